// The tiles of the GDN chunk kernels (kernels_gdn.cu; the dev/cuda lab's variants include it
// too): the chunk and state-column sizes, the in-chunk cumulative decay, the 3xTF32 mma.sync
// products, and a scan pass's chunk range and state carried between passes.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/kernels.h"

namespace clefrt::cuda::gdn {

constexpr int C = 64;   // chunk
constexpr int SW = 32;  // state columns per scan CTA
constexpr int SWP = SW + 8;  // state rows in shared memory, padded so fragment loads do not conflict


// The in-chunk cumulative log decay in double for lane l's tokens 2l and 2l + 1 (zeros past n):
// each lane adds its pair, then a shuffle scan over the 32 pairs. Every lane of the warp calls it.
__device__ __forceinline__ void chunk_gamma_pair(const float* g, int64_t t0, int n, int64_t Hv, int64_t j, int lane, double& gam0,
                                                 double& gam1) {
  const int i0 = 2 * lane;
  const double a = i0 < n ? double(g[(t0 + i0) * Hv + j]) : 0.0;
  const double b = i0 + 1 < n ? double(g[(t0 + i0 + 1) * Hv + j]) : 0.0;
  double sum = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    const double v = __shfl_up_sync(0xffffffffu, sum, o);
    if (lane >= o) sum += v;
  }
  gam1 = sum;
  gam0 = sum - b;
}

// gamma_i = sum of g over the chunk's tokens 0..i (zeros past n), in double, by warp 0 into
// shared memory (the chunk's first step, on the scan's sequential path: a one-thread loop of 64
// dependent loads was slower).
__device__ __forceinline__ void chunk_gamma(double* gam, const float* g, int64_t t0, int n, int64_t Hv, int64_t j) {
  const int lane = int(threadIdx.x);
  if (lane >= 32) return;
  chunk_gamma_pair(g, t0, n, Hv, j, lane, gam[2 * lane], gam[2 * lane + 1]);
}

// ---- bf16x3 planes (the Wgmma path, kernels_gdn_wgmma.cu) ----
// An fp32 matrix as two bf16 planes, hi = bf16(x) and lo = bf16(x - hi), each a K-major tile in
// 64-element k panels with wgmma's 128-byte swizzle (wgmma.cuh): 64 x 128 tiles (W, Q, K,
// S^T) take kTile bytes, 64 x 64 ones (A, Vn^T) kSmallTile; the lo plane follows the hi one.
constexpr int kTile = C * 128 * 4, kSmallTile = C * C * 4;
// Byte offset of element (row, k) in a plane of `rows` rows.
__device__ __forceinline__ int kmajor_off(int row, int k, int rows) {
  return (k >> 6) * rows * 128 + swizzle128(row, (k & 63) >> 3) + (k & 7) * 2;
}
__device__ __forceinline__ void split_pair(float x0, float x1, __nv_bfloat162& hi, __nv_bfloat162& lo) {
  hi = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(hi);
  lo = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
}
// The same hi, and lo only when with_lo (one bf16 pass has no lo plane: lo is left as it was).
__device__ __forceinline__ void split_pair(float x0, float x1, __nv_bfloat162& hi, __nv_bfloat162& lo, bool with_lo) {
  if (with_lo) split_pair(x0, x1, hi, lo);
  else hi = __floats2bfloat162_rn(x0, x1);
}
// Elements (row, k) and (row, k + 1), k even, into the hi plane at `hi` and the lo plane `plane`
// bytes further; lo false (one bf16 pass: no reader of a lo plane) leaves the lo plane alone.
__device__ __forceinline__ void put_pair(uint8_t* hi, int plane, int row, int k, int rows, float x0, float x1, bool lo = true) {
  const int off = kmajor_off(row, k, rows);
  __nv_bfloat162 h, l;
  split_pair(x0, x1, h, l, lo);
  *reinterpret_cast<__nv_bfloat162*>(hi + off) = h;
  if (lo) *reinterpret_cast<__nv_bfloat162*>(hi + plane + off) = l;
}

// Eight consecutive k of one row: 16 bytes of the hi plane at hi + off, of the lo plane `plane`
// bytes further (lo false: the hi plane alone).
__device__ __forceinline__ void put8(uint8_t* hi, int plane, int off, const float (&v)[8], bool lo = true) {
  uint32_t h[4], l[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    __nv_bfloat162 hh, ll;
    split_pair(v[2 * q], v[2 * q + 1], hh, ll, lo);
    h[q] = *reinterpret_cast<const uint32_t*>(&hh);
    if (lo) l[q] = *reinterpret_cast<const uint32_t*>(&ll);
  }
  *reinterpret_cast<uint4*>(hi + off) = make_uint4(h[0], h[1], h[2], h[3]);
  if (lo) *reinterpret_cast<uint4*>(hi + plane + off) = make_uint4(l[0], l[1], l[2], l[3]);
}

// ---- tensor-core helpers ----
// mma.sync m16n8k8 TF32 with the "3xTF32" split (x = hi + lo, both TF32; a*b ~ a_hi b_hi +
// a_hi b_lo + a_lo b_hi), which keeps fp32-level accuracy (~2^-21) at a few times the SIMT rate.
// hi: x rounded to TF32 by adding half a TF32 unit to the bits and clearing the 13 low ones (ties
// away from zero, like cvt.rna); lo = x - hi is exact in fp32 and goes in as is: the tensor core
// reads only a TF32 operand's upper 19 bits. Three instructions; cvt.rna.tf32.f32 has no sm_90
// instruction and compiled to ~20 (Nsight Compute: FSETP / SEL / LOP3 / VIADD were half of the
// scan's instructions, HMMA 5%). Finite inputs only (hi of an infinity would be one).
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  const uint32_t h = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  hi = h;
  lo = __float_as_uint(x - __uint_as_float(h));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d[q] += A[16 x K] B_q[K x 8] for q < nb <= NB: A(r, k) = a_at(r, k), B_q(k, c) = b_at(q, k, c), r and
// c relative to the tile. One A fragment, split once per k-step, serves the nb tiles (the split,
// not the MMA, is most of the instructions). The three products of a k-step go to three
// accumulators (hi*hi, lo*hi, hi*lo), summed at the end: one chain of dependent MMAs per tile
// was three times as long (Nsight Compute: "fixed latency" the top stall of the scan). Per tile:
// the same operations in the same order as one tile alone.
template <int NB, class FA, class FB>
__device__ __forceinline__ void mma_3xtf32_shared_a(float (&d)[NB][4], int nb, int K, FA a_at, FB b_at) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float e1[NB][4] = {}, e2[NB][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    uint32_t ah[4], al[4];
    split_tf32(a_at(g, k0 + t), ah[0], al[0]);
    split_tf32(a_at(g + 8, k0 + t), ah[1], al[1]);
    split_tf32(a_at(g, k0 + t + 4), ah[2], al[2]);
    split_tf32(a_at(g + 8, k0 + t + 4), ah[3], al[3]);
#pragma unroll
    for (int q = 0; q < NB; ++q) {
      if (q >= nb) break;
      uint32_t bh[2], bl[2];
      split_tf32(b_at(q, k0 + t, g), bh[0], bl[0]);
      split_tf32(b_at(q, k0 + t + 4, g), bh[1], bl[1]);
      mma_tf32(e1[q], al, bh);
      mma_tf32(e2[q], ah, bl);
      mma_tf32(d[q], ah, bh);
    }
  }
#pragma unroll
  for (int q = 0; q < NB; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) d[q][i] += e1[q][i] + e2[q][i];
}

// d[q] += A_q[16 x K] B[K x 8] for q < na <= NA: A_q(r, k) = a_at(q, r, k); one B fragment serves
// the na tiles. The two correction products share one accumulator here (NA goes up to 8 tiles:
// three accumulators each would not fit the registers).
template <int NA, class FA, class FB>
__device__ __forceinline__ void mma_3xtf32_shared_b(float (&d)[NA][4], int na, int K, FA a_at, FB b_at) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float e[NA][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    uint32_t bh[2], bl[2];
    split_tf32(b_at(k0 + t, g), bh[0], bl[0]);
    split_tf32(b_at(k0 + t + 4, g), bh[1], bl[1]);
#pragma unroll
    for (int q = 0; q < NA; ++q) {
      if (q >= na) break;
      uint32_t ah[4], al[4];
      split_tf32(a_at(q, g, k0 + t), ah[0], al[0]);
      split_tf32(a_at(q, g + 8, k0 + t), ah[1], al[1]);
      split_tf32(a_at(q, g, k0 + t + 4), ah[2], al[2]);
      split_tf32(a_at(q, g + 8, k0 + t + 4), ah[3], al[3]);
      mma_tf32(e[q], al, bh);
      mma_tf32(e[q], ah, bl);
      mma_tf32(d[q], ah, bh);
    }
  }
#pragma unroll
  for (int q = 0; q < NA; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) d[q][i] += e[q][i];
}

// T = (I + Lm)^-1 for a strictly lower triangular C x C Lm (rows ldl floats apart; T zeroed
// before), blocked by 16: the four diagonal blocks by substitution (a column per thread, held in
// registers), then T_ib = -T_ii sum_{k = b..i-1} Lm_ik T_kb by block distance through P
// [3][16][16] on tensor cores. The chunk preps' sequential part; the block's 256 threads all
// take part (barriers inside).
//
// The substitution pushes each finished row k into the rows below it, t_r -= Lm_rk t_k, in
// registers: the longest chain is 15 dependent FMAs, and Lm's loads depend on nothing. Row r's
// value is the same sum in the same order as -(sum_{k = col..r-1} Lm_rk T_kc) (a negated FMA
// chain rounds alike): the values of the dot-product form (a zero sum's sign aside: +0 here, -0
// there), which read each T_kc back from shared memory as it wrote it (Nsight Compute: the other
// threads' wait at the barrier after it was ~11% of the wgmma prep's stall samples).
__device__ __forceinline__ void invert_unit_lower(const float* Lm, float* T, float* P, int ldl, int tid, int nt) {
  if (tid < C) {
    const int b0 = (tid / 16) * 16, col = tid % 16;
    float t[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) t[r] = r == col ? 1.0f : 0.0f;
#pragma unroll
    for (int k = 0; k < 15; ++k)
#pragma unroll
      for (int r = k + 1; r < 16; ++r) t[r] -= Lm[(b0 + r) * ldl + b0 + k] * t[k];
    // the whole diagonal block, its zeros above the diagonal too (t[r] = +0 for r < col): the
    // products below read them, and the T form's T lies over memory nobody zeroed
#pragma unroll
    for (int r = 0; r < 16; ++r) T[(b0 + r) * ldl + b0 + col] = t[r];
  }
  __syncthreads();
  // Off-diagonal blocks by distance d between block row bi and block column bj = bi - d: the sums
  // P = Lm[bi][bj .. bi - 1] T[bj .. bi - 1][bj] (16 x 16, K = 16 d), then T_ib = -T_ii P, on
  // 3xTF32 mma.sync (fp32-level products): warp w takes block bj = w / 2, columns 8 (w % 2) ..,
  // 6 / 4 / 2 warps at d = 1 / 2 / 3. The SIMT form (a thread an element, a sum of 16 d products
  // from shared memory each) was 28% of the wgmma prep's instructions (Nsight Compute).
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  if (nt < 6 * 32) __trap();  // the 6 warps of d = 1 (both preps run 256 threads)
  for (int d = 1; d < C / 16; ++d) {
    const int bj = warp >> 1, half = warp & 1, bi = bj + d, c0 = 8 * half;
    const bool active = bj < C / 16 - d;
    if (active) {
      float acc[1][4] = {};
      mma_3xtf32_shared_a<1>(
          acc, 1, 16 * d, [&](int r, int k) { return Lm[(16 * bi + r) * ldl + 16 * bj + k]; },
          [&](int, int k, int c) { return T[(16 * bj + k) * ldl + 16 * bj + c0 + c]; });
      float* pb = P + bj * 256;
      pb[g * 16 + c0 + 2 * t4] = acc[0][0];
      pb[g * 16 + c0 + 2 * t4 + 1] = acc[0][1];
      pb[(g + 8) * 16 + c0 + 2 * t4] = acc[0][2];
      pb[(g + 8) * 16 + c0 + 2 * t4 + 1] = acc[0][3];
      __syncwarp();  // the warp reads back only the 16 x 8 of P it wrote
      float acc2[1][4] = {};
      mma_3xtf32_shared_a<1>(
          acc2, 1, 16, [&](int r, int k) { return T[(16 * bi + r) * ldl + 16 * bi + k]; },
          [&](int, int k, int c) { return pb[k * 16 + c0 + c]; });
      float* tb = T + 16 * bi * ldl + 16 * bj + c0 + 2 * t4;
      tb[g * ldl] = -acc2[0][0];
      tb[g * ldl + 1] = -acc2[0][1];
      tb[(g + 8) * ldl] = -acc2[0][2];
      tb[(g + 8) * ldl + 1] = -acc2[0][3];
    }
    __syncthreads();  // this distance's blocks whole before the next reads them
  }
}

// The chunks of sequence s in this pass, [cb, ce); false (the CTA has nothing to do) if none.
__device__ __forceinline__ bool scan_pass_chunks(const GdnChunks& ch, const GdnScratch& sc, int64_t s, int64_t& cb, int64_t& ce) {
  const int64_t first = ch.seq_chunk[s], end = ch.seq_chunk[s + 1];
  cb = first > sc.c0 ? first : sc.c0;
  ce = sc.c1 >= 0 && sc.c1 < end ? sc.c1 : end;
  return cb < ce;
}
// Where sequence s's state comes from as this pass begins at chunk cb: the previous pass's
// state_in when the sequence began before it, else its cached prefix (seq_state_in, at the
// layer's offset), else nothing (a zero state).
__device__ __forceinline__ const float* scan_state_source(const GdnChunks& ch, const GdnScratch& sc, int64_t s, int64_t cb) {
  return ch.seq_chunk[s] < cb ? sc.state_in : sc.seq_state_in && sc.seq_state_in[s] ? sc.seq_state_in[s] + sc.layer_off : nullptr;
}
// This CTA's state columns [c0_col, c0_col + sw) of value head j: from the previous pass when
// the sequence began before it, else from its cached prefix (seq_state_in) or zero (columns
// >= sw, padding, stay zero).
__device__ __forceinline__ void load_state(float* S, int lds, const GdnScratch& sc, int64_t s, bool carried, int64_t j, int64_t Dk, int64_t Dv,
                                           int64_t c0_col, int sw, int tid, int nt) {
  const float* from = carried ? sc.state_in : sc.seq_state_in && sc.seq_state_in[s] ? sc.seq_state_in[s] + sc.layer_off : nullptr;
  for (int64_t e = tid; e < Dk * lds; e += nt) {
    const int64_t y = e / lds, x = e - y * lds;
    S[e] = from && x < sw ? from[(j * Dk + y) * Dv + c0_col + x] : 0.0f;
  }
}
// This CTA's state columns into `to` (laid out as state_in), once the S updates before are done.
__device__ __forceinline__ void save_state(const float* S, int lds, float* to, int64_t j, int64_t Dk, int64_t Dv, int64_t c0_col, int sw,
                                           int tid, int nt) {
  __syncthreads();
  for (int64_t e = tid; e < Dk * sw; e += nt) {
    const int64_t y = e / sw, x = e - y * sw;
    to[(j * Dk + y) * Dv + c0_col + x] = S[y * lds + x];
  }
}
// The state as sequence s reaches chunk c (before it) goes to its prefix state when c is its
// snap_chunk (the prefix cache, a long request's steps).
__device__ __forceinline__ void snap_state(const float* S, int lds, const GdnScratch& sc, int64_t s, int64_t c, int64_t j, int64_t Dk,
                                           int64_t Dv, int64_t c0_col, int sw, int tid, int nt) {
  if (sc.snap_chunk && sc.snap_chunk[s] == c) save_state(S, lds, sc.seq_state_out[s] + sc.layer_off, j, Dk, Dv, c0_col, sw, tid, nt);
}
// After the pass's last chunk, for a sequence that continues in the next pass.
__device__ __forceinline__ void store_state(const float* S, int lds, const GdnScratch& sc, int64_t j, int64_t Dk, int64_t Dv,
                                            int64_t c0_col, int sw, int tid, int nt) {
  save_state(S, lds, sc.state_out, j, Dk, Dv, c0_col, sw, tid, nt);
}
// After the pass's chunks [.., ce) of sequence s: to the next pass when the sequence goes on,
// else to its prefix state when it leaves one after its last chunk.
__device__ __forceinline__ void end_pass(const float* S, int lds, const GdnScratch& sc, const GdnChunks& ch, int64_t s, int64_t ce, int64_t j,
                                         int64_t Dk, int64_t Dv, int64_t c0_col, int sw, int tid, int nt) {
  if (ch.seq_chunk[s + 1] > ce) store_state(S, lds, sc, j, Dk, Dv, c0_col, sw, tid, nt);
  else snap_state(S, lds, sc, s, ce, j, Dk, Dv, c0_col, sw, tid, nt);
}

}  // namespace clefrt::cuda::gdn

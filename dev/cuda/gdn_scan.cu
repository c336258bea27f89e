// The GDN chunked prefill's scan, kernel variants side by side (issue 20), at the 27B model's
// GDN shapes (Hk 16, Hv 48, Dk = Dv = 128) on random inputs normalised as the engine's gdn_prep
// leaves them. Per batch shape (1 x 8,192, 8 x 1,024, 64 x 512 tokens; one layer; CUDA events,
// median of 20 after 3 warm-ups; each run from a fresh prep, whose time is subtracted):
//   product       gdn_chunk_scan, the engine's (one fused kernel, 3xTF32 products)
//   fused 3xtf32  this file's copy of it (its bits must equal the product's: the harness check)
//   regs nwN      gdn_scan_regs.cuh: the state in registers, one warp per 16 state columns, N
//                 warps a CTA (1, 2, 4), 3xTF32; regs tf32: 2 warps, plain TF32 products
//   fused tf32    the same kernel with plain TF32 products (one MMA instead of three)
//   fused bf16    the same kernel with bf16 m16n8k16 products (fp32 accumulation; fla's choice)
//   narrow sw16   the fused kernel over 16 state columns per CTA (twice the CTAs, three per SM),
//                 sw32 the same layout at 32 columns: the same bits as the product
//   split 3xtf32  a state kernel (the recurrence alone, next chunk's loads under the update)
//               + a parallel output kernel over saved chunk states: the same bits, and slower
//   simt          the engine's CUDA-core scan
// Error is against the product's output, which the GPU tests hold to the CPU's fp32 within
// 2e-5 relative. Rates count each product once (useful FLOPs), for scale against the measured
// bf16 GEMM peak. Usage: clefrt_bench_gdn [--commit ID] [--json FILE]; CLEFRT_LAB_ONLY=NAME in the
// environment runs the product and the variants whose names contain NAME at 1 x 8,192 alone.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <cstdio>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "gdn_scan_regs.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {
using namespace gdn;

// The products' kinds: the product's 3xTF32 (fp32-level), plain TF32 (operands rounded to
// 10-bit mantissas, one MMA), bf16 m16n8k16 (operands rounded to bf16, fp32 accumulation: what
// fla does). Same accumulator layout in all three (rows g and g + 8, columns 2t and 2t + 1).
enum class Mma { Tf32x3, Tf32, Bf16 };

__device__ __forceinline__ uint32_t tf32_hi(float x) {
  uint32_t h, l;
  split_tf32(x, h, l);
  return h;
}

template <Mma M, int NB, class FA, class FB>
__device__ __forceinline__ void mma_shared_a(float (&d)[NB][4], int nb, int K, FA a_at, FB b_at) {
  if constexpr (M == Mma::Tf32x3) {
    mma_3xtf32_shared_a<NB>(d, nb, K, a_at, b_at);
  } else {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if constexpr (M == Mma::Tf32) {
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 8) {
        const uint32_t a[4] = {tf32_hi(a_at(g, k0 + t)), tf32_hi(a_at(g + 8, k0 + t)), tf32_hi(a_at(g, k0 + t + 4)),
                               tf32_hi(a_at(g + 8, k0 + t + 4))};
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          if (q >= nb) break;
          const uint32_t b[2] = {tf32_hi(b_at(q, k0 + t, g)), tf32_hi(b_at(q, k0 + t + 4, g))};
          mma_tf32(d[q], a, b);
        }
      }
    } else {
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 16) {
        const int c0 = k0 + 2 * t, c1 = c0 + 8;
        const uint32_t a0 = pack_bf16(a_at(g, c0), a_at(g, c0 + 1)), a1 = pack_bf16(a_at(g + 8, c0), a_at(g + 8, c0 + 1)),
                       a2 = pack_bf16(a_at(g, c1), a_at(g, c1 + 1)), a3 = pack_bf16(a_at(g + 8, c1), a_at(g + 8, c1 + 1));
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          if (q >= nb) break;
          mma_bf16(d[q], a0, a1, a2, a3, pack_bf16(b_at(q, c0, g), b_at(q, c0 + 1, g)), pack_bf16(b_at(q, c1, g), b_at(q, c1 + 1, g)));
        }
      }
    }
  }
}

template <Mma M, int NA, class FA, class FB>
__device__ __forceinline__ void mma_shared_b(float (&d)[NA][4], int na, int K, FA a_at, FB b_at) {
  if constexpr (M == Mma::Tf32x3) {
    mma_3xtf32_shared_b<NA>(d, na, K, a_at, b_at);
  } else {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if constexpr (M == Mma::Tf32) {
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 8) {
        const uint32_t b[2] = {tf32_hi(b_at(k0 + t, g)), tf32_hi(b_at(k0 + t + 4, g))};
#pragma unroll
        for (int q = 0; q < NA; ++q) {
          if (q >= na) break;
          const uint32_t a[4] = {tf32_hi(a_at(q, g, k0 + t)), tf32_hi(a_at(q, g + 8, k0 + t)), tf32_hi(a_at(q, g, k0 + t + 4)),
                                 tf32_hi(a_at(q, g + 8, k0 + t + 4))};
          mma_tf32(d[q], a, b);
        }
      }
    } else {
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += 16) {
        const int c0 = k0 + 2 * t, c1 = c0 + 8;
        const uint32_t b0 = pack_bf16(b_at(c0, g), b_at(c0 + 1, g)), b1 = pack_bf16(b_at(c1, g), b_at(c1 + 1, g));
#pragma unroll
        for (int q = 0; q < NA; ++q) {
          if (q >= na) break;
          mma_bf16(d[q], pack_bf16(a_at(q, g, c0), a_at(q, g, c0 + 1)), pack_bf16(a_at(q, g + 8, c0), a_at(q, g + 8, c0 + 1)),
                   pack_bf16(a_at(q, g, c1), a_at(q, g, c1 + 1)), pack_bf16(a_at(q, g + 8, c1), a_at(q, g + 8, c1 + 1)), b0, b1);
        }
      }
    }
  }
}

// ---- variant "fused" (the product's kernel), its products of the kind M ----
struct ScanTcSmem {
  // W, then A, then K share one region (each is done before the next arrives): ~100 KiB at
  // Dk = 128, two CTAs per SM
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4, region = C * (ld > C + 4 ? ld : C + 4);
    return sizeof(double) * C + sizeof(float) * (Dk * SWP + region + C * ld + C * SWP + 2 * C);
  }
};

// One CTA (8 warps) per (sequence, value head, 32 state columns), as gdn_chunk_scan_k. Each warp
// owns output tiles of 16 x 8: Vn and O 64 x 32 (2 tiles per warp), S 128 x 32 (Dk / 16 x 4 tiles).
template <Mma M>
__global__ void __launch_bounds__(256) gdn_chunk_scan_tc_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                           int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* o) {
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4, lda = C + 4;
  double* gam = smem_d;
  float* S = reinterpret_cast<float*>(gam + C);  // [Dk][SWP]
  float* Ws = S + Dk * SWP;                      // [C][ld]: W, then A ([C][lda]), then K
  float* qs = Ws + C * (ld > lda ? ld : lda);    // [C][ld]
  float* ks = Ws;
  float* As = Ws;
  float* Vn = qs + C * ld;    // [C][SWP]
  float* eg = Vn + C * SWP;   // e^gamma_i
  float* ek = eg + C;         // e^(gamma_C - gamma_i)

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SW;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk, value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SW ? Dv - c0_col : SW);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  // this warp's 16 x 8 tiles of the 64 x 32 outputs: rows 16 * (warp % 4), columns 8 * ct
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 16;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, SWP, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  for (int64_t c = cb; c < ce; ++c) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* w = sc.w + ((c - sc.c0) * Hv + j) * C * Dk;
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;
    const float* aqk = sc.aqk + ((c - sc.c0) * Hv + j) * C * C;
    const float* rows = mixed + t0 * conv_dim;
    __syncthreads();  // the previous chunk's readers of q/k/Vn/S are done
    load_tile_async(Ws, ld, w, Dk, C, int(Dk), C, int(Dk));
    load_tile_async(qs, ld, rows + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
    load_tile_async(Vn, SWP, u + c0_col, Dv, C, SW, C, sw);
    chunk_gamma(gam, g, t0, n, Hv, j);
    cp_async_wait_all();
    __syncthreads();
    if (tid < C) {
      eg[tid] = float(exp(gam[tid]));
      ek[tid] = tid < n ? float(exp(gam[n - 1] - gam[tid])) : 0.0f;
    }
    // Vn = U - W S: this warp's two tiles share their W fragment
    {
      float d[2][4] = {};
      mma_shared_a<M, 2>(
          d, 2, int(Dk), [&](int r, int k) { return Ws[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWP + ct0 + 8 * q + col]; });
      for (int q = 0; q < 2; ++q) {
        const int cc = ct0 + 8 * q;
        Vn[(rt + gq) * SWP + cc + 2 * tq] -= d[q][0];
        Vn[(rt + gq) * SWP + cc + 2 * tq + 1] -= d[q][1];
        Vn[(rt + gq + 8) * SWP + cc + 2 * tq] -= d[q][2];
        Vn[(rt + gq + 8) * SWP + cc + 2 * tq + 1] -= d[q][3];
      }
    }
    __syncthreads();  // W is done: A into its space
    load_tile_async(As, lda, aqk, C, C, C, C, C);
    cp_async_wait_all();
    __syncthreads();
    // O = e^gamma Q S + A Vn (A is lower triangular: k stops at the tile's last row)
    {
      float d[2][4] = {};
      mma_shared_a<M, 2>(
          d, 2, int(Dk), [&](int r, int k) { return qs[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWP + ct0 + 8 * q + col]; });
      const float e0 = eg[rt + gq], e1 = eg[rt + gq + 8];
      float a[2][4];
      for (int q = 0; q < 2; ++q) {
        a[q][0] = d[q][0] * e0;
        a[q][1] = d[q][1] * e0;
        a[q][2] = d[q][2] * e1;
        a[q][3] = d[q][3] * e1;
      }
      mma_shared_a<M, 2>(
          a, 2, rt + 16, [&](int r, int k) { return As[(rt + r) * lda + k]; },
          [&](int q, int k, int col) { return Vn[k * SWP + ct0 + 8 * q + col]; });
      for (int q = 0; q < 2; ++q) {
        const int r0 = rt + gq, r1 = rt + gq + 8, col = ct0 + 8 * q + 2 * tq;
        float* out0 = o + (t0 + r0) * value_dim + j * Dv + c0_col + col;
        float* out1 = o + (t0 + r1) * value_dim + j * Dv + c0_col + col;
        if (r0 < n && col < sw) out0[0] = a[q][0];
        if (r0 < n && col + 1 < sw) out0[1] = a[q][1];
        if (r1 < n && col < sw) out1[0] = a[q][2];
        if (r1 < n && col + 1 < sw) out1[1] = a[q][3];
      }
    }
    __syncthreads();  // Q, A and Vn reads are done
    load_tile_async(ks, ld, rows + key_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));  // K into W's (then A's) space
    for (int e = tid; e < C * SW; e += nt) Vn[(e / SW) * SWP + e % SW] *= ek[e / SW];
    cp_async_wait_all();
    __syncthreads();
    // S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn): (Dk / 16) x 4 tiles over the 8 warps; a
    // warp's tiles (warp + 8 i) share their columns, so one Vn fragment serves them all
    const float eC = float(exp(gam[n - 1]));
    const int tiles = int(Dk / 16) * 4, na = warp < tiles ? (tiles - warp + 7) / 8 : 0;
    const int cc = (warp & 3) * 8;
    if (na > 0) {
      float d[4][4] = {};
      mma_shared_b<M, 4>(
          d, na, C, [&](int q, int r, int k) { return ks[k * ld + ((warp + 8 * q) >> 2) * 16 + r]; },
          [&](int k, int col) { return Vn[k * SWP + cc + col]; });
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q >= na) break;
        const int r0 = ((warp + 8 * q) >> 2) * 16;
        float* s0 = S + (r0 + gq) * SWP + cc + 2 * tq;
        float* s1 = S + (r0 + gq + 8) * SWP + cc + 2 * tq;
        s0[0] = s0[0] * eC + d[q][0];
        s0[1] = s0[1] * eC + d[q][1];
        s1[0] = s1[0] * eC + d[q][2];
        s1[1] = s1[1] * eC + d[q][3];
      }
    }
  }
  if (ch.seq_chunk[s + 1] > ce) store_state(S, SWP, sc, j, Dk, Dv, c0_col, sw, tid, nt);
}


// ---- variant "narrow": the fused kernel over 16 state columns per CTA ----
// Nsight Compute showed the fused kernel latency-bound with 1.45 CTAs per SM (192 CTAs at
// 1 x 8,192). Here a CTA owns SWT = 16 columns: twice the CTAs, each a warp's single 16 x 8
// tile of Vn / O and two of S, and a smaller shared footprint (W, Q and K take turns in one
// region; A has its own and loads with W) so three fit an SM. Every tile's products run in the
// same order as in the product's kernel: the same bits.
template <int SWT>
struct NarrowSmem {
  static constexpr int SWPT = SWT + 8;
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4, lda = C + 4;
    return sizeof(double) * C + sizeof(float) * (Dk * SWPT + C * ld + C * lda + C * SWPT + 2 * C);
  }
};

template <int SWT>
__global__ void __launch_bounds__(256) gdn_scan_narrow_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                         int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* o) {
  constexpr int SWPT = NarrowSmem<SWT>::SWPT, CT = SWT / 8;  // column tiles of 8
  static_assert(8 % CT == 0 && (4 * CT) % 8 == 0, "8 warps: 4 row tiles x CT column tiles of Vn / O");
  constexpr int NB = 4 * CT / 8;  // this warp's tiles of Vn / O
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4, lda = C + 4;
  double* gam = smem_d;
  float* S = reinterpret_cast<float*>(gam + C);  // [Dk][SWPT]
  float* R = S + Dk * SWPT;                      // [C][ld]: W, then Q, then K
  float* As = R + C * ld;                        // [C][lda]
  float* Vn = As + C * lda;                      // [C][SWPT]
  float* eg = Vn + C * SWPT;
  float* ek = eg + C;

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk, value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SWT ? Dv - c0_col : SWT);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 8 * NB;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, SWPT, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  for (int64_t c = cb; c < ce; ++c) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* w = sc.w + ((c - sc.c0) * Hv + j) * C * Dk;
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;
    const float* aqk = sc.aqk + ((c - sc.c0) * Hv + j) * C * C;
    const float* rows = mixed + t0 * conv_dim;
    __syncthreads();  // the previous chunk's readers are done
    load_tile_async(R, ld, w, Dk, C, int(Dk), C, int(Dk));
    load_tile_async(As, lda, aqk, C, C, C, C, C);
    load_tile_async(Vn, SWPT, u + c0_col, Dv, C, SWT, C, sw);
    chunk_gamma(gam, g, t0, n, Hv, j);
    cp_async_wait_all();
    __syncthreads();
    if (tid < C) {
      eg[tid] = float(exp(gam[tid]));
      ek[tid] = tid < n ? float(exp(gam[n - 1] - gam[tid])) : 0.0f;
    }
    {  // Vn = U - W S
      float d[NB][4] = {};
      mma_shared_a<Mma::Tf32x3, NB>(
          d, NB, int(Dk), [&](int r, int k) { return R[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWPT + ct0 + 8 * q + col]; });
      for (int q = 0; q < NB; ++q) {
        const int cc = ct0 + 8 * q;
        Vn[(rt + gq) * SWPT + cc + 2 * tq] -= d[q][0];
        Vn[(rt + gq) * SWPT + cc + 2 * tq + 1] -= d[q][1];
        Vn[(rt + gq + 8) * SWPT + cc + 2 * tq] -= d[q][2];
        Vn[(rt + gq + 8) * SWPT + cc + 2 * tq + 1] -= d[q][3];
      }
    }
    __syncthreads();  // W is done: Q into its space
    load_tile_async(R, ld, rows + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
    cp_async_wait_all();
    __syncthreads();
    {  // O = e^gamma Q S + A Vn
      float d[NB][4] = {};
      mma_shared_a<Mma::Tf32x3, NB>(
          d, NB, int(Dk), [&](int r, int k) { return R[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWPT + ct0 + 8 * q + col]; });
      const float e0 = eg[rt + gq], e1 = eg[rt + gq + 8];
      float a[NB][4];
      for (int q = 0; q < NB; ++q) {
        a[q][0] = d[q][0] * e0;
        a[q][1] = d[q][1] * e0;
        a[q][2] = d[q][2] * e1;
        a[q][3] = d[q][3] * e1;
      }
      mma_shared_a<Mma::Tf32x3, NB>(
          a, NB, rt + 16, [&](int r, int k) { return As[(rt + r) * lda + k]; },
          [&](int q, int k, int col) { return Vn[k * SWPT + ct0 + 8 * q + col]; });
      for (int q = 0; q < NB; ++q) {
        const int r0 = rt + gq, r1 = rt + gq + 8, col = ct0 + 8 * q + 2 * tq;
        float* out0 = o + (t0 + r0) * value_dim + j * Dv + c0_col + col;
        float* out1 = o + (t0 + r1) * value_dim + j * Dv + c0_col + col;
        if (r0 < n && col < sw) out0[0] = a[q][0];
        if (r0 < n && col + 1 < sw) out0[1] = a[q][1];
        if (r1 < n && col < sw) out1[0] = a[q][2];
        if (r1 < n && col + 1 < sw) out1[1] = a[q][3];
      }
    }
    __syncthreads();  // Q, A and Vn reads are done
    load_tile_async(R, ld, rows + key_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
    for (int e = tid; e < C * SWT; e += nt) Vn[(e / SWT) * SWPT + e % SWT] *= ek[e / SWT];
    cp_async_wait_all();
    __syncthreads();
    // S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn): tile t = warp + 8 i is row block t / CT,
    // column tile t % CT (= warp % CT for every i: one Vn fragment serves the warp's tiles)
    const float eC = float(exp(gam[n - 1]));
    const int tiles = int(Dk / 16) * CT, na = warp < tiles ? (tiles - warp + 7) / 8 : 0;
    const int cc = (warp % CT) * 8;
    if (na > 0) {
      float d[4][4] = {};
      mma_shared_b<Mma::Tf32x3, 4>(
          d, na, C, [&](int q, int r, int k) { return R[k * ld + ((warp + 8 * q) / CT) * 16 + r]; },
          [&](int k, int col) { return Vn[k * SWPT + cc + col]; });
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q >= na) break;
        const int r0 = ((warp + 8 * q) / CT) * 16;
        float* s0 = S + (r0 + gq) * SWPT + cc + 2 * tq;
        float* s1 = S + (r0 + gq + 8) * SWPT + cc + 2 * tq;
        s0[0] = s0[0] * eC + d[q][0];
        s0[1] = s0[1] * eC + d[q][1];
        s1[0] = s1[0] * eC + d[q][2];
        s1[1] = s1[1] * eC + d[q][3];
      }
    }
  }
  if (ch.seq_chunk[s + 1] > ce) store_state(S, SWPT, sc, j, Dk, Dv, c0_col, sw, tid, nt);
}

// ---- variant "split": the scan on tensor cores in two kernels ----
// gdn_chunk_state_tc_k is the sequential part alone, one CTA (8 warps) per (sequence, value
// head, 32 state columns): per chunk it saves S as the chunk's starting state h_c, forms
// Vn = U - W S (written over U) and updates S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn).
// The next chunk's W and U load while the state update runs, K while Vn is formed.
// gdn_chunk_out_tc_k then forms O = e^gamma Q h_c + A Vn for every chunk at once. Each product
// is the 3xTF32 tile of gdn_tiles.cuh in the same order as one kernel doing all of it (the
// dev/cuda lab's fused variant), so the outputs are the same bits. Shared strides: rows of
// Dk + 4 and C + 4 floats, state rows of SW + 8.
struct StateTcSmem {
  // S, W, K, U, Vn: ~106 KiB at Dk = 128, two CTAs per SM
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4;
    return sizeof(double) * C + sizeof(float) * (Dk * SWP + 2 * C * ld + 2 * C * SWP + C);
  }
};

__global__ void __launch_bounds__(256) gdn_chunk_state_tc_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                            int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* hbuf) {
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4;
  double* gam = smem_d;
  float* S = reinterpret_cast<float*>(gam + C);  // [Dk][SWP]
  float* Ws = S + Dk * SWP;                      // [C][ld]
  float* ks = Ws + C * ld;                       // [C][ld]
  float* Us = ks + C * ld;                       // [C][SWP]: U's columns of this CTA
  float* Vn = Us + C * SWP;                      // [C][SWP]
  float* ek = Vn + C * SWP;                      // e^(gamma_C - gamma_i)

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SW;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk;
  const int sw = int(Dv - c0_col < SW ? Dv - c0_col : SW);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 16;  // this warp's two 16 x 8 tiles of Vn

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, SWP, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  auto load_wu = [&](int64_t c) {
    load_tile_async(Ws, ld, sc.w + ((c - sc.c0) * Hv + j) * C * Dk, Dk, C, int(Dk), C, int(Dk));
    load_tile_async(Us, SWP, sc.u + ((c - sc.c0) * Hv + j) * C * Dv + c0_col, Dv, C, SW, C, sw);
    cp_async_commit();
  };
  load_wu(cb);
  for (int64_t c = cb; c < ce; ++c) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;  // becomes Vn
    float* h = hbuf + ((c - sc.c0) * Hv + j) * Dk * Dv;
    load_tile_async(ks, ld, mixed + t0 * conv_dim + key_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
    cp_async_commit();
    chunk_gamma(gam, g, t0, n, Hv, j);
    cp_async_wait<1>();  // W and U of this chunk (K may still be on its way)
    __syncthreads();
    for (int e = tid; e < int(Dk) * sw; e += nt) h[(e / sw) * Dv + c0_col + e % sw] = S[(e / sw) * SWP + e % sw];
    if (tid < C) ek[tid] = tid < n ? float(exp(gam[n - 1] - gam[tid])) : 0.0f;
    // Vn = U - W S: this warp's two tiles share their W fragment
    {
      float d[2][4] = {};
      mma_3xtf32_shared_a<2>(
          d, 2, int(Dk), [&](int r, int k) { return Ws[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWP + ct0 + 8 * q + col]; });
      for (int q = 0; q < 2; ++q) {
        const int cc = ct0 + 8 * q + 2 * tq, r0 = (rt + gq) * SWP, r1 = (rt + gq + 8) * SWP;
        Vn[r0 + cc] = Us[r0 + cc] - d[q][0];
        Vn[r0 + cc + 1] = Us[r0 + cc + 1] - d[q][1];
        Vn[r1 + cc] = Us[r1 + cc] - d[q][2];
        Vn[r1 + cc + 1] = Us[r1 + cc + 1] - d[q][3];
      }
    }
    __syncthreads();  // Vn is whole; W and U are free for the next chunk's
    if (c + 1 < ce) load_wu(c + 1);
    // Vn for the output kernel, then e^(gamma_C - gamma_i) Vn for the state update
    for (int e = tid; e < C * SW; e += nt) {
      const int r = e / SW, x = e % SW;
      const float v = Vn[r * SWP + x];
      if (x < sw) u[r * Dv + c0_col + x] = v;
      Vn[r * SWP + x] = v * ek[r];
    }
    if (c + 1 < ce)
      cp_async_wait<1>();  // K (the next W and U may still be on their way)
    else
      cp_async_wait<0>();
    __syncthreads();
    // S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn): (Dk / 16) x 4 tiles over the 8 warps; a
    // warp's tiles (warp + 8 i) share their columns, so one Vn fragment serves them all
    const float eC = float(exp(gam[n - 1]));
    const int tiles = int(Dk / 16) * 4, na = warp < tiles ? (tiles - warp + 7) / 8 : 0;
    const int cc = (warp & 3) * 8;
    if (na > 0) {
      float d[4][4] = {};
      mma_3xtf32_shared_b<4>(
          d, na, C, [&](int q, int r, int k) { return ks[k * ld + ((warp + 8 * q) >> 2) * 16 + r]; },
          [&](int k, int col) { return Vn[k * SWP + cc + col]; });
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q >= na) break;
        const int r0 = ((warp + 8 * q) >> 2) * 16;
        float* s0 = S + (r0 + gq) * SWP + cc + 2 * tq;
        float* s1 = S + (r0 + gq + 8) * SWP + cc + 2 * tq;
        s0[0] = s0[0] * eC + d[q][0];
        s0[1] = s0[1] * eC + d[q][1];
        s1[0] = s1[0] * eC + d[q][2];
        s1[1] = s1[1] * eC + d[q][3];
      }
    }
    __syncthreads();  // S, K and Vn are done before the next chunk reads or refills them
  }
  if (ch.seq_chunk[s + 1] > ce) store_state(S, SWP, sc, j, Dk, Dv, c0_col, sw, tid, nt);
}

struct OutTcSmem {
  // Q, h_c, A, Vn: ~81 KiB at Dk = 128
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4, lda = C + 4;
    return sizeof(double) * C + sizeof(float) * (C * ld + Dk * SWP + C * lda + C * SWP + C);
  }
};

// One CTA per (chunk of the pass, value head, 32 state columns); warp tiles as in the state kernel.
__global__ void __launch_bounds__(256) gdn_chunk_out_tc_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                          int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, const float* hbuf, float* o) {
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4, lda = C + 4;
  double* gam = smem_d;
  float* qs = reinterpret_cast<float*>(gam + C);  // [C][ld]
  float* H = qs + C * ld;                         // [Dk][SWP]
  float* As = H + Dk * SWP;                       // [C][lda]
  float* Vn = As + C * lda;                       // [C][SWP]
  float* eg = Vn + C * SWP;                       // e^gamma_i

  const int64_t ci = blockIdx.x, c = sc.c0 + ci, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SW;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SW ? Dv - c0_col : SW);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 16;
  const int64_t t0 = ch.chunk_start[c];
  const int n = ch.chunk_len[c];
  const int64_t slot = ci * Hv + j;
  load_tile_async(qs, ld, mixed + t0 * conv_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
  load_tile_async(H, SWP, hbuf + slot * Dk * Dv + c0_col, Dv, int(Dk), SW, int(Dk), sw);
  load_tile_async(As, lda, sc.aqk + slot * C * C, C, C, C, C, C);
  load_tile_async(Vn, SWP, sc.u + slot * C * Dv + c0_col, Dv, C, SW, C, sw);
  chunk_gamma(gam, g, t0, n, Hv, j);
  cp_async_wait_all();
  __syncthreads();
  if (tid < C) eg[tid] = float(exp(gam[tid]));
  __syncthreads();
  float d[2][4] = {};
  mma_3xtf32_shared_a<2>(
      d, 2, int(Dk), [&](int r, int k) { return qs[(rt + r) * ld + k]; },
      [&](int q, int k, int col) { return H[k * SWP + ct0 + 8 * q + col]; });
  const float e0 = eg[rt + gq], e1 = eg[rt + gq + 8];
  float a[2][4];
  for (int q = 0; q < 2; ++q) {
    a[q][0] = d[q][0] * e0;
    a[q][1] = d[q][1] * e0;
    a[q][2] = d[q][2] * e1;
    a[q][3] = d[q][3] * e1;
  }
  mma_3xtf32_shared_a<2>(
      a, 2, rt + 16, [&](int r, int k) { return As[(rt + r) * lda + k]; },
      [&](int q, int k, int col) { return Vn[k * SWP + ct0 + 8 * q + col]; });
  for (int q = 0; q < 2; ++q) {
    const int r0 = rt + gq, r1 = rt + gq + 8, col = ct0 + 8 * q + 2 * tq;
    float* out0 = o + (t0 + r0) * value_dim + j * Dv + c0_col + col;
    float* out1 = o + (t0 + r1) * value_dim + j * Dv + c0_col + col;
    if (r0 < n && col < sw) out0[0] = a[q][0];
    if (r0 < n && col + 1 < sw) out0[1] = a[q][1];
    if (r1 < n && col < sw) out1[0] = a[q][2];
    if (r1 < n && col + 1 < sw) out1[1] = a[q][3];
  }
}


// ---- variant "split2": the split scan with a deeper load pipeline, SWT state columns a CTA ----
// gdn_state2_k: one CTA (8 warps, one per SM: ~190 KiB of shared memory) per (sequence, value
// head, SWT = 64 state columns), the recurrence alone as in gdn_chunk_state_tc_k. W and K go
// through a ring of three [C][Dk + 4] tiles in the order W_c, K_c, W_c+1, K_c+1, ..., each
// issued as soon as its slot frees (K_c+1 once Vn_c is formed, W_c+2 once S is updated), so a
// tile's load has a whole product to land; U is double-buffered; the decays of chunk c + 1 are
// read into warp 0's registers while chunk c computes. Per chunk: store S as h_c, Vn = U - W S
// (a warp: 16 rows x 32 columns, 4 tiles sharing the W fragment; Vn written over U for the
// output kernel, e^(gamma_C - gamma) Vn kept), S = e^gamma_C S + K^T (...) (a warp: 8 columns,
// all Dk / 16 row tiles sharing the Vn fragment). Three barriers a chunk. Every tile's products
// are the product kernel's in the same order: the same bits.
template <int SWT>
struct State2Smem {
  static constexpr int swp = SWT + 8;  // state / Vn rows: fragment loads conflict-free
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4;
    return sizeof(float) * (3 * C * (ld + 4) + 2 * C * swp + Dk * swp + C * swp + C + 1);
  }
};

template <int SWT>
__global__ void __launch_bounds__(256, 1) gdn_state2_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                       int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* hbuf) {
  static_assert(SWT == 64, "the warp tiling below covers 64 state columns with 8 warps");
  constexpr int swp = State2Smem<SWT>::swp;
  extern __shared__ double smem_d[];
  // W rows (the A operand, [row][k]) at Dk + 4 floats, K rows (read transposed, [k][row]) at
  // Dk + 8: = 4 and = 8 (mod 32), the strides at which those fragment loads do not conflict
  const int ld = int(Dk) + 4, ldk = int(Dk) + 8;
  float* ring = reinterpret_cast<float*>(smem_d);  // [3][C][ldk]: W_c, K_c, W_c+1, ... by (2 c + kind) % 3
  float* Us = ring + 3 * C * ldk;                  // [2][C][swp]
  float* S = Us + 2 * C * swp;                     // [Dk][swp]
  float* Vn = S + Dk * swp;                        // [C][swp]: e^(gamma_C - gamma) Vn
  float* ek = Vn + C * swp;                        // [C] e^(gamma_C - gamma_i), then e^gamma_C

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk;
  const int sw = int(Dv - c0_col < SWT ? Dv - c0_col : SWT);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 32;  // Vn: 16 rows x 32 columns a warp
  const int cs = warp * 8;                                 // S: 8 columns a warp, every row

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, swp, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  auto slot = [&](int64_t c, int kind) { return ring + ((2 * (c - cb) + kind) % 3) * C * ldk; };
  auto load_w = [&](int64_t c) {
    if (c < ce) {
      load_tile_async(slot(c, 0), ld, sc.w + ((c - sc.c0) * Hv + j) * C * Dk, Dk, C, int(Dk), C, int(Dk));
      load_tile_async(Us + ((c - cb) & 1) * C * swp, swp, sc.u + ((c - sc.c0) * Hv + j) * C * Dv + c0_col, Dv, C, SWT, C, sw);
    }
    cp_async_commit();  // empty past the end: the wait counts stay the same
  };
  auto load_k = [&](int64_t c) {
    if (c < ce) load_tile_async(slot(c, 1), ldk, mixed + ch.chunk_start[c] * conv_dim + key_dim + kh * Dk, conv_dim, C, int(Dk), ch.chunk_len[c], int(Dk));
    cp_async_commit();
  };
  // warp 0's decays: lane l holds g of tokens 2l, 2l + 1 of the chunk it reads ahead
  float ga = 0, gb = 0;
  auto read_g = [&](int64_t c) {
    if (warp == 0 && c < ce) {
      const int64_t t0 = ch.chunk_start[c];
      const int n = ch.chunk_len[c], i0 = 2 * lane;
      ga = i0 < n ? g[(t0 + i0) * Hv + j] : 0.0f;
      gb = i0 + 1 < n ? g[(t0 + i0 + 1) * Hv + j] : 0.0f;
    }
  };
  load_w(cb);
  load_k(cb);
  load_w(cb + 1);
  read_g(cb);
  for (int64_t c = cb; c < ce; ++c) {
    const int n = ch.chunk_len[c];
    float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;  // becomes Vn
    float* h = hbuf + ((c - sc.c0) * Hv + j) * Dk * Dv;
    const float* Ws = slot(c, 0);
    const float* ks = slot(c, 1);
    const float* Uc = Us + ((c - cb) & 1) * C * swp;
    if (warp == 0) {  // gamma as chunk_gamma_pair sums it, then the decays
      double sum = double(ga) + double(gb);
      for (int o = 1; o < 32; o <<= 1) {
        const double v = __shfl_up_sync(0xffffffffu, sum, o);
        if (lane >= o) sum += v;
      }
      const double gam1 = sum, gam0 = sum - double(gb);
      const double gl = __shfl_sync(0xffffffffu, (n - 1) & 1 ? gam1 : gam0, (n - 1) >> 1);
      ek[2 * lane] = 2 * lane < n ? float(exp(gl - gam0)) : 0.0f;
      ek[2 * lane + 1] = 2 * lane + 1 < n ? float(exp(gl - gam1)) : 0.0f;
      if (lane == 0) ek[C] = float(exp(gl));
      read_g(c + 1);
    }
    // h_c = S (stable since the last barrier)
    for (int e = tid; e < int(Dk) * (SWT / 4); e += nt) {
      const int y = e / (SWT / 4), x = (e % (SWT / 4)) * 4;
      if (x < sw) *reinterpret_cast<float4*>(h + y * Dv + c0_col + x) = *reinterpret_cast<const float4*>(S + y * swp + x);
    }
    cp_async_wait<2>();  // W_c and U_c (K_c and W_c+1 may be on their way)
    __syncthreads();
    // Vn = U - W S: this warp's four tiles share their W fragment
    {
      float d[4][4] = {};
      mma_3xtf32_shared_a<4>(
          d, 4, int(Dk), [&](int r, int k) { return Ws[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * swp + ct0 + 8 * q + col]; });
      const int r0 = rt + gq, r1 = r0 + 8;
      const float e0 = ek[r0], e1 = ek[r1];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int cc = ct0 + 8 * q + 2 * tq;
        const float v00 = Uc[r0 * swp + cc] - d[q][0], v01 = Uc[r0 * swp + cc + 1] - d[q][1];
        const float v10 = Uc[r1 * swp + cc] - d[q][2], v11 = Uc[r1 * swp + cc + 1] - d[q][3];
        if (cc < sw) {
          *reinterpret_cast<float2*>(u + r0 * Dv + c0_col + cc) = make_float2(v00, v01);
          *reinterpret_cast<float2*>(u + r1 * Dv + c0_col + cc) = make_float2(v10, v11);
        }
        Vn[r0 * swp + cc] = v00 * e0;
        Vn[r0 * swp + cc + 1] = v01 * e0;
        Vn[r1 * swp + cc] = v10 * e1;
        Vn[r1 * swp + cc + 1] = v11 * e1;
      }
    }
    cp_async_wait<1>();  // K_c (W_c+1 may be on its way)
    __syncthreads();     // Vn whole, K_c visible, W_c's slot free
    load_k(c + 1);
    // S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn): the Dk / 16 row tiles of this warp's
    // columns share the Vn fragment
    {
      const float eC = ek[C];
      float d[8][4] = {};
      mma_3xtf32_shared_b<8>(
          d, int(Dk / 16), C, [&](int q, int r, int k) { return ks[k * ldk + 16 * q + r]; },
          [&](int k, int col) { return Vn[k * swp + cs + col]; });
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        if (q >= int(Dk / 16)) break;
        float* s0 = S + (16 * q + gq) * swp + cs + 2 * tq;
        float* s1 = s0 + 8 * swp;
        s0[0] = s0[0] * eC + d[q][0];
        s0[1] = s0[1] * eC + d[q][1];
        s1[0] = s1[0] * eC + d[q][2];
        s1[1] = s1[1] * eC + d[q][3];
      }
    }
    __syncthreads();  // S updated; K_c's slot and U_c's buffer free
    load_w(c + 2);
  }
  if (ch.seq_chunk[s + 1] > ce) store_state(S, swp, sc, j, Dk, Dv, c0_col, sw, tid, nt);
}

// gdn_out2_k: O = e^gamma Q h_c + A Vn for every chunk, one CTA (8 warps) per (chunk, value
// head, SWT state columns): a warp's tiles are 16 rows x SWT / 2 columns sharing the Q / A
// fragment. The same products in the same order as gdn_chunk_out_tc_k.
template <int SWT>
struct Out2Smem {
  static constexpr int swp = SWT + 8;
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4, lda = C + 4;
    return sizeof(double) * C + sizeof(float) * (C * ld + Dk * swp + C * lda + C * swp + C);
  }
};

template <int SWT>
__global__ void __launch_bounds__(256) gdn_out2_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                                  const float* g, GdnChunks ch, GdnScratch sc, const float* hbuf, float* o) {
  constexpr int swp = Out2Smem<SWT>::swp, NB = SWT / 16;
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4, lda = C + 4;
  double* gam = smem_d;
  float* qs = reinterpret_cast<float*>(gam + C);  // [C][ld]
  float* H = qs + C * ld;                         // [Dk][swp]
  float* As = H + Dk * swp;                       // [C][lda]
  float* Vn = As + C * lda;                       // [C][swp]
  float* eg = Vn + C * swp;                       // e^gamma_i

  const int64_t ci = blockIdx.x, c = sc.c0 + ci, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SWT ? Dv - c0_col : SWT);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * (SWT / 2);
  const int64_t t0 = ch.chunk_start[c];
  const int n = ch.chunk_len[c];
  const int64_t slot = ci * Hv + j;
  load_tile_async(qs, ld, mixed + t0 * conv_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
  load_tile_async(H, swp, hbuf + slot * Dk * Dv + c0_col, Dv, int(Dk), SWT, int(Dk), sw);
  load_tile_async(As, lda, sc.aqk + slot * C * C, C, C, C, C, C);
  load_tile_async(Vn, swp, sc.u + slot * C * Dv + c0_col, Dv, C, SWT, C, sw);
  chunk_gamma(gam, g, t0, n, Hv, j);
  cp_async_wait_all();
  __syncthreads();
  if (tid < C) eg[tid] = float(exp(gam[tid]));
  __syncthreads();
  float d[NB][4] = {};
  mma_3xtf32_shared_a<NB>(
      d, NB, int(Dk), [&](int r, int k) { return qs[(rt + r) * ld + k]; },
      [&](int q, int k, int col) { return H[k * swp + ct0 + 8 * q + col]; });
  const float e0 = eg[rt + gq], e1 = eg[rt + gq + 8];
  float a[NB][4];
  for (int q = 0; q < NB; ++q) {
    a[q][0] = d[q][0] * e0;
    a[q][1] = d[q][1] * e0;
    a[q][2] = d[q][2] * e1;
    a[q][3] = d[q][3] * e1;
  }
  mma_3xtf32_shared_a<NB>(
      a, NB, rt + 16, [&](int r, int k) { return As[(rt + r) * lda + k]; },
      [&](int q, int k, int col) { return Vn[k * swp + ct0 + 8 * q + col]; });
  for (int q = 0; q < NB; ++q) {
    const int r0 = rt + gq, r1 = rt + gq + 8, col = ct0 + 8 * q + 2 * tq;
    float* out0 = o + (t0 + r0) * value_dim + j * Dv + c0_col + col;
    float* out1 = o + (t0 + r1) * value_dim + j * Dv + c0_col + col;
    if (r0 < n && col < sw) out0[0] = a[q][0];
    if (r0 < n && col + 1 < sw) out0[1] = a[q][1];
    if (r1 < n && col < sw) out1[0] = a[q][2];
    if (r1 < n && col + 1 < sw) out1[1] = a[q][3];
  }
}

// ---- variant "state3": the recurrence on wgmma, bf16x3 products ----
// Each fp32 operand x goes in as two bf16 planes, hi = bf16(x) and lo = bf16(x - hi) (x - hi -
// lo is within 2^-18 |x|), and a product as three bf16 wgmmas with fp32 accumulation: hi hi +
// hi lo + lo hi (the dropped lo lo is ~2^-16 of it). ~1e-5 relative, against TF32's ~5e-4,
// at half the tensor work of 3xTF32 (bf16 runs at twice TF32's rate) and with no split
// instructions in the product's loop. Operands are K-major 128-byte-swizzled bf16 tiles
// (wgmma.cuh's layout): W [tokens][Dk] (two k panels), K^T [Dk][tokens], S^T [state
// columns][Dk] (two k panels), (e^(gamma_C - gamma) Vn)^T [state columns][tokens].
// gdn_planes_k writes W's and K^T's planes per chunk from the prep's W and the conv's K (in the
// product the prep would write them); gdn_state3_k walks the chunks with S^T in registers.

// Byte offset of element (row, k) in a K-major tile of `rows` rows and 64-element k panels.
__device__ __forceinline__ int kmajor_off(int row, int k, int rows) {
  return (k >> 6) * rows * 128 + swizzle128(row, (k & 63) >> 3) + (k & 7) * 2;
}
__device__ __forceinline__ void split_bf16(float x, uint16_t& hi, uint16_t& lo) {
  const bf16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(h)));
}

constexpr int kPlanes = 32768;  // one W or K^T tile: hi plane (16 KB), then lo plane

// grid (chunks of the pass, max(Hv, Hk)): y < Hv: W of (chunk, value head y); y < Hk: K^T of
// (chunk, key head y). Dk = 128, C = 64.
// rows x cols of fp32 (row stride lds; rows >= n read as zero) into K-major planes at hi (lo
// plane `plane` bytes further), k = column
__device__ __forceinline__ void rows_to_planes(const float* src, int64_t lds, int rows, int cols, int n, uint8_t* hi, int plane) {
  for (int e = threadIdx.x; e < rows * cols / 4; e += blockDim.x) {
    const int r = e / (cols / 4), k = (e % (cols / 4)) * 4;
    const float4 v = r < n ? *reinterpret_cast<const float4*>(src + r * lds + k) : make_float4(0, 0, 0, 0);
    uint16_t h[4], l[4];
    split_bf16(v.x, h[0], l[0]);
    split_bf16(v.y, h[1], l[1]);
    split_bf16(v.z, h[2], l[2]);
    split_bf16(v.w, h[3], l[3]);
    const int off = kmajor_off(r, k, rows);
    *reinterpret_cast<uint2*>(hi + off) = make_uint2(h[0] | uint32_t(h[1]) << 16, h[2] | uint32_t(h[3]) << 16);
    *reinterpret_cast<uint2*>(hi + plane + off) = make_uint2(l[0] | uint32_t(l[1]) << 16, l[2] | uint32_t(l[3]) << 16);
  }
}

// qp / ap (the output kernel's Q [tokens][Dk] per key head and A [tokens][tokens] per value
// head, 16 KB) may be null.
__global__ void __launch_bounds__(256) gdn_planes_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, GdnChunks ch,
                                                    GdnScratch sc, uint8_t* wp, uint8_t* ktp, uint8_t* qp = nullptr, uint8_t* ap = nullptr) {
  constexpr int Dk = 128;
  const int64_t ci = blockIdx.x, c = sc.c0 + ci, y = blockIdx.y;
  const int tid = threadIdx.x;
  if (y < Hv) {
    rows_to_planes(sc.w + (ci * Hv + y) * C * Dk, Dk, C, Dk, C, wp + (ci * Hv + y) * kPlanes, kPlanes / 2);
    if (ap) rows_to_planes(sc.aqk + (ci * Hv + y) * C * C, C, C, C, C, ap + (ci * Hv + y) * (kPlanes / 2), kPlanes / 4);
  }
  if (y < Hk && qp) {
    const int64_t t0 = ch.chunk_start[c];
    rows_to_planes(mixed + t0 * conv_dim + y * Dk, conv_dim, C, Dk, ch.chunk_len[c], qp + (ci * Hk + y) * kPlanes, kPlanes / 2);
  }
  if (y < Hk) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* src = mixed + t0 * conv_dim + Hk * Dk + y * Dk;
    uint8_t* hi = ktp + (ci * Hk + y) * kPlanes;
    for (int e = tid; e < C * Dk / 4; e += blockDim.x) {
      const int i = e / (Dk / 4), x = (e % (Dk / 4)) * 4;
      const float4 v = i < n ? *reinterpret_cast<const float4*>(src + i * conv_dim + x) : make_float4(0, 0, 0, 0);
      const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint16_t h, l;
        split_bf16(vv[q], h, l);
        const int off = kmajor_off(x + q, i, Dk);
        *reinterpret_cast<uint16_t*>(hi + off) = h;
        *reinterpret_cast<uint16_t*>(hi + kPlanes / 2 + off) = l;
      }
    }
  }
}

struct State3Smem {
  // two stages of W and K^T planes, S^T planes, Vn'^T planes (and Vn^T's for the planes output),
  // decays; 1 KB for the alignment
  static size_t bytes(bool planes_out) {
    return 1024 + 2 * 2 * kPlanes + kPlanes + (planes_out ? kPlanes : kPlanes / 2) + sizeof(float) * (C + 1);
  }
};

// One CTA (two warpgroups) per (sequence, value head, 64 state columns), Dk = Dv = 128. Warpgroup
// w holds S^T's Dk columns [64 w, 64 w + 64) for all 64 state columns in registers (m64n64
// accumulators) and forms Vn's state columns [32 w, 32 w + 32). Per chunk: h_c = S to global;
// barrier; Vn = U - W S (24 wgmma m64n32k16); Vn over U in global, e^(gamma_C - gamma) Vn's
// planes to shared memory; barrier; S^T = e^gamma_C S^T + Vn'^T K (12 wgmma m64n64k16); S^T's
// planes for the next chunk. The next chunk's W and K^T planes load during the chunk.
// PlanesOut: h_c goes out as S^T's planes (hp: [chunk][Hv][64-column block] 32 KB, the
// shared image) and Vn as Vn^T's planes (vp: 16 KB a block) for gdn_out3_k, instead of fp32 h
// and Vn over U.
template <bool PlanesOut>
__global__ void __launch_bounds__(256, 1) gdn_state3_k(const float* g, int64_t Hk, int64_t Hv, GdnChunks ch, GdnScratch sc,
                                                       const uint8_t* wp, const uint8_t* ktp, float* hbuf, uint8_t* hp, uint8_t* vp) {
  constexpr int Dk = 128, Dv = 128, SWT = 64;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* St = base + 2 * 2 * kPlanes;  // hi, lo: [64 columns][128 Dk], two k panels each
  uint8_t* Vt = St + kPlanes;            // hi, lo: [64 columns][64 tokens], 8 KB each
  uint8_t* Vu = Vt + kPlanes / 2;        // PlanesOut: Vn^T (unscaled), hi, lo
  float* ek = reinterpret_cast<float*>(Vt + (PlanesOut ? kPlanes : kPlanes / 2));

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wi = warp & 3;
  const int gq = lane >> 2, tq = lane & 3;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  // sacc[4 jj + 2 h + cc]: S^T at state column 16 wi + gq + 8 h, Dk index 64 wg + 8 jj + 2 tq + cc
  float sacc[32];
  auto sidx = [&](int i) { return int64_t(64 * wg + 8 * (i >> 2) + 2 * tq + (i & 1)) * Dv + c0_col + 16 * wi + gq + 8 * ((i >> 1) & 1); };
  {
    const float* from = ch.seq_chunk[s] < cb ? sc.state_in : sc.seq_state_in && sc.seq_state_in[s] ? sc.seq_state_in[s] + sc.layer_off : nullptr;
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] = from ? from[j * Dk * Dv + sidx(i)] : 0.0f;
  }
  auto store_s = [&](float* head) {  // laid out as a state [Dk][Dv]
#pragma unroll
    for (int i = 0; i < 32; ++i) head[sidx(i)] = sacc[i];
  };
  auto write_st = [&] {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint16_t h0, l0, h1, l1;
        split_bf16(sacc[4 * jj + 2 * h], h0, l0);
        split_bf16(sacc[4 * jj + 2 * h + 1], h1, l1);
        const int off = kmajor_off(16 * wi + gq + 8 * h, 64 * wg + 8 * jj + 2 * tq, SWT);
        *reinterpret_cast<uint32_t*>(St + off) = h0 | uint32_t(h1) << 16;
        *reinterpret_cast<uint32_t*>(St + kPlanes / 2 + off) = l0 | uint32_t(l1) << 16;
      }
  };
  auto fence_acc = [](float* a, int n) {
    for (int i = 0; i < n; ++i) fence_operand(a[i]);
  };
  auto load_stage = [&](int64_t c) {
    if (c < ce) {
      uint8_t* st = base + ((c - cb) & 1) * 2 * kPlanes;
      const uint8_t* w_src = wp + ((c - sc.c0) * Hv + j) * kPlanes;
      const uint8_t* k_src = ktp + ((c - sc.c0) * Hk + kh) * kPlanes;
      for (int e = tid; e < kPlanes / 16; e += 256) {
        cp_async16(st + 16 * e, w_src + 16 * e, true);
        cp_async16(st + kPlanes + 16 * e, k_src + 16 * e, true);
      }
    }
    cp_async_commit();
  };
  float ga = 0, gb = 0;
  auto read_g = [&](int64_t c) {
    if (warp == 0 && c < ce) {
      const int64_t t0 = ch.chunk_start[c];
      const int n = ch.chunk_len[c], i0 = 2 * lane;
      ga = i0 < n ? g[(t0 + i0) * Hv + j] : 0.0f;
      gb = i0 + 1 < n ? g[(t0 + i0 + 1) * Hv + j] : 0.0f;
    }
  };
  load_stage(cb);
  read_g(cb);
  write_st();
  for (int64_t c = cb; c < ce; ++c) {
    const int n = ch.chunk_len[c];
    float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv + c0_col;  // becomes Vn
    const int64_t blk = ((c - sc.c0) * Hv + j) * (Dv / SWT) + blockIdx.z;
    if (!PlanesOut) store_s(hbuf + ((c - sc.c0) * Hv + j) * Dk * Dv);
    if (sc.snap_chunk && sc.snap_chunk[s] == c) store_s(sc.seq_state_out[s] + sc.layer_off + j * Dk * Dv);
    if (warp == 0) {  // gamma as chunk_gamma_pair sums it, then the decays
      double sum = double(ga) + double(gb);
      for (int o = 1; o < 32; o <<= 1) {
        const double v = __shfl_up_sync(0xffffffffu, sum, o);
        if (lane >= o) sum += v;
      }
      const double gam1 = sum, gam0 = sum - double(gb);
      const double gl = __shfl_sync(0xffffffffu, (n - 1) & 1 ? gam1 : gam0, (n - 1) >> 1);
      ek[2 * lane] = 2 * lane < n ? float(exp(gl - gam0)) : 0.0f;
      ek[2 * lane + 1] = 2 * lane + 1 < n ? float(exp(gl - gam1)) : 0.0f;
      if (lane == 0) ek[C] = float(exp(gl));
      read_g(c + 1);
    }
    // this thread's U (Vn's tokens 16 wi + gq (+8), state columns 32 wg + 8 jj + 2 tq (+1))
    float2 ur[8];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ur[2 * jj + h] = *reinterpret_cast<const float2*>(u + (16 * wi + gq + 8 * h) * Dv + 32 * wg + 8 * jj + 2 * tq);
    cp_async_wait<0>();  // this chunk's planes
    fence_proxy_async();
    __syncthreads();  // planes, S^T planes and decays visible; the last chunk's readers done
    load_stage(c + 1);
    if (PlanesOut)
      for (int e = tid; e < kPlanes / 16; e += 256)
        reinterpret_cast<uint4*>(hp + blk * kPlanes)[e] = reinterpret_cast<const uint4*>(St)[e];
    const uint8_t* st = base + ((c - cb) & 1) * 2 * kPlanes;
    // Vn = U - W S: M = 64 tokens, N = 32 state columns, K = Dk (two panels of four k steps)
    float vacc[16];
    fence_acc(vacc, 16);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < Dk / 16; ++k) {
      const int po = (k >> 2) * (SWT * 128) + (k & 3) * 32;
      const uint64_t ah = wgmma_desc(st + po), al = wgmma_desc(st + kPlanes / 2 + po);
      const uint64_t bh = wgmma_desc(St + 32 * wg * 128 + po), bl = wgmma_desc(St + kPlanes / 2 + 32 * wg * 128 + po);
      wgmma_bf16<32>(vacc, ah, bh, k > 0);
      wgmma_bf16<32>(vacc, ah, bl, true);
      wgmma_bf16<32>(vacc, al, bh, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(vacc, 16);
    const float eC = ek[C];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * wi + gq + 8 * h, col = 32 * wg + 8 * jj + 2 * tq;
        const float v0 = ur[2 * jj + h].x - vacc[4 * jj + 2 * h], v1 = ur[2 * jj + h].y - vacc[4 * jj + 2 * h + 1];
        const float e = ek[row];
        uint16_t h0, l0, h1, l1;
        if (PlanesOut) {
          split_bf16(v0, h0, l0);
          split_bf16(v1, h1, l1);
          const int o0 = kmajor_off(col, row, SWT), o1 = kmajor_off(col + 1, row, SWT);
          *reinterpret_cast<uint16_t*>(Vu + o0) = h0;
          *reinterpret_cast<uint16_t*>(Vu + o1) = h1;
          *reinterpret_cast<uint16_t*>(Vu + kPlanes / 4 + o0) = l0;
          *reinterpret_cast<uint16_t*>(Vu + kPlanes / 4 + o1) = l1;
        } else {
          *reinterpret_cast<float2*>(u + row * Dv + col) = make_float2(v0, v1);
        }
        split_bf16(v0 * e, h0, l0);
        split_bf16(v1 * e, h1, l1);
        const int o0 = kmajor_off(col, row, SWT), o1 = kmajor_off(col + 1, row, SWT);
        *reinterpret_cast<uint16_t*>(Vt + o0) = h0;
        *reinterpret_cast<uint16_t*>(Vt + o1) = h1;
        *reinterpret_cast<uint16_t*>(Vt + kPlanes / 4 + o0) = l0;
        *reinterpret_cast<uint16_t*>(Vt + kPlanes / 4 + o1) = l1;
      }
    fence_proxy_async();
    __syncthreads();  // Vn'^T planes whole; every warpgroup's reads of S^T's planes done
    if (PlanesOut)
      for (int e = tid; e < kPlanes / 32; e += 256)
        reinterpret_cast<uint4*>(vp + blk * (kPlanes / 2))[e] = reinterpret_cast<const uint4*>(Vu)[e];
    // S^T = e^gamma_C S^T + Vn'^T K: M = 64 state columns, N = this warpgroup's 64 Dk, K = 64 tokens
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] *= eC;
    fence_acc(sacc, 32);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < C / 16; ++k) {
      const uint64_t ah = wgmma_desc(Vt + 32 * k), al = wgmma_desc(Vt + kPlanes / 4 + 32 * k);
      const uint64_t bh = wgmma_desc(st + kPlanes + 64 * wg * 128 + 32 * k), bl = wgmma_desc(st + kPlanes + kPlanes / 2 + 64 * wg * 128 + 32 * k);
      wgmma_bf16<64>(sacc, ah, bh, true);
      wgmma_bf16<64>(sacc, ah, bl, true);
      wgmma_bf16<64>(sacc, al, bh, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(sacc, 32);
    write_st();
  }
  cp_async_wait_all();
  if (ch.seq_chunk[s + 1] > ce) store_s(sc.state_out + j * Dk * Dv);
  else if (sc.snap_chunk && sc.snap_chunk[s] == ce) store_s(sc.seq_state_out[s] + sc.layer_off + j * Dk * Dv);
}

// gdn_out3_k: O = e^gamma Q h_c + A Vn for every chunk from gdn_state3_k<true>'s planes, one CTA
// (a warpgroup) per (chunk, value head, 64 state columns): Q h (24 wgmma m64n64k16), the rows
// scaled by e^gamma, + A Vn (12 more). Q's and A's planes from gdn_planes_k.
struct Out3Smem {
  static size_t bytes() { return 1024 + 2 * kPlanes + kPlanes + sizeof(double) * C + sizeof(float) * C; }  // Q, h; A, Vn^T; decays
};

__global__ void __launch_bounds__(128) gdn_out3_k(const float* g, int64_t Hk, int64_t Hv, GdnChunks ch, GdnScratch sc, const uint8_t* qp,
                                                  const uint8_t* ap, const uint8_t* hp, const uint8_t* vp, float* o) {
  constexpr int Dv = 128, SWT = 64;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* Qs = base;                // hi, lo: [64 tokens][128 Dk]
  uint8_t* Hs = Qs + kPlanes;        // hi, lo: [64 columns][128 Dk]
  uint8_t* As = Hs + kPlanes;        // hi, lo: [64 tokens][64 tokens]
  uint8_t* Vs = As + kPlanes / 2;    // hi, lo: [64 columns][64 tokens]
  double* gam = reinterpret_cast<double*>(Vs + kPlanes / 2);
  float* eg = reinterpret_cast<float*>(gam + C);

  const int64_t ci = blockIdx.x, c = sc.c0 + ci, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int tid = threadIdx.x, lane = tid & 31, wi = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int64_t t0 = ch.chunk_start[c];
  const int n = ch.chunk_len[c];
  const int64_t blk = (ci * Hv + j) * (Dv / SWT) + blockIdx.z;
  auto copy = [&](uint8_t* dst, const uint8_t* src, int bytes) {
    for (int e = tid; e < bytes / 16; e += 128) cp_async16(dst + 16 * e, src + 16 * e, true);
  };
  copy(Qs, qp + (ci * Hk + kh) * kPlanes, kPlanes);
  copy(Hs, hp + blk * kPlanes, kPlanes);
  copy(As, ap + (ci * Hv + j) * (kPlanes / 2), kPlanes / 2);
  copy(Vs, vp + blk * (kPlanes / 2), kPlanes / 2);
  cp_async_commit();
  chunk_gamma(gam, g, t0, n, Hv, j);
  __syncthreads();
  if (tid < C) eg[tid] = float(exp(gam[tid]));
  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();
  float acc[32];
  for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int po = (k >> 2) * (64 * 128) + (k & 3) * 32;
    const uint64_t ah = wgmma_desc(Qs + po), al = wgmma_desc(Qs + kPlanes / 2 + po);
    const uint64_t bh = wgmma_desc(Hs + po), bl = wgmma_desc(Hs + kPlanes / 2 + po);
    wgmma_bf16<64>(acc, ah, bh, k > 0);
    wgmma_bf16<64>(acc, ah, bl, true);
    wgmma_bf16<64>(acc, al, bh, true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
  const float e0 = eg[16 * wi + gq], e1 = eg[16 * wi + gq + 8];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] *= (i >> 1) & 1 ? e1 : e0;
  for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint64_t ah = wgmma_desc(As + 32 * k), al = wgmma_desc(As + kPlanes / 4 + 32 * k);
    const uint64_t bh = wgmma_desc(Vs + 32 * k), bl = wgmma_desc(Vs + kPlanes / 4 + 32 * k);
    wgmma_bf16<64>(acc, ah, bh, true);
    wgmma_bf16<64>(acc, ah, bl, true);
    wgmma_bf16<64>(acc, al, bh, true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * wi + gq + 8 * h;
      if (row < n)
        *reinterpret_cast<float2*>(o + (t0 + row) * value_dim + j * Dv + c0_col + 8 * jj + 2 * tq) =
            make_float2(acc[4 * jj + 2 * h], acc[4 * jj + 2 * h + 1]);
    }
}

// ---- variant "fused4": state3's recurrence with the outputs in the same kernel ----
// gdn_planes2_k: every plane in 16-byte pieces (eight k of one row: two float4 in, a 16-byte
// store per plane out): W [tokens][Dk] and A [tokens][tokens] per (chunk, value head), Q
// [tokens][Dk] and K^T [Dk][tokens] per (chunk, key head). Q / K^T: lanes take consecutive Dk
// (K^T reads eight token rows, coalesced across the warp).
__device__ __forceinline__ void split8(const float (&v)[8], uint4& hi, uint4& lo) {
  uint32_t h[4], l[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const __nv_bfloat162 hh = __floats2bfloat162_rn(v[2 * q], v[2 * q + 1]);
    const float2 hf = __bfloat1622float2(hh);
    const __nv_bfloat162 ll = __floats2bfloat162_rn(v[2 * q] - hf.x, v[2 * q + 1] - hf.y);
    h[q] = *reinterpret_cast<const uint32_t*>(&hh);
    l[q] = *reinterpret_cast<const uint32_t*>(&ll);
  }
  hi = make_uint4(h[0], h[1], h[2], h[3]);
  lo = make_uint4(l[0], l[1], l[2], l[3]);
}
__device__ __forceinline__ void put8(uint8_t* hi, int plane, int off, const float (&v)[8]) {
  uint4 h, l;
  split8(v, h, l);
  *reinterpret_cast<uint4*>(hi + off) = h;
  *reinterpret_cast<uint4*>(hi + plane + off) = l;
}

__global__ void __launch_bounds__(256) gdn_planes2_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, GdnChunks ch, GdnScratch sc,
                                                     uint8_t* wp, uint8_t* ap, uint8_t* qp, uint8_t* ktp) {
  constexpr int Dk = 128;
  const int64_t ci = blockIdx.x, c = sc.c0 + ci, y = blockIdx.y;
  const int tid = threadIdx.x;
  if (y < Hv) {
    const float* w = sc.w + (ci * Hv + y) * C * Dk;
    const float* a = sc.aqk + (ci * Hv + y) * C * C;
    for (int e = tid; e < C * Dk / 8 + C * C / 8; e += 256) {
      const bool isw = e < C * Dk / 8;
      const int ee = isw ? e : e - C * Dk / 8, cols = isw ? Dk : C;
      const int r = ee / (cols / 8), k = (ee % (cols / 8)) * 8;
      const float* src = (isw ? w : a) + r * cols + k;
      const float4 v0 = reinterpret_cast<const float4*>(src)[0], v1 = reinterpret_cast<const float4*>(src)[1];
      const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      if (isw) put8(wp + (ci * Hv + y) * kPlanes, kPlanes / 2, kmajor_off(r, k, C), v);
      else put8(ap + (ci * Hv + y) * (kPlanes / 2), kPlanes / 4, kmajor_off(r, k, C), v);
    }
  }
  if (y < Hk) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* q = mixed + t0 * conv_dim + y * Dk;
    const float* k = q + Hk * Dk;
    for (int e = tid; e < 2 * C * Dk / 8; e += 256) {
      float v[8];
      if (e < C * Dk / 8) {  // Q: row i, Dk 8 kk ..
        const int i = e / (Dk / 8), kk = (e % (Dk / 8)) * 8;
        for (int m = 0; m < 8; ++m) v[m] = i < n ? q[i * conv_dim + kk + m] : 0.0f;
        put8(qp + (ci * Hk + y) * kPlanes, kPlanes / 2, kmajor_off(i, kk, C), v);
      } else {  // K^T: row x (Dk), tokens i0 ..
        const int ee = e - C * Dk / 8, x = ee % Dk, i0 = (ee / Dk) * 8;
        for (int m = 0; m < 8; ++m) v[m] = i0 + m < n ? k[(i0 + m) * conv_dim + x] : 0.0f;
        put8(ktp + (ci * Hk + y) * kPlanes, kPlanes / 2, kmajor_off(x, i0, Dk), v);
      }
    }
  }
}

struct Fused4Smem {
  // W, Q, K^T planes (32 KB each), A planes (16 KB), S^T planes (32 KB), Vn'^T and Vn^T planes
  // (16 KB each), decays; 1 KB for the alignment
  static size_t bytes() { return 1024 + 4 * kPlanes + kPlanes / 2 + kPlanes + kPlanes + sizeof(float) * (2 * C + 1); }
};

// One CTA (two warpgroups) per (sequence, value head, 64 state columns), Dk = Dv = 128; S^T in
// registers as in gdn_state3_k. Per chunk: barrier; Vn = U - W S and Q S (48 wgmma a
// warpgroup, both on S^T's planes); Vn'^T and Vn^T planes; Q S rows scaled by e^gamma;
// barrier; S^T = e^gamma_C S^T + Vn'^T K and O = ... + A Vn (24 more); O out; S^T's planes.
// W and Q of the next chunk load during the second half, K^T and A during the first.
__global__ void __launch_bounds__(256, 1) gdn_fused4_k(const float* g, int64_t Hk, int64_t Hv, GdnChunks ch, GdnScratch sc,
                                                       const uint8_t* wp, const uint8_t* ap, const uint8_t* qp, const uint8_t* ktp, float* o) {
  constexpr int Dk = 128, Dv = 128, SWT = 64;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* Wb = base;                 // [64 tokens][128 Dk]
  uint8_t* Qb = Wb + kPlanes;         // [64 tokens][128 Dk]
  uint8_t* Kb = Qb + kPlanes;         // [128 Dk][64 tokens]
  uint8_t* St = Kb + kPlanes;         // [64 columns][128 Dk]
  uint8_t* Ab = St + kPlanes;         // [64 tokens][64 tokens]
  uint8_t* Vt = Ab + kPlanes / 2;     // (e^(gamma_C - gamma) Vn)^T [64 columns][64 tokens]
  uint8_t* Vu = Vt + kPlanes / 2;     // Vn^T
  float* ek = reinterpret_cast<float*>(Vu + kPlanes / 2);  // [C] e^(gamma_C - gamma_i), [C] e^gamma_C
  float* eg = ek + C + 1;                                  // [C] e^gamma_i

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SWT;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wi = warp & 3;
  const int gq = lane >> 2, tq = lane & 3;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  float sacc[32];
  auto sidx = [&](int i) { return int64_t(64 * wg + 8 * (i >> 2) + 2 * tq + (i & 1)) * Dv + c0_col + 16 * wi + gq + 8 * ((i >> 1) & 1); };
  {
    const float* from = ch.seq_chunk[s] < cb ? sc.state_in : sc.seq_state_in && sc.seq_state_in[s] ? sc.seq_state_in[s] + sc.layer_off : nullptr;
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] = from ? from[j * Dk * Dv + sidx(i)] : 0.0f;
  }
  auto store_s = [&](float* head) {
#pragma unroll
    for (int i = 0; i < 32; ++i) head[sidx(i)] = sacc[i];
  };
  // S^T's planes: this thread's pairs (state column 16 wi + gq + 8 h, Dk 64 wg + 8 jj + 2 tq (+1));
  // the row's swizzle phase is gq, its Dk panel wg
  auto write_st = [&] {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 hh = __floats2bfloat162_rn(sacc[4 * jj + 2 * h], sacc[4 * jj + 2 * h + 1]);
        const float2 hf = __bfloat1622float2(hh);
        const __nv_bfloat162 ll = __floats2bfloat162_rn(sacc[4 * jj + 2 * h] - hf.x, sacc[4 * jj + 2 * h + 1] - hf.y);
        const int off = wg * (SWT * 128) + (16 * wi + gq + 8 * h) * 128 + ((jj ^ gq) << 4) + 4 * tq;
        *reinterpret_cast<__nv_bfloat162*>(St + off) = hh;
        *reinterpret_cast<__nv_bfloat162*>(St + kPlanes / 2 + off) = ll;
      }
  };
  auto fence_acc = [](float* a, int n) {
    for (int i = 0; i < n; ++i) fence_operand(a[i]);
  };
  auto copy = [&](uint8_t* dst, const uint8_t* src, int bytes) {
    for (int e = tid; e < bytes / 16; e += 256) cp_async16(dst + 16 * e, src + 16 * e, true);
  };
  auto load_wq = [&](int64_t c) {
    if (c < ce) {
      copy(Wb, wp + ((c - sc.c0) * Hv + j) * kPlanes, kPlanes);
      copy(Qb, qp + ((c - sc.c0) * Hk + kh) * kPlanes, kPlanes);
    }
    cp_async_commit();
  };
  auto load_ka = [&](int64_t c) {
    copy(Kb, ktp + ((c - sc.c0) * Hk + kh) * kPlanes, kPlanes);
    copy(Ab, ap + ((c - sc.c0) * Hv + j) * (kPlanes / 2), kPlanes / 2);
    cp_async_commit();
  };
  float ga = 0, gb = 0;
  auto read_g = [&](int64_t c) {
    if (warp == 0 && c < ce) {
      const int64_t t0 = ch.chunk_start[c];
      const int n = ch.chunk_len[c], i0 = 2 * lane;
      ga = i0 < n ? g[(t0 + i0) * Hv + j] : 0.0f;
      gb = i0 + 1 < n ? g[(t0 + i0 + 1) * Hv + j] : 0.0f;
    }
  };
  load_wq(cb);
  read_g(cb);
  write_st();
  for (int64_t c = cb; c < ce; ++c) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv + c0_col;
    if (sc.snap_chunk && sc.snap_chunk[s] == c) store_s(sc.seq_state_out[s] + sc.layer_off + j * Dk * Dv);
    if (warp == 0) {  // gamma as chunk_gamma_pair sums it, then the decays
      double sum = double(ga) + double(gb);
      for (int of = 1; of < 32; of <<= 1) {
        const double v = __shfl_up_sync(0xffffffffu, sum, of);
        if (lane >= of) sum += v;
      }
      const double gam1 = sum, gam0 = sum - double(gb);
      const double gl = __shfl_sync(0xffffffffu, (n - 1) & 1 ? gam1 : gam0, (n - 1) >> 1);
      ek[2 * lane] = 2 * lane < n ? float(exp(gl - gam0)) : 0.0f;
      ek[2 * lane + 1] = 2 * lane + 1 < n ? float(exp(gl - gam1)) : 0.0f;
      eg[2 * lane] = float(exp(gam0));
      eg[2 * lane + 1] = float(exp(gam1));
      if (lane == 0) ek[C] = float(exp(gl));
      read_g(c + 1);
    }
    float2 ur[8];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ur[2 * jj + h] = *reinterpret_cast<const float2*>(u + (16 * wi + gq + 8 * h) * Dv + 32 * wg + 8 * jj + 2 * tq);
    cp_async_wait<0>();  // W and Q
    fence_proxy_async();
    __syncthreads();  // W, Q, S^T planes and decays visible; the last chunk's readers done
    load_ka(c);
    // Vn = U - W S and Q S: M = 64 tokens, N = this warpgroup's 32 state columns, K = Dk
    float vacc[16], oacc[16];
    fence_acc(vacc, 16);
    fence_acc(oacc, 16);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < Dk / 16; ++k) {
      const int po = (k >> 2) * (SWT * 128) + (k & 3) * 32;
      const uint64_t bh = wgmma_desc(St + 32 * wg * 128 + po), bl = wgmma_desc(St + kPlanes / 2 + 32 * wg * 128 + po);
      const uint64_t wh = wgmma_desc(Wb + po), wl = wgmma_desc(Wb + kPlanes / 2 + po);
      const uint64_t qh = wgmma_desc(Qb + po), ql = wgmma_desc(Qb + kPlanes / 2 + po);
      wgmma_bf16<32>(vacc, wh, bh, k > 0);
      wgmma_bf16<32>(oacc, qh, bh, k > 0);
      wgmma_bf16<32>(vacc, wh, bl, true);
      wgmma_bf16<32>(oacc, qh, bl, true);
      wgmma_bf16<32>(vacc, wl, bh, true);
      wgmma_bf16<32>(oacc, ql, bh, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(vacc, 16);
    fence_acc(oacc, 16);
    const float eC = ek[C];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * wi + gq + 8 * h, col = 32 * wg + 8 * jj + 2 * tq;
        const float v0 = ur[2 * jj + h].x - vacc[4 * jj + 2 * h], v1 = ur[2 * jj + h].y - vacc[4 * jj + 2 * h + 1];
        const float e = ek[row], eo = eg[row];
        oacc[4 * jj + 2 * h] *= eo;
        oacc[4 * jj + 2 * h + 1] *= eo;
        // (col, row) and (col + 1, row) in [columns][tokens] planes: col's swizzle phase is 2 tq (+1)
        const int o0 = col * 128 + ((((row >> 3)) ^ (2 * tq)) << 4) + 2 * gq, o1 = (col + 1) * 128 + ((((row >> 3)) ^ (2 * tq + 1)) << 4) + 2 * gq;
        uint16_t h0, l0, h1, l1;
        split_bf16(v0 * e, h0, l0);
        split_bf16(v1 * e, h1, l1);
        *reinterpret_cast<uint16_t*>(Vt + o0) = h0;
        *reinterpret_cast<uint16_t*>(Vt + o1) = h1;
        *reinterpret_cast<uint16_t*>(Vt + kPlanes / 4 + o0) = l0;
        *reinterpret_cast<uint16_t*>(Vt + kPlanes / 4 + o1) = l1;
        split_bf16(v0, h0, l0);
        split_bf16(v1, h1, l1);
        *reinterpret_cast<uint16_t*>(Vu + o0) = h0;
        *reinterpret_cast<uint16_t*>(Vu + o1) = h1;
        *reinterpret_cast<uint16_t*>(Vu + kPlanes / 4 + o0) = l0;
        *reinterpret_cast<uint16_t*>(Vu + kPlanes / 4 + o1) = l1;
      }
    cp_async_wait<0>();  // K^T and A
    fence_proxy_async();
    __syncthreads();  // Vn planes whole, K^T and A visible; W, Q and S^T's planes read by all
    load_wq(c + 1);
    // S^T = e^gamma_C S^T + Vn'^T K (M = 64 columns, N = this warpgroup's 64 Dk, K = 64 tokens)
    // and O += A Vn (M = 64 tokens, N = its 32 columns, K = 64 tokens)
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] *= eC;
    fence_acc(sacc, 32);
    fence_acc(oacc, 16);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < C / 16; ++k) {
      const uint64_t vh = wgmma_desc(Vt + 32 * k), vl = wgmma_desc(Vt + kPlanes / 4 + 32 * k);
      const uint64_t kh_ = wgmma_desc(Kb + 64 * wg * 128 + 32 * k), kl = wgmma_desc(Kb + kPlanes / 2 + 64 * wg * 128 + 32 * k);
      const uint64_t ah = wgmma_desc(Ab + 32 * k), al = wgmma_desc(Ab + kPlanes / 4 + 32 * k);
      const uint64_t uh = wgmma_desc(Vu + 32 * wg * 128 + 32 * k), ul = wgmma_desc(Vu + kPlanes / 4 + 32 * wg * 128 + 32 * k);
      wgmma_bf16<64>(sacc, vh, kh_, true);
      wgmma_bf16<32>(oacc, ah, uh, true);
      wgmma_bf16<64>(sacc, vh, kl, true);
      wgmma_bf16<32>(oacc, ah, ul, true);
      wgmma_bf16<64>(sacc, vl, kh_, true);
      wgmma_bf16<32>(oacc, al, uh, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(sacc, 32);
    fence_acc(oacc, 16);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * wi + gq + 8 * h;
        if (row < n)
          *reinterpret_cast<float2*>(o + (t0 + row) * value_dim + j * Dv + c0_col + 32 * wg + 8 * jj + 2 * tq) =
              make_float2(oacc[4 * jj + 2 * h], oacc[4 * jj + 2 * h + 1]);
      }
    write_st();
  }
  cp_async_wait_all();
  if (ch.seq_chunk[s + 1] > ce) store_s(sc.state_out + j * Dk * Dv);
  else if (sc.snap_chunk && sc.snap_chunk[s] == ce) store_s(sc.seq_state_out[s] + sc.layer_off + j * Dk * Dv);
}

}  // namespace
}  // namespace clefrt::cuda

using namespace clefrt;
using namespace clefrt::cuda;
using bench::median_ms;

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    for (const void* k : {(const void*)gdn_chunk_scan_tc_k<Mma::Tf32x3>, (const void*)gdn_chunk_scan_tc_k<Mma::Tf32>,
                          (const void*)gdn_chunk_scan_tc_k<Mma::Bf16>, (const void*)gdn_chunk_state_tc_k, (const void*)gdn_chunk_out_tc_k,
                          (const void*)gdn_scan_narrow_k<16>, (const void*)gdn_scan_narrow_k<32>, (const void*)gdn_state2_k<64>,
                          (const void*)gdn_out2_k<64>, (const void*)gdn_out2_k<128>, (const void*)gdn_state3_k<false>,
                          (const void*)gdn_state3_k<true>, (const void*)gdn_out3_k,
                          (const void*)gdn_fused4_k})
      check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "lab smem");
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    const int64_t Hk = 16, Hv = 48, Dk = 128, Dv = 128, conv_dim = 2 * Hk * Dk + Hv * Dv;
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t seqs, len;
    };
    // CLEFRT_LAB_ONLY=NAME: the product and the variants whose names contain NAME, at 1 x 8,192
    // only (a profiler's run)
    const char* only = std::getenv("CLEFRT_LAB_ONLY");
    for (Shape sh : {Shape{"1x8192", 1, 8192}, Shape{"8x1024", 8, 1024}, Shape{"64x512", 64, 512}}) {
      if (only && sh.seqs != 1) break;
      const int64_t L = sh.seqs * sh.len;
      std::vector<int32_t> cs, cl, sc = {0};
      for (int64_t q = 0; q < sh.seqs; ++q) {
        for (int64_t t = 0; t < sh.len; t += 64) {
          cs.push_back(int32_t(q * sh.len + t));
          cl.push_back(int32_t(std::min<int64_t>(64, sh.len - t)));
        }
        sc.push_back(int32_t(cs.size()));
      }
      const int64_t nc = int64_t(cs.size());
      auto up = [&](const std::vector<int32_t>& v, const char* what) {
        DeviceBuffer b(v.size() * 4, what);
        check(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), what);
        return b;
      };
      DeviceBuffer dcs = up(cs, "chunk starts"), dcl = up(cl, "chunk lengths"), dsc = up(sc, "seq chunks");
      DeviceBuffer mixed(size_t(L * conv_dim) * 4, "mixed"), ba(size_t(L * 2 * Hv) * 4, "b|a"), negA(size_t(Hv) * 4, "negA"),
          dtb(size_t(Hv) * 4, "dt_bias"), g(size_t(L * Hv) * 4, "g"), beta(size_t(L * Hv) * 4, "beta");
      DeviceBuffer w(size_t(nc * Hv * 64 * Dk) * 4, "W"), u(size_t(nc * Hv * 64 * Dv) * 4, "U"), a(size_t(nc * Hv * 64 * 64) * 4, "A"),
          h(size_t(nc * Hv * Dk * Dv) * 4, "h"), wp(size_t(nc * Hv) * kPlanes, "W planes"), ktp(size_t(nc * Hk) * kPlanes, "K^T planes"),
          qp(size_t(nc * Hk) * kPlanes, "Q planes"), ap(size_t(nc * Hv) * kPlanes / 2, "A planes"), hp(size_t(nc * Hv * 2) * kPlanes, "h planes"),
          vp(size_t(nc * Hv * 2) * kPlanes / 2, "Vn planes"), o(size_t(L * Hv * Dv) * 4, "o"), o_ref(size_t(L * Hv * Dv) * 4, "o product");
      fill_normal_f32(mixed.as<float>(), L * conv_dim, 21, 0.0f, 1.0f, s);
      fill_normal_f32(ba.as<float>(), L * 2 * Hv, 22, 0.0f, 1.0f, s);
      fill_normal_f32(negA.as<float>(), Hv, 23, -1.0f, 0.3f, s);
      fill_normal_f32(dtb.as<float>(), Hv, 24, 0.0f, 0.5f, s);
      gdn_prep(mixed.as<float>(), conv_dim, L, Hk, Dk, ba.as<float>(), ba.as<float>() + Hv, 2 * Hv, Hv, negA.as<float>(), dtb.as<float>(),
               g.as<float>(), beta.as<float>(), s);
      const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, sh.seqs};
      const GdnScratch scr{w.as<float>(), u.as<float>(), a.as<float>()};
      const float* mx = mixed.as<float>();
      const float* gg = g.as<float>();
      const dim3 sgrid(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / SW)), ogrid(unsigned(nc), unsigned(Hv), unsigned(Dv / SW));
      auto prep = [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s); };
      struct Variant {
        const char* name;
        std::function<void(float*)> scan;
      };
      const std::vector<Variant> variants = {
          {"product", [&](float* out) { gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s); }},
          {"regs nw1", [&](float* out) {
             gdn_chunk_scan_rs_k<16, 1, true><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 16)), 32, 0, s>>>(mx, conv_dim, Hk, Hv, Dv,
                                                                                                                  gg, ch, scr, out);
           }},
          {"regs nw2", [&](float* out) {
             gdn_chunk_scan_rs_k<16, 2, true><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 32)), 64, 0, s>>>(mx, conv_dim, Hk, Hv, Dv,
                                                                                                                  gg, ch, scr, out);
           }},
          {"regs nw4", [&](float* out) {
             gdn_chunk_scan_rs_k<16, 4, true><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 128, 0, s>>>(mx, conv_dim, Hk, Hv, Dv,
                                                                                                                   gg, ch, scr, out);
           }},
          {"regs tf32", [&](float* out) {
             gdn_chunk_scan_rs_k<16, 2, false><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 32)), 64, 0, s>>>(mx, conv_dim, Hk, Hv, Dv,
                                                                                                                   gg, ch, scr, out);
           }},
          {"fused 3xtf32", [&](float* out) {
             gdn_chunk_scan_tc_k<Mma::Tf32x3><<<sgrid, 256, ScanTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, out);
           }},
          {"fused tf32", [&](float* out) {
             gdn_chunk_scan_tc_k<Mma::Tf32><<<sgrid, 256, ScanTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, out);
           }},
          {"fused bf16", [&](float* out) {
             gdn_chunk_scan_tc_k<Mma::Bf16><<<sgrid, 256, ScanTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, out);
           }},
          {"narrow sw16", [&](float* out) {
             gdn_scan_narrow_k<16><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 16)), 256, NarrowSmem<16>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, out);
           }},
          {"narrow sw32", [&](float* out) {
             gdn_scan_narrow_k<32><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 32)), 256, NarrowSmem<32>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, out);
           }},
          {"split 3xtf32", [&](float* out) {
             gdn_chunk_state_tc_k<<<sgrid, 256, StateTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>());
             gdn_chunk_out_tc_k<<<ogrid, 256, OutTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>(), out);
           }},
          {"split2 sw64", [&](float* out) {
             gdn_state2_k<64><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State2Smem<64>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>());
             gdn_out2_k<64><<<dim3(unsigned(nc), unsigned(Hv), unsigned(Dv / 64)), 256, Out2Smem<64>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>(), out);
           }},
          {"split2 out128", [&](float* out) {
             gdn_state2_k<64><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State2Smem<64>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>());
             gdn_out2_k<128><<<dim3(unsigned(nc), unsigned(Hv), 1u), 256, Out2Smem<128>::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg,
                                                                                                     ch, scr, h.as<float>(), out);
           }},
          {"state3 bf16x3", [&](float* out) {
             gdn_planes_k<<<dim3(unsigned(nc), unsigned(std::max(Hv, Hk))), 256, 0, s>>>(mx, conv_dim, Hk, Hv, ch, scr, wp.as<uint8_t>(),
                                                                                     ktp.as<uint8_t>());
             gdn_state3_k<false><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State3Smem::bytes(false), s>>>(
                 gg, Hk, Hv, ch, scr, wp.as<uint8_t>(), ktp.as<uint8_t>(), h.as<float>(), nullptr, nullptr);
             gdn_out2_k<64><<<dim3(unsigned(nc), unsigned(Hv), unsigned(Dv / 64)), 256, Out2Smem<64>::bytes(Dk), s>>>(
                 mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>(), out);
           }},
          {"state3 out3", [&](float* out) {
             gdn_planes_k<<<dim3(unsigned(nc), unsigned(std::max(Hv, Hk))), 256, 0, s>>>(mx, conv_dim, Hk, Hv, ch, scr, wp.as<uint8_t>(),
                                                                                     ktp.as<uint8_t>(), qp.as<uint8_t>(), ap.as<uint8_t>());
             gdn_state3_k<true><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State3Smem::bytes(true), s>>>(
                 gg, Hk, Hv, ch, scr, wp.as<uint8_t>(), ktp.as<uint8_t>(), nullptr, hp.as<uint8_t>(), vp.as<uint8_t>());
             gdn_out3_k<<<dim3(unsigned(nc), unsigned(Hv), unsigned(Dv / 64)), 128, Out3Smem::bytes(), s>>>(
                 gg, Hk, Hv, ch, scr, qp.as<uint8_t>(), ap.as<uint8_t>(), hp.as<uint8_t>(), vp.as<uint8_t>(), out);
           }},
          {"fused4 bf16x3", [&](float* out) {
             gdn_planes2_k<<<dim3(unsigned(nc), unsigned(std::max(Hv, Hk))), 256, 0, s>>>(mx, conv_dim, Hk, Hv, ch, scr, wp.as<uint8_t>(),
                                                                                      ap.as<uint8_t>(), qp.as<uint8_t>(), ktp.as<uint8_t>());
             gdn_fused4_k<<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, Fused4Smem::bytes(), s>>>(
                 gg, Hk, Hv, ch, scr, wp.as<uint8_t>(), ap.as<uint8_t>(), qp.as<uint8_t>(), ktp.as<uint8_t>(), out);
           }},
          {"simt", [&](float* out) { gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s, GdnPath::Simt); }},
      };
      const size_t N = size_t(L * Hv * Dv);
      std::vector<float> ref(N), got(N);
      // every variant from a fresh prep (the split one writes Vn over U); times are prep + scan - prep
      const double t_prep = median_ms(s, prep);
      const double flop_prep = 2.0 * (2 * 64 * 64 * Dk + 64 * 64 * (Dk + Dv)) * double(nc * Hv);
      const double flop_scan = 2.0 * (64 * Dk * Dv * 3 + 64 * 64 * Dv) * double(nc * Hv);
      std::printf("\n%s: %lld chunks; prep %.3f ms (%.1f TFLOP/s, %.3f of the bf16 peak)\n", sh.name, (long long)nc, t_prep,
                  flop_prep / (t_prep * 1e-3) / 1e12, flop_prep / (t_prep * 1e-3) / 1e12 / hw.peak_bf16_tflops);
      json::Value pts = json::Value::array();
      double t_product = 0;
      for (const Variant& v : variants) {
        if (only && v.name != std::string("product") && !std::strstr(v.name, only)) continue;
        float* out = v.name == std::string("product") ? o_ref.as<float>() : o.as<float>();
        prep();
        v.scan(out);
        check_launch(v.name);
        check(cudaStreamSynchronize(s), v.name);
        check(cudaMemcpy((out == o_ref.as<float>() ? ref : got).data(), out, N * 4, cudaMemcpyDeviceToHost), "copy");
        size_t differ = 0;
        double max_ref = 0, max_err = 0, se = 0, sr = 0;
        if (out != o_ref.as<float>())
          for (size_t i = 0; i < N; ++i) {
            differ += std::memcmp(&got[i], &ref[i], 4) != 0;
            const double e = double(got[i]) - double(ref[i]);
            max_err = std::max(max_err, std::fabs(e));
            max_ref = std::max(max_ref, std::fabs(double(ref[i])));
            se += e * e;
            sr += double(ref[i]) * double(ref[i]);
          }
        const double t = median_ms(s, [&] {
          prep();
          v.scan(out);
        }) - t_prep;
        if (out == o_ref.as<float>()) t_product = t;
        const double rel_max = max_ref > 0 ? max_err / max_ref : 0, rel_rms = sr > 0 ? std::sqrt(se / sr) : 0;
        std::printf("  %-13s scan %7.3f ms (%.2fx the product's) %6.1f TFLOP/s | prep + scan %7.3f ms | vs the product: %zu of %zu bits "
                    "differ, max |err| / max |o| %.2e, rms rel %.2e\n",
                    v.name, t, t / t_product, flop_scan / (t * 1e-3) / 1e12, t_prep + t, differ, N, rel_max, rel_rms);
        json::Value r = json::Value::object();
        r.add("variant", json::Value::string(v.name));
        r.add("m", json::Value::integer(L));
        r.add("sequences", json::Value::integer(sh.seqs));
        r.add("prep_ms", json::Value::number(t_prep));
        r.add("scan_ms", json::Value::number(t));
        r.add("outputs_differing_from_product", json::Value::integer(int64_t(differ)));
        r.add("max_err_over_max_out", json::Value::number(rel_max));
        r.add("rms_rel_err", json::Value::number(rel_rms));
        pts.arr.push_back(std::move(r));
      }
      // the split variants' sequential kernels alone (their output kernels are the difference)
      for (int k = 0; k < 6 && !only; ++k) {
        const double t = median_ms(s, [&] {
          prep();
          if (k >= 4) {
            gdn_planes2_k<<<dim3(unsigned(nc), unsigned(std::max(Hv, Hk))), 256, 0, s>>>(mx, conv_dim, Hk, Hv, ch, scr, wp.as<uint8_t>(),
                                                                                     ap.as<uint8_t>(), qp.as<uint8_t>(), ktp.as<uint8_t>());
            if (k == 5)
              gdn_fused4_k<<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, Fused4Smem::bytes(), s>>>(
                  gg, Hk, Hv, ch, scr, wp.as<uint8_t>(), ap.as<uint8_t>(), qp.as<uint8_t>(), ktp.as<uint8_t>(), o.as<float>());
            return;
          }
          if (k >= 2)
            gdn_planes_k<<<dim3(unsigned(nc), unsigned(std::max(Hv, Hk))), 256, 0, s>>>(mx, conv_dim, Hk, Hv, ch, scr, wp.as<uint8_t>(),
                                                                                    ktp.as<uint8_t>());
          if (k == 3)
            gdn_state3_k<false><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State3Smem::bytes(false), s>>>(
                gg, Hk, Hv, ch, scr, wp.as<uint8_t>(), ktp.as<uint8_t>(), h.as<float>(), nullptr, nullptr);
          if (k >= 2) return;
          if (k == 0)
            gdn_chunk_state_tc_k<<<sgrid, 256, StateTcSmem::bytes(Dk), s>>>(mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>());
          else
            gdn_state2_k<64><<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / 64)), 256, State2Smem<64>::bytes(Dk), s>>>(
                mx, conv_dim, Hk, Hv, Dk, Dv, gg, ch, scr, h.as<float>());
        }) - t_prep;
        const char* what[6] = {"split 3xtf32 state kernel", "split2 sw64 state kernel", "state3 planes kernel", "state3 planes + state kernels",
                               "fused4 planes2 kernel", "fused4 planes2 + fused kernels"};
        std::printf("  %-30s alone %7.3f ms\n", what[k], t);
        json::Value r = json::Value::object();
        r.add("variant", json::Value::string(what[k]));
        r.add("m", json::Value::integer(L));
        r.add("sequences", json::Value::integer(sh.seqs));
        r.add("scan_ms", json::Value::number(t));
        pts.arr.push_back(std::move(r));
      }
      shapes.arr.push_back(bench::shape_record(sh.name, Hv * Dv, Dk, std::move(pts)));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_gdn", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_gdn: %s\n", e.what());
    return 1;
  }
  return 0;
}

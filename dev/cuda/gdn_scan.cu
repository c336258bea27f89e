// The GDN chunked prefill's scan, kernel variants side by side (issue 20), at the 27B model's
// GDN shapes (Hk 16, Hv 48, Dk = Dv = 128) on random inputs normalised as the engine's gdn_prep
// leaves them. Per batch shape (1 x 8,192, 8 x 1,024, 64 x 512 tokens; one layer; CUDA events,
// median of 20 after 3 warm-ups; each run from a fresh 3xTF32 prep, whose time is subtracted;
// "scan" is the scan alone, "prep + scan" adds the prep it reads: the 3xTF32 one, or its own):
//   3xtf32        gdn_chunk_scan on GdnPath::TensorCores: the engine's mma.sync 3xTF32 kernel
//                 (fp32-level: the reference the others are compared with)
//   product       gdn_chunk_scan as the engine runs it (Auto; on the Wgmma path with its own prep)
//   wgmma bf16x3  gdn_chunk_prep + gdn_chunk_scan on GdnPath::Wgmma (kernels_gdn_wgmma.cu: the
//                 prep on bf16x3 wgmmas writing U in fp32, W and A as planes, the Q / K planes, the
//                 fused bf16x3 wgmma scan): it runs its own prep, timed alone first (the last
//                 line prints both preps)
//   wgmma bf16 one pass, planes  the same two kernels with one bf16 pass per product
//                 (gdn_wgmma_one_pass_bf16: the hi planes alone; FlashInfer's and fla's precision),
//                 its own prep timed alone (CLEFRT_GDN_SCAN=planes)
//   wgmma bf16, state in regs  the one-pass prep, then gdn_scan_rs_k (the state as wgmma's register
//                 operand; Auto's choice on Hopper), one or two warpgroups a CTA by shape, or
//                 forced (1wg, 2wg; gdn_wgmma_set_scan_rs_wgs)
//   fused 3xtf32  this file's copy of the 3xTF32 kernel (its bits must equal 3xtf32's)
//   regs nwN      gdn_scan_regs.cuh: the state in registers, one warp per 16 state columns, N
//                 warps a CTA (1, 2, 4), 3xTF32; regs tf32: 2 warps, plain TF32 products
//   fused tf32    the same kernel with plain TF32 products (one MMA instead of three)
//   fused bf16    the same kernel with bf16 m16n8k16 products (fp32 accumulation; fla's choice)
//   narrow sw16   the fused kernel over 16 state columns per CTA (twice the CTAs, three per SM),
//                 sw32 the same layout at 32 columns: the same bits as 3xtf32
//   split 3xtf32  a state kernel (the recurrence alone, next chunk's loads under the update)
//               + a parallel output kernel over saved chunk states: the same bits, and slower
//   simt          the engine's CUDA-core scan
// Measured and removed (bench/results/2026-12-04-h200-session21.md, code in git history at
// 5181a18 / 78cb692): a mma.sync state kernel at 64 columns with a three-tile load ring
// ("split2"), and the bf16x3 wgmma recurrence split from a wgmma output kernel ("state3 out3");
// the Wgmma scan on the 3xTF32 prep's W and A made planes ("wgmma scan on 3xtf32 prep": within
// 9.2e-6 of 3xtf32 where the Wgmma prep gives 1.1e-5; removed at 1f4fa1c when the Wgmma prep took
// over making the scan's Q and K^T planes (K planes, [tokens][Dk], since session 29):
// 2026-12-05-h200-lab-gdn-1f4fa1c.txt).
// Error is against 3xtf32's output, which the GPU tests hold to the CPU's fp32 within 2e-5
// relative. Rates count each product once (useful FLOPs), for scale against the measured bf16
// GEMM peak. Usage: clefrt_bench_gdn [--commit ID] [--json FILE] [--anchors FILE] (kernel_anchors.py's
// JSON from the same call: fla's time a layer printed beside the product's); CLEFRT_LAB_ONLY=NAME in the
// environment runs 3xtf32 and the variants whose names contain NAME at 1 x 8,192 alone.
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

}  // namespace
}  // namespace clefrt::cuda

using namespace clefrt;
using namespace clefrt::cuda;
using bench::median_ms;

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    // the variants name their precision; "product" runs the engine's (one pass unless
    // CLEFRT_GDN_PRODUCTS=bf16x3), the others set theirs
    const bool product_one_pass = gdn_wgmma_one_pass_bf16();
    gdn_wgmma_set_one_pass_bf16(false);
    const HardwareLimits hw = bench::measure_and_print_hardware();
    const json::Value anchors = bench::load_anchors(opt.anchors, hw.gpu);
    for (const void* k : {(const void*)gdn_chunk_scan_tc_k<Mma::Tf32x3>, (const void*)gdn_chunk_scan_tc_k<Mma::Tf32>,
                          (const void*)gdn_chunk_scan_tc_k<Mma::Bf16>, (const void*)gdn_chunk_state_tc_k, (const void*)gdn_chunk_out_tc_k,
                          (const void*)gdn_scan_narrow_k<16>, (const void*)gdn_scan_narrow_k<32>})
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
    // CLEFRT_LAB_PREP_ONLY=1: the preps alone at every shape (an A/B of a prep change)
    const bool prep_only = std::getenv("CLEFRT_LAB_PREP_ONLY") != nullptr;
    // CLEFRT_LAB_FORMS_ONLY=1: the 3xTF32 reference, then the W / U and T forms from bf16 rows, at
    // every shape (the suite's lab-gdn-form)
    const bool forms_only = std::getenv("CLEFRT_LAB_FORMS_ONLY") != nullptr;
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
          h(size_t(nc * Hv * Dk * Dv) * 4, "h"), o(size_t(L * Hv * Dv) * 4, "o"), o_ref(size_t(L * Hv * Dv) * 4, "o 3xTF32");
      fill_normal_f32(mixed.as<float>(), L * conv_dim, 21, 0.0f, 1.0f, s);
      fill_normal_f32(ba.as<float>(), L * 2 * Hv, 22, 0.0f, 1.0f, s);
      fill_normal_f32(negA.as<float>(), Hv, 23, -1.0f, 0.3f, s);
      fill_normal_f32(dtb.as<float>(), Hv, 24, 0.0f, 0.5f, s);
      gdn_prep(mixed.as<float>(), conv_dim, L, Hk, Dk, ba.as<float>(), ba.as<float>() + Hv, 2 * Hv, Hv, negA.as<float>(), dtb.as<float>(),
               g.as<float>(), beta.as<float>(), s);
      const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, sh.seqs};
      GdnScratch scr{w.as<float>(), u.as<float>(), a.as<float>()};
      const GdnPlaneBytes pb = gdn_plane_bytes(Hk, Hv);
      DeviceBuffer wp(size_t(nc * pb.w), "W planes"), ap(size_t(nc * pb.a), "A planes"), qp(size_t(nc * pb.q), "Q planes"),
          kp(size_t(nc * pb.k), "K planes");
      scr.wp = wp.as<uint8_t>(), scr.ap = ap.as<uint8_t>(), scr.qp = qp.as<uint8_t>(), scr.kp = kp.as<uint8_t>();
      const float* mx = mixed.as<float>();
      const float* gg = g.as<float>();
      const dim3 sgrid(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / SW)), ogrid(unsigned(nc), unsigned(Hv), unsigned(Dv / SW));
      // the 3xTF32 prep: fp32 W, U and A, what every variant but the Wgmma ones reads
      auto prep = [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s, GdnPath::TensorCores); };
      const bool auto_wgmma = gdn_path(GdnPath::Auto, Dk, Dv) == GdnPath::Wgmma;
      struct Variant {
        const char* name;
        std::function<void(float*)> scan;
        // runs its own (Wgmma) prep after the loop's 3xTF32 one: that prep counts in its prep +
        // scan time, not in its scan's
        enum { None, Wgmma, WgmmaOnePass } own_prep = None;
      };
      // the one-pass prep, then the planes scan (regs false) or the register-state scan with wgs
      // warpgroups a CTA (0: by shape)
      auto one_pass_scan = [&](bool regs, int wgs) {
        return [&, regs, wgs](float* out) {
          gdn_wgmma_set_one_pass_bf16(true);
          gdn_wgmma_set_scan_regs(regs ? 1 : 0);
          gdn_wgmma_set_scan_rs_wgs(wgs);
          gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s, GdnPath::Wgmma);
          gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s, GdnPath::Wgmma);
          gdn_wgmma_set_scan_rs_wgs(0);
          gdn_wgmma_set_scan_regs(2);
          gdn_wgmma_set_one_pass_bf16(false);
        };
      };
      const std::vector<Variant> variants = {
          {"3xtf32", [&](float* out) { gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s, GdnPath::TensorCores); }},
          {"product", [&](float* out) {  // Auto on Wgmma: its own prep too (its time includes it)
             gdn_wgmma_set_one_pass_bf16(product_one_pass);
             if (auto_wgmma) gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s);
             gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s);
             gdn_wgmma_set_one_pass_bf16(false);
           },
           !auto_wgmma ? Variant::None : product_one_pass ? Variant::WgmmaOnePass : Variant::Wgmma},
          {"wgmma bf16x3", [&](float* out) {  // its own prep (the planes form) again: the time includes it
             gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s, GdnPath::Wgmma);
             gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s, GdnPath::Wgmma);
           },
           Variant::Wgmma},
          {"wgmma bf16, state in regs", one_pass_scan(true, 0), Variant::WgmmaOnePass},  // gdn_scan_rs_k after the one-pass prep
          {"wgmma bf16, state in regs 1wg", one_pass_scan(true, 1), Variant::WgmmaOnePass},  // one warpgroup a CTA
          {"wgmma bf16, state in regs 2wg", one_pass_scan(true, 2), Variant::WgmmaOnePass},  // two warpgroups a CTA
          {"wgmma bf16 one pass, planes", one_pass_scan(false, 0), Variant::WgmmaOnePass},  // CLEFRT_GDN_SCAN=planes
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
          {"simt", [&](float* out) { gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, scr, out, s, GdnPath::Simt); }},
      };
      const size_t N = size_t(L * Hv * Dv);
      std::vector<float> ref(N), got(N);
      // every variant from a fresh prep (the split one writes Vn over U); times are the loop's
      // less its 3xTF32 prep, less the variant's own prep for the scan alone
      const double t_prep = median_ms(s, prep);
      const double flop_prep = 2.0 * (2 * 64 * 64 * Dk + 64 * 64 * (Dk + Dv)) * double(nc * Hv);
      const double flop_scan = 2.0 * (64 * Dk * Dv * 3 + 64 * 64 * Dv) * double(nc * Hv);
      std::printf("\n%s: %lld chunks; prep %.3f ms (%.1f TFLOP/s, %.3f of the bf16 peak)\n", sh.name, (long long)nc, t_prep,
                  flop_prep / (t_prep * 1e-3) / 1e12, flop_prep / (t_prep * 1e-3) / 1e12 / hw.peak_bf16_tflops);
      // the Wgmma prep alone: the variants that run it after the 3xTF32 one count it in their time
      const bool have_wgmma = gdn_wgmma_available(Dk, Dv);
      const double t_wg_prep =
          have_wgmma ? median_ms(s, [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s, GdnPath::Wgmma); }) : 0.0;
      gdn_wgmma_set_one_pass_bf16(true);
      const double t_wg1_prep =
          have_wgmma ? median_ms(s, [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, scr, s, GdnPath::Wgmma); }) : 0.0;
      gdn_wgmma_set_one_pass_bf16(false);
      // the rows in bf16 (GdnScratch::mixed16, the model's input to the one-pass prep) for the
      // preps and forms timed from them
      DeviceBuffer m16(have_wgmma ? size_t(L * conv_dim) * 2 : 0, "mixed bf16"), ready(have_wgmma ? size_t(nc * Hv) * 4 : 0, "prep flags");
      GdnScratch s16 = scr;
      if (have_wgmma) {
        f32_to_bf16_rows(mx, L, conv_dim, conv_dim, m16.as<bf16>(), conv_dim, s);
        s16.mixed16 = m16.as<bf16>();
        s16.ready = ready.as<int>();  // used only where the overlap runs (gdn_wgmma_overlap)
      }
      if (prep_only) {  // CLEFRT_LAB_PREP_ONLY: the preps alone, no scan variant
        // and the one-pass prep from the rows in bf16
        double t_wg1_16 = 0, t_v2 = 0;
        if (have_wgmma) {
          gdn_wgmma_set_one_pass_bf16(true);
          // the first form (CLEFRT_LAB_GDN_PREP=v1), then the second (the product's: q / k / v by
          // cp.async, beta on T)
          const bool v2_before = gdn_wgmma_prep_v2();
          gdn_wgmma_set_prep_v2(false);
          t_wg1_16 = median_ms(s, [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, s16, s, GdnPath::Wgmma); });
          gdn_wgmma_set_prep_v2(true);
          t_v2 = median_ms(s, [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, s16, s, GdnPath::Wgmma); });
          gdn_wgmma_set_prep_v2(v2_before);
          gdn_wgmma_set_one_pass_bf16(false);
        }
        std::printf("  prep alone: bf16x3 wgmma %7.3f ms, bf16 one pass %7.3f ms (%.1f TFLOP/s), from bf16 rows v1 %7.3f ms, v2 (the product) %7.3f ms\n", t_wg_prep,
                    t_wg1_prep, flop_prep / (t_wg1_prep * 1e-3) / 1e12, t_wg1_16, t_v2);
        continue;
      }
      json::Value pts = json::Value::array();
      double t_ref = 0, t_product = -1;
      // the anchor at this shape (kernel_anchors.py times 1 x 8,192 and 64 x 512, not 8 x 1,024)
      const std::string key = sh.seqs == 1 && sh.len == 8192 ? "tok_8192" : sh.seqs == 64 && sh.len == 512 ? "64x512" : "";
      const double fla = key.empty() ? -1 : bench::anchor_ms(anchors, "gdn_per_layer_ms", key);
      // got against ref: outputs whose bits differ, the largest |error| and |ref|, the sums of
      // squares for the rms
      struct VsRef {
        size_t differ = 0;
        double max_err = 0, max_ref = 0, se = 0, sr = 0;
      };
      auto vs_ref = [&] {
        VsRef r;
        for (size_t i = 0; i < N; ++i) {
          r.differ += std::memcmp(&got[i], &ref[i], 4) != 0;
          const double e = double(got[i]) - double(ref[i]);
          r.max_err = std::max(r.max_err, std::fabs(e));
          r.max_ref = std::max(r.max_ref, std::fabs(double(ref[i])));
          r.se += e * e;
          r.sr += double(ref[i]) * double(ref[i]);
        }
        return r;
      };
      for (const Variant& v : variants) {
        const bool is_ref = v.name == std::string("3xtf32");
        if (only && !is_ref && !std::strstr(v.name, only)) continue;
        if (forms_only && !is_ref) continue;
        if (std::strstr(v.name, "wgmma") && !gdn_wgmma_available(Dk, Dv)) {
          std::printf("  %-26s not run: no Wgmma path on this GPU / build\n", v.name);
          continue;
        }
        float* out = is_ref ? o_ref.as<float>() : o.as<float>();
        prep();
        v.scan(out);
        check_launch(v.name);
        check(cudaStreamSynchronize(s), v.name);
        check(cudaMemcpy((out == o_ref.as<float>() ? ref : got).data(), out, N * 4, cudaMemcpyDeviceToHost), "copy");
        const VsRef e = out != o_ref.as<float>() ? vs_ref() : VsRef{};
        // t: the scan alone; whole: its prep and scan (its own prep where it runs one)
        const double whole = median_ms(s, [&] {
          prep();
          v.scan(out);
        }) - (v.own_prep != Variant::None ? t_prep : 0.0);
        const double own = v.own_prep == Variant::Wgmma ? t_wg_prep : v.own_prep == Variant::WgmmaOnePass ? t_wg1_prep : t_prep;
        const double t = whole - own;
        if (out == o_ref.as<float>()) t_ref = t;
        if (v.name == std::string("product")) t_product = whole;
        const double rel_max = e.max_ref > 0 ? e.max_err / e.max_ref : 0, rel_rms = e.sr > 0 ? std::sqrt(e.se / e.sr) : 0;
        std::printf("  %-26s scan %7.3f ms (%.2fx 3xtf32's) %6.1f TFLOP/s | prep + scan %7.3f ms | vs 3xtf32: %zu of %zu bits "
                    "differ, max |err| / max |o| %.2e, rms rel %.2e\n",
                    v.name, t, t / t_ref, flop_scan / (t * 1e-3) / 1e12, whole, e.differ, N, rel_max, rel_rms);
        json::Value r = json::Value::object();
        r.add("variant", json::Value::string(v.name));
        r.add("m", json::Value::integer(L));
        r.add("sequences", json::Value::integer(sh.seqs));
        r.add("prep_ms", json::Value::number(own));
        r.add("scan_ms", json::Value::number(t));
        r.add("prep_and_scan_ms", json::Value::number(whole));
        r.add("outputs_differing_from_3xtf32", json::Value::integer(int64_t(e.differ)));
        r.add("max_err_over_max_out", json::Value::number(rel_max));
        r.add("rms_rel_err", json::Value::number(rel_rms));
        pts.arr.push_back(std::move(r));
      }
      if (have_wgmma) {
        // from the rows in bf16: the W / U form (CLEFRT_LAB_GDN_FORM=wu), the T form (the product's)
        // and the T form's prep and scan at once (CLEFRT_LAB_GDN_OVERLAP=1 | 2, where it runs: one
        // warpgroup a scan CTA), each prep alone, prep + scan, and the outputs against the 3xTF32
        // reference (on the fp32 rows: the bf16 rows' rounding counts in both); the overlap's
        // against the T form's bits as well (the same arithmetic)
        const bool t_before = gdn_wgmma_t_form();
        const int ov_before = gdn_wgmma_overlap();
        gdn_wgmma_set_one_pass_bf16(true);
        struct Form {
          const char* name;
          bool t_form;
          int overlap;
        };
        const bool overlap_runs = sh.seqs * Hv < sm_count();  // the scan's one-warpgroup CTAs (gdn_scan_rs_wgs)
        std::vector<float> got_t;
        for (const Form f : {Form{"W / U form", false, 0}, Form{"T form (product)", true, 0}, Form{"T form, overlap 1", true, 1},
                             Form{"T form, overlap 2", true, 2}}) {
          if (f.overlap && !overlap_runs) continue;
          gdn_wgmma_set_t_form(f.t_form);
          gdn_wgmma_set_overlap(f.overlap);
          const char* name = f.name;
          auto prep16 = [&] { gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, s16, s, GdnPath::Wgmma); };
          auto both = [&] {
            prep16();
            gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, s16, o.as<float>(), s, GdnPath::Wgmma);
          };
          both();
          check(cudaStreamSynchronize(s), name);
          check(cudaMemcpy(got.data(), o.get(), N * 4, cudaMemcpyDeviceToHost), "copy");
          const VsRef e = vs_ref();
          // a NaN output is the worst error (std::max passes NaNs over)
          const double max_err = std::any_of(got.begin(), got.end(), [](float x) { return x != x; }) ? INFINITY : e.max_err;
          const double max_ref = e.max_ref;
          size_t differ_t = 0;  // the overlap's outputs whose bits differ from the T form's
          if (f.t_form && !f.overlap) got_t = got;
          if (f.overlap)
            for (size_t i = 0; i < N; ++i) differ_t += std::memcmp(&got[i], &got_t[i], 4) != 0;
          const double tp = median_ms(s, prep16), tw = median_ms(s, both);
          std::printf("  from bf16 rows, %-22s prep %7.3f ms, scan %7.3f ms, prep + scan %7.3f ms | vs 3xtf32 max |err| / max |o| %.2e", name, tp,
                      tw - tp, tw, max_ref > 0 ? max_err / max_ref : 0.0);
          if (f.overlap) std::printf(" | %zu of %zu bits differ from the T form's", differ_t, N);
          std::printf("\n");
          json::Value r = json::Value::object();
          r.add("variant", json::Value::string(std::string("from bf16 rows, ") + name));
          r.add("m", json::Value::integer(L));
          r.add("sequences", json::Value::integer(sh.seqs));
          r.add("prep_ms", json::Value::number(tp));
          r.add("scan_ms", json::Value::number(tw - tp));
          r.add("prep_and_scan_ms", json::Value::number(tw));
          r.add("max_err_over_max_out", json::Value::number(max_ref > 0 ? max_err / max_ref : 0.0));
          if (f.overlap) r.add("outputs_differing_from_t_form", json::Value::integer(int64_t(differ_t)));
          pts.arr.push_back(std::move(r));
          if (fla > 0) std::printf("    = %.2fx fla's time (anchor %.3f ms a layer)\n", tw / fla, fla);
        }
        // the T form's gated norm after its scan (gated_norm's kernel, the product's) and in the
        // scan's epilogue (CLEFRT_LAB_GDN_SCAN_NORM=1; where the scan runs two warpgroups a CTA):
        // prep + scan + norm each, and act's bits against each other (the same by construction)
        if (!overlap_runs) {
          gdn_wgmma_set_t_form(true);
          const bool norm_before = gdn_wgmma_scan_norm();
          const int64_t vd = Hv * Dv;
          DeviceBuffer z(size_t(L * vd) * 4, "z"), wn(size_t(Dv) * 4, "norm weights"), act(size_t(L * vd) * 2, "act");
          fill_normal_f32(z.as<float>(), L * vd, 25, 0.0f, 2.0f, s);
          fill_normal_f32(wn.as<float>(), Dv, 26, 1.0f, 0.5f, s);
          GdnScratch sn = s16;
          sn.gn = {z.as<float>(), vd, {}, wn.as<float>(), 1e-6f, act.as<bf16>()};
          std::vector<uint16_t> act_apart, act_fused;
          double t_apart = 0, t_fused = 0;
          for (const bool fused : {false, true}) {
            gdn_wgmma_set_scan_norm(fused);
            if (fused && !gdn_scan_norms(sn, ch, Hv, Dk, Dv, GdnPath::Wgmma)) {
              std::printf("  from bf16 rows, T form, gated norm in the scan: does not run at this shape\n");
              break;
            }
            auto all3 = [&] {
              gdn_chunk_prep(mx, Hk, Hv, Dk, Dv, gg, beta.as<float>(), ch, sn, s, GdnPath::Wgmma);
              gdn_chunk_scan(mx, Hk, Hv, Dk, Dv, gg, ch, sn, o.as<float>(), s, GdnPath::Wgmma);
              if (!fused) gated_norm(o.as<float>(), L, Hv, Dv, wn.as<float>(), 1e-6f, z.as<float>(), vd, act.as<bf16>(), s);
            };
            all3();
            check(cudaStreamSynchronize(s), "gated norm forms");
            std::vector<uint16_t>& a16 = fused ? act_fused : act_apart;
            a16.resize(size_t(L * vd));
            check(cudaMemcpy(a16.data(), act.get(), a16.size() * 2, cudaMemcpyDeviceToHost), "copy act");
            (fused ? t_fused : t_apart) = median_ms(s, all3);
          }
          if (!act_fused.empty()) {
            size_t differ = 0;
            for (size_t i = 0; i < act_fused.size(); ++i) differ += act_fused[i] != act_apart[i];
            std::printf("  from bf16 rows, T form + gated norm: apart (the product) %7.3f ms, in the scan %7.3f ms (%.3fx) | %zu of %zu act "
                        "values differ\n",
                        t_apart, t_fused, t_fused / t_apart, differ, act_fused.size());
            json::Value r = json::Value::object();
            r.add("variant", json::Value::string("from bf16 rows, T form + gated norm"));
            r.add("m", json::Value::integer(L));
            r.add("sequences", json::Value::integer(sh.seqs));
            r.add("apart_ms", json::Value::number(t_apart));
            r.add("in_scan_ms", json::Value::number(t_fused));
            r.add("act_differing", json::Value::integer(int64_t(differ)));
            pts.arr.push_back(std::move(r));
          }
          gdn_wgmma_set_scan_norm(norm_before);
        }
        gdn_wgmma_set_t_form(t_before);
        gdn_wgmma_set_overlap(ov_before);
        gdn_wgmma_set_one_pass_bf16(false);
      }
      if (have_wgmma) {  // the preps alone
        const double t_tc = t_prep, t_wg = t_wg_prep;
        std::printf("  prep alone: 3xTF32 mma.sync %7.3f ms (%.1f TFLOP/s), bf16x3 wgmma %7.3f ms (%.1f TFLOP/s, %.2fx), bf16 one pass %7.3f ms\n",
                    t_tc, flop_prep / (t_tc * 1e-3) / 1e12, t_wg, flop_prep / (t_wg * 1e-3) / 1e12, t_tc / t_wg, t_wg1_prep);
        json::Value r = json::Value::object();
        r.add("variant", json::Value::string("preps alone"));
        r.add("m", json::Value::integer(L));
        r.add("sequences", json::Value::integer(sh.seqs));
        r.add("prep_3xtf32_ms", json::Value::number(t_tc));
        r.add("prep_wgmma_ms", json::Value::number(t_wg));
        r.add("prep_wgmma_one_pass_ms", json::Value::number(t_wg1_prep));
        pts.arr.push_back(std::move(r));
      }
      if (!anchors.is_null() && !key.empty() && !forms_only) {  // (forms only: beside the forms' lines)
        if (fla > 0 && t_product > 0) {
          std::printf("  anchor: fla chunk_gated_delta_rule %7.3f ms a layer (same call); the product's prep + scan %7.3f ms = %.2fx fla's time\n",
                      fla, t_product, t_product / fla);
        } else {
          std::printf("  anchor: fla at %s %s\n", key.c_str(), fla > 0 ? "(the product did not run)" : "absent or an error in the anchors file");
        }
        json::Value r = json::Value::object();
        r.add("variant", json::Value::string("anchor fla chunk_gated_delta_rule"));
        r.add("m", json::Value::integer(L));
        r.add("sequences", json::Value::integer(sh.seqs));
        if (fla > 0) r.add("ms", json::Value::number(fla));
        if (fla > 0 && t_product > 0) r.add("product_over_anchor", json::Value::number(t_product / fla));
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

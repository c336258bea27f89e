// The FP8 SwiGLU's device code: gate|up from the FP8 GEMM without its scales, the scales applied
// as read (GuScales, gu_value: kernels_basic.cu's SwiGLU kernels); the fused SwiGLU + FP8 row
// quantization's cluster form (swiglu_fp8_quant_cluster_k: compute capability 9.0 on, where
// kernels_basic.cu's swiglu_fp8_quant runs it) and its register variant (swiglu_fp8_quant_regs_k):
// one CTA a row; uncapped (one CTA an SM) it was slower in the model than the shared-row kernel
// (bench/results/2026-12-05-h200-session28.md), which stays the product's below compute
// capability 9.0. Capped for 2 CTAs an SM it is the product's form from 2,048 rows
// (swiglu_fp8_form; bench/results/2026-12-06-h100-session35.md); the cluster form capped for 4
// CTAs is a lab switch (CLEFRT_LAB_SWIGLU_MIN_BLOCKS=4). The cluster form made persistent (each
// cluster its rows in turn, the next row's gate|up prefetched into shared memory) lost on an
// H100 (session 52) and lives in the lab only: dev/cuda/elementwise.cu, on this file's helpers.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"
#include "cuda/runtime/pdl.cuh"
#include "cuda/runtime/check.h"

namespace clefrt::cuda {
namespace {

// Scaled: gate|up came from the FP8 GEMM unscaled (LinearRunner::run_fp8_unscaled); each value is
// first rounded exactly as the FP8 epilogue would have stored it, bf16(v * rs[t] * cs(c)), with
// cs(c) = cs_lo[c] for c < split, else cs_hi[c - split]: bit for bit the unfused result, without
// the epilogue's pass over the [L, 2 ffn] output.
struct GuScales {
  const float* rs = nullptr;  // null: not scaled
  const float* cs_lo = nullptr;
  const float* cs_hi = nullptr;
  int64_t split = 0;
};
__device__ __forceinline__ float gu_value(bf16 v, int64_t t, int64_t c, const GuScales& sc) {
  if (!sc.rs) return __bfloat162float(v);
  const float cs = c < sc.split ? sc.cs_lo[c] : sc.cs_hi[c - sc.split];
  return __bfloat162float(__float2bfloat16_rn(fp8_scaled(__bfloat162float(v), sc.rs[t], cs)));
}
// swiglu_k's scaled values for one token row per CTA, kept in shared memory as bf16 (the bits
// swiglu_fp8_scaled stores), then fp8_quant_rows_v_k's amax, scale and codes from them. `scale`
// may be sc.rs itself (the forward's FP8 scratch holds gate|up's row scales, then down_proj's):
// every read of rs[t] comes before block_max's barriers, and its one write after them.
constexpr int kSwigluQuantThreads = 512;
__global__ void __launch_bounds__(kSwigluQuantThreads) swiglu_fp8_quant_k(const bf16* gu, int64_t ffn, GuScales sc, uint8_t* q, int64_t kp8,
                                                                         float* scale) {
  extern __shared__ uint4 act_s[];  // [ffn / 8]
  __shared__ float sh[32];
  const int64_t t = blockIdx.x, f8 = ffn / 8;
  const uint4* g = reinterpret_cast<const uint4*>(gu + t * 2 * ffn);
  const uint4* u = g + f8;
  float m = 0;
  for (int64_t i = threadIdx.x; i < f8; i += blockDim.x) {
    const uint4 gv = g[i], uv = u[i];
    const bf16* gp = reinterpret_cast<const bf16*>(&gv);
    const bf16* up = reinterpret_cast<const bf16*>(&uv);
    uint4 ov;
    bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
    for (int j = 0; j < 8; ++j) op[j] = __float2bfloat16(silu_f(gu_value(gp[j], t, 8 * i + j, sc)) * gu_value(up[j], t, ffn + 8 * i + j, sc));
    m = absmax8_bf16(ov, m);
    act_s[i] = ov;
  }
  m = block_max(m, sh);  // its barriers also publish act_s
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f, inv = fp8_row_recip(m, s);
  if (threadIdx.x == 0) scale[t] = s;
  uint2* out = reinterpret_cast<uint2*>(q + t * kp8 * 8);
  for (int64_t i = threadIdx.x; i < kp8; i += blockDim.x) out[i] = i < f8 ? e4m3_encode8_bf16(act_s[i], s, inv) : make_uint2(0u, 0u);
}
inline void launch_swiglu_fp8_quant_rows(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  swiglu_fp8_quant_k<<<unsigned(L), kSwigluQuantThreads, size_t(ffn) * 2, s>>>(gu, ffn, sc, q, kp / 8, scale);
}

// The register variant of swiglu_fp8_quant_k (capped for 2 CTAs an SM: the product's from 2,048
// rows; uncapped: the lab's): swiglu_k's scaled values for one
// token row per CTA, then fp8_quant_rows_v_k's amax, scale and codes from them. A thread holds up
// to four 16-byte items (8 values) of the row in registers from its loads to its codes, so the
// only exchange is block_max, the four items' loads are in flight together, and the block is
// sized to the row (ffn / 32 threads rounded up to a warp: no thread idles through a last partial
// round). `scale` may be sc.rs itself (the forward's FP8 scratch
// holds gate|up's row scales, then down_proj's): rs[t] is read before block_max's barriers, and
// scale[t] written after them.
constexpr int kSwigluQuantItems = 4;
constexpr int kSwigluQuantMaxThreads = 576;  // ffn <= 18,432 (Clef: 12,288 and 17,408)
// Whether gu_scales8 may take its 16-byte loads: both scale arrays 16-byte aligned and split a
// multiple of 8 (no 8-group straddles it).
inline bool gu_scales_vec(const GuScales& sc, int64_t ffn) {
  return sc.split % 8 == 0 && aligned16(sc.cs_lo) && (sc.split >= 2 * ffn || aligned16(sc.cs_hi));
}
// 8 consecutive column scales from column c (a multiple of 8): two 16-byte loads when the host
// found both arrays 16-byte aligned and split a multiple of 8 (no 8-group straddles it).
__device__ __forceinline__ void gu_scales8(const GuScales& sc, int c, bool vec, float (&cs)[8]) {
  if (vec) {
    const int split = int(sc.split);
    const float4* p = reinterpret_cast<const float4*>(c < split ? sc.cs_lo + c : sc.cs_hi + (c - split));
    const float4 a = __ldg(p), b = __ldg(p + 1);
    cs[0] = a.x, cs[1] = a.y, cs[2] = a.z, cs[3] = a.w, cs[4] = b.x, cs[5] = b.y, cs[6] = b.z, cs[7] = b.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) cs[j] = c + j < sc.split ? sc.cs_lo[c + j] : sc.cs_hi[c + j - sc.split];
}
// The lab's SiLU from the fast intrinsics (__expf, __fdividef): not silu_f's bits; what the exact
// one costs (dev/cuda/elementwise.cu's "fast silu" line). Never in the product.
__device__ __forceinline__ float silu_fast_lab(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
// swiglu_k's 8 outputs of one item, scaled (gu_value's rounding) when rs is set; FastSilu: the
// lab's silu_fast_lab
template <bool FastSilu = false>
__device__ __forceinline__ uint4 swiglu8_scaled(uint4 gv, uint4 uv, float r, const GuScales& sc, int c, int ffn, bool vec) {
  const bf16* gp = reinterpret_cast<const bf16*>(&gv);
  const bf16* up = reinterpret_cast<const bf16*>(&uv);
  float g[8], u[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) g[j] = __bfloat162float(gp[j]), u[j] = __bfloat162float(up[j]);
  if (sc.rs) {
    float cg[8], cu[8];
    gu_scales8(sc, c, vec, cg);
    gu_scales8(sc, ffn + c, vec, cu);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      g[j] = __bfloat162float(__float2bfloat16_rn(fp8_scaled(g[j], r, cg[j])));
      u[j] = __bfloat162float(__float2bfloat16_rn(fp8_scaled(u[j], r, cu[j])));
    }
  }
  uint4 ov;
  bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
  for (int j = 0; j < 8; ++j) op[j] = __float2bfloat16((FastSilu ? silu_fast_lab(g[j]) : silu_f(g[j])) * u[j]);
  return ov;
}
// MinBlocks: CTAs an SM the registers are capped for (1: 78 registers, no spills; 2: 56 with
// spills), the lab's two variants.
template <int MinBlocks>
__global__ void __launch_bounds__(kSwigluQuantMaxThreads, MinBlocks) swiglu_fp8_quant_regs_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q,
                                                                                int64_t kp8, float* scale) {
  pdl_wait();
  __shared__ float sh[32];
  const int64_t t = blockIdx.x;
  const int f8 = int(ffn / 8);
  const uint4* g = reinterpret_cast<const uint4*>(gu + t * 2 * ffn);
  const uint4* u = g + f8;
  uint4 gv[kSwigluQuantItems], uv[kSwigluQuantItems];
#pragma unroll
  for (int k = 0; k < kSwigluQuantItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < f8) gv[k] = g[i], uv[k] = u[i];
  }
  const float r = sc.rs ? sc.rs[t] : 1.0f;
  float m = 0;
#pragma unroll
  for (int k = 0; k < kSwigluQuantItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < f8) {
      gv[k] = swiglu8_scaled(gv[k], uv[k], r, sc, 8 * i, int(ffn), vec);
      m = absmax8_bf16(gv[k], m);
    }
  }
  m = block_max(m, sh);
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f, inv = fp8_row_recip(m, s);
  if (threadIdx.x == 0) scale[t] = s;
  uint2* out = reinterpret_cast<uint2*>(q + t * kp8 * 8);
#pragma unroll
  for (int k = 0; k < kSwigluQuantItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < f8) out[i] = e4m3_encode8_bf16(gv[k], s, inv);
  }
  for (int64_t i = f8 + threadIdx.x; i < kp8; i += blockDim.x) out[i] = make_uint2(0u, 0u);  // the GEMM's K padding
}

// One CTA a row of ceil(ffn / 8 / kSwigluQuantItems) threads rounded up to a warp; the scales'
// 16-byte loads where both arrays are 16-byte aligned and split a multiple of 8.
template <int MinBlocks>
void launch_swiglu_fp8_quant_regs(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  const int64_t items = ffn / 8, per = (items + kSwigluQuantItems - 1) / kSwigluQuantItems;
  const unsigned threads = unsigned((per + 31) / 32 * 32);
  const bool vec = gu_scales_vec(sc, ffn);
  launch_after("swiglu_fp8_quant", swiglu_fp8_quant_regs_k<MinBlocks>, unsigned(L), threads, 0, s, gu, ffn, sc, vec, q, kp / 8, scale);
}

// (A streaming form, one persistent CTA an SM with the column scales in shared memory and the next
// row's loads in flight through a row's exchange, gave the same bits and was slower in the lab and
// in the model: bench/results/2026-12-06-h100-session37.md; in git at 3d76c78.)
// The cluster form: a row over a cluster of CTAs (thread block clusters, compute capability 9.0
// on), CTA r of it taking the row's 16-byte items [r per, r per + per), a thread IPT of them in
// registers from its loads to its codes. The row's amax is each CTA's block max, then the
// cluster's through distributed shared memory: one exchange, no trip of the values through shared
// memory, and as many threads on a row as its items (the blog's 318 rows fill the GPU, where one
// CTA a row left most of it idle through each row's serial loads and barriers). The same values,
// amax, scale and codes as swiglu_fp8_quant_k: max is exact in any order. `scale` may be sc.rs
// itself: every CTA of the row reads rs[t] before the cluster barrier, and rank 0 writes scale[t]
// after it.
template <int IPT, bool FastSilu = false>
__device__ __forceinline__ void swiglu_fp8_quant_cluster_row(const bf16* gu, int64_t ffn, const GuScales& sc, bool vec, uint8_t* q, int64_t kp8,
                                                             float* scale, int per) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_wait();
  namespace cg = cooperative_groups;
  __shared__ float sh[32];
  __shared__ float cta_max;
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank()), ncl = int(cl.num_blocks());
  const int64_t t = blockIdx.x / ncl;
  const int f8 = int(ffn / 8), i0 = rank * per, i1 = min(i0 + per, f8);
  const uint4* g = reinterpret_cast<const uint4*>(gu + t * 2 * ffn);
  const uint4* u = g + f8;
  uint4 gv[IPT], uv[IPT];
#pragma unroll
  for (int k = 0; k < IPT; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    if (i < i1) gv[k] = g[i], uv[k] = u[i];
  }
  const float r = sc.rs ? sc.rs[t] : 1.0f;
  float m = 0;
#pragma unroll
  for (int k = 0; k < IPT; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    if (i < i1) {
      gv[k] = swiglu8_scaled<FastSilu>(gv[k], uv[k], r, sc, 8 * i, int(ffn), vec);
      m = absmax8_bf16(gv[k], m);
    }
  }
  m = block_max(m, sh);
  if (threadIdx.x == 0) cta_max = m;
  cl.sync();  // every CTA's max published (and every rs[t] read)
#pragma unroll 1
  for (int o = 0; o < ncl; ++o) m = fmaxf(m, *cl.map_shared_rank(&cta_max, o));
  cl.barrier_arrive();  // done with the others' shared memory: they may exit after the wait below
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f, inv = fp8_row_recip(m, s);
  if (rank == 0 && threadIdx.x == 0) scale[t] = s;
  uint2* out = reinterpret_cast<uint2*>(q + t * kp8 * 8);
#pragma unroll
  for (int k = 0; k < IPT; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    if (i < i1) out[i] = e4m3_encode8_bf16(gv[k], s, inv);
  }
  for (int64_t i = f8 + int64_t(rank) * blockDim.x + threadIdx.x; i < kp8; i += int64_t(ncl) * blockDim.x) out[i] = make_uint2(0u, 0u);
  cl.barrier_wait();
#else
  __trap();  // never launched below compute capability 9.0 (swiglu_fp8_quant picks)
#endif
}
template <int IPT, bool FastSilu = false>
__global__ void swiglu_fp8_quant_cluster_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q, int64_t kp8, float* scale, int per) {
  swiglu_fp8_quant_cluster_row<IPT, FastSilu>(gu, ffn, sc, vec, q, kp8, scale, per);
}
// The product's form (a row over 2 CTAs of 4 items a thread: 288 threads) with its registers
// capped for MinBlocks CTAs an SM: the lab's and CLEFRT_LAB_SWIGLU_MIN_BLOCKS=4's. (Its gate|up
// loads streamed with the evict-first hint, to keep the scales in L1, measured no different:
// bench/results/2026-12-06-h100-session35.md; in git at 7a76c9e.)
constexpr int kSwigluClusterLabThreads = 288;
template <int MinBlocks>
__global__ void __launch_bounds__(kSwigluClusterLabThreads, MinBlocks)
    swiglu_fp8_quant_cluster_lab_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q, int64_t kp8, float* scale, int per) {
  swiglu_fp8_quant_cluster_row<4>(gu, ffn, sc, vec, q, kp8, scale, per);
}

// A row over `cl` CTAs (1..8, the portable cluster size) of `ipt` items a thread: a CTA's
// threads, its items over ipt rounded up to a warp (the launch needs <= 1024).
inline int64_t swiglu_cluster_threads(int64_t ffn, int cl, int ipt) {
  const int64_t per = (ffn / 8 + cl - 1) / cl;
  return ((per + ipt - 1) / ipt + 31) / 32 * 32;
}
// `kernel` (a cluster form's, `ipt` items a thread) over clusters of `cl` CTAs, one a row.
template <class Kernel>
void launch_swiglu_cluster_form(Kernel kernel, int ipt, const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp,
                                float* scale, int cl, cudaStream_t s) {
  const int64_t per = (ffn / 8 + cl - 1) / cl, threads = swiglu_cluster_threads(ffn, cl, ipt);
  const cudaLaunchAttribute cluster = cluster_dim_x(unsigned(cl));
  launch_after_ex("swiglu_fp8_quant", kernel, unsigned(L * cl), unsigned(threads), 0, s, &cluster, 1, gu, ffn, sc, gu_scales_vec(sc, ffn), q,
                  kp / 8, scale, int(per));
}
template <int IPT, bool FastSilu = false>
void launch_swiglu_fp8_quant_cluster(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale, int cl,
                                     cudaStream_t s) {
  launch_swiglu_cluster_form(swiglu_fp8_quant_cluster_k<IPT, FastSilu>, IPT, gu, L, ffn, sc, q, kp, scale, cl, s);
}
// The product's form capped for MinBlocks CTAs an SM: a cluster of 2 of 4 items, at most 288 threads.
template <int MinBlocks>
void launch_swiglu_fp8_quant_cluster_lab(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale,
                                         cudaStream_t s) {
  if (swiglu_cluster_threads(ffn, 2, 4) > kSwigluClusterLabThreads)
    throw Error(Status::Internal, "internal_error", "swiglu lab: ffn " + std::to_string(ffn) + " over 288 threads");
  launch_swiglu_cluster_form(swiglu_fp8_quant_cluster_lab_k<MinBlocks>, 4, gu, L, ffn, sc, q, kp, scale, 2, s);
}

}  // namespace
}  // namespace clefrt::cuda

// The FP8 SwiGLU's device code: gate|up from the FP8 GEMM without its scales, the scales applied
// as read (GuScales, gu_value: kernels_basic.cu's SwiGLU kernels); the fused SwiGLU + FP8 row
// quantization's cluster form (swiglu_fp8_quant_cluster_k: compute capability 9.0 on, where
// kernels_basic.cu's swiglu_fp8_quant runs it) and its register variant (swiglu_fp8_quant_regs_k),
// which only the kernel lab runs (dev/cuda/elementwise.cu): one CTA a row, one CTA an SM, it was
// slower in the model than the shared-row kernel (bench/results/2026-12-05-h200-session28.md),
// which stays the product's below compute capability 9.0.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"
#include "cuda/ops/tma.cuh"
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

// The lab's variant of swiglu_fp8_quant_k: swiglu_k's scaled values for one
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
// swiglu_k's 8 outputs of one item from its gate and up column scales (gu_value's rounding)
__device__ __forceinline__ uint4 swiglu8_with(uint4 gv, uint4 uv, float r, const float (&cg)[8], const float (&cu)[8]) {
  const bf16* gp = reinterpret_cast<const bf16*>(&gv);
  const bf16* up = reinterpret_cast<const bf16*>(&uv);
  uint4 ov;
  bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float g = __bfloat162float(__float2bfloat16_rn(fp8_scaled(__bfloat162float(gp[j]), r, cg[j])));
    const float u = __bfloat162float(__float2bfloat16_rn(fp8_scaled(__bfloat162float(up[j]), r, cu[j])));
    op[j] = __float2bfloat16(silu_f(g) * u);
  }
  return ov;
}
// swiglu_k's 8 outputs of one item, scaled (gu_value's rounding) when rs is set
__device__ __forceinline__ uint4 swiglu8_scaled(uint4 gv, uint4 uv, float r, const GuScales& sc, int c, int ffn, bool vec) {
  if (sc.rs) {
    float cg[8], cu[8];
    gu_scales8(sc, c, vec, cg);
    gu_scales8(sc, ffn + c, vec, cu);
    return swiglu8_with(gv, uv, r, cg, cu);
  }
  const bf16* gp = reinterpret_cast<const bf16*>(&gv);
  const bf16* up = reinterpret_cast<const bf16*>(&uv);
  uint4 ov;
  bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
  for (int j = 0; j < 8; ++j) op[j] = __float2bfloat16(silu_f(__bfloat162float(gp[j])) * __bfloat162float(up[j]));
  return ov;
}
// MinBlocks: CTAs an SM the registers are capped for (1: 78 registers, no spills; 2: 56 with
// spills), the lab's two variants.
template <int MinBlocks>
__global__ void __launch_bounds__(kSwigluQuantMaxThreads, MinBlocks) swiglu_fp8_quant_regs_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q,
                                                                                int64_t kp8, float* scale) {
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
  swiglu_fp8_quant_regs_k<MinBlocks><<<unsigned(L), threads, 0, s>>>(gu, ffn, sc, vec, q, kp / 8, scale);
}

// The cluster form: a row over a cluster of CTAs (thread block clusters, compute capability 9.0
// on), CTA r of it taking the row's 16-byte items [r per, r per + per), a thread IPT of them in
// registers from its loads to its codes. The row's amax is each CTA's block max, then the
// cluster's through distributed shared memory: one exchange, no trip of the values through shared
// memory, and as many threads on a row as its items (the blog's 318 rows fill the GPU, where one
// CTA a row left most of it idle through each row's serial loads and barriers). The same values,
// amax, scale and codes as swiglu_fp8_quant_k: max is exact in any order. `scale` may be sc.rs
// itself: every CTA of the row reads rs[t] before the cluster barrier, and rank 0 writes scale[t]
// after it.
// Stream (the lab's variant): gate|up loaded with the evict-first hint (ld.global.cs), so that the
// streamed rows do not push the column scales, which every row reads again, out of L1.
template <bool Stream>
__device__ __forceinline__ uint4 gu_load(const uint4* p) {
  if constexpr (Stream) return __ldcs(p);
  else return *p;
}
template <int IPT, bool Stream>
__device__ __forceinline__ void swiglu_fp8_quant_cluster_row(const bf16* gu, int64_t ffn, const GuScales& sc, bool vec, uint8_t* q, int64_t kp8,
                                                             float* scale, int per) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
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
    if (i < i1) gv[k] = gu_load<Stream>(g + i), uv[k] = gu_load<Stream>(u + i);
  }
  const float r = sc.rs ? sc.rs[t] : 1.0f;
  float m = 0;
#pragma unroll
  for (int k = 0; k < IPT; ++k) {
    const int i = i0 + threadIdx.x + k * blockDim.x;
    if (i < i1) {
      gv[k] = swiglu8_scaled(gv[k], uv[k], r, sc, 8 * i, int(ffn), vec);
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
template <int IPT>
__global__ void swiglu_fp8_quant_cluster_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q, int64_t kp8, float* scale, int per) {
  swiglu_fp8_quant_cluster_row<IPT, false>(gu, ffn, sc, vec, q, kp8, scale, per);
}
// The lab's variants of the product's form (a row over 2 CTAs of 4 items a thread: 288 threads):
// registers capped for MinBlocks CTAs an SM, and / or the streamed loads.
constexpr int kSwigluClusterLabThreads = 288;
template <int MinBlocks, bool Stream>
__global__ void __launch_bounds__(kSwigluClusterLabThreads, MinBlocks)
    swiglu_fp8_quant_cluster_lab_k(const bf16* gu, int64_t ffn, GuScales sc, bool vec, uint8_t* q, int64_t kp8, float* scale, int per) {
  swiglu_fp8_quant_cluster_row<4, Stream>(gu, ffn, sc, vec, q, kp8, scale, per);
}

// A row over `cl` CTAs (1..8, the portable cluster size) of `ipt` items a thread: a CTA's
// threads, its items over ipt rounded up to a warp (the launch needs <= 1024).
inline int64_t swiglu_cluster_threads(int64_t ffn, int cl, int ipt) {
  const int64_t per = (ffn / 8 + cl - 1) / cl;
  return ((per + ipt - 1) / ipt + 31) / 32 * 32;
}
template <int IPT>
void launch_swiglu_fp8_quant_cluster(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale, int cl,
                                     cudaStream_t s) {
  const int64_t per = (ffn / 8 + cl - 1) / cl, threads = swiglu_cluster_threads(ffn, cl, IPT);
  const bool vec = gu_scales_vec(sc, ffn);
  check(launch_on_clusters(swiglu_fp8_quant_cluster_k<IPT>, unsigned(L * cl), unsigned(threads), unsigned(cl), s, gu, ffn, sc, vec, q, kp / 8, scale,
                           int(per)),
        "swiglu_fp8_quant");
}
template <int MinBlocks, bool Stream>
void launch_swiglu_fp8_quant_cluster_lab(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale,
                                         cudaStream_t s) {
  const int64_t per = (ffn / 8 + 1) / 2, threads = swiglu_cluster_threads(ffn, 2, 4);
  if (threads > kSwigluClusterLabThreads) throw Error(Status::Internal, "internal_error", "swiglu lab: ffn " + std::to_string(ffn) + " over 288 threads");
  check(launch_on_clusters(swiglu_fp8_quant_cluster_lab_k<MinBlocks, Stream>, unsigned(L * 2), unsigned(threads), 2u, s, gu, ffn, sc,
                           gu_scales_vec(sc, ffn), q, kp / 8, scale, int(per)),
        "swiglu_fp8_quant (lab)");
}

// The pipelined form (lab): persistent clusters of `ncl` CTAs, CTA r of each owning the row's
// items [r per, r per + per) for every row the cluster takes (rows c, c + clusters, ...). Its
// columns' scales are loaded into shared memory once; each row's gate and up slices arrive by
// bulk copies S rows ahead (mbarriers), so the loads never wait behind the row's reduction; the
// cluster's amax exchange is split (arrive, then the previous row's codes, then wait), so a row's
// codes are written while the next row's exchange is in flight. The same values, amax, scale and
// codes as swiglu_fp8_quant_k. Dynamic shared memory: swiglu_pipe_smem. Selected by
// CLEFRT_LAB_SWIGLU_STAGES (swiglu_fp8_form) and run by the elementwise lab.
template <int S>
__host__ __device__ constexpr size_t swiglu_pipe_smem(int per) {
  return size_t(per) * 64 /* scales */ + size_t(S) * per * 32 /* stages */ + S * 8 /* mbarriers */;
}
template <int IPT, int S>
__global__ void swiglu_fp8_quant_pipe_k(const bf16* gu, int64_t L, int64_t ffn, GuScales sc, uint8_t* q, int64_t kp8, float* scale, int per) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ __align__(128) unsigned char pipe_smem[];
  __shared__ float wmax[2][32];
  __shared__ float cta_max[2];
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank()), ncl = int(cl.num_blocks());
  const int f8 = int(ffn / 8), i0 = rank * per, n = max(0, min(per, f8 - i0));
  const int64_t clusters = gridDim.x / ncl, cid = blockIdx.x / ncl;
  const int64_t rows = cid < L ? (L - cid + clusters - 1) / clusters : 0;  // the same for every CTA of the cluster
  float* csg = reinterpret_cast<float*>(pipe_smem);
  float* csu = csg + size_t(per) * 8;
  uint4* stage = reinterpret_cast<uint4*>(csu + size_t(per) * 8);  // stage s: gate at stage + 2 s per, up at + per
  uint64_t* full = reinterpret_cast<uint64_t*>(stage + size_t(S) * 2 * per);
  const uint32_t bytes = uint32_t(n) * 16;
  auto issue = [&](int64_t k) {  // row k of this cluster's into stage k % S (one thread)
    const int s = int(k % S);
    const int64_t t = cid + k * clusters;
    const uint4* g = reinterpret_cast<const uint4*>(gu + t * 2 * ffn) + i0;
    mbar_arrive_expect_tx(&full[s], 2 * bytes);
    bulk_load(stage + size_t(s) * 2 * per, g, bytes, &full[s]);
    bulk_load(stage + size_t(s) * 2 * per + per, g + f8, bytes, &full[s]);
  };
  if (threadIdx.x == 0 && n > 0) {
    for (int s = 0; s < S; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int64_t k = 0; k < min(rows, int64_t(S)); ++k) issue(k);
  }
  if (sc.rs) {
    for (int j = threadIdx.x; j < 8 * n; j += blockDim.x) {
      const int64_t c = int64_t(8) * i0 + j, cu = ffn + c;
      csg[j] = c < sc.split ? sc.cs_lo[c] : sc.cs_hi[c - sc.split];
      csu[j] = cu < sc.split ? sc.cs_lo[cu] : sc.cs_hi[cu - sc.split];
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = int(blockDim.x + 31) >> 5;
  uint4 prev[IPT];
  float prev_s = 1.0f, prev_inv = 0.0f;
  int64_t prev_t = -1;
  auto store = [&](int64_t t, const uint4 (&v)[IPT], float s, float inv) {
    uint2* out = reinterpret_cast<uint2*>(q + t * kp8 * 8);
#pragma unroll
    for (int k = 0; k < IPT; ++k) {
      const int li = threadIdx.x + k * int(blockDim.x);
      if (li < n) out[i0 + li] = e4m3_encode8_bf16(v[k], s, inv);
    }
    for (int64_t i = f8 + int64_t(rank) * blockDim.x + threadIdx.x; i < kp8; i += int64_t(ncl) * blockDim.x) out[i] = make_uint2(0u, 0u);
  };
  for (int64_t k = 0; k < rows; ++k) {
    const int s = int(k % S), b = int(k & 1);
    const int64_t t = cid + k * clusters;
    const float r = sc.rs ? sc.rs[t] : 1.0f;
    uint4 cur[IPT];
    float m = 0;
    if (n > 0) mbar_wait(&full[s], uint32_t((k / S) & 1));
    const uint4* gs = stage + size_t(s) * 2 * per;
#pragma unroll
    for (int j = 0; j < IPT; ++j) {
      const int li = threadIdx.x + j * int(blockDim.x);
      if (li < n) {
        const uint4 gv = gs[li], uv = gs[per + li];
        if (sc.rs) {
          float cgs[8], cus[8];
          const float4* pg = reinterpret_cast<const float4*>(csg + 8 * li);
          const float4* pu = reinterpret_cast<const float4*>(csu + 8 * li);
          const float4 a = pg[0], a2 = pg[1], c = pu[0], c2 = pu[1];
          cgs[0] = a.x, cgs[1] = a.y, cgs[2] = a.z, cgs[3] = a.w, cgs[4] = a2.x, cgs[5] = a2.y, cgs[6] = a2.z, cgs[7] = a2.w;
          cus[0] = c.x, cus[1] = c.y, cus[2] = c.z, cus[3] = c.w, cus[4] = c2.x, cus[5] = c2.y, cus[6] = c2.z, cus[7] = c2.w;
          cur[j] = swiglu8_with(gv, uv, r, cgs, cus);
        } else {
          cur[j] = swiglu8_scaled(gv, uv, r, sc, 0, int(ffn), false);
        }
        m = absmax8_bf16(cur[j], m);
      }
    }
    // the CTA's max: wmax double-buffered, so the next row's writes never meet this row's reads
    m = warp_max(m);
    if (lane == 0) wmax[b][w] = m;
    __syncthreads();  // also: every thread is done with stage s
    m = warp_max(lane < nw ? wmax[b][lane] : 0.0f);
    if (threadIdx.x == 0) {
      cta_max[b] = m;
      if (n > 0 && k + S < rows) issue(k + S);  // a CTA with no items has no barriers
    }
    cl.barrier_arrive();  // release: cta_max[b] (and every read of rs[t]) before the peers' wait
    if (prev_t >= 0) store(prev_t, prev, prev_s, prev_inv);
    cl.barrier_wait();
#pragma unroll 1
    for (int o = 0; o < ncl; ++o) m = fmaxf(m, *cl.map_shared_rank(&cta_max[b], o));
    prev_s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
    prev_inv = fp8_row_recip(m, prev_s);
    if (rank == 0 && threadIdx.x == 0) scale[t] = prev_s;
#pragma unroll
    for (int j = 0; j < IPT; ++j) prev[j] = cur[j];
    prev_t = t;
  }
  if (prev_t >= 0) store(prev_t, prev, prev_s, prev_inv);
  cl.sync();  // no CTA leaves while a peer may still read its cta_max
#else
  __trap();  // never launched below compute capability 9.0
#endif
}
// The pipelined form over clusters of `cl` CTAs of `threads` threads: as many clusters as fit at
// once (cudaOccupancyMaxActiveClusters), at most one a row.
template <int IPT, int S>
void launch_swiglu_fp8_quant_pipe(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale, int cl,
                                  cudaStream_t s) {
  const int per = int((ffn / 8 + cl - 1) / cl);
  const int threads = ((per + IPT - 1) / IPT + 31) / 32 * 32;
  const size_t smem = swiglu_pipe_smem<S>(per);
  const std::string form = "swiglu_fp8_quant: ffn " + std::to_string(ffn) + " over the pipelined form's cluster of " + std::to_string(cl) + " CTAs of " +
                           std::to_string(IPT) + " items a thread, " + std::to_string(S) + " stages";
  static const int optin = [] {
    int v = 0, dev = 0;
    check(cudaGetDevice(&dev), "device");
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory a CTA");
    return v;
  }();
  static const int most = [] {  // the kernel's threads a CTA at its registers
    cudaFuncAttributes a{};
    check(cudaFuncGetAttributes(&a, swiglu_fp8_quant_pipe_k<IPT, S>), "swiglu pipe attributes");
    return a.maxThreadsPerBlock;
  }();
  if (threads > most) throw Error(Status::Internal, "internal_error", form + " needs " + std::to_string(threads) + " threads a CTA (" + std::to_string(most) + " at its registers)");
  if (smem > size_t(optin))
    throw Error(Status::Internal, "internal_error", form + " needs " + std::to_string(smem) + " bytes of shared memory a CTA (" + std::to_string(optin) + " here)");
  static int smem_set = 0;  // the attribute and the cluster count queried once per size (host time in the lab's timed loop)
  static int fit = 0;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(cl);
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(unsigned(cl) * 1024u);
  if (smem_set != int(smem) * 16 + cl) {
    check(cudaFuncSetAttribute(swiglu_fp8_quant_pipe_k<IPT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "swiglu pipe smem");
    check(cudaOccupancyMaxActiveClusters(&fit, swiglu_fp8_quant_pipe_k<IPT, S>, &cfg), "swiglu pipe clusters");
    smem_set = int(smem) * 16 + cl;
  }
  if (fit <= 0) throw Error(Status::Internal, "internal_error", "swiglu pipe: no cluster of " + std::to_string(cl) + " fits");
  cfg.gridDim = dim3(unsigned(std::min<int64_t>(fit, L) * cl));
  if (L == 0) return;
  check(cudaLaunchKernelEx(&cfg, swiglu_fp8_quant_pipe_k<IPT, S>, gu, L, ffn, sc, q, kp / 8, scale, per), "swiglu_fp8_quant (pipe)");
}

}  // namespace
}  // namespace clefrt::cuda

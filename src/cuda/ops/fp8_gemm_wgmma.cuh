// An FP8 GEMM of our own (docs/notes/fp8-gemm-design.md, steps 1 and 2): y = (x w^T) scaled, x
// [m, k] and w [n, k] e4m3 (K-major, as the model holds them), fp32 accumulation with promotion,
// the per-token x per-channel scales applied in the epilogue when given (fp8_scaled: cuBLASLt on
// sm_90 leaves them to a pass of their own). The lab (dev/cuda/fp8_gemm_wgmma.cu) measures its
// forms beside cuBLASLt; the forward runs it, unscaled in cuBLASLt's place, only under the lab
// switch CLEFRT_LAB_FP8_OWN_GEMM (Gemm::run_fp8). It gives cuBLASLt's promoted answers bit for bit;
// in the lab it is as fast, in the model at the power cap 1-3% slower at 8,192 tokens and ~20% at
// 318 (bench/results/2026-12-06-h100-session38.md).
//
// The kernel (sm_90a), one CTA of two warpgroups per 128 x 128 output tile:
//   - thread 0 brings x's and w's [128, 128-byte] tiles of each 128-wide k step by TMA (128-byte
//     swizzle, wgmma's K-major layout), STAGES - 1 steps ahead, onto a full-barrier per stage;
//   - each warpgroup runs its 64 rows x 128 columns of a k step as four wgmma m64n128k32 e4m3,
//     their sum starting from zero (scale-d 0 on the first): the tensor cores' own accumulation
//     over 128 k, the interval cuBLASLt's and CUTLASS's promotion use;
//   - promotion (every PROMO steps; 1 is the interval cuBLASLt and CUTLASS use, 2 and 4 the plan's
//     step 3: less promotion work, the tensor cores' own accumulation over 256 / 512 k): the
//     interval's sum is added into a separate fp32 total once its wgmmas are done
//     (wait 0, CUTLASS's and DeepGEMM's order: the other warpgroup's wgmmas keep the tensor cores
//     busy meanwhile). Two step accumulators promoting step kt - 1 under step kt's wgmmas made
//     ptxas serialize every wgmma (C7514), with or without the loop unrolled by two;
//   - the epilogue: fp8_scaled(total, rs[row], cs[col]) in bf16, fp32, or added to an fp32 y; or
//     (Out::SwiGLU, step 4) gate|up's SwiGLU from interleaved weight rows.
// A row's result is its own k steps in increasing order whatever m and the tile walk are (no split
// of k), so it does not depend on the batch (the lab and CudaQuant.Fp8OwnGemm* check it bit for bit).
//
// fp8_gemm_ws_k below is step 2 (a producer warpgroup, persistent 256 x 128, 128 x 128 or 128 x
// 192 tiles, clusters of 2), the form the product's switch runs; this one stays as the lab's
// reference (per-element stores: the epilogues' test compares the others against it).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/mma.cuh"
#include "cuda/ops/reduce.cuh"
#include "cuda/ops/tma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {
namespace fp8own {

constexpr int BM = 128, BN = 128, BK = 128, THREADS = 256;
constexpr int kTileBytes = BM * BK;  // an x or w tile: 128 rows of 128 e4m3

// PROMO: 128-wide k steps a promotion (1, 2, 4: every 128, 256 or 512 k). Between promotions a
// step's wgmmas stay in flight while the next one's are issued (wait 1), so a stage is free one
// step later: one step less is loaded ahead.
template <int STAGES, int PROMO = 1>
struct Cfg {
  static constexpr int stage_bytes = 2 * kTileBytes;  // x's, then w's
  static constexpr int bar_base = STAGES * stage_bytes;
  static constexpr int bytes = bar_base + STAGES * 8 + 1024;  // + the 1024-byte alignment slack
  static constexpr int DIST = PROMO == 1 ? STAGES - 1 : STAGES - 2;  // k steps loaded ahead
  static_assert(bytes <= 232448, "shared memory a CTA");
  static_assert(DIST >= 1, "stages");
};

// The first 64 accumulator operands' names of an m64nN wgmma (N >= 128)
#define CLEFRT_FP8_R64                                                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CLEFRT_FP8_D64 CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24), CLEFRT_WGMMA_D8(32), CLEFRT_WGMMA_D8(40), \
                       CLEFRT_WGMMA_D8(48), CLEFRT_WGMMA_D8(56)

// D (64 x 128 fp32: d[4j .. 4j + 3] = rows 16 w + g and + 8, columns 8j + 2t and + 1) (+)= A (64 x
// 32 e4m3) B (32 x 128 e4m3), both K-major in shared memory (8-bit types take no transpose).
__device__ __forceinline__ void wgmma_e4m3_n128(float* d, uint64_t da, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" CLEFRT_FP8_R64 "}, %64, %65, p, 1, 1;\n}\n"
      : CLEFRT_FP8_D64
      : "l"(da), "l"(db), "r"(int(accumulate)));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}

// The same with N = 192 (d[4j .. 4j + 3], j < 24): DeepGEMM's widest block for promotion's registers
__device__ __forceinline__ void wgmma_e4m3_n192(float* d, uint64_t da, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {" CLEFRT_FP8_R64 ", "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n}\n"
      : CLEFRT_FP8_D64, CLEFRT_WGMMA_D8(64), CLEFRT_WGMMA_D8(72), CLEFRT_WGMMA_D8(80), CLEFRT_WGMMA_D8(88)
      : "l"(da), "l"(db), "r"(int(accumulate)));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}
#undef CLEFRT_FP8_D64
#undef CLEFRT_FP8_R64
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float* d, uint64_t da, uint64_t db, bool accumulate) {
  static_assert(N == 128 || N == 192, "m64n128 or m64n192");
  if constexpr (N == 128) wgmma_e4m3_n128(d, da, db, accumulate);
  else wgmma_e4m3_n192(d, da, db, accumulate);
}

// A warpgroup's 128-wide k step on its 64 x N tile: four wgmmas from the K-major tiles at (x rows)
// and bt (w rows); `fresh`: the first starts the sum from zero (a promotion interval's first step).
// Only wgmmas write acc (another instruction writing it inside the pipeline makes ptxas serialize
// every wgmma: C7515); between an interval's steps a wgmma is in flight on it, so only a fresh
// step fences it.
template <int N = 128>
__device__ __forceinline__ void wgmma_step_e4m3(float (&acc)[N / 2], const unsigned char* at, const unsigned char* bt, bool fresh) {
  if (fresh)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_operand(acc[i]);
  wgmma_fence();
  // a 32-byte k step is + 2 in the descriptor's start address (bytes >> 4; a tile never crosses
  // its 14 bits): one descriptor computation a step, as cuBLASLt's SASS adds 2 to a uniform register
  const uint64_t da = wgmma_desc(at), db = wgmma_desc(bt);
#pragma unroll
  for (int s = 0; s < BK / 32; ++s) wgmma_e4m3<N>(acc, da + 2 * s, db + 2 * s, s > 0 || !fresh);
  wgmma_commit();
}
// Promotion: the interval's sum into the fp32 total (after a wait for its wgmmas)
template <int R>
__device__ __forceinline__ void promote(float (&total)[R], float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    fence_operand(acc[i]);
    total[i] += acc[i];
  }
}

// Output modes of the epilogue. SwiGLU (step 4 of the plan): w's rows interleaved in groups of 8
// (8 gate rows, then the 8 up rows of the same columns, ...; cs in the same order), so a thread
// holds each gate value and its up value; y is act [m, n / 2] in bf16, act = bf16(silu(g) * u)
// from g, u = bf16(fp8_scaled(...)): the bits of the scaled bf16 gate|up through swiglu().
using Out = Fp8OwnOut;  // kernels_quant.h: the callers name the same outputs

// One warpgroup's m64nN sums v to y: this thread's rows r and r + 8 (r = the tile's first row
// + 16 warp + g), columns n0 + 8j + 2t (+1)
template <int N = 128>
__device__ __forceinline__ void store_m64n(const float (&v)[N / 2], int r, int n0, int t, int m, int n, const float* __restrict__ rs,
                                           const float* __restrict__ cs, void* y, int64_t ldy, Out out) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rr = r + 8 * h;
    if (rr >= m) continue;
    if (out == Out::SwiGLU) {  // gate group q's column 2t + c beside its up column 8 on
#pragma unroll
      for (int q = 0; q < N / 16; ++q)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int cg = n0 + 16 * q + 2 * t + c, cu = cg + 8;
          if (cu >= n) continue;
          const float gv = __bfloat162float(__float2bfloat16_rn(fp8_scaled(v[8 * q + 2 * h + c], rs[rr], cs[cg])));
          const float uv = __bfloat162float(__float2bfloat16_rn(fp8_scaled(v[8 * q + 4 + 2 * h + c], rs[rr], cs[cu])));
          static_cast<bf16*>(y)[int64_t(rr) * ldy + n0 / 2 + 8 * q + 2 * t + c] = __float2bfloat16(silu_f(gv) * uv);
        }
      continue;
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = n0 + j * 8 + t * 2 + c;
        if (col >= n) continue;
        const float x = rs ? fp8_scaled(v[j * 4 + h * 2 + c], rs[rr], cs[col]) : v[j * 4 + h * 2 + c];
        if (out == Out::BF16) static_cast<bf16*>(y)[int64_t(rr) * ldy + col] = __float2bfloat16_rn(x);
        else if (out == Out::F32) static_cast<float*>(y)[int64_t(rr) * ldy + col] = x;
        else static_cast<float*>(y)[int64_t(rr) * ldy + col] += x;
      }
  }
}

// The warp-specialized form's epilogue for bf16 outputs (Out::BF16, Out::SwiGLU), where y's rows
// are 16-byte aligned: a math warpgroup's m64n128 wave, scaled as store_m64n scales it (the
// same bits), goes through its 16 KB of shared memory (rows of 256 bytes, 16-byte chunks XOR the
// row's low 3 bits: no bank conflicts either way) and out as whole 16-byte chunks, a warp's stores
// covering two rows' contiguous bytes. The per-element stores of store_m64n used 8 of each 32
// bytes moved and held the math warps for ~40% of the kernel (Nsight Compute, s38 call 2).
// bar: the warpgroup's named barrier (1, 2: 0 is __syncthreads'); wtid: 0..127 in the warpgroup.
__device__ __forceinline__ void wg_bar(int bar) { asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory"); }

// A tile's scales, loaded at the tile's start so their latency hides under its k loop (the
// epilogue's first use waited on them: Nsight Compute, s38 call 3): lane l's column scales n0 +
// 4l .. + 3 (every warp holds the tile's first 128; N 192: and n0 + 128 + 2l, + 1 in c2x;
// scale_pair shuffles out a thread's), and the row scales of this thread's rows of each wave
// (row0 + 64 w + 16 warp + g, + 8). Unscaled (rs null): ones.
template <int WAVES, int N = 128>
struct TileScales {
  float4 c4;
  float2 c2x;
  float r[WAVES][2];
  __device__ __forceinline__ void load(const float* __restrict__ rs, const float* __restrict__ cs, int row0, int n0, int m, int n, int wtid) {
    const int lane = wtid & 31, warp = wtid >> 5, g = lane >> 2, c = n0 + 4 * lane;
    c4 = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    c2x = make_float2(1.0f, 1.0f);
    if (rs) {
      if (c + 3 < n && (reinterpret_cast<uintptr_t>(cs + c) & 15) == 0) c4 = *reinterpret_cast<const float4*>(cs + c);
      else c4 = make_float4(c < n ? cs[c] : 1.0f, c + 1 < n ? cs[c + 1] : 1.0f, c + 2 < n ? cs[c + 2] : 1.0f, c + 3 < n ? cs[c + 3] : 1.0f);
      if (N == 192) {
        const int cx = n0 + 128 + 2 * lane;
        c2x = make_float2(cx < n ? cs[cx] : 1.0f, cx + 1 < n ? cs[cx + 1] : 1.0f);
      }
    }
#pragma unroll
    for (int w = 0; w < WAVES; ++w)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = row0 + 64 * w + 16 * warp + g + 8 * h;
        r[w][h] = rs && rr < m ? rs[rr] : 1.0f;
      }
  }
};

// A thread's column scales n0 + 8j + 2t (+1) of the tile (j a compile-time index after unrolling):
// j < 16: lane 2j + t / 2's (x, y) or (z, w) of TileScales::c4; from 128 on, lane 4 (j - 16) + t's c2x
__device__ __forceinline__ float2 scale_pair(float4 c4, float2 c2x, int j, int t) {
  if (j >= 16) {
    const int src = 4 * (j - 16) + t;
    return make_float2(__shfl_sync(0xffffffffu, c2x.x, src), __shfl_sync(0xffffffffu, c2x.y, src));
  }
  const int src = 2 * j + (t >> 1);
  const float x = __shfl_sync(0xffffffffu, c4.x, src), yv = __shfl_sync(0xffffffffu, c4.y, src);
  const float z = __shfl_sync(0xffffffffu, c4.z, src), w = __shfl_sync(0xffffffffu, c4.w, src);
  return (t & 1) ? make_float2(z, w) : make_float2(x, yv);
}

// full: the wave's 64 rows and the tile's columns all inside y, no bound checks (the per-element
// checks and addresses were two thirds of the epilogue's ~1,560 instructions a warp and tile; a
// template of each kind made ptxas spill). N 192: rows of 384 bytes (24 chunks, XOR g keeps a chunk
// in its group of 8).
template <int N = 128>
__device__ __forceinline__ void store_wave_staged(const float (&v)[N / 2], unsigned char* stage, int row0, int n0, int m, int n, float4 c4,
                                                  float2 c2x, const float (&rw)[2], bool scaled, bf16* y, int64_t ldy, bool swiglu, bool full,
                                                  int bar, int wtid) {
  constexpr int NJ = N / 8, PITCH = 2 * N;  // 16-byte chunks a row, bytes a staged row
  const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
  float2 c2[NJ];  // a wave at a time: held across the waves, with the second's totals, they spilled
#pragma unroll
  for (int j = 0; j < NJ; ++j) c2[j] = scale_pair(c4, c2x, j, t);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int lr = 16 * warp + g + 8 * h;  // lr % 8 == g: chunk c of the row sits at (c ^ g) 16 bytes
    const float r = rw[h];
    unsigned char* const row = stage + lr * PITCH + 4 * t;
    auto chunk = [&](int c) { return row + ((c ^ g) << 4); };
    if (!swiglu) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float a = v[4 * j + 2 * h], b = v[4 * j + 2 * h + 1];
        const uint32_t p = scaled ? pack_bf16(fp8_scaled(a, r, c2[j].x), fp8_scaled(b, r, c2[j].y)) : pack_bf16(a, b);
        *reinterpret_cast<uint32_t*>(chunk(j)) = p;
      }
    } else {  // gate group q: columns 16q + 2t (+1) (chunk 2q), up 8 on (chunk 2q + 1); act chunk q
#pragma unroll
      for (int q = 0; q < NJ / 2; ++q) {
        float act[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float cg = c ? c2[2 * q].y : c2[2 * q].x, cu = c ? c2[2 * q + 1].y : c2[2 * q + 1].x;
          const float gv = __bfloat162float(__float2bfloat16_rn(fp8_scaled(v[8 * q + 2 * h + c], r, cg)));
          const float uv = __bfloat162float(__float2bfloat16_rn(fp8_scaled(v[8 * q + 4 + 2 * h + c], r, cu)));
          act[c] = silu_f(gv) * uv;
        }
        *reinterpret_cast<uint32_t*>(chunk(q)) = pack_bf16(act[0], act[1]);
      }
    }
  }
  wg_bar(bar);
  const int cpr = swiglu ? NJ / 2 : NJ, col0 = swiglu ? n0 / 2 : n0, ncols = swiglu ? n / 2 : n;
  // one 16-byte chunk out: staged row lr, chunk cc, to y's row row0 + lr at d
  auto out_chunk = [&](int lr, int cc, bf16* d) {
    const uint4 val = *reinterpret_cast<const uint4*>(stage + lr * PITCH + ((cc ^ (lr & 7)) << 4));
    const int col = col0 + 8 * cc;
    const bool row_in = full || row0 + lr < m;
    if (full || (row_in && col + 8 <= ncols)) {
      *reinterpret_cast<uint4*>(d) = val;
    } else if (row_in && col < ncols) {  // the last partial chunk of a row
      const uint32_t wv[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (q < ncols - col) d[q] = __ushort_as_bfloat16(uint16_t(wv[q / 2] >> (16 * (q % 2))));
    }
  };
  if constexpr (N == 128) {
    // a thread's chunk cc of rows lr0, lr0 + RS, ... (RS 8: 16 chunks a row; SwiGLU's act, 8
    // chunks a row: RS 16); every such row has lr0's low 3 bits, so one shared-memory offset
    const int rs_step = swiglu ? 16 : 8, cc = wtid & (cpr - 1), lr0 = wtid / cpr;
    bf16* d = y + int64_t(row0 + lr0) * ldy + col0 + 8 * cc;
    const int64_t d_step = int64_t(rs_step) * ldy;
#pragma unroll 4
    for (int i = 0; i < (swiglu ? 4 : 8); ++i, d += d_step) out_chunk(lr0 + i * rs_step, cc, d);
  } else {  // 24 (act: 12) chunks a row: chunk c = wtid + 128 i of the wave's
#pragma unroll 4
    for (int i = 0; i < cpr / 2; ++i) {
      const int c = wtid + 128 * i, lr = c / cpr, cc = c - lr * cpr;
      out_chunk(lr, cc, y + int64_t(row0 + lr) * ldy + col0 + 8 * cc);
    }
  }
  wg_bar(bar);  // the staging is free for the next wave
}

// The same for fp32 outputs (Out::F32, Out::F32Add; y's rows 16-byte aligned): the wave's 64 x N
// floats in 64-column passes through 16 KB of the staging (rows of 64 floats, 16-byte chunks XOR
// the row's low 3 bits), out as 16-byte chunks (F32Add: y's chunk read and added, as store_m64n).
template <int N = 128>
__device__ __forceinline__ void store_wave_staged_f32(const float (&v)[N / 2], unsigned char* stage, int row0, int n0, int m, int n, float4 c4,
                                                      float2 c2x, const float (&rw)[2], bool scaled, float* y, int64_t ldy, bool add, int bar,
                                                      int wtid) {
  const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int pass = 0; pass < N / 64; ++pass) {
    float2 c2[8];  // the pass's column scales (a pass at a time: the whole row's spilled registers)
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) c2[jj] = scale_pair(c4, c2x, 8 * pass + jj, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = 16 * warp + g + 8 * h;
      unsigned char* const row = stage + lr * 256;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int j = 8 * pass + jj, c = 2 * jj + (t >> 1);  // columns 8jj + 2t (+1) of the pass: chunk c, bytes 8 (t & 1) on
        float a = v[4 * j + 2 * h], b = v[4 * j + 2 * h + 1];
        if (scaled) a = fp8_scaled(a, rw[h], c2[jj].x), b = fp8_scaled(b, rw[h], c2[jj].y);
        *reinterpret_cast<float2*>(row + ((c ^ (lr & 7)) << 4) + 8 * (t & 1)) = make_float2(a, b);
      }
    }
    wg_bar(bar);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = wtid + 128 * i, lr = c / 16, cc = c % 16, rr = row0 + lr, col = n0 + 64 * pass + 4 * cc;
      if (rr >= m || col >= n) continue;
      const float4 val = *reinterpret_cast<const float4*>(stage + lr * 256 + ((cc ^ (lr & 7)) << 4));
      float* const dst = y + int64_t(rr) * ldy + col;
      if (col + 4 <= n) {
        float4 o = val;
        if (add) {
          const float4 old = *reinterpret_cast<const float4*>(dst);
          o = make_float4(old.x + val.x, old.y + val.y, old.z + val.z, old.w + val.w);
        }
        *reinterpret_cast<float4*>(dst) = o;
      } else {  // the last partial chunk of a row
        const float e[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (q < n - col) dst[q] = add ? dst[q] + e[q] : e[q];
      }
    }
    wg_bar(bar);  // the staging is free for the next pass
  }
}

template <int STAGES, int PROMO>
__global__ void __launch_bounds__(THREADS, 1)
    fp8_gemm_wgmma_k(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int m, int n, int k,
                     const float* __restrict__ rs, const float* __restrict__ cs, void* y, int64_t ldy, Out out) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // sm_90a only (main refuses other devices)
#else
  using C = Cfg<STAGES, PROMO>;
  static_assert(PROMO == 1 || PROMO == 2 || PROMO == 4, "promotion every 1, 2 or 4 k steps");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, wg = tid >> 7;
  const int m0 = int(blockIdx.y) * BM, n0 = int(blockIdx.x) * BN;
  const int ktiles = (k + BK - 1) / BK;  // a partial last step: TMA fills past k with zeros
  auto xtile = [&](int kt) { return smem + (kt % STAGES) * C::stage_bytes; };
  auto wtile = [&](int kt) { return smem + (kt % STAGES) * C::stage_bytes + kTileBytes; };
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto load = [&](int kt) {
    if (tid != 0 || kt >= ktiles) return;
    mbar_arrive_expect_tx(&full[kt % STAGES], 2 * kTileBytes);  // out-of-bounds bytes are counted too
    tma_load_2d(xtile(kt), &xmap, kt * BK, m0, &full[kt % STAGES]);
    tma_load_2d(wtile(kt), &wmap, kt * BK, n0, &full[kt % STAGES]);
  };
  for (int kt = 0; kt < C::DIST; ++kt) load(kt);

  float total[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) total[i] = 0.0f;
  float acc[64];  // an interval's sum (wgmma_step_e4m3)
  // an interval's steps unrolled, so ptxas sees which waits cover which wgmmas. It still injects one
  // wait of its own (C7517) where the loop exits after a partial interval: once a CTA, harmless
  for (int k0 = 0; k0 < ktiles; k0 += PROMO) {
#pragma unroll
    for (int p = 0; p < PROMO; ++p) {
      const int kt = k0 + p;
      if (kt >= ktiles) break;
      // every warpgroup is past its wait of step kt - 1: step kt - 1's wgmmas (after a promotion)
      // or step kt - 2's are done, and stage (kt + DIST) % STAGES is theirs
      __syncthreads();
      load(kt + C::DIST);
      mbar_wait(&full[kt % STAGES], uint32_t((kt / STAGES) & 1));
      wgmma_step_e4m3(acc, xtile(kt) + wg * 64 * 128, wtile(kt), p == 0);
      if (p == PROMO - 1 || kt + 1 == ktiles) {
        wgmma_wait<0>();
        promote<64>(total, acc);
      } else {
        wgmma_wait<1>();  // step kt - 1's; step kt's stay in flight, accumulating on
      }
    }
  }

  const int warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
  store_m64n<128>(total, m0 + wg * 64 + warp * 16 + g, n0, t, m, n, rs, cs, y, ldy, out);
#endif
}

// Step 2 of the plan: warp-specialized and persistent. 384 threads: warpgroup 0 the producer (one
// thread issues every TMA copy; its registers cut to 40 by setmaxnreg), warpgroups 1 and 2 the
// math (raised to 232), each 64 WAVES rows of a (128 WAVES) x NB tile as WAVES m64nNB waves a k
// step (one step accumulator shared by the waves, a fp32 total a wave: WAVES 2 is DeepGEMM's
// 256 x 128; NB 192, one wave, its 128 x 192). The stage ring runs on across tiles: full barriers (the producer's expect-tx) and
// empty ones (each math warp's arrival once its wgmmas on the stage are done, before the last
// wave's promotion: 8 a stage). One CTA an SM walks the tiles blockIdx.x, + gridDim.x, ...
// (ws_tile): GROUP M blocks at a time down each N block, then the next N block, so the CTAs in
// flight at once share few x rows and w rows (both stay in L2; GROUP 0: all M blocks, the
// walk before the grouping). The same promotion (every 128 k, after a wait) and epilogue as
// step 1: the same bits.
constexpr int WS_THREADS = 384;
template <int STAGES, int WAVES, int NB = 128>
struct WsCfg {
  static constexpr int BM = 128 * WAVES;
  static constexpr int a_bytes = BM * BK, b_bytes = NB * BK, stage_bytes = a_bytes + b_bytes;
  static constexpr int staging = STAGES * stage_bytes;  // a math warpgroup's 64 x NB bf16 (store_wave_staged)
  static constexpr int staging_wg = 64 * 2 * NB;
  static constexpr int bar_base = staging + 2 * staging_wg;
  static constexpr int bytes = bar_base + 2 * STAGES * 8 + 1024;
  static_assert(WAVES == 1 || WAVES == 2, "one or two m64 waves a math warpgroup");
  static_assert(NB == 128 || (NB == 192 && WAVES == 1), "n 128, or 192 in one wave (a total and a step sum of 96 registers each)");
  static_assert(bytes <= 232448, "shared memory a CTA");
};

// The persistent walk's tile -> (M block, N block): groups of `group` M blocks (the last one
// shorter), inside a group M fastest, then N
__device__ __forceinline__ void ws_tile(int tile, int mt, int nt, int group, int& mb, int& nb) {
  if (group <= 0 || group >= mt) {
    mb = tile % mt, nb = tile / mt;
    return;
  }
  const int per_group = group * nt, g0 = (tile / per_group) * group, rows = min(group, mt - g0), r = tile - (tile / per_group) * per_group;
  mb = g0 + r % rows, nb = r / rows;
}

template <int STAGES, int WAVES, int GROUP, int CL, int NB>
__global__ void __launch_bounds__(WS_THREADS, 1)
    fp8_gemm_ws_k(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int m, int n, int k,
                  const float* __restrict__ rs, const float* __restrict__ cs, void* y, int64_t ldy, Out out) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 CTAs");
  using C = WsCfg<STAGES, WAVES, NB>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  // the warpgroup through a shuffle, as CUTLASS's canonical_warp_group_idx: the compiler then
  // knows it warp-uniform and keeps the stage addresses and descriptors in uniform registers
  const int tid = int(threadIdx.x), lane = tid & 31, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const uint32_t rank = CL == 1 ? 0 : cluster_rank();
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  uint64_t* const empty = full + STAGES;
  if (tid == 0) {
    // CL 2: a stage is written by both CTAs' copies (x's halves multicast), so both CTAs' math
    // warps release it (8 each)
    for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 8 * CL);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (CL == 1) __syncthreads();
  else cluster_sync_all();  // the peer's barriers are initialized before any copy or arrival reaches them
  // CL 2: the cluster walks N-block pairs (unit nb2 -> N blocks 2 nb2 + rank), sharing x's tile
  const int mt = (m + C::BM - 1) / C::BM, nt = (n + NB - 1) / NB, ntu = (nt + CL - 1) / CL, units = mt * ntu, ktiles = (k + BK - 1) / BK;
  const int unit0 = int(blockIdx.x) / CL, unit_step = int(gridDim.x) / CL;
  auto atile = [&](int s) { return smem + s * C::stage_bytes; };
  auto btile = [&](int s) { return smem + s * C::stage_bytes + C::a_bytes; };
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int it = 0;  // k steps issued, over all tiles: stage it % STAGES, its round it / STAGES
      for (int u = unit0; u < units; u += unit_step) {
        int mb, nu;
        ws_tile(u, mt, ntu, GROUP, mb, nu);
        const int nb = nu * CL + int(rank);
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = it % STAGES;
          mbar_wait(&empty[s], uint32_t(((it / STAGES) & 1) ^ 1));  // a fresh barrier passes parity 1 at once
          mbar_arrive_expect_tx(&full[s], C::stage_bytes);  // x's whole tile (CL 2: half from the peer) and w's
          if (CL == 1) tma_load_2d(atile(s), &xmap, kt * BK, mb * C::BM, &full[s]);
          else tma_load_2d_multicast(atile(s) + rank * (C::a_bytes / CL), &xmap, kt * BK, mb * C::BM + int(rank) * (C::BM / CL), &full[s], 3);
          tma_load_2d(btile(s), &wmap, kt * BK, nb * NB, &full[s]);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
    // y's rows 16-byte aligned: the staged epilogues (store_wave_staged, store_wave_staged_f32)
    const bool f32 = out == Out::F32 || out == Out::F32Add;
    const bool staged = (reinterpret_cast<uintptr_t>(y) & 15) == 0 && ldy % (f32 ? 4 : 8) == 0;
    float total[WAVES][NB / 2], acc[NB / 2];
    int it = 0;
    for (int u = unit0; u < units; u += unit_step) {
      int mb, nu;
      ws_tile(u, mt, ntu, GROUP, mb, nu);
      const int nb = nu * CL + int(rank);
      const int row0 = mb * C::BM + cw * 64 * WAVES;  // this warpgroup's first row
      TileScales<WAVES, NB> sc;
      if (staged) sc.load(rs, cs, row0, nb * NB, m, n, tid - 128 * wg);
#pragma unroll
      for (int w = 0; w < WAVES; ++w)
#pragma unroll
        for (int i = 0; i < NB / 2; ++i) total[w][i] = 0.0f;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(&full[s], uint32_t((it / STAGES) & 1));
        const unsigned char* bt = btile(s);
#pragma unroll
        for (int w = 0; w < WAVES; ++w) {
          wgmma_step_e4m3<NB>(acc, atile(s) + (cw * 64 * WAVES + w * 64) * 128, bt, true);
          wgmma_wait<0>();
          if (w == WAVES - 1 && lane == 0) {  // this warp's wgmmas on stage s are done
            mbar_arrive(&empty[s]);
            if (CL == 2) mbar_arrive_cluster(&empty[s], rank ^ 1u);
          }
          promote<NB / 2>(total[w], acc);
        }
      }
      if (nb >= nt) continue;  // CL 2, an odd N-block count: the last pair's second tile is past n
      if (staged) {
        unsigned char* const st = smem + C::staging + cw * C::staging_wg;
        if (f32) {
#pragma unroll
          for (int w = 0; w < WAVES; ++w)
            store_wave_staged_f32<NB>(total[w], st, row0 + w * 64, nb * NB, m, n, sc.c4, sc.c2x, sc.r[w], rs != nullptr, static_cast<float*>(y), ldy,
                                  out == Out::F32Add, 1 + cw, tid - 128 * wg);
        } else {
          const bool full = row0 + 64 * WAVES <= m && (nb + 1) * NB <= n;
#pragma unroll
          for (int w = 0; w < WAVES; ++w)
            store_wave_staged<NB>(total[w], st, row0 + w * 64, nb * NB, m, n, sc.c4, sc.c2x, sc.r[w], rs != nullptr, static_cast<bf16*>(y), ldy,
                              out == Out::SwiGLU, full, 1 + cw, tid - 128 * wg);
        }
      } else {
#pragma unroll
        for (int w = 0; w < WAVES; ++w) store_m64n<NB>(total[w], row0 + w * 64 + warp * 16 + g, nb * NB, t, m, n, rs, cs, y, ldy, out);
      }
    }
  }
  // CL 2: no CTA leaves while its peer may still arrive on its barriers
  if (CL == 2) {
    __syncwarp();
    cluster_sync_all();
  }
#endif
}

// An e4m3 matrix [rows, k] (rows k bytes apart) as a TMA tensor map: boxes of 128 bytes of k x
// box_rows rows, 128-byte swizzle (wgmma_desc's layout), out-of-bounds elements zero
inline CUtensorMap fp8_tensor_map(const uint8_t* p, int64_t rows, int64_t k, int box_rows = BM) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder("fp8 gemm (wgmma)");
  if (k % 16 != 0) throw Error(Status::Internal, "internal_error", "fp8 gemm (wgmma): k " + std::to_string(k) + " is not a multiple of 16");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)}, strides[1] = {cuuint64_t(k)};
  const cuuint32_t box[2] = {cuuint32_t(BK), cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(Status::Internal, "internal_error",
                "fp8 gemm (wgmma): cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ") for [" + std::to_string(rows) + ", " +
                    std::to_string(k) + "]");
  return map;
}

// Kernel's dynamic shared memory raised to `bytes`, once a process (a kernel of its own each:
// the template parameter is the kernel itself)
template <auto Kernel>
void allow_smem_once(int bytes, const char* what) {
  static const bool done = [&] {
    check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
    return true;
  }();
  (void)done;
}

template <int STAGES, int PROMO = 1>
void fp8_gemm_wgmma(const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, const float* rs, const float* cs, void* y, int64_t ldy,
                    Out out, cudaStream_t s) {
  using C = Cfg<STAGES, PROMO>;
  allow_smem_once<fp8_gemm_wgmma_k<STAGES, PROMO>>(C::bytes, "fp8 gemm (wgmma)");
  const CUtensorMap xmap = fp8_tensor_map(x, m, k), wmap = fp8_tensor_map(w, n, k);
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  fp8_gemm_wgmma_k<STAGES, PROMO><<<grid, THREADS, C::bytes, s>>>(xmap, wmap, int(m), int(n), int(k), rs, cs, y, ldy, out);
  check_launch("fp8 gemm (wgmma)");
}

template <int STAGES, int WAVES = 2, int GROUP = 0, int CL = 1, int NB = 128>
void fp8_gemm_ws(const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, const float* rs, const float* cs, void* y, int64_t ldy,
                 Out out, cudaStream_t s) {
  using C = WsCfg<STAGES, WAVES, NB>;
  constexpr auto kernel = fp8_gemm_ws_k<STAGES, WAVES, GROUP, CL, NB>;
  allow_smem_once<kernel>(C::bytes, "fp8 gemm (warp-specialized)");
  const CUtensorMap xmap = fp8_tensor_map(x, m, k, C::BM / CL), wmap = fp8_tensor_map(w, n, k, NB);
  const int64_t units = ((m + C::BM - 1) / C::BM) * ((n + NB * CL - 1) / (NB * CL));
  const unsigned grid = unsigned(std::min<int64_t>(units, sm_count() / CL) * CL);
  if (CL == 1) kernel<<<grid, WS_THREADS, C::bytes, s>>>(xmap, wmap, int(m), int(n), int(k), rs, cs, y, ldy, out);
  else
    check(launch_on_clusters_smem(kernel, grid, WS_THREADS, CL, size_t(C::bytes), s, xmap, wmap, int(m), int(n), int(k), rs, cs, y, ldy, out),
          "fp8 gemm (warp-specialized, clusters)");
  check_launch("fp8 gemm (warp-specialized)");
}

}  // namespace fp8own
}  // namespace clefrt::cuda

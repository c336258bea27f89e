// The NVFP4 W4A16 GEMM on Hopper's warpgroup MMA (sm_90a; kernels_quant.h nvfp4_gemm picks it
// on compute capability 9.0): y (+)= x W^T with W packed (4.5 bits a weight) in global memory,
// dequantized per tile into shared memory, and multiplied by wgmma with both operands read from
// shared memory (wgmma.cuh's core-matrix layout).
//
// Per CTA (256 threads = two warpgroups) a BM-token x 128-channel tile; per 64-wide k step kt:
//   1. one TMA copy (tma.cuh) brings x's [BM, 64] bf16 tile, already in wgmma's swizzled A layout,
//      two steps ahead, and cp.async W's [128, 32] packed bytes + [128, 4] e4m3 scales three
//      steps ahead;
//   2. both warpgroups issue step kt's wgmmas (asynchronous: the tensor cores run them while the
//      threads go on) on x's tile and the dequantized weight tile kt, then
//   3. every thread dequantizes two (channel, 16-weight block)s of step kt + 1 into the next of
//      three bf16 weight tiles (nvfp4_dequant.cuh: a byte-permute table per block, exactly
//      nvfp4_dequantize's values), and waits for its wgmmas of step kt - 1 only: step kt's stay
//      in flight across the barrier, so the tensor cores always have the next step queued.
// mma.sync (kernels_w4a16.cu) spends most of its issue slots on ldmatrix and one MMA per 16x8x16;
// here one instruction covers 64 x 128 x 16 and the threads' slots go to the dequantization.
//
// Measured (H200, bench/results/2026-12-01-h200-gemm-w4a16-s6*.json, section "Session 6" of
// 2026-12-01-h200-clef-27b-quant.md): unswizzled operands ran below mma.sync; the swizzle + one
// step in flight, then no accumulator zeroing (ptxas had serialized every wgmma of the 256-token
// tile, C7515), the cheaper exact dequantization (nvfp4_dequant.cuh) and x by TMA brought 406-476
// TFLOP/s at 8,192 tokens (~50-60% of cuBLASLt's bf16) and 1.1-1.4x the batch-invariant bf16 GEMM
// at m <= 64. Measured slower and dropped: warp specialization (producer warpgroups copying and
// dequantizing, consumers only issuing wgmmas, mbarrier hand-over, setmaxnreg: 329-384 at 8,192,
// 0.8-0.95x at m <= 128); four warpgroups of 64 tokens (one block a thread: same at 8,192, slower
// below); weights loaded into registers a step ahead instead of cp.async (slower everywhere).
// Nsight Compute: tensor pipe 38-46% active, 8 warps per SM, ~0.45 eligible per scheduler, issue
// slots 40% busy. What holds the tensor cores back is not settled (see the note on issue 6).
//
// Tiles: BM = 256 (each warpgroup 128 tokens x 128 channels: two m64n128 per k16), 128 (64 x 128
// each) or 64 (each warpgroup 64 tokens x 64 channels, m64n64). Every output element is the
// tensor cores' fp32 sum over k in increasing 16-wide steps whatever m and the tile are (the
// per-element result of wgmma does not depend on the instruction's N: tested bit for bit across
// tile heights), so a row's result does not depend on the batch it runs in.
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/runtime/check.h"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/nvfp4_dequant.cuh"
#include "cuda/ops/tma.cuh"
#include "cuda/ops/wgmma.cuh"

namespace clefrt::cuda {

namespace {

constexpr int BN = 128, BK = 64, THREADS = 256;

template <int BM>
struct WgCfg {
  // warpgroups along the tokens (2) or, for the 64-token tile, along the channels
  static constexpr int WG_M = BM >= 128 ? 2 : 1, WG_N = 2 / WG_M;
  static constexpr int WM = BM / WG_M, MB = WM / 64;  // tokens per warpgroup, m64 blocks
  static constexpr int WN = BN / WG_N;                // channels per warpgroup = wgmma N
  // copy stages (x tiles and packed weights alike; the pipeline needs 4)
  static constexpr int STAGES = 4;
  static constexpr int WBUFS = 3;                 // dequantized tiles: kt - 1 (in flight), kt, kt + 1
  static constexpr int wb_bytes = BN * BK * 2;    // a dequantized tile, bf16, swizzled
  static constexpr int a_bytes = BM * BK * 2;     // x tile, bf16, swizzled
  static constexpr int wp_bytes = BN * BK / 2;    // packed codes, [128][32] bytes
  static constexpr int ws_bytes = BN * BK / 16;   // e4m3 scales, [128][4]
  static constexpr int a_base = WBUFS * wb_bytes;             // swizzled tiles stay 1024-aligned
  static constexpr int w_base = a_base + STAGES * a_bytes;
  static constexpr int bar_base = w_base + STAGES * (wp_bytes + ws_bytes);
  static constexpr int bytes = bar_base + STAGES * 8 + 1024;  // + alignment slack
  static constexpr int MIN_BLOCKS = BM == 64 ? 2 : 1;  // what fits the SM's 227 KB
  static constexpr int UNITS = BN * (BK / 16) / THREADS;  // (channel, block)s per thread and step
  static_assert(MB >= 1 && UNITS == 2, "tile shape");
  static_assert(MIN_BLOCKS * (bytes + 1024) <= 233472, "shared memory per SM");
};

template <int BM>
__global__ void __launch_bounds__(THREADS, WgCfg<BM>::MIN_BLOCKS)
    nvfp4_gemm_wgmma_k(const __grid_constant__ CUtensorMap xmap, int m, int k, const uint8_t* __restrict__ packed,
                       const uint8_t* __restrict__ scales, const float* __restrict__ row_gs, int n, void* y, bool y_f32, int64_t ldy,
                       bool accumulate) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Other architectures of a fat binary: never launched there (nvfp4_gemm_wgmma_available)
  __trap();
#else
  using C = WgCfg<BM>;
  constexpr int STAGES = C::STAGES, MB = C::MB, WN = C::WN, UNITS = C::UNITS;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle is computed from address bits: tiles must sit on 1024-byte boundaries
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, wg = tid >> 7;
  const int wm = C::WG_M == 2 ? wg : 0, wn = C::WG_M == 2 ? 0 : wg;
  const int m0 = int(blockIdx.y) * BM, n0 = int(blockIdx.x) * BN;
  const int ktiles = k / BK;
  auto xtile = [&](int kt) { return smem + C::a_base + (kt % STAGES) * C::a_bytes; };
  auto wtile = [&](int kt) { return smem + C::w_base + (kt % STAGES) * (C::wp_bytes + C::ws_bytes); };
  auto dtile = [&](int kt) { return smem + (kt % C::WBUFS) * C::wb_bytes; };

  // x tiles: one TMA copy each (thread 0), [BM, 64] bf16 at (k0, m0) swizzled as wgmma reads it;
  // rows past m arrive as zeros. xfull[s] completes when stage s's tile has landed.
  uint64_t* const xfull = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&xfull[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();
  const Nvfp4StepCopy<BN, BK> copy_w(packed, scales, n0, n, k, tid);
  auto load_x = [&](int kt) {
    if (tid != 0 || kt >= ktiles) return;
    mbar_arrive_expect_tx(&xfull[kt % STAGES], C::a_bytes);
    tma_load_2d(xtile(kt), &xmap, kt * BK, m0, &xfull[kt % STAGES]);
  };
  auto load_w = [&](int kt) {
    if (kt < ktiles) copy_w(wtile(kt), kt);
  };

  // Dequantization units: u = tid + i * 256 is channel u / 4, block u % 4 (8 lanes: two channels'
  // four blocks, whose swizzled 16-byte stores cover the 32 banks once).
  int urow[UNITS], ublk[UNITS];
  float ugs[UNITS], urc[UNITS];
#pragma unroll
  for (int i = 0; i < UNITS; ++i) {
    const int u = tid + i * THREADS;
    urow[i] = u >> 2;
    ublk[i] = u & 3;
    ugs[i] = n0 + urow[i] < n ? row_gs[n0 + urow[i]] : 1.0f;
    urc[i] = row_reciprocal(ugs[i]);
  }
  auto dequant = [&](int kt) {
    const unsigned char* st = wtile(kt);
    unsigned char* wb = dtile(kt);
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
      const uint2 pk = *reinterpret_cast<const uint2*>(st + urow[i] * 32 + ublk[i] * 8);
      const Table t = make_table_shift(scale_quotient(e4m3_value(st[C::wp_bytes + urow[i] * 4 + ublk[i]]), ugs[i], urc[i]));
      uint32_t o[8];
      dequant_word(pk.x, t, o);
      dequant_word(pk.y, t, o + 4);
      *reinterpret_cast<uint4*>(wb + swizzle128(urow[i], ublk[i] * 2)) = make_uint4(o[0], o[1], o[2], o[3]);
      *reinterpret_cast<uint4*>(wb + swizzle128(urow[i], ublk[i] * 2 + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
    }
  };

  // no zeroing: step 0's wgmmas overwrite (any other instruction writing the accumulators
  // between wgmmas makes ptxas serialize them all)
  float acc[MB][WN / 2];
  auto fence_accumulators = [&] {
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int j = 0; j < WN / 2; ++j) fence_operand(acc[b][j]);
  };

  // Step kt's copies, issued after its barrier: x tile kt + 2 (TMA) and weight tile kt + 3
  // (cp.async, one commit group). Stage j % 4 holds both tiles j; x tile j is read by wgmma j until
  // step j + 1 ends, weight tile j by dequant j in step j - 1. The prologue stands in for steps
  // -2 and -1.
  load_w(0), load_x(0), load_w(1);
  cp_async_commit();
  load_x(1), load_w(2);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  dequant(0);

  for (int kt = 0; kt < ktiles; ++kt) {
    // This thread's weight copies committed in step kt - 2 (tile kt + 1) have landed. After the
    // fence and the barrier every thread's copies and dequantized tile kt are visible to the
    // tensor cores, and every warpgroup's wgmmas of step kt - 2 are done (each waited
    // for them at the end of step kt - 1): stage (kt + 2) % 4 and dequantized tile (kt + 1) % 3
    // are free.
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
    load_x(kt + 2), load_w(kt + 3);
    cp_async_commit();

    mbar_wait(&xfull[kt % STAGES], uint32_t((kt / STAGES) & 1));  // x tile kt
    const unsigned char* a = xtile(kt) + wm * C::WM * 128;
    const unsigned char* wb = dtile(kt) + wn * WN * 128;
    // the accumulators pinned in registers before the wgmmas (ptxas serializes every wgmma if
    // another instruction defines them inside the pipeline, and says so only as an info line:
    // "C7515" under -Xptxas -v; check it after any change here. Serialized, the 256-token tile
    // measured 8-11% slower at 8,192 tokens)
    fence_accumulators();
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < BK / 16; ++s) {
      const uint64_t db = wgmma_desc(wb + s * 32);
#pragma unroll
      for (int b = 0; b < MB; ++b) wgmma_bf16<WN>(acc[b], wgmma_desc(a + b * 64 * 128 + s * 32), db, kt > 0 || s > 0);
    }
    wgmma_commit();
    if (kt + 1 < ktiles) dequant(kt + 1);
    wgmma_wait<1>();  // step kt - 1's wgmmas; step kt's stay in flight
  }
  wgmma_wait<0>();
  fence_accumulators();
  cp_async_wait_all();

  const int warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int j = 0; j < WN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + wm * C::WM + b * 64 + warp * 16 + g + h * 8;
        if (r >= m) continue;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = n0 + wn * WN + j * 8 + t * 2 + c;
          if (col >= n) continue;
          store_output(y, y_f32, ldy, accumulate, r, col, acc[b][j * 4 + h * 2 + c]);
        }
      }
#endif
}

template <int BM>
void launch(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
            void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s) {
  using C = WgCfg<BM>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(nvfp4_gemm_wgmma_k<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "nvfp4_gemm (wgmma)");
    check(cudaFuncSetAttribute(nvfp4_gemm_wgmma_k<BM>, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
          "nvfp4_gemm (wgmma)");
    return true;
  }();
  (void)configured;
  const CUtensorMap xmap = bf16_tensor_map_sw128(x, m, k, ldx, BK, BM, "nvfp4_gemm (wgmma)");
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  nvfp4_gemm_wgmma_k<BM><<<grid, THREADS, C::bytes, s>>>(xmap, int(m), int(k), packed, scales, row_gs, int(n), y, y_f32, ldy, accumulate);
  check_launch("nvfp4_gemm (wgmma)");
}

}  // namespace

// Called by nvfp4_gemm (kernels_w4a16.cu) after its checks, with the tile height it chose.
void nvfp4_gemm_wgmma(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs,
                      int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, int bm, cudaStream_t s) {
  switch (bm) {
    case 256: launch<256>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
    case 128: launch<128>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
    default: launch<64>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
  }
}

}  // namespace clefrt::cuda

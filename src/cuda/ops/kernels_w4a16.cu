// The NVFP4 W4A16 GEMM (kernels_quant.h nvfp4_gemm): y (+)= x W^T with W packed (4.5 bits a
// weight) in global memory and dequantized per tile in shared memory, then bf16 tensor cores.
//
// Per CTA a 128-column (output channel) x BM-row (token) tile, BM = 64, 128 (256 threads) or 256
// (512 threads); per 64-wide k step:
//   1. cp.async brings x's [BM, 64] bf16 tile and W's [128, 32] packed bytes + [128, 4] e4m3
//      scales, several steps ahead of the math (global latency under the MMAs);
//   2. each thread dequantizes one or two (row, 16-weight block)s of the NEXT step into one of
//      two bf16 tiles: the block's 8 magnitudes bf16(code_value * (e4m3(scale) / gs_row)) are
//      computed as spec/quant.md says, then looked up four codes at a time with byte permutes
//      (exactly nvfp4_dequant_k's values, tested bit for bit), interleaved with
//   3. the MMAs of this step: warps 4 across (32 channels each) x THREADS/128 down, mma.sync
//      m16n8k16 on ldmatrix fragments.
// Shared tiles keep 128-byte rows (64 bf16) with the 16-byte chunks XOR-swizzled by row % 8, so
// the 8 rows an ldmatrix phase reads sit in distinct banks.
//
// Measured (H200, 27B shapes, bench/results/2026-12-01-h200-clef-27b-quant.md, session 5): ~295
// TFLOP/s on the 8,192-token gate_up, ~175 at the blog's 318 tokens, against 400-700 for
// cuBLASLt's bf16 GEMMs behind the staged path (qlinear.h). History: a first version (dequantize,
// barrier, multiply; the direct float formula, ~5.5 instructions a weight) ran ~200 TFLOP/s and
// Nsight Compute found it issue-bound (IPC 2.27 of 4, ~600 instructions per warp per k step for
// 64 MMAs); overlapping the dequantization with the MMAs gained nothing, hoisting copy addresses
// 7%, the byte-permute lookups (~3.3 instructions a weight) with 256-row tiles another 17-20%.
// On Hopper nvfp4_gemm now runs kernels_w4a16_wgmma.cu instead (1.4-1.8x this kernel at m >=
// 318); this one serves other GPUs (and is tested beside it).
//
// Every output element is one thread's fp32 sum over k in increasing 16-wide steps, whatever m
// is and whichever BM is chosen: a row's result does not depend on the batch it runs in.
#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/mma.cuh"
#include "cuda/ops/nvfp4_dequant.cuh"

namespace clefrt::cuda {

namespace {

constexpr int BN = 128, BK = 64;

// A CTA of THREADS threads computes BM tokens x 128 channels; warps 4 across the channels (32
// each) and THREADS / 128 down the tokens.
template <int BM, int THREADS>
struct W4Cfg {
  static constexpr int WARPS_N = 4, WARPS_M = THREADS / 32 / WARPS_N;
  static constexpr int WM = BM / WARPS_M, MI = WM / 16;
  // copy stages in flight: two 256-thread CTAs, or one 512-thread CTA, per SM's 228 KB
  static constexpr int STAGES = BM == 128 ? 3 : 4;
  static constexpr int MIN_BLOCKS = THREADS == 512 ? 1 : 2;
  static constexpr int a_bytes = BM * BK * 2;    // x tile, bf16
  static constexpr int wp_bytes = BN * BK / 2;   // packed codes
  static constexpr int ws_bytes = BN * BK / 16;  // e4m3 scales
  static constexpr int stage = a_bytes + wp_bytes + ws_bytes;
  static constexpr int wb_bytes = BN * BK * 2;  // a dequantized tile (two: this step's, the next's)
  static constexpr int bytes = STAGES * stage + 2 * wb_bytes;
  static constexpr int A_CH = BM * 8 / THREADS;          // 16-byte x copies per thread and step
  static constexpr int WP_CH = wp_bytes / 16;            // 16-byte packed copies per step
  static constexpr int UNITS = BN * (BK / 16) / THREADS;  // (row, 16-weight block)s per thread and step
  static_assert(A_CH >= 1 && UNITS >= 1 && WP_CH <= THREADS && MI >= 1, "tile shape");
};

template <int BM, int THREADS>
__global__ void __launch_bounds__(THREADS, W4Cfg<BM, THREADS>::MIN_BLOCKS)
    nvfp4_gemm_k(const bf16* __restrict__ x, int m, int k, int64_t ldx, const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                 const float* __restrict__ row_gs, int n, void* y, bool y_f32, int64_t ldy, bool accumulate) {
  using C = W4Cfg<BM, THREADS>;
  constexpr int STAGES = C::STAGES, WM = C::WM, MI = C::MI, A_CH = C::A_CH, UNITS = C::UNITS;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const wbuf = smem + STAGES * C::stage;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;
  const int m0 = int(blockIdx.y) * BM, n0 = int(blockIdx.x) * BN;
  const int ktiles = k / BK;
  const int64_t prow = k / 2, srow = k / 16;

  // This thread's copies, addresses fixed but for k: A_CH chunks of x rows, one 16-byte chunk of
  // packed codes (threads < WP_CH), one 4-byte word of scales (threads < BN). Rows past m or n
  // read nothing and zero-fill (zero codes and zero scales dequantize to 0).
  // x: rows ar + i * (THREADS / 8), 16-byte chunk ac; the row step is a multiple of 8, so the
  // swizzle (row % 8) is the same for every i
  constexpr int AROWS = THREADS / 8;
  const int ar = tid >> 3, ac = tid & 7, aoff = swizzle128(ar, ac);
  const bf16* xsrc = x + int64_t(m0 + ar) * ldx + ac * 8;
  const bool wthr = tid < C::WP_CH, win = wthr && n0 + (tid >> 1) < n, sin = tid < BN && n0 + tid < n;
  const uint8_t* wsrc = win ? packed + int64_t(n0 + (tid >> 1)) * prow + (tid & 1) * 16 : packed;
  const uint8_t* ssrc = sin ? scales + int64_t(n0 + tid) * srow : scales;
  auto load_stage = [&](int kt) {
    unsigned char* a = smem + (kt % STAGES) * C::stage;
    const int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < A_CH; ++i) {
      const bool in = m0 + ar + i * AROWS < m;
      cp_async16(a + aoff + i * AROWS * 128, in ? xsrc + int64_t(i * AROWS) * ldx + k0 : x, in);
    }
    if (wthr) cp_async16(a + C::a_bytes + tid * 16, win ? wsrc + k0 / 2 : packed, win);
    if (tid < BN) cp_async4(a + C::a_bytes + C::wp_bytes + tid * 4, sin ? ssrc + k0 / 16 : scales, sin);
  };

  // This thread's dequantization units: rows ur0 + i * (THREADS / 4), 16-weight block ub (8
  // packed bytes and one scale each).
  constexpr int UROWS = THREADS / 4;
  const int ur0 = tid >> 2, ub = tid & 3;
  float ugs[UNITS];
#pragma unroll
  for (int i = 0; i < UNITS; ++i) ugs[i] = n0 + ur0 + i * UROWS < n ? row_gs[n0 + ur0 + i * UROWS] : 1.0f;
  uint2 pk[UNITS];
  float us[UNITS];
  auto fetch = [&](int kt) {  // tile kt's codes and scales of this thread's units, into registers
    const unsigned char* st = smem + (kt % STAGES) * C::stage + C::a_bytes;
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
      const int r = ur0 + i * UROWS;
      pk[i] = *reinterpret_cast<const uint2*>(st + r * 32 + ub * 8);
      us[i] = __fdiv_rn(e4m3_value(st[C::wp_bytes + r * 4 + ub]), ugs[i]);
    }
  };
  auto dequant = [&](int i, unsigned char* wb) {
    const Table t = make_table(us[i]);
    uint32_t o[8];
    dequant_word(pk[i].x, t, o);
    dequant_word(pk[i].y, t, o + 4);
    const int r = ur0 + i * UROWS;
    *reinterpret_cast<uint4*>(wb + swizzle128(r, ub * 2)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(wb + swizzle128(r, ub * 2 + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s);
    cp_async_commit();
  }
  // tile 0's weights before the loop
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  fetch(0);
#pragma unroll
  for (int i = 0; i < UNITS; ++i) dequant(i, wbuf);

  float acc[MI][4][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  for (int kt = 0; kt < ktiles; ++kt) {
    // tile kt + 1's copies are done (tile kt's were); after the barrier every thread's are
    // visible, the dequantized tile kt is complete, and tile kt - 1's stage and dequantized
    // buffer are free
    cp_async_wait<STAGES - 3>();
    __syncthreads();
    if (kt + STAGES - 1 < ktiles) load_stage(kt + STAGES - 1);
    cp_async_commit();
    const bool next = kt + 1 < ktiles;
    if (next) fetch(kt + 1);

    const unsigned char* a = smem + (kt % STAGES) * C::stage;
    const unsigned char* wb = wbuf + (kt & 1) * C::wb_bytes;
    unsigned char* wb_next = wbuf + ((kt + 1) & 1) * C::wb_bytes;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int r = wm * WM + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], a + swizzle128(r, kk * 2 + (lane >> 4)));
      }
      uint32_t bfr[2][4];
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int r = wn * 32 + pr * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(bfr[pr], wb + swizzle128(r, kk * 2 + ((lane >> 3) & 1)));
      }
      // the next tile's units, spread over this step's MMAs
      if (next && kk % (4 / UNITS) == 0) dequant(kk / (4 / UNITS), wb_next);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          mma_bf16(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[ni >> 1][(ni & 1) * 2], bfr[ni >> 1][(ni & 1) * 2 + 1]);
    }
  }
  cp_async_wait_all();

#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + wm * WM + mi * 16 + (lane >> 2) + h * 8;
        if (r >= m) continue;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = n0 + wn * 32 + ni * 8 + (lane & 3) * 2 + c;
          if (col >= n) continue;
          store_output(y, y_f32, ldy, accumulate, r, col, acc[mi][ni][h * 2 + c]);
        }
      }
}

template <int BM, int THREADS>
void launch(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
            void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s) {
  using C = W4Cfg<BM, THREADS>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(nvfp4_gemm_k<BM, THREADS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "nvfp4_gemm");
    // all of L1 as shared memory, so that the CTAs fit
    check(cudaFuncSetAttribute(nvfp4_gemm_k<BM, THREADS>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared)),
          "nvfp4_gemm");
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  nvfp4_gemm_k<BM, THREADS><<<grid, THREADS, C::bytes, s>>>(x, int(m), int(k), ldx, packed, scales, row_gs, int(n), y, y_f32, ldy,
                                                              accumulate);
  check_launch("nvfp4_gemm");
}

}  // namespace

bool nvfp4_gemm_supports(int64_t k, int64_t ldx) { return k > 0 && k % BK == 0 && ldx % 8 == 0; }

bool nvfp4_gemm_wgmma_available() { return sm90a_kernels_run_here(); }

static bool use_wgmma(W4A16Gemm which) {
  if (which == W4A16Gemm::MmaSync) return false;
  if (which == W4A16Gemm::Wgmma && !nvfp4_gemm_wgmma_available())
    throw Error(Status::Internal, "internal_error", "nvfp4_gemm: the wgmma kernel needs an sm_90a build on a compute capability 9.0 GPU");
  return nvfp4_gemm_wgmma_available();
}

int nvfp4_gemm_tile_rows(int64_t m, int64_t n, W4A16Gemm which) {
  // Taller tiles spend less dequantization and fewer copies per multiply-add (a weight tile is
  // dequantized once per CTA) but pad m more and make fewer CTAs: pick the least padded rows x
  // an overhead guess among tiles that still give every SM a CTA. Any choice gives the same bits.
  const int64_t nt = (n + BN - 1) / BN;
  const bool wg = use_wgmma(which);
  int pick = 64;
  double best = 1e300;
  for (auto [bm, f] : {std::pair{256, 1.0}, {128, wg ? 1.15 : 1.25}, {64, wg ? 1.5 : 1.6}}) {
    const int64_t tiles = (m + bm - 1) / bm;
    if (bm != 64 && tiles * nt < sm_count()) continue;
    const double cost = double(tiles * bm) * f;
    if (cost < best) best = cost, pick = bm;
  }
  return pick;
}

void nvfp4_gemm(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
                void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s, W4A16Gemm which) {
  if (m == 0 || n == 0) return;
  const auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (!nvfp4_gemm_supports(k, ldx) || misaligned(x, 16) || misaligned(packed, 16) || misaligned(scales, 4) || m > INT32_MAX ||
      n > INT32_MAX || (accumulate && !y_f32))
    throw Error(Status::Internal, "internal_error",
                "nvfp4_gemm: unsupported operands (k " + std::to_string(k) + " must be a multiple of 64, x rows 16-byte aligned, " +
                    "accumulation into fp32 only)");
  const int bm = nvfp4_gemm_tile_rows(m, n, which);
  if (use_wgmma(which)) return nvfp4_gemm_wgmma(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, bm, s);
  switch (bm) {
    case 256: launch<256, 512>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
    case 128: launch<128, 256>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
    default: launch<64, 256>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s); break;
  }
}

}  // namespace clefrt::cuda

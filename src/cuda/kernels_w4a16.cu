// The NVFP4 W4A16 GEMM (kernels_quant.h nvfp4_gemm): y (+)= x W^T with W packed (4.5 bits a
// weight) in global memory and dequantized per tile in shared memory, then bf16 tensor cores.
//
// Per CTA a 128-column (output channel) x BM-row (token) tile; per 64-wide k step:
//   1. cp.async brings x's [BM, 64] bf16 tile and W's [128, 32] packed bytes + [128, 4] e4m3
//      scales, several steps ahead of the math (global latency under the MMAs);
//   2. each of the 256 threads dequantizes 32 weights of the NEXT step (one row, half the step)
//      into one of two bf16 tiles, W = bf16(code * (e4m3(scale) / gs_row)) exactly as
//      spec/quant.md and nvfp4_dequant_k, interleaved with
//   3. the MMAs of this step: 8 warps (2 x 4, warp tile BM/2 x 32), mma.sync m16n8k16 on
//      ldmatrix fragments. The ALU work of 2. issues between the tensor-core work of 3 (a first
//      version that dequantized, synchronized, then multiplied ran at ~200 TFLOP/s).
// Shared tiles keep 128-byte rows (64 bf16) with the 16-byte chunks XOR-swizzled by row % 8, so
// the 8 rows an ldmatrix phase reads sit in distinct banks.
//
// Measured (H200, 27B shapes, bench/results/2026-12-01-h200-clef-27b-quant.md, session 5): ~200
// TFLOP/s at 8,192 tokens, 130-165 at the blog's 318, against cuBLASLt's bf16 400-700: slower
// than the staged path (qlinear.h) everywhere but the blog's down projection, so not the default.
// Nsight Compute (gdn in_proj, 8,192 x 16,384 x 5,120): issue-bound, IPC 2.27 of 4, 25% occupancy
// (registers and shared memory), ~600 instructions per warp per k step for its 64 MMAs: the
// dequantization (~5.5 instructions a weight, 32 weights a thread a step), copies and address
// math. What would close the gap: a cheaper dequantization (byte-permute lookups), 256-row tiles
// (half the dequantization per MMA), or wgmma with the dequantized tile as its B operand.
//
// Every output element is one thread's fp32 sum over k in increasing 16-wide steps, whatever m
// is and whichever BM is chosen: a row's result does not depend on the batch it runs in.
#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/async_copy.cuh"
#include "cuda/check.h"
#include "cuda/formats.cuh"
#include "cuda/kernels_quant.h"
#include "cuda/mma.cuh"

namespace clefrt::cuda {

namespace {

constexpr int BN = 128, BK = 64, THREADS = 256;

template <int BM>
struct W4Smem {
  // copy stages in flight: two CTAs of either size fit an SM's 228 KB
  static constexpr int STAGES = BM == 128 ? 3 : 4;
  static constexpr int a_bytes = BM * BK * 2;    // x tile, bf16
  static constexpr int wp_bytes = BN * BK / 2;   // packed codes
  static constexpr int ws_bytes = BN * BK / 16;  // e4m3 scales
  static constexpr int stage = a_bytes + wp_bytes + ws_bytes;
  static constexpr int wb_bytes = BN * BK * 2;  // a dequantized tile (two: this step's, the next's)
  static constexpr int bytes = STAGES * stage + 2 * wb_bytes;
};

// byte offset of 16-byte chunk c of row r in a tile of 128-byte rows
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

template <int S>
__device__ __forceinline__ uint32_t shl(uint32_t w) {
  if constexpr (S >= 0) return w << S;
  else return w >> (-S);
}

// Byte B of w (codes k = 2B in the low nibble, 2B + 1 in the high one) as a bf16 pair, for
// scales below 4. A code's bits placed as a float's (magnitude bits 0-2 at 22-24, sign at 31)
// make the float code_value x 2^-126 (exponent field e, mantissa m: 2^(e-127)(1 + m/2), and the
// subnormal m x 2^-127 for e = 0), so x (s32 x 2^126) is the same real product as
// code_value x s32 and rounds to the same float; s32 x 2^126 is exact and finite for s32 < 4.
template <int B>
__device__ __forceinline__ uint32_t pair_fast(uint32_t w, float sp) {
  const float lo = __uint_as_float((shl<22 - 8 * B>(w) & 0x01C00000u) | (shl<28 - 8 * B>(w) & 0x80000000u));
  const float hi = __uint_as_float((shl<18 - 8 * B>(w) & 0x01C00000u) | (shl<24 - 8 * B>(w) & 0x80000000u));
  return pack_bf16(__fmul_rn(lo, sp), __fmul_rn(hi, sp));
}

// 8 codes (one packed word) sharing the scale s32 -> 4 bf16 pairs in k order.
__device__ __forceinline__ void dequant_word(uint32_t w, float s32, uint32_t* out) {
  if (s32 < 4.0f) {
    const float sp = __fmul_rn(s32, __uint_as_float(0x7E800000u));  // 2^126
    out[0] = pair_fast<0>(w, sp);
    out[1] = pair_fast<1>(w, sp);
    out[2] = pair_fast<2>(w, sp);
    out[3] = pair_fast<3>(w, sp);
  } else {  // huge weights (|W| > ~24 in the block): the direct formula
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (w >> (8 * b)) & 0xff;
      out[b] = pack_bf16(__fmul_rn(e2m1_value(byte & 15), s32), __fmul_rn(e2m1_value(byte >> 4), s32));
    }
  }
}

template <int BM>
__global__ void __launch_bounds__(THREADS, 2)
    nvfp4_gemm_k(const bf16* __restrict__ x, int m, int k, int64_t ldx, const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                 const float* __restrict__ row_gs, int n, void* y, bool y_f32, int64_t ldy, bool accumulate) {
  using S = W4Smem<BM>;
  constexpr int WM = BM / 2, MI = WM / 16, STAGES = S::STAGES;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const wbuf = smem + STAGES * S::stage;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int m0 = int(blockIdx.y) * BM, n0 = int(blockIdx.x) * BN;
  const int ktiles = k / BK;
  const int64_t prow = k / 2, srow = k / 16;

  // This thread's copies, addresses fixed but for k: A_CH chunks of x rows, one 16-byte chunk of
  // packed codes, and (threads < BN) one 4-byte word of scales. Rows past m or n read nothing
  // and zero-fill (zero codes and zero scales dequantize to 0).
  constexpr int A_CH = BM * 8 / THREADS;
  const bf16* xsrc[A_CH];
  int aoff[A_CH];
  bool ain[A_CH];
#pragma unroll
  for (int i = 0; i < A_CH; ++i) {
    const int e = tid + i * THREADS, r = e >> 3, c = e & 7;
    ain[i] = m0 + r < m;
    xsrc[i] = ain[i] ? x + int64_t(m0 + r) * ldx + c * 8 : x;
    aoff[i] = swz(r, c);
  }
  const bool win = n0 + (tid >> 1) < n, sin = tid < BN && n0 + tid < n;
  const uint8_t* wsrc = win ? packed + int64_t(n0 + (tid >> 1)) * prow + (tid & 1) * 16 : packed;
  const uint8_t* ssrc = sin ? scales + int64_t(n0 + tid) * srow : scales;
  auto load_stage = [&](int kt) {
    unsigned char* a = smem + (kt % STAGES) * S::stage;
    const int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < A_CH; ++i) cp_async16(a + aoff[i], ain[i] ? xsrc[i] + k0 : x, ain[i]);
    cp_async16(a + S::a_bytes + tid * 16, win ? wsrc + k0 / 2 : packed, win);
    if (tid < BN) cp_async4(a + S::a_bytes + S::wp_bytes + tid * 4, sin ? ssrc + k0 / 16 : scales, sin);
  };

  // this thread's share of the dequantization: row dr of the tile, k half dh (two scale blocks)
  const int dr = tid >> 1, dh = tid & 1;
  const float gs = n0 + dr < n ? row_gs[n0 + dr] : 1.0f;
  // the packed word w (0-3: k dh*32 + 8w .. +7) of tile kt and its scale
  uint4 pk;
  float s0 = 0, s1 = 0;
  auto fetch = [&](int kt) {
    const unsigned char* st = smem + (kt % STAGES) * S::stage + S::a_bytes;
    pk = *reinterpret_cast<const uint4*>(st + dr * 32 + dh * 16);
    const unsigned char* sc = st + S::wp_bytes + dr * 4 + dh * 2;
    s0 = __fdiv_rn(e4m3_value(sc[0]), gs);
    s1 = __fdiv_rn(e4m3_value(sc[1]), gs);
  };
  auto dequant = [&](int w, unsigned char* wb) {
    uint32_t o[4];
    dequant_word(w == 0 ? pk.x : w == 1 ? pk.y : w == 2 ? pk.z : pk.w, w < 2 ? s0 : s1, o);
    *reinterpret_cast<uint4*>(wb + swz(dr, dh * 4 + w)) = make_uint4(o[0], o[1], o[2], o[3]);
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
  for (int w = 0; w < 4; ++w) dequant(w, wbuf);

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

    const unsigned char* a = smem + (kt % STAGES) * S::stage;
    const unsigned char* wb = wbuf + (kt & 1) * S::wb_bytes;
    unsigned char* wn_buf = wbuf + ((kt + 1) & 1) * S::wb_bytes;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int r = wm * WM + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], a + swz(r, kk * 2 + (lane >> 4)));
      }
      uint32_t bfr[2][4];
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int r = wn * 32 + pr * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(bfr[pr], wb + swz(r, kk * 2 + ((lane >> 3) & 1)));
      }
      if (next) dequant(kk, wn_buf);  // the next tile's word kk, between this step's MMAs
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
          const float v = acc[mi][ni][h * 2 + c];
          if (y_f32) {
            float* d = static_cast<float*>(y) + int64_t(r) * ldy + col;
            *d = accumulate ? *d + v : v;
          } else {
            static_cast<bf16*>(y)[int64_t(r) * ldy + col] = __float2bfloat16_rn(v);
          }
        }
      }
}

template <int BM>
void launch(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
            void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s) {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(nvfp4_gemm_k<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, W4Smem<BM>::bytes), "nvfp4_gemm");
    // all of L1 as shared memory, so that two CTAs fit an SM
    check(cudaFuncSetAttribute(nvfp4_gemm_k<BM>, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
          "nvfp4_gemm");
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  nvfp4_gemm_k<BM><<<grid, THREADS, W4Smem<BM>::bytes, s>>>(x, int(m), int(k), ldx, packed, scales, row_gs, int(n), y, y_f32, ldy,
                                                             accumulate);
  check_launch("nvfp4_gemm");
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    check(cudaGetDevice(&dev), "nvfp4_gemm");
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev), "nvfp4_gemm");
    return v;
  }();
  return n;
}

}  // namespace

bool nvfp4_gemm_supports(int64_t k, int64_t ldx) { return k > 0 && k % BK == 0 && ldx % 8 == 0; }

void nvfp4_gemm(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
                void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  const auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (!nvfp4_gemm_supports(k, ldx) || misaligned(x, 16) || misaligned(packed, 16) || misaligned(scales, 4) || m > INT32_MAX ||
      n > INT32_MAX || (accumulate && !y_f32))
    throw Error(Status::Internal, "internal_error",
                "nvfp4_gemm: unsupported operands (k " + std::to_string(k) + " must be a multiple of 64, x rows 16-byte aligned, " +
                    "accumulation into fp32 only)");
  // 128-row tiles (half the dequantization per multiply-add of 64-row ones) unless they leave
  // most SMs idle. Either gives the same bits (header comment).
  if (m > 64 && (m + 127) / 128 * ((n + BN - 1) / BN) >= sm_count())
    launch<128>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s);
  else
    launch<64>(x, m, k, ldx, packed, scales, row_gs, n, y, y_f32, ldy, accumulate, s);
}

}  // namespace clefrt::cuda

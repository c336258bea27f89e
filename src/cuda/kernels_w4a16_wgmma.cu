// The NVFP4 W4A16 GEMM on Hopper's warpgroup MMA (sm_90a; kernels_quant.h nvfp4_gemm picks it
// on compute capability 9.0): y (+)= x W^T with W packed (4.5 bits a weight) in global memory,
// dequantized per tile into shared memory, and multiplied by wgmma with both operands read from
// shared memory (wgmma.cuh's 128-byte swizzled layout).
//
// Per CTA a BM-token x 128-channel tile and three warpgroups with separate jobs (warp
// specialization), handing pipeline stages over through mbarriers:
//   producers (warpgroups 0 and 1): per 64-wide k step j, cp.async brings x's [BM, 64] bf16 tile (straight
//     into wgmma's swizzled A layout) and W's [128, 32] packed bytes + [128, 4] e4m3 scales two
//     steps ahead; it dequantizes step j's weights into the stage's bf16 tile (nvfp4_dequant.cuh:
//     a byte-permute table per block, exactly nvfp4_dequantize's values) and marks the stage full;
//   consumers (warpgroups 2 and 3): wait for stage j, issue its wgmmas (asynchronous), wait for
//     step j - 1's and mark that stage empty, so the tensor cores always have the next step queued.
// The tensor cores never wait for a barrier of the whole CTA, and the consumers' issue slots go to
// the wgmmas alone (mma.sync, kernels_w4a16.cu, spends most of its on ldmatrix and one MMA per
// 16x8x16; a first wgmma version with every thread doing both jobs ran ~55% of cuBLASLt's bf16).
//
// Tiles: BM = 256 (each consumer 128 tokens x 128 channels: two m64n128 per k16), 128 (64 x 128
// each) or 64 (each consumer 64 tokens x 64 channels, m64n64). Every output element is the tensor
// cores' fp32 sum over k in increasing 16-wide steps whatever m and the tile are (the per-element
// result of wgmma does not depend on the instruction's N: tested bit for bit across tile
// heights), so a row's result does not depend on the batch it runs in.
#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/async_copy.cuh"
#include "cuda/check.h"
#include "cuda/formats.cuh"
#include "cuda/kernels_quant.h"
#include "cuda/mbarrier.cuh"
#include "cuda/nvfp4_dequant.cuh"
#include "cuda/wgmma.cuh"

namespace clefrt::cuda {

namespace {

// 4 warpgroups: 2 producers, 2 consumers. Registers move from the producers (which need few) to
// the consumers (the 256-token tile's 128 fp32 accumulators a thread) with setmaxnreg.
constexpr int BN = 128, BK = 64, THREADS = 512, PRODUCERS = 256, PRODUCER_REGS = 80, CONSUMER_REGS = 176;
static_assert(PRODUCER_REGS * PRODUCERS + CONSUMER_REGS * (THREADS - PRODUCERS) <= 65536, "register file");

template <int BM>
struct WgCfg {
  // consumer warpgroups along the tokens (2) or, for the 64-token tile, along the channels
  static constexpr int WG_M = BM >= 128 ? 2 : 1, WG_N = 2 / WG_M;
  static constexpr int WM = BM / WG_M, MB = WM / 64;  // tokens per consumer, m64 blocks
  static constexpr int WN = BN / WG_N;                // channels per consumer = wgmma N
  static constexpr int STAGES = 4, AHEAD = 2;  // copies run AHEAD steps before the dequantization
  static constexpr int a_bytes = BM * BK * 2;   // x tile, bf16, swizzled
  static constexpr int d_bytes = BN * BK * 2;   // dequantized tile, bf16, swizzled
  static constexpr int wp_bytes = BN * BK / 2;  // packed codes, [128][32] bytes
  static constexpr int ws_bytes = BN * BK / 16; // e4m3 scales, [128][4]
  static constexpr int a_base = 0, d_base = STAGES * a_bytes;  // swizzled tiles stay 1024-aligned
  static constexpr int w_base = d_base + STAGES * d_bytes;
  static constexpr int bar_base = w_base + STAGES * (wp_bytes + ws_bytes);
  static constexpr int bytes = bar_base + 2 * STAGES * 8 + 1024;  // + alignment slack
  static constexpr int A_CH = BM * 8 / PRODUCERS;                 // 16-byte x copies per producer and step
  static constexpr int UNITS = BN * (BK / 16) / PRODUCERS;        // (channel, block)s per producer and step
  static_assert(MB >= 1 && A_CH >= 1 && UNITS == 2 && AHEAD <= STAGES - 2, "tile shape");
  static_assert(bytes + 1024 <= 233472, "shared memory per SM");
};

__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(PRODUCERS) : "memory"); }
// Gives up (dec) or claims (inc) registers for the rest of this warpgroup's run (sm_90a).
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef CLEFRT_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef CLEFRT_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

template <int BM>
__global__ void __launch_bounds__(THREADS, 1)
    nvfp4_gemm_wgmma_k(const bf16* __restrict__ x, int m, int k, int64_t ldx, const uint8_t* __restrict__ packed,
                       const uint8_t* __restrict__ scales, const float* __restrict__ row_gs, int n, void* y, bool y_f32, int64_t ldy,
                       bool accumulate) {
  using C = WgCfg<BM>;
  constexpr int STAGES = C::STAGES, AHEAD = C::AHEAD, MB = C::MB, WN = C::WN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle is computed from address bits: tiles must sit on 1024-byte boundaries
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::bar_base);  // stage j % 4 holds step j: ready
  uint64_t* const empty = full + STAGES;                                    // its wgmmas are done
  const int tid = int(threadIdx.x), wg = tid >> 7;
  const int m0 = int(blockIdx.y) * BM, n0 = int(blockIdx.x) * BN;
  const int ktiles = k / BK;
  auto xtile = [&](int j) { return smem + C::a_base + (j % STAGES) * C::a_bytes; };
  auto dtile = [&](int j) { return smem + C::d_base + (j % STAGES) * C::d_bytes; };
  auto wtile = [&](int j) { return smem + C::w_base + (j % STAGES) * (C::wp_bytes + C::ws_bytes); };
  if (tid == 0)
    for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], PRODUCERS), mbar_init(&empty[s], THREADS - PRODUCERS);
  __syncthreads();

  if (wg < 2) {
    // ---- producers ----
    setmaxnreg_dec<PRODUCER_REGS>();
    const int p = tid;
    const int64_t prow = k / 2, srow = k / 16;
    // x copies: chunk e = p + i * 128 is row e / 8, 16-byte k chunk e % 8 (8 lanes: one row's 128
    // bytes, conflict-free under the swizzle). Rows past m zero-fill.
    const bf16* xsrc[C::A_CH];
    int aoff[C::A_CH];
    bool ain[C::A_CH];
#pragma unroll
    for (int i = 0; i < C::A_CH; ++i) {
      const int e = p + i * PRODUCERS, r = e >> 3, c = e & 7;
      aoff[i] = swizzle128(r, c);
      ain[i] = m0 + r < m;
      xsrc[i] = ain[i] ? x + int64_t(m0 + r) * ldx + c * 8 : x;
    }
    // packed codes: 16-byte chunk p (channel p / 2, half p % 2); scales: 4 bytes of channel p
    // (p < 128). Channels past n read nothing: zero codes and scales give 0.
    const bool win = n0 + (p >> 1) < n, sin = p < BN && n0 + p < n;
    const uint8_t* wsrc = win ? packed + int64_t(n0 + (p >> 1)) * prow + (p & 1) * 16 : packed;
    const uint8_t* ssrc = sin ? scales + int64_t(n0 + p) * srow : scales;
    auto issue = [&](int j) {
      if (j < ktiles) {
        unsigned char* a = xtile(j);
        unsigned char* w = wtile(j);
        const int k0 = j * BK;
#pragma unroll
        for (int i = 0; i < C::A_CH; ++i) cp_async16(a + aoff[i], ain[i] ? xsrc[i] + k0 : x, ain[i]);
        cp_async16(w + p * 16, win ? wsrc + k0 / 2 : packed, win);
        if (p < BN) cp_async4(w + C::wp_bytes + p * 4, sin ? ssrc + k0 / 16 : scales, sin);
      }
      cp_async_commit();
    };
    // Dequantization units: u = p + i * 256 is channel u / 4, block u % 4 (8 lanes: two channels'
    // four blocks, whose swizzled 16-byte stores cover the 32 banks once).
    float ugs[C::UNITS], urc[C::UNITS];
#pragma unroll
    for (int i = 0; i < C::UNITS; ++i) {
      const int r = (p + i * PRODUCERS) >> 2;
      ugs[i] = n0 + r < n ? row_gs[n0 + r] : 1.0f;
      urc[i] = row_reciprocal(ugs[i]);
    }
    for (int j = 0; j < AHEAD; ++j) issue(j);
    for (int j = 0; j < ktiles; ++j) {
      // step j + AHEAD's stage was step j + AHEAD - 4's: wait until both consumers are done with it
      const int jn = j + AHEAD;
      if (jn < ktiles && jn >= STAGES) mbar_wait(&empty[jn % STAGES], uint32_t((jn / STAGES - 1) & 1));
      issue(jn);
      cp_async_wait<AHEAD>();  // this thread's copies of step j
      producer_sync();         // everyone's (the units read codes other threads copied)
      const unsigned char* st = wtile(j);
      unsigned char* d = dtile(j);
#pragma unroll
      for (int i = 0; i < C::UNITS; ++i) {
        const int u = p + i * PRODUCERS, r = u >> 2, b = u & 3;
        const uint2 pk = *reinterpret_cast<const uint2*>(st + r * 32 + b * 8);
        const Table t = make_table_shift(scale_quotient(e4m3_value(st[C::wp_bytes + r * 4 + b]), ugs[i], urc[i]));
        uint32_t o[8];
        dequant_word(pk.x, t, o);
        dequant_word(pk.y, t, o + 4);
        *reinterpret_cast<uint4*>(d + swizzle128(r, b * 2)) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(d + swizzle128(r, b * 2 + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
      }
      // this thread's x copies and dequantized stores, visible to the tensor cores of whoever
      // waits for the stage
      fence_proxy_async();
      mbar_arrive(&full[j % STAGES]);
    }
    cp_async_wait_all();
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 2, wm = C::WG_M == 2 ? cw : 0, wn = C::WG_M == 2 ? 0 : cw;
  // no zeroing: step 0's wgmmas overwrite (any other instruction writing the accumulators
  // between wgmmas makes ptxas serialize them all: C7515)
  float acc[MB][WN / 2];
  auto fence_accumulators = [&] {
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int j = 0; j < WN / 2; ++j) fence_operand(acc[b][j]);
  };
  for (int j = 0; j < ktiles; ++j) {
    mbar_wait(&full[j % STAGES], uint32_t((j / STAGES) & 1));
    const unsigned char* a = xtile(j) + wm * C::WM * 128;
    const unsigned char* wb = dtile(j) + wn * WN * 128;
    fence_accumulators();
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < BK / 16; ++s) {
      const uint64_t db = wgmma_desc(wb + s * 32);
#pragma unroll
      for (int b = 0; b < MB; ++b) wgmma_bf16<WN>(acc[b], wgmma_desc(a + b * 64 * 128 + s * 32), db, j > 0 || s > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // step j - 1's wgmmas; step j's stay in flight
    if (j > 0) mbar_arrive(&empty[(j - 1) % STAGES]);
  }
  wgmma_wait<0>();
  fence_accumulators();

  const int lane = tid & 31, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
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
          const float v = acc[b][j * 4 + h * 2 + c];
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
  using C = WgCfg<BM>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(nvfp4_gemm_wgmma_k<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "nvfp4_gemm (wgmma)");
    check(cudaFuncSetAttribute(nvfp4_gemm_wgmma_k<BM>, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
          "nvfp4_gemm (wgmma)");
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  nvfp4_gemm_wgmma_k<BM><<<grid, THREADS, C::bytes, s>>>(x, int(m), int(k), ldx, packed, scales, row_gs, int(n), y, y_f32, ldy, accumulate);
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

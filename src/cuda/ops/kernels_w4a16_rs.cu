// The NVFP4 W4A16 GEMM for short inputs (sm_90a; LinearRunner runs it where a pass has at most
// kRsMaxTokens tokens, kernels_quant.h nvfp4_gemm_rs): y^T = W x^T with the weights as wgmma's
// register operand, the winner of dev/cuda/w4a16_rs.cu (form 3).
//   - A = the weights, 64 channels a warpgroup, dequantized straight into the A fragment's
//     registers (rows g and g + 8 of the warp's 16, k 2t, 2t + 1, 2t + 8, 2t + 9): they never pass
//     through shared memory, and each is dequantized once per NT x TN tokens;
//   - B = x, NT boxes of [TN tokens, 64 k] per k step, brought by TMA (128-byte swizzle,
//     K-major), read by every warpgroup;
//   - the dequantization tables are not built in the loop (the lab's profile found that building
//     them was its hottest code): per distinct global scale gs, the 256 tables of the e4m3 scale
//     bytes are made once at load (nvfp4_rs_upload), each warpgroup copies the 2 sets its 64
//     rows use into shared memory, and a 16-weight block's table is then one 16-byte load
//     indexed by its scale byte. The same values as make_table_shift (nvfp4_dequant.cuh), so
//     exactly nvfp4_dequantize's weights.
// The codes are reordered once at load (nvfp4_rs_repack), so that a thread's 4 codes of each
// 16-block of a step (bytes t and t + 4 of the block's 8) are one 8-byte load: picking them out of
// the file's order with byte permutes in the loop measured 1.3-1.4x slower (s54 call 1). The
// staged path reads that order too (nvfp4_dequantize_rs).
//
// Every output element is the tensor cores' fp32 sum over k in increasing 16-wide steps, one
// wgmma after another, as in the bf16 GEMM that the staged path runs on the dequantized weights:
// whatever m and the tile, a row's result is the same (the GPU tests compare the bits).
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/gpu_flags.cuh"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/nvfp4_dequant.cuh"
#include "cuda/ops/tma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {

namespace {

constexpr int BK = 64, STAGES = 4;
constexpr int SET_BYTES = 256 * 16;  // one gs value's tables, by scale byte

// TW x NT x TN tokens and 64 WGS channels a CTA: WGS x TW warpgroups, warpgroup w taking the 64
// channels w % WGS and the NT token boxes of TN from (w / WGS) NT. TW 2 puts two warpgroups on
// the same channels (each dequantizes them itself): twice the warps an SM to hide the latency
// of a step's dequantization and wgmmas.
template <int TN, int WGS, int NT, int TW>
struct RsCfg {
  static constexpr int THREADS = 128 * WGS * TW, CH = 64 * WGS, TOKENS = TN * NT * TW;
  static constexpr int ACC = NT * TN / 2;                // accumulators a thread
  static constexpr int x_bytes = NT * TW * TN * BK * 2;  // NT TW x boxes [TN][64], 128-byte swizzle
  static constexpr int wp_bytes = CH * BK / 2;      // packed codes [CH][32]
  static constexpr int ws_bytes = CH * BK / 16;     // e4m3 scales [CH][4]
  static constexpr int sets_bytes = WGS * 2 * SET_BYTES;  // 2 table sets a warpgroup
  static constexpr int w_base = STAGES * x_bytes;   // x tiles stay 1024-aligned (TN % 8 == 0)
  static constexpr int t_base = w_base + STAGES * (wp_bytes + ws_bytes);
  static constexpr int bar_base = t_base + sets_bytes;
  static constexpr int bytes = bar_base + STAGES * 8 + 1024;  // + alignment slack
  static constexpr int FIT = 233472 / (bytes + 1024);  // CTAs an SM's shared memory holds
  static constexpr int MIN_BLOCKS = WGS * TW >= 2 ? 1 : FIT < 3 ? FIT : 3;
  static_assert(TN % 8 == 0 && TN <= 256, "token tile");
  static_assert(MIN_BLOCKS * (bytes + 1024) <= 233472, "shared memory per SM");
};

// A CTA's work (stream-K at whole k steps): units [u0, u1) of the sequence (tile 0 steps 0..K-1,
// tile 1 ...) with u0 = units c / G, run in this order:
//   head: the last tile's steps [0, hk) when the range ends inside it; its partial sums are
//         published for the next CTA (first, so that it waits least);
//   full tiles f0..f0 + nfull - 1;
//   tail: the first tile's steps [tk, K) when the range starts inside it, from the partial sums
//         the previous CTA published: the same fp32 sums in the same order as one CTA's.
// G <= tiles makes every CTA's share at least K steps: a tile spans at most 2 CTAs. G = tiles: a
// CTA a tile.
struct RsSchedule {
  int K, tf, tl, tk, hk, f0, nfull;
  __device__ RsSchedule(int64_t units, int G, int c, int K_) : K(K_) {
    const int64_t u0 = units * c / G, u1 = units * (c + 1) / G;
    tf = int(u0 / K), tl = int((u1 - 1) / K);
    tk = int(u0 - int64_t(tf) * K);
    const int end = int(u1 - int64_t(tl) * K);
    hk = end < K && !(tl == tf && tk > 0) ? end : 0;
    f0 = tf + (tk > 0);
    nfull = tl - (hk > 0) - f0 + 1;
    if (nfull < 0) nfull = 0;
  }
  enum Kind { HEAD, FULL, TAIL };
};

// tabs[v * 256 + b]: the table of scale byte b under gs[v]
__global__ void rs_tables_k(const float* __restrict__ gs, int values, uint4* __restrict__ tabs) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= values * 256) return;
  const float g = gs[i >> 8];
  const Table T = make_table_shift(scale_quotient(e4m3_value(uint8_t(i & 255)), g, row_reciprocal(g)));
  tabs[i] = make_uint4(T.lo0, T.lo1, T.hi0, T.hi1);
}

// packed [n][k / 2] (code 2j in byte j's low nibble) -> per row and 64-wide step (32 bytes), quad
// slot t's 8 bytes: for each of the step's 4 blocks, byte t and byte t + 4 of the block's 8 (its
// codes 2t, 2t + 1, 2t + 8, 2t + 9). In place: a thread a 32-byte unit.
__global__ void rs_repack_k(uint8_t* __restrict__ codes, int64_t units) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= units) return;
  uint4* const unit = reinterpret_cast<uint4*>(codes + i * 32);
  __align__(16) uint8_t in[32], out[32];
  reinterpret_cast<uint4*>(in)[0] = unit[0];
  reinterpret_cast<uint4*>(in)[1] = unit[1];
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      out[t * 8 + b * 2] = in[b * 8 + t];
      out[t * 8 + b * 2 + 1] = in[b * 8 + t + 4];
    }
  unit[0] = reinterpret_cast<const uint4*>(out)[0];
  unit[1] = reinterpret_cast<const uint4*>(out)[1];
}

// nvfp4_dequantize's values from the reordered codes, as nvfp4_dequantize runs them: a thread a
// 16-weight block (its 8 code bytes are 4 byte pairs of its row's 32-byte step), adjacent threads
// writing adjacent 32 bytes
__global__ void rs_dequant_k(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, const float* __restrict__ row_gs,
                             int64_t n, int64_t k, bf16* __restrict__ w) {
  const int64_t blocks_per_row = k / 16, total = n * blocks_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const float s32 = __fdiv_rn(e4m3_value(scales[i]), row_gs[i / blocks_per_row]);
    const uint8_t* const unit = codes + (i >> 2) * 32 + (i & 3) * 2;  // block i % 4 of its step
    __align__(16) bf16 out[16];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t pair = *reinterpret_cast<const uint16_t*>(unit + t * 8);  // the block's bytes t and t + 4
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t byte = (pair >> (8 * h)) & 0xffu, j = uint32_t(t + 4 * h);  // its codes 2 j, 2 j + 1
        out[2 * j] = __float2bfloat16_rn(__fmul_rn(e2m1_value(byte & 15), s32));
        out[2 * j + 1] = __float2bfloat16_rn(__fmul_rn(e2m1_value(byte >> 4), s32));
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(w + i * 16);
    dst[0] = reinterpret_cast<const uint4*>(out)[0];
    dst[1] = reinterpret_cast<const uint4*>(out)[1];
  }
}

template <int TN, int WGS, int NT, int TW>
__global__ void __launch_bounds__(RsCfg<TN, WGS, NT, TW>::THREADS, RsCfg<TN, WGS, NT, TW>::MIN_BLOCKS)
    nvfp4_gemm_rs_k(const __grid_constant__ CUtensorMap xmap, int m, int k, const uint8_t* __restrict__ packed,
                    const uint8_t* __restrict__ scales, const uint4* __restrict__ tabs, const int* __restrict__ group_sets,
                    const uint8_t* __restrict__ row_set, int n, void* y, bool y_f32, int64_t ldy, bool accumulate, int ctiles,
                    int64_t units, float* __restrict__ partial, int* __restrict__ flags) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Other architectures of a fat binary: never launched there (nvfp4_gemm_rs_available)
  __trap();
#else
  using C = RsCfg<TN, WGS, NT, TW>;
  constexpr int CH = C::CH, ACC = C::ACC;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle is computed from address bits: x tiles must sit on 1024-byte boundaries
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int wg = (tid >> 7) % WGS, box0 = (tid >> 7) / WGS * NT;  // this warpgroup's 64 channels and first token box
  const int cta = int(blockIdx.x), ktiles = k / BK;
  const RsSchedule sch(units, int(gridDim.x), cta, ktiles);
  auto xtile = [&](int j) { return smem + (j % STAGES) * C::x_bytes; };
  auto wtile = [&](int j) { return smem + C::w_base + (j % STAGES) * (C::wp_bytes + C::ws_bytes); };

  // xfull[s] completes when stage s's x boxes have landed (rows past m arrive as zeros)
  uint64_t* const xfull = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&xfull[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  const int ra = wg * 64 + warp * 16 + g;  // this thread's A rows: channels ra and ra + 8 of the CTA
  float acc[NT][TN / 2];
  uint32_t afr[2][4];

  // The CTA's segments in run order (RsSchedule): its head, its full tiles, its tail. Each runs
  // the lab's form 3 loop over its k steps; the stages and their mbarrier phases run on across
  // segments (step j of the CTA: stage j % STAGES), and a segment's first loads are issued once
  // the previous one's readers are done.
  const int nseg = (sch.hk > 0) + sch.nfull + (sch.tk > 0);
  int j0 = 0;  // the CTA's steps before this segment
  for (int sg = 0; sg < nseg; ++sg) {
    const int f = sg - (sch.hk > 0);
    const RsSchedule::Kind kind = sch.hk > 0 && sg == 0 ? RsSchedule::HEAD : f < sch.nfull ? RsSchedule::FULL : RsSchedule::TAIL;
    const int tile = kind == RsSchedule::HEAD ? sch.tl : kind == RsSchedule::FULL ? sch.f0 + f : sch.tf;
    const int k0 = kind == RsSchedule::TAIL ? sch.tk : 0, k1 = kind == RsSchedule::HEAD ? sch.hk : ktiles;
    const int n0 = (tile % ctiles) * CH, m0 = (tile / ctiles) * C::TOKENS;
    // every thread is done with the previous segment's stages and table sets (its wgmmas waited)
    __syncthreads();
    {  // the segment's table sets: warpgroup w's set s (0, 1) at t_base + (2 w + s) SET_BYTES
      uint4* const sets = reinterpret_cast<uint4*>(smem + C::t_base);
      const int groups = (n + 63) / 64;
      for (int i = tid; i < WGS * 2 * 256; i += C::THREADS) {
        const int grp = n0 / 64 + (i >> 9);
        sets[i] = grp < groups ? tabs[group_sets[2 * grp + ((i >> 8) & 1)] * 256 + (i & 255)] : make_uint4(0, 0, 0, 0);
      }
    }
    // 2 threads a channel (the first 2 CH threads) copy the codes and scales
    const Nvfp4StepCopy<CH, BK> copy_w(packed, scales, n0, n, k, tid < 2 * CH ? tid : 0);
    auto load_x = [&](int kt) {  // step kt's x boxes into stage (j0 + kt - k0) % STAGES
      if (tid != 0 || kt >= k1) return;
      const int st = (j0 + kt - k0) % STAGES;
      mbar_arrive_expect_tx(&xfull[st], C::x_bytes);
#pragma unroll
      for (int i = 0; i < NT * TW; ++i) tma_load_2d(smem + st * C::x_bytes + i * TN * BK * 2, &xmap, kt * BK, m0 + i * TN, &xfull[st]);
    };
    auto load_w = [&](int kt) {
      if (kt < k1 && tid < 2 * CH) copy_w(wtile(j0 + kt - k0), kt);
    };
    // the loads run ahead: x 2 steps, the weights 3
    load_w(k0), load_x(k0), load_w(k0 + 1);
    cp_async_commit();
    load_x(k0 + 1), load_w(k0 + 2);
    cp_async_commit();
    const unsigned char* const sets = smem + C::t_base;
    const unsigned char* const set0 = sets + (2 * wg + (n0 + ra < n ? row_set[n0 + ra] : 0)) * SET_BYTES;
    const unsigned char* const set1 = sets + (2 * wg + (n0 + ra + 8 < n ? row_set[n0 + ra + 8] : 0)) * SET_BYTES;
    if (kind == RsSchedule::TAIL) {  // the previous CTA's partial sums of this tile
      while (ld_acquire_gpu(&flags[cta - 1]) != 1) {
      }
      const float* src = partial + int64_t(cta - 1) * ACC * C::THREADS + tid;
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < TN / 2; ++e) acc[i][e] = __ldcg(src + (i * (TN / 2) + e) * C::THREADS);
    }

    for (int kt = k0; kt < k1; ++kt) {
      const int jj = j0 + kt - k0;
      // this thread's copies of weight step kt have landed; after the barrier every thread's (and
      // the table sets), and every warpgroup's wgmmas of step kt - 2 are done: x stage
      // (jj + 2) % 4 and weight stage (jj + 3) % 4 are free
      cp_async_wait<1>();
      __syncthreads();
      load_x(kt + 2), load_w(kt + 3);
      cp_async_commit();

      const unsigned char* wp = wtile(jj);
      const uint2 p0 = *reinterpret_cast<const uint2*>(wp + ra * 32 + t * 8);
      const uint2 p1 = *reinterpret_cast<const uint2*>(wp + (ra + 8) * 32 + t * 8);
      const uint32_t s0 = *reinterpret_cast<const uint32_t*>(wp + C::wp_bytes + ra * 4);
      const uint32_t s1 = *reinterpret_cast<const uint32_t*>(wp + C::wp_bytes + (ra + 8) * 4);
      mbar_wait(&xfull[jj % STAGES], uint32_t((jj / STAGES) & 1));
      const unsigned char* xt = xtile(jj);
#pragma unroll
      for (int s = 0; s < BK / 16; ++s) {
        const uint4 q0 = *reinterpret_cast<const uint4*>(set0 + ((s0 >> (8 * s)) & 0xffu) * 16);
        const uint4 q1 = *reinterpret_cast<const uint4*>(set1 + ((s1 >> (8 * s)) & 0xffu) * 16);
        uint32_t(&a)[4] = afr[s & 1];
        dequant_unit(s < 2 ? p0.x : p0.y, s & 1, Table{q0.x, q0.y, q0.z, q0.w}, a[0], a[2]);
        dequant_unit(s < 2 ? p1.x : p1.y, s & 1, Table{q1.x, q1.y, q1.z, q1.w}, a[1], a[3]);
        // the accumulators pinned in registers before the wgmmas (otherwise ptxas serializes them,
        // C7515 under -Xptxas -v)
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int e = 0; e < TN / 2; ++e) fence_operand(acc[i][e]);
        wgmma_fence();
        // a tail's steps all accumulate (kt > 0) onto the loaded partial sums
#pragma unroll
        for (int i = 0; i < NT; ++i) wgmma_bf16_rs<TN>(acc[i], a, wgmma_desc(xt + (box0 + i) * TN * BK * 2 + s * 32), kt > 0 || s > 0);
        wgmma_commit();
        wgmma_wait<1>();  // the A fragment of step s - 1 is free again
      }
    }
    j0 += k1 - k0;

    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < TN / 2; ++e) fence_operand(acc[i][e]);
    if (kind == RsSchedule::HEAD) {  // published for the next CTA, which continues the sums
      float* dst = partial + int64_t(cta) * ACC * C::THREADS + tid;
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < TN / 2; ++e) __stcg(dst + (i * (TN / 2) + e) * C::THREADS, acc[i][e]);
      __threadfence();
      __syncthreads();
      if (tid == 0) st_release_gpu(&flags[cta], 1);
    } else {
      // acc[i] is the 64-channel x TN-token D fragment: channels ra and ra + 8, tokens 8 e + 2 t + {0, 1}
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < TN / 8; ++e)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int tok = m0 + (box0 + i) * TN + e * 8 + t * 2 + c, ch = n0 + ra + h * 8;
              if (tok < m && ch < n) store_output(y, y_f32, ldy, accumulate, tok, ch, acc[i][e * 4 + h * 2 + c]);
            }
      // the previous CTA's flag back to 0 for the next launch (after every thread has seen it
      // set): launches on one stream reuse the flags without a host-side value that a CUDA
      // graph's replay would repeat
      if (kind == RsSchedule::TAIL) {
        __syncthreads();
        if (tid == 0) flags[cta - 1] = 0;
      }
    }
  }
  wgmma_wait<0>();  // (the last step's group ended with wait 0 already; ptxas wants it seen here)
  cp_async_wait_all();
#endif
}

// The kernel's shared memory and carveout, set once (before its first launch or occupancy query)
template <int TN, int WGS, int NT, int TW>
void configure() {
  static const bool configured = [] {
    using C = RsCfg<TN, WGS, NT, TW>;
    check(cudaFuncSetAttribute(nvfp4_gemm_rs_k<TN, WGS, NT, TW>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "nvfp4_gemm_rs");
    check(cudaFuncSetAttribute(nvfp4_gemm_rs_k<TN, WGS, NT, TW>, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
          "nvfp4_gemm_rs");
    return true;
  }();
  (void)configured;
}

// CTAs of this configuration an SM holds (the most a stream-K grid may have: every CTA resident)
template <int TN, int WGS, int NT, int TW>
int resident_per_sm() {
  static const int r = [] {
    configure<TN, WGS, NT, TW>();
    int b = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, nvfp4_gemm_rs_k<TN, WGS, NT, TW>, RsCfg<TN, WGS, NT, TW>::THREADS, RsCfg<TN, WGS, NT, TW>::bytes),
          "nvfp4_gemm_rs occupancy");
    if (b < 1) throw Error(Status::Internal, "internal_error", "nvfp4_gemm_rs: a CTA of this tile does not fit an SM");
    return b;
  }();
  return r;
}

// The grid of a stream-K launch (resident CTAs splitting the tiles' k steps), or 0 for a CTA a
// tile. per_sm < 0: every resident CTA, where a CTA a tile would leave the last wave's SMs idle
// for 5% or more of the time; per_sm > 0: that many CTAs an SM, where they are resident and no
// more than the tiles (a tile then spans at most 2 CTAs).
template <int TN, int WGS, int NT, int TW>
int64_t stream_k_grid(int64_t m, int64_t n, const Nvfp4RsWork* work, int per_sm) {
  using C = RsCfg<TN, WGS, NT, TW>;
  if (!work || !work->partial || per_sm == 0) return 0;
  const int64_t tiles = (n + C::CH - 1) / C::CH * ((m + C::TOKENS - 1) / C::TOKENS);
  const int64_t resident = std::min<int64_t>(int64_t(sm_count()) * resident_per_sm<TN, WGS, NT, TW>(), work->slots);
  int64_t G = 0;
  if (per_sm < 0) {
    const int64_t waves = (tiles + resident - 1) / resident;
    if (tiles > resident && double(waves * resident) >= 1.05 * double(tiles)) G = resident;
  } else if (per_sm <= resident_per_sm<TN, WGS, NT, TW>()) {
    G = std::min<int64_t>(int64_t(sm_count()) * per_sm, work->slots);
    if (G >= tiles) G = 0;
  }
  return G > 0 && size_t(G) * C::ACC * C::THREADS * 4 <= work->partial_bytes ? G : 0;
}

template <int TN, int WGS, int NT, int TW>
void launch(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const Nvfp4RsTables& tb,
            int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, Nvfp4RsWork* work, int per_sm, cudaStream_t s) {
  using C = RsCfg<TN, WGS, NT, TW>;
  configure<TN, WGS, NT, TW>();
  const CUtensorMap xmap = bf16_tensor_map_sw128(x, m, k, ldx, BK, TN, "nvfp4_gemm_rs");
  const int64_t ctiles = (n + C::CH - 1) / C::CH, tiles = ctiles * ((m + C::TOKENS - 1) / C::TOKENS);
  const int64_t units = tiles * (k / BK);
  int64_t G = stream_k_grid<TN, WGS, NT, TW>(m, n, work, per_sm);
  float* partial = nullptr;
  int* flags = nullptr;
  if (G > 0) {
    partial = work->partial;
    flags = work->flags;
    ++work->streamed;
  } else {
    G = tiles;
  }
  nvfp4_gemm_rs_k<TN, WGS, NT, TW><<<unsigned(G), C::THREADS, C::bytes, s>>>(xmap, int(m), int(k), packed, scales, static_cast<const uint4*>(tb.tabs),
                                                                            tb.group_sets, tb.row_set, int(n), y, y_f32, ldy, accumulate,
                                                                            int(ctiles), units, partial, flags);
  check_launch("nvfp4_gemm_rs");
}

}  // namespace

bool nvfp4_rs_plan(const float* row_gs, int64_t n, Nvfp4RsPlan& plan) {
  plan = Nvfp4RsPlan{};
  const int64_t groups = (n + 63) / 64;
  std::vector<int> value_of(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    size_t j = 0;  // bitwise: -0 and 0, or two NaNs, are different tables' keys
    while (j < plan.gs.size() && std::memcmp(&plan.gs[j], &row_gs[i], 4) != 0) ++j;
    if (j == plan.gs.size()) plan.gs.push_back(row_gs[i]);
    value_of[size_t(i)] = int(j);
  }
  plan.group_sets.assign(size_t(groups * 2), 0);
  plan.row_set.assign(size_t(n), 0);
  for (int64_t r = 0; r < groups; ++r) {
    const int a = value_of[size_t(r * 64)];
    int b = a;
    for (int64_t c = r * 64; c < std::min(n, r * 64 + 64); ++c) {
      const int v = value_of[size_t(c)];
      if (v != a && b == a) b = v;
      if (v != a && v != b) {
        plan = Nvfp4RsPlan{};
        return false;
      }
      plan.row_set[size_t(c)] = v == a ? 0 : 1;
    }
    plan.group_sets[size_t(2 * r)] = a, plan.group_sets[size_t(2 * r + 1)] = b;
  }
  return true;
}

size_t nvfp4_rs_bytes(const Nvfp4RsPlan& plan) {
  return plan.gs.size() * (size_t(SET_BYTES) + 4) + plan.group_sets.size() * 4 + plan.row_set.size();
}

Nvfp4RsTables nvfp4_rs_upload(const Nvfp4RsPlan& plan, void* mem, cudaStream_t s) {
  const size_t values = plan.gs.size();
  if (values == 0) return {};
  uint8_t* const base = static_cast<uint8_t*>(mem);
  float* const gs = reinterpret_cast<float*>(base + values * SET_BYTES);
  int* const group_sets = reinterpret_cast<int*>(gs + values);
  uint8_t* const row_set = reinterpret_cast<uint8_t*>(group_sets + plan.group_sets.size());
  check(cudaMemcpy(gs, plan.gs.data(), values * 4, cudaMemcpyHostToDevice), "nvfp4_rs_upload");
  check(cudaMemcpy(group_sets, plan.group_sets.data(), plan.group_sets.size() * 4, cudaMemcpyHostToDevice), "nvfp4_rs_upload");
  check(cudaMemcpy(row_set, plan.row_set.data(), plan.row_set.size(), cudaMemcpyHostToDevice), "nvfp4_rs_upload");
  rs_tables_k<<<unsigned((values * 256 + 255) / 256), 256, 0, s>>>(gs, int(values), reinterpret_cast<uint4*>(base));
  check_launch("nvfp4_rs_upload");
  return Nvfp4RsTables{base, group_sets, row_set};
}

bool nvfp4_gemm_rs_available() { return sm90a_kernels_run_here(); }

void nvfp4_rs_repack(uint8_t* packed, int64_t n, int64_t k, cudaStream_t s) {
  const int64_t units = n * k / 64;
  if (units == 0) return;
  rs_repack_k<<<unsigned((units + 255) / 256), 256, 0, s>>>(packed, units);
  check_launch("nvfp4_rs_repack");
}

void nvfp4_dequantize_rs(const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n, int64_t k, bf16* w, cudaStream_t s) {
  const int64_t blocks = n * k / 16;
  if (blocks == 0) return;
  rs_dequant_k<<<unsigned(std::min<int64_t>((blocks + 255) / 256, 65536)), 256, 0, s>>>(packed, scales, row_gs, n, k, w);
  check_launch("nvfp4_dequantize_rs");
}

Nvfp4RsWork::Nvfp4RsWork() {
  slots = 3 * sm_count();
  partial_bytes = kBytesPerSm * size_t(sm_count());
  mem_ = DeviceBuffer(partial_bytes + size_t(slots) * 4, "W4A16 stream-K partial sums");
  check(cudaMemset(mem_.get(), 0, partial_bytes + size_t(slots) * 4), "W4A16 stream-K flags");
  partial = mem_.as<float>();
  flags = reinterpret_cast<int*>(mem_.as<unsigned char>() + partial_bytes);
}

RsTile nvfp4_gemm_rs_tile(int64_t m, int64_t n) {
  RsTile tl;
  tl.tn = m <= 64 ? 64 : 160;
  tl.nt = m > 160 ? 2 : 1;
  // 128 channels a CTA (one an SM) where they still fill the GPU, else 64 (2 or 3 an SM)
  const int64_t tiles = (m + tl.tn * tl.nt - 1) / (tl.tn * tl.nt);
  tl.wgs = (n + 127) / 128 * tiles * 10 >= int64_t(sm_count()) * 9 ? 2 : 1;
  return tl;
}

namespace {

using RsLaunch = void (*)(const bf16*, int64_t, int64_t, int64_t, const uint8_t*, const uint8_t*, const Nvfp4RsTables&, int64_t, void*, bool,
                          int64_t, bool, Nvfp4RsWork*, int, cudaStream_t);
using RsGrid = int64_t (*)(int64_t, int64_t, const Nvfp4RsWork*, int);
struct RsKernel {
  RsTile tile;
  RsLaunch fn;
  RsGrid stream_k;
};
// (RsTile's fields are tn, nt, wgs, tw: the template's second and third arguments swapped)
#define CLEFRT_RS_TILE(TN, WGS, NT, TW) \
  { {TN, NT, WGS, TW}, launch<TN, WGS, NT, TW>, stream_k_grid<TN, WGS, NT, TW> }
// the compiled tiles
const RsKernel kRsKernels[] = {
    CLEFRT_RS_TILE(64, 1, 1, 1),  CLEFRT_RS_TILE(64, 2, 1, 1),  CLEFRT_RS_TILE(160, 1, 1, 1), CLEFRT_RS_TILE(160, 2, 1, 1), CLEFRT_RS_TILE(160, 1, 2, 1),
    CLEFRT_RS_TILE(160, 2, 2, 1), CLEFRT_RS_TILE(64, 1, 1, 2),  CLEFRT_RS_TILE(160, 1, 1, 2), CLEFRT_RS_TILE(160, 2, 1, 2),
};
#undef CLEFRT_RS_TILE

const RsKernel& kernel_of(const RsTile& tl) {
  for (const RsKernel& r : kRsKernels)
    if (r.tile.same_kernel(tl)) return r;
  throw Error(Status::Internal, "internal_error", "nvfp4_gemm_rs: no kernel for the tile " + tl.name());
}

}  // namespace

std::vector<RsTile> nvfp4_gemm_rs_tiles() {
  std::vector<RsTile> v;
  for (const RsKernel& r : kRsKernels) v.push_back(r.tile);
  return v;
}

void nvfp4_gemm_rs(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const Nvfp4RsTables& tables,
                   int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s, Nvfp4RsWork* work, const RsTile* tile) {
  if (m == 0 || n == 0) return;
  const auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (!nvfp4_gemm_rs_available())
    throw Error(Status::Internal, "internal_error", "nvfp4_gemm_rs: needs an sm_90a build on a compute capability 9.0 GPU");
  if (!tables || !nvfp4_gemm_supports(k, ldx) || misaligned(x, 16) || misaligned(packed, 16) || misaligned(scales, 4) ||
      m > INT32_MAX || n > INT32_MAX || (accumulate && !y_f32))
    throw Error(Status::Internal, "internal_error",
                "nvfp4_gemm_rs: unsupported operands (tables made at load, k " + std::to_string(k) +
                    " a multiple of 64, x rows 16-byte aligned, accumulation into fp32 only)");
  const RsTile tl = tile ? *tile : nvfp4_gemm_rs_tile(m, n);
  kernel_of(tl).fn(x, m, k, ldx, packed, scales, tables, n, y, y_f32, ldy, accumulate, work, tl.per_sm, s);
}

int64_t nvfp4_gemm_rs_grid(int64_t m, int64_t n, const RsTile& tile, const Nvfp4RsWork* work) {
  return kernel_of(tile).stream_k(m, n, work, tile.per_sm);
}

std::vector<RsTile> nvfp4_gemm_rs_grids(int64_t m, int64_t n, RsTile tile, const Nvfp4RsWork* work) {
  std::vector<RsTile> out;
  std::vector<int64_t> grids;
  for (int per_sm : {0, -1, 1, 2, 3}) {
    tile.per_sm = per_sm;
    const int64_t g = nvfp4_gemm_rs_grid(m, n, tile, work);
    // no stream-K there (the same launch as per_sm 0), or a grid already listed
    if ((per_sm != 0 && g == 0) || std::find(grids.begin(), grids.end(), g) != grids.end()) continue;
    grids.push_back(g);
    out.push_back(tile);
  }
  return out;
}

std::vector<RsTile> nvfp4_gemm_rs_candidates(int64_t m, int64_t n, const Nvfp4RsWork* work) {
  const RsTile reference = nvfp4_gemm_rs_tile(m, n);
  const int64_t reference_grid = nvfp4_gemm_rs_grid(m, n, reference, work);
  std::vector<RsTile> out{reference};
  for (const RsKernel& r : kRsKernels) {
    const int64_t tok = int64_t(r.tile.tn) * r.tile.nt * r.tile.tw, tiles = (m + tok - 1) / tok;
    if (tok > 64 && tiles * tok > m + m / 2 + 64) continue;  // mostly padding
    for (const RsTile& c : nvfp4_gemm_rs_grids(m, n, r.tile, work))
      if (!c.same_kernel(reference) || nvfp4_gemm_rs_grid(m, n, c, work) != reference_grid) out.push_back(c);  // (the reference's: listed)
  }
  return out;
}

}  // namespace clefrt::cuda

// The NVFP4 W4A16 GEMM with the weights as wgmma's register operand (issue 20, item 4: W4A16 no
// slower than bf16 at the blog's 318 tokens). The product's wgmma kernel (kernels_w4a16_wgmma.cu)
// dequantizes each weight tile into shared memory and has wgmma read both operands from there:
// per 16-wide k step the tensor cores read the x tile and the weight tile from shared memory, and
// the threads write the dequantized tile first. Here the roles are swapped, y^T = W x^T:
//   - A = the weights, 64 channels a warpgroup, dequantized straight into the A fragment's
//     registers (rows g and g + 8 of the warp's 16, k 2t, 2t + 1, 2t + 8, 2t + 9): they never pass
//     through shared memory;
//   - B = x, a [TN tokens, 64 k] tile brought by TMA, K-major, read by both warpgroups;
//   - so the shared memory traffic per wgmma is x's tile only, and TN can be chosen per m (318
//     tokens = 2 x 160).
// For each thread's 4 codes of a (channel, 16-block) to be one 16-bit unit, the packed codes are
// reordered once (kernels_w4a16_rs.cu nvfp4_rs_repack, the product's order: per channel and 64-wide k step, 4 x 8 bytes, quad slot t's units
// of the step's 4 blocks). The per-(channel, block) byte tables (nvfp4_dequant.cuh's make_table_shift,
// exactly nvfp4_dequantize's values) are built once per CTA and step, 2 a thread, into shared
// memory, and read by the 4 threads of a quad that need them (form 1; form 2 overlaps the next
// step's dequantization with the wgmmas; form 3 looks the tables up, built once per gs value).
//
// Every output element is the tensor cores' fp32 sum over k in increasing 16-wide steps, as in the
// product's kernel; the lab counts the outputs whose bits differ from the product's.
//
// Usage: clefrt_bench_w4a16_rs [--commit ID] [--json FILE] [--shape gate_up|down|in_proj|o|odd] [--m M]
// (CLEFRT_LAB_NO_CLUSTERS=1: without form 2's cluster-multicast variants; CLEFRT_LAB_ONCE=1: each
// kernel launched once per m, untimed, for Nsight Compute; CLEFRT_LAB_M=M: as --m M)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/nvfp4_dequant.cuh"
#include "cuda/ops/tma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"
#include "wgmma_rs_wide.cuh"

using namespace clefrt;
using namespace clefrt::cuda;

namespace {

constexpr int BK = 64, STAGES = 4;

// TN tokens x CH channels a CTA: WGS warpgroups of 64 channels (1: up to 2 CTAs an SM, 2: one)
template <int TN, int WGS>
struct Cfg {
  static constexpr int THREADS = 128 * WGS, CH = 64 * WGS, MIN_BLOCKS = WGS == 1 ? 2 : 1;
  static constexpr int x_bytes = TN * BK * 2;     // x tile [TN tokens][64 k], 128-byte swizzle
  static constexpr int wp_bytes = CH * BK / 2;    // packed codes, RS order, [CH][32]
  static constexpr int ws_bytes = CH * BK / 16;   // e4m3 scales [CH][4]
  static constexpr int tab_bytes = 4 * CH * 16;   // tables [block 4][channel CH], 16 bytes each
  static constexpr int w_base = STAGES * x_bytes;  // x tiles stay 1024-aligned (TN % 8 == 0)
  static constexpr int t_base = w_base + STAGES * (wp_bytes + ws_bytes);
  static constexpr int bar_base = t_base + 2 * tab_bytes;
  static constexpr int bytes = bar_base + STAGES * 8 + 1024;
  static_assert(TN % 8 == 0 && TN <= 256, "token tile");
  static_assert(bytes + 1024 <= 233472, "shared memory per SM");
};

// After the last step: the accumulators retired, then stored. acc is the 64-channel x TN-token
// tile's wgmma D fragment: channel (row) ch0 and ch0 + 8, tokens 8 j + 2 t + {0, 1}; y [token][channel].
template <int TN>
__device__ __forceinline__ void finish_tile(float (&acc)[TN / 2], bf16* y, int64_t ldy, int m, int n, int m0, int ch0, int t) {
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < TN / 2; ++i) fence_operand(acc[i]);
  cp_async_wait_all();
#pragma unroll
  for (int j = 0; j < TN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = m0 + j * 8 + t * 2 + c, ch = ch0 + h * 8;
        if (tok < m && ch < n) y[int64_t(tok) * ldy + ch] = __float2bfloat16_rn(acc[j * 4 + h * 2 + c]);
      }
}

template <int TN, int WGS>
__global__ void __launch_bounds__(Cfg<TN, WGS>::THREADS, Cfg<TN, WGS>::MIN_BLOCKS)
    w4a16_rs_k(const __grid_constant__ CUtensorMap xmap, int m, int k, const uint8_t* __restrict__ rs_packed,
               const uint8_t* __restrict__ scales, const float* __restrict__ row_gs, int n, bf16* y, int64_t ldy) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using C = Cfg<TN, WGS>;
  constexpr int CH = C::CH;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, wg = tid >> 7, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * CH, m0 = int(blockIdx.y) * TN;
  const int ktiles = k / BK;
  auto xtile = [&](int kt) { return smem + (kt % STAGES) * C::x_bytes; };
  auto wtile = [&](int kt) { return smem + C::w_base + (kt % STAGES) * (C::wp_bytes + C::ws_bytes); };
  auto ttile = [&](int kt) { return smem + C::t_base + (kt & 1) * C::tab_bytes; };

  uint64_t* const xfull = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&xfull[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const Nvfp4StepCopy<CH, BK> copy_w(rs_packed, scales, n0, n, k, tid);
  auto load_x = [&](int kt) {
    if (tid != 0 || kt >= ktiles) return;
    mbar_arrive_expect_tx(&xfull[kt % STAGES], C::x_bytes);
    tma_load_2d(xtile(kt), &xmap, kt * BK, m0, &xfull[kt % STAGES]);
  };
  auto load_w = [&](int kt) {
    if (kt < ktiles) copy_w(wtile(kt), kt);
  };

  // tables: this thread builds channel trow's blocks tb and tb + 2 of each step
  const int trow = tid & (CH - 1), tb = tid / CH;
  const float tgs = n0 + trow < n ? row_gs[n0 + trow] : 1.0f, trc = row_reciprocal(tgs);
  auto tables = [&](int kt) {
    const unsigned char* sc = wtile(kt) + C::wp_bytes + trow * 4;
    unsigned char* tt = ttile(kt);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = tb + 2 * j;
      const Table T = make_table_shift(scale_quotient(e4m3_value(sc[b]), tgs, trc));
      *reinterpret_cast<uint4*>(tt + (b * CH + trow) * 16) = make_uint4(T.lo0, T.lo1, T.hi0, T.hi1);
    }
  };

  const int ra = wg * 64 + warp * 16 + g;  // this thread's A rows: channels ra and ra + 8 of the CTA
  float acc[TN / 2];
  uint32_t afr[2][4];

  load_w(0), load_x(0), load_w(1);
  cp_async_commit();
  load_x(1), load_w(2);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  tables(0);

  for (int kt = 0; kt < ktiles; ++kt) {
    // This thread's copies of weight tile kt + 1 have landed; after the barrier every thread's, and
    // tables kt, are visible, and every warpgroup's wgmmas of step kt - 2 are done (each waits for
    // all but its latest): x stage (kt + 2) % 4, weight stage (kt + 3) % 4 and table buffer
    // (kt + 1) % 2 are free.
    cp_async_wait<1>();
    __syncthreads();
    load_x(kt + 2), load_w(kt + 3);
    cp_async_commit();
    if (kt + 1 < ktiles) tables(kt + 1);

    const unsigned char* wp = wtile(kt);
    const uint2 p0 = *reinterpret_cast<const uint2*>(wp + ra * 32 + t * 8);
    const uint2 p1 = *reinterpret_cast<const uint2*>(wp + (ra + 8) * 32 + t * 8);
    const unsigned char* tt = ttile(kt);
    mbar_wait(&xfull[kt % STAGES], uint32_t((kt / STAGES) & 1));
    const unsigned char* xt = xtile(kt);
#pragma unroll
    for (int s = 0; s < BK / 16; ++s) {
      const uint4 q0 = *reinterpret_cast<const uint4*>(tt + (s * CH + ra) * 16);
      const uint4 q1 = *reinterpret_cast<const uint4*>(tt + (s * CH + ra + 8) * 16);
      uint32_t(&a)[4] = afr[s & 1];
      dequant_unit(s < 2 ? p0.x : p0.y, s & 1, Table{q0.x, q0.y, q0.z, q0.w}, a[0], a[2]);
      dequant_unit(s < 2 ? p1.x : p1.y, s & 1, Table{q1.x, q1.y, q1.z, q1.w}, a[1], a[3]);
#pragma unroll
      for (int i = 0; i < TN / 2; ++i) fence_operand(acc[i]);
      wgmma_fence();
      lab::WgmmaRs<TN>::run(acc, a, wgmma_desc(xt + s * 32), kt > 0 || s > 0);
      wgmma_commit();
      wgmma_wait<1>();  // the previous k step's wgmma: its A registers are free for the next
    }
  }
  finish_tile<TN>(acc, y, ldy, m, n, m0, n0 + ra, t);
#endif
}

// Form 2: one warpgroup a CTA (64 channels, up to 2 CTAs an SM) or two sharing the x tile (128
// channels), a step's 4 wgmmas issued
// together, and the next step dequantized while they run, with no block barrier on its path:
//   - each thread copies its own packed codes (rows ra, ra + 8, quad slot t: 2 x 8 bytes) and each
//     lane its table row's 4 scales, by cp.async into private slots, PS steps ahead;
//   - each warp builds the 64 tables (16 rows x 4 blocks) that only its own lanes read: a
//     __syncwarp publishes them;
//   - the step's A fragments (4 k16 x 4 registers) are double-buffered by the parity of the step,
//     the loop unrolled by 2 so that the buffer is known at compile time (registers, not local
//     memory), and rewritten only after wgmma_wait<1> has retired the step that read them.
// The block barrier remains only to free an x stage for the next TMA copy.
__device__ __forceinline__ void cp_async8(void* smem_dst, const void* src, bool valid) {
  const unsigned d = smem_u32(smem_dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0) : "memory");
}

constexpr int PS = 4;  // steps of private copies in flight

template <int TN, int WGS>
struct Cfg2 {
  static constexpr int THREADS = 128 * WGS, CH = 64 * WGS;
  static constexpr int x_bytes = TN * BK * 2;
  static constexpr int pk_bytes = THREADS * 16;      // a step's private packed codes
  static constexpr int sc_bytes = THREADS * 4;       // a step's private scales
  static constexpr int tab_bytes = 4 * 16 * 16;      // a warp's tables: [block 4][row 16] x 16 bytes
  static constexpr int p_base = STAGES * x_bytes;
  static constexpr int s_base = p_base + PS * pk_bytes;
  static constexpr int t_base = s_base + PS * sc_bytes;
  static constexpr int bar_base = t_base + 4 * WGS * 2 * tab_bytes;  // a table pair per warp
  static constexpr int bytes = bar_base + 2 * STAGES * 8 + 1024;  // full + empty barriers
  static constexpr int MIN_BLOCKS = 2 * (bytes + 1024) <= 233472 ? 2 : 1;
  static_assert(TN % 8 == 0 && TN <= 256, "token tile");
  static_assert(bytes + 1024 <= 233472, "shared memory per SM");
};

// CL > 1: clusters of CL CTAs along the channels share each x tile: CTA rank r copies rows
// [r TN / CL, (r + 1) TN / CL) of it by TMA multicast into every CTA of the cluster, so x comes
// from L2 once per 64 CL channels instead of once per 64. A stage is refilled only when every CTA
// of the cluster has retired its wgmmas on it (xempty: CL arrivals, one from each CTA).
template <int TN, int WGS, int CL>
__global__ void __launch_bounds__(Cfg2<TN, WGS>::THREADS, Cfg2<TN, WGS>::MIN_BLOCKS)
    w4a16_rs2_k(const __grid_constant__ CUtensorMap xmap, int m, int k, const uint8_t* __restrict__ rs_packed,
                const uint8_t* __restrict__ scales, const float* __restrict__ row_gs, int n, bf16* y, int64_t ldy) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using C = Cfg2<TN, WGS>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * C::CH, m0 = int(blockIdx.y) * TN;
  const int ktiles = k / BK;
  const int64_t prow = k / 2, srow = k / 16;
  auto xtile = [&](int kt) { return smem + (kt % STAGES) * C::x_bytes; };
  unsigned char* const pk = smem + C::p_base + tid * 16;  // + (step % PS) * pk_bytes
  unsigned char* const sc = smem + C::s_base + tid * 4;   // + (step % PS) * sc_bytes
  unsigned char* const tabw = smem + C::t_base + warp * 2 * C::tab_bytes;

  uint64_t* const xfull = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  uint64_t* const xempty = xfull + STAGES;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&xfull[s], 1), mbar_init(&xempty[s], CL);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (CL > 1)
    cluster_sync_all();  // no remote arrival or copy before every CTA's barriers exist
  else
    __syncthreads();
  const uint32_t rank = CL > 1 ? cluster_rank() : 0;
  constexpr int SLICE = TN / CL;  // x rows this CTA copies for the cluster
  static_assert(TN % CL == 0 && CL <= 8, "whole slices (else xfull never completes); a portable cluster");
  static_assert(SLICE % 8 == 0, "a slice keeps the 1024-byte swizzle pattern");
  auto load_x = [&](int kt) {
    if (tid != 0 || kt >= ktiles) return;
    mbar_arrive_expect_tx(&xfull[kt % STAGES], C::x_bytes);  // the whole tile: every slice lands here
    if constexpr (CL > 1)
      tma_load_2d_multicast(xtile(kt) + rank * SLICE * 128, &xmap, kt * BK, m0 + int(rank) * SLICE, &xfull[kt % STAGES],
                            uint16_t((1u << CL) - 1));
    else
      tma_load_2d(xtile(kt), &xmap, kt * BK, m0, &xfull[kt % STAGES]);
  };
  // The cluster's release of x tile j (all CTAs past its wgmmas), then tile j + STAGES into its stage
  auto refill_x = [&](int j) {
    if constexpr (CL > 1) {
      if (tid != 0 || j < 0) return;
      for (int r = 0; r < CL; ++r) mbar_arrive_cluster(&xempty[j % STAGES], uint32_t(r));
      if (j + STAGES >= ktiles) return;
      mbar_wait(&xempty[j % STAGES], uint32_t((j / STAGES) & 1));
    }
    load_x(j + STAGES);
  };
  const int ra = warp * 16 + g;  // A rows ra and ra + 8
  const bool v0 = n0 + ra < n, v1 = n0 + ra + 8 < n;
  const uint8_t* src0 = v0 ? rs_packed + int64_t(n0 + ra) * prow + t * 8 : rs_packed;
  const uint8_t* src1 = v1 ? rs_packed + int64_t(n0 + ra + 8) * prow + t * 8 : rs_packed;
  const int trow = warp * 16 + (lane & 15), tb = lane >> 4;  // this lane's tables: row trow, blocks tb, tb + 2
  const bool tv = n0 + trow < n;
  const uint8_t* ssrc = tv ? scales + int64_t(n0 + trow) * srow : scales;
  const float tgs = tv ? row_gs[n0 + trow] : 1.0f, trc = row_reciprocal(tgs);
  auto copy_own = [&](int kt) {  // always commits a group (empty past the end)
    if (kt < ktiles) {
      unsigned char* p = pk + (kt % PS) * C::pk_bytes;
      cp_async8(p, v0 ? src0 + kt * 32 : rs_packed, v0);
      cp_async8(p + 8, v1 ? src1 + kt * 32 : rs_packed, v1);
      cp_async4(sc + (kt % PS) * C::sc_bytes, tv ? ssrc + kt * 4 : scales, tv);
    }
    cp_async_commit();
  };
  auto tables = [&](int kt) {
    const unsigned char* s4 = sc + (kt % PS) * C::sc_bytes;
    unsigned char* tt = tabw + (kt & 1) * C::tab_bytes;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = tb + 2 * j;
      const Table T = make_table_shift(scale_quotient(e4m3_value(s4[b]), tgs, trc));
      *reinterpret_cast<uint4*>(tt + (b * 16 + (lane & 15)) * 16) = make_uint4(T.lo0, T.lo1, T.hi0, T.hi1);
    }
  };
  uint32_t a0[4][4], a1[4][4];
  auto dequant = [&](int kt, uint32_t (&a)[4][4]) {
    const uint4 p = *reinterpret_cast<const uint4*>(pk + (kt % PS) * C::pk_bytes);  // x, y: row ra; z, w: row ra + 8
    const unsigned char* tt = tabw + (kt & 1) * C::tab_bytes;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 q0 = *reinterpret_cast<const uint4*>(tt + (s * 16 + g) * 16);
      const uint4 q1 = *reinterpret_cast<const uint4*>(tt + (s * 16 + g + 8) * 16);
      dequant_unit(s < 2 ? p.x : p.y, s & 1, Table{q0.x, q0.y, q0.z, q0.w}, a[s][0], a[s][2]);
      dequant_unit(s < 2 ? p.z : p.w, s & 1, Table{q1.x, q1.y, q1.z, q1.w}, a[s][1], a[s][3]);
    }
  };
  float acc[TN / 2];

  for (int j = 0; j < STAGES - 1; ++j) load_x(j);
  for (int j = 0; j < PS - 1; ++j) copy_own(j);
  cp_async_wait<PS - 2>();  // step 0's own copies
  __syncwarp();
  tables(0);
  __syncwarp();
  dequant(0, a0);

  // one step: its wgmmas on A (dequantized in the step before), then, while they run, the next
  // step's tables and A into the other buffer
  auto step = [&](int kt, uint32_t (&a)[4][4], uint32_t (&an)[4][4]) {
    mbar_wait(&xfull[kt % STAGES], uint32_t((kt / STAGES) & 1));
    const unsigned char* xt = xtile(kt);
#pragma unroll
    for (int i = 0; i < TN / 2; ++i) fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) lab::WgmmaRs<TN>::run(acc, a[s], wgmma_desc(xt + s * 32), kt > 0 || s > 0);
    wgmma_commit();
    wgmma_wait<1>();  // step kt - 1's wgmmas: buffer an and x stage (kt - 1) % 4 are free
    __syncthreads();  // ... in every warp
    if (kt == 0)
      load_x(STAGES - 1);  // a stage not used yet
    else
      refill_x(kt - 1);
    copy_own(kt + PS - 1);
    cp_async_wait<PS - 2>();  // this thread's copies of step kt + 1
    if (kt + 1 < ktiles) {
      __syncwarp();
      tables(kt + 1);
      __syncwarp();
      dequant(kt + 1, an);
    }
  };
  for (int kt = 0; kt < ktiles; kt += 2) {
    step(kt, a0, a1);
    if (kt + 1 < ktiles) step(kt + 1, a1, a0);
  }
  finish_tile<TN>(acc, y, ldy, m, n, m0, n0 + ra, t);
  if constexpr (CL > 1) cluster_sync_all();  // no CTA leaves while others may still arrive on its barriers
#endif
}

// Form 3: form 1 without building tables in the loop. A block's table depends only on its scale
// byte and its row's gs, and a GEMM's rows take few gs values (one per fused tensor), so the 256
// tables of each gs are built once (the product's nvfp4_rs_upload, at load there), and each
// warpgroup copies those of the (at most 2) gs values of its 64 rows into shared memory at the
// start. A step's table is then one lookup by the scale byte: no e4m3 conversion, division, table
// arithmetic, table stores or their buffer in the loop. The same values as form 1's tables, so the same bits.
// (Form 1's profile found the table building its hottest code: bench/results/2026-12-07-session53.md.)
// ST: x / weight stages (3: smaller, so that 3 CTAs of 128 x 64 fit an SM: 3 warps a scheduler).
// NT: token tiles of TN a warpgroup, NT wgmmas on each dequantized A fragment: a weight is
// dequantized once per NT TN tokens (at 318 tokens, NT 2 x TN 160: once, not twice).
template <int TN, int WGS, int ST = STAGES, int NT = 1>
struct Cfg3 {
  static constexpr int THREADS = 128 * WGS, CH = 64 * WGS;
  static constexpr int x_bytes = NT * TN * BK * 2;
  static constexpr int wp_bytes = CH * BK / 2;
  static constexpr int ws_bytes = CH * BK / 16;
  static constexpr int w_base = ST * x_bytes;
  static constexpr int t_base = w_base + ST * (wp_bytes + ws_bytes);
  static constexpr int set_bytes = 256 * 16;                 // one gs value's tables, by scale byte
  static constexpr int bar_base = t_base + WGS * 2 * set_bytes;  // 2 sets a warpgroup
  static constexpr int bytes = bar_base + ST * 8 + 1024;
  static constexpr int MIN_BLOCKS = WGS == 2 ? 1 : 3 * (bytes + 1024) <= 233472 ? 3 : 2;
  static_assert(ST == 3 || ST == 4, "stages");
  static_assert(bytes + 1024 <= 233472, "shared memory per SM");
};

// group_sets[2 r + j]: the gs index of set j of 64-row group r; row_set[c]: which of its group's 2
// sets row c takes
template <int TN, int WGS, int ST, int NT>
__global__ void __launch_bounds__(Cfg3<TN, WGS, ST, NT>::THREADS, Cfg3<TN, WGS, ST, NT>::MIN_BLOCKS)
    w4a16_rs3_k(const __grid_constant__ CUtensorMap xmap, int m, int k, const uint8_t* __restrict__ rs_packed,
                const uint8_t* __restrict__ scales, const uint4* __restrict__ tabs, const int* __restrict__ group_sets,
                const uint8_t* __restrict__ row_set, int n, bf16* y, int64_t ldy) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using C = Cfg3<TN, WGS, ST, NT>;
  constexpr int CH = C::CH;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = int(threadIdx.x), lane = tid & 31, wg = tid >> 7, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * CH, m0 = int(blockIdx.y) * TN * NT;
  const int ktiles = k / BK;
  auto xtile = [&](int kt) { return smem + (kt % ST) * C::x_bytes; };
  auto wtile = [&](int kt) { return smem + C::w_base + (kt % ST) * (C::wp_bytes + C::ws_bytes); };

  uint64_t* const xfull = reinterpret_cast<uint64_t*>(smem + C::bar_base);
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) mbar_init(&xfull[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // the CTA's table sets: warpgroup w's sets j = 0, 1 at t_base + (2 w + j) set_bytes
  {
    uint4* const sets = reinterpret_cast<uint4*>(smem + C::t_base);
    const int groups = (n + 63) / 64;
    for (int i = tid; i < WGS * 2 * 256; i += C::THREADS) {
      const int grp = n0 / 64 + (i >> 9);
      sets[i] = grp < groups ? tabs[group_sets[2 * grp + ((i >> 8) & 1)] * 256 + (i & 255)] : make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();
  const Nvfp4StepCopy<CH, BK> copy_w(rs_packed, scales, n0, n, k, tid);
  auto load_x = [&](int kt) {
    if (tid != 0 || kt >= ktiles) return;
    mbar_arrive_expect_tx(&xfull[kt % ST], C::x_bytes);
#pragma unroll
    for (int j = 0; j < NT; ++j) tma_load_2d(xtile(kt) + j * TN * BK * 2, &xmap, kt * BK, m0 + j * TN, &xfull[kt % ST]);
  };
  auto load_w = [&](int kt) {
    if (kt < ktiles) copy_w(wtile(kt), kt);
  };

  const int ra = wg * 64 + warp * 16 + g;  // this thread's A rows: channels ra and ra + 8 of the CTA
  const unsigned char* const set0 = smem + C::t_base + (2 * wg + (n0 + ra < n ? row_set[n0 + ra] : 0)) * C::set_bytes;
  const unsigned char* const set1 = smem + C::t_base + (2 * wg + (n0 + ra + 8 < n ? row_set[n0 + ra + 8] : 0)) * C::set_bytes;
  float acc[NT][TN / 2];
  uint32_t afr[2][4];

  if constexpr (ST == 4) {
    load_w(0), load_x(0), load_w(1);
    cp_async_commit();
    load_x(1), load_w(2);
    cp_async_commit();
  } else {
    load_w(0), load_x(0);
    cp_async_commit();
    load_w(1);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    // this thread's copies of weight tile kt have landed; after the barrier every thread's, and
    // every warpgroup's wgmmas of step kt - 2 are done: x stage (kt - 2) % ST = (kt + ST - 2) % ST
    // and weight stage (kt - 1) % ST are free (3 stages: x only one step ahead)
    cp_async_wait<1>();
    __syncthreads();
    load_x(kt + ST - 2), load_w(kt + ST - 1);
    cp_async_commit();

    const unsigned char* wp = wtile(kt);
    const uint2 p0 = *reinterpret_cast<const uint2*>(wp + ra * 32 + t * 8);
    const uint2 p1 = *reinterpret_cast<const uint2*>(wp + (ra + 8) * 32 + t * 8);
    const uint32_t s0 = *reinterpret_cast<const uint32_t*>(wp + C::wp_bytes + ra * 4);
    const uint32_t s1 = *reinterpret_cast<const uint32_t*>(wp + C::wp_bytes + (ra + 8) * 4);
    mbar_wait(&xfull[kt % ST], uint32_t((kt / ST) & 1));
    const unsigned char* xt = xtile(kt);
#pragma unroll
    for (int s = 0; s < BK / 16; ++s) {
      const uint4 q0 = *reinterpret_cast<const uint4*>(set0 + ((s0 >> (8 * s)) & 0xffu) * 16);
      const uint4 q1 = *reinterpret_cast<const uint4*>(set1 + ((s1 >> (8 * s)) & 0xffu) * 16);
      uint32_t(&a)[4] = afr[s & 1];
      dequant_unit(s < 2 ? p0.x : p0.y, s & 1, Table{q0.x, q0.y, q0.z, q0.w}, a[0], a[2]);
      dequant_unit(s < 2 ? p1.x : p1.y, s & 1, Table{q1.x, q1.y, q1.z, q1.w}, a[1], a[3]);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < TN / 2; ++i) fence_operand(acc[j][i]);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < NT; ++j) lab::WgmmaRs<TN>::run(acc[j], a, wgmma_desc(xt + j * TN * BK * 2 + s * 32), kt > 0 || s > 0);
      wgmma_commit();
      wgmma_wait<1>();
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) finish_tile<TN>(acc[j], y, ldy, m, n, m0 + j * TN, n0 + ra, t);
#endif
}

CUtensorMap x_map(const bf16* x, int64_t m, int64_t k, int tn) { return bf16_tensor_map_sw128(x, m, k, k, BK, tn, "w4a16 rs lab"); }

// Form 3's tables: the product's (kernels_w4a16_rs.cu nvfp4_rs_plan / nvfp4_rs_upload: every
// distinct gs value's 256, each 64-row group's 2 sets and each row's choice between them). ok:
// every group's rows take at most 2 gs values.
struct TableSets {
  DeviceBuffer mem;
  Nvfp4RsTables t;
  bool ok = false;
};

TableSets make_table_sets(const std::vector<float>& gsv, cudaStream_t s) {
  TableSets ts;
  Nvfp4RsPlan plan;
  ts.ok = nvfp4_rs_plan(gsv.data(), int64_t(gsv.size()), plan);
  if (!ts.ok) return ts;
  ts.mem = DeviceBuffer(nvfp4_rs_bytes(plan), "form 3 tables");
  ts.t = nvfp4_rs_upload(plan, ts.mem.get(), s);
  check(cudaStreamSynchronize(s), "form 3 tables");
  return ts;
}

template <int TN, int WGS>
void run_rs(const bf16* x, int64_t m, int64_t k, const uint8_t* rs, const uint8_t* scales, const float* gs, const TableSets&, int64_t n,
            bf16* y, cudaStream_t s) {
  using C = Cfg<TN, WGS>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(w4a16_rs_k<TN, WGS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "w4a16 rs");
    return true;
  }();
  (void)configured;
  const CUtensorMap map = x_map(x, m, k, TN);
  const dim3 grid(unsigned((n + C::CH - 1) / C::CH), unsigned((m + TN - 1) / TN));
  w4a16_rs_k<TN, WGS><<<grid, C::THREADS, C::bytes, s>>>(map, int(m), int(k), rs, scales, gs, int(n), y, n);
  check_launch("w4a16 rs");
}

template <int TN, int WGS, int ST = STAGES, int NT = 1>
void run_rs3(const bf16* x, int64_t m, int64_t k, const uint8_t* rs, const uint8_t* scales, const float*, const TableSets& ts, int64_t n,
             bf16* y, cudaStream_t s) {
  using C = Cfg3<TN, WGS, ST, NT>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(w4a16_rs3_k<TN, WGS, ST, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "w4a16 rs3");
    return true;
  }();
  (void)configured;
  const CUtensorMap map = x_map(x, m, k, TN);
  const dim3 grid(unsigned((n + C::CH - 1) / C::CH), unsigned((m + TN * NT - 1) / (TN * NT)));
  w4a16_rs3_k<TN, WGS, ST, NT><<<grid, C::THREADS, C::bytes, s>>>(map, int(m), int(k), rs, scales, static_cast<const uint4*>(ts.t.tabs),
                                                          ts.t.group_sets, ts.t.row_set, int(n), y, n);
  check_launch("w4a16 rs3");
}

template <int TN, int WGS, int CL = 1>
void run_rs2(const bf16* x, int64_t m, int64_t k, const uint8_t* rs, const uint8_t* scales, const float* gs, const TableSets&, int64_t n,
             bf16* y, cudaStream_t s) {
  using C = Cfg2<TN, WGS>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(w4a16_rs2_k<TN, WGS, CL>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::bytes), "w4a16 rs2");
    return true;
  }();
  (void)configured;
  const CUtensorMap map = x_map(x, m, k, TN / CL);
  // channel tiles rounded up to whole clusters: the extra CTAs copy their x slices and store nothing
  const unsigned ctiles = unsigned((n + C::CH - 1) / C::CH + CL - 1) / CL * CL;
  const dim3 grid(ctiles, unsigned((m + TN - 1) / TN));
  if constexpr (CL == 1) {
    w4a16_rs2_k<TN, WGS, 1><<<grid, C::THREADS, C::bytes, s>>>(map, int(m), int(k), rs, scales, gs, int(n), y, n);
  } else {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(C::THREADS);
    cfg.dynamicSmemBytes = C::bytes;
    cfg.stream = s;
    cudaLaunchAttribute at[1] = {cluster_dim_x(CL)};
    cfg.attrs = at;
    cfg.numAttrs = 1;
    check(cudaLaunchKernelEx(&cfg, w4a16_rs2_k<TN, WGS, CL>, map, int(m), int(k), rs, scales, gs, int(n), y, int64_t(n)), "w4a16 rs2 (clusters)");
  }
  check_launch("w4a16 rs2");
}

using RsFn = void (*)(const bf16*, int64_t, int64_t, const uint8_t*, const uint8_t*, const float*, const TableSets&, int64_t, bf16*,
                      cudaStream_t);
struct Form {
  int tn, wgs, form, cl;  // form 1: w4a16_rs_k, 2: w4a16_rs2_k (cl: its cluster size), 3: w4a16_rs3_k
  RsFn fn;
  int stages = STAGES;
  int nt = 1;  // form 3: token tiles a warpgroup (tokens = nt tn)
};
const Form kForms[] = {{128, 1, 3, 1, run_rs3<128, 1>},      {160, 1, 3, 1, run_rs3<160, 1>},      {192, 1, 3, 1, run_rs3<192, 1>},
                       {256, 1, 3, 1, run_rs3<256, 1>},      {128, 2, 3, 1, run_rs3<128, 2>},      {160, 2, 3, 1, run_rs3<160, 2>},
                       {256, 2, 3, 1, run_rs3<256, 2>},      {128, 1, 3, 1, run_rs3<128, 1, 3>, 3}, {96, 1, 3, 1, run_rs3<96, 1>},
                       {160, 1, 3, 1, run_rs3<160, 1, 4, 2>, 4, 2}, {160, 2, 3, 1, run_rs3<160, 2, 4, 2>, 4, 2},
                       {128, 2, 3, 1, run_rs3<128, 2, 4, 2>, 4, 2},
                       {128, 2, 1, 1, run_rs<128, 2>},       {160, 2, 1, 1, run_rs<160, 2>},       {192, 2, 1, 1, run_rs<192, 2>},
                       {256, 2, 1, 1, run_rs<256, 2>},       {128, 1, 1, 1, run_rs<128, 1>},       {160, 1, 1, 1, run_rs<160, 1>},
                       {64, 1, 2, 1, run_rs2<64, 1>},        {128, 1, 2, 1, run_rs2<128, 1>},      {160, 1, 2, 1, run_rs2<160, 1>},
                       {192, 1, 2, 1, run_rs2<192, 1>},      {256, 1, 2, 1, run_rs2<256, 1>},      {128, 2, 2, 1, run_rs2<128, 2>},
                       {160, 2, 2, 1, run_rs2<160, 2>},      {256, 2, 2, 1, run_rs2<256, 2>},      {160, 1, 2, 2, run_rs2<160, 1, 2>},
                       {160, 1, 2, 4, run_rs2<160, 1, 4>},   {128, 1, 2, 4, run_rs2<128, 1, 4>},   {256, 1, 2, 2, run_rs2<256, 1, 2>},
                       {160, 2, 2, 2, run_rs2<160, 2, 2>}};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe as they come (a timeout keeps them)
  bench::Options opt;
  if (!bench::parse_options(argc, argv, true, opt)) return 2;
  // the cluster forms last in each m's list; CLEFRT_LAB_NO_CLUSTERS=1 leaves them out
  const bool clusters = !std::getenv("CLEFRT_LAB_NO_CLUSTERS");
  // CLEFRT_LAB_ONCE=1: every kernel launched once per m, untimed (for ncu: one launch each to profile)
  const bool once = std::getenv("CLEFRT_LAB_ONCE") != nullptr;
  auto timed = [&](cudaStream_t st, const std::function<void()>& fn) {
    if (!once) return bench::median_ms(st, fn);
    fn();
    return 0.0;
  };
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    if (!nvfp4_gemm_wgmma_available()) {
      std::printf("no sm_90a kernels on this GPU: the register-A lab needs Hopper\n");
      return 0;
    }
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    Gemm inv(s, true);
    Nvfp4RsWork rs_work;
    std::vector<int64_t> ms = {318, 1024, 8192};
    if (opt.only_m > 0) ms = {opt.only_m};
    if (opt.only_m <= 0 && std::getenv("CLEFRT_LAB_M")) ms = {std::atoll(std::getenv("CLEFRT_LAB_M"))};  // the suite's env: switch
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    bool all_same = true;
    for (Shape sh : {Shape{"gate_up", 34816, 5120}, Shape{"down", 5120, 17408}, Shape{"in_proj", 16480, 5120}, Shape{"o", 5120, 6144},
                      Shape{"odd", 1000, 4160}}) {  // odd: k / 64 odd (the loops' tail) and a partial channel tile
      if (!opt.only_shape.empty() && std::string(sh.name) != opt.only_shape) continue;
      const int64_t n = sh.n, k = sh.k, mmax = *std::max_element(ms.begin(), ms.end());
      DeviceBuffer w(size_t(n * k) * 2, "W"), wd(size_t(n * k) * 2, "W dequantized"), packed(size_t(n * k / 2), "W packed"),
          rs(size_t(n * k / 2), "W packed, RS order"), scales(size_t(n * k / 16), "W scales"), gsr(size_t(n) * 4, "gs"),
          x(size_t(mmax * k) * 2, "x"), y0(size_t(mmax * n) * 2, "y product"), y1(size_t(mmax * n) * 2, "y rs"),
          yb(size_t(mmax * n) * 2, "y bf16");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), mmax * k, 12, 0.0f, 1.0f, s);
      // per-channel global scales that differ (the product's row_gs), around the tensor's
      const float gs = bench::nvfp4_tensor_gs(w.as<bf16>(), n * k, s);
      std::vector<float> gsv(static_cast<size_t>(n));
      // in runs of 96 rows (as fused tensors give: one value a tensor), not aligned to the 64-row
      // groups, so that a group takes 2 values
      for (int64_t i = 0; i < n; ++i) gsv[size_t(i)] = gs * (1.0f + 0.001f * float((i / 96) % 7));
      check(cudaMemcpy(gsr.get(), gsv.data(), gsv.size() * 4, cudaMemcpyHostToDevice), "gs");
      nvfp4_quantize(w.as<bf16>(), n, k, gsv[0], packed.as<uint8_t>(), scales.as<uint8_t>(), s);
      nvfp4_dequantize(packed.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), n, k, wd.as<bf16>(), s);
      const TableSets sets = make_table_sets(gsv, s);
      // the product's short-input kernel (kernels_w4a16_rs.cu: form 3 on the reordered codes), on the same tables
      const bool product_rs = sets.ok;
      const Nvfp4RsTables& prs = sets.t;
      if (!sets.ok) std::printf("  (form 3 skipped: a 64-row group takes more than 2 gs values)\n");
      check(cudaMemcpyAsync(rs.get(), packed.get(), size_t(n * k / 2), cudaMemcpyDeviceToDevice, s), "rs codes");
      nvfp4_rs_repack(rs.as<uint8_t>(), n, k, s);  // the product's order (kernels_w4a16_rs.cu)
      check(cudaStreamSynchronize(s), "prepare");
      std::printf("\n%s: n %lld, k %lld (packed %.1f MB, bf16 %.1f MB); TFLOP/s and %% of the bf16 peak (%.0f)\n", sh.name, (long long)n,
                  (long long)k, double(n * k) * 0.5625 / 1e6, double(n * k) * 2 / 1e6, hw.peak_bf16_tflops);
      json::Value rows = json::Value::array();
      for (int64_t m : ms) {
        const double flop = 2.0 * double(m) * double(n) * double(k);
        auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
        const double t_inv = timed(s, [&] {
          inv.run(x.as<bf16>(), m, k, k, wd.as<bf16>(), n, yb.get(), OutType::BF16, n, false, "bench");
        });
        const double t_wg = timed(s, [&] {
          nvfp4_gemm(x.as<bf16>(), m, k, k, packed.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), n, y0.get(), false, n, false, s,
                     W4A16Gemm::Wgmma);
        });
        check(cudaStreamSynchronize(s), "product");
        const std::vector<uint16_t> h0 = bench::download<uint16_t>(y0, size_t(m * n), s), hb = bench::download<uint16_t>(yb, size_t(m * n), s);
        std::printf("  m %5lld  bf16 GEMM (cuBLASLt, invariant) %8.3f ms %6.1f TF/s %5.1f%%\n", (long long)m, t_inv, tf(t_inv),
                    100 * tf(t_inv) / hw.peak_bf16_tflops);
        std::printf("  m %5lld  product W4A16 wgmma              %8.3f ms %6.1f TF/s %5.1f%%  (%.2fx bf16)\n", (long long)m, t_wg, tf(t_wg),
                    100 * tf(t_wg) / hw.peak_bf16_tflops, t_inv / t_wg);
        json::Value r = json::Value::object();
        r.add("m", json::Value::integer(m));
        r.add("bf16_invariant_ms", json::Value::number(t_inv));
        r.add("product_wgmma_ms", json::Value::number(t_wg));
        // W4A16RsTuner's candidates (it picks the fastest at its first call), the untuned pick first
        double best = 0;
        std::string best_name;
        if (product_rs) {
          const std::vector<RsTile> cands = nvfp4_gemm_rs_candidates(m, n, &rs_work);
          for (size_t ci = 0; ci < cands.size(); ++ci) {
            const RsTile& tl = cands[ci];
            const int64_t g = nvfp4_gemm_rs_grid(m, n, tl, &rs_work);
            check(cudaMemsetAsync(y1.get(), 0xFF, size_t(m * n) * 2, s), "poison");
            nvfp4_gemm_rs(x.as<bf16>(), m, k, k, rs.as<uint8_t>(), scales.as<uint8_t>(), prs, n, y1.get(), false, n, false, s, &rs_work, &tl);
            const std::vector<uint16_t> h1 = bench::download<uint16_t>(y1, size_t(m * n), s);
            size_t diff = 0;
            for (size_t i = 0; i < h1.size(); ++i) diff += h1[i] != h0[i];
            all_same = all_same && diff == 0;
            const double t = timed(s, [&] {
              nvfp4_gemm_rs(x.as<bf16>(), m, k, k, rs.as<uint8_t>(), scales.as<uint8_t>(), prs, n, y1.get(), false, n, false, s, &rs_work, &tl);
            });
            const std::string name = tl.name() + (g > 0 ? ", stream-K " + std::to_string(g) : std::string());
            const bool picked = ci == 0;
            std::printf("  m %5lld  product short-input (nvfp4_gemm_rs, %s%s) %8.3f ms %6.1f TF/s %5.1f%%  (%.2fx bf16)  %zu of %zu "
                        "outputs differ from the product's wgmma\n",
                        (long long)m, name.c_str(), picked ? ", untuned pick" : "", t, tf(t), 100 * tf(t) / hw.peak_bf16_tflops, t_inv / t, diff,
                        h1.size());
            json::Value pr = json::Value::object();
            pr.add("ms", json::Value::number(t));
            pr.add("differ_from_product", json::Value::integer(int64_t(diff)));
            pr.add("untuned_pick", json::Value::boolean(picked));
            r.add("product_rs " + name, std::move(pr));
            if (best == 0 || t < best) best = t, best_name = name;
          }
        }
        if (best > 0)
          std::printf("  m %5lld  product short-input, fastest tile: %s %.3f ms (%.2fx bf16)\n", (long long)m, best_name.c_str(), best, t_inv / best);
        for (const Form& f : kForms) {
          if ((f.cl > 1 && !clusters) || (f.form == 3 && !sets.ok)) continue;
          const int64_t tok = int64_t(f.tn) * f.nt, tiles = (m + tok - 1) / tok;
          if (tok > 64 && tiles * tok > m + m / 2 + 64) continue;  // mostly padding: skip
          check(cudaMemsetAsync(y1.get(), 0xFF, size_t(m * n) * 2, s), "poison");
          f.fn(x.as<bf16>(), m, k, rs.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), sets, n, y1.as<bf16>(), s);
          check(cudaStreamSynchronize(s), "rs run");
          const std::vector<uint16_t> h1 = bench::download<uint16_t>(y1, size_t(m * n), s);
          size_t diff = 0;
          double worst = 0, worst_b = 0;
          for (size_t i = 0; i < h1.size(); ++i) {
            diff += h1[i] != h0[i];
            worst = std::max(worst, double(std::fabs(bench::bf16_float(h1[i]) - bench::bf16_float(h0[i]))));
            worst_b = std::max(worst_b, double(std::fabs(bench::bf16_float(h1[i]) - bench::bf16_float(hb[i]))));
          }
          all_same = all_same && diff == 0;
          const double t = once ? 1.0 : bench::median_ms(s, [&] {
            f.fn(x.as<bf16>(), m, k, rs.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), sets, n, y1.as<bf16>(), s);
          });
          std::printf("  m %5lld  register A%s, %3d tokens x %3d ch%s %8.3f ms %6.1f TF/s %5.1f%%  (%.2fx bf16, %.2fx product)  %zu of %zu "
                      "outputs differ from the product's (max %.3g; vs bf16 GEMM %.3g)\n",
                      (long long)m, f.form == 2 ? " 2" : f.form == 3 ? " 3" : "  ", f.tn * f.nt, 64 * f.wgs, f.cl == 4 ? " x 4" : f.cl == 2 ? " x 2" : f.stages == 3 ? " 3st" : "    ", t, tf(t), 100 * tf(t) / hw.peak_bf16_tflops, t_inv / t, t_wg / t, diff, h1.size(), worst, worst_b);
          json::Value fr = json::Value::object();
          fr.add("ms", json::Value::number(t));
          fr.add("differ_from_product", json::Value::integer(int64_t(diff)));
          fr.add("max_abs_diff_product", json::Value::number(worst));
          r.add("rs" + std::string(f.form == 2 ? "2" : f.form == 3 ? "3" : "") + "_tn" + std::to_string(f.tn * f.nt) + "_ch" + std::to_string(64 * f.wgs) + (f.cl > 1 ? "_cl" + std::to_string(f.cl) : std::string()) + (f.stages == 3 ? "_st3" : ""), std::move(fr));
        }
        rows.arr.push_back(std::move(r));
      }
      shapes.arr.push_back(bench::shape_record(sh.name, n, k, std::move(rows)));
    }
    std::printf("\nregister-A forms against the product's bits: %s\n", all_same ? "all the same" : "SOME DIFFER");
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "", std::move(shapes));
    cudaStreamDestroy(s);
    if (!all_same) return 1;  // the forms must give the product's bits (same fp32 sums, same order)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_w4a16_rs: %s\n", e.what());
    return 1;
  }
  return 0;
}

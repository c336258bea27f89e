// The vision tower's attention (bidirectional within a frame, head dim 72 zero-padded to 80, 16
// heads: the 27B tower), kernel variants side by side (issue 19's 8 ms tower, issue 20's
// attention). Per shape (one 1024 x 768 image: 3,072 patches; one 2048 x 2048: 16,384; four
// 512 x 512 packed: 4 x 1,024), CUDA events, median of 20 after 3 warm-ups:
//   product            flash_attention_full, the engine's (128 queries x 64 keys per step, 8 warps:
//                      the variant bq128 bk64 exp2f won at e6656ed, whose product was bq64 bk64)
//   bq{64,128} bk{64,128} {exp2f, ex2.approx}
//                      this file's copy of its loop with the query tile (4 or 8 warps of 16 rows),
//                      the key step and the exponential as parameters; the exp2f variants at
//                      bk64 must equal the product bit for bit (the harness check)
//   wgmma bq128 bk128  Hopper warpgroup MMAs (see lab_wgmma_attn_k): S = Q K^T from shared
//                      memory, O += P V with P from registers, 3-stage cp.async ring
// Error is max |o - o_product| (the GPU tests hold the product to the CPU). Rates count the
// useful FLOPs (4 x frame^2 x 72 x heads per frame), for scale against the measured bf16 GEMM
// peak. Usage: clefrt_bench_vision_attn [--commit ID] [--json FILE]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool Fast>
__device__ __forceinline__ float ex2(float x) {
  if constexpr (Fast) return ex2_approx(x);
  else return exp2f(x);
}

template <int D, int BK, int WARPS>
struct LabSmem {
  static constexpr int LD = D + 8, BQ = WARPS * 16;
  static constexpr size_t bytes = sizeof(bf16) * size_t(BQ + 2 * BK) * LD;
};

template <int D, int BK, int WARPS, bool Fast>
__global__ void __launch_bounds__(WARPS * 32) lab_flash_k(const bf16* q, const bf16* k, const bf16* v, int Hq, AttnTiles tiles, bf16* out,
                                                          int dout, float scale_log2) {
  using S = LabSmem<D, BK, WARPS>;
  constexpr int LD = S::LD, BQ = S::BQ;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BQ * LD;
  bf16* Vs = Ks + BK * LD;
  const int tile = blockIdx.x, h = blockIdx.y;
  const int64_t q0 = tiles.q0[tile], seq0 = tiles.seq0[tile], end = tiles.end[tile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t ld = int64_t(Hq) * D;
  const bf16* kbase = k + int64_t(h) * D;
  const bf16* vbase = v + int64_t(h) * D;
  auto rows_valid = [](int64_t valid, int rows) { return int(valid < 0 ? 0 : valid > rows ? rows : valid); };
  load_tile_async(Qs, LD, q + (q0 * Hq + h) * D, ld, BQ, D, rows_valid(end - q0, BQ), D);
  load_tile_async(Ks, LD, kbase + seq0 * ld, ld, BK, D, rows_valid(end - seq0, BK), D);
  cp_async_commit();
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int64_t qi0 = q0 + warp * 16 + g, qi1 = qi0 + 8;
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
  const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;
  for (int64_t kb = seq0; kb < end; kb += BK) {
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async(Vs, LD, vbase + kb * ld, ld, BK, D, rows_valid(end - kb, BK), D);
    cp_async_commit();
    float s[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, Qs + (warp * 16 + lr) * LD + ks * 16 + lc);
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, Ks + (nt * 8 + kr) * LD + ks * 16 + kc);
        mma_bf16(s[nt], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_bf16(s[nt + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    const bool masked = kb + BK > end;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kj = kb + nt * 8 + 2 * tq + (e & 1);
        s[nt][e] = !masked || kj < end ? s[nt][e] * scale_log2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = ex2<Fast>(m0 - b0), c1 = ex2<Fast>(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0, rs1 = 0;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
      s[nt][0] = ex2<Fast>(s[nt][0] - b0);
      s[nt][1] = ex2<Fast>(s[nt][1] - b0);
      s[nt][2] = ex2<Fast>(s[nt][2] - b1);
      s[nt][3] = ex2<Fast>(s[nt][3] - b1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + rs0;
    l1 = l1 * c1 + rs1;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= c0;
      o[dn][1] *= c0;
      o[dn][2] *= c1;
      o[dn][3] *= c1;
    }
    cp_async_wait<0>();
    __syncthreads();
    if (kb + BK < end) {
      load_tile_async(Ks, LD, kbase + (kb + BK) * ld, ld, BK, D, rows_valid(end - (kb + BK), BK), D);
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 8; dn += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, Vs + (kk * 16 + lr) * LD + dn * 8 + lc);
        mma_bf16(o[dn], a0, a1, a2, a3, b[0], b[1]);
        mma_bf16(o[dn + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0 ? 1.0f / l0 : 0.0f, inv1 = l1 > 0 ? 1.0f / l1 : 0.0f;
  const int64_t ldo = int64_t(Hq) * dout;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int d = dn * 8 + 2 * tq;
    if (d >= dout) continue;
    if (qi0 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi0 * ldo + int64_t(h) * dout + d) = __floats2bfloat162_rn(o[dn][0] * inv0, o[dn][1] * inv0);
    if (qi1 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi1 * ldo + int64_t(h) * dout + d) = __floats2bfloat162_rn(o[dn][2] * inv1, o[dn][3] * inv1);
  }
}

// ---- the wgmma variant: Hopper warpgroup MMAs, FA3's intra-warpgroup overlap ----
// Per CTA 128 queries of one head and frame (two warpgroups of 64), keys in tiles of 128 through
// a 3-stage cp.async ring (one barrier a tile). Per warpgroup and key tile j:
//   S(j+1) = Q K(j+1)^T   5 x m64n128k16, both operands K-major in shared memory (128-byte
//                         swizzle, wgmma.cuh's layout; head dims 72..79 zero)
//   O += P(j) V(j)        8 x m64n72k16, P from registers (the S accumulators as bf16 A
//                         fragments), V MN-major (no swizzle: [8-dim block][key][8 dims])
// issued back to back; the exponentials of S(j+1) run while the tensor cores do P(j) V(j), then
// O is rescaled and S(j+1) becomes P(j+1). Lab only until it has run: the product's
// flash_attention_full is the reference it is measured against.
namespace wg {
constexpr int BQ = 128, BK = 128, THREADS = 256, STAGES = 3, QK_STEPS = 5;
static_assert(BQ == 2 * 64 && THREADS == 2 * 128, "two warpgroups of 64 queries");
static_assert(STAGES == 3, "the ring's arithmetic (step j loads tile j + 2)");
constexpr int PANEL = 128 * 128;           // 128 rows of 64 dims (128 bytes), swizzled
constexpr int Q_BYTES = 2 * PANEL;         // dims 0..63 | 64..79 (the second panel's rest unused)
constexpr int K_BYTES = 2 * PANEL;
constexpr int V_BLOCK = BK * 16;           // dims 8c..8c+7 of the tile's keys, 16 bytes a key
constexpr int V_BYTES = 9 * V_BLOCK;       // dims 0..71
constexpr int SMEM = Q_BYTES + STAGES * (K_BYTES + V_BYTES) + 1024;
static_assert(SMEM <= 232448, "shared memory per SM");
static_assert(V_BYTES % 1024 == 0 && K_BYTES % 1024 == 0, "tiles stay 1024-byte aligned");
}  // namespace wg

// The no-swizzle ("interleave") descriptor: core matrices of 8 rows x 16 bytes, contiguous. For
// an MN-major operand LBO is the stride between 8-row groups along K and SBO between 8-element
// blocks along M / N (CUTLASS's make_gmma_desc<Major::MN>, INTERLEAVE).
__device__ __forceinline__ uint64_t wgmma_desc_interleave(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem_u32(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

// D (64 x 72 fp32) (+)= A (64 x 16 bf16, registers: mma.sync's m16n8k16 A fragments, warp w rows
// 16 w ..) B (16 x 72, MN-major in shared memory: the transpose flag set).
__device__ __forceinline__ void wgmma_rs_n72_mn(float* d, const uint32_t* a, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, "
      "{%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
#else
  (void)d, (void)a, (void)db, (void)accumulate;
  __trap();
#endif
}

__device__ __forceinline__ void fence_u32(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// q / k / v rows `ld` elements apart per token, head h's dims at h * hs, dmem of them present
// (80: zero-padded, or 72: packed, dims 72..79 zero-filled here); out [token][heads][dout].
__global__ void __launch_bounds__(wg::THREADS, 1)
    lab_wgmma_attn_k(const bf16* q, const bf16* k, const bf16* v, int64_t ld, int hs, int dmem, AttnTiles tiles, bf16* out, int64_t ldo,
                     int dout, float scale_log2) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  using namespace wg;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* const Qs = smem;
  auto Ks = [&](int s) { return smem + Q_BYTES + s * K_BYTES; };
  auto Vs = [&](int s) { return smem + Q_BYTES + STAGES * K_BYTES + s * V_BYTES; };
  const int tile = int(blockIdx.x), h = int(blockIdx.y);
  const int64_t q0 = tiles.q0[tile], seq0 = tiles.seq0[tile], end = tiles.end[tile];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, wgi = tid >> 7, g = lane >> 2, t = lane & 3;
  const int nt = int((end - seq0 + BK - 1) / BK);

  // rows [r0, r0 + 128) of q or k: 10 chunks of 8 dims a row, consecutive threads along a row
  auto load_qk = [&](unsigned char* dst, const bf16* base, int64_t r0) {
    for (int i = tid; i < 128 * 10; i += THREADS) {
      const int r = i / 10, c = i - r * 10;
      const bool ok = r0 + r < end && c * 8 < dmem;
      cp_async16(dst + (c >> 3) * PANEL + swizzle128(r, c & 7), ok ? base + (r0 + r) * ld + int64_t(h) * hs + c * 8 : base, ok);
    }
  };
  // keys [r0, r0 + 128) of v, 9 chunks a key into the 8-dim blocks: a warp item is 8 keys x 4
  // chunks (64 contiguous bytes of each key read; 128 contiguous bytes of each block written)
  auto load_v = [&](unsigned char* dst, int64_t r0) {
    for (int it = warp; it < 16 * 3; it += THREADS / 32) {
      const int r = (it / 3) * 8 + (lane & 7), c = (it % 3) * 4 + (lane >> 3);
      if (c >= 9) continue;
      const bool ok = r0 + r < end;
      cp_async16(dst + c * V_BLOCK + r * 16, ok ? v + (r0 + r) * ld + int64_t(h) * hs + c * 8 : v, ok);
    }
  };
  load_qk(Qs, q, q0);
  load_qk(Ks(0), k, seq0);
  load_v(Vs(0), seq0);
  cp_async_commit();
  // Tiles 0 and 1 ahead; step j's barrier frees tile j - 1's stage for tile j + 2 (tile j's V and
  // tile j + 1's K are read in step j): one group a tile, empty past the last.
  for (int j = 1; j < STAGES - 1; ++j) {
    if (j < nt) {
      load_qk(Ks(j), k, seq0 + int64_t(j) * BK);
      load_v(Vs(j), seq0 + int64_t(j) * BK);
    }
    cp_async_commit();
  }

  // S is written by the QK^T wgmmas only, O by the P V ones and the rescale after their wait:
  // ptxas serializes every wgmma when another instruction writes an accumulator inside a
  // pipeline stage (C7515 under -Xptxas -v). P is double-buffered: P(j) is read by the tensor
  // cores while P(j+1) is written.
  float S[64], O[36];
  uint32_t Pa[32], Pb[32];
  auto fence_S = [&] {
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(S[i]);
  };
  auto fence_O = [&] {
#pragma unroll
    for (int i = 0; i < 36; ++i) fence_operand(O[i]);
  };
  auto fence_P = [&](uint32_t(&p)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_u32(p[i]);
  };
  auto issue_qk = [&](int stage) {
    const unsigned char* qa = Qs + wgi * 64 * 128;
    const unsigned char* kb = Ks(stage);
#pragma unroll
    for (int s = 0; s < QK_STEPS; ++s)
      wgmma_bf16<128>(S, wgmma_desc(qa + (s >> 2) * PANEL + (s & 3) * 32), wgmma_desc(kb + (s >> 2) * PANEL + (s & 3) * 32), s > 0);
  };
  auto issue_pv = [&](int stage, const uint32_t(&p)[32], bool acc) {
    const unsigned char* vb = Vs(stage);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) wgmma_rs_n72_mn(O, p + 4 * ks, wgmma_desc_interleave(vb + ks * 256, 128, V_BLOCK), acc || ks > 0);
  };
  // this thread's rows r0 = 16 (warp % 4) + g and r0 + 8 of the warpgroup's 64: running max m
  // (raw scores), sum l
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  // S (keys kb ..) -> the exponentials as P's bf16 A fragments (keys 16 ks .. 16 ks + 15: (g, 2t),
  // (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8) are accumulators 8 ks + 0/1, 2/3, 4/5, 6/7), their
  // fp32 row sums, and the factors that rescale O and l
  auto softmax = [&](int64_t kb, uint32_t(&p)[32], float& c0, float& c1, float& rs0, float& rs1) {
    const bool masked = kb + BK > end;
    auto sv = [&](int i) { return !masked || kb + 8 * (i / 4) + 2 * t + (i & 1) < end ? S[i] : -INFINITY; };
    float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      x0 = fmaxf(x0, fmaxf(sv(4 * j), sv(4 * j + 1)));
      x1 = fmaxf(x1, fmaxf(sv(4 * j + 2), sv(4 * j + 3)));
    }
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);  // finite: every tile holds a key of the frame
    c0 = m0 == -INFINITY ? 0.0f : ex2_approx((m0 - n0) * scale_log2);
    c1 = m1 == -INFINITY ? 0.0f : ex2_approx((m1 - n1) * scale_log2);
    m0 = n0;
    m1 = n1;
    const float b0 = n0 * scale_log2, b1 = n1 * scale_log2;
    rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      float e[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = ex2_approx(fmaf(sv(8 * ks + i), scale_log2, (i & 2) ? -b1 : -b0));
      rs0 += (e[0] + e[1]) + (e[4] + e[5]);
      rs1 += (e[2] + e[3]) + (e[6] + e[7]);
      p[4 * ks] = pack_bf16(e[0], e[1]);
      p[4 * ks + 1] = pack_bf16(e[2], e[3]);
      p[4 * ks + 2] = pack_bf16(e[4], e[5]);
      p[4 * ks + 3] = pack_bf16(e[6], e[7]);
    }
  };

  cp_async_wait<STAGES - 2>();  // tile 0 (with Q)
  fence_proxy_async();
  __syncthreads();
  wgmma_fence();
  issue_qk(0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_S();
  {
    float c0, c1;
    softmax(seq0, Pa, c0, c1, l0, l1);
  }
  // key tile j: P(j) in pc; S(j+1) and P(j+1) (into pn) when there is a tile j + 1
  auto step = [&](int j, uint32_t(&pc)[32], uint32_t(&pn)[32]) {
    const bool more = j + 1 < nt;
    // This thread's copies of tile j + 1 have landed (its group, committed in step j - 1 or the
    // prologue, is the newest); after the fence and the barrier everyone's have, and every
    // warpgroup is done with tile j - 1 (it waited for its P(j-1) V(j-1) before): its stage takes
    // tile j + 2.
    cp_async_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();
    if (j + 2 < nt) {
      load_qk(Ks((j + 2) % STAGES), k, seq0 + int64_t(j + 2) * BK);
      load_v(Vs((j + 2) % STAGES), seq0 + int64_t(j + 2) * BK);
    }
    cp_async_commit();
    fence_S();
    fence_O();
    fence_P(pc);
    // one fence per branch: a fence followed by a branch makes ptxas inject its own
    // warpgroup.arrive before the wgmmas (C7519 under -Xptxas -v)
    if (more) {
      wgmma_fence();
      issue_qk((j + 1) % STAGES);
      wgmma_commit();
      issue_pv(j % STAGES, pc, j > 0);
      wgmma_commit();
    } else {
      wgmma_fence();
      issue_pv(j % STAGES, pc, j > 0);
      wgmma_commit();
    }
    if (more) {
      wgmma_wait<1>();  // S(j+1); P(j) V(j) may still run
      fence_S();
      float c0, c1, rs0, rs1;
      softmax(seq0 + int64_t(j + 1) * BK, pn, c0, c1, rs0, rs1);
      wgmma_wait<0>();
      fence_O();
      fence_P(pc);
#pragma unroll
      for (int i = 0; i < 9; ++i) {
        O[4 * i] *= c0;
        O[4 * i + 1] *= c0;
        O[4 * i + 2] *= c1;
        O[4 * i + 3] *= c1;
      }
      l0 = l0 * c0 + rs0;
      l1 = l1 * c1 + rs1;
    } else {
      wgmma_wait<0>();
      fence_O();
      fence_P(pc);
    }
  };
  for (int j = 0; j < nt; j += 2) {
    step(j, Pa, Pb);
    if (j + 1 < nt) step(j + 1, Pb, Pa);
  }
  cp_async_wait_all();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0 ? 1.0f / l0 : 0.0f, inv1 = l1 > 0 ? 1.0f / l1 : 0.0f;
  const int64_t qi0 = q0 + wgi * 64 + (warp & 3) * 16 + g, qi1 = qi0 + 8;
#pragma unroll
  for (int i = 0; i < 9; ++i) {
    const int d = 8 * i + 2 * t;
    if (d >= dout) continue;
    if (qi0 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi0 * ldo + int64_t(h) * dout + d) = __floats2bfloat162_rn(O[4 * i] * inv0, O[4 * i + 1] * inv0);
    if (qi1 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi1 * ldo + int64_t(h) * dout + d) =
          __floats2bfloat162_rn(O[4 * i + 2] * inv1, O[4 * i + 3] * inv1);
  }
#endif
}

// Probes of the wgmma variant's P V step alone, against the host's products (small integers:
// exact): D (64 x 72) = A (64 x K) B (K x 72), A entering as m64nK accumulators (wgmma.cuh's
// layout) packed as the softmax packs P, B in [8-dim block][key][8 dims] with K * 16 bytes
// between blocks (the kernel's V_BLOCK at K = 128), K / 16 accumulating steps. K = 16: one
// instruction; K = 128: the kernel's whole tile. Tells a layout error apart from a pipeline one;
// `swapped` runs the descriptor with LBO and SBO exchanged, so that a wrong reading of the
// MN-major no-swizzle layout names its own fix.
template <int K>
__global__ void lab_probe_pv_k(const float* a, const float* b, float* d, bool swapped) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  constexpr int block = K * 16;
  __shared__ __align__(1024) unsigned char vb[9 * block];
  const int tid = int(threadIdx.x), lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < K * 72; i += 128) {
    const int key = i / 72, dim = i - key * 72;
    reinterpret_cast<bf16*>(vb + (dim / 8) * block + key * 16)[dim % 8] = __float2bfloat16(b[i]);
  }
  fence_proxy_async();
  __syncthreads();
  float s[K / 2];
#pragma unroll
  for (int i = 0; i < K / 2; ++i) s[i] = a[(16 * w + g + 8 * ((i >> 1) & 1)) * K + 8 * (i / 4) + 2 * t + (i & 1)];
  uint32_t p[K / 4];
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[4 * ks + r] = pack_bf16(s[8 * ks + 2 * r], s[8 * ks + 2 * r + 1]);
  float o[36];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks)
    wgmma_rs_n72_mn(o, p + 4 * ks, swapped ? wgmma_desc_interleave(vb + ks * 256, block, 128) : wgmma_desc_interleave(vb + ks * 256, 128, block),
                    ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 36; ++i) fence_operand(o[i]);
#pragma unroll
  for (int i = 0; i < 9; ++i) {
    const int c = 8 * i + 2 * t, r0 = 16 * w + g;
    d[r0 * 72 + c] = o[4 * i];
    d[r0 * 72 + c + 1] = o[4 * i + 1];
    d[(r0 + 8) * 72 + c] = o[4 * i + 2];
    d[(r0 + 8) * 72 + c + 1] = o[4 * i + 3];
  }
#endif
}

// max |D - A B| of a probe kernel (A 64 x K, B K x 72, D 64 x 72; small integers: exact) against
// the host's products (0: the layout and the fragments are as this file reads them)
double probe_pv(int K, void (*kernel)(const float*, const float*, float*, bool), bool swapped = false) {
  std::vector<float> a(size_t(64 * K)), b(size_t(K * 72)), want(64 * 72, 0.0f), got(64 * 72);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 11) - 5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 13) - 6);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 72; ++c)
      for (int kk = 0; kk < K; ++kk) want[size_t(r * 72 + c)] += a[size_t(r * K + kk)] * b[size_t(kk * 72 + c)];
  DeviceBuffer da(a.size() * 4, "probe a"), db(b.size() * 4, "probe b"), dd(got.size() * 4, "probe d");
  check(cudaMemcpy(da.get(), a.data(), a.size() * 4, cudaMemcpyHostToDevice), "up");
  check(cudaMemcpy(db.get(), b.data(), b.size() * 4, cudaMemcpyHostToDevice), "up");
  check(cudaMemset(dd.get(), 0xff, dd.bytes()), "NaN fill");
  kernel<<<1, 128>>>(da.as<float>(), db.as<float>(), dd.as<float>(), swapped);
  check_launch("lab wgmma probe");
  check(cudaMemcpy(got.data(), dd.get(), got.size() * 4, cudaMemcpyDeviceToHost), "down");
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    err = std::isfinite(e) ? std::max(err, e) : INFINITY;
  }
  return err;
}
double probe_rs_mn(bool swapped = false) { return probe_pv(16, lab_probe_pv_k<16>, swapped); }
double probe_pv_tile(bool swapped = false) { return probe_pv(wg::BK, lab_probe_pv_k<wg::BK>, swapped); }

// q / k / v [tokens, heads, dp] (dp 80: dims 72..79 zero, the lab's layout; 72: packed, the
// product's cuDNN layout), out [tokens, heads, dout]; tiles of wg::BQ queries
void launch_wgmma_dp(const bf16* q, const bf16* k, const bf16* v, int heads, int dp, const AttnTiles& t, bf16* out, int dout, cudaStream_t s) {
  if (dout != 72 || (dp != 72 && dp != 80)) {  // the kernel holds 9 blocks of 8 output dims
    std::fprintf(stderr, "launch_wgmma_dp: head dim 72 only (dp %d, dout %d)\n", dp, dout);
    std::abort();
  }
  static const bool attr = [] {
    check(cudaFuncSetAttribute(lab_wgmma_attn_k, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM), "smem");
    return true;
  }();
  (void)attr;
  const float scale_log2 = float(1.0 / std::sqrt(double(dout)) * 1.4426950408889634);
  lab_wgmma_attn_k<<<dim3(unsigned(t.n), unsigned(heads)), wg::THREADS, wg::SMEM, s>>>(q, k, v, int64_t(heads) * dp, dp, 72, t, out,
                                                                                       int64_t(heads) * dout, dout, scale_log2);
  check_launch("lab wgmma attention");
}
void launch_wgmma(const bf16* q, const bf16* k, const bf16* v, int heads, const AttnTiles& t, bf16* out, int dout, cudaStream_t s) {
  launch_wgmma_dp(q, k, v, heads, 80, t, out, dout, s);
}

// Per frame, tiles of bq queries: q0, seq0, end.
std::vector<int32_t> make_tiles(const std::vector<int64_t>& frames, int64_t bq, int64_t& n) {
  std::vector<int32_t> a, b, c;
  int64_t f0 = 0;
  for (int64_t f : frames) {
    for (int64_t t = f0; t < f0 + f; t += bq) {
      a.push_back(int32_t(t));
      b.push_back(int32_t(f0));
      c.push_back(int32_t(f0 + f));
    }
    f0 += f;
  }
  n = int64_t(a.size());
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

struct Variant {
  std::string name;
  int bq;
  void (*launch)(const bf16*, const bf16*, const bf16*, int, const AttnTiles&, bf16*, int, cudaStream_t);
};

template <int BK, int WARPS, bool Fast>
void launch_lab(const bf16* q, const bf16* k, const bf16* v, int heads, const AttnTiles& t, bf16* out, int dout, cudaStream_t s) {
  constexpr int D = 80;
  using S = LabSmem<D, BK, WARPS>;
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(lab_flash_k<D, BK, WARPS, Fast>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::bytes)), "smem");
    attr = true;
  }
  const float scale_log2 = float(1.0 / std::sqrt(double(dout)) * 1.4426950408889634);
  lab_flash_k<D, BK, WARPS, Fast><<<dim3(unsigned(t.n), unsigned(heads)), WARPS * 32, S::bytes, s>>>(q, k, v, heads, t, out, dout, scale_log2);
  check_launch("lab flash");
}

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  const HardwareLimits hw = bench::measure_and_print_hardware();
  const int heads = 16, hd = 72, Dp = int(flash_attention_full_padded(hd));
  const double probe = probe_rs_mn(), probe_tile = probe_pv_tile();
  std::printf("wgmma probe (the kernel's whole P V of one key tile: 8 k steps, V_BLOCK blocks): max |D - A B| = %g\n", probe_tile);
  std::printf("wgmma probe (P V's m64n72k16, A in registers, B MN-major without swizzle): max |D - A B| = %g%s\n", probe,
              probe == 0 ? "" : "  (a layout or fragment error: the wgmma variant's figures below mean nothing)");
  if (probe != 0 || probe_tile != 0)  // the other reading of the descriptor's two strides
    std::printf("wgmma probes with LBO and SBO exchanged: one step %g, the tile %g (0: exchange them in the kernel)\n", probe_rs_mn(true),
                probe_pv_tile(true));
  const std::vector<Variant> variants = {
      {"bq64 bk64 exp2f", 64, launch_lab<64, 4, false>},   {"bq64 bk64 ex2.approx", 64, launch_lab<64, 4, true>},
      {"bq64 bk128 exp2f", 64, launch_lab<128, 4, false>}, {"bq64 bk128 ex2.approx", 64, launch_lab<128, 4, true>},
      {"bq128 bk64 exp2f", 128, launch_lab<64, 8, false>}, {"bq128 bk64 ex2.approx", 128, launch_lab<64, 8, true>},
      {"bq128 bk128 exp2f", 128, launch_lab<128, 8, false>}, {"bq128 bk128 ex2.approx", 128, launch_lab<128, 8, true>},
      {"wgmma bq128 bk128", 128, launch_wgmma},
  };
  struct Shape {
    const char* name;
    std::vector<int64_t> frames;
  };
  const std::vector<Shape> shapes = {{"1x3072 (1024x768)", {3072}}, {"1x16384 (2048x2048)", {16384}}, {"4x1024 (512x512)", {1024, 1024, 1024, 1024}}};
  json::Value res = json::Value::object();
  res.add("wgmma_probe_max_abs_err", json::Value::number(probe));
  res.add("wgmma_probe_tile_max_abs_err", json::Value::number(probe_tile));
  cudaStream_t st;
  check(cudaStreamCreate(&st), "stream");
  for (const Shape& sh : shapes) {
    int64_t L = 0;
    double flops = 0;
    for (int64_t f : sh.frames) {
      L += f;
      flops += 4.0 * double(f) * double(f) * hd * heads;
    }
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16> hq(size_t(L * heads * Dp)), hk(hq.size()), hv(hq.size());
    for (size_t i = 0; i < hq.size(); ++i) {
      const bool pad = int64_t(i % size_t(Dp)) >= hd;
      hq[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
      hk[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
      hv[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
    }
    DeviceBuffer q(hq.size() * 2, "q"), k(hq.size() * 2, "k"), v(hq.size() * 2, "v"), o(size_t(L * heads * hd) * 2, "o"),
        ref(size_t(L * heads * hd) * 2, "ref");
    check(cudaMemcpy(q.get(), hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "up");
    check(cudaMemcpy(k.get(), hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "up");
    check(cudaMemcpy(v.get(), hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "up");
    auto tiles_for = [&](int64_t bq, DeviceBuffer& buf) {
      int64_t n = 0;
      const std::vector<int32_t> t = make_tiles(sh.frames, bq, n);
      buf = DeviceBuffer(t.size() * 4, "tiles");
      check(cudaMemcpy(buf.get(), t.data(), t.size() * 4, cudaMemcpyHostToDevice), "up");
      return AttnTiles{buf.as<int32_t>(), buf.as<int32_t>() + n, buf.as<int32_t>() + 2 * n, n};
    };
    DeviceBuffer t64b, t128b;
    const AttnTiles t64 = tiles_for(64, t64b), t128 = tiles_for(128, t128b);
    std::vector<bf16> want(size_t(L * heads * hd)), got(want.size());
    const AttnTiles& tp = flash_attention_full_tile() == 128 ? t128 : t64;
    const double pms = bench::median_ms(st, [&] { flash_attention_full(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), heads, hd, tp, ref.as<bf16>(), st); });
    check(cudaMemcpy(want.data(), ref.get(), want.size() * 2, cudaMemcpyDeviceToHost), "down");
    std::printf("%-22s %-24s %9.3f ms %7.1f TFLOP/s %5.1f%% of peak\n", sh.name, "product", pms, flops / (pms * 1e-3) / 1e12,
                100.0 * flops / (pms * 1e-3) / 1e12 / hw.peak_bf16_tflops);
    json::Value per = json::Value::object();
    per.add("product_ms", json::Value::number(pms));
    // one variant: ms, the rate, and its largest difference from the product (NaN: an output not
    // written, or a broken variant; the output starts as NaN)
    auto measure = [&](const std::string& name, const std::function<void()>& run) {
      check(cudaMemset(o.get(), 0xff, o.bytes()), "NaN fill");
      const double ms = bench::median_ms(st, run);
      check(cudaMemcpy(got.data(), o.get(), got.size() * 2, cudaMemcpyDeviceToHost), "down");
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(__bfloat162float(got[i])) - double(__bfloat162float(want[i])));
        if (!(e <= err)) err = e;
      }
      const double tf = flops / (ms * 1e-3) / 1e12;
      std::printf("%-22s %-24s %9.3f ms %7.1f TFLOP/s %5.1f%% of peak  max |o - o_product| %.3g\n", sh.name, name.c_str(), ms, tf,
                  100.0 * tf / hw.peak_bf16_tflops, err);
      json::Value r = json::Value::object();
      r.add("ms", json::Value::number(ms));
      r.add("tflops", json::Value::number(tf));
      r.add("max_abs_diff_vs_product", json::Value::number(err));
      per.add(name, r);
    };
    for (const Variant& var : variants) {
      const AttnTiles& t = var.bq == 64 ? t64 : t128;
      measure(var.name, [&] { var.launch(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), heads, t, o.as<bf16>(), hd, st); });
    }
    {  // the wgmma variant on packed heads (72 apart: the product's cuDNN layout)
      DeviceBuffer qp(size_t(L * heads * hd) * 2, "packed q"), kp(qp.bytes(), "packed k"), vp(qp.bytes(), "packed v");
      for (auto [from, to] : {std::pair{&q, &qp}, {&k, &kp}, {&v, &vp}})
        check(cudaMemcpy2D(to->get(), size_t(hd) * 2, from->get(), size_t(Dp) * 2, size_t(hd) * 2, size_t(L * heads), cudaMemcpyDeviceToDevice),
              "pack");
      measure("wgmma packed heads", [&] { launch_wgmma_dp(qp.as<bf16>(), kp.as<bf16>(), vp.as<bf16>(), heads, hd, t128, o.as<bf16>(), hd, st); });
    }
    res.add(sh.name, per);
  }
  if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_vision_attn", std::move(res));
  cudaStreamDestroy(st);
  return 0;
}

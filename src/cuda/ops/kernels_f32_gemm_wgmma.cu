// y[m, n] (+)= x[m, k] w[n, k]^T in fp32 on Hopper's warpgroup MMA (sm_90a): f32_gemm_3xtf32's
// three TF32 products a_hi b_hi + a_hi b_lo + a_lo b_hi (gdn_tiles.cuh's split_tf32), with w given
// as its hi / lo planes, split once at load (f32_split_tf32_planes), and x split as the threads
// read it. Why: the mma.sync form (kernels_f32_gemm.cu) spends most of its issue slots splitting
// both operands and loading them 4 bytes at a time; here B reaches the tensor cores from shared
// memory as it landed, and a thread splits 16 values of A a k step for 12 wgmmas.
//
// Sums: per element, k in 8-wide steps in k order into three accumulators, each step lo*hi, hi*lo,
// hi*hi, and d + (e1 + e2) at the end: the mma.sync form's operations. A row's result does not
// depend on m nor on the tile (BN columns, WGS warpgroups of 64 rows), which follows m (the GPU
// test holds every form to the same bits; it also found them equal to the mma.sync form's).
//
// A CTA: WGS warpgroups, one 64-row slice of x each, sharing the B tile; k in 32-wide steps
// through kStages stages of cp.async copies: A as padded rows (36 floats: a warp's fragment loads
// hit 32 banks), B's hi and lo planes as K-major 128-byte-swizzled tiles (wgmma.cuh's layout, one
// 128-byte row a column of w). A step: split A's fragments into registers, 12 wgmmas (4 k8 steps x
// 3 products). Pipelined (64-column tiles), step s + 1's split runs while step s's wgmmas do;
// step by step (64 x 32 tiles, small m), each step waits for its wgmmas and the SM's other CTAs
// keep the tensor cores busy meanwhile. Optionally a bias added as the element is written.
#include <cstdint>
#include <string>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {

namespace {

using gdn::split_tf32;

constexpr int BK = 32, kStages = 4, LDA = BK + 4;

template <int BN, int WGS>
struct Tf32Tile {
  static constexpr int BM = 64 * WGS, threads = 128 * WGS;
  static constexpr int b_bytes = BN * BK * 4;   // one plane's tile: BN rows of 128 bytes (a multiple of 1024)
  static constexpr int a_bytes = BM * LDA * 4;  // padded rows
  static constexpr int bytes = kStages * (2 * b_bytes + a_bytes) + 1024;  // + alignment slack
  static_assert(BN % 32 == 0 && (BM * 8) % threads == 0 && (2 * BN * 8) % threads == 0, "whole copies a thread");
};

template <int BN, int WGS, bool PIPE>
__global__ void __launch_bounds__(128 * WGS) f32_gemm_3xtf32_wgmma_k(const float* __restrict__ x, int64_t ldx, const float* __restrict__ whi,
                                                                     const float* __restrict__ wlo, int64_t ldw, float* __restrict__ y,
                                                                     int64_t ldy, int64_t m, int64_t n, int64_t k, bool accumulate,
                                                                     const float* __restrict__ bias) {
  using T = Tf32Tile<BN, WGS>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  float* const As = reinterpret_cast<float*>(smem + kStages * 2 * T::b_bytes);  // kStages x [BM][LDA], after the B planes
  const int tid = int(threadIdx.x), wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * T::BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t steps = (k + BK - 1) / BK;

  // step s's tiles into their stage (rows past m / n and k past its end zero-filled; k % 4 == 0,
  // so a 16-byte copy is whole or absent); past the last step an empty group, so every wait
  // below counts the same
  auto load = [&](int64_t s) {
    if (s < steps) {
      const int stage = int(s % kStages);
      const int64_t k0 = s * BK;
      float* A = As + stage * T::BM * LDA;
      unsigned char* B = smem + stage * 2 * T::b_bytes;  // hi tile, then lo
#pragma unroll
      for (int i = 0; i < T::BM * 8 / T::threads; ++i) {
        const int c = tid + T::threads * i, r = c >> 3, kc = (c & 7) * 4;
        const bool ok = m0 + r < m && k0 + kc < k;
        cp_async16(&A[r * LDA + kc], ok ? x + (m0 + r) * ldx + k0 + kc : x, ok);
      }
#pragma unroll
      for (int i = 0; i < 2 * BN * 8 / T::threads; ++i) {
        const int c = tid + T::threads * i, plane = c / (BN * 8), r = (c % (BN * 8)) >> 3, ch = c & 7;
        const bool ok = n0 + r < n && k0 + ch * 4 < k;
        const float* src = plane ? wlo : whi;
        cp_async16(B + plane * T::b_bytes + swizzle128(r, ch), ok ? src + (n0 + r) * ldw + k0 + ch * 4 : src, ok);
      }
    }
    cp_async_commit();
  };

  float d[BN / 2], e1[BN / 2], e2[BN / 2];  // hi*hi, lo*hi, hi*lo; the first step's wgmmas write them
  // step s's A fragments into registers, split
  auto split = [&](int64_t s, uint32_t (&ah)[4][4], uint32_t (&al)[4][4]) {
    const float* A = As + int(s % kStages) * T::BM * LDA + (64 * wg + 16 * warp) * LDA;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float* a = A + 8 * kk + t;
      split_tf32(a[g * LDA], ah[kk][0], al[kk][0]);
      split_tf32(a[(g + 8) * LDA], ah[kk][1], al[kk][1]);
      split_tf32(a[g * LDA + 4], ah[kk][2], al[kk][2]);
      split_tf32(a[(g + 8) * LDA + 4], ah[kk][3], al[kk][3]);
    }
  };
  // step s's 12 wgmmas, one commit group
  auto mma = [&](int64_t s, const uint32_t (&ah)[4][4], const uint32_t (&al)[4][4]) {
    const unsigned char* B = smem + int(s % kStages) * 2 * T::b_bytes;
    const bool acc = s > 0;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t bh = wgmma_desc(B + 32 * kk), bl = wgmma_desc(B + T::b_bytes + 32 * kk);
      wgmma_tf32_rs<BN>(e1, al[kk], bh, acc || kk > 0);
      wgmma_tf32_rs<BN>(e2, ah[kk], bl, acc || kk > 0);
      wgmma_tf32_rs<BN>(d, ah[kk], bh, acc || kk > 0);
    }
    wgmma_commit();
  };
  // A fragments stay live (unchanged registers) until the wgmmas reading them are done
  auto keep = [](uint32_t (&ah)[4][4], uint32_t (&al)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      asm volatile("" : "+r"(ah[kk][0]), "+r"(ah[kk][1]), "+r"(ah[kk][2]), "+r"(ah[kk][3]), "+r"(al[kk][0]), "+r"(al[kk][1]), "+r"(al[kk][2]),
                   "+r"(al[kk][3])::"memory");
  };
  if constexpr (!PIPE) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) load(s);
    for (int64_t s = 0; s < steps; ++s) {
      cp_async_wait<kStages - 2>();  // step s's copies landed (this thread's)
      fence_proxy_async();           // and are visible to the wgmmas' reads
      __syncthreads();               // everyone's; every warpgroup's step s - 1 wgmmas are done: its stage is free
      load(s + kStages - 1);         // into that stage
      uint32_t ah[4][4], al[4][4];
      split(s, ah, al);
      mma(s, ah, al);
      wgmma_wait<0>();
      keep(ah, al);
    }
  } else {
    // Step s + 1's fragments are split while step s's wgmmas run: two register sets (r0 for even
    // steps, r1 for odd), one commit group in flight across each split. Copies run two steps
    // ahead: the stage of the step in flight is not free, so a step's load goes to the stage of
    // the step before it.
    auto ready = [&](int64_t s) {
      cp_async_wait<kStages - 3>();  // step s's copies landed (this thread's)
      fence_proxy_async();           // and are visible to the wgmmas' reads
      __syncthreads();               // everyone's; every warpgroup's step s - 2 wgmmas are done: its stage is free
      load(s + kStages - 2);         // into that stage
    };
    uint32_t r0h[4][4], r0l[4][4], r1h[4][4], r1l[4][4];
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) load(s);
    ready(0);
    split(0, r0h, r0l);
    for (int64_t s = 0; s < steps; s += 2) {
      mma(s, r0h, r0l);
      wgmma_wait<1>();  // step s - 1 done: r1 free
      keep(r1h, r1l);
      if (s + 1 >= steps) break;
      ready(s + 1);
      split(s + 1, r1h, r1l);
      mma(s + 1, r1h, r1l);
      wgmma_wait<1>();  // step s done: r0 free
      keep(r0h, r0l);
      if (s + 2 >= steps) break;
      ready(s + 2);
      split(s + 2, r0h, r0l);
    }
    wgmma_wait<0>();
    keep(r0h, r0l);
    keep(r1h, r1l);
  }
  cp_async_wait_all();  // no copy outlives the CTA (the trailing groups are empty)
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fence_operand(d[i]), fence_operand(e1[i]), fence_operand(e2[i]);
  // d[4j .. 4j + 3]: rows 16 warp + g and + 8, columns 8j + 2t and + 1
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + 64 * wg + 16 * warp + g + 8 * h, col = n0 + 8 * j + 2 * t;
      if (row >= m) continue;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (col + c >= n) continue;
        const int i = 4 * j + 2 * h + c;
        const float v = d[i] + (e1[i] + e2[i]);
        float* out = y + row * ldy + col + c;
        const float o = accumulate ? *out + v : v;
        *out = bias ? o + bias[col + c] : o;
      }
    }
}

template <int BN, int WGS, bool PIPE>
void launch_form(const float* x, int64_t ldx, int64_t m, int64_t k, const float* whi, const float* wlo, int64_t ldw, int64_t n, float* y, int64_t ldy,
                 bool accumulate, const float* bias, cudaStream_t s) {
  using T = Tf32Tile<BN, WGS>;
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(f32_gemm_3xtf32_wgmma_k<BN, WGS, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::bytes),
          "f32_gemm_3xtf32_wgmma smem");
    attr = true;
  }
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + T::BM - 1) / T::BM));
  f32_gemm_3xtf32_wgmma_k<BN, WGS, PIPE><<<grid, T::threads, T::bytes, s>>>(x, ldx, whi, wlo, ldw, y, ldy, m, n, k, accumulate, bias);
  check_launch("f32_gemm_3xtf32_wgmma");
}

int g_form = 0;         // f32_gemm_3xtf32_wgmma_set_form
bool g_pipelined = true;  // f32_gemm_3xtf32_wgmma_set_pipelined

template <int BN, int WGS>
void launch(const float* x, int64_t ldx, int64_t m, int64_t k, const float* whi, const float* wlo, int64_t ldw, int64_t n, float* y, int64_t ldy,
            bool accumulate, const float* bias, cudaStream_t s) {
  // 64 x 32 tiles run where m is small (the blog's memory_projection: ~1.2 CTAs an SM): there the
  // pipelined form's copies, two steps ahead instead of three, made it slower
  // (bench/results/2026-12-07-h100-session49.md)
  if constexpr (BN != 32) {
    if (g_pipelined) return launch_form<BN, WGS, true>(x, ldx, m, k, whi, wlo, ldw, n, y, ldy, accumulate, bias, s);
  }
  launch_form<BN, WGS, false>(x, ldx, m, k, whi, wlo, ldw, n, y, ldy, accumulate, bias, s);
}

__global__ void split_tf32_planes_k(const float* __restrict__ w, int64_t count, float* __restrict__ hi, float* __restrict__ lo) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h, l;
    split_tf32(w[i], h, l);
    hi[i] = __uint_as_float(h);
    lo[i] = __uint_as_float(l);
  }
}

}  // namespace

bool f32_gemm_3xtf32_wgmma_available() { return sm90a_kernels_run_here(); }

void f32_split_tf32_planes(const float* w, int64_t count, float* hi, float* lo, cudaStream_t s) {
  if (count == 0) return;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4096);
  split_tf32_planes_k<<<unsigned(blocks), 256, 0, s>>>(w, count, hi, lo);
  check_launch("f32_split_tf32_planes");
}

void f32_gemm_3xtf32_wgmma_set_form(int form) {
  if (form != 0 && form != 321 && form != 641 && form != 642)
    throw Error(Status::Internal, "internal_error", "f32_gemm_3xtf32_wgmma_set_form: " + std::to_string(form) + " (0, 321, 641 or 642)");
  g_form = form;
}

void f32_gemm_3xtf32_wgmma_set_pipelined(bool on) { g_pipelined = on; }

bool f32_gemm_3xtf32_wgmma_fits(const float* x, int64_t ldx, int64_t k, const float* whi, const float* wlo, int64_t ldw) {
  return f32_gemm_3xtf32_fits(x, ldx, k, whi, ldw) && aligned16(wlo);
}

void f32_gemm_3xtf32_wgmma(const float* x, int64_t ldx, int64_t m, int64_t k, const float* whi, const float* wlo, int64_t ldw, int64_t n,
                           float* y, int64_t ldy, bool accumulate, cudaStream_t s, const float* bias) {
  if (m == 0 || n == 0) return;
  if (!f32_gemm_3xtf32_wgmma_available())
    throw Error(Status::Internal, "internal_error", "f32_gemm_3xtf32_wgmma: needs an sm_90a build on a compute capability 9.0 GPU");
  if (!f32_gemm_3xtf32_wgmma_fits(x, ldx, k, whi, wlo, ldw))
    throw Error(Status::Internal, "internal_error",
                "f32_gemm_3xtf32_wgmma: k, the row strides and the pointers must allow 16-byte copies (k " + std::to_string(k) + ", ldx " +
                    std::to_string(ldx) + ", ldw " + std::to_string(ldw) + ")");
  // 128 x 64 tiles (two warpgroups sharing B's tile) where they fill 70% of the SMs once (the
  // blog's k | v, m 318 n 2,048: 96 CTAs, faster than 160 of 64 x 64), else 64 x 64 where those
  // fill them, else 64 x 32 (the blog's memory_projection, m 318 n 1,024); the same bits
  const int64_t sms = sm_count(), mt64 = (m + 63) / 64, nt64 = (n + 63) / 64;
  const bool by_grid = g_form == 0;
  if (g_form == 642 || (by_grid && 10 * ((m + 127) / 128) * nt64 >= 7 * sms)) launch<64, 2>(x, ldx, m, k, whi, wlo, ldw, n, y, ldy, accumulate, bias, s);
  else if (g_form == 641 || (by_grid && mt64 * nt64 >= sms)) launch<64, 1>(x, ldx, m, k, whi, wlo, ldw, n, y, ldy, accumulate, bias, s);
  else launch<32, 1>(x, ldx, m, k, whi, wlo, ldw, n, y, ldy, accumulate, bias, s);
}

}  // namespace clefrt::cuda

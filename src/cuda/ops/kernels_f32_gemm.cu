// y[m, n] (+)= x[m, k] w[n, k]^T in fp32 on tensor cores: TF32 mma.sync m16n8k8 with the 3xTF32
// split (gdn_tiles.cuh's split_tf32 / mma_tf32: a_hi b_hi + a_hi b_lo + a_lo b_hi, fp32-level
// products, as the GDN preps' 3xTF32 path), for the joint head's Linears over all token rows
// (memory_projection, the memories' k | v). Why: cuBLASLt's batch-invariant fp32 algorithm (CUDA
// cores) ran them at ~12 TFLOP/s at the blog size, 0.93 ms of a 34 ms request
// (bench/results/2026-12-05-h100-session29.md).
//
// Batch invariance: an output element is its row's and column's dot product over k in 8-wide MMA
// steps in k order, three accumulators (hi*hi, lo*hi, hi*lo) summed once at the end; the other
// rows, m and the row's place in its tile change none of it.
//
// Tiles: a CTA of 4 warps (2 x 2) computes BM rows x BN columns (64 x 64; 64 x 32 where 64-wide
// tiles would leave SMs idle; 32 x 32 where even those would: the tile changes no element's
// operations), a warp BM / 2 x BN / 2 (BM / 32 m16 x BN / 16 n8 MMA tiles); k in 32-wide steps
// through shared memory, kStages stages of cp.async copies in flight (with two, each step waited
// out a whole global load: the token-row GEMMs at the blog size are latency-bound). Rows of x and w
// are 16-byte copies: k % 4 == 0 and 16-byte aligned rows (f32_gemm_3xtf32_fits).
#include <cstdint>
#include <string>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {

namespace {

using gdn::mma_tf32;
using gdn::split_tf32;

constexpr int BK = 32, kStages = 4;
constexpr int LDS = BK + 4;  // a tile row in floats: fragment loads (8 rows x 4 k) hit 32 banks
template <int BM, int BN>
constexpr size_t smem_bytes() {
  return sizeof(float) * size_t(kStages) * (BM + BN) * LDS;
}

template <int BM, int BN>
__global__ void __launch_bounds__(128) f32_gemm_3xtf32_k(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w, int64_t ldw,
                                                        float* __restrict__ y, int64_t ldy, int64_t m, int64_t n, int64_t k, bool accumulate) {
  constexpr int NJ = BN / 16, MI = BM / 32;  // n8 and m16 tiles a warp
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                          // kStages x [BM][LDS]
  float* Bs = smem + kStages * BM * LDS;     // kStages x [BN][LDS]
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t steps = (k + BK - 1) / BK;

  // step s's tiles into their stage: BM (BN) rows x 32 floats of x (w), 16-byte copies; rows past
  // m / n and k past its end zero-filled (k % 4 == 0: a copy is whole or absent). Past the last
  // step an empty group, so every wait below counts the same.
  auto load = [&](int64_t s) {
    if (s < steps) {
      const int stage = int(s % kStages);
      const int64_t k0 = s * BK;
      float* A = As + stage * BM * LDS;
      float* B = Bs + stage * BN * LDS;
#pragma unroll
      for (int i = 0; i < BM * BK / 4 / 128; ++i) {
        const int c = tid + 128 * i, r = c / (BK / 4), kc = (c % (BK / 4)) * 4;
        const bool xa = m0 + r < m && k0 + kc < k;
        cp_async16(&A[r * LDS + kc], xa ? x + (m0 + r) * ldx + k0 + kc : x, xa);
      }
#pragma unroll
      for (int i = 0; i < BN * BK / 4 / 128; ++i) {
        const int c = tid + 128 * i, r = c / (BK / 4), kc = (c % (BK / 4)) * 4;
        const bool wa = n0 + r < n && k0 + kc < k;
        cp_async16(&B[r * LDS + kc], wa ? w + (n0 + r) * ldw + k0 + kc : w, wa);
      }
    }
    cp_async_commit();
  };

  // d: hi*hi, e1: lo*hi, e2: hi*lo, per (m16 tile i, n8 tile j)
  float d[MI][NJ][4] = {}, e1[MI][NJ][4] = {}, e2[MI][NJ][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load(s);
  for (int64_t s = 0; s < steps; ++s) {
    cp_async_wait<kStages - 2>();  // step s's copies landed (this thread's)
    __syncthreads();               // everyone's; and step s - 1's stage, read by all, is free again
    load(s + kStages - 1);         // into that stage
    const int st = int(s % kStages);
    const float* A = As + st * BM * LDS + (BM / 2 * wm) * LDS;
    const float* B = Bs + st * BN * LDS + (BN / 2 * wn) * LDS;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      uint32_t ah[MI][4], al[MI][4], bh[NJ][2], bl[NJ][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const float* a = A + (16 * i) * LDS + kk;
        split_tf32(a[g * LDS + t], ah[i][0], al[i][0]);
        split_tf32(a[(g + 8) * LDS + t], ah[i][1], al[i][1]);
        split_tf32(a[g * LDS + t + 4], ah[i][2], al[i][2]);
        split_tf32(a[(g + 8) * LDS + t + 4], ah[i][3], al[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float* b = B + (8 * j + g) * LDS + kk;  // B(k, c) = w[c][k]: column g of the n8 tile
        split_tf32(b[t], bh[j][0], bl[j][0]);
        split_tf32(b[t + 4], bh[j][1], bl[j][1]);
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          mma_tf32(e1[i][j], al[i], bh[j]);
          mma_tf32(e2[i][j], ah[i], bl[j]);
          mma_tf32(d[i][j], ah[i], bh[j]);
        }
    }
  }
  cp_async_wait_all();  // no copy outlives the CTA (the trailing groups are empty)
  // d[i][j]: rows BM / 2 wm + 16 i + g (+ 8), columns BN / 2 wn + 8 j + 2 t (+ 1)
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + BM / 2 * wm + 16 * i + g + 8 * h, col = n0 + BN / 2 * wn + 8 * j + 2 * t;
        if (row >= m) continue;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (col + c >= n) continue;
          const float v = d[i][j][2 * h + c] + (e1[i][j][2 * h + c] + e2[i][j][2 * h + c]);
          float* out = y + row * ldy + col + c;
          *out = accumulate ? *out + v : v;
        }
      }
}

template <int BM, int BN>
void launch(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t ldw, int64_t n, float* y, int64_t ldy, bool accumulate,
            cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(f32_gemm_3xtf32_k<BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes<BM, BN>())),
          "f32_gemm_3xtf32 smem");
    attr = true;
  }
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM));
  f32_gemm_3xtf32_k<BM, BN><<<grid, 128, smem_bytes<BM, BN>(), s>>>(x, ldx, w, ldw, y, ldy, m, n, k, accumulate);
  check_launch("f32_gemm_3xtf32");
}

int g_tile = 0;  // f32_gemm_3xtf32_set_tile

}  // namespace

void f32_gemm_3xtf32_set_tile(int tile) {
  if (tile != 0 && tile != 32 && tile != 64 && tile != 3232)
    throw Error(Status::Internal, "internal_error", "f32_gemm_3xtf32_set_tile: " + std::to_string(tile) + " (0, 32, 64 or 3232)");
  g_tile = tile;
}

bool f32_gemm_3xtf32_fits(const float* x, int64_t ldx, int64_t k, const float* w, int64_t ldw) {
  return k > 0 && k % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && aligned16(x) && aligned16(w);
}

void f32_gemm_3xtf32(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t ldw, int64_t n, float* y, int64_t ldy,
                     bool accumulate, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  if (!f32_gemm_3xtf32_fits(x, ldx, k, w, ldw))
    throw Error(Status::Internal, "internal_error",
                "f32_gemm_3xtf32: k, the row strides and the pointers must allow 16-byte copies (k " + std::to_string(k) + ", ldx " +
                    std::to_string(ldx) + ", ldw " + std::to_string(ldw) + ")");
  // 64 x 64 tiles where they give every SM two CTAs, else 64 x 32 where those do, else 32 x 32
  // (the blog's memory_projection, m 318 n 1,024: bench/results/2026-12-06-h100-session45.md);
  // the same bits either way
  const int64_t sms2 = 2 * int64_t(sm_count()), tiles64 = ((n + 63) / 64) * ((m + 63) / 64), tiles32 = ((n + 31) / 32) * ((m + 63) / 64);
  const bool by_grid = g_tile == 0;
  if (g_tile == 3232 || (by_grid && tiles32 < sms2)) launch<32, 32>(x, ldx, m, k, w, ldw, n, y, ldy, accumulate, s);
  else if (g_tile == 32 || (by_grid && tiles64 < sms2)) launch<64, 32>(x, ldx, m, k, w, ldw, n, y, ldy, accumulate, s);
  else launch<64, 64>(x, ldx, m, k, w, ldw, n, y, ldy, accumulate, s);
}

}  // namespace clefrt::cuda

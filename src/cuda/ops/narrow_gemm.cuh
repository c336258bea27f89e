// A warp's share of narrow_gemm (kernels.h): 16 rows x all n = 8 NT columns of one k slice, for
// the product's split-k kernel (kernels_narrow_gemm.cu) and the lab's other forms
// (dev/cuda/narrow_gemm.cu), so that they sum alike.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"

namespace clefrt::cuda {
namespace {

// acc[j][0..3] = sum over k in [k0, k0 + 16 steps) of x[r, k] w[c, k] for rows r0 + g, r0 + g + 8
// and columns 8 j + 2 t, + 1 (mma.sync m16n8k16's accumulator layout: lane = 4 g + t): bf16 in,
// fp32 sums, steps in order. Fragments come from global memory as 32-bit words (w's slice stays in
// L1 across a CTA's warps), UNROLL steps' loads issued before their MMAs. Rows past m read as zero.
template <int NT, int UNROLL>
__device__ __forceinline__ void narrow_slice_acc(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t k, int m, int r0,
                                                 int64_t k0, int steps, float (&acc)[NT][4]) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const bool ok0 = r0 + g < m, ok1 = r0 + g + 8 < m;
  const uint32_t* xa = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g) * ldx + k0 + 2 * t);
  const uint32_t* xb = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g + 8) * ldx + k0 + 2 * t);
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(w + int64_t(g) * k + k0 + 2 * t);
  const int64_t wstep = 4 * k;  // 32-bit words from w's row c to row c + 8
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  for (int st = 0; st < steps; st += UNROLL) {
    uint32_t a[UNROLL][4], b[UNROLL][NT][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const bool in = st + u < steps;
      const int kk = (st + u) * 8;  // in 32-bit words: 16 bf16 a step
      a[u][0] = in && ok0 ? __ldg(xa + kk) : 0u;
      a[u][1] = in && ok1 ? __ldg(xb + kk) : 0u;
      a[u][2] = in && ok0 ? __ldg(xa + kk + 4) : 0u;
      a[u][3] = in && ok1 ? __ldg(xb + kk + 4) : 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t* wj = wp + j * wstep;
        b[u][j][0] = in ? __ldg(wj + kk) : 0u;
        b[u][j][1] = in ? __ldg(wj + kk + 4) : 0u;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (st + u >= steps) break;  // no product of zeros: a sum of -0 stays -0
#pragma unroll
      for (int j = 0; j < NT; ++j) mma_bf16(acc[j], a[u][0], a[u][1], a[u][2], a[u][3], b[u][j][0], b[u][j][1]);
    }
  }
}

}  // namespace
}  // namespace clefrt::cuda

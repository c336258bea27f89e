// The narrow bf16 GEMM split over k (kernels.h narrow_gemm): the FP8 model's GDN in_proj a | b
// part (n = 2 x value heads: 96 at 27B, 64 at 9B). cuBLASLt's batch-invariant picks for it run a
// handful of CTAs at short m (most SMs idle); splitting k itself, in slices fixed by k alone, keeps
// every row's sum order independent of m (batch-invariant by construction) while filling the GPU.
// Its variants and their timings: dev/cuda/narrow_gemm.cu; a warp's slice sums: narrow_gemm.cuh.
#include <algorithm>
#include <string>

#include "cuda/ops/kernels.h"
#include "cuda/ops/narrow_gemm.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/pdl.cuh"

namespace clefrt::cuda {

namespace {

// partial[s][r][c]: narrow_slice_acc's sums of slice s (rows past m not written)
template <int NT, int WARPS, int UNROLL>
__global__ void __launch_bounds__(32 * WARPS) narrow_splitk_k(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t k,
                                                               int m, int steps, float* __restrict__ partial) {
  pdl_wait();
  constexpr int n = 8 * NT;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int s = int(blockIdx.y), r0 = (int(blockIdx.x) * WARPS + warp) * 16;
  if (r0 >= m) return;
  float acc[NT][4];
  narrow_slice_acc<NT, UNROLL>(x, ldx, w, k, m, r0, int64_t(s) * steps * 16, steps, acc);
  float* p = partial + (int64_t(s) * m + r0) * n;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int c = 8 * j + 2 * t;
    if (r0 + g < m) *reinterpret_cast<float2*>(p + int64_t(g) * n + c) = make_float2(acc[j][0], acc[j][1]);
    if (r0 + g + 8 < m) *reinterpret_cast<float2*>(p + int64_t(g + 8) * n + c) = make_float2(acc[j][2], acc[j][3]);
  }
}

// y[r, c] (rows ldy apart) = the slices' partial sums added in slice order
__global__ void narrow_reduce_k(const float* __restrict__ partial, int m, int n, int slices, float* __restrict__ y, int64_t ldy) {
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(m) * n;
  if (i >= total) return;
  float v = partial[i];
  for (int s = 1; s < slices; ++s) v += partial[int64_t(s) * total + i];
  y[(i / n) * ldy + i % n] = v;
}

template <int NT, int WARPS>
void launch_splitk(const bf16* x, int64_t ldx, const bf16* w, int64_t k, int m, int slices, float* partial, cudaStream_t s) {
  const dim3 grid(unsigned((m + 16 * WARPS - 1) / (16 * WARPS)), unsigned(slices));
  launch_after("narrow_gemm", narrow_splitk_k<NT, WARPS, 2>, grid, dim3(32 * WARPS), 0, s, x, ldx, w, k, m, int(k / 16 / slices), partial);
}

template <int NT>
void launch_splitk_warps(int warps, const bf16* x, int64_t ldx, const bf16* w, int64_t k, int m, int slices, float* partial, cudaStream_t s) {
  switch (warps) {
    case 1: return launch_splitk<NT, 1>(x, ldx, w, k, m, slices, partial, s);
    case 2: return launch_splitk<NT, 2>(x, ldx, w, k, m, slices, partial, s);
    default: return launch_splitk<NT, 4>(x, ldx, w, k, m, slices, partial, s);
  }
}

}  // namespace

bool narrow_gemm_fits(int64_t n, int64_t k, int64_t ldx, const NarrowGemmForm& f) {
  const bool warps_ok = f.warps == 1 || f.warps == 2 || f.warps == 4;
  const bool n_ok = n == 8 || n == 16 || n == 32 || n == 64 || n == 96 || n == 128;
  return n_ok && warps_ok && f.slices >= 1 && f.slices <= 256 && k % 16 == 0 && (k / 16) % f.slices == 0 && ldx % 2 == 0;
}

int64_t narrow_gemm_partial_rows(int64_t n, const NarrowGemmForm& f, size_t scratch_bytes) {
  return int64_t(scratch_bytes / (size_t(f.slices) * size_t(n) * sizeof(float))) / 16 * 16;
}

void narrow_gemm(const bf16* x, int64_t m, int64_t k, int64_t ldx, const bf16* w, int64_t n, float* y, int64_t ldy, const NarrowGemmForm& f,
                 float* partial, int64_t partial_rows, cudaStream_t s) {
  if (!narrow_gemm_fits(n, k, ldx, f) || (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(y) % 4 != 0)
    throw Error(Status::Internal, "internal_error",
                "narrow_gemm: n " + std::to_string(n) + ", k " + std::to_string(k) + ", ldx " + std::to_string(ldx) + ", " +
                    std::to_string(f.slices) + " slices, " + std::to_string(f.warps) + " warps or an operand's alignment do not fit");
  if (partial_rows < 16) throw Error(Status::Internal, "internal_error", "narrow_gemm: scratch for fewer than 16 rows");
  // m in blocks of the scratch's rows: a row's sums do not depend on its block
  for (int64_t r0 = 0; r0 < m; r0 += partial_rows) {
    const int mb = int(std::min(partial_rows, m - r0));
    const bf16* xb = x + r0 * ldx;
    switch (n) {  // the test models' 8 / 16 / 32 (2 x their value heads) too
      case 8: launch_splitk_warps<1>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
      case 16: launch_splitk_warps<2>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
      case 32: launch_splitk_warps<4>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
      case 64: launch_splitk_warps<8>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
      case 96: launch_splitk_warps<12>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
      default: launch_splitk_warps<16>(f.warps, xb, ldx, w, k, mb, f.slices, partial, s); break;
    }
    const int64_t total = int64_t(mb) * n;
    launch_after("narrow_gemm reduce", narrow_reduce_k, dim3(unsigned((total + 255) / 256)), dim3(256), 0, s, partial, mb, int(n), f.slices,
                 y + r0 * ldy, ldy);
  }
}

}  // namespace clefrt::cuda

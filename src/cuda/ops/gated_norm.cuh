// The GDN gated norm of one (token, value head) row at Dv = 128, a warp a row, a lane's four
// consecutive values: act = rms_norm(o) * w * silu(z) -> bf16. One function for both of its
// callers, gated_norm128_k (kernels_gdn.cu) and the register-state scan's epilogue
// (kernels_gdn_wgmma.cu, GdnScratch::gn), so a row gets the same bits from either: which one runs
// depends on the batch (the scan's warpgroups a CTA), and answers must not.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops/reduce.cuh"

namespace clefrt::cuda {

// x: the lane's o values (columns 4 lane .. 4 lane + 3), w the norm's weights there, z the gate's
// (scaled already); the warp sums x^2 over its 32 lanes in warp_sum's fixed order
__device__ __forceinline__ uint2 gated_norm128_values(float4 x, float4 w, float4 z, float eps) {
  const float inv = rsqrtf(warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w) / 128.0f + eps);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x * inv * w.x * silu_f(z.x), x.y * inv * w.y * silu_f(z.y));
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x.z * inv * w.z * silu_f(z.z), x.w * inv * w.w * silu_f(z.w));
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

}  // namespace clefrt::cuda

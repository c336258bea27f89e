// bf16 tensor-core fragments (mma.sync m16n8k16, fp32 accumulation), shared by flash attention
// (kernels_attn.cu) and the W4A16 GEMM (kernels_w4a16.cu). Fragment layouts: PTX ISA,
// "Matrix Fragments for mma.m16n8k16".
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace clefrt::cuda {

// d (4 fp32: rows g and g + 8, columns 2t and 2t + 1 of the 16 x 8 tile) += A (16 x 16, a0..a3)
// x B (16 x 8, b0 b1)
__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace clefrt::cuda

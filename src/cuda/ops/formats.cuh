// NVFP4 / FP8 e4m3 element conversions on the GPU, shared by the conversion kernels
// (kernels_quant.cu) and the W4A16 GEMM (kernels_w4a16.cu). They repeat quant/formats.cpp's
// definitions operation for operation (the tests compare bytes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace clefrt::cuda {

// [0, .5, 1, 1.5, 2, 3, 4, 6] from the bits: exponent e = bits 1-2, mantissa m = bit 0;
// e > 0 is 1.m x 2^(e-1), e = 0 is m x 0.5. Built as float bits, not read from a table: a local
// array indexed at run time lives in local memory and made the dequantization 10x slower.
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3, m = code & 1;
  const uint32_t mag = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
  return __uint_as_float(mag | ((code & 8u) << 28));
}
// Round to nearest even on [0, .5, 1, 1.5, 2, 3, 4, 6] after clamping: the thresholds are the
// midpoints, a tie going to the code with the even last bit (formats.cpp's search, closed form).
__device__ __forceinline__ uint32_t e2m1_encode(float x) {
  if (isnan(x)) return 0;
  const uint32_t sign = signbit(x) ? 8u : 0u;
  const float a = fminf(fabsf(x), 6.0f);
  uint32_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}
__device__ __forceinline__ float e4m3_value(uint8_t b) {
  __nv_fp8_e4m3 f;
  f.__x = b;
  return float(f);  // exact: every e4m3 value is a float
}
__device__ __forceinline__ uint8_t e4m3_encode(float x) {
  if (isnan(x)) return 0x7f;
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// An activation row's FP8 quantization over 16-byte chunks of 8 bf16 (fp8_quant_rows_v_k, the
// FP8 SwiGLU): the running max of |x|, then the chunk's 8 codes of x / s in 8 bytes, first value
// in the lowest byte.
__device__ __forceinline__ float absmax4_bf16(uint2 v, float m) {  // 4 bf16 in 8 bytes (the gated norm's lane)
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return m;
}
__device__ __forceinline__ float absmax8_bf16(uint4 v, float m) {
  return absmax4_bf16(make_uint2(v.z, v.w), absmax4_bf16(make_uint2(v.x, v.y), m));
}
// x / s for an FP8 row quantization (s = m / 448, m the row's amax, a bf16 value, as every x):
// from s's correctly rounded reciprocal and one FMA correction (Markstein) instead of a division.
// The quotient is not always the correctly rounded one (subnormal x or quotients), but its e4m3
// code equals that of __fdiv_rn(x, s) for every m >= 2^-100 and every bf16 x with |x| <= m: all
// such pairs are checked on the CPU (test_quant.cpp, Fp8RowReciprocalGivesTheDivisionsCodes).
// For a smaller or infinite m, fp8_row_recip gives 0 and the codes come from the division.
__device__ __forceinline__ float fp8_row_recip(float m, float s) { return m >= 0x1p-100f && m <= 3.4028235e38f ? __frcp_rn(s) : 0.0f; }
// A row's FP8 scale from its amax m, fp8_quantize_rows' rule (m / 448; 1 for an all-zero row), and
// the reciprocal its codes are taken with (fp8_row_recip)
struct Fp8RowScale {
  float s, inv;
};
__device__ __forceinline__ Fp8RowScale fp8_row_scale(float m) {
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
  return {s, fp8_row_recip(m, s)};
}
// copysignf: for x = -0 the correction sums -0 and +0, which rounds to +0 (code 0x00) where the
// division gives -0 (0x80); every other x's quotient already carries x's sign
__device__ __forceinline__ float fp8_div_by_recip(float x, float s, float inv) {
  const float q0 = __fmul_rn(x, inv);
  return copysignf(__fmaf_rn(__fmaf_rn(-q0, s, x), inv, q0), x);
}
// x / s as the FP8 row quantizers take it: inv = fp8_row_recip(m, s), 0 meaning divide
__device__ __forceinline__ float fp8_row_quotient(float x, float s, float inv) {
  return inv != 0.0f ? fp8_div_by_recip(x, s, inv) : __fdiv_rn(x, s);
}
// inv: fp8_row_recip(m, s) (0: divide); fp8_row_quotient's choice made once for the 8 values
__device__ __forceinline__ uint2 e4m3_encode8_bf16(uint4 v, float s, float inv) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  uint32_t w[2] = {0u, 0u};
  if (inv != 0.0f) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      const uint32_t lo = e4m3_encode(fp8_div_by_recip(f.x, s, inv)), hi = e4m3_encode(fp8_div_by_recip(f.y, s, inv));
      w[j / 2] |= (lo | hi << 8) << (16 * (j % 2));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      const uint32_t lo = e4m3_encode(__fdiv_rn(f.x, s)), hi = e4m3_encode(__fdiv_rn(f.y, s));
      w[j / 2] |= (lo | hi << 8) << (16 * (j % 2));
    }
  }
  return make_uint2(w[0], w[1]);
}

// The same for 4 values (the fused gated norm's lane), first value in the lowest byte
__device__ __forceinline__ uint32_t e4m3_encode4_bf16(uint2 v, float s, float inv) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  uint32_t w = 0u;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    const uint32_t lo = e4m3_encode(inv != 0.0f ? fp8_div_by_recip(f.x, s, inv) : __fdiv_rn(f.x, s));
    const uint32_t hi = e4m3_encode(inv != 0.0f ? fp8_div_by_recip(f.y, s, inv) : __fdiv_rn(f.y, s));
    w |= (lo | hi << 8) << (16 * j);
  }
  return w;
}

// The FP8 GEMM's scales: v * rs[r] * cs[c], multiplied in that order and never contracted into
// an FMA (kernels_quant.cu's epilogues and swiglu_fp8_scaled round the same value).
__device__ __forceinline__ float fp8_scaled(float v, float r, float c) { return __fmul_rn(__fmul_rn(v, r), c); }
// Four columns of one row (the vector epilogues, and the readers that apply the scales instead:
// the GDN conv and gated norm).
__device__ __forceinline__ float4 fp8_scaled4(float4 v, float r, float4 c) {
  return make_float4(fp8_scaled(v.x, r, c.x), fp8_scaled(v.y, r, c.y), fp8_scaled(v.z, r, c.z), fp8_scaled(v.w, r, c.w));
}

}  // namespace clefrt::cuda

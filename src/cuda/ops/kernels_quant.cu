// NVFP4 / FP8 conversions and the FP8 epilogue (kernels_quant.h). The rounding helpers repeat
// quant/formats.cpp's definitions operation for operation; __fdiv_rn / __fmul_rn keep the
// compiler from contracting or approximating them.
#include "cuda/runtime/check.h"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/reduce.cuh"

namespace clefrt::cuda {

namespace {

// One thread per 16 codes (one scale): 8 packed bytes in, 32 bytes of bf16 out.
__global__ void nvfp4_dequant_k(const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n, int64_t k, bf16* w) {
  const int64_t blocks_per_row = k / 16, total = n * blocks_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks_per_row;
    const float s32 = __fdiv_rn(e4m3_value(scales[i]), row_gs[r]);
    const uint2 p = reinterpret_cast<const uint2*>(packed)[i];
    __align__(16) bf16 out[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t byte = ((j < 4 ? p.x : p.y) >> (8 * (j & 3))) & 0xff;
      out[2 * j] = __float2bfloat16_rn(__fmul_rn(e2m1_value(byte & 15), s32));
      out[2 * j + 1] = __float2bfloat16_rn(__fmul_rn(e2m1_value(byte >> 4), s32));
    }
    uint4* dst = reinterpret_cast<uint4*>(w + i * 16);
    dst[0] = reinterpret_cast<const uint4*>(out)[0];
    dst[1] = reinterpret_cast<const uint4*>(out)[1];
  }
}

__global__ void nvfp4_quant_k(const bf16* w, int64_t n, int64_t k, float gs, uint8_t* packed, uint8_t* scales) {
  const int64_t total = n * (k / 16);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const bf16* blk = w + i * 16;
    float v[16], amax = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = __bfloat162float(blk[j]);
      amax = fmaxf(amax, fabsf(v[j]));
    }
    float sv = __fdiv_rn(__fmul_rn(gs, amax), 6.0f);
    if (sv > 448.0f) sv = 448.0f;
    uint8_t sc = e4m3_encode(sv);
    if (e4m3_value(sc) == 0.0f) sc = 0x01;  // the smallest positive e4m3
    scales[i] = sc;
    const float step = __fdiv_rn(e4m3_value(sc), gs);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t code = e2m1_encode(__fdiv_rn(v[j], step));
      if (j < 8) lo |= code << (4 * j);
      else hi |= code << (4 * (j - 8));
    }
    reinterpret_cast<uint2*>(packed)[i] = make_uint2(lo, hi);
  }
}

__global__ void amax_bf16_k(const bf16* x, int64_t n, float* amax) {
  __shared__ float sh[32];
  float m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  m = block_max(m, sh);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

// One block per row.
__global__ void fp8_quant_rows_k(const bf16* x, int64_t k, int64_t ldx, uint8_t* q, int64_t kp, float* scale) {
  __shared__ float sh[32];
  const bf16* row = x + int64_t(blockIdx.x) * ldx;
  float m = 0;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(row[i])));
  m = block_max(m, sh);
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  const float inv = fp8_row_recip(m, s);
  uint8_t* out = q + int64_t(blockIdx.x) * kp;
  for (int64_t i = threadIdx.x; i < kp; i += blockDim.x) {
    const float x = i < k ? __bfloat162float(row[i]) : 0.0f;
    out[i] = i < k ? e4m3_encode(fp8_row_quotient(x, s, inv)) : uint8_t(0);
  }
}

// The same per row with 16-byte loads (8 bf16) and 8-byte stores (8 codes): rows 16-byte aligned,
// k and kp multiples of 8. The scalar loop above reads 2 bytes a thread at a time and measured at
// a fifth of the copy bandwidth (2.2 ms for 32,768 x 17,408).
__global__ void fp8_quant_rows_v_k(const bf16* x, int64_t k8, int64_t ldx, uint8_t* q, int64_t kp8, float* scale) {
  __shared__ float sh[32];
  const uint4* row = reinterpret_cast<const uint4*>(x + int64_t(blockIdx.x) * ldx);
  float m = 0;
  for (int64_t i = threadIdx.x; i < k8; i += blockDim.x) m = absmax8_bf16(row[i], m);
  m = block_max(m, sh);
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  const float inv = fp8_row_recip(m, s);
  uint2* out = reinterpret_cast<uint2*>(q + int64_t(blockIdx.x) * kp8 * 8);
  for (int64_t i = threadIdx.x; i < kp8; i += blockDim.x) out[i] = i < k8 ? e4m3_encode8_bf16(row[i], s, inv) : make_uint2(0u, 0u);
}

__global__ void fp8_dequant_rows_k(const uint8_t* q, int64_t kp, const float* scale, int64_t rows, int64_t k, bf16* w) {
  const int64_t total = rows * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i - r * k;
    w[i] = __float2bfloat16_rn(__fmul_rn(e4m3_value(q[r * kp + c]), scale[r]));
  }
}

// One thread per 16 inputs.
__global__ void nvfp4_fake_quant_k(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs, bf16* y, int64_t ldy) {
  const int64_t bpr = k / 16, total = rows * bpr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / bpr, c0 = (i - r * bpr) * 16;
    const bf16* in = x + r * ldx + c0;
    bf16* out = y + r * ldy + c0;
    float v[16], amax = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = __bfloat162float(in[j]);
      amax = fmaxf(amax, fabsf(v[j]));
    }
    const float s = e4m3_value(e4m3_encode(__fdiv_rn(__fmul_rn(gs, amax), 6.0f)));
    if (s == 0.0f) {
#pragma unroll
      for (int j = 0; j < 16; ++j) out[j] = __float2bfloat16_rn(0.0f);
      continue;
    }
    const float step = __fdiv_rn(s, gs);
#pragma unroll
    for (int j = 0; j < 16; ++j)
      out[j] = __float2bfloat16_rn(__fdiv_rn(__fmul_rn(e2m1_value(e2m1_encode(__fdiv_rn(v[j], step))), s), gs));
  }
}

// The FP8 epilogues: fp8_scaled (formats.cuh), never contracted into an FMA with the residual add
// either (the CPU tests compare bit for bit).

// Element-wise forms (any shape and alignment).
__global__ void scale_bf16_k(bf16* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    bf16& v = y[r * ldy + c];
    v = __float2bfloat16_rn(fp8_scaled(__bfloat162float(v), rs[r], cs[c]));
  }
}
__global__ void scale_f32_k(float* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    y[r * ldy + c] = fp8_scaled(y[r * ldy + c], rs[r], cs[c]);
  }
}
__global__ void scale_acc_k(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, float* acc,
                            int64_t ldacc) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    acc[r * ldacc + c] = __fadd_rn(acc[r * ldacc + c], fp8_scaled(t[r * ldt + c], rs[r], cs[c]));
  }
}
__global__ void scale_store_k(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, void* y, bool y_bf16,
                              int64_t ldy) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    const float v = fp8_scaled(t[r * ldt + c], rs[r], cs[c]);
    if (y_bf16) static_cast<bf16*>(y)[r * ldy + c] = __float2bfloat16_rn(v);
    else static_cast<float*>(y)[r * ldy + c] = v;
  }
}

// Vector forms: one thread per 4 columns (16-byte loads of fp32, 8 of bf16), blockIdx.y striding
// over rows, so there is no 64-bit division per element (the element-wise forms ran at a third
// of the copy bandwidth: 4.1 ms for 32,768 x 34,816 bf16). Used when every row start and the
// column scales are 16-byte aligned for fp32 (8-byte for bf16) and n % 4 == 0 (vec4_ok).
struct Bf16x4 {
  __nv_bfloat162 a, b;
};
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const bf16* p) {
  const Bf16x4 v = *reinterpret_cast<const Bf16x4*>(p);
  const float2 a = __bfloat1622float2(v.a), b = __bfloat1622float2(v.b);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(bf16* p, float4 v) {
  *reinterpret_cast<Bf16x4*>(p) = Bf16x4{__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
}

// y = fp8_scaled(t) (T in, Y out; in place when t == y), or y += fp8_scaled(t) with Acc.
template <class T, class Y, bool Acc>
__global__ void scale_rows_cols_v_k(const T* t, int64_t ldt, int64_t rows, int64_t n4, const float* rs, const float* cs, Y* y,
                                    int64_t ldy) {
  const int64_t c4 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c4 >= n4) return;
  const float4 c = load4(cs + 4 * c4);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float4 v = fp8_scaled4(load4(t + r * ldt + 4 * c4), rs[r], c);
    if constexpr (Acc) {
      const float4 a = load4(y + r * ldy + 4 * c4);
      v = make_float4(__fadd_rn(a.x, v.x), __fadd_rn(a.y, v.y), __fadd_rn(a.z, v.z), __fadd_rn(a.w, v.w));
    }
    store4(y + r * ldy + 4 * c4, v);
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T, class Y>
bool vec4_ok(const T* t, int64_t ldt, int64_t n, const float* cs, const Y* y, int64_t ldy) {
  return n % 4 == 0 && aligned(t, 4 * sizeof(T)) && (ldt * int64_t(sizeof(T))) % (4 * sizeof(T)) == 0 && aligned(y, 4 * sizeof(Y)) &&
         (ldy * int64_t(sizeof(Y))) % (4 * sizeof(Y)) == 0 && aligned(cs, 16);
}

template <bool Acc, class T, class Y>
void launch_scale_v(const T* t, int64_t ldt, int64_t rows, int64_t n, const float* rs, const float* cs, Y* y, int64_t ldy, cudaStream_t s) {
  const int64_t n4 = n / 4;
  const dim3 grid(unsigned((n4 + 255) / 256), unsigned(rows < 65535 ? rows : 65535));
  scale_rows_cols_v_k<T, Y, Acc><<<grid, 256, 0, s>>>(t, ldt, rows, n4, rs, cs, y, ldy);
}

__host__ __device__ __forceinline__ int64_t swz(int64_t r, int64_t c, int64_t col_tiles) {
  return ((r / 128) * col_tiles + c / 4) * 512 + (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}

__global__ void swizzle_k(const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t total = rows * cols, col_tiles = (cols + 3) / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[swz(r, c, col_tiles)] = scales[i];
  }
}

// One thread per 16 inputs: the fake-quant's arithmetic, codes kept instead of x_hat.
__global__ void nvfp4_quant_packed_k(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs, uint8_t* packed, uint8_t* sc) {
  const int64_t bpr = k / 16, total = rows * bpr, col_tiles = (bpr + 3) / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / bpr, b = i - r * bpr;
    const bf16* in = x + r * ldx + b * 16;
    float v[16], amax = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = __bfloat162float(in[j]);
      amax = fmaxf(amax, fabsf(v[j]));
    }
    const uint8_t sb = e4m3_encode(__fdiv_rn(__fmul_rn(gs, amax), 6.0f));
    const float s = e4m3_value(sb);
    sc[swz(r, b, col_tiles)] = s == 0.0f ? uint8_t(0) : sb;
    uint32_t lo = 0, hi = 0;
    if (s != 0.0f) {
      const float step = __fdiv_rn(s, gs);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const uint32_t code = e2m1_encode(__fdiv_rn(v[j], step));
        if (j < 8) lo |= code << (4 * j);
        else hi |= code << (4 * (j - 8));
      }
    }
    reinterpret_cast<uint2*>(packed + r * (k / 2))[b] = make_uint2(lo, hi);
  }
}

}  // namespace

int64_t nvfp4_swizzled_bytes(int64_t rows, int64_t k) { return (rows + 127) / 128 * 128 * ((k / 16 + 3) / 4 * 4); }
int64_t nvfp4_swizzled_offset(int64_t r, int64_t c, int64_t k) { return swz(r, c, (k / 16 + 3) / 4); }

void nvfp4_swizzle_scales(const uint8_t* scales, int64_t rows, int64_t k, uint8_t* out, cudaStream_t s) {
  if (rows == 0) return;
  check(cudaMemsetAsync(out, 0, size_t(nvfp4_swizzled_bytes(rows, k)), s), "nvfp4_swizzle_scales");
  swizzle_k<<<grid_for(rows * (k / 16)), 256, 0, s>>>(scales, rows, k / 16, out);
  check_launch("nvfp4_swizzle_scales");
}

void nvfp4_quantize_rows_packed(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs_in, uint8_t* packed, uint8_t* out_scales,
                                cudaStream_t s) {
  if (rows == 0) return;
  nvfp4_quant_packed_k<<<grid_for(rows * (k / 16)), 256, 0, s>>>(x, rows, k, ldx, gs_in, packed, out_scales);
  check_launch("nvfp4_quantize_rows_packed");
}

void scale_rows_cols_store(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, void* y, bool y_bf16,
                           int64_t ldy, cudaStream_t s) {
  if (rows == 0) return;
  if (y_bf16 && vec4_ok(t, ldt, n, cs, static_cast<bf16*>(y), ldy))
    launch_scale_v<false>(t, ldt, rows, n, rs, cs, static_cast<bf16*>(y), ldy, s);
  else if (!y_bf16 && vec4_ok(t, ldt, n, cs, static_cast<float*>(y), ldy))
    launch_scale_v<false>(t, ldt, rows, n, rs, cs, static_cast<float*>(y), ldy, s);
  else
    scale_store_k<<<grid_for(rows * n), 256, 0, s>>>(t, rows, n, ldt, rs, cs, y, y_bf16, ldy);
  check_launch("fp8 epilogue (store)");
}

void nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n, int64_t k, bf16* w, cudaStream_t s) {
  if (n == 0) return;
  nvfp4_dequant_k<<<grid_for(n * k / 16), 256, 0, s>>>(packed, scales, row_gs, n, k, w);
  check_launch("nvfp4_dequantize");
}
void nvfp4_quantize(const bf16* w, int64_t n, int64_t k, float gs, uint8_t* packed, uint8_t* scales, cudaStream_t s) {
  if (n == 0) return;
  nvfp4_quant_k<<<grid_for(n * k / 16), 256, 0, s>>>(w, n, k, gs, packed, scales);
  check_launch("nvfp4_quantize");
}
void amax_bf16(const bf16* x, int64_t n, float* amax, cudaStream_t s) {
  if (n == 0) return;
  amax_bf16_k<<<grid_for(n), 256, 0, s>>>(x, n, amax);
  check_launch("amax_bf16");
}
void fp8_quantize_rows(const bf16* x, int64_t rows, int64_t k, int64_t ldx, uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  if (rows == 0) return;
  if (k % 8 == 0 && kp % 8 == 0 && ldx % 8 == 0 && aligned(x, 16) && aligned(q, 8))
    fp8_quant_rows_v_k<<<unsigned(rows), 256, 0, s>>>(x, k / 8, ldx, q, kp / 8, scale);
  else
    fp8_quant_rows_k<<<unsigned(rows), 256, 0, s>>>(x, k, ldx, q, kp, scale);
  check_launch("fp8_quantize_rows");
}
void fp8_dequantize_rows(const uint8_t* q, int64_t kp, const float* scale, int64_t rows, int64_t k, bf16* w, cudaStream_t s) {
  if (rows == 0) return;
  fp8_dequant_rows_k<<<grid_for(rows * k), 256, 0, s>>>(q, kp, scale, rows, k, w);
  check_launch("fp8_dequantize_rows");
}
void nvfp4_fake_quantize_rows(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs_in, bf16* y, int64_t ldy, cudaStream_t s) {
  if (rows == 0) return;
  nvfp4_fake_quant_k<<<grid_for(rows * k / 16), 256, 0, s>>>(x, rows, k, ldx, gs_in, y, ldy);
  check_launch("nvfp4_fake_quantize_rows");
}
void scale_rows_cols_bf16(bf16* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs, cudaStream_t s) {
  if (rows == 0) return;
  if (vec4_ok(y, ldy, n, cs, y, ldy)) launch_scale_v<false>(static_cast<const bf16*>(y), ldy, rows, n, rs, cs, y, ldy, s);
  else scale_bf16_k<<<grid_for(rows * n), 256, 0, s>>>(y, rows, n, ldy, rs, cs);
  check_launch("fp8 epilogue (bf16)");
}
void scale_rows_cols_f32(float* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs, cudaStream_t s) {
  if (rows == 0) return;
  if (vec4_ok(y, ldy, n, cs, y, ldy)) launch_scale_v<false>(static_cast<const float*>(y), ldy, rows, n, rs, cs, y, ldy, s);
  else scale_f32_k<<<grid_for(rows * n), 256, 0, s>>>(y, rows, n, ldy, rs, cs);
  check_launch("fp8 epilogue (f32)");
}
void scale_rows_cols_acc(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, float* acc, int64_t ldacc,
                         cudaStream_t s) {
  if (rows == 0) return;
  if (vec4_ok(t, ldt, n, cs, acc, ldacc)) launch_scale_v<true>(t, ldt, rows, n, rs, cs, acc, ldacc, s);
  else scale_acc_k<<<grid_for(rows * n), 256, 0, s>>>(t, rows, n, ldt, rs, cs, acc, ldacc);
  check_launch("fp8 epilogue (residual)");
}

}  // namespace clefrt::cuda

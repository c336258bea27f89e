// Embedding gather, norms, SwiGLU, bias/GELU, casts and the synthetic-weight fill.
#include <array>

#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"
#include "cuda/runtime/pdl.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"
#include "cuda/ops/swiglu_fp8.cuh"

namespace clefrt::cuda {

namespace {


__global__ void gpu_wait_k(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void embed_gather_k(const int32_t* ids, const bf16* table, int64_t d, float* x) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + int64_t(ids[t]) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] = __bfloat162float(row[i]);
}

// One block per row, its float4s in registers, kRmsVec a thread: the row is read once, and all
// its loads are in flight before the one reduction (the grid-stride form below reads it twice,
// and a few hundred rows leave it latency-bound). d % 4 == 0 and d <= 4 kRmsVec * 1024.
constexpr int kRmsVec = 2;
// Loads the block's row (thread t its float4s t, t + blockDim, ...; zeros past d4) into v and
// returns the row's 1 / rms (every thread of the block calls it).
__device__ __forceinline__ float rms_row_inv(const float* x, int d4, float eps, float4 (&v)[kRmsVec], float* sh) {
  const float4* r4 = reinterpret_cast<const float4*>(x);
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kRmsVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < d4 ? r4[i] : make_float4(0, 0, 0, 0);
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  return rsqrtf(block_sum(ss, sh) / float(4 * d4) + eps);
}
// rms_row_inv after x's row takes a pending FP8 residual add (ResidualFp8): v = x + fp8_scaled(t,
// rs[row], cs), each sum as scale_rows_cols_acc rounds it, written back to the row of x (xw)
// before the norm reads it, so the same bits as that pass followed by the plain norm.
__device__ __forceinline__ float rms_row_inv_add(const float* x, float* xw, const ResidualFp8& ra, int64_t row, int d4, float eps,
                                                 float4 (&v)[kRmsVec], float* sh) {
  const float4* r4 = reinterpret_cast<const float4*>(x);
  const float4* t4 = reinterpret_cast<const float4*>(ra.t + row * ra.ldt);
  const float r = ra.rs[row];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kRmsVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = make_float4(0, 0, 0, 0);
    if (i < d4) {
      const float4 a = r4[i], sc = fp8_scaled4(t4[i], r, reinterpret_cast<const float4*>(ra.cs)[i]);
      v[k] = make_float4(__fadd_rn(a.x, sc.x), __fadd_rn(a.y, sc.y), __fadd_rn(a.z, sc.z), __fadd_rn(a.w, sc.w));
      reinterpret_cast<float4*>(xw)[i] = v[k];
    }
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  return rsqrtf(block_sum(ss, sh) / float(4 * d4) + eps);
}
// The register kernels' CTA: kRmsVec float4 of the row a thread, rounded up to a warp
unsigned rms_reg_threads(int64_t d) {
  const int64_t per = (d / 4 + kRmsVec - 1) / kRmsVec;
  return unsigned((per + 31) / 32 * 32);
}
// float4 i of the normed row: v * inv * (1 + w)
__device__ __forceinline__ float4 rms_1p4(float4 v, float inv, const float* w, int i) {
  const float4 ww = reinterpret_cast<const float4*>(w)[i];
  return make_float4(v.x * inv * (1.0f + ww.x), v.y * inv * (1.0f + ww.y), v.z * inv * (1.0f + ww.z), v.w * inv * (1.0f + ww.w));
}
// Add: the row first takes a pending FP8 residual add (rms_row_inv_add; x written back).
template <bool Add>
__global__ void __launch_bounds__(1024) rms_norm_1p_reg_k(const float* x, int d4, const float* w, float eps, bf16* y16, float* y32,
                                                          ResidualFp8 ra) {
  pdl_wait();
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  float4 v[kRmsVec];
  float inv;
  if constexpr (Add) inv = rms_row_inv_add(x + row * 4 * d4, const_cast<float*>(x) + row * 4 * d4, ra, row, d4, eps, v, sh);
  else inv = rms_row_inv(x + row * 4 * d4, d4, eps, v, sh);
#pragma unroll
  for (int k = 0; k < kRmsVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= d4) continue;
    const float4 o = rms_1p4(v[k], inv, w, i);
    if (y16) {
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(y16 + row * 4 * d4 + 4 * i);
      p[0] = __floats2bfloat162_rn(o.x, o.y);
      p[1] = __floats2bfloat162_rn(o.z, o.w);
    }
    if (y32) reinterpret_cast<float4*>(y32 + row * 4 * d4)[i] = o;
  }
}

// rms_norm_1p_reg_k's bf16 rows quantized for an FP8 GEMM as fp8_quant_rows_v_k would from
// them (amax of the bf16 values, s = amax / 448, codes of x / s, zeros to kp): the GEMM's input
// without the bf16 rows' trip through memory, the same bits. y16 (optional): the bf16 rows too,
// for a Linear's bf16 parts.
template <bool Add>
__global__ void __launch_bounds__(1024) rms_norm_1p_fp8_k(const float* x, int d4, const float* w, float eps, bf16* y16, uint8_t* q, int64_t kp,
                                                          float* scale, ResidualFp8 ra) {
  pdl_wait();
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  float4 v[kRmsVec];
  float inv;
  if constexpr (Add) inv = rms_row_inv_add(x + row * 4 * d4, const_cast<float*>(x) + row * 4 * d4, ra, row, d4, eps, v, sh);
  else inv = rms_row_inv(x + row * 4 * d4, d4, eps, v, sh);
  __nv_bfloat162 h[kRmsVec][2];
  float m = 0;
#pragma unroll
  for (int k = 0; k < kRmsVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    h[k][0] = h[k][1] = __floats2bfloat162_rn(0.0f, 0.0f);
    if (i >= d4) continue;
    const float4 o = rms_1p4(v[k], inv, w, i);
    h[k][0] = __floats2bfloat162_rn(o.x, o.y);
    h[k][1] = __floats2bfloat162_rn(o.z, o.w);
    if (y16) {
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(y16 + row * 4 * d4 + 4 * i);
      p[0] = h[k][0];
      p[1] = h[k][1];
    }
    const float2 a = __bfloat1622float2(h[k][0]), b = __bfloat1622float2(h[k][1]);
    m = fmaxf(m, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))));
  }
  const Fp8RowScale rsc = fp8_row_scale(block_max(m, sh));
  const float s = rsc.s, rinv = rsc.inv;
  if (threadIdx.x == 0) scale[row] = s;
  uint8_t* out = q + row * kp;
#pragma unroll
  for (int k = 0; k < kRmsVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= d4) continue;
    const float2 a = __bfloat1622float2(h[k][0]), b = __bfloat1622float2(h[k][1]);
    const float f[4] = {a.x, a.y, b.x, b.y};
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) word |= uint32_t(e4m3_encode(fp8_row_quotient(f[j], s, rinv))) << (8 * j);
    reinterpret_cast<uint32_t*>(out)[i] = word;
  }
  for (int64_t c = 4 * int64_t(d4) + threadIdx.x; c < kp; c += blockDim.x) out[c] = 0;  // the GEMM's K padding
}

// Other widths: one block per row. Rows of d % 4 == 0 floats are read as float4 (16-byte loads: the scalar
// form ran at about half the copy bandwidth on the 27B shapes).
__global__ void rms_norm_1p_k(const float* x, int64_t d, const float* w, float eps, bf16* y16, float* y32) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const float* r = x + row * d;
  float ss = 0;
  if (d % 4 == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(r);
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = r4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_sum(ss, sh) / float(d) + eps);
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = r4[i], ww = reinterpret_cast<const float4*>(w)[i];
      const float4 o = make_float4(v.x * inv * (1.0f + ww.x), v.y * inv * (1.0f + ww.y), v.z * inv * (1.0f + ww.z), v.w * inv * (1.0f + ww.w));
      if (y16) {
        __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(y16 + row * d + 4 * i);
        p[0] = __floats2bfloat162_rn(o.x, o.y);
        p[1] = __floats2bfloat162_rn(o.z, o.w);
      }
      if (y32) reinterpret_cast<float4*>(y32 + row * d)[i] = o;
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += r[i] * r[i];
  ss = block_sum(ss, sh);
  const float inv = rsqrtf(ss / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = r[i] * inv * (1.0f + w[i]);
    if (y16) y16[row * d + i] = __float2bfloat16(v);
    if (y32) y32[row * d + i] = v;
  }
}

// add (optional): a bias the previous GEMM's output still lacks, normalized with x (x + add, the
// same sum bias_act would make) and, with write_back, stored into x (one pass fewer)
__global__ void layer_norm_k(float* x, int64_t d, int64_t ldx, const float* add, bool write_back, const float* w, const float* b, float eps,
                             bf16* y16, float* y32) {
  __shared__ float sh[32];
  float* r = x + int64_t(blockIdx.x) * ldx;
  auto xv = [&](int64_t i) { return add ? r[i] + add[i] : r[i]; };
  float s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += xv(i);
  const float mean = block_sum(s, sh) / float(d);
  float v = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) v += (xv(i) - mean) * (xv(i) - mean);
  const float inv = rsqrtf(block_sum(v, sh) / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float xi = xv(i), o = (xi - mean) * inv * w[i] + b[i];
    if (add && write_back) r[i] = xi;  // each thread rewrites only the i it alone reads
    if (y16) y16[int64_t(blockIdx.x) * d + i] = __float2bfloat16(o);
    if (y32) y32[int64_t(blockIdx.x) * d + i] = o;
  }
}

// grid (L, column blocks): 8 outputs per thread, from 16-byte loads when ffn % 8 == 0 (no
// 64-bit index division per element as in a flat grid-stride loop).
constexpr int kSwigluThreads = 256;
__global__ void swiglu_k(const bf16* gu, int64_t ffn, bf16* act, GuScales sc) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const bf16* g = gu + t * 2 * ffn;
  const bf16* u = g + ffn;
  bf16* a = act + t * ffn;
  const int64_t j0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (j0 >= ffn) return;
  if (ffn % 8 == 0) {
    const uint4 gv = *reinterpret_cast<const uint4*>(g + j0), uv = *reinterpret_cast<const uint4*>(u + j0);
    const bf16* gp = reinterpret_cast<const bf16*>(&gv);
    const bf16* up = reinterpret_cast<const bf16*>(&uv);
    uint4 ov;
    bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
    for (int i = 0; i < 8; ++i) op[i] = __float2bfloat16(silu_f(gu_value(gp[i], t, j0 + i, sc)) * gu_value(up[i], t, ffn + j0 + i, sc));
    *reinterpret_cast<uint4*>(a + j0) = ov;
    return;
  }
  for (int64_t j = j0; j < j0 + 8 && j < ffn; ++j) a[j] = __float2bfloat16(silu_f(gu_value(g[j], t, j, sc)) * gu_value(u[j], t, ffn + j, sc));
}

__global__ void bias_act_k(float* y, int64_t rows, int64_t n, int64_t ldy, const float* bias, bool gelu) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    float v = y[r * ldy + c] + (bias ? bias[c] : 0.0f);
    if (gelu) v = gelu_f(v);
    y[r * ldy + c] = v;
  }
}

__global__ void rows_to_bf16_k(const float* x, int64_t rows, int64_t d, int64_t ldx, bf16* y, int64_t ldy) {
  const int64_t total = rows * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / d, c = i - r * d;
    y[r * ldy + c] = __float2bfloat16(x[r * ldx + c]);
  }
}

// splitmix64 of (seed, index) -> two uniforms -> Box-Muller.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float normal_at(uint64_t seed, int64_t i) {
  const uint64_t h = mix(seed * 0x100000001b3ull + uint64_t(i));
  const float u1 = (float((h >> 40) & 0xffffff) + 0.5f) * (1.0f / 16777216.0f);
  const float u2 = float(h & 0xffffff) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
__global__ void fill_bf16_k(bf16* p, int64_t n, uint64_t seed, float mean, float std) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(mean + std * normal_at(seed, i));
}
__global__ void fill_f32_k(float* p, int64_t n, uint64_t seed, float mean, float std) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = mean + std * normal_at(seed, i);
}

}  // namespace

void embed_gather(const int32_t* ids, int64_t L, const bf16* table, int64_t d, float* x, cudaStream_t s) {
  if (L == 0) return;
  embed_gather_k<<<unsigned(L), 256, 0, s>>>(ids, table, d, x);
  check_launch("embed_gather");
}

void rms_norm_1p(const float* x, int64_t rows, int64_t d, const float* w, float eps, bf16* y16, float* y32, cudaStream_t s) {
  if (rows == 0) return;
  if (d % 4 == 0 && d <= int64_t(4) * kRmsVec * 1024)
    return launch_after("rms_norm_1p", rms_norm_1p_reg_k<false>, unsigned(rows), rms_reg_threads(d), 0, s, x, int(d / 4), w, eps, y16, y32,
                        ResidualFp8{});
  rms_norm_1p_k<<<unsigned(rows), d >= 1024 ? 256 : 128, 0, s>>>(x, d, w, eps, y16, y32);
  check_launch("rms_norm_1p");
}

bool rms_norm_1p_fp8_fits(int64_t d, int64_t kp) { return d > 0 && d % 4 == 0 && d <= int64_t(4) * kRmsVec * 1024 && kp >= d && kp % 4 == 0; }

void rms_norm_1p_fp8(const float* x, int64_t rows, int64_t d, const float* w, float eps, bf16* y16, uint8_t* q, int64_t kp, float* scale,
                     cudaStream_t s) {
  if (!rms_norm_1p_fp8_fits(d, kp) || reinterpret_cast<uintptr_t>(q) % 4 != 0)
    throw Error(Status::Internal, "internal_error", "rms_norm_1p_fp8: d " + std::to_string(d) + ", kp " + std::to_string(kp) + " do not fit");
  if (rows == 0) return;
  launch_after("rms_norm_1p_fp8", rms_norm_1p_fp8_k<false>, unsigned(rows), rms_reg_threads(d), 0, s, x, int(d / 4), w, eps, y16, q, kp, scale,
               ResidualFp8{});
}

bool residual_fp8_fits(int64_t d, const ResidualFp8& add) {
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return add.t && add.rs && add.cs && d % 4 == 0 && d <= int64_t(4) * kRmsVec * 1024 && add.ldt % 4 == 0 && add.ldt >= d && a16(add.t) &&
         a16(add.cs);
}

void rms_norm_1p_add(float* x, int64_t rows, int64_t d, const ResidualFp8& add, const float* w, float eps, bf16* y16, cudaStream_t s) {
  if (!residual_fp8_fits(d, add) || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw Error(Status::Internal, "internal_error", "rms_norm_1p_add: d " + std::to_string(d) + " or the pending add's layout do not fit");
  if (rows == 0) return;
  launch_after("rms_norm_1p_add", rms_norm_1p_reg_k<true>, unsigned(rows), rms_reg_threads(d), 0, s, x, int(d / 4), w, eps, y16,
               static_cast<float*>(nullptr), add);
}

void rms_norm_1p_fp8_add(float* x, int64_t rows, int64_t d, const ResidualFp8& add, const float* w, float eps, bf16* y16, uint8_t* q, int64_t kp,
                         float* scale, cudaStream_t s) {
  if (!residual_fp8_fits(d, add) || !rms_norm_1p_fp8_fits(d, kp) || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 4 != 0)
    throw Error(Status::Internal, "internal_error",
                "rms_norm_1p_fp8_add: d " + std::to_string(d) + ", kp " + std::to_string(kp) + " or the pending add's layout do not fit");
  if (rows == 0) return;
  launch_after("rms_norm_1p_fp8_add", rms_norm_1p_fp8_k<true>, unsigned(rows), rms_reg_threads(d), 0, s, x, int(d / 4), w, eps, y16, q, kp,
               scale, add);
}

void layer_norm(const float* x, int64_t rows, int64_t d, int64_t ldx, const float* w, const float* b, float eps, bf16* y16, float* y32,
                cudaStream_t s) {
  if (rows == 0) return;
  layer_norm_k<<<unsigned(rows), d >= 1024 ? 512 : 128, 0, s>>>(const_cast<float*>(x), d, ldx, nullptr, false, w, b, eps, y16, y32);
  check_launch("layer_norm");
}

namespace {
// One warp per row, the row in registers (V float4 a lane: d <= 128 V), read once and written once:
// the block-per-row kernel reread the row for each of its passes (the vision tower's LayerNorms,
// 3,072 x 1,152 a block, ran at a third of the copy rate).
template <int V>
__global__ void layer_norm_warp_k(float* x, int64_t rows, int d4, int64_t ldx, const float* add, bool write_back, const float* w,
                                  const float* b, float eps, bf16* y16, float* y32) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float4* r = reinterpret_cast<float4*>(x + row * ldx);
  float4 v[V];
  float sum = 0;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int c = lane + 32 * i;
    v[i] = c < d4 ? r[c] : make_float4(0, 0, 0, 0);
    if (add && c < d4) {
      const float4 a = reinterpret_cast<const float4*>(add)[c];
      v[i].x += a.x;
      v[i].y += a.y;
      v[i].z += a.z;
      v[i].w += a.w;
      if (write_back) r[c] = v[i];
    }
    sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
  }
  const float d = float(4 * d4), mean = warp_sum(sum) / d;
  float var = 0;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (lane + 32 * i >= d4) continue;
    const float a = v[i].x - mean, bb = v[i].y - mean, c = v[i].z - mean, e = v[i].w - mean;
    var += (a * a + bb * bb) + (c * c + e * e);
  }
  const float inv = rsqrtf(warp_sum(var) / d + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int c = lane + 32 * i;
    if (c >= d4) continue;
    const float4 ww = reinterpret_cast<const float4*>(w)[c], bw = reinterpret_cast<const float4*>(b)[c];
    const float4 o = make_float4((v[i].x - mean) * inv * ww.x + bw.x, (v[i].y - mean) * inv * ww.y + bw.y, (v[i].z - mean) * inv * ww.z + bw.z,
                                 (v[i].w - mean) * inv * ww.w + bw.w);
    if (y16) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
      reinterpret_cast<uint2*>(y16 + row * 4 * int64_t(d4))[c] = make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
    }
    if (y32) reinterpret_cast<float4*>(y32 + row * 4 * int64_t(d4))[c] = o;
  }
}
}  // namespace

namespace {
void launch_layer_norm(float* x, int64_t rows, int64_t d, int64_t ldx, const float* add, bool write_back, const float* w, const float* b,
                       float eps, bf16* y16, float* y32, cudaStream_t s) {
  if (rows == 0) return;
  const bool vec = d % 4 == 0 && ldx % 4 == 0 && d <= 2048 &&
                   ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(add) | reinterpret_cast<uintptr_t>(w) |
                     reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(y16) | reinterpret_cast<uintptr_t>(y32)) % 16 == 0);
  if (!vec) {
    layer_norm_k<<<unsigned(rows), d >= 1024 ? 512 : 128, 0, s>>>(x, d, ldx, add, write_back, w, b, eps, y16, y32);
  } else {
    const unsigned grid = unsigned((rows + 7) / 8);  // 8 rows (warps) a CTA
    const int d4 = int(d / 4);
    if (d <= 512) layer_norm_warp_k<4><<<grid, 256, 0, s>>>(x, rows, d4, ldx, add, write_back, w, b, eps, y16, y32);
    else if (d <= 1024) layer_norm_warp_k<8><<<grid, 256, 0, s>>>(x, rows, d4, ldx, add, write_back, w, b, eps, y16, y32);
    else if (d <= 1536) layer_norm_warp_k<12><<<grid, 256, 0, s>>>(x, rows, d4, ldx, add, write_back, w, b, eps, y16, y32);
    else layer_norm_warp_k<16><<<grid, 256, 0, s>>>(x, rows, d4, ldx, add, write_back, w, b, eps, y16, y32);
  }
  check_launch(write_back ? "layer_norm_add" : "layer_norm_biased");
}
}  // namespace

void layer_norm_add(float* x, int64_t rows, int64_t d, int64_t ldx, const float* add, const float* w, const float* b, float eps, bf16* y16,
                    float* y32, cudaStream_t s) {
  launch_layer_norm(x, rows, d, ldx, add, true, w, b, eps, y16, y32, s);
}

void layer_norm_biased(const float* x, int64_t rows, int64_t d, int64_t ldx, const float* bias, const float* w, const float* b, float eps,
                       bf16* y16, float* y32, cudaStream_t s) {
  launch_layer_norm(const_cast<float*>(x), rows, d, ldx, bias, false, w, b, eps, y16, y32, s);
}

namespace {
void launch_swiglu(const bf16* gu, int64_t L, int64_t ffn, bf16* act, GuScales sc, cudaStream_t s) {
  if (L == 0) return;
  const int64_t blocks = (ffn + 8 * kSwigluThreads - 1) / (8 * kSwigluThreads);
  launch_after("swiglu", swiglu_k, dim3(unsigned(L), unsigned(blocks)), kSwigluThreads, 0, s, gu, ffn, act, sc);
}
}  // namespace

void swiglu(const bf16* gu, int64_t L, int64_t ffn, bf16* act, cudaStream_t s) { launch_swiglu(gu, L, ffn, act, GuScales{}, s); }

void swiglu_fp8_scaled(const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi, int64_t split,
                       bf16* act, cudaStream_t s) {
  launch_swiglu(gu, L, ffn, act, GuScales{rs, cs_lo, cs_hi, split}, s);
}

// act's row in dynamic shared memory beside the kernel's 32 floats of static, within the 48 KiB a
// block has without opting in
bool swiglu_fp8_quant_fits(int64_t ffn, int64_t kp) {
  return ffn > 0 && ffn % 8 == 0 && kp % 8 == 0 && kp >= ffn && ffn * 2 + 32 * int64_t(sizeof(float)) <= 48 * 1024;
}

// The cluster kernel of `ipt` items a thread: cluster_kernel_max_threads (queried once)
static int swiglu_cluster_max_threads(int ipt) {
  static const std::array<int, 3> most = {cluster_kernel_max_threads((const void*)swiglu_fp8_quant_cluster_k<1>),
                                          cluster_kernel_max_threads((const void*)swiglu_fp8_quant_cluster_k<2>),
                                          cluster_kernel_max_threads((const void*)swiglu_fp8_quant_cluster_k<4>)};
  return most[ipt == 1 ? 0 : ipt == 2 ? 1 : 2];
}

void swiglu_fp8_quant(const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi, int64_t split,
                      uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  SwigluFp8Form f = swiglu_fp8_form(L);
  if (!swiglu_fp8_form_fits(f, ffn)) f = swiglu_fp8_form(0);  // the row does not fit the register form: the cluster one
  if (!swiglu_fp8_form_fits(f, ffn)) f = SwigluFp8Form{};     // nor that: the shared-row kernel
  swiglu_fp8_quant_as(f, gu, L, ffn, rs, cs_lo, cs_hi, split, q, kp, scale, s);
}

// Why form f cannot run a row of ffn (empty: it can): swiglu_fp8_form_fits' answer and
// swiglu_fp8_quant_as' refusal, from one set of checks (the text built only for a refusal: the
// forward asks at every MLP).
static std::string swiglu_form_misfit(const SwigluFp8Form& f, int64_t ffn) {
  auto form = [&] { return "cluster " + std::to_string(f.cluster) + ", " + std::to_string(f.ipt) + " items a thread"; };
  if (f.min_blocks != 0) {
    const bool fits = f.min_blocks == 2   ? f.cluster == 0 && f.ipt == 4 && (ffn / 8 + 3) / 4 <= kSwigluQuantMaxThreads
                      : f.min_blocks == 4 ? f.cluster == 2 && f.ipt == 4 && swiglu_cluster_max_threads(4) > 0 &&
                                                swiglu_cluster_threads(ffn, 2, 4) <= kSwigluClusterLabThreads
                                          : false;
    if (fits) return "";
    return "no form of " + form() + " capped for " + std::to_string(f.min_blocks) + " CTAs an SM at ffn " + std::to_string(ffn) +
           " (2: cluster 0, 4 items, ffn <= 18,432; 4: cluster 2, 4 items, ffn <= 18,432, compute capability 9.0)";
  }
  if (f.cluster < 0 || f.cluster > 8 || (f.ipt != 1 && f.ipt != 2 && f.ipt != 4)) return "no form of " + form();
  if (f.cluster == 0) return "";
  if (swiglu_cluster_max_threads(f.ipt) == 0) return "the cluster form needs compute capability 9.0 and its code in the binary";
  if (swiglu_cluster_threads(ffn, f.cluster, f.ipt) > swiglu_cluster_max_threads(f.ipt))
    return "ffn " + std::to_string(ffn) + " over a cluster of " + std::to_string(f.cluster) + " CTAs of " + std::to_string(f.ipt) +
           " items a thread needs more threads a CTA than the kernel takes (" + std::to_string(swiglu_cluster_max_threads(f.ipt)) + ")";
  return "";
}

bool swiglu_fp8_form_fits(const SwigluFp8Form& f, int64_t ffn) { return swiglu_form_misfit(f, ffn).empty(); }

void swiglu_fp8_quant_as(const SwigluFp8Form& f, const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi,
                         int64_t split, uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  if (!swiglu_fp8_quant_fits(ffn, kp))
    throw Error(Status::Internal, "internal_error", "swiglu_fp8_quant: ffn " + std::to_string(ffn) + ", kp " + std::to_string(kp) + " do not fit");
  if (const std::string why = swiglu_form_misfit(f, ffn); !why.empty()) throw Error(Status::Internal, "internal_error", "swiglu_fp8_quant: " + why);
  if (L == 0) return;
  const GuScales sc{rs, cs_lo, cs_hi, split};
  if (f.min_blocks == 2) {
    launch_swiglu_fp8_quant_regs<2>(gu, L, ffn, sc, q, kp, scale, s);
  } else if (f.min_blocks == 4) {
    launch_swiglu_fp8_quant_cluster_lab<4>(gu, L, ffn, sc, q, kp, scale, s);
  } else if (f.cluster == 0) {
    launch_swiglu_fp8_quant_rows(gu, L, ffn, sc, q, kp, scale, s);
  } else if (f.ipt == 1) {
    launch_swiglu_fp8_quant_cluster<1>(gu, L, ffn, sc, q, kp, scale, f.cluster, s);
  } else if (f.ipt == 2) {
    launch_swiglu_fp8_quant_cluster<2>(gu, L, ffn, sc, q, kp, scale, f.cluster, s);
  } else {
    launch_swiglu_fp8_quant_cluster<4>(gu, L, ffn, sc, q, kp, scale, f.cluster, s);
  }
  check_launch("swiglu_fp8_quant");
}

SwigluFp8Form swiglu_fp8_form(int64_t L) {
  // from 2,048 rows the register form capped for 2 CTAs an SM (one CTA a row, no cluster exchange):
  // faster in the model at 2,048, 8,192, 16,384 and 32,768 rows, slower at 318, 512 and 1,024
  // (bench/results/2026-12-06-h100-session35.md); CLEFRT_LAB_SWIGLU_REGS_FROM_ROWS=N moves the
  // bound, 0 never takes it (and an explicit CLEFRT_LAB_SWIGLU_MIN_BLOCKS form is kept at every L)
  static const int64_t regs_from = env_count("CLEFRT_LAB_SWIGLU_REGS_FROM_ROWS", 2048, 0, int64_t(1) << 40);
  static const SwigluFp8Form f = [] {
    SwigluFp8Form d;
    if (swiglu_cluster_max_threads(1) == 0) return d;  // no thread block clusters here: the shared-row kernel
    // a row over 2 CTAs of 4 items a thread: the fastest form in the lab at 318 and 8,192 rows and
    // in the model (bench/results/2026-12-05-h100-session33.md); CLEFRT_LAB_SWIGLU_CLUSTER=0 runs
    // the shared-row kernel
    d.cluster = int(env_count("CLEFRT_LAB_SWIGLU_CLUSTER", 2, 0, 8));
    d.ipt = int(env_count("CLEFRT_LAB_SWIGLU_IPT", 4, 1, 4));
    if (d.ipt == 3) throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_SWIGLU_IPT is 3: 1, 2 or 4 items a thread");
    d.min_blocks = int(env_count("CLEFRT_LAB_SWIGLU_MIN_BLOCKS", 0, 0, 4));
    if (d.min_blocks == 2 && d.cluster != 0) throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_SWIGLU_MIN_BLOCKS=2 is the one-CTA register form: CLEFRT_LAB_SWIGLU_CLUSTER=0 with it");
    if (d.min_blocks == 4 && (d.cluster != 2 || d.ipt != 4)) throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_SWIGLU_MIN_BLOCKS=4 is the cluster of 2 of 4 items");
    if (d.min_blocks == 1 || d.min_blocks == 3) throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_SWIGLU_MIN_BLOCKS is " + std::to_string(d.min_blocks) + ": 0, 2 or 4");
    if (d.min_blocks == 2) d.ipt = 4;
    return d;
  }();
  if (regs_from > 0 && L >= regs_from && f.min_blocks == 0 && f.cluster > 0) return SwigluFp8Form{0, 4, 2};
  return f;
}

void bias_act(float* y, int64_t rows, int64_t n, int64_t ldy, const float* bias, bool gelu, cudaStream_t s) {
  if (rows == 0) return;
  bias_act_k<<<grid_for(rows * n), 256, 0, s>>>(y, rows, n, ldy, bias, gelu);
  check_launch("bias_act");
}


void f32_to_bf16_rows(const float* x, int64_t rows, int64_t d, int64_t ldx, bf16* y, int64_t ldy, cudaStream_t s) {
  if (rows == 0 || d == 0) return;
  rows_to_bf16_k<<<grid_for(rows * d), 256, 0, s>>>(x, rows, d, ldx, y, ldy);
  check_launch("f32_to_bf16");
}

void fill_normal_bf16(bf16* p, int64_t n, uint64_t seed, float mean, float std, cudaStream_t s) {
  if (n == 0) return;
  fill_bf16_k<<<grid_for(n), 256, 0, s>>>(p, n, seed, mean, std);
  check_launch("fill_normal_bf16");
}

void fill_normal_f32(float* p, int64_t n, uint64_t seed, float mean, float std, cudaStream_t s) {
  if (n == 0) return;
  fill_f32_k<<<grid_for(n), 256, 0, s>>>(p, n, seed, mean, std);
  check_launch("fill_normal_f32");
}

bool kernels_have_image(std::string* why) {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, embed_gather_k);
  if (e == cudaSuccess) return true;
  cudaGetLastError();  // clear it: the caller reports
  if (why) *why = cudaGetErrorString(e);
  return false;
}

void gpu_wait_us(int64_t us, cudaStream_t s) {
  gpu_wait_k<<<1, 1, 0, s>>>((unsigned long long)us * 1000ull);
  check_launch("gpu_wait_us");
}

}  // namespace clefrt::cuda

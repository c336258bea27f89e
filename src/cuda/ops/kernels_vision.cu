// The vision tower's own elementwise kernels (spec/model.md 2), the CUDA twins of the steps of
// model/vision.cpp between its GEMMs: the patch embedding's bias and interpolated position row,
// the qkv bias with the 2-D rotary, and the MLPs' bias + GELU. The LayerNorms, GEMMs and the
// attention are the backbone's kernels.
#include <cmath>

#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"
#include "cuda/runtime/check.h"

namespace clefrt::cuda {

namespace {

__global__ void vision_embed_finish_k(float* x, int64_t S, int64_t H, const float* bias, const float* table, const int32_t* idx4,
                                      const float* wt4) {
  const int64_t total = S * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / H, c = i - s * H;
    const int32_t* id = idx4 + 4 * s;
    const float* wt = wt4 + 4 * s;
    float pos = table[int64_t(id[0]) * H + c] * wt[0];
    for (int k = 1; k < 4; ++k) pos += table[int64_t(id[k]) * H + c] * wt[k];
    x[i] = (x[i] + bias[c]) + pos;
  }
}

// One thread per (patch, head, padded dim).
__global__ void vision_qkv_rope_k(const float* qkv, int64_t n, int64_t r0, const float* bias, const int32_t* row, const int32_t* col,
                                  const float* inv_freq, int64_t heads, int64_t hd, int64_t Dp, bf16* q, bf16* k, bf16* v) {
  const int64_t H = heads * hd, half = hd / 2, nf = hd / 4, total = n * heads * Dp;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / (heads * Dp), rem = i - r * heads * Dp, h = rem / Dp, d = rem - h * Dp;
    const int64_t out = (r0 + r) * heads * Dp + h * Dp + d;
    if (d >= hd) {
      q[out] = k[out] = v[out] = __float2bfloat16(0.0f);
      continue;
    }
    const float* src = qkv + r * 3 * H;
    const int64_t c = h * hd + d, p = h * hd + (d < half ? d + half : d - half);
    const int64_t j = d < half ? d : d - half;
    const float pos = float(j < nf ? row[r0 + r] : col[r0 + r]);
    const float ang = pos * inv_freq[j % nf];
    const float cs = cosf(ang), sn = sinf(ang);
    const float qa = src[c] + bias[c], qb = src[p] + bias[p];
    const float ka = src[H + c] + bias[H + c], kb = src[H + p] + bias[H + p];
    q[out] = __float2bfloat16(d < half ? qa * cs - qb * sn : qa * cs + qb * sn);
    k[out] = __float2bfloat16(d < half ? ka * cs - kb * sn : ka * cs + kb * sn);
    v[out] = __float2bfloat16(src[2 * H + c] + bias[2 * H + c]);
  }
}

// One thread per pair of dims (hd is even): rows of Dp apart in, hd apart out.
__global__ void vision_pack_heads_k(const __nv_bfloat162* src, int64_t rows, int64_t half, int64_t half_p, __nv_bfloat162* dst) {
  const int64_t total = rows * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / half, c = i - r * half;
    dst[i] = src[r * half_p + c];
  }
}

__global__ void vision_patchify_k(const uint8_t* rgb, int64_t width, int64_t grid_w, int64_t M, int64_t P, int64_t T, int64_t row0,
                                  int64_t n, bf16* out) {
  const int64_t cols = 3 * T * P * P, total = n * cols, bw_n = grid_w / M;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = row0 + i / cols, e = i - (i / cols) * cols;
    const int64_t mw = r % M, mh = (r / M) % M, blk = r / (M * M), bh = blk / bw_n, bwi = blk - bh * bw_n;
    const int64_t ph = bh * M + mh, pw = bwi * M + mw;
    const int64_t c = e / (T * P * P), y = (e / P) % P, x = e % P;
    const float v = float(rgb[((ph * P + y) * width + pw * P + x) * 3 + c]);
    out[i] = __float2bfloat16((v - 127.5f) / 127.5f);
  }
}

__global__ void bias_gelu_bf16_k(const float* x, int64_t rows, int64_t n, const float* bias, bool tanh_form, bf16* y) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i] + bias[i % n];
    float g;
    if (tanh_form) {  // PyTorch's gelu(approximate="tanh")
      const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
      g = 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * v * v * v)));
    } else {
      g = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    y[i] = __float2bfloat16(g);
  }
}

}  // namespace

void vision_embed_finish(float* x, int64_t S, int64_t H, const float* bias, const float* table, const int32_t* idx4, const float* wt4,
                         cudaStream_t s) {
  if (S == 0) return;
  vision_embed_finish_k<<<grid_for(S * H), 256, 0, s>>>(x, S, H, bias, table, idx4, wt4);
  check_launch("vision_embed_finish");
}

void vision_qkv_rope(const float* qkv, int64_t n, int64_t r0, const float* bias, const int32_t* row, const int32_t* col,
                     const float* inv_freq, int64_t heads, int64_t hd, int64_t Dp, bf16* q, bf16* k, bf16* v, cudaStream_t s) {
  if (n == 0) return;
  vision_qkv_rope_k<<<grid_for(n * heads * Dp), 256, 0, s>>>(qkv, n, r0, bias, row, col, inv_freq, heads, hd, Dp, q, k, v);
  check_launch("vision_qkv_rope");
}

void vision_pack_heads(const bf16* src, int64_t rows, int64_t hd, int64_t Dp, bf16* dst, cudaStream_t s) {
  if (rows == 0) return;
  if (hd % 2 || Dp % 2 || hd > Dp) throw Error(Status::Internal, "internal_error", "vision_pack_heads: head dims must be even, hd <= Dp");
  vision_pack_heads_k<<<grid_for(rows * hd / 2), 256, 0, s>>>(reinterpret_cast<const __nv_bfloat162*>(src), rows, hd / 2, Dp / 2,
                                                              reinterpret_cast<__nv_bfloat162*>(dst));
  check_launch("vision_pack_heads");
}

void vision_patchify(const uint8_t* rgb, int64_t width, int64_t grid_w, int64_t merge, int64_t P, int64_t T, int64_t row0, int64_t n,
                     bf16* out, cudaStream_t s) {
  if (n == 0) return;
  vision_patchify_k<<<grid_for(n * 3 * T * P * P), 256, 0, s>>>(rgb, width, grid_w, merge, P, T, row0, n, out);
  check_launch("vision_patchify");
}

void bias_gelu_bf16(const float* x, int64_t rows, int64_t n, const float* bias, bool tanh_form, bf16* y, cudaStream_t s) {
  if (rows * n == 0) return;
  bias_gelu_bf16_k<<<grid_for(rows * n), 256, 0, s>>>(x, rows, n, bias, tanh_form, y);
  check_launch("bias_gelu_bf16");
}

}  // namespace clefrt::cuda

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

// One CTA per patch row. The row's hd / 2 rotary angles (the same for every head) first, into
// shared memory; then a thread takes a head's dims (j, j + 1) and their partners (j + hd / 2,
// j + hd / 2 + 1); then v and the padding. 32-bit index arithmetic (the per-element 64-bit
// divisions of a flat index cost more than the data).
constexpr int kRopeMaxHalf = 64;  // hd <= 128
// Two neighbouring dims per thread (bf16x2; hd % 4 == 0 keeps every pair inside one half). x: a
// pair of the first half, y: its partners in the second; the first half gets x cos - y sin, the
// second y cos + x sin.
__device__ __forceinline__ void rotate2(float2 x, float2 y, float cs0, float sn0, float cs1, float sn1, __nv_bfloat162& first,
                                        __nv_bfloat162& second) {
  first = __floats2bfloat162_rn(x.x * cs0 - y.x * sn0, x.y * cs1 - y.y * sn1);
  second = __floats2bfloat162_rn(y.x * cs0 + x.x * sn0, y.y * cs1 + x.y * sn1);
}
__global__ void vision_qkv_rope_k(const __nv_bfloat162* qkv, int r0, const int32_t* row, const int32_t* col, const float* inv_freq,
                                  int heads, int hd, int Dp, __nv_bfloat162* q, __nv_bfloat162* k, __nv_bfloat162* v) {
  __shared__ float sin_s[kRopeMaxHalf], cos_s[kRopeMaxHalf];
  // half: the dims of a rotary half, and the bf16 pairs of a head (hd / 2 both); hp: pairs a half
  const int r = blockIdx.x, half = hd / 2, H2 = heads * half, nf = hd / 4, hp = half / 2, Dp2 = Dp / 2;
  const __nv_bfloat162* src = qkv + int64_t(r) * 3 * H2;
  const int64_t base = int64_t(r0 + r) * heads * Dp2;
  if (int j = threadIdx.x; j < half) {
    const float ang = float(j < nf ? row[r0 + r] : col[r0 + r]) * inv_freq[j % nf];
    sincosf(ang, &sin_s[j], &cos_s[j]);
  }
  __syncthreads();
  for (int p = threadIdx.x; p < heads * hp; p += blockDim.x) {
    const int h = p / hp, j = 2 * (p - h * hp);  // dims j, j + 1 and j + half, j + half + 1 of head h
    const float cs0 = cos_s[j], sn0 = sin_s[j], cs1 = cos_s[j + 1], sn1 = sin_s[j + 1];
    const int c = h * half + j / 2, c2 = c + hp;
    const float2 qa = __bfloat1622float2(src[c]), qb = __bfloat1622float2(src[c2]);
    const float2 ka = __bfloat1622float2(src[H2 + c]), kb = __bfloat1622float2(src[H2 + c2]);
    const int64_t o = base + h * Dp2 + j / 2, o2 = o + hp;
    rotate2(qa, qb, cs0, sn0, cs1, sn1, q[o], q[o2]);
    rotate2(ka, kb, cs0, sn0, cs1, sn1, k[o], k[o2]);
  }
  const __nv_bfloat162 zero = __floats2bfloat162_rn(0.0f, 0.0f);
  for (int p = threadIdx.x; p < heads * Dp2; p += blockDim.x) {
    const int h = p / Dp2, d = p - h * Dp2;
    if (d < half) {
      v[base + p] = src[2 * H2 + h * half + d];
    } else {
      q[base + p] = k[base + p] = v[base + p] = zero;
    }
  }
}

// Packed heads (Dp == hd, hd % 8 == 0: the 27B tower's 72 on cuDNN's attention), a warp per
// patch row, 8-byte and 16-byte accesses: the row's rotary angles by its lanes into the warp's
// shared slice, then q and k in units of four dims (j..j+3 of a head's first half with their
// partners j+half..j+half+3; half % 4 == 0 keeps both 8-byte aligned), then v as 16-byte copies.
// The same sincosf and rotate2 as vision_qkv_rope_k: the same bits. InPlace: q and k rotated where
// they are in the qkv rows (q, k, v null; v stays), what the tower's attention then reads.
constexpr int kRopeRowsPerCta = 4;
template <bool InPlace>
__global__ void __launch_bounds__(32 * kRopeRowsPerCta) vision_qkv_rope_packed_k(uint2* qkv, int n, int r0, const int32_t* row,
                                                                                 const int32_t* col, const float* inv_freq, int heads,
                                                                                 int hd, uint2* q, uint2* k, uint4* v) {
  __shared__ float sin_s[kRopeRowsPerCta][kRopeMaxHalf], cos_s[kRopeRowsPerCta][kRopeMaxHalf];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = blockIdx.x * kRopeRowsPerCta + w;
  if (r >= n) return;  // whole warps: no CTA-wide barrier below
  const int half = hd / 2, nf = hd / 4, H4 = heads * hd / 4, units = heads * (half / 4), u_head = half / 4;
  for (int j = lane; j < half; j += 32) {
    const float ang = float(j < nf ? row[r0 + r] : col[r0 + r]) * inv_freq[j % nf];
    sincosf(ang, &sin_s[w][j], &cos_s[w][j]);
  }
  __syncwarp();
  uint2* src = qkv + int64_t(r) * 3 * H4;  // the row's q | k | v in 4-dim units
  uint2* qo = InPlace ? src : q + int64_t(r0 + r) * H4;
  uint2* ko = InPlace ? src + H4 : k + int64_t(r0 + r) * H4;
  auto rot = [&](uint2 a, uint2 b, int j, uint2& first, uint2& second) {
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
    __nv_bfloat162* f2 = reinterpret_cast<__nv_bfloat162*>(&first);
    __nv_bfloat162* s2 = reinterpret_cast<__nv_bfloat162*>(&second);
#pragma unroll
    for (int p = 0; p < 2; ++p)
      rotate2(__bfloat1622float2(a2[p]), __bfloat1622float2(b2[p]), cos_s[w][j + 2 * p], sin_s[w][j + 2 * p], cos_s[w][j + 2 * p + 1],
              sin_s[w][j + 2 * p + 1], f2[p], s2[p]);
  };
  for (int u = lane; u < units; u += 32) {
    const int h = u / u_head, j4 = u - h * u_head;  // head h, dims 4 j4 .. 4 j4 + 3 of its first half
    const int c = h * (hd / 4) + j4, c2 = c + u_head;
    uint2 f, s2;
    rot(src[c], src[c2], 4 * j4, f, s2);  // (in place: this lane alone reads and writes units c and c2)
    qo[c] = f;
    qo[c2] = s2;
    rot(src[H4 + c], src[H4 + c2], 4 * j4, f, s2);
    ko[c] = f;
    ko[c2] = s2;
  }
  if constexpr (!InPlace) {
    const uint4* vsrc = reinterpret_cast<const uint4*>(src + 2 * H4);
    const int H8 = H4 / 2;
    for (int i = lane; i < H8; i += 32) v[int64_t(r0 + r) * H8 + i] = vsrc[i];
  }
}

// Four dims (8 bytes) per thread: rows of Dp / 4 in, hd / 4 out.
__global__ void vision_pack_heads4_k(const uint2* src, uint32_t total, uint32_t q4, uint32_t qp4, uint2* dst) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const uint32_t r = i / q4, c = i - r * q4;
    dst[i] = src[size_t(r) * qp4 + c];
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

__global__ void bias_gelu_bf16_k(const float* x, int64_t rows, int64_t n, const float* bias, bf16* y) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(gelu_f(x[i] + bias[i % n]));
}

// n % 4 == 0 and rows * n / 4 < 2^32: four values per thread from 16-byte loads, 32-bit indices.
__global__ void bias_gelu_bf16_4_k(const float4* x, uint32_t total, uint32_t n4, const float4* bias, uint2* y) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const float4 v = x[i], b = bias[i % n4];
    __nv_bfloat162 lo = __floats2bfloat162_rn(gelu_f(v.x + b.x), gelu_f(v.y + b.y));
    __nv_bfloat162 hi = __floats2bfloat162_rn(gelu_f(v.z + b.z), gelu_f(v.w + b.w));
    y[i] = make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
  }
}

}  // namespace

void vision_embed_finish(float* x, int64_t S, int64_t H, const float* bias, const float* table, const int32_t* idx4, const float* wt4,
                         cudaStream_t s) {
  if (S == 0) return;
  vision_embed_finish_k<<<grid_for(S * H), 256, 0, s>>>(x, S, H, bias, table, idx4, wt4);
  check_launch("vision_embed_finish");
}

void vision_qkv_rope(const bf16* qkv, int64_t n, int64_t r0, const int32_t* row, const int32_t* col, const float* inv_freq,
                     int64_t heads, int64_t hd, int64_t Dp, bf16* q, bf16* k, bf16* v, cudaStream_t s) {
  if (n == 0) return;
  if (hd % 4 || Dp % 2 || hd > Dp || hd > 2 * kRopeMaxHalf || r0 + n > (int64_t(1) << 31) || heads * Dp > (int64_t(1) << 20))
    throw Error(Status::Internal, "internal_error",
                "vision_qkv_rope: head dims must be a multiple of 4, at most 128, within the (even) padded dims");
  using b2 = __nv_bfloat162;
  if (Dp == hd && hd % 8 == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0 &&
      (reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k)) % 8 == 0) {
    vision_qkv_rope_packed_k<false><<<unsigned((n + kRopeRowsPerCta - 1) / kRopeRowsPerCta), 32 * kRopeRowsPerCta, 0, s>>>(
        reinterpret_cast<uint2*>(const_cast<bf16*>(qkv)), int(n), int(r0), row, col, inv_freq, int(heads), int(hd),
        reinterpret_cast<uint2*>(q), reinterpret_cast<uint2*>(k), reinterpret_cast<uint4*>(v));
    check_launch("vision_qkv_rope");
    return;
  }
  vision_qkv_rope_k<<<unsigned(n), 128, 0, s>>>(reinterpret_cast<const b2*>(qkv), int(r0), row, col, inv_freq, int(heads), int(hd), int(Dp),
                                                reinterpret_cast<b2*>(q), reinterpret_cast<b2*>(k), reinterpret_cast<b2*>(v));
  check_launch("vision_qkv_rope");
}

void vision_qkv_rope_inplace(bf16* qkv, int64_t n, int64_t r0, const int32_t* row, const int32_t* col, const float* inv_freq,
                             int64_t heads, int64_t hd, cudaStream_t s) {
  if (n == 0) return;
  if (hd % 8 || hd > 2 * kRopeMaxHalf || r0 + n > (int64_t(1) << 31) || heads * hd > (int64_t(1) << 20) ||
      reinterpret_cast<uintptr_t>(qkv) % 16)
    throw Error(Status::Internal, "internal_error",
                "vision_qkv_rope_inplace: head dims must be a multiple of 8, at most 128, the rows 16-byte aligned");
  vision_qkv_rope_packed_k<true><<<unsigned((n + kRopeRowsPerCta - 1) / kRopeRowsPerCta), 32 * kRopeRowsPerCta, 0, s>>>(
      reinterpret_cast<uint2*>(qkv), int(n), int(r0), row, col, inv_freq, int(heads), int(hd), nullptr, nullptr, nullptr);
  check_launch("vision_qkv_rope_inplace");
}

void vision_pack_heads(const bf16* src, int64_t rows, int64_t hd, int64_t Dp, bf16* dst, cudaStream_t s) {
  if (rows == 0) return;
  if (hd % 2 || Dp % 2 || hd > Dp) throw Error(Status::Internal, "internal_error", "vision_pack_heads: head dims must be even, hd <= Dp");
  if (hd % 4 == 0 && Dp % 4 == 0 && rows * (hd / 4) < (int64_t(1) << 32)) {
    const int64_t total = rows * (hd / 4);
    vision_pack_heads4_k<<<grid_for(total), 256, 0, s>>>(reinterpret_cast<const uint2*>(src), uint32_t(total), uint32_t(hd / 4), uint32_t(Dp / 4),
                                                         reinterpret_cast<uint2*>(dst));
  } else {
    vision_pack_heads_k<<<grid_for(rows * hd / 2), 256, 0, s>>>(reinterpret_cast<const __nv_bfloat162*>(src), rows, hd / 2, Dp / 2,
                                                                reinterpret_cast<__nv_bfloat162*>(dst));
  }
  check_launch("vision_pack_heads");
}

void vision_patchify(const uint8_t* rgb, int64_t width, int64_t grid_w, int64_t merge, int64_t P, int64_t T, int64_t row0, int64_t n,
                     bf16* out, cudaStream_t s) {
  if (n == 0) return;
  vision_patchify_k<<<grid_for(n * 3 * T * P * P), 256, 0, s>>>(rgb, width, grid_w, merge, P, T, row0, n, out);
  check_launch("vision_patchify");
}

void bias_gelu_bf16(const float* x, int64_t rows, int64_t n, const float* bias, bf16* y, cudaStream_t s) {
  if (rows * n == 0) return;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(bias) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
  if (n % 4 == 0 && aligned && rows * n / 4 < (int64_t(1) << 32)) {
    const int64_t total = rows * n / 4;
    bias_gelu_bf16_4_k<<<grid_for(total), 256, 0, s>>>(reinterpret_cast<const float4*>(x), uint32_t(total), uint32_t(n / 4),
                                                       reinterpret_cast<const float4*>(bias), reinterpret_cast<uint2*>(y));
  } else {
    bias_gelu_bf16_k<<<grid_for(rows * n), 256, 0, s>>>(x, rows, n, bias, y);
  }
  check_launch("bias_gelu_bf16");
}

}  // namespace clefrt::cuda

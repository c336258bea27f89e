// The joint schema head's small kernels (spec/model.md 4): span means, the option summary, the
// unmasked MHA over a request's memory, the scorer features, and the final logits + softmax.
// Rows of different requests sit in one packed matrix; index arrays say which rows belong
// together, so a batch of requests runs the head in one pass.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/runtime/check.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"

namespace clefrt::cuda {

namespace {

__global__ void span_mean_k(const float* x, int64_t ldx, const bf16* table, const int32_t* ids, const int32_t* begin, const int32_t* end,
                            int64_t d, float* out32, bf16* out16) {
  const int64_t i = blockIdx.y;
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= d) return;
  const int32_t b = begin[i], e = end[i];
  float acc = 0;
  for (int32_t t = b; t < e; ++t)
    acc += table ? __bfloat162float(table[int64_t(ids[t]) * d + col]) : x[int64_t(t) * ldx + col];
  const float m = acc / float(max(1, e - b));
  if (out32) out32[i * d + col] = m;
  if (out16) out16[i * d + col] = __float2bfloat16(m);
}

__global__ void gather_rows_k(const float* src, int64_t d, const int32_t* idx, float* out32, bf16* out16) {
  const int64_t i = blockIdx.y, col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= d) return;
  const float v = src[int64_t(idx[i]) * d + col];
  if (out32) out32[i * d + col] = v;
  if (out16) out16[i * d + col] = __float2bfloat16(v);
}

__global__ void gather_rows_add_k(const float* src, int64_t d, const int32_t* idx, float* out) {
  const int64_t i = blockIdx.y, col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= d) return;
  out[i * d + col] += src[int64_t(idx[i]) * d + col];
}

__global__ void scatter_rows_k(const float* src, int64_t d, const int32_t* idx, float* out) {
  const int64_t i = blockIdx.y, col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= d) return;
  out[int64_t(idx[i]) * d + col] = src[i * d + col];
}

// One CTA of 128 threads per (query row, head), one pass over the keys with an online softmax:
// each thread a strided subset of the keys, its running max, sum and weighted values rescaled
// when its max grows; the threads' partials merged through shared memory. A key's dot product
// in four partial sums (four independent FMA chains).
constexpr int kMhaThreads = 128;
// Vec: 16-byte loads of the key and value rows (aligned rows); the same operations either way.
template <int HD, bool Vec>
__global__ void __launch_bounds__(kMhaThreads) mha_k(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v, int64_t ldv,
                                                     const int32_t* kbeg, const int32_t* kend, float* out, int64_t ldo) {
  static_assert(HD % 4 == 0, "four partial dot products");
  __shared__ float qs[HD];
  __shared__ float red[32];
  __shared__ float acc_s[kMhaThreads / 32][HD];
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y, tid = threadIdx.x;
  for (int i = tid; i < HD; i += blockDim.x) qs[i] = q[r * ldq + int64_t(h) * HD + i];
  __syncthreads();
  const int32_t b = kbeg[r], e = kend[r];
  const float scale = rsqrtf(float(HD));
  float m = -INFINITY, l = 0;
  float acc[HD];
#pragma unroll
  for (int i = 0; i < HD; ++i) acc[i] = 0;
  for (int32_t t = b + tid; t < e; t += blockDim.x) {
    const float* kr = k + int64_t(t) * ldk + int64_t(h) * HD;
    const float* vr = v + int64_t(t) * ldv + int64_t(h) * HD;
    auto at = [&](const float* row, int i) {  // row[i .. i + 4)
      if constexpr (Vec) return *reinterpret_cast<const float4*>(row + i);
      else return make_float4(row[i], row[i + 1], row[i + 2], row[i + 3]);
    };
    float s4[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < HD; i += 4) {
      const float4 kv = at(kr, i);
      s4[0] += qs[i] * kv.x;
      s4[1] += qs[i + 1] * kv.y;
      s4[2] += qs[i + 2] * kv.z;
      s4[3] += qs[i + 3] * kv.w;
    }
    const float s = ((s4[0] + s4[1]) + (s4[2] + s4[3])) * scale;
    if (s > m) {  // the running max grows: rescale what was summed under the old one
      const float f = expf(m - s);
      l *= f;
#pragma unroll
      for (int i = 0; i < HD; ++i) acc[i] *= f;
      m = s;
    }
    const float p = expf(s - m);
    l += p;
#pragma unroll
    for (int i = 0; i < HD; i += 4) {
      const float4 vv = at(vr, i);
      acc[i] += p * vv.x;
      acc[i + 1] += p * vv.y;
      acc[i + 2] += p * vv.z;
      acc[i + 3] += p * vv.w;
    }
  }
  const float mb = block_max(m, red);
  const float f = m == -INFINITY ? 0.0f : expf(m - mb);  // a thread without keys adds nothing
  l = block_sum(l * f, red);
  const int lane = tid & 31, w = tid >> 5;
#pragma unroll
  for (int i = 0; i < HD; ++i) {
    const float s = warp_sum(acc[i] * f);
    if (lane == 0) acc_s[w][i] = s;
  }
  __syncthreads();
  for (int i = tid; i < HD; i += blockDim.x) {
    float s = 0;
    for (int ww = 0; ww < kMhaThreads / 32; ++ww) s += acc_s[ww][i];
    out[r * ldo + int64_t(h) * HD + i] = l > 0 ? s / l : 0.0f;
  }
}

// One CTA per question.
__global__ void option_summary_k(const float* R, const float* B, const int32_t* opt_beg, int64_t W, float* summary) {
  extern __shared__ float p[];  // options of this question
  __shared__ float red[32];
  const int64_t i = blockIdx.x;
  const int32_t j0 = opt_beg[i], n = opt_beg[i + 1] - j0;
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t x = threadIdx.x; x < W; x += blockDim.x) s += R[(j0 + j) * W + x] * B[i * W + x];
    s = block_sum(s, red);
    if (threadIdx.x == 0) p[j] = s / sqrtf(float(W));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; ++j) mx = fmaxf(mx, p[j]);
    for (int j = 0; j < n; ++j) sum += (p[j] = expf(p[j] - mx));
    for (int j = 0; j < n; ++j) p[j] /= sum;
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < W; x += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += p[j] * R[(j0 + j) * W + x];
    summary[i * W + x] = acc;
  }
}

__global__ void field_init_k(float* F, const float* add, const float* gp, const float* type_emb, const int32_t* type, const int32_t* qreq,
                             int64_t Q, int64_t W) {
  const int64_t n = Q * W;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / W, x = e - i * W;
    const float f = add ? F[e] + add[e] : F[e];
    F[e] = f + (gp[int64_t(qreq[i]) * W + x] + type_emb[int64_t(type[i]) * W + x]);
  }
}

__global__ void scorer_features_k(const float* F, const float* On, const int32_t* qof, int64_t O, int64_t W, float* feat) {
  const int64_t n = O * W;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e / W, x = e - j * W;
    const float f = F[int64_t(qof[j]) * W + x], o = On[e];
    float* r = feat + j * 4 * W;
    r[x] = f;
    r[W + x] = o;
    r[2 * W + x] = f * o;
    r[3 * W + x] = fabsf(f - o);
  }
}

// One CTA per option.
__global__ void head_logits_k(const float* lex, const float* qm, const float* glast, const int32_t* qof, const int32_t* oreq, int64_t d,
                              const float* F, const float* On, int64_t W, const float* hid, const float* w3, int64_t sh, HeadScalars hs,
                              float* logits) {
  __shared__ float red[32];
  const int64_t j = blockIdx.x, i = qof[j], rq = oreq[j];
  float ll = 0, qq = 0, lq = 0;
  for (int64_t x = threadIdx.x; x < d; x += blockDim.x) {
    const float a = lex[j * d + x], b = qm[i * d + x] + glast[rq * d + x];
    ll += a * a;
    qq += b * b;
    lq += a * b;
  }
  ll = block_sum(ll, red);
  qq = block_sum(qq, red);
  lq = block_sum(lq, red);
  float ff = 0, oo = 0, fo = 0, rs = 0;
  for (int64_t x = threadIdx.x; x < W; x += blockDim.x) {
    const float a = F[i * W + x], b = On[j * W + x];
    ff += a * a;
    oo += b * b;
    fo += a * b;
  }
  for (int64_t x = threadIdx.x; x < sh; x += blockDim.x) rs += hid[j * sh + x] * w3[x];
  ff = block_sum(ff, red);
  oo = block_sum(oo, red);
  fo = block_sum(fo, red);
  rs = block_sum(rs, red);
  if (threadIdx.x == 0) {
    const float prior = hs.prior_scale * lq / (fmaxf(sqrtf(ll), 1e-12f) * fmaxf(sqrtf(qq), 1e-12f));
    const float joint = hs.joint_scale * fo / fmaxf(sqrtf(ff) * sqrtf(oo), 1e-8f) + rs + hs.b3;
    logits[j] = prior + hs.gate * joint;
  }
}

__global__ void question_softmax_k(float* logits, const int32_t* opt_beg, int64_t Q) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= Q) return;
  const int32_t b = opt_beg[i], e = opt_beg[i + 1];
  float mx = -INFINITY, sum = 0;
  for (int32_t j = b; j < e; ++j) mx = fmaxf(mx, logits[j]);
  for (int32_t j = b; j < e; ++j) sum += (logits[j] = expf(logits[j] - mx));
  for (int32_t j = b; j < e; ++j) logits[j] /= sum;
}

// ---- the head's Linears over question / option rows ----
// y[m, n] (+)= x[m, k] w[n, k]^T in fp32 for a handful of rows. A warp owns 8 rows x 4 columns
// over one slice of k: k is cut into slices of hg_slice(k) elements (1,024, or k / 8 rounded up
// where k is longer), in groups of 8 elements; lane l takes its slice's groups l, l + 32, ... in
// that order, each group's eight terms in order (one FMA chain per element); the 32 lane sums
// combine by a fixed reduce-scatter butterfly, and the slices' sums add in slice order through
// shared memory. Every element's operations depend on k only, never on m or where its row sits:
// batch-invariant by construction. A CTA holds one column group's slices (k > 1,024) or two
// column groups of one slice each, so the weights are read by every SM with 16-byte loads, a lane
// at most four groups deep (the next group's weights in flight). The previous form (8 warps
// splitting k into 4-element chunks) and this one are compared in dev/cuda/head_gemm.cu. Rather
// than 128-row cuBLASLt tiles of which a request's few questions used a handful of rows (4.8 of
// the blog request's 8 ms head), or one thread's FMA chain over k (170 us a GEMM: too few CTAs,
// each latency-bound).
// The weights may be bf16 (the release's head is, so they are held as the file has them: half
// the memory) and are widened exactly to fp32 as they are read: the same FMAs on the same values.
// The Linear's bias (and the feedforward's GELU) are applied as the element is written, in
// bias_act's order (sum, + bias, GELU): its bits without its launch.
constexpr int kHgRows = 8, kHgCols = 4, kHgGroup = 8, kHgMaxSlices = 8;
constexpr int64_t kHgSlice = 1024;  // elements of k a warp sums where k allows
// a slice's elements: a multiple of the group, depending on k alone
inline int64_t hg_slice(int64_t k) {
  const int64_t eighth = ((k + kHgMaxSlices - 1) / kHgMaxSlices + kHgGroup - 1) / kHgGroup * kHgGroup;
  return eighth > kHgSlice ? eighth : kHgSlice;
}
static_assert(kHgRows * kHgCols == 32, "a lane per output element of the warp's tile");
__device__ __forceinline__ float hg_f32(float v) { return v; }
__device__ __forceinline__ float hg_f32(bf16 v) { return __bfloat162float(v); }
// a group of 8 weights raw (16 bytes of bf16, 32 of fp32; 16-byte aligned), widened at use
template <class WT>
struct HgRaw;
template <>
struct HgRaw<bf16> {
  uint4 u;
  __device__ __forceinline__ void load(const bf16* p) { u = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ float operator[](int e) const {  // element e: the low half of word e / 2 first
    const uint32_t wd = e < 2 ? u.x : e < 4 ? u.y : e < 6 ? u.z : u.w;
    return __uint_as_float(e % 2 ? wd & 0xffff0000u : wd << 16);
  }
};
template <>
struct HgRaw<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = __ldg(reinterpret_cast<const float4*>(p));
    b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ float operator[](int e) const {
    return e == 0 ? a.x : e == 1 ? a.y : e == 2 ? a.z : e == 3 ? a.w : e == 4 ? b.x : e == 5 ? b.y : e == 6 ? b.z : b.w;
  }
};
// 8 consecutive values from p (element 8 g of a k-long row), those at or past k as 0 (scalar form)
template <class T>
__device__ __forceinline__ void hg_load_scalar(const T* p, int64_t left, float (&v)[kHgGroup]) {
#pragma unroll
  for (int e = 0; e < kHgGroup; ++e) v[e] = e < left ? hg_f32(p[e]) : 0.0f;
}

template <bool Vec, class WT>
__global__ void __launch_bounds__(kHgMaxSlices * 32) head_gemm_k(const float* x, int64_t ldx, int64_t m, int64_t k, const WT* w, int64_t n,
                                                                 float* y, int64_t ldy, bool accumulate, const float* bias, bool gelu,
                                                                 int64_t slice) {
  __shared__ float part[kHgMaxSlices][32];
  // blockDim: x 32 lanes x column groups (2 where k is one slice, else 1), y the slices
  const int lane = threadIdx.x & 31, sl = threadIdx.y, slices = blockDim.y;
  const int64_t c0 = (int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) * kHgCols, r0 = int64_t(blockIdx.y) * kHgRows;
  const bool live = c0 < n;  // the last CTA's second column group may fall past n
  const int nc = !live ? 1 : int(n - c0 < kHgCols ? n - c0 : kHgCols), nr = int(m - r0 < kHgRows ? m - r0 : kHgRows);
  float acc[kHgRows][kHgCols] = {};
  const int64_t groups = (k + kHgGroup - 1) / kHgGroup, per = slice / kHgGroup;
  const int64_t gb = sl * per, ge = live ? (gb + per < groups ? gb + per : groups) : gb;
  // the columns past n read column nc - 1 again (a valid row; their sums are never written)
  const WT* wc[kHgCols];
#pragma unroll
  for (int c = 0; c < kHgCols; ++c) wc[c] = w + ((live ? c0 : 0) + (c < nc ? c : nc - 1)) * k;
  // one group's products into acc: wv the group's weights per column, x read here
  auto group = [&](int64_t e0, const float (&wv)[kHgCols][kHgGroup]) {
#pragma unroll
    for (int r = 0; r < kHgRows; ++r) {
      if (r >= nr) continue;
      const float* xr = x + (r0 + r) * ldx + e0;
      float xv[kHgGroup];
      if constexpr (Vec) {
        const float4 a = *reinterpret_cast<const float4*>(xr), b = *reinterpret_cast<const float4*>(xr + 4);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
      } else {
        hg_load_scalar(xr, k - e0, xv);
      }
#pragma unroll
      for (int c = 0; c < kHgCols; ++c) {
        float a = acc[r][c];
#pragma unroll
        for (int e = 0; e < kHgGroup; ++e) a = fmaf(xv[e], wv[c][e], a);
        acc[r][c] = a;
      }
    }
  };
  if constexpr (Vec) {
    // the next group's weights are loaded while this one's are used: two groups' loads in flight
    HgRaw<WT> cur[kHgCols], nxt[kHgCols];
    if (gb + lane < ge)
#pragma unroll
      for (int c = 0; c < kHgCols; ++c) cur[c].load(wc[c] + (gb + lane) * kHgGroup);
#pragma unroll 1
    for (int64_t g = gb + lane; g < ge; g += 32) {
      if (g + 32 < ge)
#pragma unroll
        for (int c = 0; c < kHgCols; ++c) nxt[c].load(wc[c] + (g + 32) * kHgGroup);
      float wv[kHgCols][kHgGroup];
#pragma unroll
      for (int c = 0; c < kHgCols; ++c)
#pragma unroll
        for (int e = 0; e < kHgGroup; ++e) wv[c][e] = cur[c][e];
      group(g * kHgGroup, wv);
#pragma unroll
      for (int c = 0; c < kHgCols; ++c) cur[c] = nxt[c];
    }
  } else {
#pragma unroll 1
    for (int64_t g = gb + lane; g < ge; g += 32) {
      float wv[kHgCols][kHgGroup];
#pragma unroll
      for (int c = 0; c < kHgCols; ++c) hg_load_scalar(wc[c] + g * kHgGroup, k - g * kHgGroup, wv[c]);
      group(g * kHgGroup, wv);
    }
  }
  // the 32 lane sums of each element (warp_reduce_scatter32): lane l ends with element l, row
  // l / 4, column l % 4
  float v[32];
#pragma unroll
  for (int r = 0; r < kHgRows; ++r)
#pragma unroll
    for (int c = 0; c < kHgCols; ++c) v[r * kHgCols + c] = acc[r][c];
  float sum = warp_reduce_scatter32(v, lane);
  if (slices > 1) {  // the slices' sums in slice order
    part[sl][lane] = sum;  // one column group
    __syncthreads();
    if (sl != 0) return;
    for (int i = 1; i < slices; ++i) sum += part[i][lane];
  }
  const int r = lane / kHgCols, c = lane % kHgCols;
  if (!live || r >= nr || c >= nc) return;
  float* out = y + (r0 + r) * ldy + c0 + c;
  float y1 = accumulate ? *out + sum : sum;
  if (bias || gelu) y1 += bias ? bias[c0 + c] : 0.0f;  // as bias_act adds
  if (gelu) y1 = gelu_f(y1);
  *out = y1;
}

}  // namespace

void span_mean(const float* x, int64_t ldx, const bf16* table, const int32_t* ids, const int32_t* begin, const int32_t* end, int64_t n,
               int64_t d, float* out32, bf16* out16, cudaStream_t s) {
  if (n == 0) return;
  span_mean_k<<<dim3(unsigned((d + 255) / 256), unsigned(n)), 256, 0, s>>>(x, ldx, table, ids, begin, end, d, out32, out16);
  check_launch("head span_mean");
}

void gather_rows(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out32, bf16* out16, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_k<<<dim3(unsigned((d + 255) / 256), unsigned(n)), 256, 0, s>>>(src, d, idx, out32, out16);
  check_launch("head gather_rows");
}

void gather_rows_add(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_add_k<<<dim3(unsigned((d + 255) / 256), unsigned(n)), 256, 0, s>>>(src, d, idx, out);
  check_launch("head gather_rows_add");
}

void scatter_rows(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  scatter_rows_k<<<dim3(unsigned((d + 255) / 256), unsigned(n)), 256, 0, s>>>(src, d, idx, out);
  check_launch("head scatter_rows");
}

void mha_attend(const float* q, int64_t ldq, int64_t nq, const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* kbeg,
                const int32_t* kend, int64_t width, int64_t heads, float* out, cudaStream_t s) {
  if (nq == 0) return;
  const int64_t hd = width / heads;
  const dim3 grid{unsigned(nq), unsigned(heads), 1u};
  const bool vec = ldk % 4 == 0 && ldv % 4 == 0 && aligned16(k) && aligned16(v);  // every head's rows 16-byte aligned (hd % 4 == 0)
  auto run = [&](auto hd_c) {
    constexpr int HD = decltype(hd_c)::value;
    if (vec) mha_k<HD, true><<<grid, kMhaThreads, 0, s>>>(q, ldq, k, ldk, v, ldv, kbeg, kend, out, width);
    else mha_k<HD, false><<<grid, kMhaThreads, 0, s>>>(q, ldq, k, ldk, v, ldv, kbeg, kend, out, width);
  };
  switch (hd) {
    case 8: run(std::integral_constant<int, 8>{}); break;
    case 12: run(std::integral_constant<int, 12>{}); break;
    case 16: run(std::integral_constant<int, 16>{}); break;
    case 24: run(std::integral_constant<int, 24>{}); break;
    case 32: run(std::integral_constant<int, 32>{}); break;
    case 48: run(std::integral_constant<int, 48>{}); break;
    case 64: run(std::integral_constant<int, 64>{}); break;
    case 96: run(std::integral_constant<int, 96>{}); break;
    case 128: run(std::integral_constant<int, 128>{}); break;
    default:
      throw Error(Status::Internal, "unsupported", "head attention: head dim " + std::to_string(hd) + " (8, 12, 16, 24, 32, 48, 64, 96 or 128)");
  }
  check_launch("head mha");
}

namespace {
template <class WT>
void launch_head_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const WT* w, int64_t n, float* y, int64_t ldy, bool accumulate,
                      cudaStream_t s, const float* bias, bool gelu) {
  if (m == 0 || n == 0) return;
  if ((m + kHgRows - 1) / kHgRows > 65535)
    throw Error(Status::Internal, "internal_error", "head gemm: " + std::to_string(m) + " rows (at most 524,280 question / option rows)");
  const int64_t slice = hg_slice(k), slices = (k + slice - 1) / slice, cgroups = slices == 1 ? 2 : 1;
  const dim3 grid(unsigned((n + cgroups * kHgCols - 1) / (cgroups * kHgCols)), unsigned((m + kHgRows - 1) / kHgRows));
  const dim3 threads(unsigned(32 * cgroups), unsigned(slices));
  // 16-byte loads of 8-element groups when every row start is aligned for them; both forms do
  // the same operations
  const bool vec = k % kHgGroup == 0 && ldx % 4 == 0 && aligned16(x) && aligned16(w);
  if (vec) head_gemm_k<true, WT><<<grid, threads, 0, s>>>(x, ldx, m, k, w, n, y, ldy, accumulate, bias, gelu, slice);
  else head_gemm_k<false, WT><<<grid, threads, 0, s>>>(x, ldx, m, k, w, n, y, ldy, accumulate, bias, gelu, slice);
  check_launch("head gemm");
}
}  // namespace

void head_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t n, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s, const float* bias, bool gelu) {
  launch_head_gemm(x, ldx, m, k, w, n, y, ldy, accumulate, s, bias, gelu);
}
void head_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const bf16* w, int64_t n, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s, const float* bias, bool gelu) {
  launch_head_gemm(x, ldx, m, k, w, n, y, ldy, accumulate, s, bias, gelu);
}

void option_summary(const float* R, const float* B, const int32_t* opt_beg, int64_t Q, int64_t W, float* summary, cudaStream_t s) {
  if (Q == 0) return;
  option_summary_k<<<unsigned(Q), 256, 256 * sizeof(float), s>>>(R, B, opt_beg, W, summary);
  check_launch("head option_summary");
}

void field_init(float* F, const float* add, const float* gp, const float* type_emb, const int32_t* type, const int32_t* qreq, int64_t Q, int64_t W,
                cudaStream_t s) {
  if (Q == 0) return;
  field_init_k<<<grid_for(Q * W), 256, 0, s>>>(F, add, gp, type_emb, type, qreq, Q, W);
  check_launch("head field_init");
}

void scorer_features(const float* F, const float* On, const int32_t* qof, int64_t O, int64_t W, float* feat, cudaStream_t s) {
  if (O == 0) return;
  scorer_features_k<<<grid_for(O * W), 256, 0, s>>>(F, On, qof, O, W, feat);
  check_launch("head scorer_features");
}

void head_logits(const float* lex, const float* qm, const float* glast, const int32_t* qof, const int32_t* oreq, int64_t O, int64_t d,
                 const float* F, const float* On, int64_t W, const float* hid, const float* w3, int64_t sh, HeadScalars hs, float* logits,
                 cudaStream_t s) {
  if (O == 0) return;
  head_logits_k<<<unsigned(O), 256, 0, s>>>(lex, qm, glast, qof, oreq, d, F, On, W, hid, w3, sh, hs, logits);
  check_launch("head logits");
}

void question_softmax(float* logits, const int32_t* opt_beg, int64_t Q, cudaStream_t s) {
  if (Q == 0) return;
  question_softmax_k<<<unsigned((Q + 127) / 128), 128, 0, s>>>(logits, opt_beg, Q);
  check_launch("head softmax");
}

}  // namespace clefrt::cuda

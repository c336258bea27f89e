#include "cpu/ops.h"

#include <cblas.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace clefrt::cpu {

void keep_freed_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // both or neither: setting one turns off glibc's dynamic adjustment of the other
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

namespace {

// e^x for x <= 0 (softmax arguments once the row max is subtracted), 8 lanes at a time with
// GCC vector types (libm's expf is a scalar call and was 6% of the CPU profile; -O2 does not
// vectorize float reductions by itself): x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts),
// e^r by its degree-6 Taylor polynomial (truncation < 1.2e-7 relative), 2^n from exponent bits.
// Below -87 it gives e^-87 ~ 1.6e-38 instead of a denormal: nothing a softmax can see. Within a
// few ulp of expf.
using v8f = float __attribute__((vector_size(32)));
using v8i = int32_t __attribute__((vector_size(32)));
using v4f = float __attribute__((vector_size(16)));
using v4d = double __attribute__((vector_size(32)));

// In place on one lane (F = float) or eight (F = v8f) at p: a pointer, not a vector argument,
// so no 32-byte vector crosses a call even where a compiler sees the call before inlining it
// (clang refuses vector arguments in the "default" clone of target_clones functions); always
// inlined, hence GCC's psabi note, which it issues at the end of the file, does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
template <class F, class I>
inline __attribute__((always_inline)) void exp_nonpos(float* p) {
  F x;
  std::memcpy(&x, p, sizeof x);
  const F lo = F{} - 87.0f;
  x = x < lo ? lo : x;
  // round x / ln2 to an integer by adding 1.5 * 2^23 (the sum's low mantissa bits are n)
  const F t = x * 1.44269504088896341f + 12582912.0f;
  const F n = t - 12582912.0f;
  const I ni = std::bit_cast<I>(t) - 0x4B400000;
  const F r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  F q = F{} + 1.0f / 720.0f;
  q = q * r + 1.0f / 120.0f;
  q = q * r + 1.0f / 24.0f;
  q = q * r + 1.0f / 6.0f;
  q = q * r + 0.5f;
  q = q * r + 1.0f;
  q = q * r + 1.0f;
  x = q * std::bit_cast<F>((ni + 127) << 23);
  std::memcpy(p, &x, sizeof x);
}

// One causal softmax row in place: keys [0, n) (n >= 1), the rest of the row up to `width`
// zeroed; the sum in double. Cloned for AVX2 + FMA (chosen at run time; the build targets plain
// x86-64, where the 8-lane vectors become pairs of SSE ones).
__attribute__((target_clones("arch=x86-64-v3", "default"))) void softmax_row(float* s, int64_t n, int64_t width) {
  int64_t j = 0;
  float mx = -INFINITY;
  if (n >= 8) {
    v8f m;
    std::memcpy(&m, s, sizeof m);
    for (j = 8; j + 8 <= n; j += 8) {
      v8f v;
      std::memcpy(&v, s + j, sizeof v);
      m = v > m ? v : m;
    }
    for (int l = 0; l < 8; ++l) mx = std::max(mx, m[l]);
  }
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  v4d acc0 = {0, 0, 0, 0}, acc1 = {0, 0, 0, 0};
  for (j = 0; j + 8 <= n; j += 8) {
    v8f v;
    std::memcpy(&v, s + j, sizeof v);
    v -= mx;
    std::memcpy(s + j, &v, sizeof v);
    exp_nonpos<v8f, v8i>(s + j);
    std::memcpy(&v, s + j, sizeof v);
    acc0 += __builtin_convertvector(v4f{v[0], v[1], v[2], v[3]}, v4d);
    acc1 += __builtin_convertvector(v4f{v[4], v[5], v[6], v[7]}, v4d);
  }
  double sum = (acc0[0] + acc0[1]) + (acc0[2] + acc0[3]) + ((acc1[0] + acc1[1]) + (acc1[2] + acc1[3]));
  for (; j < n; ++j) {
    s[j] -= mx;
    exp_nonpos<float, int32_t>(s + j);
    sum += double(s[j]);
  }
  const float inv = float(1.0 / sum);
  for (j = 0; j < n; ++j) s[j] *= inv;
  for (; j < width; ++j) s[j] = 0.0f;
}

// x[j] = e^x[j] for x <= 0, in place (the GDN decay factors).
__attribute__((target_clones("arch=x86-64-v3", "default"))) void exp_nonpos_row(float* x, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) exp_nonpos<v8f, v8i>(x + j);
  for (; j < n; ++j) exp_nonpos<float, int32_t>(x + j);
}

}  // namespace

// One thread pool: OpenBLAS runs single-threaded and the parallelism is ours (OpenMP). With
// both pools active they spun against each other (a third of the time in sched_yield on 2 cores).
static void blas_single_threaded() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, const float* bias) {
  if (m == 0 || n == 0) return;
  blas_single_threaded();
  const int64_t T = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (T <= 1 || m * n * k < (int64_t(1) << 18)) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x, int(k), w, int(k), 0.0f, y, int(n));
  } else if (m >= 32 * T) {  // split the rows of x
#pragma omp parallel for num_threads(int(T))
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r0 = m * t / T, r1 = m * (t + 1) / T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(r1 - r0), int(n), int(k), 1.0f, x + r0 * k, int(k), w, int(k), 0.0f,
                  y + r0 * n, int(n));
    }
  } else {  // few rows: split the outputs (rows of w)
#pragma omp parallel for num_threads(int(T))
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c0 = n * t / T, c1 = n * (t + 1) / T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(c1 - c0), int(k), 1.0f, x, int(k), w + c0 * k, int(k), 0.0f,
                  y + c0, int(n));
    }
  }
  if (bias)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += bias[c];
}

static void rms_rows(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y, bool one_plus) {
#pragma omp parallel for if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += double(xr[c]) * xr[c];
    float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = xr[c] * inv * (one_plus ? 1.0f + w[c] : w[c]);
  }
}
void rms_norm_1p(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) { rms_rows(x, rows, d, w, eps, y, true); }
void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) { rms_rows(x, rows, d, w, eps, y, false); }

void layer_norm(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps, float* y) {
#pragma omp parallel for if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < d; ++c) mean += xr[c];
    mean /= double(d);
    for (int64_t c = 0; c < d; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= double(d);
    float inv = float(1.0 / std::sqrt(var + eps));
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = float(xr[c] - mean) * inv * w[c] + b[c];
  }
}

void causal_conv_silu(const float* x, int64_t len, int64_t channels, const float* w, int64_t kernel, float* y) {
#pragma omp parallel for if (len * channels > 65536)
  for (int64_t t = 0; t < len; ++t)
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        int64_t src = t - kernel + 1 + j;
        if (src >= 0) acc += w[c * kernel + j] * x[src * channels + c];
      }
      y[t * channels + c] = silu(acc);
    }
}

void causal_conv_silu_after(const float* history, const float* x, int64_t len, int64_t channels, const float* w, int64_t kernel,
                            float* y) {
#pragma omp parallel for if (len * channels > 65536)
  for (int64_t t = 0; t < len; ++t)
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        const int64_t src = t - kernel + 1 + j;  // < 0: history row kernel - 1 + src
        acc += w[c * kernel + j] * (src >= 0 ? x[src * channels + c] : history[(kernel - 1 + src) * channels + c]);
      }
      y[t * channels + c] = silu(acc);
    }
}

void gdn_recurrent(const GdnHead& h) {
  std::vector<float> S(size_t(h.dk * h.dv), 0.0f), kv(size_t(h.dv));
  if (h.state) std::copy_n(h.state, S.size(), S.begin());
  for (int64_t t = 0; t < h.len; ++t) {
    const float* q = h.q + t * h.q_stride;
    const float* k = h.k + t * h.k_stride;
    const float* v = h.v + t * h.v_stride;
    const float decay = std::exp(h.g[t * h.gb_stride]);
    const float beta = h.beta[t * h.gb_stride];
    for (auto& s : S) s *= decay;
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < h.dk; ++i)
      for (int64_t j = 0; j < h.dv; ++j) kv[size_t(j)] += S[size_t(i * h.dv + j)] * k[i];
    for (int64_t j = 0; j < h.dv; ++j) kv[size_t(j)] = beta * (v[j] - kv[size_t(j)]);  // delta
    for (int64_t i = 0; i < h.dk; ++i)
      for (int64_t j = 0; j < h.dv; ++j) S[size_t(i * h.dv + j)] += k[i] * kv[size_t(j)];
    float* o = h.o + t * h.o_stride;
    for (int64_t j = 0; j < h.dv; ++j) o[j] = 0;
    for (int64_t i = 0; i < h.dk; ++i)
      for (int64_t j = 0; j < h.dv; ++j) o[j] += S[size_t(i * h.dv + j)] * q[i];
  }
  if (h.state) std::copy(S.begin(), S.end(), h.state);
}

// The chunked (UT transform) form of spec/model.md 1.1; the same result up to rounding.
// Cloned for AVX2 like softmax_row (the per-element loops below are `omp simd`), without FMA
// contraction: the substitution rounds as the scalar build does (the oracle fixtures amplify a
// changed rounding order enough to move a request across 1e-4).
__attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=off"))) void gdn_chunked(const GdnHead& h, int64_t C) {
  blas_single_threaded();  // called once per (sequence, head), inside the caller's parallel loop
  const int64_t dk = h.dk, dv = h.dv;
  std::vector<float> S(size_t(dk * dv), 0.0f);
  if (h.state) std::copy_n(h.state, S.size(), S.begin());
  // gamma (the in-chunk cumulative log decay) is kept in double: with strong decay it reaches
  // thousands within a chunk, and fp32 differences gamma_i - gamma_j would lose ~1e-4 of
  // accuracy to cancellation (seen against the reference on runs of repeated characters). The
  // difference is taken in double; its exponential (<= 1) is then fine in fp32.
  std::vector<double> gam(static_cast<size_t>(C));
  std::vector<float> Qc(size_t(C * dk)), Kc(size_t(C * dk)), Kd(size_t(C * dk)), L(size_t(C * C)), A(size_t(C * C)),
      U(size_t(C * dv)), W(size_t(C * dk)), O(size_t(C * dv)), eg(static_cast<size_t>(C)), bet(static_cast<size_t>(C));
  for (int64_t c0 = 0; c0 < h.len; c0 += C) {
    const int n = int(std::min(C, h.len - c0));
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(h.q + (c0 + i) * h.q_stride, dk, Qc.data() + i * dk);
      std::copy_n(h.k + (c0 + i) * h.k_stride, dk, Kc.data() + i * dk);
      gam[size_t(i)] = acc += h.g[(c0 + i) * h.gb_stride];
      bet[size_t(i)] = h.beta[(c0 + i) * h.gb_stride];
      eg[size_t(i)] = float(std::exp(gam[size_t(i)]));
    }
    // L = beta K K^T and A = Q K^T, both times e^(gamma_i - gamma_j) below the diagonal
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, int(dk), 1.0f, Kc.data(), int(dk), Kc.data(), int(dk), 0.0f, L.data(), n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, int(dk), 1.0f, Qc.data(), int(dk), Kc.data(), int(dk), 0.0f, A.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      float* Gi = Kd.data();  // scratch row (Kd is rebuilt below)
      const double gi = gam[size_t(i)];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) Gi[j] = float(gi - gam[size_t(j)]);  // <= 0: gamma decreases
      exp_nonpos_row(Gi, i + 1);
      float* Li = L.data() + i * n;
      float* Ai = A.data() + i * n;
      const float bi = bet[size_t(i)];
#pragma omp simd
      for (int64_t j = 0; j < i; ++j) Li[j] = bi * Li[j] * Gi[j];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) Ai[j] *= Gi[j];
      for (int64_t j = i; j < n; ++j) Li[j] = 0.0f;
      for (int64_t j = i + 1; j < n; ++j) Ai[j] = 0.0f;
    }
    // U = (I + L)^-1 (beta V), W = (I + L)^-1 (beta K e^gamma): forward substitution
    for (int64_t i = 0; i < n; ++i) {
      const float* vi = h.v + (c0 + i) * h.v_stride;
      float* ui = U.data() + i * dv;
      float* wi = W.data() + i * dk;
      for (int64_t x = 0; x < dv; ++x) ui[x] = bet[size_t(i)] * vi[x];
      for (int64_t x = 0; x < dk; ++x) wi[x] = bet[size_t(i)] * Kc[size_t(i * dk + x)] * eg[size_t(i)];
      for (int64_t j = 0; j < i; ++j) {
        const float l = L[size_t(i * n + j)];
        if (l == 0.0f) continue;
        const float* uj = U.data() + j * dv;
        const float* wj = W.data() + j * dk;
#pragma omp simd
        for (int64_t x = 0; x < dv; ++x) ui[x] -= l * uj[x];
#pragma omp simd
        for (int64_t x = 0; x < dk; ++x) wi[x] -= l * wj[x];
      }
    }
    // Vn = U - W S (in place in U)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, int(dv), int(dk), -1.0f, W.data(), int(dk), S.data(), int(dv), 1.0f, U.data(),
                int(dv));
    // O = (Q e^gamma) S + A Vn
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < dk; ++x) Qc[size_t(i * dk + x)] *= eg[size_t(i)];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, int(dv), int(dk), 1.0f, Qc.data(), int(dk), S.data(), int(dv), 0.0f, O.data(),
                int(dv));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, int(dv), n, 1.0f, A.data(), n, U.data(), int(dv), 1.0f, O.data(), int(dv));
    for (int64_t i = 0; i < n; ++i) std::copy_n(O.data() + i * dv, dv, h.o + (c0 + i) * h.o_stride);
    // S = e^gamma_C S + (K e^(gamma_C - gamma))^T Vn
    const double gC = gam[size_t(n - 1)];
    const float eC = float(std::exp(gC));
    for (auto& v : S) v *= eC;
    for (int64_t i = 0; i < n; ++i) {
      const float e = std::exp(float(gC - gam[size_t(i)]));
      for (int64_t x = 0; x < dk; ++x) Kd[size_t(i * dk + x)] = Kc[size_t(i * dk + x)] * e;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(dk), int(dv), n, 1.0f, Kd.data(), int(dk), U.data(), int(dv), 1.0f, S.data(),
                int(dv));
  }
  if (h.state) std::copy(S.begin(), S.end(), h.state);
}

void attention_causal(const float* q, const float* k, const float* v, int64_t len, int64_t hq, int64_t hkv, int64_t d,
                      int64_t q_stride, int64_t kv_stride, float* out) {
  attention_causal_rows(q, 0, len, k, v, hq, hkv, d, q_stride, kv_stride, out);
}

void attention_causal_rows(const float* q, int64_t first, int64_t rows_total, const float* k, const float* v, int64_t hq, int64_t hkv,
                           int64_t d, int64_t q_stride, int64_t kv_stride, float* out) {
  // Blocks of query rows: S = Q_blk K^T (sgemm), causal softmax per row, O_blk = P V (sgemm).
  const float scale = 1.0f / std::sqrt(float(d));
  const int64_t group = hq / hkv;
  const int64_t B = kAttentionBlock, end = first + rows_total;
  blas_single_threaded();
#pragma omp parallel for schedule(dynamic)
  for (int64_t h = 0; h < hq; ++h) {
    std::vector<float> S(static_cast<size_t>(std::min(B, rows_total) * end));
    const int64_t kh = h / group;
    const float* kb = k + kh * d;
    const float* vb = v + kh * d;
    for (int64_t i0 = first; i0 < end; i0 += B) {
      const int64_t rows = std::min(B, end - i0), keys = i0 + rows;  // keys beyond the block's last row are masked
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(d), scale, q + (i0 - first) * q_stride + h * d,
                  int(q_stride), kb, int(kv_stride), 0.0f, S.data(), int(keys));
      for (int64_t r = 0; r < rows; ++r) softmax_row(S.data() + r * keys, i0 + r + 1, keys);  // causal: keys 0..i0+r
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(keys), 1.0f, S.data(), int(keys), vb,
                  int(kv_stride), 0.0f, out + ((i0 - first) * hq + h) * d, int(hq * d));
    }
  }
}

void attention_full(const float* q, int64_t lq, const float* k, const float* v, int64_t lk, int64_t width, int64_t heads,
                    float* out) {
  const int64_t d = width / heads;
  const float scale = 1.0f / std::sqrt(float(d));
#pragma omp parallel for collapse(2) if (lq * heads > 64)
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < lq; ++i) {
      std::vector<float> p(static_cast<size_t>(lk));
      const float* qi = q + i * width + h * d;
      float mx = -INFINITY;
      for (int64_t j = 0; j < lk; ++j) {
        const float* kj = k + j * width + h * d;
        float s = 0;
        for (int64_t x = 0; x < d; ++x) s += qi[x] * kj[x];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - mx));
      float* o = out + i * width + h * d;
      for (int64_t x = 0; x < d; ++x) o[x] = 0;
      for (int64_t j = 0; j < lk; ++j) {
        const float w = float(p[size_t(j)] / sum);
        const float* vj = v + j * width + h * d;
        for (int64_t x = 0; x < d; ++x) o[x] += w * vj[x];
      }
    }
}

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x / std::sqrt(2.0f))); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace clefrt::cpu

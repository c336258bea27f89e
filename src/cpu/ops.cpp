#include "cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace clefrt::cpu {

void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, const float* bias) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x, int(k), w, int(k), 0.0f, y, int(n));
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

void gdn_recurrent(const GdnHead& h) {
  std::vector<float> S(size_t(h.dk * h.dv), 0.0f), kv(size_t(h.dv));
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
}

// The chunked (UT transform) form of spec/model.md 1.1; the same result up to rounding.
void gdn_chunked(const GdnHead& h, int64_t C) {
  const int64_t dk = h.dk, dv = h.dv;
  std::vector<float> S(size_t(dk * dv), 0.0f);
  // gamma (the in-chunk cumulative log decay) is kept in double: with strong decay it reaches
  // thousands within a chunk, and fp32 differences gamma_i - gamma_j would lose ~1e-4 of
  // accuracy to cancellation (seen against the reference on runs of repeated characters).
  std::vector<double> gam(static_cast<size_t>(C));
  std::vector<float> L(size_t(C * C)), A(size_t(C * C)), U(size_t(C * dv)), W(size_t(C * dk)), Vn(size_t(C * dv));
  for (int64_t c0 = 0; c0 < h.len; c0 += C) {
    const int64_t n = std::min(C, h.len - c0);
    auto q = [&](int64_t i) { return h.q + (c0 + i) * h.q_stride; };
    auto k = [&](int64_t i) { return h.k + (c0 + i) * h.k_stride; };
    auto v = [&](int64_t i) { return h.v + (c0 + i) * h.v_stride; };
    auto beta = [&](int64_t i) { return h.beta[(c0 + i) * h.gb_stride]; };
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) gam[size_t(i)] = acc += h.g[(c0 + i) * h.gb_stride];
    auto dot = [](const float* a, const float* b, int64_t d) {
      float s = 0;
      for (int64_t x = 0; x < d; ++x) s += a[x] * b[x];
      return s;
    };
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float G = i >= j ? float(std::exp(gam[size_t(i)] - gam[size_t(j)])) : 0.0f;
        L[size_t(i * C + j)] = i > j ? beta(i) * dot(k(i), k(j), dk) * G : 0.0f;
        A[size_t(i * C + j)] = i >= j ? dot(q(i), k(j), dk) * G : 0.0f;
      }
    // U = (I + L)^-1 (beta V), W = (I + L)^-1 (beta K exp(gamma)): forward substitution.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t x = 0; x < dv; ++x) U[size_t(i * dv + x)] = beta(i) * v(i)[x];
      const float eg = float(std::exp(gam[size_t(i)]));
      for (int64_t x = 0; x < dk; ++x) W[size_t(i * dk + x)] = beta(i) * k(i)[x] * eg;
      for (int64_t j = 0; j < i; ++j) {
        float l = L[size_t(i * C + j)];
        if (l == 0.0f) continue;
        for (int64_t x = 0; x < dv; ++x) U[size_t(i * dv + x)] -= l * U[size_t(j * dv + x)];
        for (int64_t x = 0; x < dk; ++x) W[size_t(i * dk + x)] -= l * W[size_t(j * dk + x)];
      }
    }
    // Vn = U - W S
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < dv; ++x) {
        float s = 0;
        for (int64_t y = 0; y < dk; ++y) s += W[size_t(i * dk + y)] * S[size_t(y * dv + x)];
        Vn[size_t(i * dv + x)] = U[size_t(i * dv + x)] - s;
      }
    // O = (Q exp(gamma)) S + A Vn
    for (int64_t i = 0; i < n; ++i) {
      float* o = h.o + (c0 + i) * h.o_stride;
      const float eg = float(std::exp(gam[size_t(i)]));
      for (int64_t x = 0; x < dv; ++x) {
        float s = 0;
        for (int64_t y = 0; y < dk; ++y) s += q(i)[y] * S[size_t(y * dv + x)];
        s *= eg;
        for (int64_t j = 0; j <= i; ++j) s += A[size_t(i * C + j)] * Vn[size_t(j * dv + x)];
        o[x] = s;
      }
    }
    // S = S exp(gamma_C) + (K exp(gamma_C - gamma))^T Vn
    const double gC = gam[size_t(n - 1)];
    const float eC = float(std::exp(gC));
    for (auto& s : S) s *= eC;
    for (int64_t j = 0; j < n; ++j) {
      const float e = float(std::exp(gC - gam[size_t(j)]));
      for (int64_t y = 0; y < dk; ++y) {
        const float kk = k(j)[y] * e;
        for (int64_t x = 0; x < dv; ++x) S[size_t(y * dv + x)] += kk * Vn[size_t(j * dv + x)];
      }
    }
  }
}

void attention_causal(const float* q, const float* k, const float* v, int64_t len, int64_t hq, int64_t hkv, int64_t d,
                      int64_t q_stride, int64_t kv_stride, float* out) {
  // Blocks of query rows: S = Q_blk K^T (sgemm), causal softmax per row, O_blk = P V (sgemm).
  const float scale = 1.0f / std::sqrt(float(d));
  const int64_t group = hq / hkv;
  const int64_t B = 256;
  std::vector<float> S(static_cast<size_t>(std::min(B, len) * len));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kh = h / group;
    const float* kb = k + kh * d;
    const float* vb = v + kh * d;
    for (int64_t i0 = 0; i0 < len; i0 += B) {
      const int64_t rows = std::min(B, len - i0), keys = i0 + rows;  // keys beyond the block's last row are masked
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(d), scale, q + i0 * q_stride + h * d,
                  int(q_stride), kb, int(kv_stride), 0.0f, S.data(), int(keys));
#pragma omp parallel for if (rows * keys > 65536)
      for (int64_t r = 0; r < rows; ++r) {
        float* srow = S.data() + r * keys;
        const int64_t last = i0 + r;  // causal: keys 0..last
        float mx = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, srow[j]);
        double sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += (srow[j] = std::exp(srow[j] - mx));
        const float inv = float(1.0 / sum);
        for (int64_t j = 0; j <= last; ++j) srow[j] *= inv;
        for (int64_t j = last + 1; j < keys; ++j) srow[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(keys), 1.0f, S.data(), int(keys), vb,
                  int(kv_stride), 0.0f, out + (i0 * hq + h) * d, int(hq * d));
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

// The CPU kernels: the chunked GDN against the recurrent form, attention against a direct
// double-precision sum, norms against their formulas; random inputs at several sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/ops.h"

namespace clefrt::cpu {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void l2norm_rows(std::vector<float>& x, int64_t rows, int64_t d, float extra_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += double(x[size_t(r * d + c)]) * x[size_t(r * d + c)];
    float inv = float(1.0 / std::sqrt(s + 1e-6)) * extra_scale;
    for (int64_t c = 0; c < d; ++c) x[size_t(r * d + c)] *= inv;
  }
}

TEST(CpuOps, GdnChunkedEqualsRecurrent) {
  std::mt19937 rng(1);
  for (int64_t len : {1, 5, 63, 64, 65, 130, 300, 2100}) {  // 2100: 33 chunks
    for (int64_t dk : {8, 32}) {
      int64_t dv = dk * 2;
      auto q = randn(size_t(len * dk), rng), k = randn(size_t(len * dk), rng), v = randn(size_t(len * dv), rng);
      l2norm_rows(q, len, dk, 1.0f / std::sqrt(float(dk)));
      l2norm_rows(k, len, dk, 1.0f);
      std::vector<float> g(static_cast<size_t>(len)), beta(static_cast<size_t>(len));
      std::uniform_real_distribution<float> u(0, 1);
      for (int64_t t = 0; t < len; ++t) {
        g[size_t(t)] = -std::exp(u(rng) - 2.0f) * softplus(u(rng) * 4 - 2);
        beta[size_t(t)] = sigmoid(u(rng) * 6 - 3);
      }
      std::vector<float> o1(size_t(len * dv), NAN), o2(size_t(len * dv), NAN);
      GdnHead h{q.data(), k.data(), v.data(), g.data(), beta.data(), len, dk, dv, dk, dk, dv, 1, dv, o1.data()};
      gdn_recurrent(h);
      h.o = o2.data();
      gdn_chunked(h, 64);
      double worst = 0;
      for (size_t x = 0; x < o1.size(); ++x) {
        ASSERT_FALSE(std::isnan(o2[x])) << "unwritten output at " << x;
        worst = std::max(worst, double(std::fabs(o1[x] - o2[x])));
      }
      EXPECT_LT(worst, 1e-5) << "len " << len << " dk " << dk;
    }
  }
}

// One token of very strong decay followed by weak decay: the in-chunk cumulative log decay sits
// in the thousands while its differences are small, where fp32 differences lose precision to
// cancellation. The chunked form must still agree with the recurrent one.
TEST(CpuOps, GdnChunkedEqualsRecurrentUnderStrongDecay) {
  std::mt19937 rng(5);
  const int64_t len = 200, dk = 16, dv = 16;
  auto q = randn(size_t(len * dk), rng), k = randn(size_t(len * dk), rng), v = randn(size_t(len * dv), rng);
  l2norm_rows(q, len, dk, 0.25f);
  l2norm_rows(k, len, dk, 1.0f);
  std::vector<float> g(static_cast<size_t>(len)), beta(static_cast<size_t>(len));
  std::uniform_real_distribution<float> u(0, 1);
  for (int64_t t = 0; t < len; ++t) {
    g[size_t(t)] = t % 64 == 3 ? -3000.0f * (0.5f + u(rng)) : -0.05f * u(rng);
    beta[size_t(t)] = sigmoid(u(rng) * 6 - 3);
  }
  std::vector<float> o1(size_t(len * dv)), o2(size_t(len * dv));
  GdnHead h{q.data(), k.data(), v.data(), g.data(), beta.data(), len, dk, dv, dk, dk, dv, 1, dv, o1.data()};
  gdn_recurrent(h);
  h.o = o2.data();
  gdn_chunked(h, 64);
  double worst = 0;
  for (size_t x = 0; x < o1.size(); ++x) worst = std::max(worst, double(std::fabs(o1[x] - o2[x])));
  EXPECT_LT(worst, 1e-5);
}

TEST(CpuOps, CausalAttentionMatchesDirectSum) {
  std::mt19937 rng(2);
  for (int64_t len : {1, 7, 40, 300}) {  // 300: crosses a 256-row block
    const int64_t hq = 4, hkv = 2, d = 16;
    auto q = randn(size_t(len * hq * d), rng), k = randn(size_t(len * hkv * d), rng), v = randn(size_t(len * hkv * d), rng);
    std::vector<float> out(size_t(len * hq * d), NAN);
    attention_causal(q.data(), k.data(), v.data(), len, hq, hkv, d, hq * d, hkv * d, out.data());
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < len; ++i) {
        int64_t kh = h / (hq / hkv);
        std::vector<double> s(size_t(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double x = 0;
          for (int64_t c = 0; c < d; ++c) x += double(q[size_t((i * hq + h) * d + c)]) * k[size_t((j * hkv + kh) * d + c)];
          s[size_t(j)] = x / std::sqrt(double(d));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += s[size_t(j)] / sum * v[size_t((j * hkv + kh) * d + c)];
          EXPECT_NEAR(out[size_t((i * hq + h) * d + c)], o, 1e-5);
        }
      }
  }
}

TEST(CpuOps, NormsAndLinear) {
  std::mt19937 rng(3);
  const int64_t rows = 3, d = 10;
  auto x = randn(size_t(rows * d), rng), w = randn(size_t(d), rng), b = randn(size_t(d), rng);
  std::vector<float> y(size_t(rows * d));
  rms_norm_1p(x.data(), rows, d, w.data(), 1e-6f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < d; ++c) ms += double(x[size_t(r * d + c)]) * x[size_t(r * d + c)] / d;
    for (int64_t c = 0; c < d; ++c)
      EXPECT_NEAR(y[size_t(r * d + c)], x[size_t(r * d + c)] / std::sqrt(ms + 1e-6) * (1 + w[size_t(c)]), 1e-5);
  }
  layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-5f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < d; ++c) m += x[size_t(r * d + c)] / double(d);
    for (int64_t c = 0; c < d; ++c) var += (x[size_t(r * d + c)] - m) * (x[size_t(r * d + c)] - m) / d;
    for (int64_t c = 0; c < d; ++c)
      EXPECT_NEAR(y[size_t(r * d + c)], (x[size_t(r * d + c)] - m) / std::sqrt(var + 1e-5) * w[size_t(c)] + b[size_t(c)], 1e-5);
  }
  const int64_t m = 5, k = 7, n = 3;
  auto a = randn(size_t(m * k), rng), wt = randn(size_t(n * k), rng), bias = randn(size_t(n), rng);
  std::vector<float> out(size_t(m * n));
  linear(a.data(), m, k, wt.data(), n, out.data(), bias.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias[size_t(j)];
      for (int64_t c = 0; c < k; ++c) s += double(a[size_t(i * k + c)]) * wt[size_t(j * k + c)];
      EXPECT_NEAR(out[size_t(i * n + j)], s, 1e-5);
    }
}

TEST(CpuOps, CausalConv) {
  const int64_t len = 6, ch = 3, K = 4;
  std::vector<float> x(size_t(len * ch)), w(size_t(ch * K)), y(size_t(len * ch));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) - 2;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * float(i + 1);
  causal_conv_silu(x.data(), len, ch, w.data(), K, y.data());
  for (int64_t t = 0; t < len; ++t)
    for (int64_t c = 0; c < ch; ++c) {
      float acc = 0;
      for (int64_t j = 0; j < K; ++j)  // w[c, K-1] multiplies the current token
        if (t - (K - 1 - j) >= 0) acc += w[size_t(c * K + j)] * x[size_t((t - (K - 1 - j)) * ch + c)];
      EXPECT_NEAR(y[size_t(t * ch + c)], acc / (1 + std::exp(-acc)), 1e-6);
    }
  EXPECT_FLOAT_EQ(softplus(30.0f), 30.0f);
  EXPECT_NEAR(gelu_erf(1.0f), 0.8413447f, 1e-6);
}

}  // namespace
}  // namespace clefrt::cpu

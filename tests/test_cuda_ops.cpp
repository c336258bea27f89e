// Every CUDA kernel against its CPU twin (cpu/ops.h) on random inputs at several sizes.
// CTest label `gpu`; skipped where no GPU is present. Inputs that the GPU reads in bf16 are
// rounded to bf16 first on both sides, so the comparison measures the kernels, not the format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <vector>

#include "cpu/ops.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/cudnn_attention.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "cuda/ops/kernels.h"
#include "engine/engine_core.h"
#include "test_cuda_util.h"

namespace clefrt::cuda {
namespace {

using test::down;
using test::down_bf;
using test::to_bf;

std::vector<float> randn(size_t n, uint64_t seed, float std = 1.0f, float mean = 0.0f) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}
// y[r, c] = sum_i x[r, i] w[c, i] in double ([m, k] times [n, k]^T, row-major), and each
// element's sum of |terms| (the scale of its rounding)
struct DoubleGemm {
  std::vector<double> y, mag;
};
DoubleGemm gemm_double(const std::vector<float>& x, const std::vector<float>& w, int m, int n, int k) {
  DoubleGemm g{std::vector<double>(size_t(m * n)), std::vector<double>(size_t(m * n))};
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      double a = 0, b = 0;
      for (int i = 0; i < k; ++i) {
        const double p = double(x[size_t(r * k + i)]) * w[size_t(c * k + i)];
        a += p;
        b += std::fabs(p);
      }
      g.y[size_t(r * n + c)] = a;
      g.mag[size_t(r * n + c)] = b;
    }
  return g;
}

// The fp32 GEMM tests' two checks against gemm_double's reference (f32_gemm_3xtf32 and its wgmma
// form): the worst |y - y_double| / sum |x w| of a plain result and of one accumulated onto y0
// (NaN stays the worst), and rows [m / 3, m / 3 + 15), run alone by `alone` (their 15 x n
// outputs), against the bits they had inside m.
std::pair<double, double> worst_f32_gemm_errors(const std::vector<float>& got, const std::vector<float>& got_acc, const DoubleGemm& g,
                                                const std::vector<float>& y0) {
  double worst = 0, worst_acc = 0;
  for (size_t i = 0; i < g.y.size(); ++i) {
    const double e = std::fabs(double(got[i]) - g.y[i]) / std::max(g.mag[i], 1e-30);
    const double ea = std::fabs(double(got_acc[i]) - (g.y[i] + y0[i])) / (g.mag[i] + std::fabs(double(y0[i])) + 1e-30);
    if (!(e <= worst)) worst = e;
    if (!(ea <= worst_acc)) worst_acc = ea;
  }
  return {worst, worst_acc};
}
void expect_rows_alone_same(int m, int n, const std::vector<float>& got, const std::function<std::vector<float>(int r0)>& alone,
                            const std::string& at) {
  if (m < 20) return;
  const int r0 = m / 3;
  const std::vector<float> a = alone(r0);
  for (int r = 0; r < 15; ++r)
    for (int c = 0; c < n; ++c) ASSERT_EQ(a[size_t(r * n + c)], got[size_t((r0 + r) * n + c)]) << "row " << r0 + r << " col " << c << at;
}
float round_bf16(float f) { return __bfloat162float(__float2bfloat16(f)); }
std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
// max |a - b| / (atol + rtol |b|) <= 1
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]) / (atol + rtol * std::fabs(double(want[i])));
    if (!(e <= worst)) {  // NaN included: it stays the worst
      worst = e;
      at = i;
      if (std::isnan(e)) break;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at " << at << " got " << got[at] << " want " << want[at];
}

TEST(CudaOps, GemmMatchesSgemm) {
  NEED_GPU();
  Gemm gemm(nullptr, false);
  Gemm inv(nullptr, true);
  for (auto [m, n, k] : {std::tuple{1, 8, 16}, {7, 40, 64}, {129, 257, 96}, {512, 1024, 512}}) {
    auto x = rounded(randn(size_t(m * k), 1)), w = rounded(randn(size_t(n * k), 2, 0.1f)), y0 = randn(size_t(m * n), 3);
    std::vector<float> want(static_cast<size_t>(m * n));
    cpu::linear(x.data(), m, k, w.data(), n, want.data());
    DeviceBuffer dx = upload(to_bf(x), "x"), dw = upload(to_bf(w), "w"), dy = upload(y0, "y"), dy2(size_t(m * n) * 2);
    gemm.run(dx.as<bf16>(), m, k, k, dw.as<bf16>(), n, dy.get(), OutType::F32, n, true, "test gemm");
    std::vector<float> acc(want);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += y0[i];
    expect_close(down<float>(dy, acc.size()), acc, 1e-4, 1e-4, "accumulate");
    inv.run(dx.as<bf16>(), m, k, k, dw.as<bf16>(), n, dy2.get(), OutType::BF16, n, false, "test gemm bf16");
    expect_close(down_bf(dy2, want.size()), want, 1e-3, 8e-3, "bf16 out");
  }
}

// The bf16 GEMM with cuBLASLt's epilogues (the vision blocks' qkv + bias and fc1 + bias + GELU):
// against the CPU's sums + bias (+ tanh-form GELU) within bf16 rounding, at small shapes and the
// tower's, and each row's bits independent of m (40 .. 5,000 rows: the m buckets' tuning included).
TEST(CudaOps, Bf16GemmEpiloguesMatchCpuAndKeepTheirBits) {
  NEED_GPU();
  auto gelu_tanh = [](double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); };
  Gemm gemm(nullptr, true);
  for (auto [m, n, k] : {std::tuple{7, 40, 64}, {129, 264, 96}, {300, 3456, 1152}, {300, 4304, 1152}}) {
    auto x = rounded(randn(size_t(m * k), 41)), w = rounded(randn(size_t(n * k), 42, 0.05f)), bias = rounded(randn(size_t(n), 43, 0.5f));
    std::vector<float> sums(size_t(m * n));
    cpu::linear(x.data(), m, k, w.data(), n, sums.data());
    DeviceBuffer dx = upload(to_bf(x), "x"), dw = upload(to_bf(w), "w"), db = upload(to_bf(bias), "bias"), dy(size_t(m * n) * 2);
    for (Epilogue ep : {Epilogue::Bias, Epilogue::BiasGelu}) {
      std::vector<float> want(sums.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const double v = double(sums[i]) + bias[i % size_t(n)];
        want[i] = float(ep == Epilogue::BiasGelu ? gelu_tanh(v) : v);
      }
      gemm.run_epilogue(dx.as<bf16>(), m, k, k, dw.as<bf16>(), n, ep, db.as<bf16>(), dy.as<bf16>(), n, "test gemm epilogue");
      expect_close(down_bf(dy, want.size()), want, 2e-3, 8e-3,
                   std::string(ep == Epilogue::Bias ? "bias" : "bias + gelu") + " m " + std::to_string(m) + " n " + std::to_string(n));
    }
  }
  const int64_t mmax = 5000, n = 4304, k = 1152;
  DeviceBuffer x = upload(to_bf(randn(size_t(mmax * k), 44)), "x"), w = upload(to_bf(randn(size_t(n * k), 45, 0.05f)), "w"),
               b = upload(to_bf(randn(size_t(n), 46, 0.5f)), "bias"), y(size_t(mmax * n) * 2);
  for (Epilogue ep : {Epilogue::Bias, Epilogue::BiasGelu}) {
    std::vector<uint8_t> first;
    for (int64_t m : {40, 300, 512, 3072, 5000}) {
      gemm.run_epilogue(x.as<bf16>(), m, k, k, w.as<bf16>(), n, ep, b.as<bf16>(), y.as<bf16>(), n, "test gemm epilogue rows");
      check(cudaDeviceSynchronize(), "gemm");
      auto got = down<uint8_t>(y, size_t(40 * n) * 2);
      if (first.empty()) first = got;
      else EXPECT_EQ(got, first) << "epilogue " << int(ep) << " m " << m;
    }
  }
}

// The head's fp32 GEMM: against a double-precision reference at several shapes (tile edges in m,
// n and k), with and without accumulation, and each row alone equal to the row in the batch bit
// for bit (batch invariance).
// The batch-invariant bf16 GEMM with its m buckets tuned (gemm.h): a row's bits do not
// depend on m, written or accumulated (the tuning times an accumulating call into a scratch,
// leaving y's sums alone), at a 27B shape (mlp down: n 5,120, k 17,408 / 4), a small one, and a
// narrow one (the FP8 GDN in_proj's bf16 a | b rows: n 96)
static void bf16_rows_do_not_depend_on_m(int64_t n, int64_t k) {
  const int64_t mmax = 5000;
  DeviceBuffer x = upload(to_bf(randn(size_t(mmax * k), 21, 1.0f)), "x"), w = upload(to_bf(randn(size_t(n * k), 22, 0.05f)), "w"),
               y(size_t(mmax * n) * 4), base = upload(randn(size_t(mmax * n), 23, 1.0f), "y0");
  Gemm gemm(nullptr, true);
  for (bool acc : {false, true})
    for (OutType yt : {OutType::BF16, OutType::F32}) {
      if (acc && yt != OutType::F32) continue;
      const size_t es = yt == OutType::F32 ? 4 : 2;
      std::vector<uint8_t> first;
      for (int64_t m : {40, 300, 512, 1500, 5000}) {
        check(cudaMemcpy(y.get(), base.get(), size_t(mmax * n) * 4, cudaMemcpyDeviceToDevice), "y0");
        gemm.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), yt, n, acc, "test bf16");
        check(cudaDeviceSynchronize(), "gemm");
        auto got = down<uint8_t>(y, size_t(40 * n) * es);
        if (first.empty()) first = got;
        else EXPECT_EQ(got, first) << "n " << n << " k " << k << " m " << m << (acc ? " accumulate" : "") << (yt == OutType::F32 ? " fp32" : " bf16");
      }
    }
  std::cout << "bf16 n " << n << " k " << k << ": m buckets " << gemm.fp8_buckets_adopted() << " adopted another algorithm than the reference, "
            << gemm.fp8_buckets_refused() << " candidates dropped for rounding differently\n";
}

TEST(CudaOps, Bf16GemmRowsDoNotDependOnM) {
  NEED_GPU();
  bf16_rows_do_not_depend_on_m(5120, 4352);
  bf16_rows_do_not_depend_on_m(384, 512);
  bf16_rows_do_not_depend_on_m(96, 5120);
}

// The head's token-row Linears on tensor cores (f32_gemm_3xtf32) against a double-precision
// reference: within 1e-5 of each element's sum of |x w| terms (fp32-level: TF32 alone is ~1e-3),
// every element written (NaN poison), accumulate adding to y, partial tiles in m, n and k; and a
// row's bits the same alone as inside m = 318 (batch invariance).
TEST(CudaOps, F32Gemm3xTf32MatchesDoubleAndIsRowInvariant) {
  NEED_GPU();
  for (auto [m, n, k] : {std::tuple{1, 8, 4}, {17, 2048, 1024}, {318, 100, 36}, {65, 72, 132}, {3, 1024, 5120}, {130, 64, 64}}) {
    const std::string at = " at " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
    auto x = randn(size_t(m * k), 21), w = randn(size_t(n * k), 22, 0.05f), y0 = randn(size_t(m * n), 23);
    const DoubleGemm ref = gemm_double(x, w, m, n, k);
    const std::vector<double>& want = ref.y;
    DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), dy(size_t(m * n) * 4), dacc = upload(y0, "y0"), d1(size_t(15 * n) * 4);
    ASSERT_TRUE(f32_gemm_3xtf32_fits(dx.as<float>(), k, k, dw.as<float>(), k)) << at;
    check(cudaMemset(dy.get(), 0xff, size_t(m * n) * 4), "poison y");
    f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dy.as<float>(), n, false, nullptr);
    f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dacc.as<float>(), n, true, nullptr);
    check(cudaDeviceSynchronize(), "f32_gemm_3xtf32");
    const auto got = down<float>(dy, want.size()), got_acc = down<float>(dacc, want.size());
    const auto [worst, worst_acc] = worst_f32_gemm_errors(got, got_acc, ref, y0);
    std::printf("[ cuda    ] f32_gemm_3xtf32%s: worst |y - y_double| / sum |x w| %.3g, accumulate %.3g\n", at.c_str(), worst, worst_acc);
    EXPECT_LE(worst, 1e-5) << at;
    EXPECT_LE(worst_acc, 1e-5) << at;
    // rows alone (a CTA tile of their own, from another row offset) give the bits they had inside m
    expect_rows_alone_same(m, n, got, [&](int r0) {
      f32_gemm_3xtf32(dx.as<float>() + size_t(r0) * size_t(k), k, 15, k, dw.as<float>(), k, n, d1.as<float>(), n, false, nullptr);
      return down<float>(d1, size_t(15 * n));
    }, at);
    if (HasFatalFailure()) return;
    // every tile (64 x 64, 64 x 32, 32 x 32) gives the same bits, plain and accumulating
    for (int tile : {64, 32, 3232}) {
      f32_gemm_3xtf32_set_tile(tile);
      DeviceBuffer dt(size_t(m * n) * 4), dta = upload(y0, "y0");
      f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dt.as<float>(), n, false, nullptr);
      f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dta.as<float>(), n, true, nullptr);
      f32_gemm_3xtf32_set_tile(0);
      check(cudaDeviceSynchronize(), "f32_gemm_3xtf32 tiles");
      const auto t = down<float>(dt, want.size()), ta = down<float>(dta, want.size());
      EXPECT_EQ(std::memcmp(t.data(), got.data(), t.size() * 4), 0) << "tile " << tile << at;
      EXPECT_EQ(std::memcmp(ta.data(), got_acc.data(), ta.size() * 4), 0) << "tile " << tile << ", accumulating" << at;
    }
  }
  EXPECT_THROW(f32_gemm_3xtf32_set_tile(48), Error);
  // what it refuses: k not a multiple of 4 (the 16-byte copies)
  DeviceBuffer dx(64 * 4), dw(64 * 4), dy(64 * 4);
  EXPECT_FALSE(f32_gemm_3xtf32_fits(dx.as<float>(), 6, 6, dw.as<float>(), 6));
  EXPECT_THROW(f32_gemm_3xtf32(dx.as<float>(), 6, 2, 6, dw.as<float>(), 6, 2, dy.as<float>(), 2, false, nullptr), Error);
}

// The wgmma form (f32_gemm_3xtf32_wgmma, w as TF32 planes): the planes are split_tf32's (hi has
// no bits below TF32's, hi + lo == w exactly); y within 1e-5 of the double reference as the
// mma.sync form, every element written, accumulate adding; every tile (64 x 32, 64 x 64, 128 x
// 64), pipelined or not, gives the product's bits; a row's bits the same alone; a bias added as it
// writes gives bias_act's bits. Whether its values equal the mma.sync form's (the same products
// and sums) is printed, not required.
TEST(CudaOps, F32Gemm3xTf32WgmmaMatchesDoubleAndIsRowInvariant) {
  NEED_GPU();
  if (!f32_gemm_3xtf32_wgmma_available()) GTEST_SKIP() << "needs an sm_90a build on a compute capability 9.0 GPU";
  for (auto [m, n, k] : {std::tuple{1, 8, 4}, {17, 2048, 1024}, {318, 100, 36}, {65, 72, 132}, {3, 1024, 5120}, {130, 64, 64}, {318, 1024, 5120},
                         {700, 2048, 1024}, {9000, 200, 68}}) {
    const std::string at = " at " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
    auto x = randn(size_t(m * k), 31), w = randn(size_t(n * k), 32, 0.05f), y0 = randn(size_t(m * n), 33);
    const DoubleGemm ref = gemm_double(x, w, m, n, k);
    const std::vector<double>& want = ref.y;
    DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), hi(size_t(n * k) * 4), lo(size_t(n * k) * 4);
    f32_split_tf32_planes(dw.as<float>(), int64_t(n) * k, hi.as<float>(), lo.as<float>(), nullptr);
    const auto h = down<float>(hi, w.size()), l = down<float>(lo, w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t hb;
      std::memcpy(&hb, &h[i], 4);
      ASSERT_EQ(hb & 0x1fffu, 0u) << "hi keeps bits below TF32's at " << i << at;
      ASSERT_EQ(h[i] + l[i], w[i]) << "hi + lo != w at " << i << at;
    }
    DeviceBuffer dy(size_t(m * n) * 4), dacc = upload(y0, "y0"), d1(size_t(15 * n) * 4), dm(size_t(m * n) * 4);
    ASSERT_TRUE(f32_gemm_3xtf32_wgmma_fits(dx.as<float>(), k, k, hi.as<float>(), lo.as<float>(), k)) << at;
    check(cudaMemset(dy.get(), 0xff, size_t(m * n) * 4), "poison y");
    f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, hi.as<float>(), lo.as<float>(), k, n, dy.as<float>(), n, false, nullptr);
    f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, hi.as<float>(), lo.as<float>(), k, n, dacc.as<float>(), n, true, nullptr);
    f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dm.as<float>(), n, false, nullptr);
    check(cudaDeviceSynchronize(), "f32_gemm_3xtf32_wgmma");
    const auto got = down<float>(dy, want.size()), got_acc = down<float>(dacc, want.size()), mma = down<float>(dm, want.size());
    const auto [worst, worst_acc] = worst_f32_gemm_errors(got, got_acc, ref, y0);
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&got[i], &mma[i], 4) != 0;
    std::printf("[ cuda    ] f32_gemm_3xtf32_wgmma%s: worst |y - y_double| / sum |x w| %.3g, accumulate %.3g; %zu of %zu values differ from mma.sync's\n",
                at.c_str(), worst, worst_acc, differ, want.size());
    EXPECT_LE(worst, 1e-5) << at;
    EXPECT_LE(worst_acc, 1e-5) << at;
    expect_rows_alone_same(m, n, got, [&](int r0) {
      f32_gemm_3xtf32_wgmma(dx.as<float>() + size_t(r0) * size_t(k), k, 15, k, hi.as<float>(), lo.as<float>(), k, n, d1.as<float>(), n, false,
                            nullptr);
      return down<float>(d1, size_t(15 * n));
    }, at);
    if (HasFatalFailure()) return;
    // the bias as it writes: bias_act's bits after the plain GEMM
    const auto bias = randn(size_t(n), 34);
    DeviceBuffer dbias = upload(bias, "bias"), dyb(size_t(m * n) * 4), dyr(size_t(m * n) * 4);
    f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, hi.as<float>(), lo.as<float>(), k, n, dyb.as<float>(), n, false, nullptr, dbias.as<float>());
    check(cudaMemcpy(dyr.get(), dy.get(), size_t(m * n) * 4, cudaMemcpyDeviceToDevice), "y");
    bias_act(dyr.as<float>(), m, n, n, dbias.as<float>(), false, nullptr);
    EXPECT_EQ(down<float>(dyb, want.size()), down<float>(dyr, want.size())) << "bias in the epilogue vs bias_act" << at;
    // every tile, pipelined (the default) or one step at a time
    for (int form : {321, 641, 642})
      for (bool pipelined : {true, false}) {
        f32_gemm_3xtf32_wgmma_set_form(form);
        f32_gemm_3xtf32_wgmma_set_pipelined(pipelined);
        DeviceBuffer dt(size_t(m * n) * 4), dta = upload(y0, "y0");
        f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, hi.as<float>(), lo.as<float>(), k, n, dt.as<float>(), n, false, nullptr);
        f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, hi.as<float>(), lo.as<float>(), k, n, dta.as<float>(), n, true, nullptr);
        f32_gemm_3xtf32_wgmma_set_form(0);
        f32_gemm_3xtf32_wgmma_set_pipelined(true);
        check(cudaDeviceSynchronize(), "f32_gemm_3xtf32_wgmma tiles");
        const auto t = down<float>(dt, want.size()), ta = down<float>(dta, want.size());
        const std::string form_at = " tile " + std::to_string(form) + (pipelined ? " pipelined" : " step by step") + at;
        EXPECT_EQ(std::memcmp(t.data(), got.data(), t.size() * 4), 0) << form_at;
        EXPECT_EQ(std::memcmp(ta.data(), got_acc.data(), ta.size() * 4), 0) << "accumulating" << form_at;
      }
  }
  EXPECT_THROW(f32_gemm_3xtf32_wgmma_set_form(64), Error);
  DeviceBuffer dx(64 * 4), dw(64 * 4), dy(64 * 4);
  EXPECT_FALSE(f32_gemm_3xtf32_wgmma_fits(dx.as<float>(), 6, 6, dw.as<float>(), dw.as<float>(), 6));
  EXPECT_THROW(f32_gemm_3xtf32_wgmma(dx.as<float>(), 6, 2, 6, dw.as<float>(), dw.as<float>(), 6, 2, dy.as<float>(), 2, false, nullptr), Error);
}

TEST(CudaOps, HeadGemmMatchesReferenceAndIsRowInvariant) {
  NEED_GPU();
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {5, 64, 31}, {33, 100, 70}, {9, 37, 36}, {70, 1024, 1024}, {3, 96, 5120}}) {
    const std::string at = " at " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
    auto x = randn(size_t(m * k), 11), w = randn(size_t(n * k), 12, 0.05f), y0 = randn(size_t(m * n), 13);
    const std::vector<double> ref = gemm_double(x, w, m, n, k).y;
    std::vector<float> want(ref.size()), want_acc(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) want[i] = float(ref[i]), want_acc[i] = float(ref[i] + y0[i]);
    DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), dy(size_t(m * n) * 4), dacc = upload(y0, "y0"), d1(size_t(n) * 4);
    head_gemm(dx.as<float>(), k, m, k, dw.as<float>(), n, dy.as<float>(), n, false, nullptr);
    head_gemm(dx.as<float>(), k, m, k, dw.as<float>(), n, dacc.as<float>(), n, true, nullptr);
    const auto got = down<float>(dy, want.size());
    expect_close(got, want, 1e-4, 1e-4, "head_gemm" + at);
    expect_close(down<float>(dacc, want.size()), want_acc, 1e-4, 1e-4, "head_gemm accumulate" + at);
    // the same rows with a row stride of k + 1 (unaligned: the scalar loads) give the same bits
    std::vector<float> xp(size_t(m) * size_t(k + 1), 0.0f);
    for (int r = 0; r < m; ++r) std::copy(x.begin() + r * k, x.begin() + (r + 1) * k, xp.begin() + r * (k + 1));
    DeviceBuffer dxp = upload(xp, "x padded"), dyp(size_t(m * n) * 4);
    head_gemm(dxp.as<float>(), k + 1, m, k, dw.as<float>(), n, dyp.as<float>(), n, false, nullptr);
    EXPECT_EQ(down<float>(dyp, want.size()), got) << "scalar vs vector loads" << at;
    for (int r : {0, m / 2, m - 1}) {
      head_gemm(dx.as<float>() + size_t(r) * size_t(k), k, 1, k, dw.as<float>(), n, d1.as<float>(), n, false, nullptr);
      const auto alone = down<float>(d1, size_t(n));
      for (int c = 0; c < n; ++c) ASSERT_EQ(alone[size_t(c)], got[size_t(r * n + c)]) << "row " << r << " col " << c << at;
    }
    // bf16 weights (the head's matrices as the release holds them) give exactly what the fp32
    // form gives on the same values widened, with vector and scalar loads (k + 1: odd row starts)
    const auto wb = to_bf(w);
    std::vector<float> wf(wb.size());
    for (size_t i = 0; i < wb.size(); ++i) wf[i] = __bfloat162float(wb[i]);
    DeviceBuffer dwb = upload(wb, "w bf16"), dwf = upload(wf, "w widened"), dyb(size_t(m * n) * 4), dyf(size_t(m * n) * 4);
    head_gemm(dx.as<float>(), k, m, k, dwf.as<float>(), n, dyf.as<float>(), n, false, nullptr);
    head_gemm(dx.as<float>(), k, m, k, dwb.as<bf16>(), n, dyb.as<float>(), n, false, nullptr);
    const auto want_b = down<float>(dyf, want.size());
    EXPECT_EQ(down<float>(dyb, want.size()), want_b) << "bf16 weights vs the same values in fp32" << at;
    std::vector<cuda::bf16> wbp(size_t(n) * size_t(k + 1), __float2bfloat16(0.0f));
    for (int c = 0; c < n; ++c) std::copy(wb.begin() + c * k, wb.begin() + (c + 1) * k, wbp.begin() + c * (k + 1));
    DeviceBuffer dwbp = upload(wbp, "w bf16 padded"), dybp(size_t(m * n) * 4), dyfp(size_t(m * n) * 4);
    // row stride k + 1 is not a head_gemm argument for w, so run a k + 1 wide problem (odd row
    // starts where k is even: the scalar loads) with bf16 and with widened fp32 weights
    std::vector<float> xz(size_t(m) * size_t(k + 1), 0.0f);
    for (int r = 0; r < m; ++r) std::copy(x.begin() + r * k, x.begin() + (r + 1) * k, xz.begin() + r * (k + 1));
    std::vector<float> wfp(wbp.size());
    for (size_t i = 0; i < wbp.size(); ++i) wfp[i] = __bfloat162float(wbp[i]);
    DeviceBuffer dxz = upload(xz, "x zero column"), dwfp = upload(wfp, "w widened padded");
    head_gemm(dxz.as<float>(), k + 1, m, k + 1, dwbp.as<bf16>(), n, dybp.as<float>(), n, false, nullptr);
    head_gemm(dxz.as<float>(), k + 1, m, k + 1, dwfp.as<float>(), n, dyfp.as<float>(), n, false, nullptr);
    EXPECT_EQ(down<float>(dybp, want.size()), down<float>(dyfp, want.size())) << "bf16 weights, scalar loads" << at;
    const std::vector<double> ref_wb = gemm_double(x, wf, m, n, k).y;
    const std::vector<float> want_wb(ref_wb.begin(), ref_wb.end());
    expect_close(want_b, want_wb, 1e-4, 1e-4, "head_gemm bf16 weights vs double" + at);
  }
}

// The head's Linears take their bias (and GELU) in head_gemm's epilogue: the bits of head_gemm
// followed by bias_act, with and without accumulation, fp32 and bf16 weights, vector and
// scalar loads.
TEST(CudaOps, HeadGemmBiasEpilogueEqualsBiasAct) {
  NEED_GPU();
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {5, 64, 31}, {9, 37, 36}, {70, 1024, 1024}, {3, 4096, 1024}, {4, 1024, 4096}}) {
    const std::string at = " at " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
    auto x = randn(size_t(m * k), 21), w = randn(size_t(n * k), 22, 0.05f), y0 = randn(size_t(m * n), 23), bias = randn(size_t(n), 24, 0.5f);
    DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), dwb = upload(to_bf(w), "w bf16"), db = upload(bias, "bias");
    for (bool acc : {false, true})
      for (bool gelu : {false, true})
        for (bool bf : {false, true}) {
          DeviceBuffer want = upload(y0, "y0"), got = upload(y0, "y0");
          auto gemm = [&](float* y, const float* b, bool g) {
            if (bf) head_gemm(dx.as<float>(), k, m, k, dwb.as<cuda::bf16>(), n, y, n, acc, nullptr, b, g);
            else head_gemm(dx.as<float>(), k, m, k, dw.as<float>(), n, y, n, acc, nullptr, b, g);
          };
          gemm(want.as<float>(), nullptr, false);
          bias_act(want.as<float>(), m, n, n, db.as<float>(), gelu, nullptr);
          gemm(got.as<float>(), db.as<float>(), gelu);
          check(cudaDeviceSynchronize(), "head gemm epilogue");
          const auto w_ = down<float>(want, size_t(m * n)), g_ = down<float>(got, size_t(m * n));
          size_t differ = 0;
          for (size_t i = 0; i < w_.size(); ++i) differ += std::memcmp(&w_[i], &g_[i], 4) != 0;
          EXPECT_EQ(differ, 0u) << (acc ? "accumulate " : "") << (gelu ? "gelu " : "") << (bf ? "bf16 weights" : "fp32 weights") << at;
        }
  }
}

// field_init with add: F = (F + add) + (gp + type_emb), the bits of adding add in a pass of its
// own (the second question_projection the forward no longer runs) and then field_init.
TEST(CudaOps, FieldInitAddEqualsAddingFirst) {
  NEED_GPU();
  const int Q = 5, W = 96, R = 2, T = 3;
  auto F = randn(size_t(Q * W), 41), add = randn(size_t(Q * W), 42), gp = randn(size_t(R * W), 43), te = randn(size_t(T * W), 44);
  const std::vector<int32_t> type = {0, 2, 1, 1, 0}, qreq = {0, 0, 1, 1, 1};
  std::vector<float> first(F);
  for (size_t i = 0; i < first.size(); ++i) first[i] = first[i] + add[i];
  DeviceBuffer dF = upload(F, "F"), dfirst = upload(first, "F + add"), dadd = upload(add, "add"), dgp = upload(gp, "gp"), dte = upload(te, "type"),
               dtype = upload(type, "types"), dq = upload(qreq, "qreq");
  field_init(dF.as<float>(), dadd.as<float>(), dgp.as<float>(), dte.as<float>(), dtype.as<int32_t>(), dq.as<int32_t>(), Q, W, nullptr);
  field_init(dfirst.as<float>(), nullptr, dgp.as<float>(), dte.as<float>(), dtype.as<int32_t>(), dq.as<int32_t>(), Q, W, nullptr);
  check(cudaDeviceSynchronize(), "field_init");
  const auto a = down<float>(dF, size_t(Q * W)), b = down<float>(dfirst, size_t(Q * W));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  // and the value: (F + add) + (gp[qreq] + te[type]) for one element
  const size_t e = size_t(3 * W + 7);
  EXPECT_EQ(a[e], first[e] + (gp[size_t(qreq[3]) * W + 7] + te[size_t(type[3]) * W + 7]));
}

TEST(CudaOps, NormsMatchCpu) {
  NEED_GPU();
  // rms_norm_1p: a row in registers up to 8,192 (two float4 a thread), a block-per-row loop over
  // 8,200 (float4) and 1,001 (scalar)
  for (int64_t d : {16, 64, 1000, 1152, 4096, 5120, 8192, 8200, 1001}) {
    const int64_t rows = 37;
    auto x = randn(size_t(rows * d), 4, 3.0f), w = randn(size_t(d), 5, 0.1f), b = randn(size_t(d), 6, 0.1f);
    std::vector<float> want(x.size()), want_ln(x.size());
    cpu::rms_norm_1p(x.data(), rows, d, w.data(), 1e-6f, want.data());
    cpu::layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-5f, want_ln.data());
    DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), db = upload(b, "b"), y32(x.size() * 4), y16(x.size() * 2);
    rms_norm_1p(dx.as<float>(), rows, d, dw.as<float>(), 1e-6f, y16.as<bf16>(), y32.as<float>(), nullptr);
    expect_close(down<float>(y32, x.size()), want, 1e-5, 1e-5, "rms_norm_1p");
    expect_close(down_bf(y16, x.size()), want, 1e-5, 8e-3, "rms_norm_1p bf16");
    layer_norm(dx.as<float>(), rows, d, d, dw.as<float>(), db.as<float>(), 1e-5f, nullptr, y32.as<float>(), nullptr);
    expect_close(down<float>(y32, x.size()), want_ln, 1e-5, 1e-5, "layer_norm");
    // layer_norm_add: x += add in place, then the LayerNorm (one warp a row for d <= 2,048, d % 4 == 0)
    const auto add = randn(size_t(d), 7, 0.5f);
    std::vector<float> xa(x.size()), want_la(x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) xa[size_t(r * d + i)] = x[size_t(r * d + i)] + add[size_t(i)];
    cpu::layer_norm(xa.data(), rows, d, w.data(), b.data(), 1e-6f, want_la.data());
    DeviceBuffer da = upload(add, "add");
    // layer_norm_biased first: the same outputs, x left alone
    DeviceBuffer bx = upload(x, "x"), by32(x.size() * 4), by16(x.size() * 2);
    layer_norm_biased(bx.as<float>(), rows, d, d, da.as<float>(), dw.as<float>(), db.as<float>(), 1e-6f, by16.as<bf16>(), by32.as<float>(),
                      nullptr);
    EXPECT_EQ(down<float>(bx, x.size()), x) << "layer_norm_biased wrote x, d " << d;
    layer_norm_add(dx.as<float>(), rows, d, d, da.as<float>(), dw.as<float>(), db.as<float>(), 1e-6f, y16.as<bf16>(), y32.as<float>(), nullptr);
    EXPECT_EQ(down<float>(dx, x.size()), xa) << "layer_norm_add: x + add in place, d " << d;
    expect_close(down<float>(y32, x.size()), want_la, 1e-5, 1e-5, "layer_norm_add");
    expect_close(down_bf(y16, x.size()), want_la, 1e-5, 8e-3, "layer_norm_add bf16");
    EXPECT_EQ(down<float>(by32, x.size()), down<float>(y32, x.size())) << "layer_norm_biased vs layer_norm_add, d " << d;
    EXPECT_EQ(down_bf(by16, x.size()), down_bf(y16, x.size())) << "layer_norm_biased vs layer_norm_add (bf16), d " << d;
    // no bias (block 0's norm1): the LayerNorm of x, x left alone (its kernel is layer_norm_add's,
    // not layer_norm's: the same values summed in another order, so not layer_norm's bits)
    std::vector<float> want_nb(x.size());
    cpu::layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-6f, want_nb.data());
    DeviceBuffer nx = upload(x, "x");
    layer_norm_biased(nx.as<float>(), rows, d, d, nullptr, dw.as<float>(), db.as<float>(), 1e-6f, nullptr, by32.as<float>(), nullptr);
    EXPECT_EQ(down<float>(nx, x.size()), x) << "layer_norm_biased without a bias wrote x, d " << d;
    expect_close(down<float>(by32, x.size()), want_nb, 1e-5, 1e-5, "layer_norm_biased without a bias");
  }
}

TEST(CudaOps, ConvSiluPackedMatchesCpu) {
  NEED_GPU();
  // the 4-channel float4 form (Cn, ldx multiples of 4, K = 4) and the general form (Cn = 1030,
  // ldx = 1031)
  for (auto [Cn, ldx] : {std::pair<int64_t, int64_t>{48, 56}, {1030, 1031}}) {
  const std::vector<int64_t> lens = {1, 3, 64, 130};
  const int64_t K = 4;
  int64_t L = 0;
  for (auto l : lens) L += l;
  auto x = rounded(randn(size_t(L * ldx), 7)), w = randn(size_t(Cn * K), 8, 0.5f);
  std::vector<int32_t> seq_start;
  std::vector<float> want(static_cast<size_t>(L * Cn));
  int64_t t0 = 0;
  for (auto l : lens) {
    std::vector<float> xs(static_cast<size_t>(l * Cn));
    for (int64_t t = 0; t < l; ++t)
      for (int64_t c = 0; c < Cn; ++c) xs[size_t(t * Cn + c)] = x[size_t((t0 + t) * ldx + c)];
    cpu::causal_conv_silu(xs.data(), l, Cn, w.data(), K, want.data() + t0 * Cn);
    for (int64_t t = 0; t < l; ++t) seq_start.push_back(int32_t(t0));
    t0 += l;
  }
  DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), ds = upload(seq_start, "s"), dy(want.size() * 4);
  conv_silu(dx.as<float>(), ldx, ds.as<int32_t>(), L, Cn, dw.as<float>(), K, dy.as<float>(), nullptr);
  const auto whole = down<float>(dy, want.size());
  expect_close(whole, want, 1e-5, 1e-5, "conv_silu Cn=" + std::to_string(Cn));
  // token blocks (as the forward runs the GDN layer): x holds the block's rows and up to K - 1
  // before it; the same bits as the whole run
  for (auto [b0, b1] : {std::pair<int64_t, int64_t>{0, 5}, {5, 70}, {70, L}, {66, 67}, {2, 3}}) {
    const int64_t r0 = std::max<int64_t>(0, b0 - (K - 1));
    DeviceBuffer xb(size_t((b1 - r0) * ldx) * 4), yb(size_t((b1 - b0) * Cn) * 4);
    check(cudaMemcpy(xb.get(), dx.as<float>() + r0 * ldx, size_t((b1 - r0) * ldx) * 4, cudaMemcpyDeviceToDevice), "x block");
    conv_silu_rows(xb.as<float>(), ldx, r0, ds.as<int32_t>(), b0, b1 - b0, Cn, dw.as<float>(), K, yb.as<float>(), nullptr);
    const auto got = down<float>(yb, size_t((b1 - b0) * Cn));
    EXPECT_EQ(got, std::vector<float>(whole.begin() + b0 * Cn, whole.begin() + b1 * Cn)) << "conv_silu rows [" << b0 << ", " << b1 << ") Cn=" << Cn;
  }
  }
}

// Random GDN inputs as the engine's gdn_prep leaves them (q and k normalised, strong and weak
// decay) for packed sequences of the given lengths, and their 64-token chunks.
struct GdnCase {
  int64_t L = 0, conv_dim = 0;
  std::vector<float> mixed, g, beta;
  std::vector<int32_t> cs, cl, sc = {0};
};
GdnCase gdn_case(int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const std::vector<int64_t>& lens) {
  GdnCase k;
  for (auto l : lens) k.L += l;
  k.conv_dim = 2 * Hk * Dk + Hv * Dv;
  k.mixed = randn(size_t(k.L * k.conv_dim), 9);
  for (int64_t t = 0; t < k.L; ++t)
    for (int64_t r = 0; r < 2 * Hk; ++r) {
      float* p = k.mixed.data() + t * k.conv_dim + r * Dk;
      double ss = 0;
      for (int64_t i = 0; i < Dk; ++i) ss += double(p[i]) * p[i];
      const float inv = float(1.0 / std::sqrt(ss + 1e-6)) * (r < Hk ? 1.0f / std::sqrt(float(Dk)) : 1.0f);
      for (int64_t i = 0; i < Dk; ++i) p[i] *= inv;
    }
  k.g.resize(size_t(k.L * Hv));
  k.beta.resize(size_t(k.L * Hv));
  std::mt19937_64 r(10);
  std::uniform_real_distribution<float> ug(-3.0f, -0.001f), ub(0.0f, 1.0f);
  for (auto& v : k.g) v = ug(r);
  for (auto& v : k.beta) v = ub(r);
  int64_t t0 = 0;
  for (auto len : lens) {
    for (int64_t t = t0; t < t0 + len; t += 64) {
      k.cs.push_back(int32_t(t));
      k.cl.push_back(int32_t(std::min<int64_t>(64, t0 + len - t)));
    }
    k.sc.push_back(int32_t(k.cs.size()));
    t0 += len;
  }
  return k;
}

// The Wgmma path's products and its scan's form (the state in registers: one pass only; else the
// planes scan) for a scope (kernels.h's gdn_wgmma_set_one_pass_bf16 / gdn_wgmma_set_scan_regs);
// after it, the products as before and the scan by the products (the default)
struct WgmmaProducts {
  bool before;
  explicit WgmmaProducts(bool one_pass, bool scan_regs = false) : before(gdn_wgmma_one_pass_bf16()) {
    gdn_wgmma_set_scan_regs(0);
    gdn_wgmma_set_one_pass_bf16(one_pass);
    gdn_wgmma_set_scan_regs(scan_regs ? 1 : 0);
  }
  ~WgmmaProducts() {
    gdn_wgmma_set_scan_regs(0);
    gdn_wgmma_set_one_pass_bf16(before);
    gdn_wgmma_set_scan_regs(2);
  }
};
// One bf16 pass rounds every operand to 8 significant bits (up to 2^-8 relative): an output's error
// scales with the largest terms, not with itself, so the bound is a fraction of max |want| (the
// lab measures ~5e-3 of it on a layer at Clef's heads; a layout or pipeline error is O(1)).
void expect_close_to_max(const std::vector<float>& got, const std::vector<float>& want, double frac, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double big = 0, worst = 0;
  for (float v : want) big = std::max(big, double(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    if (!(e <= worst)) worst = e;  // NaN stays the worst
  }
  std::printf("[ cuda    ] %s: worst |diff| %.3g of max |x| %.3g (%.3g)\n", what.c_str(), worst, big, worst / std::max(big, 1e-30));
  EXPECT_LE(worst, frac * std::max(big, 1e-30)) << what;
}

// A GdnScratch for passes of P chunks: W, U and A, and the Wgmma path's planes, held in `keep`.
GdnScratch gdn_scratch(int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t P, std::vector<DeviceBuffer>& keep) {
  auto buf = [&](int64_t bytes) {
    keep.emplace_back(size_t(bytes), "gdn scratch");
    return keep.back().get();
  };
  GdnScratch sc{static_cast<float*>(buf(P * Hv * 64 * Dk * 4)), static_cast<float*>(buf(P * Hv * 64 * Dv * 4)),
                static_cast<float*>(buf(P * Hv * 64 * 64 * 4))};
  const GdnPlaneBytes pb = gdn_plane_bytes(Hk, Hv);
  sc.wp = static_cast<uint8_t*>(buf(P * pb.w));
  sc.ap = static_cast<uint8_t*>(buf(P * pb.a));
  sc.qp = static_cast<uint8_t*>(buf(P * pb.q));
  sc.kp = static_cast<uint8_t*>(buf(P * pb.k));
  // bf16 NaNs (0xffff): a plane byte the Wgmma prep leaves unwritten (a key head without its lead
  // value head, K's padding) reaches the scan's outputs as NaN
  for (auto [p, bytes] : {std::pair{sc.wp, P * pb.w}, {sc.ap, P * pb.a}, {sc.qp, P * pb.q}, {sc.kp, P * pb.k}})
    check(cudaMemset(p, 0xff, size_t(bytes)), "poison planes");
  return sc;
}

// gdn_chunked in passes of P chunks over a scratch of P chunks, the state carried between passes
// in two buffers (swapped per pass: one sequence may end and the next begin in a pass); `extra`
// adds what else a pass's scratch holds (prefix states).
void gdn_in_passes(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta, const GdnChunks& ch,
                   int64_t P, float* o, GdnPath path, const std::function<void(GdnScratch&)>& extra = {}) {
  DeviceBuffer st0(size_t(Hv * Dk * Dv) * 4), st1(size_t(Hv * Dk * Dv) * 4);
  float* st[2] = {st0.as<float>(), st1.as<float>()};
  std::vector<DeviceBuffer> keep;
  const GdnScratch scratch = gdn_scratch(Hk, Hv, Dk, Dv, P, keep);
  for (int64_t c0 = 0, pass = 0; c0 < ch.n_chunks; c0 += P, ++pass) {
    GdnScratch sp = scratch;
    sp.c0 = c0;
    sp.c1 = std::min(ch.n_chunks, c0 + P);
    sp.state_in = st[pass % 2];
    sp.state_out = st[(pass + 1) % 2];
    if (extra) extra(sp);
    gdn_chunked(mixed, Hk, Hv, Dk, Dv, g, beta, ch, sp, o, nullptr, path);
  }
}

// The chunked GDN kernels against the CPU recurrent form (the definition), packed sequences
// crossing chunk boundaries, Hv > Hk, strong and weak decay.
TEST(CudaOps, GdnChunkedMatchesCpuRecurrent) {
  NEED_GPU();
  // (the 27B model's heads, Hk 16 / Hv 48 at 128, run the Wgmma path too; at Hk = Hv every
  // value head leads its key head and writes the scan's Q / K planes)
  for (auto [Hk, Hv, Dk, Dv] :
       {std::tuple{2, 4, 16, 16}, {2, 6, 128, 128}, {1, 2, 64, 96}, {1, 1, 32, 24}, {16, 48, 128, 128}, {1, 3, 128, 64}, {2, 2, 128, 128}}) {
    const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
    const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
    const int64_t L = k.L, key_dim = Hk * Dk, conv_dim = k.conv_dim;
    const std::vector<float>&mixed = k.mixed, &g = k.g, &beta = k.beta;
    std::vector<float> want(static_cast<size_t>(L * Hv * Dv));
    int64_t t0 = 0;
    for (auto len : lens) {
      for (int64_t j = 0; j < Hv; ++j) {
        const int64_t kh = j / (Hv / Hk);
        cpu::GdnHead h{mixed.data() + t0 * conv_dim + kh * Dk,
                       mixed.data() + t0 * conv_dim + key_dim + kh * Dk,
                       mixed.data() + t0 * conv_dim + 2 * key_dim + j * Dv,
                       g.data() + t0 * Hv + j,
                       beta.data() + t0 * Hv + j,
                       len, Dk, Dv, conv_dim, conv_dim, conv_dim, Hv, Hv * Dv,
                       want.data() + t0 * Hv * Dv + j * Dv};
        cpu::gdn_recurrent(h);
      }
      t0 += len;
    }
    const std::vector<int32_t>&cs = k.cs, &cl = k.cl, &sc = k.sc;
    const int64_t nc = int64_t(cs.size());
    DeviceBuffer dm = upload(mixed, "m"), dg = upload(g, "g"), db = upload(beta, "b"), dcs = upload(cs, "cs"), dcl = upload(cl, "cl"),
                 dsc = upload(sc, "sc"), o(want.size() * 4);
    GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, int64_t(lens.size())};
    // (path, one bf16 pass, the scan's state in registers): the Wgmma path in both of its
    // precisions and with its register-state scan
    std::vector<std::tuple<GdnPath, bool, bool>> paths = {{GdnPath::TensorCores, false, false}, {GdnPath::Simt, false, false}};
    if (gdn_wgmma_available(Dk, Dv))
      paths.insert(paths.end(), {{GdnPath::Wgmma, false, false}, {GdnPath::Wgmma, true, false}, {GdnPath::Wgmma, true, true}});
    else if (gdn_wgmma_built(Dk, Dv)) std::printf("[ cuda    ] gdn_chunked: no Wgmma path on this GPU (Dk %d, Dv %d)\n", int(Dk), int(Dv));
    for (auto [path, one_pass, regs] : paths) {
      const WgmmaProducts products(one_pass, regs);
      const std::string name = path == GdnPath::Simt            ? "simt"
                               : path == GdnPath::TensorCores ? "tensor cores"
                               : !one_pass                    ? "wgmma bf16x3"
                               : regs                         ? "wgmma bf16, state in registers"
                                                              : "wgmma bf16";
      check(cudaMemset(o.get(), 0xff, want.size() * 4), "poison o");  // NaN: every output must be written
      std::vector<DeviceBuffer> keep;
      gdn_chunked(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, gdn_scratch(Hk, Hv, Dk, Dv, nc, keep), o.as<float>(),
                  nullptr, path);
      const auto whole = down<float>(o, want.size());
      const std::string what = "gdn_chunked " + name + " Hk " + std::to_string(Hk) + " Hv " + std::to_string(Hv) + " Dk " + std::to_string(Dk) +
                               " Dv " + std::to_string(Dv);
      // Wgmma's bf16x3 products: each within ~2^-16 of its terms' magnitude (the lab measures
      // ~1e-5 of the largest output against 3xTF32), so its bound is 5x looser; one bf16 pass:
      // a fraction of the largest output (expect_close_to_max); a layout or pipeline error is O(1)
      if (path == GdnPath::Wgmma && one_pass) expect_close_to_max(whole, want, 2e-2, what);
      else if (path == GdnPath::Wgmma) {
        expect_close(whole, want, 1e-4, 2e-4, what);
        expect_close_to_max(whole, want, 1e-3, what);  // (prints the worst beside one pass's)
      } else {
        expect_close(whole, want, 2e-5, 1e-4, what);
      }
      // in passes of P chunks over a scratch of P chunks (sequences cross pass boundaries, and
      // at P = 1 one ends and the next begins within a pass): the same bits as one pass
      for (int64_t P : {int64_t(1), int64_t(2), int64_t(3), nc - 1}) {
        if (P < 1) continue;
        check(cudaMemset(o.get(), 0xff, want.size() * 4), "poison o");
        gdn_in_passes(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, P, o.as<float>(), path);
        EXPECT_EQ(down<float>(o, want.size()), whole) << name << " in passes of " << P << " chunks, Dk=" << Dk;
      }
      // the register-state scan with one and two warpgroups a CTA (picked by shape): each
      // warpgroup runs the same instructions either way, so the same bits
      for (int wgs : {1, 2}) {
        if (!regs) break;
        gdn_wgmma_set_scan_rs_wgs(wgs);
        check(cudaMemset(o.get(), 0xff, want.size() * 4), "poison o");
        gdn_chunked(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, gdn_scratch(Hk, Hv, Dk, Dv, nc, keep), o.as<float>(),
                    nullptr, path);
        gdn_wgmma_set_scan_rs_wgs(0);
        EXPECT_EQ(down<float>(o, want.size()), whole) << name << " with " << wgs << " warpgroups a CTA, Hv " << Hv;
      }
    }
  }
}

// Element (row, k) of a plane of `rows` rows at byte `base` of b (gdn_tiles.cuh's kmajor_off:
// 64-wide k panels, 128-byte rows, 16-byte chunks swizzled by row % 8), hi + lo (the lo plane
// lo_at bytes further; one pass: hi alone).
double plane_value(const std::vector<uint8_t>& b, size_t base, size_t lo_at, int row, int kk, int rows, bool one_pass) {
  const size_t off = base + size_t((kk >> 6) * rows * 128 + row * 128 + ((((kk & 63) >> 3) ^ (row & 7)) << 4) + (kk & 7) * 2);
  __nv_bfloat16_raw h, l;
  std::memcpy(&h.x, &b[off], 2);
  if (one_pass) return double(__bfloat162float(__nv_bfloat16(h)));
  std::memcpy(&l.x, &b[off + lo_at], 2);
  return double(__bfloat162float(__nv_bfloat16(h))) + double(__bfloat162float(__nv_bfloat16(l)));
}

// A GdnScratch's parts as gdn_scratch keeps them: U (fp32), W's, A's, Q's and K's planes, with
// their bytes a chunk (Hv value heads of Dv values)
struct ScratchPart {
  const char* what;
  size_t keep;
  int64_t chunk_bytes;
};
std::vector<ScratchPart> scratch_parts(int64_t Hv, int64_t Dv, const GdnPlaneBytes& pb) {
  return {{"U", 1, Hv * 64 * Dv * 4}, {"W planes", 3, pb.w}, {"A planes", 4, pb.a}, {"Q planes", 5, pb.q}, {"K planes", 6, pb.k}};
}
// Rows rounded to bf16 (the conv's mixed16) and the same values widened back to fp32
struct Bf16Rows {
  std::vector<bf16> b16;
  std::vector<float> f32;
};
Bf16Rows bf16_rows(const std::vector<float>& x) {
  Bf16Rows r{std::vector<bf16>(x.size()), std::vector<float>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) r.b16[i] = __float2bfloat16_rn(x[i]), r.f32[i] = __bfloat162float(r.b16[i]);
  return r;
}

// The Wgmma path's prep (W and A left as the scan's planes) against the 3xTF32 prep's fp32 W, U
// and A, over partial chunks and a pass that starts at chunk 2, in both precisions: a layout or
// gating error is O(1); bf16x3's rounding ~1e-5 of a matrix's largest entry (its planes read as
// hi + lo), one bf16 pass's a fraction of it (the hi planes alone: it writes no lo plane).
TEST(CudaOps, GdnWgmmaPrepMatchesTensorCoresPrep) {
  NEED_GPU();
  for (const bool one_pass : {false, true}) {
    const WgmmaProducts products(one_pass);
    const std::string mode = one_pass ? "bf16" : "bf16x3";
    const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128;
    if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
    const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
    const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
    const int64_t nc = int64_t(k.cs.size()), c0 = 2, P = nc - c0;
    DeviceBuffer dm = upload(k.mixed, "m"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"), dcl = upload(k.cl, "cl"),
                 dsc = upload(k.sc, "sc"), st(size_t(Hv * Dk * Dv) * 4);
    const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, int64_t(lens.size())};
    std::vector<DeviceBuffer> keep_t, keep_w;
    GdnScratch tc = gdn_scratch(Hk, Hv, Dk, Dv, P, keep_t), wg = gdn_scratch(Hk, Hv, Dk, Dv, P, keep_w);
    for (GdnScratch* x : {&tc, &wg}) {
      x->c0 = c0;
      x->state_in = st.as<float>();  // a pass after the first: the prep does not read it
    }
    const GdnPlaneBytes pb = gdn_plane_bytes(Hk, Hv);
    check(cudaMemset(wg.u, 0xff, size_t(P * Hv * 64 * Dv) * 4), "poison U");  // NaN (0xffff: a bf16 NaN): every output must be written
    check(cudaMemset(wg.wp, 0xff, size_t(P * pb.w)), "poison W planes");
    check(cudaMemset(wg.ap, 0xff, size_t(P * pb.a)), "poison A planes");
    gdn_chunk_prep(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, tc, nullptr, GdnPath::TensorCores);
    gdn_chunk_prep(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, wg, nullptr, GdnPath::Wgmma);
    const auto wp = down<uint8_t>(keep_w[3], size_t(P * pb.w)), ap = down<uint8_t>(keep_w[4], size_t(P * pb.a));
    const auto w_t = down<float>(keep_t[0], size_t(P * Hv * 64 * Dk)), a_t = down<float>(keep_t[2], size_t(P * Hv * 64 * 64));
    std::vector<float> w_w(w_t.size()), a_w(a_t.size());
    for (int64_t m = 0; m < P * Hv; ++m)
      for (int r = 0; r < 64; ++r) {
        for (int kk = 0; kk < Dk; ++kk) w_w[size_t((m * 64 + r) * Dk + kk)] = float(plane_value(wp, size_t(m * pb.w / Hv), size_t(pb.w / Hv / 2), r, kk, 64, one_pass));
        for (int kk = 0; kk < 64; ++kk) a_w[size_t((m * 64 + r) * 64 + kk)] = float(plane_value(ap, size_t(m * pb.a / Hv), size_t(pb.a / Hv / 2), r, kk, 64, one_pass));
      }
    auto check_matrix = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      const std::string name = "wgmma prep (" + mode + ") " + what + " vs 3xTF32";
      if (one_pass) return expect_close_to_max(got, want, 2e-2, name);
      double big = 0;
      for (float v : want) big = std::max(big, double(std::fabs(v)));
      expect_close_to_max(got, want, 1e-3, name);  // (prints the worst beside one pass's)
      expect_close(got, want, 2e-5 * std::max(big, 1e-30), 2e-4, name);
    };
    check_matrix(w_w, w_t, "W");
    check_matrix(a_w, a_t, "A");
    check_matrix(down<float>(keep_w[1], size_t(P * Hv * 64 * Dv)), down<float>(keep_t[1], size_t(P * Hv * 64 * Dv)), "U");
    // the scan's Q and K [tokens][Dk] planes per (chunk, key head), written by each
    // key head's lead value head: q and k as hi + lo (within 2^-16 relative; one pass: hi, within
    // 2^-8), zero past the chunk (gdn_scratch poisoned them with NaNs)
    const auto qp = down<uint8_t>(keep_w[5], size_t(P * pb.q)), kp = down<uint8_t>(keep_w[6], size_t(P * pb.k));
    std::vector<float> q_got, q_want, k_got, k_want;
    for (int64_t ci = 0; ci < P; ++ci) {
      const int64_t t0 = k.cs[size_t(c0 + ci)], n = k.cl[size_t(c0 + ci)];
      for (int64_t kh = 0; kh < Hk; ++kh) {
        const size_t at = size_t((ci * Hk + kh) * (pb.q / Hk)), at_k = size_t((ci * Hk + kh) * (pb.k / Hk));
        for (int r = 0; r < 64; ++r)
          for (int d = 0; d < Dk; ++d) {
            const float* row = r < n ? k.mixed.data() + (t0 + r) * k.conv_dim : nullptr;  // past the chunk: zero
            q_want.push_back(row ? row[kh * Dk + d] : 0.0f);
            k_want.push_back(row ? row[Hk * Dk + kh * Dk + d] : 0.0f);
            q_got.push_back(float(plane_value(qp, at, size_t(pb.q / Hk / 2), r, d, 64, one_pass)));
            k_got.push_back(float(plane_value(kp, at_k, size_t(pb.k / Hk / 2), r, d, 64, one_pass)));
          }
      }
    }
    const double rel = one_pass ? 4e-3 : 2e-5;  // bf16's rounding: up to 2^-8 = 3.9e-3 relative
    expect_close(q_got, q_want, 1e-30, rel, "wgmma prep (" + mode + "): the scan's Q planes");
    expect_close(k_got, k_want, 1e-30, rel, "wgmma prep (" + mode + "): the scan's K planes");
  }
}

// Sets the T form (gdn_wgmma_set_t_form) for a test's scope, then restores it.
struct TForm {
  bool to = gdn_wgmma_t_form();
  explicit TForm(bool on) { gdn_wgmma_set_t_form(on); }
  ~TForm() { gdn_wgmma_set_t_form(to); }
};

// Sets the bf16-rows prep's form (gdn_wgmma_set_prep_v2) for a test's scope, then restores it.
struct PrepForm {
  bool to = gdn_wgmma_prep_v2();
  explicit PrepForm(bool v2) { gdn_wgmma_set_prep_v2(v2); }
  ~PrepForm() { gdn_wgmma_set_prep_v2(to); }
};

// The one-pass Wgmma prep's first form (v1) from the conv's rows in bf16 (GdnScratch::mixed16) against the same
// prep from fp32 rows holding the same values (each bf16 widened): U, W, A and the scan's Q and K
// planes bit for bit (the loads give the same floats), and the one-pass scan's outputs after each.
// A prep that read past a row, dropped a value or ignored mixed16 (fp32 rows of other values are
// passed beside it) fails here.
TEST(CudaOps, GdnWgmmaPrepFromBf16RowsIsTheFp32RowsBits) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const WgmmaProducts products(true, true);
  const PrepForm first(false);
  const TForm wu(false);  // the planes this test compares are the W / U form's
  const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size());
  const Bf16Rows rows = bf16_rows(k.mixed);
  std::vector<float> other(k.mixed.size());
  for (size_t i = 0; i < other.size(); ++i) other[i] = -k.mixed[i];  // what a prep ignoring mixed16 would read
  DeviceBuffer d16 = upload(rows.b16, "m16"), d32 = upload(rows.f32, "m32"), dother = upload(other, "other"), dg = upload(k.g, "g"), db = upload(k.beta, "b"),
               dcs = upload(k.cs, "cs"), dcl = upload(k.cl, "cl"), dsc = upload(k.sc, "sc"), st(size_t(Hv * Dk * Dv) * 4),
               o32(size_t(k.L * Hv * Dv) * 4), o16(size_t(k.L * Hv * Dv) * 4);
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, int64_t(lens.size())};
  std::vector<DeviceBuffer> keep32, keep16;
  GdnScratch a = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep32), b = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep16);
  for (GdnScratch* x : {&a, &b}) x->state_out = st.as<float>();
  b.mixed16 = d16.as<bf16>();
  check(cudaMemset(b.u, 0xff, size_t(nc * Hv * 64 * Dv) * 4), "poison U");
  gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, a, nullptr, GdnPath::Wgmma);
  gdn_chunk_prep(dother.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, b, nullptr, GdnPath::Wgmma);
  for (const ScratchPart& p : scratch_parts(Hv, Dv, gdn_plane_bytes(Hk, Hv)))
    EXPECT_EQ(down<uint8_t>(keep16[p.keep], size_t(nc * p.chunk_bytes)), down<uint8_t>(keep32[p.keep], size_t(nc * p.chunk_bytes))) << p.what;
  gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, a, o32.as<float>(), nullptr, GdnPath::Wgmma);
  gdn_chunk_scan(dother.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, b, o16.as<float>(), nullptr, GdnPath::Wgmma);
  const auto got = down<float>(o16, size_t(k.L * Hv * Dv)), want = down<float>(o32, size_t(k.L * Hv * Dv));
  EXPECT_EQ(got, want) << "the scan's outputs";
  // bf16 rows on any other path are refused, not read as fp32
  EXPECT_THROW(gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, b, nullptr, GdnPath::TensorCores), Error);
}

// The second one-pass prep (the product's, gdn_wgmma_prep_v2: q / k / v by cp.async into the planes, beta
// on T's columns) from bf16 rows: A's, Q's and K's planes the first form's bits; U and W within
// the one-pass bound of the 3xTF32 prep's on the same values (every U written: NaN-poisoned
// before); the scan's outputs after it within a one-pass rounding of the first form's.
TEST(CudaOps, GdnWgmmaPrepV2MatchesTensorCoresPrep) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const WgmmaProducts products(true, true);
  const PrepForm restore(gdn_wgmma_prep_v2());
  const TForm wu(false);  // the W / U form's planes
  const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size());
  const Bf16Rows rows = bf16_rows(k.mixed);
  DeviceBuffer d16 = upload(rows.b16, "m16"), d32 = upload(rows.f32, "m32"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"),
               dcl = upload(k.cl, "cl"), dsc = upload(k.sc, "sc"), st(size_t(Hv * Dk * Dv) * 4), o1(size_t(k.L * Hv * Dv) * 4),
               o2(size_t(k.L * Hv * Dv) * 4);
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, int64_t(lens.size())};
  std::vector<DeviceBuffer> keep_t, keep1, keep2;
  GdnScratch tc = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep_t), v1 = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep1), v2 = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep2);
  for (GdnScratch* x : {&tc, &v1, &v2}) x->state_out = st.as<float>();
  v1.mixed16 = v2.mixed16 = d16.as<bf16>();
  check(cudaMemset(v2.u, 0xff, size_t(nc * Hv * 64 * Dv) * 4), "poison U");
  gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, tc, nullptr, GdnPath::TensorCores);
  gdn_wgmma_set_prep_v2(false);
  gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, v1, nullptr, GdnPath::Wgmma);
  gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, v1, o1.as<float>(), nullptr, GdnPath::Wgmma);
  gdn_wgmma_set_prep_v2(true);
  gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, v2, nullptr, GdnPath::Wgmma);
  gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, v2, o2.as<float>(), nullptr, GdnPath::Wgmma);
  const GdnPlaneBytes pb = gdn_plane_bytes(Hk, Hv);
  const std::vector<ScratchPart> parts = scratch_parts(Hv, Dv, pb);
  for (const ScratchPart& p : parts)  // A's, Q's and K's planes: the first form's bits
    if (p.keep >= 4) EXPECT_EQ(down<uint8_t>(keep2[p.keep], size_t(nc * p.chunk_bytes)), down<uint8_t>(keep1[p.keep], size_t(nc * p.chunk_bytes))) << p.what;
  const auto wp = down<uint8_t>(keep2[3], size_t(nc * pb.w));
  std::vector<float> w2(size_t(nc * Hv * 64 * Dk));
  for (int64_t m = 0; m < nc * Hv; ++m)
    for (int r = 0; r < 64; ++r)
      for (int kk = 0; kk < Dk; ++kk) w2[size_t((m * 64 + r) * Dk + kk)] = float(plane_value(wp, size_t(m * pb.w / Hv), 0, r, kk, 64, true));
  expect_close_to_max(w2, down<float>(keep_t[0], w2.size()), 2e-2, "wgmma prep v2 W vs 3xTF32");
  expect_close_to_max(down<float>(keep2[1], size_t(nc * Hv * 64 * Dv)), down<float>(keep_t[1], size_t(nc * Hv * 64 * Dv)), 2e-2,
                      "wgmma prep v2 U vs 3xTF32");
  expect_close_to_max(down<float>(o2, size_t(k.L * Hv * Dv)), down<float>(o1, size_t(k.L * Hv * Dv)), 2e-2, "scan after prep v2 vs after v1");
  // a pass from chunk 2 (its own scratch, chunks counted from there): the whole pass's bytes
  const int64_t c0 = 2, P = nc - c0;
  std::vector<DeviceBuffer> keep3;
  GdnScratch v3 = gdn_scratch(Hk, Hv, Dk, Dv, P, keep3);
  v3.c0 = c0;
  v3.state_in = st.as<float>();
  v3.mixed16 = d16.as<bf16>();
  gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, v3, nullptr, GdnPath::Wgmma);
  for (const ScratchPart& p : parts) {
    const auto whole = down<uint8_t>(keep2[p.keep], size_t(nc * p.chunk_bytes));
    EXPECT_EQ(down<uint8_t>(keep3[p.keep], size_t(P * p.chunk_bytes)), std::vector<uint8_t>(whole.begin() + c0 * p.chunk_bytes, whole.end()))
        << p.what << ", a pass from chunk " << c0;
  }
}

// The T form (gdn_wgmma_t_form: the prep leaves T diag(beta), the register-state scan forms Vn
// from the rows' V) from bf16 rows against the 3xTF32 path on the same values and beside the W / U
// form: outputs within the one-pass bound (a layout, gating or decay error is O(1); every plane
// byte the prep leaves unwritten is a NaN from gdn_scratch), and the planes scan refused with it.
TEST(CudaOps, GdnWgmmaTFormMatchesTensorCores) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const WgmmaProducts products(true, true);
  const TForm restore(false);
  const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size()), state = Hv * Dk * Dv;
  const Bf16Rows rows = bf16_rows(k.mixed);
  DeviceBuffer d16 = upload(rows.b16, "m16"), d32 = upload(rows.f32, "m32"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"),
               dcl = upload(k.cl, "cl"), dsc = upload(k.sc, "sc"), o(size_t(k.L * Hv * Dv) * 4), st(size_t(state) * 4);
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, int64_t(lens.size())};
  // the path's outputs, the rows in bf16 unless `tc` (states: GdnWgmmaStatesMatchTensorCores)
  auto run = [&](bool tc, bool t_form, std::vector<float>& out) {
    gdn_wgmma_set_t_form(t_form);
    std::vector<DeviceBuffer> keep;
    GdnScratch sc = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep);
    sc.state_out = st.as<float>();
    if (!tc) sc.mixed16 = d16.as<bf16>();
    check(cudaMemset(o.get(), 0xff, size_t(k.L * Hv * Dv) * 4), "poison o");
    const GdnPath path = tc ? GdnPath::TensorCores : GdnPath::Wgmma;
    gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, sc, nullptr, path);
    gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, sc, o.as<float>(), nullptr, path);
    out = down<float>(o, size_t(k.L * Hv * Dv));
  };
  std::vector<float> want, wu, tf;
  run(true, false, want);
  run(false, false, wu);
  run(false, true, tf);
  expect_close_to_max(wu, want, 2e-2, "W / U form vs 3xtf32 outputs");
  expect_close_to_max(tf, want, 2e-2, "T form vs 3xtf32 outputs");
  EXPECT_NE(tf, wu) << "the T form rounds elsewhere: the same bits as the W / U form would mean it did not run";
  // the planes scan has no T form
  gdn_wgmma_set_t_form(true);
  gdn_wgmma_set_scan_regs(0);
  std::vector<DeviceBuffer> keep;
  GdnScratch sc = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep);
  sc.state_out = st.as<float>();
  sc.mixed16 = d16.as<bf16>();
  EXPECT_THROW(gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, sc, o.as<float>(), nullptr, GdnPath::Wgmma), Error);
  gdn_wgmma_set_scan_regs(1);
}

// The T form's prep and scan at once (gdn_wgmma_overlap: a persistent prep flags each item, the
// scan launched while it runs waits on the flags) against the T form one after the other: the
// same bits, at 1 and 2 prep CTAs an SM, three times each (a scan that read an item before its
// flag would differ somewhere, or read the NaNs gdn_scratch poisons the planes with), in one pass
// and in passes of 16 chunks (flags per pass). 72 chunks x 6 value heads: more items than the
// persistent grid's CTAs, so each CTA takes several in turn.
TEST(CudaOps, GdnWgmmaTFormOverlapIsTheTFormBits) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const WgmmaProducts products(true, true);
  const TForm t_form(true);
  struct Overlap {
    int to = gdn_wgmma_overlap();
    ~Overlap() { gdn_wgmma_set_overlap(to); }
  } restore;
  const std::vector<int64_t> lens = {1, 63, 64, 65, 200, 4000};
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size()), ns = int64_t(lens.size()), P = 16;
  ASSERT_GT(nc * Hv, 2 * sm_count()) << "the case should give the persistent prep more items than CTAs";
  ASSERT_LT(ns * Hv, sm_count()) << "the overlap runs where the scan takes one warpgroup a CTA";
  const Bf16Rows rows = bf16_rows(k.mixed);
  DeviceBuffer d16 = upload(rows.b16, "m16"), d32 = upload(rows.f32, "m32"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"),
               dcl = upload(k.cl, "cl"), dsc = upload(k.sc, "sc"), o(size_t(k.L * Hv * Dv) * 4), ready(size_t(nc * Hv) * 4, "flags");
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, ns};
  // one pass (passes = false) or passes of P chunks, the overlap at `ov` prep CTAs an SM
  auto run = [&](int ov, bool passes) {
    gdn_wgmma_set_overlap(ov);
    check(cudaMemset(o.get(), 0xff, size_t(k.L * Hv * Dv) * 4), "poison o");
    check(cudaMemset(ready.get(), 0, size_t(nc * Hv) * 4), "flags");
    if (passes) {
      gdn_in_passes(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, P, o.as<float>(), GdnPath::Wgmma, [&](GdnScratch& sp) {
        sp.mixed16 = d16.as<bf16>();
        sp.ready = ready.as<int>();
      });
    } else {
      std::vector<DeviceBuffer> keep;
      GdnScratch sc = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep);
      sc.mixed16 = d16.as<bf16>();
      sc.ready = ready.as<int>();
      gdn_chunk_prep(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, sc, nullptr, GdnPath::Wgmma);
      gdn_chunk_scan(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), ch, sc, o.as<float>(), nullptr, GdnPath::Wgmma);
    }
    check(cudaDeviceSynchronize(), "overlap run");
    return down<float>(o, size_t(k.L * Hv * Dv));
  };
  for (const bool passes : {false, true}) {
    const std::vector<float> want = run(0, passes);
    for (const int ov : {1, 2})
      for (int rep = 0; rep < 3; ++rep) {
        const std::vector<float> got = run(ov, passes);
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
        EXPECT_EQ(differ, 0u) << "overlap " << ov << ", rep " << rep << (passes ? ", passes of 16 chunks" : ", one pass");
      }
  }
}

// The gated norm in the T-form scan's epilogue (gdn_scan_norms: two warpgroups a scan CTA) against
// the scan's O at one warpgroup a CTA (a small batch's form) then gated_norm: act bit for bit
// (gated_norm.cuh computes both), in one pass and in passes of 2 chunks, z read at an offset into
// wider rows (as the in_proj output holds it), and with z an FP8 GEMM's unscaled output (its row
// and column scales applied as read). act is NaN-poisoned first (every row written), O too, and
// stays so (the fused scan writes no O: a scan that fell back would overwrite it).
TEST(CudaOps, GdnScanGatedNormIsTheGatedNormBits) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128, value_dim = Hv * Dv;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const WgmmaProducts products(true, true);
  const TForm t_form(true);
  struct Restore {
    bool norm = gdn_wgmma_scan_norm();
    ~Restore() {
      gdn_wgmma_set_scan_norm(norm);
      gdn_wgmma_set_scan_rs_wgs(0);
    }
  } restore;
  const std::vector<int64_t> lens = {1, 63, 64, 65, 200};
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size()), ns = int64_t(lens.size()), L = k.L, zoff = 12, ldz = value_dim + 36;
  const float eps = 1e-6f;
  const Bf16Rows rows = bf16_rows(k.mixed);
  std::vector<float> w = randn(size_t(Dv), 78, 0.5f, 1.0f);
  DeviceBuffer d16 = upload(rows.b16, "m16"), d32 = upload(rows.f32, "m32"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"),
               dcl = upload(k.cl, "cl"), dsc = upload(k.sc, "sc"), st(size_t(Hv * Dk * Dv) * 4), o(size_t(L * value_dim) * 4),
               dz = upload(randn(size_t(L * ldz), 77, 2.0f), "z"), dw = upload(w, "w"), act(size_t(L * value_dim) * 2);
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, ns};
  const float* z = dz.as<float>() + zoff;
  const GdnScratch::GatedNorm gn{z, ldz, {}, dw.as<float>(), eps, act.as<bf16>()};
  auto poison = [&] {
    check(cudaMemset(o.get(), 0xff, size_t(L * value_dim) * 4), "poison o");
    check(cudaMemset(act.get(), 0xff, size_t(L * value_dim) * 2), "poison act");
  };
  // the reference: O at one warpgroup a scan CTA, then the gated norm's kernel
  gdn_wgmma_set_scan_norm(false);
  gdn_wgmma_set_scan_rs_wgs(1);
  poison();
  std::vector<DeviceBuffer> keep;
  GdnScratch sc = gdn_scratch(Hk, Hv, Dk, Dv, nc, keep);
  sc.state_out = st.as<float>();
  sc.mixed16 = d16.as<bf16>();
  sc.gn = gn;
  EXPECT_FALSE(gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::Wgmma)) << "switch off";
  gdn_chunked(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, sc, o.as<float>(), nullptr, GdnPath::Wgmma);
  DeviceBuffer o_ref(size_t(L * value_dim) * 4);
  check(cudaMemcpy(o_ref.get(), o.get(), size_t(L * value_dim) * 4, cudaMemcpyDeviceToDevice), "keep O");
  gated_norm(o_ref.as<float>(), L, Hv, Dv, dw.as<float>(), eps, z, ldz, act.as<bf16>(), nullptr);
  std::vector<uint16_t> want = down<uint16_t>(act, size_t(L * value_dim));
  size_t nan = 0;
  for (uint16_t v : want) nan += (v & 0x7f80) == 0x7f80 && (v & 0x7f);
  ASSERT_EQ(nan, 0u) << "the reference's act";
  gdn_wgmma_set_scan_norm(true);
  EXPECT_FALSE(gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::Wgmma)) << "one warpgroup a CTA: a row is split over two CTAs";
  gdn_wgmma_set_scan_rs_wgs(2);
  ASSERT_TRUE(gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::Wgmma));
  auto compare = [&](const char* what) {
    const std::vector<uint16_t> got = down<uint16_t>(act, want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << what << ": act values unlike the scan's O then gated_norm";
    const std::vector<uint32_t> ov = down<uint32_t>(o, size_t(L * value_dim));
    EXPECT_EQ(std::count(ov.begin(), ov.end(), 0xffffffffu), std::ptrdiff_t(ov.size())) << what << ": the fused scan wrote O";
  };
  poison();
  gdn_chunked(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, sc, o.as<float>(), nullptr, GdnPath::Wgmma);
  compare("one pass");
  poison();
  gdn_in_passes(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, 2, o.as<float>(), GdnPath::Wgmma, [&](GdnScratch& sp) {
    sp.mixed16 = d16.as<bf16>();
    sp.gn = gn;
  });
  compare("passes of 2 chunks");
  // z as an FP8 GEMM's unscaled output (gn.zs: the scales applied as read, as gated_norm does)
  const std::vector<float> rs = randn(size_t(L), 79, 0.1f, 1.0f), cs = randn(size_t(value_dim), 80, 0.1f, 1.0f);
  DeviceBuffer drs = upload(rs, "rs"), dcs2 = upload(cs, "cs");
  const RowColScales zs{drs.as<float>(), dcs2.as<float>()};
  gated_norm(o_ref.as<float>(), L, Hv, Dv, dw.as<float>(), eps, z, ldz, act.as<bf16>(), nullptr, zs);
  want = down<uint16_t>(act, size_t(L * value_dim));
  sc.gn.zs = zs;
  ASSERT_TRUE(gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::Wgmma));
  poison();
  gdn_chunked(d32.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, sc, o.as<float>(), nullptr, GdnPath::Wgmma);
  compare("z with FP8 row and column scales");
  sc.gn.zs = {};
  // where it cannot run, the scan writes O and the caller runs gated_norm: z unaligned, a wrong ldz
  GdnScratch bad = sc;
  bad.gn.z = z + 1;
  EXPECT_FALSE(gdn_scan_norms(bad, ch, Hv, Dk, Dv, GdnPath::Wgmma)) << "z not 16-byte aligned";
  bad.gn.z = z;
  bad.gn.ldz = ldz + 1;
  EXPECT_FALSE(gdn_scan_norms(bad, ch, Hv, Dk, Dv, GdnPath::Wgmma)) << "ldz % 4 != 0";
  EXPECT_FALSE(gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::TensorCores)) << "the 3xTF32 path";
}

// The Wgmma scan's prefix-cache paths against the 3xTF32 scan's: sequences starting from cached
// states (seq_state_in, at a layer offset), snapshots at a chunk inside a sequence and after its
// last chunk (snap_chunk), in one pass and in passes of two chunks (the state carried between
// them). Outputs and snapshots within the Wgmma bound of the 3xTF32 ones; passes give the bits
// of one pass.
TEST(CudaOps, GdnWgmmaStatesMatchTensorCores) {
  NEED_GPU();
  const int64_t Hk = 2, Hv = 6, Dk = 128, Dv = 128, layers = 2, layer = 1;
  if (!gdn_wgmma_available(Dk, Dv)) GTEST_SKIP() << "no Wgmma path on this GPU / build";
  const std::vector<int64_t> lens = {64, 200, 130};  // 1, 4 and 3 chunks
  const GdnCase k = gdn_case(Hk, Hv, Dk, Dv, lens);
  const int64_t nc = int64_t(k.cs.size()), ns = int64_t(lens.size()), state = Hv * Dk * Dv;
  DeviceBuffer dm = upload(k.mixed, "m"), dg = upload(k.g, "g"), db = upload(k.beta, "b"), dcs = upload(k.cs, "cs"), dcl = upload(k.cl, "cl"),
               dsc = upload(k.sc, "sc"), o(size_t(k.L * Hv * Dv) * 4);
  const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, ns};
  // cached states in: none for sequence 0, random ones (a GDN state's scale) for 1 and 2, each at
  // layer 1 of a two-layer buffer
  std::vector<DeviceBuffer> in;
  std::vector<const float*> in_ptr(size_t(ns), nullptr);
  for (int64_t q = 1; q < ns; ++q) {
    in.push_back(upload(randn(size_t(layers * state), uint64_t(40 + q), 0.3f), "state in"));
    in_ptr[size_t(q)] = in.back().as<float>();
  }
  // snapshots: sequence 0 none, 1 before its third chunk, 2 after its last
  const std::vector<int32_t> snap = {-1, k.sc[1] + 2, k.sc[3]};
  DeviceBuffer din = upload(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(in_ptr.data()),
                                                 reinterpret_cast<const uint8_t*>(in_ptr.data() + ns)), "state in pointers"),
               dsnap = upload(snap, "snap chunks");
  // the T form reads the rows in bf16 (GdnScratch::mixed16): these, when set
  const Bf16Rows rows = bf16_rows(k.mixed);
  DeviceBuffer d16 = upload(rows.b16, "m16");
  const bf16* rows16 = nullptr;
  auto run = [&](GdnPath path, int64_t P, std::vector<float>& out, std::vector<std::vector<float>>& snaps) {
    std::vector<DeviceBuffer> snap_buf;
    std::vector<float*> out_ptr(static_cast<size_t>(ns));
    for (int64_t q = 0; q < ns; ++q) {
      snap_buf.emplace_back(size_t(layers * state) * 4, "snapshot");
      check(cudaMemset(snap_buf.back().get(), 0xff, size_t(layers * state) * 4), "poison snapshot");
      out_ptr[size_t(q)] = snap_buf.back().as<float>();
    }
    DeviceBuffer dout = upload(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(out_ptr.data()),
                                                    reinterpret_cast<const uint8_t*>(out_ptr.data() + ns)), "snapshot pointers");
    check(cudaMemset(o.get(), 0xff, size_t(k.L * Hv * Dv) * 4), "poison o");
    gdn_in_passes(dm.as<float>(), Hk, Hv, Dk, Dv, dg.as<float>(), db.as<float>(), ch, P, o.as<float>(), path, [&](GdnScratch& sp) {
      sp.seq_state_in = reinterpret_cast<const float* const*>(din.get());
      sp.seq_state_out = reinterpret_cast<float* const*>(dout.get());
      sp.snap_chunk = dsnap.as<int32_t>();
      sp.layer_off = layer * state;
      if (rows16) sp.mixed16 = rows16;
    });
    out = down<float>(o, size_t(k.L * Hv * Dv));
    snaps.clear();
    for (int64_t q = 0; q < ns; ++q) {
      const auto all = down<float>(snap_buf[size_t(q)], size_t(layers * state));
      snaps.emplace_back(all.begin() + layer * state, all.end());
    }
  };
  std::vector<float> want, got, got2;
  std::vector<std::vector<float>> want_s, got_s, got2_s;
  run(GdnPath::TensorCores, nc, want, want_s);
  // bf16x3, one pass, one pass with the state in registers, and that from bf16 rows in the T form
  for (const int variant : {0, 1, 2, 3}) {
    const bool one_pass = variant > 0;
    const WgmmaProducts products(one_pass, variant >= 2);
    const TForm form(variant == 3);
    rows16 = variant == 3 ? d16.as<bf16>() : nullptr;
    const std::string mode = variant == 3   ? "wgmma bf16, T form"
                             : variant == 2 ? "wgmma bf16, state in registers"
                             : one_pass     ? "wgmma bf16"
                                            : "wgmma bf16x3";
    run(GdnPath::Wgmma, nc, got, got_s);
    auto near = [&](const std::vector<float>& g, const std::vector<float>& w, const std::string& what) {
      if (one_pass) expect_close_to_max(g, w, 2e-2, mode + " vs 3xtf32 " + what);
      else expect_close(g, w, 1e-4, 2e-4, mode + " vs 3xtf32 " + what);
    };
    near(got, want, "outputs, cached states in");
    for (int64_t q = 1; q < ns; ++q) near(got_s[size_t(q)], want_s[size_t(q)], "snapshot " + std::to_string(q));
    run(GdnPath::Wgmma, 2, got2, got2_s);
    EXPECT_EQ(got2, got) << mode << " in passes of 2 chunks";
    for (int64_t q = 1; q < ns; ++q) EXPECT_EQ(got2_s[size_t(q)], got_s[size_t(q)]) << mode << " snapshot " << q << " in passes of 2 chunks";
  }
}

TEST(CudaOps, FlashAttentionMatchesCpu) {
  NEED_GPU();
  for (auto [Hq, Hkv, D] : {std::tuple{4, 2, 32}, {2, 1, 48}, {6, 1, 64}, {4, 4, 128}, {6, 2, 256}}) {
    const std::vector<int64_t> lens = {1, 17, 64, 130, 300};
    int64_t L = 0;
    for (auto l : lens) L += l;
    // the fused qkv layout: per token [Hq x (q | gate)] [Hkv k] [Hkv v]; q and k come separately
    const int64_t ld = Hq * 2 * D + 2 * Hkv * D;
    auto qkv = rounded(randn(size_t(L * ld), 11, 1.5f));
    auto q = rounded(randn(size_t(L * Hq * D), 12, 1.5f)), k = rounded(randn(size_t(L * Hkv * D), 13, 1.5f));
    std::vector<float> want(static_cast<size_t>(L * Hq * D)), vv(size_t(L * Hkv * D));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Hkv * D; ++i) vv[size_t(t * Hkv * D + i)] = qkv[size_t(t * ld + Hq * 2 * D + Hkv * D + i)];
    std::vector<int32_t> tq, ts, te;
    int64_t t0 = 0;
    for (auto len : lens) {
      cpu::attention_causal(q.data() + t0 * Hq * D, k.data() + t0 * Hkv * D, vv.data() + t0 * Hkv * D, len, Hq, Hkv, D, Hq * D, Hkv * D,
                            want.data() + t0 * Hq * D);
      for (int64_t t = t0; t < t0 + len; t += 64) {
        tq.push_back(int32_t(t));
        ts.push_back(int32_t(t0));
        te.push_back(int32_t(t0 + len));
      }
      t0 += len;
    }
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < D; ++i) want[size_t((t * Hq + h) * D + i)] *= cpu::sigmoid(qkv[size_t(t * ld + h * 2 * D + D + i)]);
    DeviceBuffer dqkv = upload(to_bf(qkv), "qkv"), dq = upload(to_bf(q), "q"), dk = upload(to_bf(k), "k"), dtq = upload(tq, "tq"),
                 dts = upload(ts, "ts"), dte = upload(te, "te"), dout(want.size() * 2);
    const bf16* base = dqkv.as<bf16>();
    flash_attention(dq.as<bf16>(), dk.as<bf16>(), base + Hq * 2 * D + Hkv * D, ld, base + D, ld, 2 * D, Hq, Hkv, D,
                    AttnTiles{dtq.as<int32_t>(), dts.as<int32_t>(), dte.as<int32_t>(), int64_t(tq.size())}, dout.as<bf16>(), nullptr);
    // P is rounded to bf16 before P V (as in every flash kernel) and the output is bf16
    expect_close(down_bf(dout, want.size()), want, 2e-2, 2e-2, "flash_attention D=" + std::to_string(D));
  }
}

// cuDNN's fused attention on the product's ragged path (cudnn_attention.h), then the output gate:
// against the CPU as clefrt's kernel above, and its bits: a sequence alone = in the batch, a
// continuation's queries (keys cached before them) = the same queries of the whole sequence
TEST(CudaOps, CudnnAttentionMatchesCpuAndKeepsItsBits) {
  NEED_GPU();
  std::string why;
  if (!cudnn_available(&why)) GTEST_SKIP() << "cuDNN: " << why;
  for (auto [Hq, Hkv, D] : {std::tuple{4, 2, 32}, {2, 1, 48}, {6, 1, 64}, {4, 4, 128}, {6, 2, 256}}) {
    const std::vector<int64_t> lens = {1, 17, 64, 130, 300};
    int64_t L = 0;
    for (auto l : lens) L += l;
    const int64_t ld = Hq * 2 * D + 2 * Hkv * D;
    auto qkv = rounded(randn(size_t(L * ld), 11, 1.5f));
    auto q = rounded(randn(size_t(L * Hq * D), 12, 1.5f)), k = rounded(randn(size_t(L * Hkv * D), 13, 1.5f));
    std::vector<float> want(static_cast<size_t>(L * Hq * D)), vv(size_t(L * Hkv * D));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Hkv * D; ++i) vv[size_t(t * Hkv * D + i)] = qkv[size_t(t * ld + Hq * 2 * D + Hkv * D + i)];
    std::vector<RaggedSeq> seqs;
    int64_t t0 = 0, max_kv = 0;
    for (auto len : lens) {
      cpu::attention_causal(q.data() + t0 * Hq * D, k.data() + t0 * Hkv * D, vv.data() + t0 * Hkv * D, len, Hq, Hkv, D, Hq * D, Hkv * D,
                            want.data() + t0 * Hq * D);
      seqs.push_back({t0, len, t0, len});
      max_kv = std::max(max_kv, len);
      t0 += len;
    }
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < D; ++i) want[size_t((t * Hq + h) * D + i)] *= cpu::sigmoid(qkv[size_t(t * ld + h * 2 * D + D + i)]);
    DeviceBuffer dqkv = upload(to_bf(qkv), "qkv"), dq = upload(to_bf(q), "q"), dk = upload(to_bf(k), "k"), dout(want.size() * 2),
                 dpart(want.size() * 2);
    const bf16* base = dqkv.as<bf16>();
    CudnnAttention att(Hq, Hkv, D);
    // the ragged arrays of `ss` (b: its plan's bound) through the attention, then the gate
    auto run = [&](const std::vector<RaggedSeq>& ss, int64_t kv, DeviceBuffer& out) {
      std::vector<int32_t> h;
      const int64_t b = cudnn_bound(int64_t(ss.size()), 1);
      append_ragged(h, ss, b, Hq * D, Hkv * D, ld, Hq * D);
      DeviceBuffer dr = upload(h, "ragged");
      check(cudaMemset(out.get(), 0xff, out.bytes()), "poison out");
      att.run(dq.as<bf16>(), dk.as<bf16>(), base + Hq * 2 * D + Hkv * D, ld, out.as<bf16>(), ragged_at(dr.as<int32_t>(), b), int64_t(ss.size()),
              kv, nullptr);
      int64_t rows = 0;
      for (const RaggedSeq& r : ss) rows = std::max(rows, r.qrow + r.qlen);
      attention_output_gate(out.as<bf16>(), rows, Hq, D, base + D, ld, 2 * D, nullptr);
      check(cudaDeviceSynchronize(), "cudnn attention");
    };
    run(seqs, max_kv, dout);
    const std::string name = "cuDNN attention D=" + std::to_string(D);
    expect_close(down_bf(dout, want.size()), want, 2e-2, 2e-2, name);
    const std::vector<uint16_t> all = down<uint16_t>(dout, want.size());
    auto rows_differ = [&](const DeviceBuffer& x, int64_t r0, int64_t n) {
      const std::vector<uint16_t> got = down<uint16_t>(x, want.size());
      size_t d = 0;
      for (size_t i = size_t(r0 * Hq * D); i < size_t((r0 + n) * Hq * D); ++i) d += got[i] != all[i];
      return d;
    };
    // the 130-token sequence alone; the 300-token one as 237 cached + 63 new, and as 299 + 1
    run({seqs[3]}, 130, dpart);
    EXPECT_EQ(rows_differ(dpart, seqs[3].qrow, 130), 0u) << name << ": a sequence alone vs in the batch";
    for (int64_t cached : {237, 299}) {
      const RaggedSeq& w = seqs[4];
      run({{w.qrow + cached, w.qlen - cached, w.krow, w.kvlen}}, w.kvlen, dpart);
      EXPECT_EQ(rows_differ(dpart, w.qrow + cached, w.qlen - cached), 0u) << name << ": " << cached << " keys cached vs the whole sequence";
    }
  }
}

// attention_output_gate's two kernels (8 values a thread where rows, heads and pointers are
// 16-byte aligned, else a pair a thread) give the same bits: the same gate values once at an
// aligned address and once an element off it
TEST(CudaOps, OutputGateVectorAndScalarKernelsAgree) {
  NEED_GPU();
  for (auto [L, Hq, D] : {std::tuple{5, 4, 256}, {33, 3, 48}, {2, 24, 256}}) {
    const int64_t ld = Hq * 2 * D + 8, n = L * Hq * D;
    const auto x = to_bf(rounded(randn(size_t(n), 21, 2.0f)));
    const auto g = to_bf(rounded(randn(size_t(L * ld + 1), 22, 3.0f)));
    std::vector<bf16> g_off(g.size() + 1);
    for (size_t i = 0; i < g.size(); ++i) g_off[i + 1] = g[i];
    DeviceBuffer o1 = upload(x, "out"), o2 = upload(x, "out"), dg = upload(g, "gate"), dg_off = upload(g_off, "gate, an element off");
    attention_output_gate(o1.as<bf16>(), L, Hq, D, dg.as<bf16>() + D, ld, 2 * D, nullptr);          // aligned: 8 a thread
    attention_output_gate(o2.as<bf16>(), L, Hq, D, dg_off.as<bf16>() + 1 + D, ld, 2 * D, nullptr);  // misaligned: a pair
    check(cudaDeviceSynchronize(), "output gate");
    const auto a = down<uint16_t>(o1, size_t(n)), b = down<uint16_t>(o2, size_t(n));
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
    EXPECT_EQ(differ, 0u) << "L " << L << " Hq " << Hq << " D " << D;
    // and against the CPU: x * sigmoid(gate), rounded to bf16
    const auto got = down_bf(o1, size_t(n));
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Hq * D; ++i) {
        const int64_t h = i / D, d = i % D;
        want[size_t(t * Hq * D + i)] = __bfloat162float(x[size_t(t * Hq * D + i)]) * cpu::sigmoid(__bfloat162float(g[size_t(t * ld + h * 2 * D + D + d)]));
      }
    expect_close(got, want, 1e-2, 1e-2, "output gate");
  }
}

TEST(CudaOps, AttnPrepNormAndRope) {
  NEED_GPU();
  const int64_t Hq = 3, Hkv = 2, D = 64, R = 16, L = 70;
  const int64_t ld = Hq * 2 * D + 2 * Hkv * D;
  auto qkv = rounded(randn(size_t(L * ld), 14));
  auto qn = randn(size_t(D), 15, 0.1f), kn = randn(size_t(D), 16, 0.1f);
  std::vector<int32_t> ss(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) ss[size_t(t)] = t < 30 ? 0 : 30;
  std::vector<float> inv(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(1e7f, float(2 * i) / float(R));
  std::vector<float> wq(static_cast<size_t>(L * Hq * D)), wk(size_t(L * Hkv * D));
  auto ref = [&](const float* src, const float* w, int64_t pos, float* dst) {
    std::vector<float> x(static_cast<size_t>(D));
    cpu::rms_norm_1p(src, 1, D, w, 1e-6f, x.data());
    for (int64_t i = 0; i < R / 2; ++i) {
      const float a = inv[size_t(i)] * float(pos), c = std::cos(a), s = std::sin(a);
      const float x1 = x[size_t(i)], x2 = x[size_t(i + R / 2)];
      x[size_t(i)] = x1 * c - x2 * s;
      x[size_t(i + R / 2)] = x2 * c + x1 * s;
    }
    std::copy(x.begin(), x.end(), dst);
  };
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t h = 0; h < Hq; ++h) ref(qkv.data() + t * ld + h * 2 * D, qn.data(), t - ss[size_t(t)], wq.data() + (t * Hq + h) * D);
    for (int64_t h = 0; h < Hkv; ++h) ref(qkv.data() + t * ld + Hq * 2 * D + h * D, kn.data(), t - ss[size_t(t)], wk.data() + (t * Hkv + h) * D);
  }
  DeviceBuffer d = upload(to_bf(qkv), "qkv"), dqn = upload(qn, "qn"), dkn = upload(kn, "kn"), dss = upload(ss, "ss"), dinv = upload(inv, "inv"),
               oq(wq.size() * 2), ok(wk.size() * 2);
  attn_prep(d.as<bf16>(), ld, L, 0, L, Hq, Hkv, D, R, dinv.as<float>(), dss.as<int32_t>(), {}, dqn.as<float>(), dkn.as<float>(), 1e-6f,
            oq.as<bf16>(), ok.as<bf16>(), nullptr);
  expect_close(down_bf(oq, wq.size()), wq, 1e-3, 8e-3, "attn_prep q");
  expect_close(down_bf(ok, wk.size()), wk, 1e-3, 8e-3, "attn_prep k");
  // in two blocks of tokens (the lean plan's), gates and values copied out: the same bits
  const std::vector<uint16_t> q_all = down<uint16_t>(oq, wq.size()), k_all = down<uint16_t>(ok, wk.size());
  DeviceBuffer bq(wq.size() * 2), bk(wk.size() * 2), bv(size_t(L * Hkv * D) * 2), bg(size_t(L * Hq * D) * 2);
  for (auto [t0, rows] : {std::pair<int64_t, int64_t>{0, 37}, {37, L - 37}})
    attn_prep(d.as<bf16>(), ld, L, t0, rows, Hq, Hkv, D, R, dinv.as<float>(), dss.as<int32_t>(), {}, dqn.as<float>(), dkn.as<float>(), 1e-6f,
              bq.as<bf16>(), bk.as<bf16>(), nullptr, nullptr, bv.as<bf16>(), bg.as<bf16>());
  EXPECT_EQ(down<uint16_t>(bq, wq.size()), q_all);
  EXPECT_EQ(down<uint16_t>(bk, wk.size()), k_all);
  const std::vector<uint16_t> qkv_bits = down<uint16_t>(d, qkv.size()), v_bits = down<uint16_t>(bv, size_t(L * Hkv * D)),
                              g_bits = down<uint16_t>(bg, size_t(L * Hq * D));
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < D; ++i) ASSERT_EQ(g_bits[size_t((t * Hq + h) * D + i)], qkv_bits[size_t(t * ld + h * 2 * D + D + i)]) << "gate " << t;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < D; ++i)
        ASSERT_EQ(v_bits[size_t((t * Hkv + h) * D + i)], qkv_bits[size_t(t * ld + Hq * 2 * D + Hkv * D + h * D + i)]) << "value " << t;
  }
}

TEST(CudaOps, HeadMhaMatchesCpu) {
  NEED_GPU();
  for (int64_t heads : {4, 16}) {
    const int64_t W = heads == 4 ? 128 : 1024;  // head dims 32 and 64
    const int64_t lq = 5, lk = 300;
    auto q = randn(size_t(lq * W), 17), k = randn(size_t(lk * W), 18), v = randn(size_t(lk * W), 19);
    std::vector<float> want(static_cast<size_t>(lq * W));
    cpu::attention_full(q.data(), lq, k.data(), v.data(), lk, W, heads, want.data());
    std::vector<int32_t> kb(static_cast<size_t>(lq), 0), ke(static_cast<size_t>(lq), int32_t(lk));
    DeviceBuffer dq = upload(q, "q"), dk = upload(k, "k"), dv = upload(v, "v"), dkb = upload(kb, "kb"), dke = upload(ke, "ke"),
                 out(want.size() * 4);
    mha_attend(dq.as<float>(), W, lq, dk.as<float>(), W, dv.as<float>(), W, dkb.as<int32_t>(), dke.as<int32_t>(), W, heads, out.as<float>(),
               nullptr);
    expect_close(down<float>(out, want.size()), want, 1e-5, 1e-4, "mha heads=" + std::to_string(heads));
  }
  // per-row key ranges over a long memory (the online softmax's rescaling), one of them empty
  const int64_t heads = 16, W = 1024, lq = 4, lk = 6000;
  auto q = randn(size_t(lq * W), 20, 2.0f), k = randn(size_t(lk * W), 21), v = randn(size_t(lk * W), 22);
  const std::vector<int32_t> kb = {0, 100, 5999, 40}, ke = {6000, 4100, 6000, 40};
  std::vector<float> want(static_cast<size_t>(lq * W), 0.0f);
  for (int64_t r = 0; r < lq; ++r)
    if (ke[size_t(r)] > kb[size_t(r)])
      cpu::attention_full(q.data() + r * W, 1, k.data() + int64_t(kb[size_t(r)]) * W, v.data() + int64_t(kb[size_t(r)]) * W,
                          ke[size_t(r)] - kb[size_t(r)], W, heads, want.data() + r * W);
  DeviceBuffer dq = upload(q, "q"), dk = upload(k, "k"), dv = upload(v, "v"), dkb = upload(kb, "kb"), dke = upload(ke, "ke"), out(want.size() * 4);
  mha_attend(dq.as<float>(), W, lq, dk.as<float>(), W, dv.as<float>(), W, dkb.as<int32_t>(), dke.as<int32_t>(), W, heads, out.as<float>(), nullptr);
  const auto got = down<float>(out, want.size());
  expect_close(got, want, 1e-5, 1e-4, "mha over per-row key ranges");
  for (int64_t i = 3 * W; i < 4 * W; ++i) ASSERT_EQ(got[size_t(i)], 0.0f) << "an empty key range gives zeros";
}

}  // namespace
}  // namespace clefrt::cuda

namespace clefrt::cuda {
namespace {

TEST(CudaOps, GdnPrepGatesAndGatedNorm) {
  NEED_GPU();
  const int64_t L = 50, Hk = 2, Hv = 4, Dk = 16, Dv = 24, key_dim = Hk * Dk, conv_dim = 2 * key_dim + Hv * Dv;
  auto mixed = randn(size_t(L * conv_dim), 20);
  const int64_t ldba = 3 + 2 * Hv;
  auto ba = rounded(randn(size_t(L * ldba), 21, 2.0f));
  auto negA = randn(size_t(Hv), 22), dt = randn(size_t(Hv), 23);
  for (auto& a : negA) a = -std::exp(a);
  std::vector<float> want = mixed, wg(size_t(L * Hv)), wb(size_t(L * Hv));
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t r = 0; r < 2 * Hk; ++r) {
      float* p = want.data() + t * conv_dim + r * Dk;
      double ss = 0;
      for (int64_t i = 0; i < Dk; ++i) ss += double(p[i]) * p[i];
      const float inv = float(1.0 / std::sqrt(ss + 1e-6)) * (r < Hk ? 1.0f / std::sqrt(float(Dk)) : 1.0f);
      for (int64_t i = 0; i < Dk; ++i) p[i] *= inv;
    }
    for (int64_t j = 0; j < Hv; ++j) {
      wb[size_t(t * Hv + j)] = cpu::sigmoid(ba[size_t(t * ldba + 3 + j)]);
      wg[size_t(t * Hv + j)] = negA[size_t(j)] * cpu::softplus(ba[size_t(t * ldba + 3 + Hv + j)] + dt[size_t(j)]);
    }
  }
  DeviceBuffer dm = upload(mixed, "m"), dba = upload(ba, "ba"), dA = upload(negA, "A"), ddt = upload(dt, "dt"), g(wg.size() * 4),
               beta(wb.size() * 4);
  const float* b = dba.as<float>() + 3;
  gdn_prep(dm.as<float>(), conv_dim, L, Hk, Dk, b, b + Hv, ldba, Hv, dA.as<float>(), ddt.as<float>(), g.as<float>(), beta.as<float>(), nullptr);
  expect_close(down<float>(dm, want.size()), want, 1e-6, 1e-5, "q/k norm");
  expect_close(down<float>(g, wg.size()), wg, 1e-6, 1e-5, "g");
  expect_close(down<float>(beta, wb.size()), wb, 1e-6, 1e-5, "beta");

  // gated norm: rms_norm(o) * w * silu(z) per value head; Dv = 128 with z's rows 16-byte aligned
  // is the float4 form, the others the general one
  for (auto [dv, ldz] : {std::pair<int64_t, int64_t>{Dv, Hv * Dv + 5}, {128, Hv * 128 + 8}, {128, Hv * 128 + 5}}) {
    auto o = randn(size_t(L * Hv * dv), 24), w = randn(size_t(dv), 25, 0.1f, 1.0f);
    auto z = rounded(randn(size_t(L * ldz), 26));
    std::vector<float> wn(o.size());
    cpu::rms_norm(o.data(), L * Hv, dv, w.data(), 1e-6f, wn.data());
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Hv * dv; ++i) wn[size_t(t * Hv * dv + i)] *= cpu::silu(z[size_t(t * ldz + i)]);
    DeviceBuffer dO = upload(o, "o"), dw = upload(w, "w"), dz = upload(z, "z"), act(o.size() * 2);
    gated_norm(dO.as<float>(), L, Hv, dv, dw.as<float>(), 1e-6f, dz.as<float>(), ldz, act.as<bf16>(), nullptr);
    expect_close(down_bf(act, wn.size()), wn, 1e-4, 8e-3, "gated_norm Dv " + std::to_string(dv) + " ldz " + std::to_string(ldz));
    // FP8: z unscaled, its scales applied on read (rs by row, cs by column): the bits of z scaled
    std::vector<float> rs(static_cast<size_t>(L)), cs(static_cast<size_t>(Hv * dv)), zr = z, zs = z;
    for (size_t i = 0; i < rs.size(); ++i) rs[i] = 1e-2f * float(1 + i % 7);
    for (size_t i = 0; i < cs.size(); ++i) cs[i] = 1e-3f * float(3 + i % 11);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < Hv * dv; ++i) {
        zr[size_t(t * ldz + i)] = z[size_t(t * ldz + i)] * 3e4f;
        float v = zr[size_t(t * ldz + i)] * rs[size_t(t)];
        zs[size_t(t * ldz + i)] = v * cs[size_t(i)];
      }
    DeviceBuffer dzr = upload(zr, "z unscaled"), dzs = upload(zs, "z scaled"), drs = upload(rs, "rs"), dcs = upload(cs, "cs"), a1(o.size() * 2),
                 a2(o.size() * 2);
    gated_norm(dO.as<float>(), L, Hv, dv, dw.as<float>(), 1e-6f, dzs.as<float>(), ldz, a1.as<bf16>(), nullptr);
    gated_norm(dO.as<float>(), L, Hv, dv, dw.as<float>(), 1e-6f, dzr.as<float>(), ldz, a2.as<bf16>(), nullptr,
               RowColScales{drs.as<float>(), dcs.as<float>()});
    EXPECT_EQ(down<uint16_t>(a2, o.size()), down<uint16_t>(a1, o.size())) << "gated_norm with FP8 scales on read, Dv " << dv << " ldz " << ldz;
  }
}

// gdn_conv_prep at Clef's shape (K = 4, Dk = 128: the one-kernel form) against conv_silu_rows +
// gdn_prep (each checked against the CPU above): the conv's value columns and the gates bit for
// bit, the normed q / k within fp32 rounding (the norm's sum runs in another order), over token
// blocks with and without cached conv history.
TEST(CudaOps, GdnConvPrepAtClefShapeMatchesTheTwoKernels) {
  NEED_GPU();
  const int64_t Hk = 2, Dk = 128, Hv = 4, Dv = 128, K = 4, conv_dim = 2 * Hk * Dk + Hv * Dv, ldx = conv_dim + Hv * Dv + 2 * Hv;
  const std::vector<int64_t> lens = {1, 3, 64, 130};
  int64_t L = 0;
  std::vector<int32_t> seq_start, seq_of;
  for (size_t q = 0; q < lens.size(); ++q) {
    for (int64_t t = 0; t < lens[q]; ++t) seq_start.push_back(int32_t(L)), seq_of.push_back(int32_t(q));
    L += lens[q];
  }
  auto x = randn(size_t(L * ldx), 31, 2.0f), w = randn(size_t(conv_dim * K), 32, 0.5f);
  auto negA = randn(size_t(Hv), 33), dt = randn(size_t(Hv), 34);
  for (auto& a : negA) a = -std::exp(a);
  // cached history (the prefix cache's K - 1 rows, at a layer offset) for sequences 1 and 3
  const int64_t layer_off = 3 * conv_dim;
  DeviceBuffer h1 = upload(randn(size_t(layer_off + (K - 1) * conv_dim), 35), "h1"), h3 = upload(randn(size_t(layer_off + (K - 1) * conv_dim), 36), "h3");
  const std::vector<const float*> hrows = {nullptr, h1.as<float>(), nullptr, h3.as<float>()};
  DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), ds = upload(seq_start, "s"), dso = upload(seq_of, "so"), dA = upload(negA, "A"),
               ddt = upload(dt, "dt"), dh(hrows.size() * sizeof(float*));
  check(cudaMemcpy(dh.get(), hrows.data(), hrows.size() * sizeof(float*), cudaMemcpyHostToDevice), "history pointers");
  const ConvHistory hist{dso.as<int32_t>(), reinterpret_cast<const float* const*>(dh.get()), layer_off};
  for (bool with_hist : {false, true})
    for (auto [b0, b1] : {std::pair<int64_t, int64_t>{0, L}, {5, 70}, {66, 67}, {70, L}, {2, 3}}) {
      const int64_t r0 = std::max<int64_t>(0, b0 - (K - 1)), rows = b1 - b0;
      const float* xb = dx.as<float>() + r0 * ldx;
      const float* bcol = dx.as<float>() + b0 * ldx + conv_dim + Hv * Dv;
      const ConvHistory h = with_hist ? hist : ConvHistory{};
      DeviceBuffer m1(size_t(rows * conv_dim) * 4), m2(size_t(rows * conv_dim) * 4), g1(size_t(rows * Hv) * 4), g2(size_t(rows * Hv) * 4),
          be1(size_t(rows * Hv) * 4), be2(size_t(rows * Hv) * 4);
      conv_silu_rows(xb, ldx, r0, ds.as<int32_t>(), b0, rows, conv_dim, dw.as<float>(), K, m1.as<float>(), nullptr, h);
      gdn_prep(m1.as<float>(), conv_dim, rows, Hk, Dk, bcol, bcol + Hv, ldx, Hv, dA.as<float>(), ddt.as<float>(), g1.as<float>(), be1.as<float>(),
               nullptr);
      gdn_conv_prep(xb, ldx, r0, ds.as<int32_t>(), b0, rows, dw.as<float>(), K, conv_dim, Hk, Dk, bcol, bcol + Hv, ldx, Hv, dA.as<float>(),
                    ddt.as<float>(), m2.as<float>(), g2.as<float>(), be2.as<float>(), nullptr, h);
      const std::string what = "blocks [" + std::to_string(b0) + ", " + std::to_string(b1) + ")" + (with_hist ? " with history" : "");
      const auto want = down<float>(m1, size_t(rows * conv_dim)), got = down<float>(m2, size_t(rows * conv_dim));
      std::vector<float> want_qk, got_qk;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t c = 0; c < conv_dim; ++c) {
          const size_t i = size_t(t * conv_dim + c);
          if (c < 2 * Hk * Dk) {
            want_qk.push_back(want[i]);
            got_qk.push_back(got[i]);
          } else {
            ASSERT_EQ(got[i], want[i]) << what << ": value column " << c << " of row " << t;
          }
        }
      expect_close(got_qk, want_qk, 1e-7, 1e-5, "normed q / k, " + what);
      EXPECT_EQ(down<float>(g2, size_t(rows * Hv)), down<float>(g1, size_t(rows * Hv))) << "g, " << what;
      EXPECT_EQ(down<float>(be2, size_t(rows * Hv)), down<float>(be1, size_t(rows * Hv))) << "beta, " << what;
      // the default (registers capped for 3 CTAs an SM) against the uncapped kernel: the same bits
      DeviceBuffer m3(size_t(rows * conv_dim) * 4), g3(size_t(rows * Hv) * 4), be3(size_t(rows * Hv) * 4);
      gdn_conv_prep(xb, ldx, r0, ds.as<int32_t>(), b0, rows, dw.as<float>(), K, conv_dim, Hk, Dk, bcol, bcol + Hv, ldx, Hv, dA.as<float>(),
                    ddt.as<float>(), m3.as<float>(), g3.as<float>(), be3.as<float>(), nullptr, h, {}, 0);
      EXPECT_EQ(down<float>(m3, size_t(rows * conv_dim)), got) << "uncapped, " << what;
      EXPECT_EQ(down<float>(g3, size_t(rows * Hv)), down<float>(g2, size_t(rows * Hv))) << "g, uncapped, " << what;
      EXPECT_EQ(down<float>(be3, size_t(rows * Hv)), down<float>(be2, size_t(rows * Hv))) << "beta, uncapped, " << what;
      // the rows in bf16 (mixed16, the one-pass Wgmma prep's input), capped and uncapped: each the
      // fp32 value rounded to nearest, the gates the same
      for (int cap : {-1, 0}) {
        DeviceBuffer m4(size_t(rows * conv_dim) * 2), g4(size_t(rows * Hv) * 4), be4(size_t(rows * Hv) * 4);
        check(cudaMemset(m4.get(), 0xff, size_t(rows * conv_dim) * 2), "poison");  // every value must be written
        gdn_conv_prep(xb, ldx, r0, ds.as<int32_t>(), b0, rows, dw.as<float>(), K, conv_dim, Hk, Dk, bcol, bcol + Hv, ldx, Hv, dA.as<float>(),
                      ddt.as<float>(), nullptr, g4.as<float>(), be4.as<float>(), nullptr, h, {}, cap, m4.as<bf16>());
        const auto m16 = down<bf16>(m4, size_t(rows * conv_dim));
        for (size_t i = 0; i < got.size(); ++i) {
          const bf16 want16 = __float2bfloat16_rn(got[i]);
          ASSERT_EQ(std::memcmp(&m16[i], &want16, 2), 0) << "bf16 rows (cap " << cap << "), value " << i << ", " << what;
        }
        EXPECT_EQ(down<float>(g4, size_t(rows * Hv)), down<float>(g2, size_t(rows * Hv))) << "g, bf16 rows, " << what;
        EXPECT_EQ(down<float>(be4, size_t(rows * Hv)), down<float>(be2, size_t(rows * Hv))) << "beta, bf16 rows, " << what;
      }
    }
  // FP8: x's conv columns as the FP8 in_proj leaves them unscaled, the kernel applying the scales
  // (rs by x's row, cs by column) as it reads: the bits of the kernel on the scaled values
  std::vector<float> rs(static_cast<size_t>(L)), cs(static_cast<size_t>(conv_dim)), xs = x;
  std::mt19937 rng(39);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  for (auto& v : rs) v = ud(rng) * 1e-2f;
  for (auto& v : cs) v = ud(rng) * 1e-3f;
  for (int64_t t = 0; t < L; ++t)  // unscaled: ~1e5 times the values the conv should see
    for (int64_t c = 0; c < conv_dim; ++c) {
      float& raw = x[size_t(t * ldx + c)];
      raw = raw * 1e5f;
      const float v = raw * rs[size_t(t)];
      xs[size_t(t * ldx + c)] = v * cs[size_t(c)];
    }
  DeviceBuffer dxr = upload(x, "x unscaled"), dxs = upload(xs, "x scaled"), drs = upload(rs, "rs"), dcs = upload(cs, "cs");
  for (bool with_hist : {false, true})
    for (auto [b0, b1] : {std::pair<int64_t, int64_t>{0, L}, {5, 70}, {70, L}}) {
      const int64_t r0 = std::max<int64_t>(0, b0 - (K - 1)), rows = b1 - b0;
      const ConvHistory h = with_hist ? hist : ConvHistory{};
      DeviceBuffer m1(size_t(rows * conv_dim) * 4), m2(size_t(rows * conv_dim) * 4), g1(size_t(rows * Hv) * 4), g2(size_t(rows * Hv) * 4),
          be1(size_t(rows * Hv) * 4), be2(size_t(rows * Hv) * 4);
      const float* b_s = dxs.as<float>() + b0 * ldx + conv_dim + Hv * Dv;
      const float* b_r = dxr.as<float>() + b0 * ldx + conv_dim + Hv * Dv;
      gdn_conv_prep(dxs.as<float>() + r0 * ldx, ldx, r0, ds.as<int32_t>(), b0, rows, dw.as<float>(), K, conv_dim, Hk, Dk, b_s, b_s + Hv, ldx, Hv,
                    dA.as<float>(), ddt.as<float>(), m1.as<float>(), g1.as<float>(), be1.as<float>(), nullptr, h);
      gdn_conv_prep(dxr.as<float>() + r0 * ldx, ldx, r0, ds.as<int32_t>(), b0, rows, dw.as<float>(), K, conv_dim, Hk, Dk, b_r, b_r + Hv, ldx, Hv,
                    dA.as<float>(), ddt.as<float>(), m2.as<float>(), g2.as<float>(), be2.as<float>(), nullptr, h,
                    RowColScales{drs.as<float>() + r0, dcs.as<float>()});
      const std::string what = "FP8 scales on read, blocks [" + std::to_string(b0) + ", " + std::to_string(b1) + ")" + (with_hist ? " with history" : "");
      EXPECT_EQ(down<float>(m2, size_t(rows * conv_dim)), down<float>(m1, size_t(rows * conv_dim))) << "mixed, " << what;
      EXPECT_EQ(down<float>(g2, size_t(rows * Hv)), down<float>(g1, size_t(rows * Hv))) << "g, " << what;
      EXPECT_EQ(down<float>(be2, size_t(rows * Hv)), down<float>(be1, size_t(rows * Hv))) << "beta, " << what;
    }
}

TEST(CudaOps, SwigluEmbedAndBiasGelu) {
  NEED_GPU();
  const int64_t L = 33, vocab = 50, d = 40;
  for (int64_t ffn : {70, 4104}) {  // scalar form; 16-byte form over two column blocks
    auto gu = rounded(randn(size_t(L * 2 * ffn), 27, 2.0f));
    std::vector<float> want(size_t(L * ffn));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t j = 0; j < ffn; ++j) want[size_t(t * ffn + j)] = cpu::silu(gu[size_t(t * 2 * ffn + j)]) * gu[size_t(t * 2 * ffn + ffn + j)];
    DeviceBuffer dgu = upload(to_bf(gu), "gu"), act(want.size() * 2);
    swiglu(dgu.as<bf16>(), L, ffn, act.as<bf16>(), nullptr);
    expect_close(down_bf(act, want.size()), want, 1e-4, 8e-3, "swiglu ffn=" + std::to_string(ffn));
  }

  auto table = rounded(randn(size_t(vocab * d), 28));
  std::vector<int32_t> ids;
  std::vector<float> we;
  for (int64_t t = 0; t < L; ++t) {
    ids.push_back(int32_t((t * 7) % vocab));
    we.insert(we.end(), table.begin() + ids.back() * d, table.begin() + (ids.back() + 1) * d);
  }
  DeviceBuffer dt = upload(to_bf(table), "t"), di = upload(ids, "ids"), x(we.size() * 4);
  embed_gather(di.as<int32_t>(), L, dt.as<bf16>(), d, x.as<float>(), nullptr);
  expect_close(down<float>(x, we.size()), we, 1e-30, 0, "embed");

  auto y = randn(size_t(L * d), 29), bias = randn(size_t(d), 30);
  std::vector<float> wy = y;
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < d; ++i) wy[size_t(t * d + i)] = cpu::gelu_erf(y[size_t(t * d + i)] + bias[size_t(i)]);
  DeviceBuffer dy = upload(y, "y"), db = upload(bias, "b");
  bias_act(dy.as<float>(), L, d, d, db.as<float>(), true, nullptr);
  expect_close(down<float>(dy, wy.size()), wy, 1e-6, 1e-5, "bias+gelu");
}

}  // namespace
}  // namespace clefrt::cuda

// The FP8 model's narrow bf16 GEMM (issue 20, short requests): the GDN in_proj keeps its a | b
// rows (2 x 48 gate inputs, n 96, k 5,120) in bf16, a cuBLASLt GEMM of its own after the FP8
// part. At the blog's 318 rows the engine's batch-invariant pick takes ~11 us a layer, 48 layers
// (~0.5 ms of a ~22 ms forward: bench/results/2026-12-07-h100-session50.md), on a grid that
// leaves most SMs idle, and cuBLASLt's split-K kernels are not batch-invariant candidates.
// The variants: kernels.h narrow_gemm (the product's, behind CLEFRT_LAB_NARROW_SPLITK) per form,
// k split in fixed slices (S of them, whatever m), each warp 16 rows x all n columns of one slice
// on mma.sync m16n8k16 (bf16 in, fp32 sums), the slices' partial sums then added in slice order
// by a second kernel: a row's bits depend only on its own values (batch-invariant by
// construction), though not cuBLASLt's bits (other sums).
// Prints per m (318, 1,024, 8,192) and form: us a call (bench::per_launch_ms: 20 back to back), the error against a
// double-precision reference (|y - y_double| / sum |x w|, worst), whether a row alone gives the
// bits it gives inside m (row invariance), and the largest difference from the engine's output.
// Usage: clefrt_bench_narrow_gemm [--commit ID] [--json FILE] [--m M]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/ops/kernels.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int kN = 96, kK = 5120;  // Clef-27B's a | b: 2 x 48 value heads, hidden 5,120

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  return bench::gemm_lab_main(argc, argv, "clefrt_bench_narrow_gemm", [](const bench::Options& opt, const HardwareLimits&, cudaStream_t st,
                                                                          Gemm& engine, Gemm&) {
    json::Value lines = json::Value::array();
    const int mmax = 8192;
    std::mt19937 rng(31);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16> hx(size_t(mmax) * kK), hw16(size_t(kN) * kK);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    for (auto& v : hw16) v = __float2bfloat16(0.02f * nd(rng));
    DeviceBuffer dx = upload(hx, "x"), dw = upload(hw16, "w"), y(size_t(mmax) * kN * 4), y1(size_t(mmax) * kN * 4),
                 part(size_t(64) << 20, "partials (the size of the engine Gemm's workspace, where the product keeps them)");
    for (int m : {318, 1024, 8192}) {
      if (opt.only_m > 0 && m != opt.only_m) continue;
      // the reference in double for the first 64 rows
      const int rows = std::min(m, 64);
      std::vector<double> ref(size_t(rows) * kN), mag(size_t(rows) * kN);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < kN; ++c) {
          double sum = 0, abs = 0;
          for (int k = 0; k < kK; ++k) {
            const double p = double(__bfloat162float(hx[size_t(r) * kK + k])) * double(__bfloat162float(hw16[size_t(c) * kK + k]));
            sum += p;
            abs += std::fabs(p);
          }
          ref[size_t(r) * kN + c] = sum;
          mag[size_t(r) * kN + c] = abs;
        }
      auto err = [&](const float* got) {  // over the reference's first rows
        double e = 0;
        for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(double(got[i]) - ref[i]) / std::max(mag[i], 1e-30));
        return e;
      };
      const double t_eng = 1e3 * bench::per_launch_ms(st, [&] { engine.run(dx.as<bf16>(), m, kK, kK, dw.as<bf16>(), kN, y.get(), OutType::F32, kN, false, "a|b"); });
      engine.run(dx.as<bf16>(), m, kK, kK, dw.as<bf16>(), kN, y.get(), OutType::F32, kN, false, "a|b");
      const std::vector<float> eng = bench::download<float>(y, size_t(m) * kN, st);
      std::printf("\nm %d, n %d, k %d\n  %-34s %8.2f us  worst error %.2e\n", m, kN, kK, "engine (cuBLASLt, batch-invariant)", t_eng,
                  err(eng.data()));
      json::Value e = json::Value::object();
      e.add("m", json::Value::integer(m));
      e.add("form", json::Value::string("engine"));
      e.add("us", json::Value::number(t_eng));
      lines.arr.push_back(std::move(e));
      auto variant = [&](const char* name, auto run) {
        const double us = 1e3 * bench::per_launch_ms(st, [&] { run(m, y1); });
        run(m, y1);
        const std::vector<float> got = bench::download<float>(y1, size_t(m) * kN, st);
        // row invariance: the first rows alone (m 1 and 17) against inside m
        bool inv = true;
        for (int alone : {1, 17}) {
          run(alone, y1);
          const std::vector<float> a = bench::download<float>(y1, size_t(alone) * kN, st);
          inv = inv && std::equal(a.begin(), a.end(), got.begin());
        }
        double dmax = 0;
        for (size_t i = 0; i < got.size(); ++i) dmax = std::max(dmax, double(std::fabs(got[i] - eng[i])));
        const double er = err(got.data());
        std::printf("  %-34s %8.2f us  worst error %.2e  rows alone %s  max |y - engine's| %.3g  (%.2fx the engine)\n", name, us, er,
                    inv ? "same bits" : "BITS DIFFER", dmax, t_eng / us);
        json::Value v = json::Value::object();
        v.add("m", json::Value::integer(m));
        v.add("form", json::Value::string(name));
        v.add("us", json::Value::number(us));
        v.add("worst_error", json::Value::number(er));
        v.add("row_invariant", json::Value::boolean(inv));
        v.add("max_diff_from_engine", json::Value::number(dmax));
        lines.arr.push_back(std::move(v));
      };
      const bf16* xp = dx.as<bf16>();
      const bf16* wp = dw.as<bf16>();
      float* pp = part.as<float>();
      for (const NarrowGemmForm f : {NarrowGemmForm{8, 2}, NarrowGemmForm{16, 2}, NarrowGemmForm{16, 4}, NarrowGemmForm{20, 2},
                                     NarrowGemmForm{32, 1}, NarrowGemmForm{32, 2}, NarrowGemmForm{64, 1}}) {
        const std::string name = "split " + std::to_string(f.slices) + ", " + std::to_string(f.warps) + " warps";
        const int64_t prows = narrow_gemm_partial_rows(kN, f, part.bytes());
        variant(name.c_str(), [&](int mm, DeviceBuffer& out) { narrow_gemm(xp, mm, kK, kK, wp, kN, out.as<float>(), kN, f, pp, prows, st); });
      }
    }
    return lines;
  });
}

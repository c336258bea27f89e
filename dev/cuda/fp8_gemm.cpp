// The FP8 GEMM at the GEMM level (issue 6: "batched prefill >= 1.6x bf16" needs the FP8 GEMM
// well above the bf16 one), at the 27B model's MLP shapes. Per shape and m (CUDA events, median
// of 20 after 3 warm-ups):
//   bf16 inv       cuBLASLt bf16, the engine's batch-invariant algorithm
//   fp8 inv        cuBLASLt FP8 e4m3, the engine's batch-invariant algorithm (GEMM alone)
//   fast accum     the same algorithm without fp32 promotion of partial sums (GemmLab: a
//                  variant kept here, not in the product)
//   quant / scale  the engine's per-token activation quantization and the scale pass after it
//   candidates     every algorithm cuBLASLt's heuristic offers for this m, timed, with its
//                  configuration; "inv" marks the batch-invariant ones (no split-K / reduction);
//                  and how many of its outputs differ in any bit from the engine's algorithm
//                  (0 everywhere would mean it could replace it at this m without changing answers)
//   accuracy       per shape, at m = 256, the promoted and the fast-accumulation GEMM (fp32 out)
//                  against the exact sum of the same e4m3 products (fp64 on the host) over 64 rows
//                  x 512 columns: RMS error / RMS of the exact outputs, the worst such error, and
//                  the bias (least-squares slope of output on exact, minus 1: a shrink toward zero
//                  shows as negative), on normal activations and on activations with 16 outlier
//                  channels 40x the others (what real hidden states carry). Quantization's own
//                  error is not in these figures: both sides take the same codes.
//   alpha vector   at m 318 and 8,192: whether cuBLASLt takes the weights' per-channel scale cs
//                  as a device vector of alphas (GemmLab::fp8_alpha_vector; a lead of
//                  docs/notes/fp8-gemm-design.md: the scale inside the GEMM instead of the pass
//                  after it), its time beside the scalar-alpha GEMM and that pass, and its bf16
//                  outputs against bf16(cs[row] x the engine's fp32 sum); with alpha 1 everywhere
//                  against bf16(sum), so that a difference tells its summation order from where
//                  alpha is applied (the product's bits are bf16(bf16(sum) rs cs) either way)
//   outer vectors  at m 318 and 8,192: whether cuBLASLt takes both FP8 scales, the weights' per
//                  channel and the activations' per token, as outer vectors
//                  (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: GemmLab::fp8_channel_scales /
//                  fp8_token_scales), its time beside the scalar GEMM and the scale pass; its bf16
//                  outputs against the product's bf16(bf16(sum) rs cs) (bits) and bf16(rs cs sum)
//                  (bits, and the worst difference relative to the largest output); and adding into
//                  an fp32 residual (beta 1, GemmLab::fp8_accumulate: what would let the down and
//                  out_proj GEMMs write the residual stream as bf16's do) against r + rs cs sum
// Random inputs. Usage: clefrt_bench_fp8 [--commit ID] [--json FILE] [--m M]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "gpu_bench.h"

using namespace clefrt;
using namespace clefrt::cuda;

using bench::median_ms;

namespace {

// At m = 256, 64 rows x 512 columns of the promoted and the fast-accumulation GEMM (fp32 out)
// against the exact e4m3 sums (see the header)
json::Value measure_accuracy(Gemm& inv, Gemm& fast, const DeviceBuffer& x8, const DeviceBuffer& w8, int64_t n, int64_t k, const char* data,
                             cudaStream_t s) {
  const int64_t m = 256;
  const bench::ExactE4m3Sums exact = bench::exact_e4m3_sums(x8, w8, n, k, 64, 512, s);
  DeviceBuffer y(size_t(m * n) * 4, "y fp32");
  auto run = [&](Gemm& g) {
    g.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::F32, n, "accuracy");
    return bench::accuracy_of(exact, y, n, s);
  };
  const bench::Accuracy p = run(inv), f = run(fast);
  std::printf("accuracy (%s activations, m %lld, %lld x %lld outputs vs the exact e4m3 sums): promoted rms %.2e worst %.2e bias %+.2e | "
              "fast accum rms %.2e worst %.2e bias %+.2e\n",
              data, (long long)m, (long long)exact.rows, (long long)exact.cols, p.rms_rel, p.worst_rel, p.bias, f.rms_rel, f.worst_rel, f.bias);
  json::Value r = json::Value::object();
  r.add("activations", json::Value::string(data));
  r.add("promoted", bench::accuracy_json(p));
  r.add("fast_accum", bench::accuracy_json(f));
  return r;
}

// Outputs of y (bf16 [m, n], ld n) that differ in any bit from bf16(scale[col] * f32[row, col]).
int64_t mismatches_against_scaled(const DeviceBuffer& y, const std::vector<float>& f32, const std::vector<float>& scale, int64_t m, int64_t n,
                                  cudaStream_t s) {
  const std::vector<uint16_t> got = bench::download<uint16_t>(y, size_t(m * n), s);
  int64_t bad = 0;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t c = 0; c < n; ++c) {
      const __nv_bfloat16 want = __float2bfloat16_rn(scale[size_t(c)] * f32[size_t(t * n + c)]);
      uint16_t wb;
      std::memcpy(&wb, &want, 2);
      bad += wb != got[size_t(t * n + c)];
    }
  return bad;
}

// The alpha-vector point (see the header) at one m; t_scalar / t_scale: the scalar-alpha GEMM's
// and the scale pass's times at this m.
json::Value alpha_vector_point(Gemm& inv, const DeviceBuffer& x8, const DeviceBuffer& w8, const DeviceBuffer& cs, int64_t m, int64_t n,
                               int64_t k, double t_scalar, double t_scale, cudaStream_t s) {
  json::Value r = json::Value::object();
  GemmLab with_cs, with_ones;
  with_cs.fp8_alpha_vector = cs.as<float>();
  const std::vector<float> ones_h(static_cast<size_t>(n), 1.0f);
  DeviceBuffer ones = bench::upload(ones_h, "ones");
  with_ones.fp8_alpha_vector = ones.as<float>();
  Gemm vec(s, true, size_t(64) << 20, with_cs), vec1(s, true, size_t(64) << 20, with_ones);
  DeviceBuffer y(size_t(m * n) * 2, "y alpha vector"), y32(size_t(m * n) * 4, "y fp32");
  auto run = [&](Gemm& g) { g.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "alpha vector"); };
  double t_vec = 0;
  try {
    run(vec);
    t_vec = bench::median_ms(s, [&] { run(vec); });
  } catch (const Error& e) {  // no algorithm takes it (or the pointer mode is refused): the answer is "no"
    std::printf("m %6lld  alpha vector: not available (%s) | scalar alpha %.3f ms, scale pass %.3f ms\n", (long long)m, e.what(), t_scalar, t_scale);
    r.add("available", json::Value::boolean(false));
    r.add("why", json::Value::string(e.what()));
    return r;
  }
  inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y32.get(), OutType::F32, n, "alpha vector");
  const std::vector<float> sum = bench::download<float>(y32, size_t(m * n), s), cs_h = bench::download<float>(cs, size_t(n), s);
  run(vec);
  const int64_t bad = mismatches_against_scaled(y, sum, cs_h, m, n, s);
  run(vec1);
  const int64_t bad1 = mismatches_against_scaled(y, sum, ones_h, m, n, s);
  std::printf("m %6lld  alpha vector: %.3f ms | scalar alpha %.3f ms (%.3fx), scale pass %.3f ms | outputs != bf16(cs * fp32 sum): %lld of %lld "
              "(alpha 1: != bf16(sum) %lld)\n",
              (long long)m, t_vec, t_scalar, t_vec / t_scalar, t_scale, (long long)bad, (long long)(m * n), (long long)bad1);
  r.add("available", json::Value::boolean(true));
  r.add("ms", json::Value::number(t_vec));
  r.add("mismatches_vs_scaled_fp32", json::Value::integer(bad));
  r.add("mismatches_alpha_one_vs_fp32", json::Value::integer(bad1));
  return r;
}

// The outer-vector point (see the header) at one m: cs per output feature (n), rs per row (m).
json::Value outer_vector_point(Gemm& inv, const DeviceBuffer& x8, const DeviceBuffer& w8, const DeviceBuffer& cs, const DeviceBuffer& rs,
                               int64_t m, int64_t n, int64_t k, double t_scalar, double t_scale, cudaStream_t s) {
  json::Value r = json::Value::object();
  GemmLab outer_lab;
  outer_lab.fp8_channel_scales = cs.as<float>();
  outer_lab.fp8_token_scales = rs.as<float>();
  GemmLab acc_lab = outer_lab;
  acc_lab.fp8_accumulate = true;
  Gemm outer(s, true, size_t(64) << 20, outer_lab), outer_acc(s, true, size_t(64) << 20, acc_lab);
  DeviceBuffer y(size_t(m * n) * 2, "y outer"), y32(size_t(m * n) * 4, "y fp32"), res(size_t(m * n) * 4, "residual");
  auto run = [&] { outer.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "outer vectors"); };
  // with fast accumulation too (some callers of this scale mode set it; whether sm_90 takes the
  // mode only that way is part of the question), asked whether or not the promoted form runs
  auto fast_point = [&] {
    GemmLab fast_lab = outer_lab;
    fast_lab.fp8_fast_accum = true;
    Gemm outer_fast(s, true, size_t(64) << 20, fast_lab);
    auto run_fast = [&] {
      outer_fast.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "outer vectors, fast accumulation");
    };
    json::Value f = json::Value::object();
    try {
      run_fast();
      const double t_fast = bench::median_ms(s, run_fast);
      std::printf("m %6lld  outer vectors, fast accumulation: %.3f ms\n", (long long)m, t_fast);
      f.add("available", json::Value::boolean(true));
      f.add("ms", json::Value::number(t_fast));
    } catch (const Error& e) {
      std::printf("m %6lld  outer vectors, fast accumulation: not available (%s)\n", (long long)m, e.what());
      f.add("available", json::Value::boolean(false));
      f.add("why", json::Value::string(e.what()));
    }
    return f;
  };
  double t_outer = 0;
  try {
    run();
    t_outer = bench::median_ms(s, run);
  } catch (const Error& e) {  // no algorithm takes the scale mode: the answer is "no"
    std::printf("m %6lld  outer vectors: not available (%s) | scalar %.3f ms + scale pass %.3f ms\n", (long long)m, e.what(), t_scalar, t_scale);
    r.add("available", json::Value::boolean(false));
    r.add("why", json::Value::string(e.what()));
    r.add("fast_accum", fast_point());
    return r;
  }
  const size_t mn = size_t(m * n);
  inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y32.get(), OutType::F32, n, "outer vectors");
  const std::vector<float> sum = bench::download<float>(y32, mn, s), cs_h = bench::download<float>(cs, size_t(n), s),
                           rs_h = bench::download<float>(rs, size_t(m), s);
  run();
  const std::vector<uint16_t> got = bench::download<uint16_t>(y, mn, s);
  // the product's bits: the bf16 GEMM output scaled by the pass
  DeviceBuffer yp(mn * 2, "y product");
  inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, yp.get(), OutType::BF16, n, "outer vectors");
  scale_rows_cols_bf16(yp.as<bf16>(), m, n, n, rs.as<float>(), cs.as<float>(), s);
  const std::vector<uint16_t> prod = bench::download<uint16_t>(yp, mn, s);
  int64_t vs_product = 0, vs_scaled = 0;
  double worst = 0, largest = 0;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t c = 0; c < n; ++c) {
      const size_t i = size_t(t * n + c);
      const float want = rs_h[size_t(t)] * cs_h[size_t(c)] * sum[i];
      const __nv_bfloat16 wb16 = __float2bfloat16_rn(want);
      uint16_t wb;
      std::memcpy(&wb, &wb16, 2);
      vs_scaled += wb != got[i];
      vs_product += prod[i] != got[i];
      __nv_bfloat16 g16;
      std::memcpy(&g16, &got[i], 2);
      worst = std::max(worst, double(std::fabs(__bfloat162float(g16) - want)));
      largest = std::max(largest, double(std::fabs(want)));
    }
  std::printf("m %6lld  outer vectors: %.3f ms | scalar %.3f ms + scale pass %.3f ms (%.2fx their sum) | bf16 outputs != the product's %lld, "
              "!= bf16(rs cs sum) %lld of %lld, worst |diff| %.2e of the largest output\n",
              (long long)m, t_outer, t_scalar, t_scale, t_outer / (t_scalar + t_scale), (long long)vs_product, (long long)vs_scaled,
              (long long)(m * n), largest > 0 ? worst / largest : 0.0);
  r.add("available", json::Value::boolean(true));
  r.add("ms", json::Value::number(t_outer));
  r.add("mismatches_vs_product", json::Value::integer(vs_product));
  r.add("mismatches_vs_bf16_rs_cs_sum", json::Value::integer(vs_scaled));
  r.add("worst_rel_to_largest", json::Value::number(largest > 0 ? worst / largest : 0.0));
  // beta 1 into an fp32 residual
  json::Value a = json::Value::object();
  fill_normal_f32(res.as<float>(), m * n, 21, 0.0f, 1.0f, s);
  const std::vector<float> res_h = bench::download<float>(res, mn, s);
  auto run_acc = [&] {
    check(cudaMemcpyAsync(y32.get(), res.get(), mn * 4, cudaMemcpyDeviceToDevice, s), "outer vectors");
    outer_acc.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y32.get(), OutType::F32, n, "outer vectors, accumulating");
  };
  try {
    run_acc();
    const double t_acc = bench::median_ms(s, run_acc);  // (the residual's copy included)
    run_acc();
    const std::vector<float> acc = bench::download<float>(y32, mn, s);
    double worst_acc = 0, largest_acc = 0;
    for (size_t i = 0; i < mn; ++i) {
      const size_t t = i / size_t(n), c = i % size_t(n);
      const float want = res_h[i] + rs_h[t] * cs_h[c] * sum[i];
      worst_acc = std::max(worst_acc, double(std::fabs(acc[i] - want)));
      largest_acc = std::max(largest_acc, double(std::fabs(want)));
    }
    std::printf("m %6lld  outer vectors adding into fp32: %.3f ms (with the residual's copy) | worst |y - (r + rs cs sum)| %.2e of the largest\n",
                (long long)m, t_acc, largest_acc > 0 ? worst_acc / largest_acc : 0.0);
    a.add("available", json::Value::boolean(true));
    a.add("ms_with_copy", json::Value::number(t_acc));
    a.add("worst_rel_to_largest", json::Value::number(largest_acc > 0 ? worst_acc / largest_acc : 0.0));
  } catch (const Error& e) {
    std::printf("m %6lld  outer vectors adding into fp32: not available (%s)\n", (long long)m, e.what());
    a.add("available", json::Value::boolean(false));
    a.add("why", json::Value::string(e.what()));
  }
  r.add("accumulating_fp32", std::move(a));
  r.add("fast_accum", fast_point());
  return r;
}

// x [rows, k] bf16: `count` columns spread over k multiplied by `factor` (on the host: a few rows)
void scale_columns_of_first_rows(bf16* x, int64_t rows, int64_t k, int64_t count, float factor, cudaStream_t s) {
  std::vector<bf16> h(size_t(rows * k));
  check(cudaMemcpyAsync(h.data(), x, h.size() * 2, cudaMemcpyDeviceToHost, s), "outliers");
  check(cudaStreamSynchronize(s), "outliers");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < count; ++j) {
      bf16& v = h[size_t(r * k + j * (k / count))];
      v = __float2bfloat16(__bfloat162float(v) * factor);
    }
  check(cudaMemcpyAsync(x, h.data(), h.size() * 2, cudaMemcpyHostToDevice, s), "outliers");
  check(cudaStreamSynchronize(s), "outliers");
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    Gemm inv(s, true), any(s, false);
    GemmLab fast_lab;
    fast_lab.fp8_fast_accum = true;
    Gemm fast(s, true, size_t(64) << 20, fast_lab);
    std::vector<int64_t> ms = {318, 1024, 8192, 32768};
    if (opt.only_m > 0) ms = {opt.only_m};
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    for (Shape sh : {Shape{"mlp gate_up", 34816, 5120}, Shape{"mlp down", 5120, 17408}}) {
      const int64_t n = sh.n, k = sh.k, mmax = *std::max_element(ms.begin(), ms.end());
      DeviceBuffer w(size_t(n * k) * 2, "W"), w8(size_t(n * k), "W fp8"), ws(size_t(n) * 4, "W scales"), x(size_t(mmax * k) * 2, "x"),
          x8(size_t(mmax * k), "x fp8"), xs(size_t(mmax) * 4, "x scales"), y(size_t(mmax * n) * 2, "y");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), mmax * k, 12, 0.0f, 1.0f, s);
      fp8_quantize_rows(w.as<bf16>(), n, k, k, w8.as<uint8_t>(), k, ws.as<float>(), s);
      fp8_quantize_rows(x.as<bf16>(), mmax, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s);
      std::printf("\n%s: n %lld, k %lld\n", sh.name, (long long)n, (long long)k);
      json::Value rows = json::Value::array();
      for (int64_t m : ms) {
        const double flop = 2.0 * double(m) * double(n) * double(k);
        auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
        const double t_bf = median_ms(s, [&] { inv.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), OutType::BF16, n, false, "bench"); });
        const double t_f8 = median_ms(s, [&] { inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); });
        const double t_q = median_ms(s, [&] { fp8_quantize_rows(x.as<bf16>(), m, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s); });
        const double t_sc = median_ms(s, [&] { scale_rows_cols_bf16(y.as<bf16>(), m, n, n, xs.as<float>(), ws.as<float>(), s); });
        const double t_fa = median_ms(s, [&] { fast.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); });
        std::printf("m %6lld  bf16 inv %8.3f ms %6.0f TF/s | fp8 inv %8.3f ms %6.0f TF/s (%.2fx bf16) | fast accum %8.3f ms (%.2fx fp8 inv) | quant %.3f scale %.3f ms\n",
                    (long long)m, t_bf, tf(t_bf), t_f8, tf(t_f8), t_bf / t_f8, t_fa, t_f8 / t_fa, t_q, t_sc);
        // the engine's output (bf16) for these m rows, to compare each candidate's bits with
        inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench");
        std::vector<uint8_t> ref(size_t(m * n) * 2);
        check(cudaMemcpyAsync(ref.data(), y.get(), ref.size(), cudaMemcpyDeviceToHost, s), "bench");
        check(cudaStreamSynchronize(s), "bench");
        json::Value cands = bench::time_candidates(any, true, x8.get(), m, k, w8.get(), n, y.get(), OutType::BF16, ref, s);
        json::Value r = json::Value::object();
        r.add("m", json::Value::integer(m));
        r.add("bf16_invariant_ms", json::Value::number(t_bf));
        r.add("fp8_invariant_ms", json::Value::number(t_f8));
        r.add("fp8_fast_accum_ms", json::Value::number(t_fa));
        r.add("fp8_quantize_ms", json::Value::number(t_q));
        r.add("fp8_scale_ms", json::Value::number(t_sc));
        r.add("fp8_candidates", std::move(cands));
        if (m == 318 || m == 8192) {
          r.add("fp8_alpha_vector", alpha_vector_point(inv, x8, w8, ws, m, n, k, t_f8, t_sc, s));
          r.add("fp8_outer_vectors", outer_vector_point(inv, x8, w8, ws, xs, m, n, k, t_f8, t_sc, s));
        }
        rows.arr.push_back(std::move(r));
      }
      json::Value acc = json::Value::array();
      acc.arr.push_back(measure_accuracy(inv, fast, x8, w8, n, k, "normal", s));
      // 16 outlier channels at 40x: the row's scale follows them, the other codes shrink
      scale_columns_of_first_rows(x.as<bf16>(), 256, k, 16, 40.0f, s);
      fp8_quantize_rows(x.as<bf16>(), 256, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s);
      acc.arr.push_back(measure_accuracy(inv, fast, x8, w8, n, k, "outlier", s));
      json::Value rec = bench::shape_record(sh.name, n, k, std::move(rows));
      rec.add("accuracy", std::move(acc));
      shapes.arr.push_back(std::move(rec));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_fp8", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_fp8: %s\n", e.what());
    return 1;
  }
  return 0;
}

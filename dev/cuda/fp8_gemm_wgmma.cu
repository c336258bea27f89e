// The lab of the FP8 GEMM of our own (src/cuda/ops/fp8_gemm_wgmma.cuh: its forms, how they work).
// The bench, per shape of the 27B model at m = 318 and 8,192: ms and TFLOP/s beside cuBLASLt's
// promoted and fast-accumulation GEMMs (the engine's batch-invariant Gemm, unscaled output: its
// scale pass is timed apart); the error of each against the exact sum of the same e4m3 products
// (fp64 on the host; 64 rows x 512 columns, as fp8_gemm.cpp's accuracy lines); and row bits alone
// vs in the batch; at gate|up, step 4 (the SwiGLU in the epilogue) against the product's gate|up +
// swiglu_fp8_quant. Usage: clefrt_bench_fp8_wgmma [--commit ID] [--json FILE] [--m M] [--shape PART-OF-NAME] [--sustained]
// (--sustained: cuBLASLt and two of our forms at the power cap, nothing else); CLEFRT_LAB_PROFILE=cublaslt|INDEX:
// one launch of cuBLASLt or kVariants[INDEX] per shape and m between cudaProfilerStart / Stop, nothing else (ncu)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/tma.cuh"
#include "cuda/ops/wgmma.cuh"
#include "cuda/ops/fp8_gemm_wgmma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"

using namespace clefrt;
using namespace clefrt::cuda;
using namespace clefrt::cuda::fp8own;

namespace {

struct Variant {
  const char* name;
  void (*run)(const uint8_t*, int64_t, int64_t, const uint8_t*, int64_t, const float*, const float*, void*, int64_t, Out, cudaStream_t);
  int promo;  // 128-wide k steps a promotion: forms of one interval give the same bits
};
const Variant kVariants[] = {
    {"ours, 6 stages", fp8_gemm_wgmma<6>, 1},
    {"ours, warp-specialized, 256 x 128, 4 stages, groups of 8 M blocks", fp8_gemm_ws<4, 2, 8>, 1},
    {"ours, warp-specialized, 128 x 128, 6 stages, groups of 16 M blocks", fp8_gemm_ws<6, 1, 16>, 1},
    {"ours, ws 256 x 128, 4 stages, groups of 8, clusters of 2 (x multicast)", fp8_gemm_ws<4, 2, 8, 2>, 1},
    {"ours, ws 128 x 192, 4 stages, groups of 16", fp8_gemm_ws<4, 1, 16, 1, 192>, 1},
    {"ours, ws 128 x 192, 4 stages, groups of 16, clusters of 2 (x multicast)", fp8_gemm_ws<4, 1, 16, 2, 192>, 1},
    {"ours, 6 stages, promotion every 512 k", fp8_gemm_wgmma<6, 4>, 4},
};
constexpr int kWs256 = 1, kWs128x192 = 4;  // the forms --sustained runs beside cuBLASLt



// Step 4 (the SwiGLU in gate|up's epilogue, option B of the design note: act in bf16, then
// fp8_quantize_rows) at m rows: each form's act against the same form unfused (scaled bf16
// gate|up, then swiglu: the same bits by construction), and the time of gate|up + SwiGLU + act's FP8
// quantization against the product's (cuBLASLt's gate|up unscaled, then swiglu_fp8_quant).
json::Value swiglu_epilogue(Gemm& inv, const DeviceBuffer& x8, const DeviceBuffer& xs, const DeviceBuffer& w8, const DeviceBuffer& ws, int64_t m,
                            int64_t n, int64_t k, cudaStream_t s) {
  const int64_t ffn = n / 2;
  // w's rows (and their scales) interleaved: 8 gate rows, the 8 up rows of the same columns, ...
  const std::vector<uint8_t> hw = bench::download<uint8_t>(w8, size_t(n * k), s);
  const std::vector<float> hs = bench::download<float>(ws, size_t(n), s);
  std::vector<uint8_t> iw(hw.size());
  std::vector<float> is(hs.size());
  for (int64_t ri = 0; ri < n; ++ri) {
    const int64_t q = ri / 16, within = ri % 16, src = within < 8 ? 8 * q + within : ffn + 8 * q + within - 8;
    std::copy(hw.begin() + src * k, hw.begin() + (src + 1) * k, iw.begin() + ri * k);
    is[size_t(ri)] = hs[size_t(src)];
  }
  const DeviceBuffer w8i = upload(iw, "W fp8 interleaved"), wsi = upload(is, "W scales interleaved");
  DeviceBuffer gu(size_t(m * n) * 2, "gate|up"), act_ref(size_t(m * ffn) * 2, "act (unfused)"), act(size_t(m * ffn) * 2, "act"),
      q(size_t(m * ffn), "act fp8"), qs(size_t(m) * 4, "act scales");
  const double t_prod = bench::median_ms(s, [&] {
    inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, gu.get(), OutType::BF16, n, "bench");
    swiglu_fp8_quant(gu.as<bf16>(), m, ffn, xs.as<float>(), ws.as<float>(), ws.as<float>() + ffn, ffn, q.as<uint8_t>(), ffn, qs.as<float>(), s);
  });
  std::printf("  gate|up + SwiGLU + act's quantization at m %lld: the product's (cuBLASLt, swiglu_fp8_quant) %.3f ms\n", (long long)m, t_prod);
  json::Value r = json::Value::object();
  r.add("m", json::Value::integer(m));
  r.add("product_ms", json::Value::number(t_prod));
  json::Value vs = json::Value::array();
  for (const Variant& v : kVariants) {
    // the same form unfused: scaled bf16 gate|up from the rows in their order, then swiglu
    v.run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, xs.as<float>(), ws.as<float>(), gu.get(), n, Out::BF16, s);
    swiglu(gu.as<bf16>(), m, ffn, act_ref.as<bf16>(), s);
    const std::vector<uint16_t> want = bench::download<uint16_t>(act_ref, size_t(m * ffn), s);
    cuda::check(cudaMemset(act.get(), 0xff, act.bytes()), "poison");
    v.run(x8.as<uint8_t>(), m, k, w8i.as<uint8_t>(), n, xs.as<float>(), wsi.as<float>(), act.get(), ffn, Out::SwiGLU, s);
    const bool same = bench::download<uint16_t>(act, size_t(m * ffn), s) == want;
    const double t = bench::median_ms(s, [&] {
      v.run(x8.as<uint8_t>(), m, k, w8i.as<uint8_t>(), n, xs.as<float>(), wsi.as<float>(), act.get(), ffn, Out::SwiGLU, s);
      fp8_quantize_rows(act.as<bf16>(), m, ffn, ffn, q.as<uint8_t>(), ffn, qs.as<float>(), s);
    });
    std::printf("    %-66s %8.3f ms (%.2fx the product's)  act vs unfused: %s\n", v.name, t, t_prod / t, same ? "same bits" : "BITS DIFFER");
    json::Value e = json::Value::object();
    e.add("variant", json::Value::string(v.name));
    e.add("ms", json::Value::number(t));
    e.add("act_bits_as_unfused", json::Value::boolean(same));
    vs.arr.push_back(std::move(e));
  }
  r.add("ours", std::move(vs));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, true, opt)) return 2;
  try {
    if (!sm90a_kernels_run_here()) throw Error(Status::Internal, "internal_error", "clefrt_bench_fp8_wgmma: needs an sm_90a build on a compute capability 9.0 GPU");
    const HardwareLimits hw = bench::measure_and_print_hardware();
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    Gemm inv(s, true);
    GemmLab fast_lab;
    fast_lab.fp8_fast_accum = true;
    Gemm fast(s, true, size_t(64) << 20, fast_lab);
    std::vector<int64_t> ms = {318, 8192};
    if (opt.only_m > 0) ms = {opt.only_m};
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    json::Value shapes = json::Value::array();
    for (Shape sh : {Shape{"mlp gate_up", 34816, 5120}, Shape{"mlp down", 5120, 17408}, Shape{"gdn in_proj", 16480, 5120},
                     Shape{"gdn out_proj", 5120, 6144}, Shape{"k not a multiple of 128 (a zero-filled last step)", 4096, 5136}}) {
      if (!opt.only_shape.empty() && std::string(sh.name).find(opt.only_shape) == std::string::npos) continue;  // --shape: a part of the name
      // at least the accuracy lines' 64 rows (--m below 64 would read and write past x8 and y)
      const int64_t n = sh.n, k = sh.k, mmax = std::max<int64_t>(64, *std::max_element(ms.begin(), ms.end()));
      DeviceBuffer w(size_t(n * k) * 2, "W"), w8(size_t(n * k), "W fp8"), ws(size_t(n) * 4, "W scales"), x(size_t(mmax * k) * 2, "x"),
          x8(size_t(mmax * k), "x fp8"), xs(size_t(mmax) * 4, "x scales"), y(size_t(mmax * n) * 4, "y"), y2(size_t(mmax * n) * 4, "y2");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), mmax * k, 12, 0.0f, 1.0f, s);
      fp8_quantize_rows(w.as<bf16>(), n, k, k, w8.as<uint8_t>(), k, ws.as<float>(), s);
      fp8_quantize_rows(x.as<bf16>(), mmax, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s);
      std::printf("\n%s: n %lld, k %lld\n", sh.name, (long long)n, (long long)k);
      json::Value rec = json::Value::object();
      rec.add("name", json::Value::string(sh.name));
      rec.add("n", json::Value::integer(n));
      rec.add("k", json::Value::integer(k));

      if (const char* prof = std::getenv("CLEFRT_LAB_PROFILE")) {
        // one launch between cudaProfilerStart / Stop (ncu --profile-from-start off) at each m, after
        // three (cuBLASLt's tune included): "cublaslt" or a variant's index in kVariants
        const std::string who = prof;
        for (int64_t m : ms) {
          auto once = [&] {
            if (who == "cublaslt") inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench");
            else kVariants[std::atoi(prof)].run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, xs.as<float>(), ws.as<float>(), y.get(), n, Out::BF16, s);
          };
          for (int i = 0; i < 3; ++i) once();
          check(cudaStreamSynchronize(s), "profile");
          check(cudaProfilerStart(), "profile");
          once();
          check(cudaStreamSynchronize(s), "profile");
          check(cudaProfilerStop(), "profile");
          std::printf("profiled %s at m %lld\n", prof, (long long)m);
        }
        continue;
      }
      if (opt.sustained) {
        // at the power cap, as in the model: cuBLASLt's promoted GEMM and our 256 x 128 and 128 x
        // 192 forms (unscaled bf16 out, as Gemm::run_fp8 runs them) back to back for 1 s each after
        // 0.3 s warm, alternated twice: ms, J and the mean SM clock a call, and clocks a call (ms x
        // MHz: the lab's 1,950 MHz bursts gave ours fewer, the model's capped forward more)
        json::Value sus = json::Value::array();
        for (int64_t m : ms) {
          const double flop = 2.0 * double(m) * double(n) * double(k);
          std::printf("m %6lld sustained (0.3 s warm + 1 s each, alternated twice):\n", (long long)m);
          struct Who {
            const char* name;
            std::function<void()> run;
          };
          const Who who[] = {
              {"cuBLASLt, promoted", [&] { inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); }},
              {kVariants[kWs256].name, [&] { kVariants[kWs256].run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, nullptr, nullptr, y.get(), n, Out::BF16, s); }},
              {kVariants[kWs128x192].name, [&] { kVariants[kWs128x192].run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, nullptr, nullptr, y.get(), n, Out::BF16, s); }}};
          for (int round = 0; round < 2; ++round)
            for (const Who& w : who) {
              const bench::Sustained v = bench::sustained(s, w.run, 0.3, 1.0);
              std::printf("  %-66s %8.3f ms %6.0f TF/s %8.4f J %6.0f MHz %9.0f kclk\n", w.name, v.ms, flop / (v.ms * 1e-3) / 1e12, v.joules, v.sm_mhz,
                          v.ms * v.sm_mhz);
              json::Value e = json::Value::object();
              e.add("m", json::Value::integer(m));
              e.add("who", json::Value::string(w.name));
              e.add("ms", json::Value::number(v.ms));
              e.add("joules", json::Value::number(v.joules));
              e.add("sm_mhz", json::Value::number(v.sm_mhz));
              sus.arr.push_back(std::move(e));
            }
        }
        rec.add("sustained", std::move(sus));
        shapes.arr.push_back(std::move(rec));
        continue;
      }
      // the exact sums of rows [0, 64) x 512 columns (fp64 on the host)
      const bench::ExactE4m3Sums exact = bench::exact_e4m3_sums(x8, w8, n, k, 64, 512, s);
      const int64_t arows = exact.rows;
      auto acc_line = [&](const char* who, const DeviceBuffer& out, json::Value& into) {
        const bench::Accuracy a = bench::accuracy_of(exact, out, n, s);
        std::printf("  %-66s error rms %.2e worst %.2e bias %+.2e\n", who, a.rms_rel, a.worst_rel, a.bias);
        json::Value v = bench::accuracy_json(a);
        v.add("who", json::Value::string(who));
        into.arr.push_back(std::move(v));
      };
      json::Value acc = json::Value::array();
      inv.run_fp8(x8.as<uint8_t>(), arows, k, w8.as<uint8_t>(), n, y.get(), OutType::F32, n, "bench");
      acc_line("cuBLASLt, promoted", y, acc);
      fast.run_fp8(x8.as<uint8_t>(), arows, k, w8.as<uint8_t>(), n, y.get(), OutType::F32, n, "bench");
      acc_line("cuBLASLt, fast accumulation", y, acc);
      for (const Variant& v : kVariants) {
        v.run(x8.as<uint8_t>(), arows, k, w8.as<uint8_t>(), n, nullptr, nullptr, y.get(), n, Out::F32, s);
        acc_line(v.name, y, acc);
      }
      rec.add("accuracy", std::move(acc));

      json::Value rows = json::Value::array();
      for (int64_t m : ms) {
        const double flop = 2.0 * double(m) * double(n) * double(k);
        auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
        json::Value pt = json::Value::object();
        pt.add("m", json::Value::integer(m));
        const double t_p = bench::median_ms(s, [&] { inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); });
        const double t_f = bench::median_ms(s, [&] { fast.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); });
        const double t_sc = bench::median_ms(s, [&] { scale_rows_cols_bf16(y.as<bf16>(), m, n, n, xs.as<float>(), ws.as<float>(), s); });
        std::printf("m %6lld  cuBLASLt promoted %8.3f ms %6.0f TF/s | fast accumulation %8.3f ms %6.0f TF/s | its scale pass %.3f ms\n",
                    (long long)m, t_p, tf(t_p), t_f, tf(t_f), t_sc);
        pt.add("cublaslt_promoted_ms", json::Value::number(t_p));
        pt.add("cublaslt_fast_ms", json::Value::number(t_f));
        pt.add("scale_pass_ms", json::Value::number(t_sc));
        json::Value vs = json::Value::array();
        std::vector<uint16_t> first;  // the first variant's whole output: every variant of its interval must give its bits
        for (const Variant& v : kVariants) {
          const double t = bench::median_ms(s, [&] { v.run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, xs.as<float>(), ws.as<float>(), y.get(), n, Out::BF16, s); });
          // batch invariance, scaled bf16 out, bit for bit: rows [0, 64) of this m against the same
          // rows run alone as m = 64 and row 0 as m = 1; and, where m has them, rows [64, 128) (the
          // second warpgroup's in the batch) and row m - 1 (the last tile's) run alone from an
          // offset x, where they sit in the first warpgroup of the first tile
          v.run(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, xs.as<float>(), ws.as<float>(), y.get(), n, Out::BF16, s);
          const std::vector<uint16_t> in_batch = bench::download<uint16_t>(y, size_t(m * n), s);
          auto alone = [&](int64_t r0, int64_t rows) {
            v.run(x8.as<uint8_t>() + r0 * k, rows, k, w8.as<uint8_t>(), n, xs.as<float>() + r0, ws.as<float>(), y2.get(), n, Out::BF16, s);
            const std::vector<uint16_t> got = bench::download<uint16_t>(y2, size_t(rows * n), s);
            return std::equal(got.begin(), got.end(), in_batch.begin() + r0 * n);
          };
          bool same = alone(0, std::min<int64_t>(m, 64)) && alone(0, 1) && alone(m - 1, 1);
          if (m >= 128) same = same && alone(64, 64);
          if (first.empty()) first = in_batch;
          const bool as_first = in_batch == first;
          std::printf("         %-66s %8.3f ms %6.0f TF/s (%.2fx promoted + scale pass)  rows alone vs in the batch: %s; vs the first variant: %s\n",
                      v.name, t, tf(t), (t_p + t_sc) / t, same ? "same bits" : "BITS DIFFER",
                      as_first ? "same bits" : v.promo == kVariants[0].promo ? "BITS DIFFER" : "other bits (another promotion interval)");
          json::Value e = json::Value::object();
          e.add("variant", json::Value::string(v.name));
          e.add("ms", json::Value::number(t));
          e.add("tflops", json::Value::number(tf(t)));
          e.add("batch_invariant", json::Value::boolean(same));
          e.add("bits_as_first_variant", json::Value::boolean(as_first));
          vs.arr.push_back(std::move(e));
        }
        pt.add("ours", std::move(vs));
        rows.arr.push_back(std::move(pt));
      }
      rec.add("points", std::move(rows));
      if (n == 34816) {  // gate|up: step 4, the SwiGLU in the epilogue
        std::printf("step 4, the SwiGLU in gate|up's epilogue (act in bf16, then fp8_quantize_rows):\n");
        json::Value sw = json::Value::array();
        for (int64_t m : ms) sw.arr.push_back(swiglu_epilogue(inv, x8, xs, w8, ws, m, n, k, s));
        rec.add("swiglu_epilogue", std::move(sw));
      }
      shapes.arr.push_back(std::move(rec));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_fp8_wgmma", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_fp8_wgmma: %s\n", e.what());
    return 1;
  }
  return 0;
}

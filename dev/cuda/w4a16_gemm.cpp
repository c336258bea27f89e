// The W4A16 GEMM against bf16 at the GEMM level (issue 6: "beat the bf16 GEMM at small M,
// >= 70% of its rate at M >= 2,048"), at the 27B model's MLP shapes, for token counts from 1 to
// 8,192. Per shape and m (CUDA events, median of 20 after 3 warm-ups):
//   bf16 inv     cuBLASLt bf16 GEMM, batch-invariant algorithm (the engine's default)
//   bf16 heur    cuBLASLt bf16 GEMM, the heuristic's algorithm for this m
//   staged       the whole NVFP4 weight dequantized to bf16, then the invariant GEMM, serially
//                (the engine overlaps the two in chunks: an upper bound of its cost)
//   mma.sync     nvfp4_gemm's mma.sync kernel (kernels_w4a16.cu)
//   wgmma        nvfp4_gemm's wgmma kernel (kernels_w4a16_wgmma.cu; sm_90a builds on Hopper)
// Random weights, quantized on the GPU. Usage: clefrt_bench_w4a16 [--commit ID] [--json FILE]
// [--shape gate_up|down] [--m M] (one shape / one m: for profilers)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
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

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, true, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    Gemm inv(s, true), heur(s, false);
    std::vector<int64_t> ms = {1, 16, 64, 128, 318, 1024, 2048, 8192};
    if (opt.only_m > 0) ms = {opt.only_m};
    const bool wgmma = nvfp4_gemm_wgmma_available();
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    for (Shape sh : {Shape{"mlp gate_up", 34816, 5120}, Shape{"mlp down", 5120, 17408}}) {
      if (!opt.only_shape.empty() && std::string(sh.name) != "mlp " + opt.only_shape) continue;
      const int64_t n = sh.n, k = sh.k, mmax = ms.back();
      DeviceBuffer w(size_t(n * k) * 2, "W"), wd(size_t(n * k) * 2, "W dequantized"), packed(size_t(n * k / 2), "W packed"),
          scales(size_t(n * k / 16), "W scales"), gsr(size_t(n) * 4, "gs"), x(size_t(mmax * k) * 2, "x"), y(size_t(mmax * n) * 2, "y");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), mmax * k, 12, 0.0f, 1.0f, s);
      const float gs = bench::nvfp4_tensor_gs(w.as<bf16>(), n * k, s);
      const std::vector<float> gsv(size_t(n), gs);
      check(cudaMemcpy(gsr.get(), gsv.data(), gsv.size() * 4, cudaMemcpyHostToDevice), "gs");
      nvfp4_quantize(w.as<bf16>(), n, k, gs, packed.as<uint8_t>(), scales.as<uint8_t>(), s);
      std::printf("\n%s: n %lld, k %lld (packed weights %.1f MB, bf16 %.1f MB)\n", sh.name, (long long)n, (long long)k,
                  double(n * k) * 0.5625 / 1e6, double(n * k) * 2 / 1e6);
      std::printf("%6s %10s %10s %10s %10s %10s   %7s %7s %7s %7s %7s  wgmma/bf16inv  wgmma weight GB/s\n", "m", "bf16 inv",
                  "bf16 heur", "staged", "mma.sync", "wgmma", "TF/s", "TF/s", "TF/s", "TF/s", "TF/s");
      json::Value rows = json::Value::array();
      for (int64_t m : ms) {
        const double t_inv = median_ms(s, [&] { inv.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), OutType::BF16, n, false, "bench"); });
        const double t_heur =
            median_ms(s, [&] { heur.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), OutType::BF16, n, false, "bench"); });
        const double t_staged = median_ms(s, [&] {
          nvfp4_dequantize(packed.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), n, k, wd.as<bf16>(), s);
          inv.run(x.as<bf16>(), m, k, k, wd.as<bf16>(), n, y.get(), OutType::BF16, n, false, "bench");
        });
        const double t_fused = median_ms(s, [&] {
          nvfp4_gemm(x.as<bf16>(), m, k, k, packed.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), n, y.get(), false, n, false, s,
                     W4A16Gemm::MmaSync);
        });
        const double t_wg = !wgmma ? 0.0 : median_ms(s, [&] {
          nvfp4_gemm(x.as<bf16>(), m, k, k, packed.as<uint8_t>(), scales.as<uint8_t>(), gsr.as<float>(), n, y.get(), false, n, false, s,
                     W4A16Gemm::Wgmma);
        });
        const double flop = 2.0 * double(m) * double(n) * double(k);
        auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
        const double t_best = wgmma ? t_wg : t_fused;
        const double wbw = double(n * k) * 0.5625 / (t_best * 1e-3) / 1e9;
        std::printf("%6lld %10.3f %10.3f %10.3f %10.3f %10.3f   %7.1f %7.1f %7.1f %7.1f %7.1f  %12.2fx %12.0f\n", (long long)m, t_inv,
                    t_heur, t_staged, t_fused, t_wg, tf(t_inv), tf(t_heur), tf(t_staged), tf(t_fused), wgmma ? tf(t_wg) : 0.0,
                    t_inv / t_best, wbw);
        json::Value r = json::Value::object();
        r.add("m", json::Value::integer(m));
        r.add("bf16_invariant_ms", json::Value::number(t_inv));
        r.add("bf16_heuristic_ms", json::Value::number(t_heur));
        r.add("staged_serial_ms", json::Value::number(t_staged));
        r.add("mma_sync_ms", json::Value::number(t_fused));
        if (wgmma) r.add("wgmma_ms", json::Value::number(t_wg));
        r.add("best_fused_weight_gbps", json::Value::number(wbw));
        rows.arr.push_back(std::move(r));
      }
      shapes.arr.push_back(bench::shape_record(sh.name, n, k, std::move(rows)));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_w4a16: %s\n", e.what());
    return 1;
  }
  return 0;
}

// The bf16 GEMMs at the sizes where the batch-invariant algorithm is slow (issue 20's short
// requests, issue 19's vision tower), and two ways to keep answers batch-invariant faster:
//   engine inv     cuBLASLt bf16 with the engine's batch-invariant algorithm (one per (n, k),
//                  chosen at m = 4,096, no split-K): the product today
//   candidates     every algorithm cuBLASLt's heuristic offers at this m, timed, with its
//                  configuration, "inv" on those without split-K / reduction, and how many
//                  outputs differ in any bit from the engine's: 0 means it could replace the
//                  engine's at this m without changing an answer (as the FP8 m buckets do)
//   blocks of B    m cut into row blocks of a fixed B (the last one padded to B), each run with
//                  the heuristic's first algorithm at m = B, split-K allowed: every row then
//                  goes through the same kernel whatever the batch, so answers stay
//                  batch-invariant if that kernel's result for a row does not depend on the
//                  row's place in its block ("place": the block's rows shifted by 8 give the
//                  same bits) nor on the run ("rerun": a second run gives the same bits)
// Shapes: the 27B backbone's Linears (qkv / gate_up write bf16, the others fp32, as forward.cpp
// runs them) and the 27B vision tower's (fp32 outputs). Random inputs; CUDA events, median of 20
// after 3 warm-ups. Usage: clefrt_bench_bf16 [--commit ID] [--json FILE] [--m M]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"
#include "model/synth.h"

using namespace clefrt;
using namespace clefrt::cuda;

using bench::median_ms;

namespace {

struct Shape {
  std::string name;
  int64_t n, k;
  OutType yt;
  bool tower;  // timed at the tower's m (3,072 patches: one 1024x768 image) too
};

std::vector<Shape> shapes_27b() {
  const model::ModelConfig c = model::synthetic_config("clef-27b");
  const model::TextConfig& t = c.text;
  const model::VisionConfig& v = c.vision;
  const int64_t key_dim = t.k_heads * t.k_head_dim, value_dim = t.v_heads * t.v_head_dim, m2 = v.spatial_merge * v.spatial_merge;
  return {
      {"gdn in_proj", 2 * key_dim + 2 * value_dim + 2 * t.v_heads, t.hidden, OutType::F32, false},
      {"gdn out_proj", t.hidden, value_dim, OutType::F32, false},
      {"attention qkv_proj", 2 * t.q_heads * t.head_dim + 2 * t.kv_heads * t.head_dim, t.hidden, OutType::BF16, false},
      {"attention o_proj", t.hidden, t.q_heads * t.head_dim, OutType::F32, false},
      {"mlp gate_up", 2 * t.ffn, t.hidden, OutType::BF16, false},
      {"mlp down", t.hidden, t.ffn, OutType::F32, false},
      {"vision qkv", 3 * v.hidden, v.hidden, OutType::F32, true},
      {"vision proj", v.hidden, v.hidden, OutType::F32, true},
      {"vision fc1", v.ffn, v.hidden, OutType::F32, true},
      {"vision fc2", v.hidden, v.ffn, OutType::F32, true},
      {"vision merger fc1", m2 * v.hidden, m2 * v.hidden, OutType::F32, true},
      {"vision merger fc2", v.out_hidden, m2 * v.hidden, OutType::F32, true},
  };
}

std::vector<uint8_t> down(const DeviceBuffer& b, size_t bytes, size_t at, cudaStream_t s) {
  std::vector<uint8_t> h(bytes);
  check(cudaMemcpyAsync(h.data(), static_cast<const uint8_t*>(b.get()) + at, bytes, cudaMemcpyDeviceToHost, s), "bench download");
  check(cudaStreamSynchronize(s), "bench download");
  return h;
}

using bench::differing;

}  // namespace

int main(int argc, char** argv) {
  return bench::gemm_lab_main(argc, argv, "clefrt_bench_bf16", [](const bench::Options& opt, const HardwareLimits& hw, cudaStream_t s, Gemm& inv,
                                                                        Gemm& any) {
    const std::vector<int64_t> blocks = {128, 256, 512, 1024, 2048};
    json::Value records = json::Value::array();
    for (const Shape& sh : shapes_27b()) {
      std::vector<int64_t> ms = {318, 1024, 8192};
      if (sh.tower) ms = {3072, 12288};
      if (opt.only_m > 0) ms = {opt.only_m};
      const int64_t n = sh.n, k = sh.k, es = sh.yt == OutType::F32 ? 4 : 2;
      int64_t rows_max = 0;
      for (int64_t m : ms) rows_max = std::max(rows_max, (m + 2048 - 1) / 2048 * 2048 + 8);
      DeviceBuffer w(size_t(n * k) * 2, "W"), x(size_t(rows_max * k) * 2, "x"), y(size_t(rows_max * n * es), "y"),
          y2(size_t(rows_max * n * es), "y2");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), rows_max * k, 12, 0.0f, 1.0f, s);
      std::printf("\n%s: n %lld, k %lld, %s out\n", sh.name.c_str(), (long long)n, (long long)k, es == 4 ? "fp32" : "bf16");
      json::Value points = json::Value::array();
      for (int64_t m : ms) {
        const double flop = 2.0 * double(m) * double(n) * double(k);
        auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
        const double t_inv = median_ms(s, [&] { inv.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), sh.yt, n, false, "bench"); });
        inv.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), sh.yt, n, false, "bench");
        const std::vector<uint8_t> ref = down(y, size_t(m * n * es), 0, s);
        std::printf("m %6lld  engine inv %8.3f ms %6.0f TF/s (%.0f%% of the measured peak)\n", (long long)m, t_inv, tf(t_inv),
                    100.0 * tf(t_inv) / hw.peak_bf16_tflops);
        json::Value cands = bench::time_candidates(any, false, x.get(), m, k, w.get(), n, y.get(), sh.yt, ref, s);
        json::Value blk = json::Value::array();
        for (int64_t B : blocks) {
          const std::vector<Gemm::Candidate> at_b = any.candidates(false, B, n, k, sh.yt, "bench");
          if (at_b.empty()) continue;
          const Gemm::Candidate& c = at_b[0];
          const int64_t nb = (m + B - 1) / B;
          auto run_blocks = [&](int64_t shift, DeviceBuffer& out) {
            for (int64_t b0 = 0; b0 < nb; ++b0)
              any.run_candidate(c, false, x.as<bf16>() + (b0 * B + shift) * k, B, k, w.get(), n,
                                static_cast<uint8_t*>(out.get()) + size_t((b0 * B + shift) * n * es), sh.yt, "bench");
          };
          double t = -1;
          try {
            t = median_ms(s, [&] { run_blocks(0, y); });
          } catch (const std::exception& e) {
            std::printf("    blocks of %5lld  %-60s failed: %s\n", (long long)B, c.config.c_str(), e.what());
            continue;
          }
          run_blocks(0, y);
          const std::vector<uint8_t> a = down(y, size_t(B * n * es), 0, s);
          run_blocks(0, y2);
          const size_t rerun = differing(down(y2, a.size(), 0, s), a, size_t(es));
          // the same rows 8 places further into their block: rows 8 .. B-1 of the first block
          run_blocks(8, y2);
          const size_t place = differing(down(y2, size_t((B - 8) * n * es), size_t(8 * n * es), s),
                                         std::vector<uint8_t>(a.begin() + 8 * n * es, a.end()), size_t(es));
          std::printf("    blocks of %5lld  %-60s %8.3f ms %6.0f TF/s (%.2fx engine inv)  place %zu, rerun %zu outputs differ\n",
                      (long long)B, c.config.c_str(), t, tf(t), t_inv / t, place, rerun);
          json::Value bv = json::Value::object();
          bv.add("block", json::Value::integer(B));
          bv.add("config", json::Value::string(c.config));
          bv.add("ms", json::Value::number(t));
          bv.add("outputs_differing_by_place", json::Value::integer(int64_t(place)));
          bv.add("outputs_differing_by_rerun", json::Value::integer(int64_t(rerun)));
          blk.arr.push_back(std::move(bv));
        }
        json::Value r = json::Value::object();
        r.add("m", json::Value::integer(m));
        r.add("engine_invariant_ms", json::Value::number(t_inv));
        r.add("candidates", std::move(cands));
        r.add("fixed_blocks", std::move(blk));
        points.arr.push_back(std::move(r));
      }
      records.arr.push_back(bench::shape_record(sh.name, n, k, std::move(points)));
    }
    return records;
  });
}

// cuBLASLt beyond its heuristic (issue 20's short-request GEMMs, issue 19's tower): for the GEMM
// shapes that dominate the blog request (m = 318) and the vision tower (m = 3,072), every
// configuration cuBLASLt's algorithms take (Gemm::search: tiles, stages, CTA swizzling, cluster
// shapes; one K split, so batch-invariant) timed beside the engine's algorithm and the
// heuristic's best, each with how many outputs differ in any bit from the engine's (0: it could
// replace the engine's at this m without moving an answer, as the m buckets' tuning does).
// Prints per shape: engine, heuristic best, search best, and the search's five fastest.
// Random inputs; CUDA events, median of 20 after 3 warm-ups.
// --sustained (the backbone's shapes, bf16 and FP8; m 8,192 unless --m; the search cut to 48
// configurations, the heuristic's own candidates among those run at load): in the model the card runs its GEMMs at
// its power cap, far below the clock of a short timing, so the fastest configuration of 20 short
// runs need not be the fastest there. The engine's and the search's six fastest same-bits
// configurations then run again for 0.5 s each after 0.3 s of the same load, alternated with the
// engine's (engine, A, engine, B, ...): ms a GEMM, joules a GEMM (the driver's energy counter,
// gpu_power()) and the mean SM clock of each stretch.
// Usage: clefrt_bench_gemm_search [--commit ID] [--json FILE] [--m M] [--sustained] [--shape SUBSTRING: those shapes alone, e.g. "bf16 mlp"]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"
#include "clefrt/clefrt.h"
#include "model/synth.h"

using namespace clefrt;
using namespace clefrt::cuda;

using bench::median_ms;

namespace {

constexpr size_t kMaxConfigs = 600;  // per shape: the search's configurations timed at most
constexpr size_t kMaxConfigsSustained = 48;  // the same under --sustained

struct Shape {
  std::string name;
  int64_t m, n, k;
  OutType yt;
  bool fp8;
};

std::vector<Shape> shapes_27b() {
  const model::ModelConfig c = model::synthetic_config("clef-27b");
  const model::TextConfig& t = c.text;
  const model::VisionConfig& v = c.vision;
  const int64_t key_dim = t.k_heads * t.k_head_dim, value_dim = t.v_heads * t.v_head_dim, blog = 318, tower = 3072;
  std::vector<Shape> out;
  for (bool fp8 : {false, true}) {
    const std::string q = fp8 ? "fp8 " : "bf16 ";
    out.push_back({q + "gdn in_proj", blog, 2 * key_dim + 2 * value_dim + 2 * t.v_heads, t.hidden, OutType::F32, fp8});
    out.push_back({q + "gdn out_proj", blog, t.hidden, value_dim, OutType::F32, fp8});
    out.push_back({q + "attention o_proj", blog, t.hidden, t.q_heads * t.head_dim, OutType::F32, fp8});
    out.push_back({q + "mlp gate_up", blog, 2 * t.ffn, t.hidden, OutType::BF16, fp8});
    out.push_back({q + "mlp down", blog, t.hidden, t.ffn, OutType::F32, fp8});
  }
  // the FP8 model's GDN in_proj keeps its a | b rows (the gates' 2 x 48) in bf16: a GEMM of its own
  out.push_back({"bf16 gdn in_proj a|b (the FP8 model's bf16 part)", blog, 2 * t.v_heads, t.hidden, OutType::F32, false});
  out.push_back({"bf16 vision qkv", tower, 3 * v.hidden, v.hidden, OutType::BF16, false});
  out.push_back({"bf16 vision proj", tower, v.hidden, v.hidden, OutType::F32, false});
  out.push_back({"bf16 vision fc1", tower, v.ffn, v.hidden, OutType::BF16, false});
  out.push_back({"bf16 vision fc2", tower, v.hidden, v.ffn, OutType::F32, false});
  return out;
}


}  // namespace

int main(int argc, char** argv) {
  return bench::gemm_lab_main(argc, argv, "clefrt_bench_gemm_search", [](const bench::Options& opt, const HardwareLimits&, cudaStream_t s,
                                                                         Gemm& inv, Gemm& any) {
    json::Value records = json::Value::array();
    for (Shape sh : shapes_27b()) try {
      if (!opt.only_shape.empty() && sh.name.find(opt.only_shape) == std::string::npos) continue;
      if (opt.sustained && sh.name.find("vision") != std::string::npos) continue;  // the backbone's shapes
      if (opt.sustained) sh.m = 8192;
      if (opt.only_m > 0) sh.m = opt.only_m;
      const int64_t m = sh.m, n = sh.n, k = sh.k, es = sh.yt == OutType::F32 ? 4 : 2;
      DeviceBuffer w(size_t(n * k) * 2, "W"), x(size_t(m * k) * 2, "x"), y(size_t(m * n * es), "y"), w8(size_t(n * k), "W fp8"),
          x8(size_t(m * k), "x fp8"), ws(size_t(n) * 4, "W scales"), xs(size_t(m) * 4, "x scales");
      fill_normal_bf16(w.as<bf16>(), n * k, 11, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), m * k, 12, 0.0f, 1.0f, s);
      if (sh.fp8) {
        fp8_quantize_rows(w.as<bf16>(), n, k, k, w8.as<uint8_t>(), k, ws.as<float>(), s);
        fp8_quantize_rows(x.as<bf16>(), m, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s);
      }
      const void* xa = sh.fp8 ? x8.get() : x.get();
      const void* wa = sh.fp8 ? w8.get() : w.get();
      auto engine = [&] {
        if (sh.fp8) inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), sh.yt, n, "bench");
        else inv.run(x.as<bf16>(), m, k, k, w.as<bf16>(), n, y.get(), sh.yt, n, false, "bench");
      };
      const double flop = 2.0 * double(m) * double(n) * double(k);
      auto tf = [&](double t) { return flop / (t * 1e-3) / 1e12; };
      const double t_eng = median_ms(s, engine);
      engine();
      std::vector<uint8_t> ref(size_t(m * n * es)), got(ref.size());
      check(cudaMemcpyAsync(ref.data(), y.get(), ref.size(), cudaMemcpyDeviceToHost, s), "download");
      check(cudaStreamSynchronize(s), "download");
      struct Timed {
        Gemm::Candidate c;
        double ms;
        size_t differ;
      };
      auto time_all = [&](const std::vector<Gemm::Candidate>& cands) {
        std::vector<Timed> out;
        for (const Gemm::Candidate& c : cands) {
          double t = -1;
          try {
            t = median_ms(s, [&] { any.run_candidate(c, sh.fp8, xa, m, k, wa, n, y.get(), sh.yt, "bench"); });
          } catch (const std::exception&) {
            continue;  // configurations cuBLASLt checks but will not launch
          }
          check(cudaMemcpyAsync(got.data(), y.get(), got.size(), cudaMemcpyDeviceToHost, s), "download");
          check(cudaStreamSynchronize(s), "download");
          out.push_back({c, t, bench::differing(got, ref, size_t(es))});
        }
        std::sort(out.begin(), out.end(), [](const Timed& a, const Timed& b) { return a.ms < b.ms; });
        return out;
      };
      const std::vector<Timed> heur = time_all(any.candidates(sh.fp8, m, n, k, sh.yt, "bench"));
      // sustained: fewer (a bf16 gate|up at m 32,768 is ~17 ms a run), the time goes to the load
      const std::vector<Gemm::Candidate> configs = any.search(sh.fp8, m, n, k, sh.yt, "bench", opt.sustained ? kMaxConfigsSustained : kMaxConfigs);
      const std::vector<Timed> found = time_all(configs);
      // the fastest of a list whose bits equal the engine's
      auto best_same = [](const std::vector<Timed>& v) -> const Timed* {
        for (const Timed& t : v)
          if (t.differ == 0) return &t;
        return nullptr;
      };
      const Timed *hb = best_same(heur), *sb = best_same(found);
      std::printf("\n%s: m %lld, n %lld, k %lld, %s out; %zu configurations checked, %zu ran\n", sh.name.c_str(), (long long)m, (long long)n,
                  (long long)k, es == 4 ? "fp32" : "bf16", configs.size(), found.size());
      std::printf("  engine            %8.3f ms %6.0f TF/s\n", t_eng, tf(t_eng));
      if (hb) std::printf("  heuristic, same bits  %8.3f ms %6.0f TF/s  %s\n", hb->ms, tf(hb->ms), hb->c.config.c_str());
      if (sb) std::printf("  search, same bits     %8.3f ms %6.0f TF/s  %s (%.2fx the engine)\n", sb->ms, tf(sb->ms), sb->c.config.c_str(), t_eng / sb->ms);
      for (size_t i = 0; i < std::min<size_t>(5, found.size()); ++i)
        std::printf("    %8.3f ms %6.0f TF/s  %-70s %zu outputs differ from the engine's\n", found[i].ms, tf(found[i].ms), found[i].c.config.c_str(),
                    found[i].differ);
      json::Value r = json::Value::object();
      r.add("name", json::Value::string(sh.name));
      r.add("m", json::Value::integer(m));
      r.add("n", json::Value::integer(n));
      r.add("k", json::Value::integer(k));
      r.add("engine_ms", json::Value::number(t_eng));
      r.add("configurations_checked", json::Value::integer(int64_t(configs.size())));
      r.add("configurations_ran", json::Value::integer(int64_t(found.size())));
      auto rec = [](const Timed* t) {
        json::Value v = json::Value::object();
        if (!t) return v;
        v.add("config", json::Value::string(t->c.config));
        v.add("ms", json::Value::number(t->ms));
        return v;
      };
      r.add("heuristic_best_same_bits", rec(hb));
      r.add("search_best_same_bits", rec(sb));
      json::Value top = json::Value::array();
      for (size_t i = 0; i < std::min<size_t>(10, found.size()); ++i) {
        json::Value v = rec(&found[i]);
        v.add("outputs_differing_from_engine", json::Value::integer(int64_t(found[i].differ)));
        top.arr.push_back(std::move(v));
      }
      r.add("search_fastest", std::move(top));
      if (opt.sustained) {
        // the engine's, then up to six distinct same-bits configurations: the heuristic's fastest
        // three (the search's list may miss them), then the search's fastest
        std::vector<const Timed*> picks;
        auto take = [&](const std::vector<Timed>& from, size_t upto) {
          for (const Timed& t : from) {
            if (picks.size() >= upto) break;
            if (t.differ != 0) continue;
            bool seen = false;
            for (const Timed* p : picks) seen = seen || p->c.config == t.c.config;
            if (!seen) picks.push_back(&t);
          }
        };
        take(heur, 3);
        take(found, 6);
        std::printf("  sustained (0.3 s warm + 0.5 s each, alternated with the engine's):\n");
        json::Value sus = json::Value::array();
        auto line = [&](const char* who, const std::string& config, const bench::Sustained& v) {
          std::printf("    %-8s %8.3f ms %6.0f TF/s %8.4f J %6.0f MHz  %s\n", who, v.ms, tf(v.ms), v.joules, v.sm_mhz, config.c_str());
          json::Value e = json::Value::object();
          e.add("who", json::Value::string(who));
          e.add("config", json::Value::string(config));
          e.add("ms", json::Value::number(v.ms));
          e.add("joules", json::Value::number(v.joules));
          e.add("sm_mhz", json::Value::number(v.sm_mhz));
          sus.arr.push_back(std::move(e));
        };
        for (const Timed* p : picks) {
          line("engine", "", bench::sustained(s, engine, 0.3, 0.5));
          line("config", p->c.config, bench::sustained(s, [&] { any.run_candidate(p->c, sh.fp8, xa, m, k, wa, n, y.get(), sh.yt, "bench"); }, 0.3, 0.5));
        }
        r.add("sustained", std::move(sus));
      }
      records.arr.push_back(std::move(r));
    } catch (const std::exception& e) {  // a shape cuBLASLt refuses: said, the others go on
      std::printf("\n%s: %s\n", sh.name.c_str(), e.what());
    }
    return records;
  }, true);
}

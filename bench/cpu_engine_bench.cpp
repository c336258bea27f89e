// CPU engine prefill throughput (issue 3): synthesizes the `small` config, measures this
// machine's sgemm peak first, then prefill tokens/s at 512 and 4,096 tokens, with the achieved
// matmul GFLOP/s as a fraction of that peak. Prints one JSON object.
//   clefrt_bench_cpu [--threads N] [--reps N]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "model/synth.h"
#include "schema/request.h"

using clock_type = std::chrono::steady_clock;

static double seconds(clock_type::time_point a) { return std::chrono::duration<double>(clock_type::now() - a).count(); }

static double sgemm_peak_gflops() {
  const int n = 2048;
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  for (auto* v : {&a, &b})
    for (auto& x : *v) x = d(rng);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);  // warm up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto t = clock_type::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / seconds(t) / 1e9);
  }
  return best;
}

int main(int argc, char** argv) {
  int reps = 3;
  for (int k = 1; k + 1 < argc; k += 2) {
    if (!std::strcmp(argv[k], "--threads")) omp_set_num_threads(std::atoi(argv[k + 1]));
    if (!std::strcmp(argv[k], "--reps")) reps = std::atoi(argv[k + 1]);
  }
  const double peak = sgemm_peak_gflops();
  std::string dir = (std::filesystem::temp_directory_path() / "clefrt-bench-small").string();
  if (!std::filesystem::exists(dir + "/joint_head.safetensors")) {
    clefrt::model::SynthOptions o;
    o.out_dir = dir;
    o.preset = "small";
    o.tokenizer = std::string(CLEFRT_SOURCE_DIR) + "/.deps/qwen3/tokenizer.json";
    o.progress = false;
    clefrt::model::synthesize(o);
  }
  auto engine = clefrt::EngineCore::load(dir);
  const auto& c = engine->config().text;
  // Matmul FLOPs per token of the backbone (2 x weights touched per token; no lm_head).
  double per_tok = 0;
  const double H = double(c.hidden), F = double(c.ffn);
  const double kd = double(c.k_heads * c.k_head_dim), vd = double(c.v_heads * c.v_head_dim);
  for (auto t : c.layer_types) {
    per_tok += 3 * H * F;
    if (t == clefrt::model::LayerType::LinearAttention) per_tok += H * (2 * kd + 2 * vd + 2 * double(c.v_heads)) + vd * H;
    else per_tok += H * double(c.q_heads * 2 * c.head_dim + 2 * c.kv_heads * c.head_dim) + double(c.q_heads * c.head_dim) * H;
  }
  per_tok *= 2;
  // Causal attention's own matmul work (Q K^T and P V over the causal triangle), counted the way
  // `clefrt bench` counts it on the GPU; reported separately so older runs stay comparable.
  double attn_layers = 0;
  for (auto t : c.layer_types) attn_layers += t == clefrt::model::LayerType::FullAttention;
  auto attention_flops = [&](double L) { return attn_layers * 4.0 * double(c.q_heads * c.head_dim) * L * (L + 1) / 2.0; };
  std::printf("{\"machine_cores\":%d,\"sgemm_peak_gflops\":%.1f,\"model\":\"small\",\"runs\":[", omp_get_max_threads(), peak);
  bool first = true;
  for (int target : {512, 4096}) {
    std::string state;
    clefrt::Encoded enc;
    std::string piece = "the service answered slowly and some orders failed ";
    while (true) {  // grow the state until the prompt reaches the target length
      std::string body = "{\"state\":\"" + state + "\",\"questions\":{\"q\":{\"type\":\"noul\",\"instructions\":\"Is it urgent?\"}}}";
      enc = engine->encoder().encode(clefrt::parse_request(body));
      if (int(enc.input_ids.size()) >= target) break;
      state += piece;
    }
    const double L = double(enc.input_ids.size());
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto t = clock_type::now();
      auto p = engine->probs({&enc});
      best = std::min(best, seconds(t));
    }
    const double gflops = per_tok * L / best / 1e9;
    const double with_attn = (per_tok * L + attention_flops(L)) / best / 1e9;
    std::printf("%s{\"tokens\":%d,\"seconds\":%.4f,\"tokens_per_s\":%.1f,\"matmul_gflops\":%.2f,\"fraction_of_sgemm_peak\":%.3f,"
                "\"with_attention_gflops\":%.2f,\"with_attention_fraction\":%.3f}",
                first ? "" : ",", int(L), best, L / best, gflops, gflops / peak, with_attn, with_attn / peak);
    std::fflush(stdout);
    first = false;
  }
  std::printf("]");
  // The reuse point (issue 18): an ~8,000-token state asked a second question set (~300 schema
  // tokens). Cold: the engine without a prefix cache; warm: the same request on an engine whose
  // cache holds the state from a first question set. Best of `reps` each (every warm rep hits).
  {
    clefrt::CoreOptions co;
    co.prefix_cache_bytes = size_t(4) << 30;
    auto cached = clefrt::EngineCore::load(dir, co);
    std::string state;
    for (int i = 0; state.size() < 8000 * 4; ++i) state += "order " + std::to_string(i) + " shipped late and the customer asked twice. ";
    auto encode = [&](const std::string& questions) {
      return engine->encoder().encode(clefrt::parse_request("{\"state\":\"" + state + "\",\"questions\":" + questions + "}"));
    };
    const clefrt::Encoded first = encode(R"({"q":{"type":"noul","instructions":"Is it urgent?"}})");
    const clefrt::Encoded second = encode(
        R"({"refund":{"type":"noul","instructions":"Does the customer ask for a refund, a credit or a replacement for the order?"},)"
        R"("team":{"type":"choice","instructions":"Which team should handle the ticket?","criteria":{"billing":"payments, invoices, refunds","logistics":"shipping, delivery, tracking","support":"everything else","sales":"new orders and quotes"}},)"
        R"("tone":{"type":"score","instructions":"How upset is the customer?","criteria":["calm","annoyed","upset","furious","threatening to leave"]},)"
        R"("lang":{"type":"choice","instructions":"Which language is the ticket in?","criteria":{"en":"English","de":"German","fr":"French","es":"Spanish"}}})");
    const clefrt::model::Batch b1 = clefrt::model::batch_of({&first}), b2 = clefrt::model::batch_of({&second});
    cached->probs(b1);
    double cold = 1e30, warm = 1e30;
    std::vector<size_t> hit;
    for (int r = 0; r < reps; ++r) {
      auto t = clock_type::now();
      engine->probs(b2);
      cold = std::min(cold, seconds(t));
      t = clock_type::now();
      cached->probs(b2, clefrt::model::GdnForm::Chunked, &hit);
      warm = std::min(warm, seconds(t));
    }
    const size_t state_tokens = size_t(second.state_span.end), total = second.input_ids.size();
    std::printf(",\"reuse\":{\"input_tokens\":%zu,\"state_end\":%zu,\"schema_tokens\":%zu,\"cached_tokens\":%zu,\"cold_seconds\":%.4f,"
                "\"warm_seconds\":%.4f,\"warm_over_cold\":%.4f,\"new_tokens_over_all\":%.4f}",
                total, state_tokens, total - state_tokens, hit.empty() ? size_t(0) : hit[0], cold, warm, warm / cold,
                double(total - (hit.empty() ? 0 : hit[0])) / double(total));
  }
  std::printf("}\n");
}

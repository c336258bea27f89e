// `clefrt bench`: the GPU benchmark on synthetic weights at the real shapes (issue 4's suite).
// Measures the card's own limits first, then latency and batched throughput, and writes a JSON
// record (bench/results/) that later runs are compared with.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <future>
#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "common/file.h"
#include "common/json.h"
#include "image/png_write.h"
#include "schema/images.h"

namespace clefrt::cli {

namespace {

using json::Value;

// The blog request padded to n tokens (the long latency points and the 512-token throughput requests).
Encoded padded(const Encoded& e, int64_t n, uint64_t seed) { return random_prefixed(e, n - int64_t(e.input_ids.size()), seed); }

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t i = size_t(pos);
  return i + 1 < v.size() ? v[i] + (pos - double(i)) * (v[i + 1] - v[i]) : v.back();
}

// Milliseconds since t0 on the steady clock.
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A timed point's energy and clock from the driver (gpu_power: NVML's energy counter) read before
// its reps and after them: joules a forward and a token and the mean draw over the reps' wall
// time; the SM clock and the power cap sampled every 5 ms by a thread of its own while the reps
// run (the host's waits between reps are not sampled). The driver's counter moves in steps: over
// the blog's five reps (~0.1 s) it gave 430 to 960 W on a 700 W card (session 37), so a point's
// reps go on, untimed, until the energy window is kEnergyWindowS long. Under sustained load a card may run at
// its power cap, where its clock, not a kernel, sets the time
// (bench/results/2026-12-06-h100-session36.md). The window's time a forward (ms/fwd) is the
// point's sustained latency, the reps back to back: above the p50 of the first reps where the card
// had not settled at its cap. It is what a server's single client sees
// (bench/results/2026-12-06-h100-session45.md).
constexpr double kEnergyWindowS = 1.0;
struct EnergyFigures {
  bool measured = false;
  double joules = 0, seconds = 0, sm_mhz = 0, capped_share = 0;
  int reps = 0;
};
class PointEnergy {
 public:
  PointEnergy() : e0_(gpu_power()), t0_(std::chrono::steady_clock::now()) {
    if (e0_.available)
      sampler_ = std::thread([this] {
        while (!stop_.load()) {
          const GpuPower g = gpu_power();
          if (g.available) {
            mhz_ += g.sm_clock_mhz;
            capped_ += g.power_capped ? 1 : 0;
            ++samples_;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      });
  }
  ~PointEnergy() { stop(); }
  PointEnergy(const PointEnergy&) = delete;
  PointEnergy& operator=(const PointEnergy&) = delete;
  // After the point's `reps` timed reps: `rep` again, untimed, until the window is kEnergyWindowS
  // long, then the figures over all of them
  template <class Rep>
  EnergyFigures end(int reps, Rep&& rep) {
    for (; ms_since(t0_) * 1e-3 < kEnergyWindowS; ++reps) rep();
    const double seconds = ms_since(t0_) * 1e-3;
    const GpuPower e1 = gpu_power();
    stop();
    EnergyFigures f;
    if (!e0_.available || !e1.available || reps <= 0 || seconds <= 0) return f;
    f.measured = true;
    f.joules = e1.energy_j - e0_.energy_j;
    f.seconds = seconds;
    f.reps = reps;
    if (samples_ > 0) f.sm_mhz = mhz_ / samples_, f.capped_share = double(capped_) / samples_;
    return f;
  }

 private:
  void stop() {
    stop_.store(true);
    if (sampler_.joinable()) sampler_.join();
  }
  GpuPower e0_;
  std::chrono::steady_clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::thread sampler_;
  double mhz_ = 0;  // the sampler's, read after its join
  int capped_ = 0, samples_ = 0;
};
// A point's row of the energy table (tokens: a forward's), and its JSON
json::Value energy_row(const std::string& name, double tokens, const EnergyFigures& f) {
  const double jf = f.joules / f.reps, ms = 1e3 * f.seconds / f.reps;
  json::Value v = json::Value::object();
  v.add("ms_per_forward", json::Value::number(ms));
  v.add("joules_per_forward", json::Value::number(jf));
  v.add("joules_per_token", json::Value::number(jf / tokens));
  v.add("mean_watts", json::Value::number(f.joules / f.seconds));
  v.add("sm_clock_mhz", json::Value::number(f.sm_mhz));
  v.add("power_capped_share", json::Value::number(f.capped_share));
  std::printf("%-12s %9.2f %12.3f %10.4f %8.0f %8.0f %8.0f%%\n", name.c_str(), ms, jf, jf / tokens, f.joules / f.seconds,
              f.sm_mhz, 100.0 * f.capped_share);
  return v;
}

// A batch's answers as JSON: per request, per question, the options' probabilities
json::Value answers_json(const std::vector<Probs>& all) {
  json::Value reqs = json::Value::array();
  for (const Probs& p : all) {
    json::Value qs = json::Value::array();
    for (const auto& q : p) {
      json::Value opts = json::Value::array();
      for (double v : q) opts.arr.push_back(json::Value::number(v));
      qs.arr.push_back(std::move(opts));
    }
    reqs.arr.push_back(std::move(qs));
  }
  json::Value v = json::Value::object();
  v.add("requests", json::Value::string("the blog request, then 63 of 512 tokens (padded with seeds 500..562), as one batch"));
  v.add("probs", std::move(reqs));
  return v;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The record on stdout, and into `path` when one is given.
void emit_json(const Value& out, const std::string& path) {
  const std::string text = json::write(out);
  if (!path.empty()) {
    std::ofstream f(path);
    if (!(f << text << "\n")) throw Error(Status::Internal, "io_error", "cannot write " + path);
  }
  std::printf("%s\n", text.c_str());
}

// The reuse point (issue 18): per size, states of `tokens` tokens (random tokens in front of the
// blog's system prompt and state), each new one asked the blog's questions first (cold: a cache
// miss that leaves its state at the last 64-token boundary before the schema) and then another
// question set (warm: continues the cached state; only the schema and questions are computed).
Value reuse_points(Engine& engine, const Encoded& blog, const Encoded& other, int64_t max_tokens, int reps) {
  Value out = Value::object();
  std::printf("%-10s %8s %8s %12s %12s %8s %14s\n", "reuse", "tokens", "cached", "cold p50 ms", "warm p50 ms", "ratio", "new tokens");
  std::vector<int64_t> sizes = {1024, 8000};
  if (max_tokens >= 32768) sizes.push_back(32768);
  for (const int64_t n : sizes) {
    const int64_t extra = n - int64_t(blog.input_ids.size());
    std::vector<double> cold, warm;
    size_t cached = 0, warm_tokens = 0;
    const int r_n = n >= 32768 ? std::max(2, reps / 4) : reps;
    for (int r = -1; r < r_n; ++r) {  // r = -1: a warm-up pair, not timed
      const uint64_t seed = 9000 + uint64_t(n) * 100 + uint64_t(r + 1);
      const Prepared a = engine.prepare_encoded(random_prefixed(blog, extra, seed)), b = engine.prepare_encoded(random_prefixed(other, extra, seed));
      std::vector<size_t> ca, cb;
      auto t0 = std::chrono::steady_clock::now();
      engine.probs({&a}, &ca);
      const double ms_a = ms_since(t0);
      t0 = std::chrono::steady_clock::now();
      engine.probs({&b}, &cb);
      const double ms_b = ms_since(t0);
      if (ca[0] != 0) throw Error(Status::Internal, "internal_error", "bench reuse: a new state was found in the cache");
      if (cb[0] == 0) throw Error(Status::Internal, "internal_error", "bench reuse: the second question set missed the cache");
      if (r < 0) continue;
      cold.push_back(ms_a);
      warm.push_back(ms_b);
      cached = cb[0];
      warm_tokens = b.input_tokens();
    }
    // where a warm request's time goes: one more pair, the warm one profiled per op
    Value ops = Value::object();
    {
      const uint64_t seed = 9000 + uint64_t(n) * 100 + 99;
      const Prepared a = engine.prepare_encoded(random_prefixed(blog, extra, seed)), b = engine.prepare_encoded(random_prefixed(other, extra, seed));
      engine.probs({&a});
      engine.set_profile(true);
      engine.clear_profile();
      engine.probs({&b});
      for (auto& [op, ms] : engine.profile()) ops.add(op, Value::number(ms));
      engine.set_profile(false);
    }
    const double c50 = percentile(cold, 0.5), w50 = percentile(warm, 0.5);
    std::printf("%-10s %8zu %8zu %12.2f %12.2f %7.1f%% %14zu\n", ("reuse_" + std::to_string(n)).c_str(), warm_tokens, cached, c50, w50,
                100.0 * w50 / c50, warm_tokens - cached);
    Value v = Value::object();
    v.add("tokens", Value::integer(int64_t(warm_tokens)));
    v.add("cached_tokens", Value::integer(int64_t(cached)));
    v.add("new_tokens", Value::integer(int64_t(warm_tokens - cached)));
    v.add("reps", Value::integer(r_n));
    v.add("cold_p50", Value::number(c50));
    v.add("warm_p50", Value::number(w50));
    v.add("warm_over_cold", Value::number(w50 / c50));
    v.add("warm_profile_ms", ops);
    out.add("reuse_" + std::to_string(n), v);
  }
  return out;
}

// The host tier's point (--reuse-host-gib with a GPU budget for one state, --reuse-cache-gib):
// per repetition a new 8,000-token state asked the blog's questions (cold), another new state
// (which evicts the first to the host tier), then the first state with another question set:
// its prefix comes back from pinned host memory by a copy. p50 of that against cold.
Value host_tier_point(Engine& engine, const Encoded& blog, const Encoded& other, int reps) {
  const int64_t n = 8000, extra = n - int64_t(blog.input_ids.size());
  std::vector<double> cold, back;
  size_t cached = 0;
  for (int r = -1; r < reps; ++r) {  // r = -1: a warm-up round, not timed
    const uint64_t seed = 7000 + uint64_t(r + 1) * 2;
    const Prepared a = engine.prepare_encoded(random_prefixed(blog, extra, seed)), b = engine.prepare_encoded(random_prefixed(blog, extra, seed + 1)),
                   a2 = engine.prepare_encoded(random_prefixed(other, extra, seed));
    auto t0 = std::chrono::steady_clock::now();
    engine.probs({&a});
    const double ms_a = ms_since(t0);
    engine.probs({&b});
    const uint64_t before = engine.prefix_cache().host_hits;
    std::vector<size_t> c2;
    t0 = std::chrono::steady_clock::now();
    engine.probs({&a2}, &c2);
    const double ms_back = ms_since(t0);
    if (engine.prefix_cache().host_hits != before + 1 || c2[0] == 0)
      throw Error(Status::Internal, "internal_error",
                  "bench host tier: the first state did not come back from the host tier (give --reuse-cache-gib room for one "
                  "8,000-token state only, so that the second evicts it)");
    if (r < 0) continue;
    cold.push_back(ms_a);
    back.push_back(ms_back);
    cached = c2[0];
  }
  const double c50 = percentile(cold, 0.5), b50 = percentile(back, 0.5);
  std::printf("%-10s %8lld %8zu %12.2f %12.2f %7.1f%%   (warm from the host tier)\n", "host_8000", (long long)n, cached, c50, b50,
              100.0 * b50 / c50);
  Value v = Value::object();
  v.add("cached_tokens", Value::integer(int64_t(cached)));
  v.add("reps", Value::integer(reps));
  v.add("cold_p50", Value::number(c50));
  v.add("host_warm_p50", Value::number(b50));
  v.add("host_warm_over_cold", Value::number(b50 / c50));
  return v;
}

// The interleave point (issue 18): a long request (--max-tokens less 100) submitted while blog
// requests run one after another (a closed loop: each arrives as the last is answered): their
// latency while it runs against idle, and its own time, per step size and layers a call
// (EngineOptions::step_tokens / step_layers; a fresh engine each).
Value interleave_points(const std::function<std::unique_ptr<Engine>(size_t, size_t)>& open, const std::string& request, int64_t max_tokens,
                        int reps) {
  Value out = Value::object();
  using C = std::chrono::steady_clock;
  std::printf("%-16s %8s %10s %12s %12s %8s %10s %12s\n", "interleave", "long", "idle p50", "during p50", "during p95", "ratio", "requests",
              "long ms");
  const size_t one = size_t(1) << 30;
  for (const auto& [step, layers] : std::vector<std::pair<size_t, size_t>>{{2048, 4}, {2048, 8}, {2048, one}, {512, one}, {one, one}}) {
    std::unique_ptr<Engine> engine = open(step, layers);
    const Prepared blog = engine->prepare(read_file(request));
    const Encoded long_enc = padded(blog.encoded(), max_tokens - 100, 77);
    const Prepared big = engine->prepare_encoded(long_enc);
    std::vector<double> idle, during;
    for (int w = 0; w < 2; ++w) engine->probs({&blog});
    for (int r = 0; r < reps; ++r) {
      const auto t0 = C::now();
      engine->probs({&blog});
      idle.push_back(ms_since(t0));
    }
    engine->probs({&big});  // warm-up of the long shapes
    std::promise<double> done;
    std::atomic<bool> finished{false};
    const auto t_long = C::now();
    engine->submit(big, C::time_point::max(), [&](const Prepared&, Outcome o) {
      finished = true;
      done.set_value(o.kind == Outcome::Kind::Answered ? ms_since(t_long) : -1.0);
    });
    while (!finished) {
      const auto t0 = C::now();
      engine->probs({&blog});
      if (!finished) during.push_back(ms_since(t0));
    }
    const double long_ms = done.get_future().get();
    if (long_ms < 0) throw Error(Status::Internal, "internal_error", "bench interleave: the long request failed");
    const double i50 = percentile(idle, 0.5), d50 = during.empty() ? 0 : percentile(during, 0.5), d95 = during.empty() ? 0 : percentile(during, 0.95);
    const std::string name = step >= one ? "one_step" : "step_" + std::to_string(step) + (layers < one ? "_layers_" + std::to_string(layers) : "");
    std::printf("%-16s %8zu %10.2f %12.2f %12.2f %7.2fx %10zu %12.1f\n", name.c_str(), big.input_tokens(), i50, d50, d95, d50 / i50,
                during.size(), long_ms);
    Value v = Value::object();
    v.add("step_tokens", Value::integer(int64_t(step)));
    v.add("step_layers", Value::integer(int64_t(layers)));
    v.add("long_tokens", Value::integer(int64_t(big.input_tokens())));
    v.add("idle_p50", Value::number(i50));
    v.add("during_p50", Value::number(d50));
    v.add("during_p95", Value::number(d95));
    v.add("during_over_idle", Value::number(d50 / i50));
    v.add("requests_during", Value::integer(int64_t(during.size())));
    v.add("long_ms", Value::number(long_ms));
    out.add(name, v);
  }
  return out;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Opts {
    std::string synthetic = "clef-27b", quant = "bf16", json_out, tokenizer = ".deps/qwen3/tokenizer.json", request = "examples/blog.json";
    std::string commit = "unknown", baseline, command;
    int reps = 20;
    int64_t max_tokens = 32768;
    bool profiler_range = false;
    bool no_batch_invariant = false, profile = false, offload = false, memory_only = false, w4a16_fused = false, reuse = false, interleave = false;
    double reuse_gib = 16, reuse_host_gib = 0, gpu_limit_gib = 0;
    bool no_vision = false, images_only = false;
    size_t cuda_graphs = kCudaGraphsAfter;
    std::string attention = "auto";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("bench",
                                   "GPU benchmark on random weights created in GPU memory at a preset's real shapes (no files).\n"
                                   "Measures the card's bf16 GEMM peak and copy bandwidth, then: latency (p50/p95) of the blog\n"
                                   "request and of 1,024-, 8,192- and 16,384-token requests; throughput of batches of 512-token\n"
                                   "requests at 1, 4, 16 and 64 in flight; achieved TFLOP/s against the measured peak; each\n"
                                   "point's energy from the driver's NVML (J a forward and a token, mean W, SM clock, the share\n"
                                   "of reps the power cap held down), or a line saying why not.");
  c->add_option("--synthetic", o->synthetic, "clef-27b | clef-flash | small | tiny")->check(CLI::IsMember({"clef-27b", "clef-flash", "small", "tiny"}));
  c->add_option("--quant", o->quant,
                "bf16 | fp8 | nvfp4 | nvfp4-w4a16: what the Linears run in (random weights quantized on the GPU;\n"
                "nvfp4 = W4A4 numerics with a made-up static activation scale)")
      ->check(CLI::IsMember({"bf16", "fp8", "nvfp4", "nvfp4-w4a16"}));
  c->add_flag("--offload-embeddings", o->offload,
              "lean memory: embed_tokens / lm_head in pinned host memory, the MLP in 1,024-token blocks, the GDN in "
              "16-chunk passes (same answers)");
  c->add_flag("--w4a16-fused", o->w4a16_fused, "NVFP4: the fused W4A16 GEMM instead of staging (as decide / serve take it)");
  c->add_option("--max-tokens", o->max_tokens,
                "tokens the activation memory is planned for, at most 65536 (decide / serve's --max-length; default 32768;\n"
                "at 65536 the 64k latency point runs too)")
      ->check(CLI::Range(int64_t(1), int64_t(kMaxContext)));
  c->add_flag("--memory-only", o->memory_only,
              "only measure GPU memory: plan --max-tokens for one request, run one request of that length, report");
  c->add_flag("--reuse", o->reuse,
              "only the prefix cache's reuse points: per size (1,024, 8,000 and, with --max-tokens >= 32768, 32,768\n"
              "tokens) new states asked the blog's questions (cold: a miss that caches the state) then another\n"
              "question set (warm: a hit); p50 of each and warm / cold. The other points run without a cache");
  c->add_flag("--interleave", o->interleave,
              "only the scheduling points: a long request (--max-tokens less 100) submitted while blog requests\n"
              "run one after another: their p50 while it runs against idle, and its time, per step size and\n"
              "layers a call (2,048 tokens 4 / 8 / all layers at a time, 512 tokens all, one step)");
  c->add_flag("--no-vision", o->no_vision, "a text-only engine: no vision tower in GPU memory nor in the plan (the image points are skipped)");
  c->add_flag("--images-only", o->images_only,
              "only the image points (the tower's GPU time, its ops, end-to-end latency beside the same tokens of text):\n"
              "to compare tower kernels (--attention) in a minute");
  c->add_option("--attention", o->attention,
                "auto | cudnn | clefrt: the attention kernels of the backbone and the tower, as decide / serve take them (see\n"
                "their --attention); the JSON's \"engine\" line names what ran")
      ->check(CLI::IsMember({"auto", "cudnn", "clefrt"}));
  c->add_option("--gpu-limit-gib", o->gpu_limit_gib,
                "run as on a card of this many GiB: the memory beyond it is allocated first and held (the figures\n"
                "reported leave it out); with --memory-only, whether the request fits a 16 GiB card (--gpu-limit-gib 16)");
  c->add_option("--reuse-cache-gib", o->reuse_gib,
                "--reuse: the prefix cache's budget in GPU memory (default 16; at most half of what the weights leave:\n"
                "8 on an 80 GB card at clef-27b bf16)");
  c->add_option("--reuse-host-gib", o->reuse_host_gib,
                "--reuse: a host tier of this many GiB too, and its point (an 8,000-token state evicted to it by another,\n"
                "then asked again: it comes back by a copy); give --reuse-cache-gib room for one such state (~0.6 GiB at 27B\n"
                "shapes) and --max-tokens 16384 (the 32k reuse point needs a larger budget)");
  c->add_option("--json", o->json_out, "write the results as JSON here");
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json for the example request (default: the pinned Qwen3 one)");
  c->add_option("--request", o->request, "the latency request (default examples/blog.json)");
  c->add_option("--reps", o->reps, "timed repetitions of the short points (default 20)")->check(CLI::Range(1, 1000000));
  c->add_option("--commit", o->commit, "commit id recorded in the JSON");
  c->add_option("--baseline", o->baseline, "JSON from tools/reference/bench_reference.py to embed and compare with");
  c->add_option("--command", o->command, "the command line recorded in the JSON (default: argv)");
  c->add_flag("--profiler-range", o->profiler_range,
              "for an external profiler started with collection off (ncu --profile-from-start off): only the blog point's first timed "
              "forward runs inside cudaProfilerStart / Stop, after its warm-ups (loading and the GEMMs' tuning stay out of the profile)");
  c->add_flag("--profile", o->profile, "also time every op (CUDA events) for the blog, 8,192-token, 16,384-token (when --max-tokens allows) and 64 x 512 runs");
  c->add_option("--cuda-graphs", o->cuda_graphs,
                "capture a batch shape seen N times (N >= 2) into a CUDA graph and replay it (as decide / serve take it; 0: off; default 2)")
      ->check(graph_sightings());
  c->add_flag("--no-batch-invariant", o->no_batch_invariant, "let cuBLASLt pick GEMM algorithms per batch size");
  return [o]() -> int {
    const QuantMode qm = parse_quant_mode(o->quant);
    if (qm == QuantMode::Auto) throw Error(Status::BadRequest, "usage", "--quant auto means nothing for random weights: bf16, fp8, nvfp4 or nvfp4-w4a16");
    if (o->images_only && o->no_vision) throw Error(Status::BadRequest, "usage", "--images-only with --no-vision leaves nothing to measure");
    if (o->images_only && (o->memory_only || o->reuse || o->interleave))
      throw Error(Status::BadRequest, "usage", "--images-only is its own run: not with --memory-only, --reuse or --interleave");
    std::string why;
    if (!cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", "clefrt bench: " + why);
    auto log = [](const std::string& s) { std::fprintf(stderr, "bench: %s\n", s.c_str()); };

    log("measuring the card (bf16 GEMM 8192^3, 2 GiB device copy)");
    const Hardware hw = measure_hardware();
    log(hw.gpu + ": " + std::to_string(hw.peak_bf16_tflops) + " TFLOP/s bf16, " + std::to_string(hw.copy_gbps) + " GB/s copy");

    // What every JSON record starts with: when, where, what ran, and the card's measured limits.
    auto record = [&] {
      Value out = Value::object();
      out.add("date", Value::string(utc_now()));
      out.add("gpu", Value::string(hw.gpu));
      out.add("commit", Value::string(o->commit));
      out.add("command", Value::string(o->command.empty() ? "clefrt bench --synthetic " + o->synthetic + " --quant " + o->quant : o->command));
      out.add("model", Value::string(o->synthetic));
      out.add("quant", Value::string(o->quant));
      out.add("offload_embeddings", Value::boolean(o->offload));
      out.add("batch_invariant", Value::boolean(!o->no_batch_invariant));
      out.add("attention", Value::string(o->attention));
      out.add("cuda_graphs", Value::number(double(o->cuda_graphs)));
      out.add("peak_bf16_tflops", Value::number(hw.peak_bf16_tflops));
      out.add("copy_gbps", Value::number(hw.copy_gbps));
      return out;
    };
    // The engine the flags ask for, its activations planned for one forward of --max-tokens.
    auto engine_options = [&] {
      EngineOptions eo;
      eo.device = Device::Cuda;
      eo.quant = qm;
      eo.offload_embeddings = o->offload;
      eo.w4a16_fused = o->w4a16_fused;
      eo.batch_invariant = !o->no_batch_invariant;
      eo.max_length = size_t(o->max_tokens);
      eo.max_batch_tokens = size_t(o->max_tokens);
      eo.vision = !o->no_vision;
      eo.attention = parse_attention_kernel(o->attention);
      eo.cuda_graphs = o->cuda_graphs;
      return eo;
    };
    if (o->interleave) {
      auto open = [&](size_t step, size_t layers) {
        EngineOptions eo = engine_options();
        eo.prefix_cache_gib = 0;
        eo.step_tokens = step;
        eo.step_layers = layers;
        return Engine::synthetic(o->synthetic, o->tokenizer, eo);
      };
      Value out = record();
      out.add("interleave", interleave_points(open, o->request, o->max_tokens, o->reps));
      emit_json(out, o->json_out);
      return 0;
    }
    double held = 0;  // --gpu-limit-gib: what is held beyond the card's size (left out of every figure)
    std::shared_ptr<void> ballast;
    if (o->gpu_limit_gib > 0) {
      ballast = hold_gpu_memory_beyond(o->gpu_limit_gib, &held);
      log("holding " + std::to_string(held) + " GiB: the GPU now has " + std::to_string(o->gpu_limit_gib) + " GiB");
    }
    auto gpu_memory_in_use_gib = [&] { return clefrt::gpu_memory_in_use_gib() - held; };
    const double mem_before = gpu_memory_in_use_gib();  // the CUDA context and the measurement's leftovers
    log("creating " + o->synthetic + " weights in GPU memory (" + o->quant + (o->offload ? ", embeddings offloaded" : "") + ")");
    EngineOptions eo = engine_options();
    eo.max_batch_requests = o->memory_only ? 1 : 64;
    // the latency points repeat one request: a cache would answer them from its state
    eo.prefix_cache_gib = o->reuse ? o->reuse_gib : 0;
    eo.prefix_cache_host_gib = o->reuse ? o->reuse_host_gib : 0;
    auto engine = Engine::synthetic(o->synthetic, o->tokenizer, eo);
    const Encoded blog = engine->prepare(read_file(o->request)).encoded();
    const double gib = double(1ull << 30);
    auto mem_line = [&]() {
      const MemoryUse m = engine->memory();
      return "weights " + std::to_string(double(m.weights) / gib) + " GiB on the GPU (+" + std::to_string(double(m.weights_host) / gib) +
             " GiB pinned host), Linears bf16/nvfp4/fp8 " + std::to_string(double(m.linear_bf16) / gib) + "/" +
             std::to_string(double(m.linear_nvfp4) / gib) + "/" + std::to_string(double(m.linear_fp8) / gib) +
             " GiB, arena + workspace + staging " + std::to_string(double(m.working) / gib) + " GiB, GPU memory in use " +
             std::to_string(gpu_memory_in_use_gib()) + " GiB (" + std::to_string(mem_before) + " before loading)";
    };
    log(mem_line());
    // runs a batch of made-up encodings through the engine (its scheduler packs a list as one forward)
    auto run = [&](const std::vector<const Encoded*>& b) {
      std::vector<Prepared> ps;
      for (const Encoded* e : b) ps.push_back(engine->prepare_encoded(*e));
      std::vector<const Prepared*> pp;
      for (auto& p : ps) pp.push_back(&p);
      return engine->probs(pp);
    };
    if (o->memory_only) {
      const Encoded e = padded(blog, o->max_tokens, 7);
      auto t0 = std::chrono::steady_clock::now();
      run({&e});
      const double ms = ms_since(t0);
      const double used = gpu_memory_in_use_gib();
      log("ran one " + std::to_string(e.input_ids.size()) + "-token request (" + std::to_string(ms) + " ms, first run)");
      log(mem_line());
      const MemoryUse m = engine->memory();
      Value out = record();
      out.add("max_tokens", Value::integer(o->max_tokens));
      if (o->gpu_limit_gib > 0) out.add("gpu_limit_gib", Value::number(o->gpu_limit_gib));
      out.add("gpu_mem_gib", Value::number(used));
      out.add("gpu_mem_before_load_gib", Value::number(mem_before));
      out.add("gpu_mem_engine_gib", Value::number(double(m.weights_reserved + m.working) / gib));
      out.add("weights_gib", Value::number(double(m.weights) / gib));
      out.add("weights_reserved_gib", Value::number(double(m.weights_reserved) / gib));
      out.add("host_weights_gib", Value::number(double(m.weights_host) / gib));
      out.add("working_gib", Value::number(double(m.working) / gib));
      emit_json(out, o->json_out);
      return 0;
    }
    if (o->reuse) {
      const Value blog_json = json::parse(read_file(o->request));
      Value other_json = Value::object();  // the blog's members, another question set
      for (const json::Member& m : blog_json.obj)
        if (m.first != "questions") other_json.add(m.first, m.second);
      other_json.add("questions", json::parse(
          R"({"refund":{"type":"noul","instructions":"Does the customer ask for a refund?"},)"
          R"("lang":{"type":"choice","instructions":"Which language is it in?","criteria":{"en":null,"de":null,"fr":null}},)"
          R"("tone":{"type":"score","instructions":"How upset is the customer?","criteria":["calm","upset","furious"]}})"));
      const Encoded other = engine->prepare(json::write(other_json)).encoded();
      Value out = record();
      out.add("reuse", reuse_points(*engine, blog, other, o->max_tokens, o->reps));
      if (o->reuse_host_gib > 0) out.add("host_tier", host_tier_point(*engine, blog, other, o->reps));
      const PrefixCacheStats st = engine->prefix_cache();
      out.add("prefix_cache_bytes", Value::integer(int64_t(st.bytes)));
      out.add("prefix_cache_entries", Value::integer(int64_t(st.entries)));
      out.add("prefix_cache_evictions", Value::integer(int64_t(st.evictions)));
      out.add("gpu_mem_gib", Value::number(gpu_memory_in_use_gib()));
      emit_json(out, o->json_out);
      return 0;
    }
    const double mem = gpu_memory_in_use_gib();

    auto time_ms = [&](const std::vector<const Encoded*>& b) {
      auto t0 = std::chrono::steady_clock::now();
      run(b);
      return ms_since(t0);
    };
    Value lat = Value::object();
    struct EnergyRow {
      std::string name;
      double tokens;  // a forward's
      EnergyFigures f;
    };
    std::vector<EnergyRow> energy_rows;  // printed after the throughput table
    if (!o->images_only) std::printf("%-12s %8s %10s %10s %10s\n", "latency", "tokens", "p50 ms", "p95 ms", "TFLOP/s");
    struct Point {
      const char* name;
      int64_t tokens;
      int reps;
    };
    std::vector<Point> points = {Point{"blog_346", 0, o->reps}, Point{"tok_1024", 1024, o->reps}, Point{"tok_8192", 8192, std::max(3, o->reps / 4)},
                                 Point{"tok_16384", 16384, std::max(3, o->reps / 6)}};
    // the long points where the plan holds them (--max-tokens)
    for (int64_t n : {int64_t(32768), int64_t(65536)})
      if (o->max_tokens >= n) points.push_back(Point{n == 32768 ? "tok_32768" : "tok_65536", n, 2});
    if (o->images_only) points.clear();
    for (const Point& p : points) {
      Encoded e = p.tokens ? padded(blog, p.tokens, 7) : blog;
      for (int w = 0; w < 2; ++w) time_ms({&e});
      std::vector<double> t;
      PointEnergy pe;
      for (int r = 0; r < p.reps; ++r) {
        const bool ranged = o->profiler_range && r == 0 && &p == &points.front();
        if (ranged) gpu_profiler_range(true);
        t.push_back(time_ms({&e}));
        if (ranged) gpu_profiler_range(false);
      }
      energy_rows.push_back({p.name, double(e.input_ids.size()), pe.end(p.reps, [&] { run({&e}); })});
      const double p50 = percentile(t, 0.5), p95 = percentile(t, 0.95);
      const double tf = engine->forward_flops({int64_t(e.input_ids.size())}) / (p50 * 1e-3) / 1e12;
      std::printf("%-12s %8zu %10.2f %10.2f %10.1f\n", p.name, e.input_ids.size(), p50, p95, tf);
      Value v = Value::object();
      v.add("tokens", Value::integer(int64_t(e.input_ids.size())));
      v.add("p50", Value::number(p50));
      v.add("p95", Value::number(p95));
      v.add("tflops", Value::number(tf));
      lat.add(p.name, v);
    }
    // Images (issue 19): the blog request with one 1024 x 768 PNG (a 48 x 64-patch grid: 3,072
    // patches, 768 image tokens) against the blog padded to as many text tokens; the tower's own
    // GPU time from the stage profile (two events around it: its kernels back to back, as
    // unprofiled; the median of the reps), and where it goes from one run profiled per op (an
    // event between every two of its ~250 kernels: the ops' sum runs over the stage's time by
    // the gaps those events leave); then one 16 MP image (65,536
    // patches) and four (more tokens than any plan holds: refused before decoding, never out of
    // memory).
    Value images = Value::object();
    if (!o->no_vision) {
      const Value blog_json = json::parse(read_file(o->request));
      auto with_images = [&](int n, uint32_t w, uint32_t h) {
        Value r = blog_json;
        Value arr = Value::array();
        const std::string url = "data:image/png;base64," + base64_encode(synthetic_png(w, h));
        for (int i = 0; i < n; ++i) arr.arr.push_back(Value::string(url));
        r.add("images", arr);
        return json::write(r);
      };
      struct ImagePoint {
        const char* name;
        int n;
        uint32_t w, h;
        int reps;
      };
      std::printf("%-18s %8s %12s %10s %10s %12s %12s %10s\n", "images", "tokens", "prepare ms", "p50 ms", "text p50", "tower GPU ms",
                  "per-op sum", "mem GiB");
      for (const ImagePoint ip : {ImagePoint{"image_1024x768", 1, 1024, 768, o->reps}, ImagePoint{"image_16mp", 1, 4000, 4000, 3},
                                  ImagePoint{"images_4x16mp", 4, 4000, 4000, 1}}) {
        const std::string body = with_images(ip.n, ip.w, ip.h);
        Value v = Value::object();
        v.add("images", Value::integer(ip.n));
        v.add("width", Value::integer(ip.w));
        v.add("height", Value::integer(ip.h));
        v.add("request_bytes", Value::integer(int64_t(body.size())));
        try {
          auto t0 = std::chrono::steady_clock::now();
          Prepared p = engine->prepare(body);
          const double prep = ms_since(t0);
          for (int w = 0; w < 2; ++w) engine->probs({&p});
          std::vector<double> t;
          for (int r = 0; r < ip.reps; ++r) {
            t0 = std::chrono::steady_clock::now();
            engine->probs({&p});
            t.push_back(ms_since(t0));
          }
          const Encoded text = padded(blog, int64_t(p.input_tokens()), 7);
          for (int w = 0; w < 2; ++w) time_ms({&text});
          std::vector<double> tt;
          for (int r = 0; r < ip.reps; ++r) tt.push_back(time_ms({&text}));
          engine->set_profile(ProfileDetail::Stages);
          std::vector<double> towers;
          for (int r = 0; r < ip.reps; ++r) {
            engine->clear_profile();
            engine->probs({&p});
            for (auto& [stage, ms] : engine->profile())
              if (stage == "vision tower") towers.push_back(ms);
          }
          if (towers.size() != size_t(ip.reps))
            throw Error(Status::Internal, "internal_error", std::string(ip.name) + ": the stage profile holds no \"vision tower\"");
          const double tower = percentile(towers, 0.5);
          engine->set_profile(ProfileDetail::Ops);
          engine->clear_profile();
          engine->probs({&p});
          // the sum is the tower's GPU ops; "vision prep" and "vision upload" (the host's index
          // arrays, then the uploads: the GPU waiting on them) are listed with them but kept out of
          // it, summed as tower_prep_ms
          double ops_sum = 0, prep_ms = 0;
          Value ops = Value::object();
          for (auto& [op, ms] : engine->profile())
            if (op.rfind("vision", 0) == 0) {
              (op == "vision prep" || op == "vision upload" ? prep_ms : ops_sum) += ms;
              ops.add(op, Value::number(ms));
            }
          engine->set_profile(ProfileDetail::Off);
          const double p50 = percentile(t, 0.5), tp50 = percentile(tt, 0.5), mem_now = gpu_memory_in_use_gib();
          std::printf("%-18s %8zu %12.1f %10.2f %10.2f %12.2f %12.2f %10.2f\n", ip.name, p.input_tokens(), prep, p50, tp50, tower, ops_sum,
                      mem_now);
          v.add("tokens", Value::integer(int64_t(p.input_tokens())));
          v.add("prepare_ms", Value::number(prep));
          v.add("p50", Value::number(p50));
          v.add("p95", Value::number(percentile(t, 0.95)));
          v.add("text_same_tokens_p50", Value::number(tp50));
          v.add("tower_gpu_ms", Value::number(tower));
          v.add("tower_gpu_ms_runs", Value::integer(ip.reps));
          v.add("tower_ops_sum_ms", Value::number(ops_sum));
          v.add("tower_prep_ms", Value::number(prep_ms));
          v.add("tower_ops_ms", ops);
          v.add("gpu_mem_gib", Value::number(mem_now));
        } catch (const Error& e) {
          std::printf("%-18s refused: %d %s: %s\n", ip.name, e.http_status(), e.type().c_str(), e.what());
          v.add("refused", Value::string(e.what()));
          v.add("status", Value::integer(e.http_status()));
          v.add("type", Value::string(e.type()));
        }
        images.add(ip.name, v);
      }
    }
    // Batch invariance at the real shapes: the blog request alone, first in a batch of 16 and of
    // 64 (other requests 512 tokens: other GEMM m buckets), bit for bit.
    Value inv = Value::object();
    // the batch of 64's answers: two runs' (another mode, a lab switch, another build) compared
    // by bench/compare_answers.py
    Value answers = Value::object();
    if (!o->images_only) {
      std::vector<Encoded> others;
      for (int i = 0; i < 63; ++i) others.push_back(padded(blog, 512, 500 + uint64_t(i)));
      auto alone = run({&blog})[0];
      double worst = 0;
      for (int n : {16, 64}) {
        std::vector<const Encoded*> b = {&blog};
        for (int i = 0; i + 1 < n; ++i) b.push_back(&others[size_t(i)]);
        const auto all = run(b);
        const auto& together = all[0];
        if (n == 64) answers = answers_json(all);
        double w = 0;
        for (size_t q = 0; q < alone.size(); ++q)
          for (size_t j = 0; j < alone[q].size(); ++j) w = std::max(w, std::fabs(alone[q][j] - together[q][j]));
        inv.add("batch_" + std::to_string(n) + "_vs_alone_max_abs_diff", Value::number(w));
        worst = std::max(worst, w);
      }
      std::printf("batch invariance: blog alone vs first of 16 / 64 in a batch, worst |dp| = %g\n", worst);
    }
    Value thr = Value::array();
    // the last column against the measured bf16 GEMM peak, whatever the format (FP8's tensor rate
    // is twice bf16's: an FP8 model can pass 100%)
    if (!o->images_only)
      std::printf("%-12s %8s %12s %10s %10s %13s\n", "in flight", "tokens", "tokens/s", "req/s", "TFLOP/s", "of bf16 peak");
    for (int n : o->images_only ? std::vector<int>{} : std::vector<int>{1, 4, 16, 64}) {
      std::vector<Encoded> reqs;
      for (int i = 0; i < n; ++i) reqs.push_back(padded(blog, 512, 100 + uint64_t(i)));
      std::vector<const Encoded*> b;
      std::vector<int64_t> lens;
      for (auto& r : reqs) {
        b.push_back(&r);
        lens.push_back(int64_t(r.input_ids.size()));
      }
      for (int w = 0; w < 2; ++w) time_ms(b);
      std::vector<double> t;
      const int reps = std::max(3, o->reps / (n >= 16 ? 4 : 1));
      PointEnergy pe;
      for (int r = 0; r < reps; ++r) t.push_back(time_ms(b));
      energy_rows.push_back({"in_flight_" + std::to_string(n), double(n) * 512.0, pe.end(reps, [&] { run(b); })});
      const double ms = percentile(t, 0.5);
      const double tokens = double(n) * 512.0, tf = engine->forward_flops(lens) / (ms * 1e-3) / 1e12;
      std::printf("%-12d %8.0f %12.0f %10.1f %10.1f %12.1f%%\n", n, tokens, tokens / (ms * 1e-3), n / (ms * 1e-3), tf,
                  100.0 * tf / hw.peak_bf16_tflops);
      Value v = Value::object();
      v.add("in_flight", Value::integer(n));
      v.add("ms", Value::number(ms));
      v.add("tokens_per_s", Value::number(tokens / (ms * 1e-3)));
      v.add("requests_per_s", Value::number(n / (ms * 1e-3)));
      v.add("tflops", Value::number(tf));
      v.add("fraction_of_peak", Value::number(tf / hw.peak_bf16_tflops));
      thr.arr.push_back(v);
    }
    // each point's energy and clock (the driver's counters; see PointEnergy)
    Value energy = Value::object();
    if (!energy_rows.empty()) {
      const GpuPower g = gpu_power();
      if (g.available) {
        std::printf("%-12s %9s %12s %10s %8s %8s %9s\n", "energy", "ms/fwd", "J/forward", "J/token", "mean W", "SM MHz", "capped");
        for (const EnergyRow& r : energy_rows)
          if (r.f.measured) energy.add(r.name, energy_row(r.name, r.tokens, r.f));
      } else {
        std::printf("energy: not measured (%s)\n", g.why.c_str());
        energy.add("why_not", Value::string(g.why));
      }
    }
    Value prof = Value::object();
    if (o->profile && !o->images_only) {
      engine->set_profile(true);
      std::vector<Encoded> reqs;
      for (int i = 0; i < 64; ++i) reqs.push_back(padded(blog, 512, 100 + uint64_t(i)));
      std::vector<const Encoded*> b64;
      for (auto& r : reqs) b64.push_back(&r);
      const Encoded e8k = padded(blog, 8192, 7), e16k = o->max_tokens >= 16384 ? padded(blog, 16384, 7) : Encoded{};
      std::vector<std::pair<const char*, std::vector<const Encoded*>>> points = {{"blog_346", {&blog}}, {"tok_8192", {&e8k}}};
      if (o->max_tokens >= 16384) points.push_back({"tok_16384", {&e16k}});  // the long point where the quick bench's trend can turn
      points.push_back({"batch_64x512", b64});
      for (auto& [name, batch] : points) {
        engine->clear_profile();
        run(batch);
        double total = 0;
        const auto prof_ms = engine->profile();
        for (auto& [op, ms] : prof_ms) total += ms;
        std::printf("profile %s: %.2f ms in ops\n", name, total);
        Value v = Value::object();
        for (auto& [op, ms] : prof_ms) {
          std::printf("  %-22s %9.3f ms %5.1f%%\n", op.c_str(), ms, 100.0 * ms / total);
          v.add(op, Value::number(ms));
        }
        prof.add(name, v);
      }
      engine->set_profile(false);
    }
    Value out = record();
    const MemoryUse mu = engine->memory();
    out.add("linear_gib_by_format", [&] {
      Value v = Value::object();
      v.add("bf16", Value::number(double(mu.linear_bf16) / gib));
      v.add("nvfp4", Value::number(double(mu.linear_nvfp4) / gib));
      v.add("fp8", Value::number(double(mu.linear_fp8) / gib));
      return v;
    }());
    out.add("engine", Value::string(engine->summary()));  // the kernels it runs (attention, the tower's) and its memory
    out.add("invariance", inv);
    out.add("answers", answers);
    out.add("gpu_mem_gib", Value::number(mem));
    out.add("weights_gib", Value::number(double(mu.weights) / gib));
    out.add("flops_per_token_gflop", Value::number(engine->forward_flops({1}) / 1e9));
    out.add("latency_ms", lat);
    out.add("images", images);
    out.add("throughput", thr);
    out.add("energy", energy);
    if (o->profile) out.add("profile_ms", prof);
    Value base = Value::object();
    if (!o->baseline.empty()) base = json::parse(read_file(o->baseline));
    out.add("baseline", base);
    emit_json(out, o->json_out);
    return 0;
  };
}

}  // namespace clefrt::cli

// The whole CUDA forward (bf16 weights and GEMMs, fp32 elsewhere) against the reference
// fixtures and the CPU engine, and a request's answer alone vs in a batch of 16.
// CTest label `gpu`; skipped where no GPU is present.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include <cmath>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "common/json.h"
#include "cuda/model/device_model.h"
#include "cuda/model/forward.h"
#include "cuda/ops/kernels.h"
#include "engine/engine_core.h"
#include "engine/warmup.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "schema/request.h"
#include "test_cuda_util.h"
#include "test_util.h"

namespace clefrt {
namespace {

using test::Fixture;
using test::read_fixture;
using test::worst_diff;

void check_folder(const std::string& name) {
  NEED_GPU();
  CoreOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = 65536;
  auto gpu = EngineCore::load(test::source_path("tests/fixtures/oracle/" + name), o);
  Fixture f = read_fixture(*gpu, name);
  ASSERT_GE(f.enc.size(), 100u);
  double worst = 0;
  for (size_t i = 0; i < f.enc.size(); ++i) worst = std::max(worst, worst_diff(gpu->probs({&f.enc[i]})[0], f.want[i]));
  std::cout << "[ cuda    ] " << name << ": " << f.enc.size() << " requests, worst |p - p_ref| = " << worst << "\n";
  // Issue 4's target is 2e-3 with bf16 compute. These fixtures cannot show it: their random
  // weights amplify rounding ~200x per layer (fp32 on the CPU: 1.4e-5 after layer 0), so bf16
  // GEMM inputs alone move their answers by up to ~0.4 (measured 0.37 tiny-a, 0.10 tiny-b); the
  // GPU kernels themselves are checked against the CPU with the same bf16 rounding points
  // (check_halves). The bound only catches gross breakage until better-conditioned fixtures
  // exist.
  EXPECT_LT(worst, 0.5) << name;

  // batches of 16 (packed, mixed lengths) give the same answers as one at a time
  double batch_worst = 0;
  for (size_t s = 0; s + 16 <= f.enc.size(); s += 16) {
    std::vector<const Encoded*> b;
    for (size_t i = s; i < s + 16; ++i) b.push_back(&f.enc[i]);
    auto together = gpu->probs(b);
    for (size_t i = 0; i < 16; ++i) batch_worst = std::max(batch_worst, worst_diff(together[i], gpu->probs({b[i]})[0]));
  }
  std::cout << "[ cuda    ] " << name << ": batch of 16 vs alone, worst difference = " << batch_worst << "\n";
  EXPECT_EQ(batch_worst, 0.0) << "batch invariance";
}

// The backbone's hidden states and the head's probabilities, each against the CPU engine on
// the same inputs, so a failure says which half is wrong.
// An oracle folder as these tests load it: the CPU engine, and the config and weights a device
// model is built from (their stores kept open: a weight's `src` points into them).
struct OracleFolder {
  std::unique_ptr<EngineCore> cpu;
  model::ModelConfig cfg;
  io::TensorStore st, hs;
  model::TextWeights tw;
  model::HeadWeights hw;
};
OracleFolder open_oracle(const std::string& name) {
  const std::string dir = test::source_path("tests/fixtures/oracle/" + name);
  OracleFolder o;
  o.cpu = EngineCore::load(dir);
  o.cfg = model::load_config(dir);
  o.st = io::TensorStore::open_folder(dir);
  o.hs.add_file(dir + "/joint_head.safetensors");
  o.tw = model::load_text_weights(o.st, o.cfg.text);
  o.hw = model::load_head_weights(o.hs, o.cfg.head);
  return o;
}

void check_halves(const std::string& name, bool batch_invariant) {
  NEED_GPU();
  const OracleFolder o = open_oracle(name);
  const auto& cpu = o.cpu;
  const auto& cfg = o.cfg;
  const auto& tw = o.tw;
  const auto& hw = o.hw;
  cuda::DevModel dm = cuda::build_device_model(tw, hw, cfg.text, cfg.head);
  cuda::ForwardOptions fo;
  fo.batch_invariant = batch_invariant;
  cuda::Forward fwd(dm, fo);
  Fixture f = read_fixture(*cpu, name);
  {  // diagnosis: the first request through the first n layers only
    const Encoded& e = f.enc[0];
    for (int64_t n = 0; n <= int64_t(tw.layers.size()); ++n) {
      const double rel = test::first_layers_rel_diff(tw, cfg.text, dm, e, n);
      std::cout << "[ cuda    ] " << name << " first " << n << " layers: relative max diff to the CPU with bf16 rounding points "
                << rel << "\n";
      // Measured 1.5e-3 (tiny-a) and 2.1e-3 (tiny-b) after one layer: accumulation order only.
      // Deeper layers amplify it (these random models amplify rounding ~200x per layer; issue
      // 4's note), so only the first layer is bounded.
      if (n == 1) EXPECT_LT(rel, 1e-2) << "first layer against the CPU with the same bf16 rounding";
    }
  }
  double worst_h = 0, worst_p = 0;
  for (size_t i = 0; i < f.enc.size(); i += 7) {
    const Encoded& e = f.enc[i];
    const std::vector<int64_t> offs = {0, int64_t(e.input_ids.size())};
    auto hc = model::backbone_forward(tw, cfg.text, e.input_ids, offs);
    auto hg = fwd.hidden_states({&e});
    double scale = 0, diff = 0;
    for (size_t k = 0; k < hc.size(); ++k) {
      scale = std::max(scale, double(std::fabs(hc[k])));
      diff = std::max(diff, double(std::fabs(hc[k] - hg[k])));
    }
    worst_h = std::max(worst_h, diff / scale);
    auto pc = model::joint_head(hw, cfg.head, tw.lm_head, hc.data(), e);
    worst_p = std::max(worst_p, worst_diff(fwd.head_only({&e}, hc)[0], pc));
  }
  std::cout << "[ cuda    ] " << name << (batch_invariant ? " (batch-invariant GEMMs)" : " (heuristic GEMMs)")
            << ": backbone max |h_gpu - h_cpu| / max |h_cpu| = " << worst_h << ", head on the CPU's hidden states: worst |dp| = " << worst_p
            << "\n";
  EXPECT_LT(worst_p, 1e-4) << "head (fp32 on the GPU too; measured 1.5e-6)";
}

TEST(CudaEngine, TinyAHalvesAgainstCpu) { check_halves("tiny-a", true); }
TEST(CudaEngine, TinyAHalvesAgainstCpuHeuristicGemm) { check_halves("tiny-a", false); }
TEST(CudaEngine, TinyBHalvesAgainstCpu) { check_halves("tiny-b", true); }

TEST(CudaEngine, TinyAAgainstReference) { check_folder("tiny-a"); }
TEST(CudaEngine, TinyBAgainstReference) { check_folder("tiny-b"); }

// Issue 4's accuracy target, every probability within 2e-3 with bf16 compute, on a model where
// it means something: the oracle folders amplify rounding ~200x per layer (check_folder above),
// so it is checked here on the `small` preset (8 layers, Hv > Hk, two attention layers)
// synthesized with Linear gain 0.5, whose answers bf16 rounding moves by ~1e-3
// (Engine.LinearGainHalfIsWellConditionedUnderBf16). The reference is the CPU engine in fp32,
// itself within 1e-4 of transformers' fp32 forward on the oracle folders (test_oracle.cpp).
// All 120 corpus requests (up to 5,499 tokens with the full Qwen3 tokenizer), one at a time.
// Measured on the H200 (bench/results/2026-12-02-h200-gpu-tests-49d4b55.log): worst 8.9e-4, mean
// 3.6e-4, none at or over 1e-3.
// A folder's CUDA engine planned for 65,536-token batches (the corpus's longest fits).
std::unique_ptr<EngineCore> cuda_engine(const std::string& dir, bool portable_kernels = false) {
  CoreOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = 65536;
  o.portable_kernels = portable_kernels;
  return EngineCore::load(dir, o);
}

TEST(CudaEngine, WellConditionedAgainstCpuFp32) {
  NEED_GPU();
  const std::string dir = test::synth_folder("calm-small", 5, "small", 0.5f);
  auto cpu = EngineCore::load(dir), gpu = cuda_engine(dir);
  double worst = 0, sum = 0;
  size_t n = 0, over_1e3 = 0, longest = 0;
  for (const auto& text : test::corpus_requests(120)) {
    const Encoded e = cpu->encoder().encode(parse_request(text));
    const double w = worst_diff(gpu->probs({&e})[0], cpu->probs({&e})[0]);
    worst = std::max(worst, w);
    sum += w;
    over_1e3 += w >= 1e-3;
    longest = std::max(longest, e.input_ids.size());
    ++n;
  }
  std::cout << "[ cuda    ] small, linear gain 0.5: " << n << " requests (up to " << longest << " tokens), GPU (bf16) vs CPU (fp32): worst |dp| "
            << worst << ", mean " << sum / double(n) << ", " << over_1e3 << " at or over 1e-3\n";
  EXPECT_GE(n, 100u);
  EXPECT_LT(worst, 2e-3);
}

// The same check on a model with the Clef models' 128-wide GDN heads (small-gdn128), whose GDN
// layers run the kernels that tile those shapes (on Hopper the Wgmma scan once it is Auto's
// choice), and --portable-kernels (the mma.sync 3xTF32 scan) beside it. 40 corpus requests.
TEST(CudaEngine, WellConditionedAtClefGdnHeadsAgainstCpuFp32) {
  NEED_GPU();
  const std::string dir = test::synth_folder("calm-small-gdn128", 5, "small-gdn128", 0.5f);
  auto cpu = EngineCore::load(dir), gpu = cuda_engine(dir), portable = cuda_engine(dir, true);
  std::cout << "[ cuda    ] " << gpu->gpu_summary() << "\n";
  double worst = 0, worst_p = 0, between = 0;
  size_t n = 0;
  for (const auto& text : test::corpus_requests(40)) {
    const Encoded e = cpu->encoder().encode(parse_request(text));
    const auto want = cpu->probs({&e})[0], got = gpu->probs({&e})[0], got_p = portable->probs({&e})[0];
    worst = std::max(worst, worst_diff(got, want));
    worst_p = std::max(worst_p, worst_diff(got_p, want));
    between = std::max(between, worst_diff(got, got_p));
    ++n;
  }
  std::cout << "[ cuda    ] small-gdn128, linear gain 0.5: " << n << " requests, GPU (bf16) vs CPU (fp32): worst |dp| " << worst
            << ", portable kernels " << worst_p << ", between them " << between << "\n";
  EXPECT_EQ(n, 40u);
  EXPECT_LT(worst, 2e-3);
  EXPECT_LT(worst_p, 2e-3);
}

// The Wgmma GDN path's two precisions (kernels.h's gdn_wgmma_one_pass_bf16): one bf16 pass per
// product (the default: FlashInfer's and fla's precision) and bf16x3, on
// WellConditionedAtClefGdnHeadsAgainstCpuFp32's model and requests: both within the product's
// 2e-3 of the CPU, and apart (the switch reaches the kernels). Prints both: what one pass costs
// the answers beside bf16x3.
TEST(CudaEngine, GdnProductsAtClefGdnHeadsAgainstCpuFp32) {
  NEED_GPU();
  if (!cuda::gdn_wgmma_available(128, 128)) GTEST_SKIP() << "no Wgmma GDN path on this GPU / build";
  const std::string dir = test::synth_folder("calm-small-gdn128", 5, "small-gdn128", 0.5f);
  const bool before = cuda::gdn_wgmma_one_pass_bf16();
  struct Restore {
    bool to;
    ~Restore() { cuda::gdn_wgmma_set_one_pass_bf16(to); }
  } restore{before};
  auto cpu = EngineCore::load(dir);
  cuda::gdn_wgmma_set_one_pass_bf16(false);
  auto x3 = cuda_engine(dir);
  EXPECT_NE(x3->gpu_summary().find("wgmma bf16x3"), std::string::npos) << x3->gpu_summary();
  cuda::gdn_wgmma_set_one_pass_bf16(true);
  auto one = cuda_engine(dir);
  double worst = 0, worst_x3 = 0, sum = 0, sum_x3 = 0, apart = 0;
  size_t n = 0;
  for (const auto& text : test::corpus_requests(40)) {
    const Encoded e = cpu->encoder().encode(parse_request(text));
    const auto want = cpu->probs({&e})[0];
    cuda::gdn_wgmma_set_one_pass_bf16(true);
    const auto p1 = one->probs({&e})[0];
    cuda::gdn_wgmma_set_one_pass_bf16(false);
    const auto p3 = x3->probs({&e})[0];
    const double w = worst_diff(p1, want), w3 = worst_diff(p3, want);
    worst = std::max(worst, w);
    worst_x3 = std::max(worst_x3, w3);
    sum += w;
    sum_x3 += w3;
    apart = std::max(apart, worst_diff(p1, p3));
    ++n;
  }
  std::cout << "[ cuda    ] small-gdn128, linear gain 0.5, " << n << " requests, GPU vs CPU (fp32): GDN products one bf16 pass worst |dp| " << worst
            << " (mean " << sum / double(n) << "), bf16x3 worst " << worst_x3 << " (mean " << sum_x3 / double(n) << "); apart by up to " << apart
            << "\n";
  EXPECT_EQ(n, 40u);
  EXPECT_GT(apart, 0.0) << "the two precisions gave the same answers: the switch did not reach the kernels";
  EXPECT_LT(worst, 2e-3);
  EXPECT_LT(worst_x3, 2e-3);
}

// CUDA graphs (ForwardOptions::graph_after): a shape's first forward runs eagerly, its second is
// captured, later ones replay; every one gives the eager engine's bits, a batch of the same shape
// with other tokens its own answers (the graph reads the new index arrays), and another shape
// misses the cache. bf16, FP8 and NVFP4 W4A16 Linears (short passes: nvfp4_gemm_rs, its tiles
// timed at the first sighting), clefrt's and cuDNN's attention.
TEST(CudaEngine, GraphReplayGivesTheEagerBits) {
  NEED_GPU();
  const OracleFolder o = open_oracle("tiny-a");
  const auto& cfg = o.cfg;
  const auto& tw = o.tw;
  const auto& hw = o.hw;
  Fixture f = read_fixture(*o.cpu, "tiny-a");
  ASSERT_GE(f.enc.size(), 3u);
  Encoded other = f.enc[0];  // the same shape, other tokens (inside the state, away from every span's ends)
  for (size_t i = other.input_ids.size() / 4; i < other.input_ids.size() / 2; i += 3) other.input_ids[i] = (other.input_ids[i] + 7) % cfg.text.vocab;
  const std::vector<const Encoded*> x = {&f.enc[0], &f.enc[1]}, y = {&other, &f.enc[1]}, z = {&f.enc[2]};
  std::string why;
  const bool has_cudnn = cuda::cudnn_available(&why);
  for (QuantMode q : {QuantMode::BF16, QuantMode::FP8, QuantMode::NVFP4_W4A16}) {
    cuda::BuildOptions bo;
    bo.quant = q;
    cuda::DevModel dm = cuda::build_device_model(tw, hw, cfg.text, cfg.head, bo);
    for (bool cudnn : {false, true}) {
      if (q == QuantMode::NVFP4_W4A16 && cudnn) continue;  // the attention is the other modes' business
      if (cudnn && !has_cudnn) {
        std::cout << "[ cuda    ] cuDNN attention not checked: " << why << "\n";
        continue;
      }
      const std::string what = std::string(quant_mode_name(q)) + (cudnn ? ", cuDNN attention" : ", clefrt attention");
      cuda::ForwardOptions fo;
      fo.cudnn_attention = cudnn;
      // NVFP4: the fixture's batches pass 512 tokens, where the staged path (its side stream)
      // keeps a forward out of graphs; the short-input path at every length (the runner reads
      // the bound when it is made)
      if (q == QuantMode::NVFP4_W4A16) setenv("CLEFRT_LAB_W4A16_RS_MAX_M", "1000000", 1);
      cuda::Forward eager(dm, fo);
      fo.graph_after = 2;
      cuda::Forward graphed(dm, fo);
      unsetenv("CLEFRT_LAB_W4A16_RS_MAX_M");
      const auto want_x = eager.run(x), want_y = eager.run(y), want_z = eager.run(z);
      ASSERT_NE(want_x, want_y) << what << ": the changed tokens changed nothing; the test cannot tell replay from stale";
      auto timed = [](auto&& f) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = f();
        return std::make_pair(r, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      };
      auto [first, first_ms] = timed([&] { return graphed.run(x); });
      EXPECT_EQ(first, want_x) << what << ": first sighting (eager)";
      EXPECT_EQ(graphed.graphs_held(), 0u) << what;
      auto [second, capture_ms] = timed([&] { return graphed.run(x); });
      EXPECT_EQ(second, want_x) << what << ": second sighting (captured, then launched)";
      EXPECT_EQ(graphed.graphs_held(), 1u) << what;
      EXPECT_EQ(graphed.graph_replays(), 1u) << what;
      auto [third, replay_ms] = timed([&] { return graphed.run(x); });
      EXPECT_EQ(third, want_x) << what << ": replayed";
      std::cout << "[ cuda    ] " << what << ": ms a forward, eager (first sighting) " << first_ms << ", captured " << capture_ms << ", replayed "
                << replay_ms << "\n";
      EXPECT_EQ(graphed.run(y), want_y) << what << ": replayed with other tokens";
      EXPECT_EQ(graphed.graph_replays(), 3u) << what;
      EXPECT_EQ(graphed.run(z), want_z) << what << ": another shape";
      EXPECT_EQ(graphed.graph_replays(), 3u) << what << ": another shape replayed a graph";
      EXPECT_EQ(graphed.run(x), want_x) << what << ": replayed after another shape";
      EXPECT_EQ(graphed.graph_replays(), 4u) << what;
    }
  }
}

// The warm-up (engine/warmup.h) runs its forwards on the GPU, within the engine's plan, and
// changes no answer: the GEMM algorithms it settles are chosen among those that round as the
// reference does.
TEST(CudaEngine, WarmupRunsItsForwardsAndChangesNoAnswer) {
  NEED_GPU();
  CoreOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = 16384;  // as Engine::open plans it from EngineOptions' defaults
  auto warm = EngineCore::load(test::source_path("tests/fixtures/oracle/tiny-b"), o);
  auto cold = EngineCore::load(test::source_path("tests/fixtures/oracle/tiny-b"), o);
  EngineOptions eo;
  eo.warmup = true;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t forwards = warm_up(*warm, eo, RequestLimits{});
  std::cout << "[ cuda    ] warm-up: " << forwards << " forwards in "
            << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() << " ms\n";
  EXPECT_GE(forwards, 6u);  // at least 2 .. 32 short requests and a full forward of them
  Fixture f = read_fixture(*warm, "tiny-b");
  std::vector<const Encoded*> fit;  // the fixture's requests a forward of the plan holds, together
  size_t tokens = 0;
  for (const auto& e : f.enc)
    if (tokens + e.input_ids.size() <= 16384) {
      fit.push_back(&e);
      tokens += e.input_ids.size();
    }
  ASSERT_GE(fit.size(), 2u);
  EXPECT_EQ(warm->probs(fit), cold->probs(fit));
  for (const Encoded* e : fit) EXPECT_EQ(warm->probs({e}), cold->probs({e}));
}

TEST(CudaEngine, RefusesBatchOverThePlan) {
  NEED_GPU();
  CoreOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = 300;
  auto gpu = EngineCore::load(test::source_path("tests/fixtures/oracle/tiny-b"), o);
  Fixture f = read_fixture(*gpu, "tiny-b");
  const Encoded* big = nullptr;
  for (const auto& e : f.enc)
    if (e.input_ids.size() > 300) big = &e;
  ASSERT_NE(big, nullptr);
  try {
    gpu->probs({big});
    FAIL() << "expected a 413";
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 413);
    EXPECT_NE(std::string(e.what()).find("maximum context length"), std::string::npos) << e.what();
  }
}

// A plan over the GPU's free memory (a batch of 2^26 tokens) is refused from the headers, in
// well under the time a load takes, naming the figure and what would fit.
TEST(CudaEngine, PlanOverTheFreeMemoryIsRefusedBeforeLoading) {
  NEED_GPU();
  const std::string dir = test::synth_folder("calm-small", 5, "small", 0.5f);
  CoreOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = int64_t(1) << 26;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    EngineCore::load(dir, o);
    FAIL() << "expected insufficient_memory";
  } catch (const Error& e) {
    std::cout << "[ cuda    ] " << e.what() << "\n";
    EXPECT_EQ(e.type(), "insufficient_memory");
    EXPECT_NE(e.message().find("GPU has"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

}  // namespace
}  // namespace clefrt

// gpu_profiler_range: cudaProfilerStart / Stop succeed with no profiler attached (bench
// --profiler-range outside Nsight Compute), twice over.
TEST(CudaEngine, ProfilerRangeStartsAndStops) {
  NEED_GPU();
  for (int i = 0; i < 2; ++i) {
    EXPECT_NO_THROW(clefrt::gpu_profiler_range(true));
    EXPECT_NO_THROW(clefrt::gpu_profiler_range(false));
  }
}

// gpu_power on a GPU: the driver's NVML answers (a machine with a CUDA GPU has the driver that
// ships it), the energy counter goes forward over a second of work, and the clock and
// draw are plausible.
TEST(CudaEngine, GpuPowerReadsTheDriversCounters) {
  NEED_GPU();
  const clefrt::GpuPower a = clefrt::gpu_power();
  ASSERT_TRUE(a.available) << a.why;
  EXPECT_GT(a.energy_j, 0.0);
  EXPECT_GT(a.sm_clock_mhz, 100.0);
  EXPECT_LT(a.sm_clock_mhz, 5000.0);
  EXPECT_GT(a.power_w, 1.0);
  // a second of GEMMs and copies: measure_hardware is ~0.1 s of them, and over so short a window
  // the driver's counter may not have ticked yet (seen once on an H100: 0 J)
  clefrt::Hardware hw;
  const auto t0 = std::chrono::steady_clock::now();
  do hw = clefrt::measure_hardware();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  const clefrt::GpuPower b = clefrt::gpu_power();
  ASSERT_TRUE(b.available) << b.why;
  EXPECT_GT(b.energy_j, a.energy_j) << "the GEMMs of measure_hardware (" << hw.peak_bf16_tflops << " TFLOP/s) took no energy";
  std::cout << "[ cuda    ] " << b.energy_j - a.energy_j << " J over measure_hardware, SM " << b.sm_clock_mhz << " MHz, " << b.power_w << " W"
            << (b.power_capped ? ", power-capped" : "") << "\n";
}

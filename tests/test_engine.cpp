// The CPU engine on a synthesized tiny model: packing, GDN forms, load errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <omp.h>
#include <unistd.h>

#include <thread>

#include "common/error.h"
#include "engine/engine_core.h"
#include "io/safetensors_write.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/synth.h"
#include "model/weights.h"
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

namespace fs = std::filesystem;

const std::string& tiny_dir() {
  static const std::string dir = test::synth_folder("tiny", 7);
  return dir;
}

const EngineCore& tiny() {
  static std::unique_ptr<EngineCore> e = EngineCore::load(tiny_dir());
  return *e;
}

std::vector<std::string> requests() {
  std::string long_state;
  for (int k = 0; k < 60; ++k) long_state += "Sentence number " + std::to_string(k) + " about the outage and the billing system. ";
  return {
      test::read_file(test::source_path("examples/blog.json")),
      R"({"state":"short","questions":{"a":{"type":"noul"}}})",
      R"({"state":")" + long_state + R"(","questions":{"x":{"type":"choice","criteria":{"p":"one","q":"two","r":null}},"y":{"type":"score","criteria":["a","b"]}}})",
      R"({"state":{"k":[1,2,3]},"questions":{"z":{"type":"noul","instructions":"Is it?"},"w":{"type":"noul"}}})",
  };
}

TEST(Engine, PackedBatchEqualsOneAtATime) {
  std::vector<Encoded> enc;
  for (const auto& r : requests()) enc.push_back(tiny().encoder().encode(parse_request(r)));
  std::vector<const Encoded*> all;
  for (const auto& e : enc) all.push_back(&e);
  auto packed = EngineCore::load(tiny_dir(), CoreOptions{});  // (batch_invariant = false is a CUDA option, refused here)
  auto batched = packed->probs(all);
  EXPECT_EQ(tiny().probs(all), [&] {  // the default engine: exactly the answers alone
    std::vector<std::vector<std::vector<double>>> one;
    for (auto* e : all) one.push_back(tiny().probs({e})[0]);
    return one;
  }());
  double worst = 0;
  for (size_t k = 0; k < enc.size(); ++k) {
    auto alone = tiny().probs({&enc[k]})[0];
    ASSERT_EQ(alone.size(), batched[k].size());
    for (size_t q = 0; q < alone.size(); ++q) {
      double sum = 0;
      for (size_t j = 0; j < alone[q].size(); ++j) {
        worst = std::max(worst, std::fabs(alone[q][j] - batched[k][q][j]));
        sum += alone[q][j];
        EXPECT_GE(alone[q][j], 0.0);
      }
      EXPECT_NEAR(sum, 1.0, 1e-9);
    }
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(enc[2].input_ids.size(), 700u);  // crosses several GDN chunks
}

// --threads is honoured on the thread that runs the forward (the server's engine thread), not only
// on the one that loaded the engine: OpenMP's thread count is per thread. Left at the default
// there, a 1-thread server on 2 cores spun a second OpenMP thread against its own I/O threads.
TEST(Engine, ThreadCountHoldsOnTheThreadThatRunsTheForward) {
  CoreOptions o;
  o.threads = 1;
  auto e = EngineCore::load(tiny_dir(), o);
  const Encoded enc = e->encoder().encode(parse_request(requests()[1]));
  int seen = -1, before = -1;
  std::thread([&] {
    before = omp_get_max_threads();
    e->probs({&enc});
    seen = omp_get_max_threads();
  }).join();
  if (before == 1) GTEST_SKIP() << "this machine runs one OpenMP thread by default: nothing to tell apart";
  EXPECT_EQ(seen, 1);
}

TEST(Engine, ChunkedAndRecurrentGdnAgree) {
  std::vector<Encoded> enc;
  for (const auto& r : requests()) enc.push_back(tiny().encoder().encode(parse_request(r)));
  std::vector<const Encoded*> all;
  for (const auto& e : enc) all.push_back(&e);
  auto a = tiny().probs(all, model::GdnForm::Chunked);
  auto b = tiny().probs(all, model::GdnForm::Recurrent);
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k)
    for (size_t q = 0; q < a[k].size(); ++q)
      for (size_t j = 0; j < a[k][q].size(); ++j) worst = std::max(worst, std::fabs(a[k][q][j] - b[k][q][j]));
  EXPECT_LT(worst, 1e-5);
}

TEST(Engine, AnswersArePeakedNotUniform) {
  Encoded e = tiny().encoder().encode(parse_request(requests()[0]));
  auto p = tiny().probs({&e})[0];
  double maxp = 0;
  for (auto& q : p)
    for (double x : q) maxp = std::max(maxp, x);
  EXPECT_GT(maxp, 0.6);
}

// The instrument behind the GPU accuracy check (CudaEngine.WellConditionedAgainstCpuFp32): with
// Linear gain 0.5 a random model is well-conditioned, so bf16 compute (emulated here by the CPU
// engine's bf16 rounding points) moves its answers by ~1e-3; at unit gain by far more. Both
// halves are asserted, so the test fails if either model stops being what the check assumes.
double bf16_points_worst(const std::string& dir, size_t n) {
  const auto cfg = model::load_config(dir);
  io::TensorStore st = io::TensorStore::open_folder(dir), hs;
  hs.add_file(dir + "/joint_head.safetensors");
  const auto tw = model::load_text_weights(st, cfg.text);
  const auto hw = model::load_head_weights(hs, cfg.head);
  auto eng = EngineCore::load(dir);
  double worst = 0;
  for (const auto& text : test::corpus_requests(n)) {
    Encoded e = eng->encoder().encode(parse_request(text));
    if (e.input_ids.size() > 2000) continue;
    const std::vector<int64_t> offs = {0, int64_t(e.input_ids.size())};
    auto h32 = model::backbone_forward(tw, cfg.text, e.input_ids, offs);
    auto h16 = model::backbone_forward_bf16_points(tw, cfg.text, e.input_ids, offs);
    worst = std::max(worst, test::worst_diff(model::joint_head(hw, cfg.head, tw.lm_head, h32.data(), e),
                                             model::joint_head(hw, cfg.head, tw.lm_head, h16.data(), e)));
  }
  return worst;
}

TEST(Engine, LinearGainHalfIsWellConditionedUnderBf16) {
  const double calm = bf16_points_worst(test::synth_folder("calm", 3, "tiny", 0.5f), 30);
  const double wild = bf16_points_worst(test::synth_folder("wild", 3, "tiny", 1.0f), 30);
  std::cout << "[ engine  ] bf16 rounding points vs fp32, worst |dp|: linear gain 0.5 " << calm << ", gain 1 " << wild << "\n";
  EXPECT_LT(calm, 1.5e-3);  // measured 1.1e-3 (1.0e-3 for `small`)
  EXPECT_GT(wild, 1e-2);    // measured 3.4e-2
}

std::string load_error_of(const std::string& dir) {
  try {
    EngineCore::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Engine, LoadErrorsNameFileAndTensor) {
  std::string d = testing::TempDir() + "clefrt-broken-" + std::to_string(getpid());
  auto fresh = [&] {
    fs::remove_all(d);
    fs::copy(tiny_dir(), d);
  };
  fresh();
  fs::remove(d + "/joint_head.safetensors");
  EXPECT_NE(load_error_of(d).find("joint_head.safetensors"), std::string::npos);
  fresh();
  fs::remove(d + "/model-00002-of-00002.safetensors");
  EXPECT_NE(load_error_of(d).find("model-00002-of-00002.safetensors"), std::string::npos);
  fresh();
  fs::resize_file(d + "/model-00001-of-00002.safetensors", 1000000);
  EXPECT_NE(load_error_of(d).find("truncated"), std::string::npos);
  fresh();
  {  // a head tensor with the wrong shape
    io::write_safetensors(d + "/joint_head.safetensors",
                          {{"hidden_norm.weight", io::DType::BF16, {63}, io::bf16_bytes(std::vector<float>(63, 1.0f))}});
    std::string msg = load_error_of(d);
    EXPECT_NE(msg.find("hidden_norm.weight has shape [63], expected [64]"), std::string::npos) << msg;
  }
  fresh();
  {  // config inconsistent with the weights
    std::string cfg = test::read_file(d + "/config.json");
    cfg.replace(cfg.find("\"intermediate_size\":128"), 23, "\"intermediate_size\":96");
    std::ofstream(d + "/config.json") << cfg;
    std::string msg = load_error_of(d);
    EXPECT_NE(msg.find("mlp.gate_proj.weight has shape [128, 64], expected [96, 64]"), std::string::npos) << msg;
  }
  fresh();
  std::ofstream(d + "/config.json") << "{";
  EXPECT_NE(load_error_of(d).find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace clefrt

// gpu_profiler_range without a GPU: a 503 that says why, not a silent no-op (`clefrt bench
// --profiler-range` then fails at its first point rather than profiling nothing).
TEST(Engine, GpuProfilerRangeRefusesWithoutAGpu) {
  std::string why;
  if (clefrt::cuda_available(&why)) GTEST_SKIP() << "a GPU is here: CudaEngine.ProfilerRangeStartsAndStops covers it";
  try {
    clefrt::gpu_profiler_range(true);
    FAIL() << "no throw";
  } catch (const clefrt::Error& e) {
    EXPECT_EQ(e.type(), "device_unavailable");
    EXPECT_EQ(e.http_status(), 503);
  }
}

// gpu_power without a GPU (or without CUDA in the build): not available, never a throw, and it
// says why (`clefrt bench` prints that line instead of its energy table). The GPU side is
// CudaEngine.GpuPowerReadsTheDriversCounters.
TEST(Engine, GpuPowerSaysWhyWithoutAGpu) {
  std::string why;
  if (clefrt::cuda_available(&why)) GTEST_SKIP() << "a GPU is here: CudaEngine.GpuPowerReadsTheDriversCounters covers it";
  const clefrt::GpuPower g = clefrt::gpu_power();
  EXPECT_FALSE(g.available);
  EXPECT_FALSE(g.why.empty());
  EXPECT_EQ(g.energy_j, 0.0);
}

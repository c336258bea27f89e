// The whole CUDA forward (bf16 weights and GEMMs, fp32 elsewhere) against the reference
// fixtures and the CPU engine, and a request's answer alone vs in a batch of 16.
// CTest label `gpu`; skipped where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "common/json.h"
#include "engine/engine.h"
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

struct Fixture {
  std::vector<Encoded> enc;
  std::vector<std::vector<std::vector<double>>> want;
};

Fixture read_fixture(const Engine& e, const std::string& name) {
  Fixture f;
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/" + name + ".expected.jsonl")));
  std::string line;
  while (std::getline(in, line)) {
    auto rec = json::parse(line);
    f.enc.push_back(e.encoder().encode(parse_request(*rec.find("request"))));
    std::vector<std::vector<double>> p;
    for (const auto& q : rec.find("probs")->arr) {
      p.emplace_back();
      for (const auto& x : q.arr) p.back().push_back(x.d);
    }
    f.want.push_back(std::move(p));
  }
  return f;
}

double worst_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double w = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t q = 0; q < a.size() && q < b.size(); ++q) {
    EXPECT_EQ(a[q].size(), b[q].size());
    for (size_t j = 0; j < a[q].size() && j < b[q].size(); ++j) w = std::max(w, std::fabs(a[q][j] - b[q][j]));
  }
  return w;
}

void check_folder(const std::string& name) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  EngineOptions o;
  o.device = Device::Cuda;
  auto gpu = Engine::load(test::source_path("tests/fixtures/oracle/" + name), o);
  Fixture f = read_fixture(*gpu, name);
  ASSERT_GE(f.enc.size(), 100u);
  double worst = 0;
  for (size_t i = 0; i < f.enc.size(); ++i) worst = std::max(worst, worst_diff(gpu->probs({&f.enc[i]})[0], f.want[i]));
  std::cout << "[ cuda    ] " << name << ": " << f.enc.size() << " requests, worst |p - p_ref| = " << worst << "\n";
  EXPECT_LT(worst, 2e-3) << name;  // issue 4's target with bf16 compute

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

TEST(CudaEngine, TinyAAgainstReference) { check_folder("tiny-a"); }
TEST(CudaEngine, TinyBAgainstReference) { check_folder("tiny-b"); }

TEST(CudaEngine, RefusesBatchOverThePlan) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  EngineOptions o;
  o.device = Device::Cuda;
  o.max_batch_tokens = 300;
  auto gpu = Engine::load(test::source_path("tests/fixtures/oracle/tiny-b"), o);
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

}  // namespace
}  // namespace clefrt

// The warm-up's plan (engine/warmup.h) and random_prefixed; the GPU run is in test_cuda_engine.cpp.
#include <gtest/gtest.h>

#include <set>

#include "engine/engine_core.h"
#include "engine/warmup.h"
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

WarmupLimits serve_defaults() {
  WarmupLimits l;
  l.max_batch_tokens = 16384;
  l.max_batch_requests = 64;
  l.max_batch_options = 1 << 20;
  l.max_single_tokens = 8192;  // the GPU's steps start above 4 x 2,048
  l.request_tokens = 320;
  l.request_options = 9;
  return l;
}

void expect_within(const std::vector<WarmupForward>& plan, const WarmupLimits& l) {
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const WarmupForward& f : plan) {
    EXPECT_GE(f.requests, 1);
    EXPECT_LE(f.requests, l.max_batch_requests);
    EXPECT_LE(f.requests * l.request_options, l.max_batch_options);
    EXPECT_LE(f.tokens, l.max_single_tokens);
    if (f.requests > 1) EXPECT_LE(f.requests * f.tokens, l.max_batch_tokens);
    EXPECT_TRUE(seen.insert({f.requests, f.tokens}).second) << f.requests << " x " << f.tokens << " twice";
  }
}

TEST(Warmup, PlanMeetsEverySequenceBoundAndMBucketOfTheServersBatches) {
  const WarmupLimits l = serve_defaults();
  const std::vector<WarmupForward> plan = warmup_plan(l);
  expect_within(plan, l);
  std::vector<std::pair<int64_t, int64_t>> got;
  for (const auto& f : plan) got.push_back({f.requests, f.tokens});
  const std::vector<std::pair<int64_t, int64_t>> want = {{2, 320}, {4, 320}, {8, 320}, {16, 320}, {32, 320}, {51, 320}, {1, 2048}, {1, 8192}};
  EXPECT_EQ(got, want);
  // the GEMMs' m buckets above 512 (<= 2,048, <= 8,192, above) each first met by a batch of short
  // requests; the <= 512 one left to the first real request
  std::set<int> buckets;
  for (const auto& f : plan) {
    const int64_t m = f.requests * f.tokens;
    buckets.insert(m <= 512 ? 0 : m <= 2048 ? 1 : m <= 8192 ? 2 : 3);
  }
  EXPECT_EQ(buckets, (std::set<int>{1, 2, 3}));
}

TEST(Warmup, PlanStaysWithinSmallerLimits) {
  WarmupLimits l = serve_defaults();
  l.max_batch_requests = 6;
  std::vector<WarmupForward> plan = warmup_plan(l);
  expect_within(plan, l);
  ASSERT_GE(plan.size(), 3u);
  EXPECT_EQ(plan[2].requests, 6);  // 2, 4, then the most a forward holds
  l = serve_defaults();
  l.max_batch_options = 9 * 5;  // options bound it: 5 requests
  plan = warmup_plan(l);
  expect_within(plan, l);
  EXPECT_EQ(plan[2].requests, 5);
  l = serve_defaults();
  l.max_batch_tokens = 1000;  // tokens bound it: 3 requests
  l.max_single_tokens = 1000;
  plan = warmup_plan(l);
  expect_within(plan, l);
  ASSERT_EQ(plan.size(), 2u);  // 2, 3 requests; no 2,048 / 8,192-token request fits max_length
  EXPECT_EQ(plan[1].requests, 3);
  l.max_single_tokens = 200;  // not even one short request runs as one forward
  EXPECT_TRUE(warmup_plan(l).empty());
  l = serve_defaults();
  l.max_batch_requests = 1;
  plan = warmup_plan(l);
  expect_within(plan, l);
  ASSERT_EQ(plan.size(), 2u);  // no batch of short requests, only the long ones
  EXPECT_EQ(plan[0].tokens, 2048);
}

TEST(Warmup, RandomPrefixedShiftsEverySpanAndStaysInTheVocabulary) {
  Encoded e;
  e.input_ids = {5, 6, 7, 8, 9, 10};
  e.state_span = {1, 3};
  e.images.push_back({});
  e.images[0].pad_span = {3, 4};
  EncodedQuestion q;
  q.question_span = {4, 5};
  q.option_spans = {{5, 6}};
  e.questions.push_back(q);
  const Encoded p = random_prefixed(e, 100, 3, 600);
  ASSERT_EQ(p.input_ids.size(), 106u);
  for (size_t i = 0; i < 100; ++i) {
    EXPECT_GE(p.input_ids[i], 299);  // from vocab / 2 when that is under 2,000
    EXPECT_LT(p.input_ids[i], 600);
  }
  EXPECT_EQ(std::vector<int32_t>(p.input_ids.begin() + 100, p.input_ids.end()), e.input_ids);
  EXPECT_EQ(p.state_span.begin, 101);
  EXPECT_EQ(p.images[0].pad_span.begin, 103);
  EXPECT_EQ(p.questions[0].question_span.end, 105);
  EXPECT_EQ(p.questions[0].option_spans[0].begin, 105);
  EXPECT_EQ(random_prefixed(e, 100, 3, 600).input_ids, p.input_ids);  // seeded
  EXPECT_NE(random_prefixed(e, 100, 4, 600).input_ids, p.input_ids);
  EXPECT_EQ(random_prefixed(e, 0, 3).input_ids, e.input_ids);
  const Encoded big = random_prefixed(e, 1000, 3);  // no vocabulary given: 1,000 to 100,000
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_GE(big.input_ids[i], 1000);
    EXPECT_LE(big.input_ids[i], 100000);
  }
}

// The CPU engine has nothing to warm: the option is taken and nothing runs.
TEST(Warmup, CpuEngineSkipsIt) {
  CoreOptions co;
  co.device = Device::Cpu;
  auto core = EngineCore::load(test::source_path("tests/fixtures/oracle/tiny-b"), co);
  EngineOptions eo;
  eo.warmup = true;
  EXPECT_EQ(warm_up(*core, eo, RequestLimits{}), 0u);
}

}  // namespace
}  // namespace clefrt

#include "engine/warmup.h"

#include <algorithm>
#include <random>

#include "common/error.h"
#include "common/progress.h"
#include "engine/engine_core.h"
#include "model/batch.h"
#include "schema/request.h"

namespace clefrt {

Encoded random_prefixed(const Encoded& e, int64_t extra, uint64_t seed, int64_t vocab) {
  if (extra <= 0) return e;
  if (vocab == 1 || vocab < 0) throw Error(Status::Internal, "internal_error", "random_prefixed: a vocabulary of " + std::to_string(vocab) + " ids");
  Encoded p = e;
  std::mt19937_64 r(seed);
  const int64_t hi = vocab > 0 ? std::min<int64_t>(100000, vocab - 1) : 100000, lo = std::min<int64_t>(1000, hi / 2);
  std::uniform_int_distribution<int32_t> d{int32_t(lo), int32_t(hi)};
  p.input_ids.assign(size_t(extra), 0);
  for (auto& x : p.input_ids) x = d(r);
  p.input_ids.insert(p.input_ids.end(), e.input_ids.begin(), e.input_ids.end());
  auto shift = [&](Span& s) {
    s.begin += int32_t(extra);
    s.end += int32_t(extra);
  };
  shift(p.state_span);
  for (auto& im : p.images) shift(im.pad_span);
  for (auto& q : p.questions) {
    shift(q.question_span);
    for (auto& s : q.option_spans) shift(s);
  }
  return p;
}

std::vector<WarmupForward> warmup_plan(const WarmupLimits& l) {
  std::vector<WarmupForward> plan;
  if (l.request_tokens <= 0 || l.request_options <= 0) return plan;
  // as many short requests as one forward holds
  int64_t most = std::min({l.max_batch_requests, l.max_batch_tokens / l.request_tokens, l.max_batch_options / l.request_options});
  if (l.request_tokens > l.max_single_tokens) most = 0;
  // from 2 requests: the <= 512 bucket is left to the first real request (warmup.h)
  for (int64_t n = 2; n < most; n *= 2) plan.push_back({n, l.request_tokens});
  if (most >= 2) plan.push_back({most, l.request_tokens});
  for (int64_t t : {int64_t(2048), int64_t(8192)})
    if (t <= l.max_single_tokens && t > l.request_tokens) plan.push_back({1, t});
  return plan;
}

namespace {

// A request of the usual kind (the three question types, nine options): what the head runs for
// a forward of short requests. Its text does not matter; its ids are padded with random ones.
constexpr const char* kWarmupBody = R"({"state": "Our checkout is down and orders are blocked.",
 "questions": {
  "outage": {"type": "noul", "instructions": "Is a service down?"},
  "team": {"type": "choice", "instructions": "Which team should handle it?",
           "criteria": {"billing": "payments", "tech": "outages", "sales": null}},
  "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["No impact", "Minor", "Major", "Critical"]}}})";

}  // namespace

size_t warm_up(const EngineCore& core, const EngineOptions& opts, const RequestLimits& limits) {
  if (core.device() != Device::Cuda) return 0;
  Encoded base;
  try {
    base = core.encoder().encode(parse_request(std::string_view(kWarmupBody), limits));
  } catch (const Error&) {  // a max_length too short for its questions: requests that small have nothing to warm
    return 0;
  }
  int64_t options = 0;
  for (const auto& q : base.questions) options += int64_t(q.option_spans.size());
  WarmupLimits l;
  l.max_batch_tokens = int64_t(opts.max_batch_tokens);
  l.max_batch_requests = int64_t(opts.max_batch_requests);
  l.max_batch_options = core.max_batch_options();
  l.max_single_tokens = std::min(int64_t(opts.max_length), core.steps_above(int64_t(opts.step_tokens)));  // as the scheduler steps
  l.request_tokens = std::max(kWarmupRequestTokens, int64_t(base.input_ids.size()));
  l.request_options = options;
  const std::vector<WarmupForward> plan = warmup_plan(l);
  Progress progress(opts.progress, "warm-up", double(plan.size()), "forwards");
  uint64_t seed = 1;
  for (const WarmupForward& f : plan) {
    std::vector<Encoded> reqs;
    for (int64_t i = 0; i < f.requests; ++i) reqs.push_back(random_prefixed(base, f.tokens - int64_t(base.input_ids.size()), seed++, core.config().text.vocab));
    std::vector<const Encoded*> ptrs;
    for (const Encoded& e : reqs) ptrs.push_back(&e);
    try {
      core.warm_forward(model::batch_of(ptrs));
    } catch (const Error& e) {  // (a real batch of this size would fail the same way)
      throw Error(e.status(), e.type(),
                  "the warm-up's forward of " + std::to_string(f.requests) + " x " + std::to_string(f.tokens) + " tokens failed: " + e.message() +
                      " (`clefrt serve --no-warmup` starts without it)",
                  e.where());
    }
    progress.add(1);
  }
  progress.finish();
  return plan.size();
}

}  // namespace clefrt

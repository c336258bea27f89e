// Helpers of the prefix cache's tests (tests/test_prefix_cache.cpp on the CPU,
// tests/test_cuda_prefix.cpp on the GPU): seeded state texts, request bodies under three
// question sets, and batches submitted together through the public Engine.
#pragma once
#include <clefrt/clefrt.h>

#include <future>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/json.h"

namespace clefrt::test {

// About `words` words of seeded text (tokens ~ 1.3 x words).
inline std::string state_text(size_t words, uint32_t seed) {
  static const char* vocab[] = {"billing", "outage", "the", "customer", "reports", "that", "invoice", "was", "charged", "twice",
                                "server", "error", "page", "since", "Monday", "refund", "please", "urgent", "login", "fails",
                                "on", "mobile", "and", "desktop", "42", "2026-12-01", "EU-west", "latency", "spikes", "again"};
  std::mt19937 rng(seed);
  std::string s;
  for (size_t i = 0; i < words; ++i) {
    if (i) s += (rng() % 17 == 0) ? ".\n" : " ";
    s += vocab[rng() % (sizeof vocab / sizeof *vocab)];
  }
  return s;
}

inline std::string body(const std::string& state, int question_set) {
  json::Value b = json::Value::object();
  b.add("state", json::Value::string(state));
  const char* qs[] = {
      R"({"outage":{"type":"noul","instructions":"Is a service down?"},"team":{"type":"choice","criteria":{"billing":"payments","tech":"outages","sales":null}}})",
      R"({"severity":{"type":"score","criteria":["No impact","Minor","Major","Critical"]}})",
      R"({"refund":{"type":"noul","instructions":"Does the customer ask for a refund?"},"lang":{"type":"choice","criteria":{"en":null,"de":null}},"tone":{"type":"score","criteria":["calm","upset","furious"]}})"};
  b.add("questions", json::parse(qs[question_set % 3]));
  return json::write(b);
}

struct Answer {
  Probs probs;
  size_t cached = 0;
  size_t state_end = 0;
};

// Submitted together while the engine thread is held, so they run as one batch.
inline std::vector<Answer> run_batch(Engine& e, const std::vector<std::string>& bodies) {
  std::vector<std::promise<Outcome>> promises(bodies.size());
  std::vector<Answer> out(bodies.size());
  e.pause(true);
  for (size_t i = 0; i < bodies.size(); ++i) {
    Prepared p = e.prepare(bodies[i]);
    out[i].state_end = size_t(p.encoded().state_span.end);
    e.submit(p, std::chrono::steady_clock::time_point::max(), [pr = &promises[i]](const Prepared&, Outcome o) { pr->set_value(std::move(o)); });
  }
  e.pause(false);
  for (size_t i = 0; i < bodies.size(); ++i) {
    Outcome o = promises[i].get_future().get();
    if (o.kind == Outcome::Kind::Failed) std::rethrow_exception(o.error);
    EXPECT_EQ(o.kind, Outcome::Kind::Answered);
    out[i].probs = o.probs;
    out[i].cached = o.cached_tokens;
  }
  return out;
}
inline Answer run(Engine& e, const std::string& b) { return run_batch(e, {b})[0]; }

}  // namespace clefrt::test

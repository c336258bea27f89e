// Helpers of the prefix cache's tests (tests/test_prefix_cache.cpp on the CPU,
// tests/test_cuda_prefix.cpp on the GPU): seeded state texts, request bodies under three
// question sets, batches submitted together through the public Engine, and the checks both
// backends pass (at their own granularity).
#pragma once
#include <clefrt/clefrt.h>

#include <future>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/json.h"
#include "image/png_write.h"
#include "schema/images.h"

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

// The leading tokens a cache may cover at `granularity`-token boundaries.
inline size_t reusable(size_t state_end, size_t granularity) { return state_end / granularity * granularity; }

// States of each length in `words` asked three question sets on both engines: the same bits;
// the first question set computes the prefix, the others continue it. Returns the hits.
inline size_t check_warm_equals_cold(Engine& cold, Engine& warm, const std::vector<size_t>& words, size_t granularity) {
  size_t hits = 0;
  for (size_t n : words) {
    const std::string s = state_text(n, uint32_t(n));
    for (int qset = 0; qset < 3; ++qset) {
      const Answer c = run(cold, body(s, qset)), w = run(warm, body(s, qset));
      EXPECT_EQ(c.cached, 0u);
      EXPECT_EQ(w.probs, c.probs) << n << " words, question set " << qset << ", " << w.cached << " tokens from the cache";
      EXPECT_EQ(w.cached, qset == 0 ? 0 : reusable(w.state_end, granularity)) << n << " words";
      if (w.cached) ++hits;
    }
  }
  return hits;
}

// body(state, qset) with these PNG files as its images.
inline std::string with_images(const std::string& state, int qset, const std::vector<const std::string*>& pngs) {
  json::Value b = json::parse(body(state, qset));
  json::Value arr = json::Value::array();
  for (const std::string* png : pngs) arr.arr.push_back(json::Value::string("data:image/png;base64," + base64_encode(*png)));
  b.add("images", arr);
  return json::write(b);
}

// Images are in the key by their bytes: the same image and state under another question set
// continue the cached prefix past the image; another image of the same size (the same token
// ids) never reads the state after the first one; every answer is the cold engine's.
inline void check_images_keyed_by_bytes(Engine& warm, Engine& cold, size_t granularity) {
  const std::string s = state_text(400, 5);
  std::vector<uint8_t> noise(256 * 256 * 3);
  std::mt19937 rng(9);
  for (auto& v : noise) v = uint8_t(rng());
  const std::string x = synthetic_png(256, 256), y = encode_png_rgb(noise.data(), 256, 256);
  const Prepared probe = warm.prepare(with_images(s, 0, {&x}));
  ASSERT_EQ(probe.encoded().images.size(), 1u);
  const Span image = probe.encoded().images[0].pad_span;
  ASSERT_LT(size_t(image.end), reusable(size_t(probe.encoded().state_span.end), granularity));  // the reusable prefix holds the image
  const Answer a = run(warm, with_images(s, 0, {&x}));
  EXPECT_EQ(a.cached, 0u);
  EXPECT_EQ(a.probs, run(cold, with_images(s, 0, {&x})).probs);
  const Answer b = run(warm, with_images(s, 1, {&x}));
  EXPECT_EQ(b.cached, reusable(b.state_end, granularity)) << "the same image and state: a hit";
  EXPECT_EQ(b.probs, run(cold, with_images(s, 1, {&x})).probs);
  const Answer c = run(warm, with_images(s, 1, {&y}));
  EXPECT_LE(c.cached, size_t(image.begin)) << "another image never reads the state after the first one";
  EXPECT_EQ(c.probs, run(cold, with_images(s, 1, {&y})).probs);
  EXPECT_NE(c.probs, b.probs) << "the image matters to the answer";
}

// The bytes the cached prefix of a request on `state` takes on an engine from open(budget_gib).
template <class Open>
size_t one_entry_bytes(const Open& open, const std::string& state) {
  auto probe = open(1.0);
  run(*probe, body(state, 0));
  return probe->prefix_cache().bytes;
}

// Two states taking turns under a budget with room for one of them: every answer is the cold
// engine's; a hit only right after the same state; three evictions, two hits.
inline void check_eviction_keeps_answers(Engine& cold, Engine& warm, const std::string& a, const std::string& b) {
  const std::vector<std::pair<const std::string*, bool>> order = {{&a, false}, {&b, false}, {&a, false}, {&a, true}, {&b, false}, {&b, true}};
  for (size_t i = 0; i < order.size(); ++i) {
    const int qset = int(i % 3);
    const Answer w = run(warm, body(*order[i].first, qset));
    EXPECT_EQ(w.probs, run(cold, body(*order[i].first, qset)).probs) << "step " << i;
    EXPECT_EQ(w.cached > 0, order[i].second) << "step " << i;
  }
  const PrefixCacheStats st = warm.prefix_cache();
  EXPECT_EQ(st.entries, 1u);
  EXPECT_LE(st.bytes, st.budget_bytes);
  EXPECT_EQ(st.evictions, 3u);  // a by b, b by a, a by b
  EXPECT_EQ(st.hits, 2u);
}

}  // namespace clefrt::test

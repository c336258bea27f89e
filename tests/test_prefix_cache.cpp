// The prefix cache on the CPU engine (engine/prefix_cache.h, model/sequence_forward.h): an answer
// that continues a cached prefix is the answer without the cache, bit for bit, across prefix
// lengths, batch mixes and evictions; the counters say what happened.
#include <gtest/gtest.h>

#include <clefrt/clefrt.h>

#include <future>
#include <random>
#include <string>
#include <vector>

#include "common/json.h"
#include "engine/prefix_cache.h"
#include "image/png_write.h"
#include "schema/images.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "model/sequence_forward.h"
#include "model/synth.h"
#include "model/weights.h"
#include "prefix_util.h"
#include "test_util.h"

namespace clefrt {
namespace {

using test::Answer;
using test::body;
using test::run;
using test::run_batch;
using test::state_text;

const std::string& tiny_dir() {
  static const std::string d = test::synth_folder("prefix", 11);
  return d;
}

std::unique_ptr<Engine> open(double cache_gib) {
  EngineOptions o;
  o.device = Device::Cpu;
  o.threads = 2;
  o.prefix_cache_gib = cache_gib;
  o.max_length = 16384;
  return Engine::load(tiny_dir(), o);
}

size_t reusable(size_t state_end) { return test::reusable(state_end, 256); }  // the CPU's chunk

TEST(PrefixCache, WarmEqualsColdBitForBitAcrossPrefixLengths) {
  auto cold = open(0), warm = open(1);
  // states from a few tokens to ~10,000 (one crosses no chunk boundary, the others land anywhere in a chunk)
  const size_t hits = test::check_warm_equals_cold(*cold, *warm, {2, 150, 200, 420, 1000, 2300, 7600}, 256);
  const PrefixCacheStats st = warm->prefix_cache();
  EXPECT_TRUE(st.enabled);
  EXPECT_EQ(st.granularity, 256);
  EXPECT_EQ(st.hits, hits);
  EXPECT_GE(hits, 10u);
  EXPECT_GT(st.hit_tokens, 9000u * 2);
  EXPECT_GT(st.bytes, 0u);
  EXPECT_FALSE(cold->prefix_cache().enabled);
}

// Images are in the key by their bytes (test::check_images_keyed_by_bytes).
TEST(PrefixCache, ImagesAreKeyedByTheirBytes) {
  auto warm = open(1.0), cold = open(0);
  test::check_images_keyed_by_bytes(*warm, *cold, 256);
}

TEST(PrefixCache, BatchMixesGiveEachRequestItsColdAnswer) {
  auto cold = open(0), warm = open(1);
  const std::string a = state_text(600, 1), b = state_text(900, 2), c = state_text(30, 3);
  // one batch: a twice (the second continues the first's prefix, inserted earlier in the same
  // batch), b, a short one that caches nothing, a state that extends a's text
  const std::vector<std::string> bodies = {body(a, 0), body(b, 1), body(a, 2), body(c, 0), body(a + " and more words after it", 1), body(b, 2)};
  const auto w = run_batch(*warm, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(w[i].probs, run(*cold, bodies[i]).probs) << "request " << i;
  EXPECT_EQ(w[0].cached, 0u);
  EXPECT_EQ(w[2].cached, reusable(w[2].state_end));
  EXPECT_EQ(w[3].cached, 0u);
  EXPECT_GT(w[4].cached, 0u);  // a's boundary, or a longer one of its own
  EXPECT_LE(w[4].cached, reusable(w[4].state_end));
  EXPECT_EQ(w[5].cached, reusable(w[5].state_end));
  // and again, all from the cache now
  const auto again = run_batch(*warm, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(again[i].probs, w[i].probs) << "request " << i;
    EXPECT_EQ(again[i].cached, reusable(again[i].state_end)) << "request " << i;
  }
}

TEST(PrefixCache, EvictionUnderATinyBudgetKeepsAnswersExact) {
  const std::string a = state_text(700, 4), b = state_text(700, 5);
  const size_t one = test::one_entry_bytes([](double gib) { return open(gib); }, a);
  ASSERT_GT(one, 0u);
  auto cold = open(0);
  auto warm = open(double(one) * 1.5 / double(size_t(1) << 30));  // room for one of a, b
  test::check_eviction_keeps_answers(*cold, *warm, a, b);
}

TEST(PrefixCache, OffMeansNoLookupsAndZeroCachedTokens) {
  auto e = open(0);
  const std::string s = state_text(800, 6);
  EXPECT_EQ(run(*e, body(s, 0)).cached, 0u);
  EXPECT_EQ(run(*e, body(s, 1)).cached, 0u);
  const PrefixCacheStats st = e->prefix_cache();
  EXPECT_FALSE(st.enabled);
  EXPECT_EQ(st.hits + st.misses, 0u);
  // the response says so
  const json::Value r = json::parse(e->decide(body(s, 2)));
  EXPECT_EQ(r.find("usage")->find("cached_tokens")->i, 0);
}

TEST(PrefixCache, DecideReportsCachedTokensInUsage) {
  auto e = open(1);
  const std::string s = state_text(800, 7);
  const json::Value first = json::parse(e->decide(body(s, 0)));
  const json::Value second = json::parse(e->decide(body(s, 1)));
  EXPECT_EQ(first.find("usage")->find("cached_tokens")->i, 0);
  const int64_t n = second.find("usage")->find("cached_tokens")->i;
  EXPECT_GT(n, 0);
  EXPECT_EQ(n % 256, 0);
  EXPECT_LT(n, second.find("usage")->find("input_tokens")->i);
}

// The comparisons above can fail: a prefix state from another state's text, continued as if it
// were this request's, changes the answer.
TEST(PrefixCache, AWrongPrefixStateChangesTheAnswer) {
  const std::string dir = tiny_dir();
  auto e = open(0);
  const Prepared pa = e->prepare(body(state_text(600, 8), 0)), pb = e->prepare(body(state_text(600, 9), 0));
  // the backbone and head at the model level, as the engine runs them
  const model::ModelConfig cfg = model::load_config(dir);
  io::TensorStore backbone = io::TensorStore::open_folder(dir);
  io::TensorStore head;
  head.add_file(dir + "/joint_head.safetensors");
  const model::TextWeights tw = model::load_text_weights(backbone, cfg.text, model::LoadMode::Full);
  const model::HeadWeights hw = model::load_head_weights(head, cfg.head);
  const model::Sequence a = model::sequence_of(pa.encoded()), b = model::sequence_of(pb.encoded());
  ASSERT_GE(a.prefix_limit, 512);
  // each run whole, its state taken at 512 on the way
  auto whole = [&](const model::Sequence& e, model::PrefixState& at512) {
    model::SequenceRunner r(tw, hw, cfg, e, model::GdnForm::Chunked);
    r.advance(512);
    at512 = r.snapshot();
    r.advance(e.length);
    return r.finish();
  };
  auto from = [&](const model::Sequence& e, const model::PrefixState& st) {
    model::SequenceRunner r(tw, hw, cfg, e, model::GdnForm::Chunked, &st);
    r.advance(e.length);
    return r.finish();
  };
  model::PrefixState sa, sb;
  const auto pa_cold = whole(a, sa);
  whole(b, sb);
  EXPECT_EQ(from(a, sa), pa_cold);
  EXPECT_NE(from(a, sb), pa_cold);
  EXPECT_EQ(pa_cold, e->probs({&pa})[0]);
}

struct FakeState : CachedState {
  size_t n;
  explicit FakeState(size_t b) : n(b) {}
  size_t bytes() const override { return n; }
};

TEST(PrefixCache, LongestMatchLruAndHeldEntries) {
  std::vector<int32_t> ids(1024);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 + 3);
  PrefixCache c(10000, 256);
  c.insert(ids.data(), 256, std::make_shared<FakeState>(1000));
  c.insert(ids.data(), 768, std::make_shared<FakeState>(1000));
  auto hit = c.find(ids.data(), 1024);  // the longest cached boundary within the limit
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->ids.size(), 768u);
  EXPECT_EQ(c.find(ids.data(), 700)->ids.size(), 256u);  // 768 is past the limit
  std::vector<int32_t> other = ids;
  other[300] = 5;  // differs inside the second block: only the first boundary matches
  EXPECT_EQ(c.find(other.data(), 1024)->ids.size(), 256u);
  other[0] = 5;
  EXPECT_FALSE(c.find(other.data(), 1024));
  // an entry a running batch holds (`hit`, the least recently used now) is not evicted: the
  // 256 entry goes instead
  other[0] = ids[0];
  c.insert(other.data(), 512, std::make_shared<FakeState>(2500));  // 4,548 bytes over the 6,096 held
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_EQ(c.stats().entries, 2u);
  EXPECT_EQ(c.find(ids.data(), 1024)->ids.size(), 768u);
  EXPECT_EQ(c.find(ids.data(), 300), nullptr);
  EXPECT_EQ(c.find(other.data(), 1024)->ids.size(), 512u);
  c.insert(ids.data(), 1024, std::make_shared<FakeState>(20000));  // over the budget alone
  EXPECT_EQ(c.stats().too_large, 1u);
  EXPECT_LE(c.stats().bytes, 10000u);
}

// An insert that cannot fit for the entries running batches hold evicts nothing.
TEST(PrefixCache, ARefusedInsertEvictsNothing) {
  PrefixCache c(1000, 1);
  const int32_t a[1] = {1}, b[1] = {2}, d[1] = {3};
  c.insert(a, 1, std::make_shared<FakeState>(596));  // 600 bytes with its id
  c.insert(b, 1, std::make_shared<FakeState>(196));  // 200
  auto held = c.find(a, 1);
  ASSERT_TRUE(held);
  EXPECT_FALSE(c.would_keep(a, 1, 10));  // cached already
  EXPECT_FALSE(c.would_keep(d, 1, 2000));  // over the budget alone
  EXPECT_TRUE(c.would_keep(d, 1, 496));
  c.insert(d, 1, std::make_shared<FakeState>(496));  // 500: would fit only by evicting the held one
  PrefixCacheStats st = c.stats();
  EXPECT_EQ(st.too_large, 1u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.entries, 2u);
  EXPECT_TRUE(c.find(b, 1));
  held.reset();  // the batch ended: now it can go
  c.insert(d, 1, std::make_shared<FakeState>(496));
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_TRUE(c.find(d, 1));
}

// make_room (the GPU frees entries before it allocates a new one) follows insert's rule: it
// evicts only when that makes room, and says whether it did.
TEST(PrefixCache, MakeRoomEvictsOnlyWhenThatMakesRoom) {
  PrefixCache c(1000, 1);
  const int32_t a[1] = {1}, b[1] = {2};
  c.insert(a, 1, std::make_shared<FakeState>(596));  // 600 bytes with its id
  c.insert(b, 1, std::make_shared<FakeState>(196));  // 200
  auto held = c.find(a, 1);
  EXPECT_FALSE(c.make_room(1, 496));  // 500 fits only without the held entry
  EXPECT_EQ(c.stats().evictions, 0u);
  EXPECT_EQ(c.stats().too_large, 1u);
  EXPECT_TRUE(c.make_room(1, 296));  // 300: b goes
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_EQ(c.stats().entries, 1u);
  EXPECT_TRUE(c.make_room(1, 196));  // fits already: nothing goes
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_FALSE(c.make_room(1, 5000));  // over the budget alone
}

// The host tier (the GPU's prefixes in pinned host memory; here a fake copy): what the budget
// evicts is copied there rather than dropped, a hit there says so (host) and counts, its own
// budget evicts its least recently used entries, a copy that fails drops the entry, a prefix
// already there is not copied again, and a copy back that fails counts as a miss.
struct FakeHostCopy : CachedState {
  size_t n;
  explicit FakeHostCopy(size_t b) : n(b) {}
  size_t bytes() const override { return n; }
};

TEST(PrefixCache, HostTierKeepsWhatTheBudgetEvicts) {
  int copies = 0;
  bool fail = false;
  HostTier host;
  host.budget_bytes = 1300;
  host.copy_out = [&](const CachedState& st) -> std::shared_ptr<const CachedState> {
    ++copies;
    if (fail) return nullptr;
    EXPECT_TRUE(dynamic_cast<const FakeState*>(&st)) << "the host tier copies the backend's states only";
    return std::make_shared<FakeHostCopy>(st.bytes());
  };
  PrefixCache c(1000, 1, host);
  EXPECT_EQ(c.stats().host_budget_bytes, 1300u);
  const int32_t a[1] = {1}, b[1] = {2}, d[1] = {3}, e[1] = {4};
  c.insert(a, 1, std::make_shared<FakeState>(596));  // 600 bytes with its id
  c.insert(b, 1, std::make_shared<FakeState>(596));  // a goes to the host tier
  PrefixCacheStats st = c.stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.to_host, 1u);
  EXPECT_EQ(st.host_entries, 1u);
  EXPECT_EQ(st.host_bytes, 600u);
  EXPECT_EQ(st.entries, 1u);
  auto hit = c.find(a, 1);
  ASSERT_TRUE(hit);
  EXPECT_TRUE(hit->host);
  EXPECT_TRUE(dynamic_cast<const FakeHostCopy*>(hit->state.get()));
  EXPECT_FALSE(c.find(b, 1)->host);
  st = c.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.host_hits, 1u);
  EXPECT_EQ(st.host_hit_tokens, 1u);
  // the backend could not copy it back: a miss after all
  c.copy_back_failed(*hit);
  st = c.stats();
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.host_hits, 0u);
  EXPECT_EQ(st.host_hit_tokens, 0u);
  EXPECT_EQ(st.misses, 1u);
  // copied back (insert), then evicted again: already in the host tier, not copied twice
  c.insert(a, 1, std::make_shared<FakeState>(596));  // b to the host tier
  EXPECT_EQ(copies, 2);
  c.insert(d, 1, std::make_shared<FakeState>(596));  // a again: its host copy moves to the front
  EXPECT_EQ(copies, 2);
  st = c.stats();
  EXPECT_EQ(st.host_entries, 2u);
  EXPECT_EQ(st.to_host, 2u);
  // the host budget (1,300) holds two: a third evicts the least recently used one not held (b)
  hit.reset();
  c.insert(e, 1, std::make_shared<FakeState>(596));  // d to the host tier, b out of it
  st = c.stats();
  EXPECT_EQ(st.host_entries, 2u);
  EXPECT_EQ(st.host_evictions, 1u);
  EXPECT_LE(st.host_bytes, 1300u);
  EXPECT_FALSE(c.find(b, 1));
  EXPECT_TRUE(c.find(a, 1)->host);
  EXPECT_TRUE(c.find(d, 1)->host);
  // a copy that fails: the entry goes, and nothing made room for it
  fail = true;
  const int32_t f[1] = {5}, g[1] = {6};
  c.insert(f, 1, std::make_shared<FakeState>(596));  // e would go to the host tier
  EXPECT_EQ(copies, 4);
  st = c.stats();
  EXPECT_EQ(st.to_host, 3u);  // a, b and d: not the copy that failed
  EXPECT_EQ(st.host_entries, 2u);
  EXPECT_EQ(st.host_evictions, 1u);
  EXPECT_FALSE(c.find(e, 1));
  // a host entry a running batch holds (d, the least recently used) stays; a goes instead
  fail = false;
  auto held = c.find(d, 1);
  EXPECT_TRUE(c.find(a, 1));
  c.insert(g, 1, std::make_shared<FakeState>(596));  // f to the host tier
  st = c.stats();
  EXPECT_EQ(st.host_evictions, 2u);
  EXPECT_TRUE(c.find(d, 1));
  EXPECT_FALSE(c.find(a, 1));
  EXPECT_TRUE(c.find(f, 1)->host);
  held.reset();
  // over the host budget alone: not copied
  fail = false;
  PrefixCache small(1000, 1, HostTier{100, host.copy_out});
  small.insert(a, 1, std::make_shared<FakeState>(596));
  small.insert(b, 1, std::make_shared<FakeState>(596));
  EXPECT_EQ(small.stats().host_entries, 0u);
  EXPECT_FALSE(small.find(a, 1));
}

// The host tier is a GPU engine's: the CPU engine refuses it (its cache is in host memory
// already), and without a cache there is nothing to tier.
TEST(PrefixCache, HostTierIsAGpuOption) {
  EngineOptions o;
  o.device = Device::Cpu;
  o.prefix_cache_gib = 0.5;
  o.prefix_cache_host_gib = 1;
  auto refused = [&](const char* what, const std::string& says) {
    try {
      Engine::load(tiny_dir(), o);
      ADD_FAILURE() << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.http_status(), 400) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("a CPU engine took a host tier", "--prefix-cache-host-gib");
  o.prefix_cache_gib = 0;
  refused("a host tier without a cache", "prefix_cache_gib 0");
}

// The GPU takes a budget too (tests/test_cuda_prefix.cpp); without a GPU the device is the
// complaint, never the cache.
TEST(PrefixCache, CudaTakesABudgetOrNamesTheMissingGpu) {
  EngineOptions o;
  o.device = Device::Cuda;
  o.prefix_cache_gib = 0.5;
  std::string why;
  if (cuda_available(&why)) {
    auto e = Engine::load(tiny_dir(), o);
    EXPECT_TRUE(e->prefix_cache().enabled);
    EXPECT_EQ(e->prefix_cache().granularity, 64);
    return;
  }
  try {
    Engine::load(tiny_dir(), o);
    FAIL() << "loaded without a GPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.http_status(), 503) << m;
    EXPECT_EQ(m.find("prefix cache"), std::string::npos) << m;
  }
}

// Refused at load, naming the flag with the number as asked (not 1000000.000000).
TEST(PrefixCache, ABudgetOverTheMemoryLeftIsRefused) {
  try {
    open(1e6);  // a million GiB
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 503);
    EXPECT_EQ(e.type(), "insufficient_memory");
    EXPECT_NE(std::string(e.what()).find("--prefix-cache-gib 1000000.0 is over half of the host memory"), std::string::npos) << e.what();
  }
}

TEST(PrefixCache, MaxLengthIsAtMostTheWindow) {
  EngineOptions o;
  o.device = Device::Cpu;
  o.max_length = 65537;
  try {
    Engine::load(tiny_dir(), o);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 65536"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace clefrt

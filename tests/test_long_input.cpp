// Long inputs on the CPU engine: a 60,000-token request at Clef's full window (max_length 65,536)
// is answered, the state kept whole, in chunks that carry the backbone's state (model/forward.h).
#include <gtest/gtest.h>

#include <clefrt/clefrt.h>

#include <chrono>
#include <cmath>
#include <future>
#include <thread>
#include <string>

#include "common/json.h"
#include "test_util.h"

namespace clefrt {
namespace {

TEST(LongInput, SixtyThousandTokensAtTheFullWindowOnTheCpu) {
  const std::string dir = test::synth_folder("long", 12);
  EngineOptions o;
  o.device = Device::Cpu;
  o.max_length = kMaxContext;
  auto e = Engine::load(dir, o);
  std::string state;
  for (int i = 0; state.size() < 194000; ++i) state += "line " + std::to_string(i) + ": the invoice was charged twice\n";
  json::Value b = json::Value::object();
  b.add("state", json::Value::string(state));
  b.add("questions", json::parse(R"({"outage":{"type":"noul","instructions":"Is a service down?"},"team":{"type":"choice","criteria":{"billing":null,"tech":null}}})"));
  const Prepared p = e->prepare(json::write(b));
  ASSERT_GE(p.input_tokens(), 60000u);
  ASSERT_LE(p.input_tokens(), kMaxContext);
  EXPECT_EQ(p.encoded().state_tokens_dropped, 0u);
  const json::Value r = json::parse(p.answer(e->probs({&p})[0], {}));
  EXPECT_EQ(size_t(r.find("usage")->find("input_tokens")->i), p.input_tokens());
  EXPECT_EQ(r.find("usage")->find("state_tokens_dropped"), nullptr);
  const double pt = r.find("answers")->find("outage")->find("noul")->d;
  EXPECT_TRUE(std::isfinite(pt) && pt >= 0 && pt <= 1) << pt;
  // the same state beyond the window is cut, and says so
  o.max_length = 16384;
  auto shorter = Engine::load(dir, o);
  const Prepared cut = shorter->prepare(json::write(b));
  EXPECT_EQ(cut.input_tokens(), 16384u);
  EXPECT_GT(cut.encoded().state_tokens_dropped, 40000u);
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

std::string long_body(size_t chars) {
  std::string state;
  for (int i = 0; state.size() < chars; ++i) state += "entry " + std::to_string(i) + ": the payment failed and was retried\n";
  json::Value b = json::Value::object();
  b.add("state", json::Value::string(state));
  b.add("questions", json::parse(R"({"q":{"type":"noul","instructions":"Did a payment fail?"}})"));
  return json::write(b);
}

EngineOptions cpu_options(double prefix_cache_gib = -1) {
  EngineOptions o;
  o.device = Device::Cpu;
  o.threads = 2;
  o.max_length = 32768;
  o.prefix_cache_gib = prefix_cache_gib;
  return o;
}

// A long request runs in steps (scheduler.h step_tokens) with the short requests that arrive
// meanwhile answered between them; its own answer is what it gets alone.
TEST(LongInput, ALongRequestDoesNotStallShortOnes) {
  const std::string dir = test::synth_folder("long", 12);
  auto e = Engine::load(dir, cpu_options());
  using C = std::chrono::steady_clock;
  const Prepared big = e->prepare(long_body(40000));  // ~12,000 tokens
  ASSERT_GT(big.input_tokens(), 10000u);
  std::promise<std::pair<Outcome, C::time_point>> big_done;
  e->submit(big, C::time_point::max(), [&](const Prepared&, Outcome out) { big_done.set_value({std::move(out), C::now()}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it is running now
  std::vector<C::time_point> short_done;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = C::now();
    e->decide(R"({"state":"short ticket )" + std::to_string(i) + R"(","questions":{"q":{"type":"noul"}}})");
    short_done.push_back(C::now());
    EXPECT_LT(std::chrono::duration<double>(C::now() - t0).count(), 3.0) << "short request " << i << " waited for the long one";
  }
  auto [out, big_end] = big_done.get_future().get();
  ASSERT_EQ(out.kind, Outcome::Kind::Answered);
  for (auto t : short_done) EXPECT_LT(t, big_end) << "a short request ended after the long one";
  // the same bits as the long request alone on an engine without a cache
  auto alone = Engine::load(dir, cpu_options(0));
  const Prepared again = alone->prepare(long_body(40000));
  EXPECT_EQ(alone->probs({&again})[0], out.probs);
}

TEST(LongInput, ACancelledLongRequestStopsBetweenSteps) {
  const std::string dir = test::synth_folder("long", 12);
  auto e = Engine::load(dir, cpu_options());
  using C = std::chrono::steady_clock;
  std::promise<Outcome> done;
  // ~32,000 tokens (cut to the context): seconds of work alone on two cores
  auto ticket = e->submit(e->prepare(long_body(200000)), C::time_point::max(), [&](const Prepared&, Outcome out) { done.set_value(std::move(out)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto t0 = C::now();
  ticket->cancel();
  EXPECT_EQ(done.get_future().get().kind, Outcome::Kind::Cancelled);
  // its work stops at the next step: a short request answers long before the whole would have run
  e->decide(R"({"state":"after","questions":{"q":{"type":"noul"}}})");
  EXPECT_LT(std::chrono::duration<double>(C::now() - t0).count(), 3.0);
}

}  // namespace
}  // namespace clefrt

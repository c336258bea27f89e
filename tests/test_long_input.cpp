// Long inputs on the CPU engine: a 60,000-token request at Clef's full window (max_length 65,536)
// is answered, the state kept whole, in chunks that carry the backbone's state (model/forward.h).
#include <gtest/gtest.h>

#include <clefrt/clefrt.h>

#include <cmath>
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

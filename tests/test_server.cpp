// `clefrt serve` in-process on the CPU engine with a synthesized tiny model: every endpoint and
// error path, 64 concurrent clients (each answer equal to the same request answered alone),
// queue-full and timeout behaviour, hostile bodies, graceful shutdown.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "common/json.h"
#include "model/synth.h"
#include "schema/request.h"
#include "server/server.h"
#include "test_server_util.h"
#include "test_util.h"

namespace clefrt::server {
namespace {

using namespace test_server;

std::string request_n(int i) {
  return R"({"state":"ticket )" + std::to_string(i) + std::string(size_t(i % 7) * 40, 'x') +
         R"(","questions":{"q":{"type":"choice","criteria":{"a":null,"b":"bee","c":null}},"s":{"type":"score","criteria":["lo","mid","hi"]}}})";
}

// The Decision Index kit's checks: every question answered, every option present, p in [0,1],
// a question's probabilities summing to 1 within 0.01.
void kit_checks(const std::string& req_body, const std::string& resp_body) {
  json::Value req = json::parse(req_body), resp = json::parse(resp_body);
  const json::Value* answers = resp.find("answers");
  ASSERT_NE(answers, nullptr) << resp_body;
  for (const auto& [id, q] : req.find("questions")->obj) {
    const json::Value* a = answers->find(id);
    ASSERT_NE(a, nullptr) << "question " << id << " unanswered";
    const std::string type = q.find("type")->s;
    if (type == "noul") {
      const double p = a->find("noul")->d;
      EXPECT_TRUE(p >= 0 && p <= 1);
      continue;
    }
    const json::Value* ps = a->find("probabilities");
    ASSERT_NE(ps, nullptr);
    const json::Value& crit = *q.find("criteria");
    EXPECT_EQ(ps->obj.size(), crit.is_array() ? crit.arr.size() : crit.obj.size());
    double sum = 0;
    for (const auto& [k, v] : ps->obj) {
      EXPECT_TRUE(v.d >= 0 && v.d <= 1);
      sum += v.d;
    }
    EXPECT_NEAR(sum, 1.0, 0.01);
  }
}

TEST(Server, EndpointsAnswer) {
  Running r{ServerOptions{}};
  auto c = r.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_NE(h->body.find("\"device\":\"cpu\""), std::string::npos);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("\"id\":\"clef\""), std::string::npos);
  auto a = c.Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 200) << a->body;
  kit_checks(kBlog, a->body);
  auto d = c.Post("/v1/decisions", kBlog, "application/json");  // System One body there too
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200);
  EXPECT_EQ(d->body, a->body);
  const std::string oai = R"({"model":"clef","input":"checkout is down","questions":[
    {"type":"predicate","name":"outage","instructions":"Is a service down?"},
    {"type":"choice","name":"team","choices":[{"value":"billing","description":"payments"},{"value":"tech"}]},
    {"type":"score","name":"sev","levels":[{"label":"low"},{"label":"high"}]}]})";
  auto o = c.Post("/v1/decisions", oai, "application/json");
  ASSERT_TRUE(o);
  ASSERT_EQ(o->status, 200) << o->body;
  json::Value v = json::parse(o->body);
  ASSERT_TRUE(v.find("answers")->is_array());
  EXPECT_EQ(v.find("answers")->arr.size(), 3u);
  EXPECT_NE(v.find("answers")->arr[0].find("probability"), nullptr);
  EXPECT_EQ(v.find("answers")->arr[1].find("probabilities")->arr.size(), 2u);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  for (const char* k : {"clefrt_requests_total{endpoint=\"/v1/systemone\",status=\"200\"} 1", "clefrt_request_duration_seconds_bucket",
                        "clefrt_batch_tokens_bucket", "clefrt_queue_depth", "clefrt_prompt_tokens_total", "clefrt_device_memory_bytes",
                        // bucket bounds in their shortest spelling: queries match the label as text
                        "le=\"0.005\"", "le=\"2.5\""})
    EXPECT_NE(met->body.find(k), std::string::npos) << k;
  EXPECT_EQ(met->body.find("0.0050000"), std::string::npos);
}

// The prefix cache through HTTP: the second question set on one state says how many tokens came
// from the cache, answers as the cache-free engine does, and /metrics counts it.
TEST(Server, PrefixCacheHitsShowInUsageAndMetrics) {
  Running r{ServerOptions{}};
  auto c = r.client();
  std::string state;
  for (int i = 0; i < 150; ++i) state += "order " + std::to_string(i) + " was charged twice. ";
  const std::string a = R"({"state":")" + state + R"(","questions":{"q":{"type":"noul","instructions":"Is it a billing issue?"}}})";
  const std::string b = R"({"state":")" + state + R"(","questions":{"t":{"type":"choice","criteria":{"billing":null,"tech":null}}}})";
  auto ra = c.Post("/v1/systemone", a, "application/json");
  auto rb = c.Post("/v1/systemone", b, "application/json");
  ASSERT_TRUE(ra && rb);
  ASSERT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(json::parse(ra->body).find("usage")->find("cached_tokens")->i, 0);
  const int64_t cached = json::parse(rb->body).find("usage")->find("cached_tokens")->i;
  EXPECT_GT(cached, 0);
  EXPECT_EQ(cached % 256, 0);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  for (const std::string k : {std::string("clefrt_prefix_cache_hits_total 1\n"), "clefrt_prefix_cache_hit_tokens_total " + std::to_string(cached) + "\n",
                              std::string("clefrt_prefix_cache_misses_total 1\n"), std::string("clefrt_prefix_cache_entries 1\n"),
                              std::string("clefrt_prefix_cache_evictions_total 0\n")})
    EXPECT_NE(met->body.find(k), std::string::npos) << k << met->body;
  EXPECT_EQ(met->body.find("clefrt_prefix_cache_bytes 0\n"), std::string::npos);
}

// Operations (issue 22): CORS for the allowed origin only (preflight and answers), a cut state
// reported in usage.state_tokens_dropped (absent when nothing was cut), /health's version and
// format, and latency histograms by endpoint and outcome.
TEST(Server, CorsTruncationHealthAndLatencyByEndpoint) {
  ServerOptions so;
  so.cors_origins = {"https://app.example"};
  Running r{so, [] {
              EngineOptions eo;
              eo.device = Device::Cpu;
              eo.threads = 2;
              eo.max_length = 400;
              return Engine::load(tiny_dir(), eo);
            }};
  auto c = r.client();
  httplib::Headers from_app = {{"Origin", "https://app.example"}, {"Access-Control-Request-Method", "POST"}};
  auto pre = c.Options("/v1/systemone", from_app);
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  auto other = c.Options("/v1/systemone", httplib::Headers{{"Origin", "https://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 405);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto a = c.Post("/v1/systemone", from_app, kBlog, "application/json");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 200) << a->body;
  EXPECT_EQ(a->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(a->body.find("state_tokens_dropped"), std::string::npos) << "nothing was cut: " << a->body;
  const std::string long_state = R"({"state":")" + std::string(3000, 'x') + R"(","questions":{"q":{"type":"noul"}}})";
  auto cut = c.Post("/v1/systemone", long_state, "application/json");
  ASSERT_TRUE(cut);
  ASSERT_EQ(cut->status, 200) << cut->body;
  const json::Value v = json::parse(cut->body);
  const json::Value* dropped = v.find("usage")->find("state_tokens_dropped");
  ASSERT_NE(dropped, nullptr) << cut->body;
  EXPECT_GT(dropped->i, 0);
  EXPECT_LE(v.find("usage")->find("input_tokens")->i, 400);
  EXPECT_FALSE(cut->has_header("Access-Control-Allow-Origin"));  // no Origin sent
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_NE(h->body.find("\"format\":\"f32\""), std::string::npos) << h->body;
  EXPECT_NE(h->body.find("\"version\":\"clefrt "), std::string::npos) << h->body;
  EXPECT_EQ(c.Post("/v1/systemone", "{", "application/json")->status, 400);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  for (const char* k : {"clefrt_request_duration_seconds_count{endpoint=\"/v1/systemone\",outcome=\"answered\"} 3",  // the preflight too
                        "clefrt_request_duration_seconds_count{endpoint=\"/v1/systemone\",outcome=\"refused\"} 2",
                        "clefrt_request_duration_seconds_count{endpoint=\"/health\",outcome=\"answered\"} 1"})
    EXPECT_NE(met->body.find(k), std::string::npos) << k << "\n" << met->body;
}

TEST(Server, ErrorsHaveProtocolStatusesAndBodies) {
  ServerOptions so;
  so.api_key = "s3cret";
  Running r{so};
  auto c = r.client();
  auto no_key = c.Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  httplib::Headers bad = {{"Authorization", "Bearer s3cre"}}, good = {{"Authorization", "Bearer s3cret"}};
  EXPECT_EQ(c.Post("/v1/systemone", bad, kBlog, "application/json")->status, 401);
  EXPECT_EQ(c.Post("/v1/systemone", good, kBlog, "application/json")->status, 200);
  EXPECT_EQ(c.Get("/health")->status, 200);  // health needs no key
  struct Case {
    std::string body;
    int status;
  };
  const std::vector<Case> cases = {
      {"{bad", 400},
      {"[1,2]", 400},
      {R"({"state":"x"})", 400},
      {R"({"state":"x","questions":{"q":{"type":"choice","criteria":{"only":null}}}})", 422},
      {R"({"state":"x","questions":{"q":{"type":"choice","criteria":["a","b"]}}})", 400},
      {R"({"state":"x","questions":{"q":{"type":"score","criteria":["1","2","3","4","5","6","7","8","9","10","11"]}}})", 422},
      {std::string(300, '[') + std::string(300, ']'), 400},
      {"{\"state\":\"\xff\xfe\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", 400},
      {R"({"state":"x","questions":{"q":{"type":"noul"}}})", 200},
  };
  for (const auto& k : cases) {
    auto res = c.Post("/v1/systemone", good, k.body, "application/json");
    ASSERT_TRUE(res) << k.body.substr(0, 60);
    EXPECT_EQ(res->status, k.status) << k.body.substr(0, 60) << " -> " << res->body;
    if (k.status != 200) {
      json::Value e = json::parse(res->body);
      ASSERT_NE(e.find("error"), nullptr) << res->body;
      EXPECT_NE(e.find("error")->find("message"), nullptr);
    }
  }
  // a prompt that cannot fit: a huge state is cut, a huge schema is refused with the phrase
  std::string many = R"({"state":"x","questions":{)";
  for (int i = 0; i < 64; ++i) many += (i ? "," : "") + ("\"q" + std::to_string(i) + "\":{\"type\":\"choice\",\"instructions\":\"" +
                                                         std::string(2000, 'a') + " " + std::to_string(i) + "\",\"criteria\":{\"a\":null,\"b\":null}}");
  many += "}}";
  auto big = c.Post("/v1/systemone", good, many, "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413) << big->body.substr(0, 200);
  EXPECT_NE(big->body.find("maximum context length"), std::string::npos);
  // body over 13 MiB
  auto huge = c.Post("/v1/systemone", good, std::string(14u << 20, ' '), "application/json");
  if (huge) EXPECT_EQ(huge->status, 413);  // the server may also just close the connection
  EXPECT_EQ(c.Get("/nope", good)->status, 404);
  EXPECT_EQ(c.Post("/v1/systemone", good, kBlog, "text/plain")->status, 200);  // the body is JSON whatever the label
  EXPECT_EQ(c.Get("/health")->status, 200);  // and it is still up
}

TEST(Server, SixtyFourConcurrentClientsGetTheirAloneAnswers) {
  Running r{ServerOptions{}};
  std::vector<std::string> alone(16);
  {
    auto c = r.client();
    for (int i = 0; i < 16; ++i) {
      auto res = c.Post("/v1/systemone", request_n(i), "application/json");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200);
      alone[size_t(i)] = res->body;
    }
  }
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 64; ++t)
    ts.emplace_back([&, t] {
      auto c = r.client();
      for (int k = 0; k < 3; ++k) {
        const int i = (t * 3 + k) % 16;
        auto res = c.Post("/v1/systemone", request_n(i), "application/json");
        if (!res || res->status != 200) ++failures;
        else if (res->body != alone[size_t(i)]) ++mismatches;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "a request's answer changed with the batch it ran in";
  auto met = r.client().Get("/metrics");
  EXPECT_NE(met->body.find("clefrt_batch_requests_bucket"), std::string::npos);
}

TEST(Server, QueueFullIs429AndTimeoutIs503) {
  ServerOptions so;
  so.max_queue = 2;
  so.timeout_s = 3;  // long enough for the last request below on a loaded CI machine
  Running r{so, [] { return load_tiny(tiny_dir(), true, 2); }};
  r.srv->engine()->pause(true);
  std::vector<std::thread> ts;
  std::atomic<int> s503{0};
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&] {
      auto res = r.client().Post("/v1/systemone", kBlog, "application/json");
      if (res && res->status == 503 && res->has_header("Retry-After")) ++s503;
    });
  while (r.srv->engine()->queued() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto full = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429);
  EXPECT_TRUE(full->has_header("Retry-After"));
  for (auto& t : ts) t.join();
  EXPECT_EQ(s503.load(), 2) << "queued requests past --timeout answer 503 with Retry-After";
  r.srv->engine()->pause(false);
  auto ok = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);  // cancelled work was skipped, the server goes on
}

TEST(Server, ClientThatLeavesCancelsItsQueuedWork) {
  Running r{ServerOptions{}};
  r.srv->engine()->pause(true);
  {
    httplib::Client c("127.0.0.1", r.port);
    c.set_read_timeout(0, 300000);  // gives up after 0.3 s and hangs up
    auto res = c.Post("/v1/systemone", kBlog, "application/json");
    EXPECT_FALSE(res);
  }
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seen = r.client().Get("/metrics")->body.find("endpoint=\"/v1/systemone\",status=\"499\"") != std::string::npos;
  }
  EXPECT_TRUE(seen) << "the handler should notice the client left and cancel its job";
  r.srv->engine()->pause(false);
  auto ok = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Server, GracefulStopAnswersInFlightRequests) {
  auto r = std::make_unique<Running>(ServerOptions{});
  std::atomic<int> answered{0}, sent{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      ++sent;
      auto res = r->client().Post("/v1/systemone", request_n(i), "application/json");
      if (res && res->status == 200) ++answered;
    });
  while (sent.load() < 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.reset();  // stop(): no new connections; what was accepted is answered
  for (auto& t : ts) t.join();
  EXPECT_EQ(answered.load(), 8);
}

}  // namespace
}  // namespace clefrt::server

namespace clefrt::server {
namespace {

using namespace test_server;

TEST(Server, NonFiniteWeightsAreRefusedAtLoadOrAnswered500) {
  const std::string bad = poisoned_copy(tiny_dir(), "serve-nan", "layers.1.mlp.down_proj");
  {  // checked at load (the default): the server stops itself, naming the tensor
    Running r{ServerOptions{}, [bad] { return load_tiny(bad); }};
    const auto t0 = std::chrono::steady_clock::now();
    r.th.join();  // run() returns on its own
    r.th = std::thread([] {});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    EXPECT_NE(r.srv->load_error().find("layers.1.mlp.down_proj"), std::string::npos) << r.srv->load_error();
    EXPECT_NE(r.srv->load_error().find("non-finite"), std::string::npos);
  }
  // unchecked: the request is a 500 naming the layer, never a body with NaN in it
  Running r{ServerOptions{}, [bad] { return load_tiny(bad, false); }};
  auto res = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  json::Value v = json::parse(res->body);
  ASSERT_NE(v.find("error"), nullptr);
  EXPECT_EQ(v.find("error")->find("type")->s, "non_finite");
  EXPECT_NE(res->body.find("after backbone layer 1 "), std::string::npos) << res->body;
  EXPECT_EQ(r.client().Get("/health")->status, 200);  // and it is still up
}

// A tower weight that is NaN (unchecked at load): an image request is a 500 that says where,
// the image rows being among the places, never an answer with NaN in it.
TEST(Server, NonFiniteVisionWeightsAnswer500NamingTheImageRows) {
  const std::string bad = poisoned_copy(tiny_dir(), "serve-nan-v", "visual.merger.linear_fc2.weight");
  Running r{ServerOptions{}, [bad] { return load_tiny(bad, false); }};
  json::Value body = json::parse(kBlog);
  json::Value imgs = json::Value::array();
  imgs.arr.push_back(json::Value::string(
      "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="));
  body.add("images", imgs);
  auto res = r.client().Post("/v1/systemone", json::write(body), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500) << res->body;
  EXPECT_NE(res->body.find("non_finite"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("the image rows"), std::string::npos) << res->body;
  auto text = r.client().Post("/v1/systemone", kBlog, "application/json");  // text alone does not touch the tower
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200);
}

TEST(Server, UnknownFieldsAndImagePartsAreRefusedOnEveryShape) {
  Running r{ServerOptions{}};
  auto c = r.client();
  const std::string png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
  const std::string q = R"("questions":[{"type":"predicate","name":"outage"}])";
  struct Case {
    std::string path, body, field;
  };
  const std::vector<Case> cases = {
      {"/v1/decisions", R"({"input":"x",)" + q + R"(,"temperature":0})", "temperature"},
      {"/v1/decisions", R"({"input":"x","questions":[{"type":"predicate","name":"o","weight":2}]})", "questions[0].weight"},
      {"/v1/decisions", R"({"input":"x","questions":[{"type":"choice","name":"o","choices":[{"value":"a","p":1},{"value":"b"}]}]})",
       "questions[0].choices[0].p"},
      {"/v1/decisions", R"({"input":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":")" + png + R"("}}],)" + q + "}",
       "state[1]"},
      {"/v1/systemone", R"({"state":{"msgs":[{"role":"user","content":[{"type":"input_image","image_url":")" + png +
                            R"("}]}]},"questions":{"q":{"type":"noul"}}})",
       "state.msgs[0].content[0]"},
  };
  for (const auto& k : cases) {
    auto res = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 422) << k.body.substr(0, 80) << " -> " << res->body;
    json::Value v = json::parse(res->body);
    const json::Value* d = v.find("error") ? v.find("error")->find("details") : nullptr;
    ASSERT_NE(d, nullptr) << res->body;
    EXPECT_EQ(d->find("path")->s, k.field) << res->body;
  }
  // the OpenAI shape's `images` reach the model (the CPU engine runs the tower): the answer
  // differs from the same body without them, so they were not dropped
  auto with = c.Post("/v1/decisions", R"({"input":"x",)" + q + R"(,"images":[")" + png + R"("]})", "application/json");
  auto without = c.Post("/v1/decisions", R"({"input":"x",)" + q + "}", "application/json");
  ASSERT_TRUE(with && without);
  EXPECT_EQ(with->status, 200) << with->body;
  EXPECT_EQ(without->status, 200) << without->body;
  EXPECT_NE(with->body, without->body);
  // a state that merely mentions such types as data is left alone
  auto ok = c.Post("/v1/systemone", R"({"state":{"type":"image_url","note":"no payload"},"questions":{"q":{"type":"noul"}}})", "application/json");
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(Server, JsonNestingLimitIsTheDocumentedOne) {
  Running r{ServerOptions{}};
  auto depth = [&](size_t n) {  // the body object is level 1
    const std::string state = std::string(n - 1, '[') + std::string(n - 1, ']');
    return r.client().Post("/v1/systemone", "{\"state\":" + state + ",\"questions\":{\"q\":{\"type\":\"noul\"}}}", "application/json")->status;
  };
  EXPECT_EQ(RequestLimits{}.max_json_depth, 128u);
  EXPECT_EQ(depth(128), 200);
  EXPECT_EQ(depth(129), 400);
}

}  // namespace
}  // namespace clefrt::server

namespace clefrt::server {
namespace {

using namespace test_server;

// A job's callback usually holds the request's state, which holds the job: the scheduler drops
// the callback when the job ends, or every request would leak both (the soak run of
// bench/attack.py found it as 760 MiB of growth in 60 s).
TEST(Scheduler, JobsEndOnceAndReleaseTheirCallback) {
  auto engine = load_tiny(tiny_dir());
  const Prepared req = engine->prepare(kBlog);
  for (auto kind : {Outcome::Kind::Answered, Outcome::Kind::Cancelled, Outcome::Kind::TimedOut}) {
    struct Holder {
      std::shared_ptr<Ticket> job;
    };
    auto holder = std::make_shared<Holder>();
    std::weak_ptr<Holder> weak = holder;
    std::atomic<int> calls{0};
    std::promise<Outcome::Kind> got;
    const auto now = std::chrono::steady_clock::now();
    const auto deadline = kind == Outcome::Kind::TimedOut ? now : now + std::chrono::seconds(60);
    if (kind == Outcome::Kind::Cancelled) engine->pause(true);
    holder->job = engine->submit(req, deadline, [holder, &calls, &got](const Prepared&, Outcome o) {
      if (calls++ == 0) got.set_value(o.kind);
    });
    if (kind == Outcome::Kind::Cancelled) {
      holder->job->cancel();
      holder->job->cancel();  // a second end is a no-op
      engine->pause(false);
    }
    EXPECT_EQ(got.get_future().get(), kind);
    EXPECT_TRUE(holder->job->ended());
    holder.reset();
    for (int i = 0; i < 100 && !weak.expired(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(weak.expired()) << "the callback still holds the request after the job ended";
    EXPECT_EQ(calls.load(), 1);
  }
}

// After a forward of several requests the engine waits (up to batch_wait_ms) for as many to be
// queued again: clients that send their next request when their answer arrives, some
// milliseconds apart, share the next forward instead of splitting into a forward of the first
// and one of the rest. A lone client never waits.
TEST(Scheduler, ClientsThatComeBackTogetherShareTheNextForward) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.threads = 2;
  eo.batch_wait_ms = 1000;  // far above the clients' spread, so that a slow machine still passes
  auto engine = Engine::load(tiny_dir(), eo);
  const Prepared req = engine->prepare(kBlog);
  std::mutex mu;
  std::vector<size_t> sizes;
  engine->set_observer({[&](size_t n, size_t) {
                          std::lock_guard<std::mutex> l(mu);
                          sizes.push_back(n);
                        },
                        nullptr});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  constexpr int kClients = 4;
  std::vector<std::promise<void>> second(kClients);
  std::vector<std::thread> clients(kClients);
  engine->pause(true);  // the first round in one forward
  for (int i = 0; i < kClients; ++i)
    engine->submit(req, deadline, [&, i](const Prepared&, Outcome) {
      // client i sends again 20 i ms after its answer (the engine thread only starts it)
      clients[i] = std::thread([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20 * i));
        engine->submit(req, deadline, [&, i](const Prepared&, Outcome) { second[i].set_value(); });
      });
    });
  engine->pause(false);
  // EXPECT, not ASSERT: the client threads are joined either way (a joinable one at return would
  // end the whole test program)
  for (auto& p : second) EXPECT_EQ(p.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  for (auto& t : clients) t.join();
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(sizes, (std::vector<size_t>{4, 4})) << "the second round split across forwards";
  }
  // one request after a forward of four waits out the rest of the window; one after a forward
  // of one does not wait at all
  auto one = [&] {
    std::promise<Outcome> got;
    engine->submit(req, deadline, [&](const Prepared&, Outcome o) { got.set_value(std::move(o)); });
    auto f = got.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return f.get();
  };
  one();
  EXPECT_LT(one().queue_ms, 500.0);
}

}  // namespace
}  // namespace clefrt::server

namespace clefrt::server {
namespace {

std::string run_cli(const std::string& args, int* status = nullptr) {
  std::string out;
  FILE* p = popen((std::string(CLEFRT_BINARY) + " " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  if (status) *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

// Under a Type=notify unit the server tells systemd it is ready once the model has loaded:
// "READY=1" on $NOTIFY_SOCKET (here a socket of the test's own).
TEST(Server, NotifiesTheServiceManagerWhenReady) {
  const std::string path = testing::TempDir() + "clefrt-notify-" + std::to_string(getpid());
  ::unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  std::string got;
  {
    Running r{ServerOptions{}};
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0) got.assign(buf, size_t(n));
  }
  unsetenv("NOTIFY_SOCKET");
  close(fd);
  ::unlink(path.c_str());
  EXPECT_EQ(got, "READY=1");
}

// `clefrt eval --endpoint` against this server answers what the same model answers in process;
// --compare says so (full top-1 agreement, |dp| 0).
TEST(Server, EvalThroughTheEndpointEqualsInProcess) {
  const std::string data = test::source_path("../shared/data");
  if (!std::filesystem::exists(data + "/banking77_test.csv")) GTEST_SKIP() << data << " is not here";
  Running r{ServerOptions{}};
  const std::string base = testing::TempDir() + "clefrt-eval-ep-" + std::to_string(getpid());
  std::filesystem::remove_all(base);
  const std::string common = " --data " + data + " --suite banking77,finentity --limit 5";
  run_cli("eval --model " + tiny_dir() + " --device cpu --threads 2 --out " + base + "/a" + common);
  run_cli("eval --endpoint http://127.0.0.1:" + std::to_string(r.port) + " --concurrency 3 --out " + base + "/b" + common);
  const json::Value rb = json::parse(read_file(base + "/b/report.json"));
  EXPECT_EQ(rb.find("benchmarks")->find("finentity")->find("answered")->i, 5);
  const std::string cmp = run_cli("eval --compare " + base + "/a " + base + "/b");
  EXPECT_NE(cmp.find("top-1 agreement 100.00%"), std::string::npos) << cmp;
  EXPECT_NE(cmp.find("max 0.0000"), std::string::npos) << cmp;
  // a server that is not there: refused before any row (not a report of 0% coverage), exit 2
  int status = 0;
  const std::string none = run_cli("eval --endpoint http://127.0.0.1:1 --out " + base + "/c --data " + data + " --suite banking77 --limit 2", &status);
  EXPECT_EQ(status, 2) << none;
  EXPECT_NE(none.find("http://127.0.0.1:1: cannot connect"), std::string::npos) << none;
  EXPECT_FALSE(std::filesystem::exists(base + "/c/report.json"));
}

}  // namespace
}  // namespace clefrt::server

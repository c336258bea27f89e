// `clefrt serve` in-process on the CPU engine with a synthesized tiny model: every endpoint and
// error path, 64 concurrent clients (each answer equal to the same request answered alone),
// queue-full and timeout behaviour, hostile bodies, graceful shutdown.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <thread>

#include "common/json.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "schema/request.h"
#include "server/server.h"
#include "test_util.h"

namespace clefrt::server {
namespace {

const std::string& tiny_dir() {
  static const std::string dir = test::synth_folder("serve-tiny", 11);
  return dir;
}

struct Running {
  std::unique_ptr<HttpServer> srv;
  std::thread th;
  int port = 0;
  explicit Running(ServerOptions o) {
    signal(SIGPIPE, SIG_IGN);  // a client writing a body the server has refused gets EPIPE, not a signal
    o.port = 0;
    o.log_requests = false;
    srv = std::make_unique<HttpServer>(o, [] {
      EngineOptions eo;
      eo.threads = 2;
      return Engine::load(tiny_dir(), eo);
    });
    port = srv->bind();
    th = std::thread([this] { srv->run(); });
    srv->wait_ready();
  }
  ~Running() {
    srv->stop();
    th.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
};

const std::string kBlog = R"({"model":"clef","state":"Our checkout is down and orders are blocked.","questions":{
  "outage":{"type":"noul","instructions":"Is a service down?"},
  "team":{"type":"choice","instructions":"Which team should handle it?","criteria":{"billing":"payments","tech":"outages","sales":null}},
  "severity":{"type":"score","instructions":"How severe is it?","criteria":["No impact","Minor","Major","Critical"]}}})";

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
                        "clefrt_batch_tokens_bucket", "clefrt_queue_depth", "clefrt_prompt_tokens_total", "clefrt_device_memory_bytes"})
    EXPECT_NE(met->body.find(k), std::string::npos) << k;
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
  so.scheduler.max_queue = 2;
  so.timeout_s = 3;  // long enough for the last request below on a loaded CI machine
  Running r{so};
  r.srv->scheduler()->pause(true);
  std::vector<std::thread> ts;
  std::atomic<int> s503{0};
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&] {
      auto res = r.client().Post("/v1/systemone", kBlog, "application/json");
      if (res && res->status == 503 && res->has_header("Retry-After")) ++s503;
    });
  while (r.srv->scheduler()->queued() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto full = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429);
  EXPECT_TRUE(full->has_header("Retry-After"));
  for (auto& t : ts) t.join();
  EXPECT_EQ(s503.load(), 2) << "queued requests past --timeout answer 503 with Retry-After";
  r.srv->scheduler()->pause(false);
  auto ok = r.client().Post("/v1/systemone", kBlog, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);  // cancelled work was skipped, the server goes on
}

TEST(Server, ClientThatLeavesCancelsItsQueuedWork) {
  Running r{ServerOptions{}};
  r.srv->scheduler()->pause(true);
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
  r.srv->scheduler()->pause(false);
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

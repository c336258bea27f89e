#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/error.h"
#include "common/json.h"
#include "common/log_event.h"
#include "server/service_notify.h"
#include "server/work_pool.h"

namespace clefrt::server {

using json::Value;
using Clock = std::chrono::steady_clock;

namespace {

// Constant time in the length of the expected key: no early exit on the first difference.
bool same_key(std::string_view got, const std::string& want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  return diff == 0;
}

// "Authorization: Bearer KEY": the scheme is case-insensitive (RFC 9110 11.1), one or more
// spaces before the key.
bool authorized(const http::Request& req, const std::string& key) {
  const std::string* h = req.header("Authorization");
  if (!h || h->size() < 7) return false;
  std::string_view v(*h);
  static const char scheme[] = "bearer";
  for (size_t i = 0; i < 6; ++i)
    if (char(std::tolower(static_cast<unsigned char>(v[i]))) != scheme[i]) return false;
  if (v[6] != ' ' && v[6] != '\t') return false;
  v.remove_prefix(6);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return same_key(v, key);
}

std::string error_body(int status, const std::string& type, const std::string& message) {
  return Error(static_cast<Status>(status), type, message).to_json();
}

// The endpoint as a metrics label: one of the served paths, or "other" (a label per unknown
// path would let any client grow /metrics without bound).
std::string endpoint_label(const std::string& path) {
  for (const char* e : {"/v1/systemone", "/v1/decisions", "/v1/models", "/health", "/metrics"})
    if (path == e) return e;
  return "other";
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

}  // namespace

struct HttpServer::Pending {
  uint64_t id = 0;
  Clock::time_point t0;
  std::string method, path, endpoint, remote;
  std::shared_ptr<http::Exchange> ex;
  std::atomic<bool> finished{false};
  std::mutex mu;  // job / aborted: the client may leave while the request is being prepared
  std::shared_ptr<Ticket> job;
  bool aborted = false;
  std::string cors_origin;  // the Access-Control-Allow-Origin value for this request's answer, if any
};

HttpServer::HttpServer(ServerOptions o, std::function<std::unique_ptr<Engine>()> load) : o_(std::move(o)), load_(std::move(load)) {
  http::Options ho = o_.http;
  ho.host = o_.host;
  ho.port = o_.port;
  ho.max_body_bytes = o_.max_body_bytes;
  http_ = std::make_unique<http::Transport>(
      ho, [this](http::Request req, std::shared_ptr<http::Exchange> ex) { handle(std::move(req), std::move(ex)); },
      [this](const http::Request& req, const http::Refusal& why) { return refused(req, why); });
  const size_t threads = o_.prep_threads > 0 ? size_t(o_.prep_threads) : std::max(2u, std::thread::hardware_concurrency());
  prep_ = std::make_unique<WorkPool>(threads, o_.max_queue);
}

void HttpServer::join_loader() {
  std::lock_guard<std::mutex> l(loader_mu_);  // run(), wait_ready() and the destructor may race here
  if (loader_.joinable()) loader_.join();
}

HttpServer::~HttpServer() {
  stop();
  join_loader();
  prep_.reset();
  if (engine_) engine_->stop();
}

int HttpServer::bind() {
  int port;
  try {
    port = http_->bind();
  } catch (const std::exception& e) {
    throw Error(Status::Internal, "bind_error", e.what());
  }
  o_.port = port;
  loader_ = std::thread([this] {
    try {
      engine_ = load_();
      engine_->set_observer(SchedulerObserver{[this](size_t requests, size_t tokens) { metrics_.batch(requests, tokens); },
                                              [this](size_t waiting) { metrics_.set_queue_depth(waiting); }});
      metrics_.set_device_memory(engine_->gpu_bytes());
      engine_ready_ = true;
      const std::string summary = engine_->summary();  // the GPU's memory plan; the CPU engine has none to say
      const std::string memory = summary.empty() ? "" : ",\"memory\":" + json::write(Value::string(summary));
      log_event("\"event\":\"ready\",\"model\":" + json::write(Value::string(o_.model_name)) + ",\"device\":\"" + device_name(engine_->device()) +
                "\",\"port\":" + std::to_string(o_.port) + memory);
      notify_service_manager("READY=1");  // a Type=notify unit's start completes here
    } catch (const std::exception& e) {
      load_error_ = e.what();
      load_failed_ = true;
      log_event("\"event\":\"load_failed\",\"message\":" + json::write(Value::string(e.what())));
      stop();  // a server that cannot answer must not look alive to its supervisor
    }
  });
  return port;
}

void HttpServer::wait_ready() { join_loader(); }

void HttpServer::run() {
  http_->run();  // returns once stopped and drained
  join_loader();
  prep_.reset();  // what was being prepared is submitted (and refused: the engine stops next)
  if (engine_) engine_->stop();
}

void HttpServer::stop() { http_->stop(); }

HttpServer::Reply HttpServer::error(const Error& e) const {
  Reply r{e.http_status(), e.to_json(), e.type()};
  if (e.http_status() == 429 || e.http_status() == 503) r.retry_after = 1;
  return r;
}

void HttpServer::log_line(const Pending& p, const Reply& r, double secs) const {
  if (!o_.log_requests) return;
  std::string line = "{\"ts\":\"" + log_timestamp() + "\",\"id\":" + std::to_string(p.id) + ",\"remote\":" + json::write(Value::string(p.remote)) +
                     ",\"method\":" + json::write(Value::string(p.method)) +
                     ",\"path\":" + json::write(Value::string(p.path)) + ",\"status\":" + std::to_string(r.status);
  if (!r.type.empty()) line += ",\"error\":" + json::write(Value::string(r.type));
  char nums[200];
  std::snprintf(nums, sizeof nums,
                ",\"tokens\":%zu,\"cached_tokens\":%zu,\"batch\":%zu,\"prep_wait_ms\":%.2f,\"prep_ms\":%.2f,\"queue_ms\":%.2f,\"compute_ms\":%.2f,"
                "\"total_ms\":%.2f}\n",
                r.tokens, r.cached_tokens, r.batch, r.prep_wait_ms, r.prep_ms, r.queue_ms, r.compute_ms, secs * 1e3);
  line += nums;
  std::fputs(line.c_str(), stderr);
}

void HttpServer::finish(Pending& p, Reply r) {
  if (p.finished.exchange(true)) return;
  const double secs = std::chrono::duration<double>(Clock::now() - p.t0).count();
  metrics_.request(p.endpoint, r.status, r.type, secs);
  log_line(p, r, secs);
  http::Response res;
  res.status = r.status;
  res.content_type = r.content_type;
  res.body = std::move(r.body);
  if (r.retry_after > 0) res.headers.push_back({"Retry-After", std::to_string(int(r.retry_after))});
  if (!r.allow.empty()) res.headers.push_back({"Allow", r.allow});
  if (!p.cors_origin.empty()) {
    res.headers.push_back({"Access-Control-Allow-Origin", p.cors_origin});
    res.headers.push_back({"Vary", "Origin"});
    res.headers.push_back({"Access-Control-Expose-Headers", "Retry-After"});
  }
  for (auto& h : r.extra_headers) res.headers.push_back(std::move(h));
  p.ex->respond(std::move(res));
}

http::Response HttpServer::refused(const http::Request& req, const http::Refusal& why) {
  Pending p;
  p.id = next_id_++;
  p.t0 = Clock::now();
  p.method = req.method.empty() ? "-" : req.method.substr(0, 40);
  p.path = req.path.empty() ? "-" : req.path.substr(0, 200);
  p.endpoint = endpoint_label(req.path);
  p.remote = req.remote;
  Reply r{why.status, error_body(why.status, why.type, why.message), why.type};
  metrics_.request(p.endpoint, r.status, r.type, 0);
  log_line(p, r, 0);
  http::Response res;
  res.status = r.status;
  res.body = std::move(r.body);
  if (why.status == 503 || why.status == 429) res.headers.push_back({"Retry-After", "1"});
  return res;
}

HttpServer::Reply HttpServer::models() const {
  Value m = Value::object();
  m.add("id", Value::string(o_.model_name));
  m.add("object", Value::string("model"));
  m.add("owned_by", Value::string("clefrt"));
  Value list = Value::object();
  list.add("object", Value::string("list"));
  Value data = Value::array();
  data.arr.push_back(m);
  list.add("data", data);
  return Reply{200, json::write(list)};
}

HttpServer::Reply HttpServer::health() const {
  Value h = Value::object();
  if (!engine_ready_) {
    const bool failed = load_failed_.load();
    h.add("status", Value::string(failed ? "failed" : "loading"));
    if (failed) h.add("error", Value::string(load_error_));
    Reply r{503, json::write(h)};
    r.retry_after = 5;
    return r;
  }
  h.add("status", Value::string("ok"));
  h.add("model", Value::string(o_.model_name));
  h.add("device", Value::string(device_name(engine_->device())));
  h.add("format", Value::string(engine_->format()));
  if (engine_->device() == Device::Cuda) {
    const GpuInfo g = gpu_info();
    Value gpu = Value::object();
    gpu.add("name", Value::string(g.name));
    gpu.add("compute_capability", Value::string(std::to_string(g.major) + "." + std::to_string(g.minor)));
    gpu.add("memory_total_gib", Value::number(g.memory_gib));
    h.add("gpu", gpu);
  }
  h.add("gpu_memory_bytes", Value::integer(int64_t(engine_->gpu_bytes())));
  {
    const PrefixCacheStats pc = engine_->prefix_cache();
    Value c = Value::object();
    c.add("enabled", Value::boolean(pc.enabled));
    c.add("budget_bytes", Value::integer(int64_t(pc.budget_bytes)));
    c.add("bytes", Value::integer(int64_t(pc.bytes)));
    c.add("entries", Value::integer(int64_t(pc.entries)));
    if (pc.host_budget_bytes > 0) {
      c.add("host_budget_bytes", Value::integer(int64_t(pc.host_budget_bytes)));
      c.add("host_bytes", Value::integer(int64_t(pc.host_bytes)));
      c.add("host_entries", Value::integer(int64_t(pc.host_entries)));
    }
    h.add("prefix_cache", c);
  }
  h.add("queue_depth", Value::integer(int64_t(engine_->queued())));
  h.add("open_connections", Value::integer(int64_t(http_->open_connections())));
  h.add("version", Value::string(version()));
  return Reply{200, json::write(h)};
}

// Runs on a transport thread: routing, authentication and the cheap endpoints here; decisions
// go on to the work pool.
void HttpServer::handle(http::Request req, std::shared_ptr<http::Exchange> ex) {
  auto p = std::make_shared<Pending>();
  p->id = next_id_++;
  p->t0 = Clock::now();
  p->method = req.method.substr(0, 40);  // a method is a token of any length: the log keeps a bounded one
  p->path = req.path.substr(0, 200);
  p->endpoint = endpoint_label(req.path);
  p->remote = req.remote;
  p->ex = std::move(ex);
  const bool decision = p->endpoint == "/v1/systemone" || p->endpoint == "/v1/decisions";
  if (p->endpoint == "other")
    return finish(*p, Reply{404, error_body(404, "not_found", "no such endpoint: " + p->method + " " + p->path), "not_found"});
  if (const std::string* origin = req.header("Origin"); origin && !o_.cors_origins.empty()) {
    for (const std::string& allowed : o_.cors_origins)
      if (allowed == "*" || allowed == *origin) p->cors_origin = allowed == "*" ? "*" : *origin;
  }
  if (req.method == "OPTIONS" && !p->cors_origin.empty()) {  // a CORS preflight
    Reply r{204, ""};
    r.content_type.clear();
    r.extra_headers = {{"Access-Control-Allow-Methods", decision ? "POST, OPTIONS" : "GET, HEAD, OPTIONS"},
                       {"Access-Control-Allow-Headers", "Authorization, Content-Type, Content-Encoding"},
                       {"Access-Control-Max-Age", "600"}};
    return finish(*p, std::move(r));
  }
  const bool get_like = req.method == "GET" || req.method == "HEAD";
  if (decision ? req.method != "POST" : !get_like) {
    Reply r{405, error_body(405, "method_not_allowed", p->method + " is not served at " + p->path + " (use " + (decision ? "POST" : "GET") + ")"),
            "method_not_allowed"};
    r.allow = decision ? "POST" : "GET, HEAD";
    return finish(*p, std::move(r));
  }
  const bool needs_auth = p->endpoint != "/health" && p->endpoint != "/metrics";
  if (needs_auth && !o_.api_key.empty() && !authorized(req, o_.api_key)) {
    return finish(*p, Reply{401, error_body(401, "unauthorized", "missing or wrong API key (Authorization: Bearer KEY)"), "unauthorized"});
  }
  if (p->endpoint == "/health") return finish(*p, health());
  if (p->endpoint == "/metrics") {
    Reply r{200, metrics_.render(http_->open_connections(), engine_ready_ ? engine_->prefix_cache() : PrefixCacheStats{})};
    r.content_type = "text/plain; version=0.0.4";
    return finish(*p, std::move(r));
  }
  if (p->endpoint == "/v1/models") return finish(*p, models());
  decide(std::move(p), std::move(req));
}

void HttpServer::decide(std::shared_ptr<Pending> p, http::Request req) {
  if (!engine_ready_) {
    Reply r = error(Error(Status::Unavailable, "loading", "the model is loading"));
    r.retry_after = 5;
    return finish(*p, std::move(r));
  }
  if (const std::string* ct = req.header("Content-Type"); ct && starts_with_ci(*ct, "multipart/"))
    return finish(*p, error(Error(static_cast<Status>(415), "unsupported_media_type",
                                  "the body must be a JSON document (Content-Type: application/json); " + ct->substr(0, 40) +
                                      " bodies are not read")));
  // Admission before any work on the body: a full queue costs no parsing or tokenization.
  auto queue_full = [&] {
    return error(Error(Status::TooManyRequests, "rate_limited",
                       "the request queue is full (" + std::to_string(o_.max_queue) + " waiting); retry shortly"));
  };
  if (engine_->queue_full()) return finish(*p, queue_full());
  p->ex->on_abort([this, w = std::weak_ptr<Pending>(p)] {
    auto p = w.lock();
    if (!p) return;
    std::shared_ptr<Ticket> job;
    {
      std::lock_guard<std::mutex> l(p->mu);
      p->aborted = true;
      job = p->job;
    }
    if (job) job->cancel();  // its done callback logs the 499
    else finish(*p, Reply{499, "", "client_closed"});
  });
  auto shared_req = std::make_shared<http::Request>(std::move(req));
  if (!prep_->try_post([this, p, shared_req] { prepare(p, *shared_req); }))
    return finish(*p, prep_->stopping() ? error(Error(Status::Unavailable, "unavailable", "the server is shutting down")) : queue_full());
}

// On a work-pool thread: parse, validate, encode, submit. The job's done callback answers.
void HttpServer::prepare(const std::shared_ptr<Pending>& p, const http::Request& hreq) {
  if (p->finished) return;  // the client left while this waited
  const auto started = Clock::now();
  try {
    Prepared prepared = engine_->prepare(hreq.body, p->endpoint == "/v1/decisions" ? BodyShape::Decisions : BodyShape::SystemOne);
    const size_t tokens = prepared.input_tokens();
    const auto deadline = p->t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s));
    if (p->finished) return;
    const auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    const double prep_wait_ms = ms(p->t0, started), prep_ms = ms(started, Clock::now());
    auto job = engine_->submit(std::move(prepared), deadline, [this, p, tokens, prep_wait_ms, prep_ms](const Prepared& req, Outcome o) {
      Reply r{500, ""};
      switch (o.kind) {
        case Outcome::Kind::Answered:
          r = Reply{200, req.answer(o.probs, o_.answers, o_.model_name, o.cached_tokens)};
          metrics_.prompt_tokens(tokens);
          break;
        case Outcome::Kind::Failed:
          try {
            std::rethrow_exception(o.error);
          } catch (const Error& e) {
            r = error(e);
          } catch (const std::exception& e) {
            r = error(Error(Status::Internal, "internal_error", e.what()));
          }
          break;
        case Outcome::Kind::TimedOut:
          r = error(Error(Status::Unavailable, "timeout", "the request did not finish within " + json::float_repr(o_.timeout_s) + " s"));
          break;
        case Outcome::Kind::Cancelled:
          r = Reply{499, "", "client_closed"};
          break;
      }
      r.tokens = tokens;
      r.cached_tokens = o.cached_tokens;
      r.queue_ms = o.queue_ms;
      r.compute_ms = o.compute_ms;
      r.prep_wait_ms = prep_wait_ms;
      r.prep_ms = prep_ms;
      r.batch = o.batch_requests;
      finish(*p, std::move(r));
    });
    bool left;
    {
      std::lock_guard<std::mutex> l(p->mu);
      left = p->aborted;
      p->job = job;
    }
    if (left) job->cancel();
  } catch (const Error& e) {
    finish(*p, error(e));
  } catch (const std::exception& e) {
    finish(*p, error(Error(Status::Internal, "internal_error", e.what())));
  }
}

}  // namespace clefrt::server

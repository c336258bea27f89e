#include "server/server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/error.h"
#include "common/json.h"
#include "server/openai_shape.h"

namespace clefrt::server {

using json::Value;
using Clock = std::chrono::steady_clock;

namespace {

// Constant time in the length of the expected key: no early exit on the first difference.
bool same_key(const std::string& got, const std::string& want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  return diff == 0;
}

std::string error_body(int status, const std::string& type, const std::string& message) {
  return Error(static_cast<Status>(status), type, message).to_json();
}

// cpp-httplib 0.11 does not say when a client hangs up, and hides the socket. The connection is
// found by its two ends (getpeername / getsockname over this process's descriptors); it stays
// open, so its number cannot be reused, until the handler returns.
int find_client_socket(const std::string& addr, int port, int local_port) {
  if (port <= 0 || local_port <= 0) return -1;
  for (int fd = 3; fd < 4096; ++fd) {
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {0};
    int pport = -1, sport = -1;
    if (peer.ss_family == AF_INET) {
      auto* p4 = reinterpret_cast<sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &p4->sin_addr, host, sizeof host);
      pport = ntohs(p4->sin_port);
      sport = ntohs(reinterpret_cast<sockaddr_in*>(&self)->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      auto* p6 = reinterpret_cast<sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &p6->sin6_addr, host, sizeof host);
      pport = ntohs(p6->sin6_port);
      sport = ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
    } else {
      continue;
    }
    if (pport == port && sport == local_port && addr == host) return fd;
  }
  return -1;
}

// The peer has closed (or reset) its side: no response can reach it.
bool client_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

HttpServer::HttpServer(ServerOptions o, std::function<std::unique_ptr<Engine>()> load)
    : o_(std::move(o)), load_(std::move(load)), http_(std::make_unique<httplib::Server>()) {
  install_routes();
}

HttpServer::~HttpServer() {
  stop();
  if (loader_.joinable()) loader_.join();
  if (scheduler_) scheduler_->stop();
}

int HttpServer::bind() {
  // Keep-alive connections each hold a worker; most workers only wait on the engine, so be generous
  // (32 workers for 64 clients left some of them unanswered in the H200 load run).
  const int threads = o_.http_threads > 0 ? o_.http_threads : int(std::max(128u, 4 * std::thread::hardware_concurrency()));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(o_.limits.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  // Clients keep connections open and send back to back; closing a kept-alive connection
  // after a few requests (httplib's default: 5) raced with the client's next request and lost
  // it ("Read" errors under 64 clients).
  http_->set_keep_alive_max_count(100000);
  http_->set_keep_alive_timeout(60);
  // Debian's libcpp-httplib listens with a backlog of 5: with 64 clients connecting at once,
  // connections past it were reset after the client had sent its request ("Read" errors). We
  // note the socket as it is made and listen() on it again with the system's maximum.
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof yes);
    listen_fd = int(sock);
  });
  int port = o_.port;
  if (port == 0) port = http_->bind_to_any_port(o_.host);
  else if (!http_->bind_to_port(o_.host, port)) port = -1;
  if (port < 0) throw Error(Status::Internal, "bind_error", "cannot listen on " + o_.host + ":" + std::to_string(o_.port));
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  o_.port = port;
  loader_ = std::thread([this] {
    try {
      engine_ = load_();
      scheduler_ = std::make_unique<Scheduler>(*engine_, o_.scheduler, metrics_);
      metrics_.set_device_memory(engine_->gpu_bytes());
      engine_ready_ = true;
      std::fprintf(stderr, "{\"event\":\"ready\",\"model\":\"%s\",\"device\":\"%s\",\"port\":%d,\"memory\":%s}\n", o_.model_name.c_str(),
                   device_name(engine_->device()), o_.port, json::write(Value::string(engine_->gpu_summary())).c_str());
    } catch (const std::exception& e) {
      load_error_ = e.what();
      std::fprintf(stderr, "{\"event\":\"load_failed\",\"message\":%s}\n", json::write(Value::string(e.what())).c_str());
    }
  });
  return port;
}

void HttpServer::wait_ready() {
  if (loader_.joinable()) loader_.join();
}

void HttpServer::run() {
  http_->listen_after_bind();  // returns once stopped and every accepted request is answered
  std::lock_guard<std::mutex> l(stop_mu_);
  if (loader_.joinable()) loader_.join();
  if (scheduler_) scheduler_->stop();
}

void HttpServer::stop() {
  std::lock_guard<std::mutex> l(stop_mu_);
  if (http_->is_running()) http_->stop();  // closes the listening socket; run() finishes the rest
}

HttpServer::Reply HttpServer::error(const Error& e) const {
  Reply r{e.http_status(), e.to_json()};
  if (e.http_status() == 429 || e.http_status() == 503) r.retry_after = 1;
  return r;
}

HttpServer::Reply HttpServer::decide(const std::string& endpoint, const std::string& body, const std::function<int()>& find_client_fd) {
  if (!engine_ready_) {
    Reply r{503, error_body(503, "loading", load_error_.empty() ? "the model is loading" : "the model failed to load: " + load_error_)};
    r.retry_after = 5;
    return r;
  }
  try {
    Value root = json::parse(body, json::ParseOptions{o_.limits.max_json_depth});
    bool openai = false;
    Value converted;
    if (endpoint == "/v1/decisions" && root.is_object()) {
      const Value* q = root.find("questions");
      if (q && q->is_array()) {
        openai = true;
        converted = openai_to_system_one(root);
      }
    }
    Request req = parse_request(openai ? converted : root, o_.limits);
    Encoded enc = engine_->encoder().encode(req);
    const size_t tokens = enc.input_ids.size();
    auto job = scheduler_->submit(std::move(enc));
    auto fut = job->result.get_future();
    // Wait in short steps: past --timeout answer 503; if the client has gone, drop the work
    // (a queued job is skipped by the engine thread; a running batch finishes regardless).
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.timeout_s);
    int client_fd = -2;  // not looked up yet
    while (fut.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
      if (client_fd == -2) client_fd = find_client_fd();
      if (client_gone(client_fd)) {
        job->cancelled = true;
        return Reply{499, error_body(400, "client_closed", "the client closed the connection before the answer")};
      }
      if (Clock::now() >= deadline) {
        job->cancelled = true;
        Reply r{503, error_body(503, "timeout", "the request did not finish within " + json::float_repr(o_.timeout_s) + " s")};
        r.retry_after = 1;
        return r;
      }
    }
    auto probs = fut.get();
    metrics_.prompt_tokens(tokens);
    const std::string model = req.model.empty() ? o_.model_name : req.model;
    Reply r{200, openai ? openai_response(model, root, req, probs, tokens, o_.answers)
                        : response_json(model, req, probs, tokens, o_.answers)};
    r.tokens = tokens;
    r.queue_ms = job->queue_ms;
    r.compute_ms = job->compute_ms;
    return r;
  } catch (const Error& e) {
    return error(e);
  } catch (const std::exception& e) {
    return Reply{500, error_body(500, "internal_error", e.what())};
  }
}

void HttpServer::install_routes() {
  auto& s = *http_;
  // Every response goes through here: auth, the handler, status, log line, metrics.
  auto wrap = [this](const std::string& endpoint, bool needs_auth, std::function<Reply(const httplib::Request&)> fn) {
    return [this, endpoint, needs_auth, fn](const httplib::Request& req, httplib::Response& res) {
      const auto t0 = Clock::now();
      const uint64_t id = next_id_++;
      Reply r{500, ""};
      if (needs_auth && !o_.api_key.empty()) {
        const std::string h = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        if (h.compare(0, prefix.size(), prefix) != 0 || !same_key(h.substr(prefix.size()), o_.api_key))
          r = Reply{401, error_body(401, "unauthorized", "missing or wrong API key (Authorization: Bearer KEY)")};
        else
          r = fn(req);
      } else {
        r = fn(req);
      }
      res.status = r.status;
      if (r.retry_after > 0) res.set_header("Retry-After", std::to_string(int(r.retry_after)));
      res.set_content(r.body, r.content_type.c_str());
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      metrics_.request(endpoint, r.status, secs);
      if (o_.log_requests)
        std::fprintf(stderr,
                     "{\"id\":%llu,\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,\"tokens\":%zu,\"queue_ms\":%.2f,\"compute_ms\":%.2f,"
                     "\"total_ms\":%.2f}\n",
                     (unsigned long long)id, req.method.c_str(), endpoint.c_str(), r.status, r.tokens, r.queue_ms, r.compute_ms, secs * 1e3);
    };
  };
  for (const char* path : {"/v1/systemone", "/v1/decisions"}) {
    const std::string endpoint = path;
    s.Post(path, wrap(endpoint, true, [this, endpoint](const httplib::Request& q) {
             return decide(endpoint, q.body, [&q] { return find_client_socket(q.remote_addr, q.remote_port, q.local_port); });
           }));
  }
  s.Get("/v1/models", wrap("/v1/models", true, [this](const httplib::Request&) {
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
        }));
  s.Get("/health", wrap("/health", false, [this](const httplib::Request&) {
          Value h = Value::object();
          if (!engine_ready_) {
            h.add("status", Value::string(load_error_.empty() ? "loading" : "failed"));
            if (!load_error_.empty()) h.add("error", Value::string(load_error_));
            Reply r{503, json::write(h)};
            r.retry_after = 5;
            return r;
          }
          h.add("status", Value::string("ok"));
          h.add("model", Value::string(o_.model_name));
          h.add("device", Value::string(device_name(engine_->device())));
          h.add("format", Value::string(engine_->device() == Device::Cuda ? "bf16" : "f32"));
          h.add("gpu_memory_bytes", Value::integer(int64_t(engine_->gpu_bytes())));
          h.add("queue_depth", Value::integer(int64_t(scheduler_->queued())));
          return Reply{200, json::write(h)};
        }));
  s.Get("/metrics", wrap("/metrics", false, [this](const httplib::Request&) {
          Reply r{200, metrics_.render()};
          r.content_type = "text/plain; version=0.0.4";
          return r;
        }));
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int st = res.status;
    std::string msg = st == 404 ? "no such endpoint: " + req.method + " " + req.path
                      : st == 413 ? "the body is larger than the 13 MiB limit"
                                  : "HTTP error " + std::to_string(st);
    const char* type = st == 404 ? "not_found" : st == 413 ? "request_too_large" : "invalid_request";
    res.set_content(error_body(st, type, msg), "application/json");
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(500, "internal_error", msg), "application/json");
  });
}

}  // namespace clefrt::server

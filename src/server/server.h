// `clefrt serve`: the System One HTTP API (spec/protocol.md) over the public clefrt::Engine.
// The transport (http.h) reads requests on its event loop; a work pool prepares them (parse,
// validate, encode: Engine::prepare); the engine's scheduler runs packed batches; answers go
// back through the transport.
// Every response, whichever layer makes it, is a protocol JSON body, a log line and a count.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <clefrt/clefrt.h>

#include "server/http.h"
#include "server/metrics.h"

namespace clefrt::server {

class WorkPool;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (tests)
  std::string api_key;        // empty: no authentication
  std::string model_name = "clef";
  double timeout_s = 60;      // per request, from its arrival to its answer; past it the answer is 503
  int prep_threads = 0;       // threads that parse and encode requests (0: the cores, at least 2)
  bool log_requests = true;   // one JSON line per request on stderr (never the body)
  size_t max_body_bytes = 13u << 20;  // the protocol's body limit, after decoding
  size_t max_queue = 256;     // requests admitted and not yet answered (the engine's own queue bounds it too)
  http::Options http;         // connections, limits, deadlines, drain (host / port / body limit come from above)
  AnswerOptions answers;
  // Browsers' cross-origin calls (CORS): the Origin values allowed ("*": any). Empty: no CORS
  // headers, and OPTIONS is a 405 like any other unserved method.
  std::vector<std::string> cors_origins;
};

class HttpServer {
 public:
  // load() runs on a background thread after the socket is bound: /health answers 503 until it
  // returns, and decisions are refused with 503 + Retry-After meanwhile. If it throws, the
  // server stops (run() returns) and load_error() says why.
  HttpServer(ServerOptions o, std::function<std::unique_ptr<Engine>()> load);
  ~HttpServer();

  int bind();          // binds host:port, returns the port; throws on failure
  void run();          // serves until stop(); blocks; on return every accepted request is answered or timed out
  void stop();         // stop accepting (any thread); run() then drains and returns
  bool ready() const { return engine_ready_; }
  void wait_ready();   // tests: until the engine is loaded (or failed)
  const std::string& load_error() const { return load_error_; }
  Engine* engine() { return engine_ready_ ? engine_.get() : nullptr; }  // tests

 private:
  struct Reply {
    Reply(int s = 500, std::string b = {}, std::string t = {}) : status(s), body(std::move(b)), type(std::move(t)) {}
    int status;
    std::string body;
    std::string content_type = "application/json";
    double retry_after = 0;
    std::string type;   // the error type of a refusal (log line, metrics); empty on success
    std::string allow;  // 405: the methods the path takes
    std::vector<http::Header> extra_headers;  // CORS preflight answers
    size_t tokens = 0, cached_tokens = 0;
    double queue_ms = 0, compute_ms = 0;
    // before the engine's queue: waiting for a prep worker (prep_wait_ms), then parsing,
    // validating, tokenizing and encoding on it (prep_ms)
    double prep_wait_ms = 0, prep_ms = 0;
    size_t batch = 0;  // requests in the forward that answered it (the log's "batch")
  };
  struct Pending;  // one request from arrival to its log line
  void handle(http::Request req, std::shared_ptr<http::Exchange> ex);
  void decide(std::shared_ptr<Pending> p, http::Request req);
  void prepare(const std::shared_ptr<Pending>& p, const http::Request& req);
  void finish(Pending& p, Reply r);
  http::Response refused(const http::Request& req, const http::Refusal& why);
  Reply error(const Error& e) const;
  Reply health() const;
  Reply models() const;
  void log_line(const Pending& p, const Reply& r, double secs) const;

  ServerOptions o_;
  std::function<std::unique_ptr<Engine>()> load_;
  std::unique_ptr<http::Transport> http_;
  std::unique_ptr<WorkPool> prep_;
  std::unique_ptr<Engine> engine_;
  Metrics metrics_;
  std::atomic<bool> engine_ready_{false}, load_failed_{false};  // load_error_ is written before load_failed_
  std::string load_error_;
  std::thread loader_;
  std::mutex loader_mu_;
  void join_loader();
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace clefrt::server

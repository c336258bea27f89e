// `clefrt serve`: the System One HTTP API (spec/protocol.md) over the engine. The transport
// (http.h) reads requests on its event loop; a work pool parses, validates and encodes them;
// one engine thread runs packed batches (scheduler.h); answers go back through the transport.
// Every response, whichever layer makes it, is a protocol JSON body, a log line and a count.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "engine/engine_core.h"
#include "schema/answers.h"
#include "schema/request.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/scheduler.h"

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
  http::Options http;         // connections, limits, deadlines, drain (host / port / body limit come from above)
  SchedulerOptions scheduler;
  RequestLimits limits;
  AnswerOptions answers;
};

class HttpServer {
 public:
  // load() runs on a background thread after the socket is bound: /health answers 503 until it
  // returns, and decisions are refused with 503 + Retry-After meanwhile. If it throws, the
  // server stops (run() returns) and load_error() says why.
  HttpServer(ServerOptions o, std::function<std::unique_ptr<EngineCore>()> load);
  ~HttpServer();

  int bind();          // binds host:port, returns the port; throws on failure
  void run();          // serves until stop(); blocks; on return every accepted request is answered or timed out
  void stop();         // stop accepting (any thread); run() then drains and returns
  bool ready() const { return engine_ready_; }
  void wait_ready();   // tests: until the engine is loaded (or failed)
  const std::string& load_error() const { return load_error_; }
  Scheduler* scheduler() { return scheduler_.get(); }

 private:
  struct Reply {
    Reply(int s = 500, std::string b = {}, std::string t = {}) : status(s), body(std::move(b)), type(std::move(t)) {}
    int status;
    std::string body;
    std::string content_type = "application/json";
    double retry_after = 0;
    std::string type;   // the error type of a refusal (log line, metrics); empty on success
    std::string allow;  // 405: the methods the path takes
    size_t tokens = 0;
    double queue_ms = 0, compute_ms = 0;
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
  std::function<std::unique_ptr<EngineCore>()> load_;
  std::unique_ptr<http::Transport> http_;
  std::unique_ptr<WorkPool> prep_;
  std::unique_ptr<EngineCore> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  Metrics metrics_;
  std::atomic<bool> engine_ready_{false}, load_failed_{false};  // load_error_ is written before load_failed_
  std::string load_error_;
  std::thread loader_;
  std::mutex loader_mu_;
  void join_loader();
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace clefrt::server

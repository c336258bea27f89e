// `clefrt serve`: the System One HTTP API (spec/protocol.md) over the engine. HTTP threads
// parse, validate and encode; one engine thread runs packed batches (scheduler.h).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>

#include "common/error.h"
#include "engine/engine.h"
#include "schema/answers.h"
#include "schema/request.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
}

namespace clefrt::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (tests)
  std::string api_key;  // empty: no authentication
  std::string model_name = "clef";
  double timeout_s = 60;  // per request, queue + compute; past it the answer is 503
  int http_threads = 0;   // 0: max(128, 4 x cores)
  bool log_requests = true;  // one JSON line per request on stderr (never the body)
  SchedulerOptions scheduler;
  RequestLimits limits;
  AnswerOptions answers;
};

class HttpServer {
 public:
  // load() runs on a background thread after the socket is bound: /health answers 503 until it
  // returns, and decisions are refused with 503 + Retry-After meanwhile.
  HttpServer(ServerOptions o, std::function<std::unique_ptr<Engine>()> load);
  ~HttpServer();

  int bind();          // binds host:port, returns the port; throws on failure
  void run();          // serves until stop(); blocks; on return every accepted request is answered
  void stop();         // stop accepting (any thread); run() then finishes in-flight work and returns
  bool ready() const { return engine_ready_; }
  void wait_ready();   // tests: until the engine is loaded (or failed)
  Scheduler* scheduler() { return scheduler_.get(); }

 private:
  struct Reply {
    int status;
    std::string body;
    std::string content_type = "application/json";
    double retry_after = 0;
    size_t tokens = 0;
    double queue_ms = 0, compute_ms = 0;
  };
  // find_client_fd: the connection's socket, watched so a client that leaves cancels its queued
  // work. Looked up only once a request has waited a step (it scans descriptors), so requests
  // answered at once never pay for it.
  Reply decide(const std::string& endpoint, const std::string& body, const std::function<int()>& find_client_fd);
  Reply error(const Error& e) const;
  void install_routes();

  ServerOptions o_;
  std::function<std::unique_ptr<Engine>()> load_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  Metrics metrics_;
  std::atomic<bool> engine_ready_{false};
  std::string load_error_;
  std::thread loader_;
  std::mutex stop_mu_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace clefrt::server

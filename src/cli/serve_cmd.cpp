// `clefrt serve`: the System One HTTP server (src/server/). SIGTERM/SIGINT stop accepting,
// close idle connections, give requests in progress --drain-seconds to finish and exit 0; a
// model that fails to load exits 1.
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <unistd.h>

#include "cli/commands.h"
#include "common/file.h"
#include "common/json.h"
#include "common/log_event.h"
#include "server/server.h"
#include "server/service_notify.h"

namespace clefrt::cli {

namespace {
// A handler (not sigwait: BLAS libraries start threads before main, with signals unblocked)
// that only writes to a pipe; a watcher thread reads it and stops the server.
int g_signal_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &c, 1);
}
}  // namespace

Runner add_serve(CLI::App& app) {
  struct Opts {
    EngineFlags engine;
    std::string model, synthetic, tokenizer = ".deps/qwen3/tokenizer.json", host = "127.0.0.1", api_key, api_key_file;
    std::string confidence = "reference", model_name = "clef";
    std::vector<std::string> cors;
    int port = 8080, io_threads = 2, prep_threads = 0;
    size_t max_batch_tokens = 16384, max_queue = 256, max_batch_requests = 64, max_connections = 16384;
    double batch_wait_ms = 0;
    double timeout = 60, header_timeout = 10, body_timeout = 60, keep_alive_timeout = 60, drain = 10;
    bool quiet = false, no_warmup = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("serve",
                                   "Serve the System One API over HTTP: POST /v1/systemone, POST /v1/decisions (System One or\n"
                                   "OpenAI-style body), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
                                   "Concurrent requests are packed into shared forwards up to --max-batch-tokens; a full queue\n"
                                   "answers 429 with Retry-After. Binds 127.0.0.1 unless --host says otherwise. Request bodies\n"
                                   "are never logged; one JSON line per request goes to stderr.");
  auto* m = c->add_option("--model", o->model, "a Clef release folder")->check(CLI::ExistingDirectory);
  auto* syn = c->add_option("--synthetic", o->synthetic, "clef-27b | clef-flash | small | tiny: random weights on the GPU (benchmarks)")
                  ->check(CLI::IsMember({"clef-27b", "clef-flash", "small", "tiny"}));
  m->excludes(syn);
  c->add_option("--tokenizer", o->tokenizer, "with --synthetic: the tokenizer.json to encode with");
  c->add_option("--host", o->host, "address to bind (default 127.0.0.1)");
  c->add_option("--port", o->port, "port (default 8080; 0 = any free port)")->check(CLI::Range(0, 65535));
  auto* k = c->add_option("--api-key", o->api_key,
                          "require Authorization: Bearer KEY (visible in ps: prefer --api-key-file or the CLEFRT_API_KEY variable)")
                ->envname("CLEFRT_API_KEY");
  auto* kf = c->add_option("--api-key-file", o->api_key_file, "read the key from this file (first line)")->check(CLI::ExistingFile);
  k->excludes(kf);
  c->add_option("--max-batch-tokens", o->max_batch_tokens, "tokens packed into one forward (default 16384)")->check(positive());
  c->add_option("--max-batch-requests", o->max_batch_requests, "requests packed into one forward (default 64)")->check(positive());
  c->add_option("--batch-wait-ms", o->batch_wait_ms,
                "after a forward of several requests, wait up to this long for as many to arrive before the next forward\n"
                "(clients that send again on each answer come back together; without it the batches alternate between\n"
                "a few requests and the rest; on an H100 2 ms evened them but gained no throughput). A lone request never\n"
                "waits. 0: never wait (default 0)")
      ->check(CLI::Range(0.0, 1000.0));
  c->add_flag("--no-warmup", o->no_warmup,
             "cuda: take requests as soon as the weights are loaded, without the warm-up: forwards of made-up requests\n"
             "(batches of 2, 4, 8, ... up to a full forward of 320-token ones; one of 2,048 and one of 8,192 tokens) that\n"
             "choose each size's GEMM algorithms and attention plans before the first real request of that size has to\n"
             "(seconds at start; /health says 503 until it is done). The CPU has nothing to warm");
  c->add_option("--max-queue", o->max_queue, "requests waiting for the engine before 429 (default 256)")->check(positive());
  c->add_option("--timeout", o->timeout, "seconds a request may take from its arrival, queue included, before a 503 (default 60)")
      ->check(positive());
  c->add_option("--max-connections", o->max_connections,
                "HTTP connections open at once; past it a new one gets 503 and is closed (default 16384; bounded by the descriptor limit)")
      ->check(positive());
  c->add_option("--header-timeout", o->header_timeout, "seconds from a request's first byte to the end of its headers, else 408 (default 10)")
      ->check(positive());
  c->add_option("--body-timeout", o->body_timeout, "seconds from the end of the headers to the end of the body, else 408 (default 60)")
      ->check(positive());
  c->add_option("--keep-alive-timeout", o->keep_alive_timeout, "seconds an idle connection stays open (default 60)")->check(positive());
  c->add_option("--drain-seconds", o->drain,
                "on SIGTERM / SIGINT: idle connections close at once; requests in progress get this long to finish (default 10)")
      ->check(non_negative());
  c->add_option("--confidence", o->confidence, "reference | purity | jev")->check(CLI::IsMember({"reference", "purity", "jev"}));
  c->add_option("--model-name", o->model_name, "the id reported by /v1/models and in responses without a model (default clef)");
  add_engine_flags(*c, o->engine);
  c->add_option("--io-threads", o->io_threads, "threads running the HTTP connections' event loop (default 2)")->check(CLI::Range(1, 64));
  c->add_option("--prep-threads", o->prep_threads, "threads that parse and tokenize requests (default: the cores, at least 2)")
      ->check(non_negative());
  c->add_option("--cors-origin", o->cors,
                "allow browsers on this origin (https://app.example; repeatable; '*' for any) to call the API: CORS headers on\n"
                "answers and OPTIONS preflights answered (default: none)")
      ->delimiter(',');
  c->add_flag("--quiet", o->quiet, "no per-request log lines");
  add_env_names(*c);
  return [o, k]() -> int {
    if (o->model.empty() && o->synthetic.empty()) throw Error(Status::BadRequest, "usage", "serve needs --model DIR or --synthetic NAME");
    server::ServerOptions so;
    so.host = o->host;
    so.port = o->port;
    so.api_key = o->api_key;
    const char* env_key = std::getenv("CLEFRT_API_KEY");
    if ((k->count() > 0 || (env_key && o->api_key_file.empty())) && o->api_key.empty())
      throw Error(Status::BadRequest, "usage", "--api-key (or CLEFRT_API_KEY) is empty: give a key, or leave the option out to serve without one");
    if (!o->api_key_file.empty()) {
      std::string t = read_file(o->api_key_file);
      so.api_key = t.substr(0, t.find_first_of("\r\n"));
      if (so.api_key.empty()) throw Error(Status::BadRequest, "usage", "--api-key-file " + o->api_key_file + " is empty");
    }
    so.model_name = o->model_name;
    // origins separated by commas (the flag's delimiter) or spaces / semicolons (as an
    // environment file may hold them), each an origin a browser sends: scheme://host[:port] or *
    for (const std::string& entry : o->cors) {
      size_t at = 0;
      while ((at = entry.find_first_not_of(" ;\t", at)) != std::string::npos) {
        const size_t end = entry.find_first_of(" ;\t", at);
        const std::string origin = entry.substr(at, end == std::string::npos ? std::string::npos : end - at);
        at = end;
        const size_t scheme = origin.find("://");
        const bool ok = origin == "*" || ((origin.rfind("http://", 0) == 0 || origin.rfind("https://", 0) == 0) &&
                                          origin.size() > scheme + 3 && origin.find('/', scheme + 3) == std::string::npos);
        if (!ok)
          throw Error(Status::BadRequest, "usage",
                      "--cors-origin: '" + origin + "' is not an origin (scheme://host[:port] with no path, e.g. https://app.example; or *)");
        so.cors_origins.push_back(origin);
      }
    }
    so.timeout_s = o->timeout;
    so.prep_threads = o->prep_threads;
    so.log_requests = !o->quiet;
    so.http.io_threads = o->io_threads;
    so.http.max_connections = o->max_connections;
    so.http.header_timeout_s = o->header_timeout;
    so.http.body_timeout_s = o->body_timeout;
    so.http.idle_timeout_s = o->keep_alive_timeout;
    so.http.drain_s = o->drain;
    // Each connection is a descriptor: take what the hard limit allows, and keep room below it
    // for the model files, the engine and logging.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
      if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
      }
      const size_t room = rl.rlim_cur > 512 ? size_t(rl.rlim_cur) - 256 : 256;
      if (so.http.max_connections > room) {
        log_event("\"event\":\"max_connections_lowered\",\"from\":" + std::to_string(so.http.max_connections) + ",\"to\":" +
                  std::to_string(room) + ",\"why\":\"the descriptor limit is " + std::to_string((unsigned long long)rl.rlim_cur) + "\"");
        so.http.max_connections = room;
      }
    }
    so.max_queue = o->max_queue;
    so.answers.confidence = parse_confidence(o->confidence);
    EngineOptions eo = engine_options(o->engine);
    eo.max_batch_tokens = o->max_batch_tokens;
    eo.max_batch_requests = o->max_batch_requests;
    eo.batch_wait_ms = o->batch_wait_ms;
    eo.warmup = !o->no_warmup;
    eo.max_queue = o->max_queue;
    if (pipe(g_signal_pipe) != 0) throw Error(Status::Internal, "internal_error", "pipe() failed");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
    auto opts = *o;
    server::HttpServer srv(so, [opts, eo]() {
      return opts.synthetic.empty() ? Engine::load(opts.model, eo) : Engine::synthetic(opts.synthetic, opts.tokenizer, eo);
    });
    const int port = srv.bind();
    log_event("\"event\":\"listening\",\"host\":" + json::write(json::Value::string(so.host)) + ",\"port\":" + std::to_string(port));
    std::thread watcher([&] {
      char sig = 0;
      if (read(g_signal_pipe[0], &sig, 1) == 1 && sig != 0) {
        log_event("\"event\":\"stopping\",\"signal\":" + std::to_string(int(sig)));
        server::notify_service_manager("STOPPING=1");
        srv.stop();
      }
    });
    srv.run();
    srv.stop();
    const char zero = 0;  // wakes the watcher if run() ended for another reason
    [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &zero, 1);
    watcher.join();
    if (!srv.load_error().empty()) {
      log_event("\"event\":\"stopped\",\"exit\":1,\"why\":\"the model failed to load\"");
      return 1;
    }
    log_event("\"event\":\"stopped\",\"exit\":0");
    return 0;
  };
}

}  // namespace clefrt::cli

// `clefrt serve`: the System One HTTP server (src/server/). SIGTERM/SIGINT stop accepting,
// finish what is in flight and exit 0.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <unistd.h>

#include "cli/commands.h"
#include "common/error.h"
#include "common/file.h"
#include "engine/engine.h"
#include "server/server.h"

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
    std::string model, synthetic, tokenizer = ".deps/qwen3/tokenizer.json", device = "auto", host = "127.0.0.1", api_key, api_key_file;
    std::string confidence = "reference", model_name = "clef";
    int port = 8080, threads = 0, http_threads = 0;
    size_t max_batch_tokens = 16384, max_queue = 256, max_length = 16384, max_batch_requests = 64;
    double timeout = 60;
    bool parse_special = false, require_instructions = false, quiet = false, batch_invariant = true, offload = false;
    std::string quant = "auto";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("serve",
                                   "Serve the System One API over HTTP: POST /v1/systemone, POST /v1/decisions (System One or\n"
                                   "OpenAI-style body), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
                                   "Concurrent requests are packed into shared forwards up to --max-batch-tokens; a full queue\n"
                                   "answers 429 with Retry-After. Binds 127.0.0.1 unless --host says otherwise. Request bodies\n"
                                   "are never logged; one JSON line per request goes to stderr.");
  auto* m = c->add_option("--model", o->model, "a Clef release folder")->check(CLI::ExistingDirectory);
  auto* syn = c->add_option("--synthetic", o->synthetic, "clef-27b | clef-flash | small: random weights on the GPU (benchmarks)")
                  ->check(CLI::IsMember({"clef-27b", "clef-flash", "small", "tiny"}));
  m->excludes(syn);
  c->add_option("--tokenizer", o->tokenizer, "with --synthetic: the tokenizer.json to encode with");
  c->add_option("--device", o->device, "auto | cuda | cpu")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  c->add_option("--host", o->host, "address to bind (default 127.0.0.1)");
  c->add_option("--port", o->port, "port (default 8080; 0 = any free port)");
  auto* k = c->add_option("--api-key", o->api_key, "require Authorization: Bearer KEY");
  auto* kf = c->add_option("--api-key-file", o->api_key_file, "read the key from this file (first line)")->check(CLI::ExistingFile);
  k->excludes(kf);
  c->add_option("--max-batch-tokens", o->max_batch_tokens, "tokens packed into one forward (default 16384)");
  c->add_option("--max-batch-requests", o->max_batch_requests, "requests packed into one forward (default 64)");
  c->add_option("--max-queue", o->max_queue, "requests waiting before 429 (default 256)");
  c->add_option("--max-length", o->max_length, "context length; longer states are cut, longer schemas refused with 413 (default 16384)");
  c->add_option("--timeout", o->timeout, "seconds a request may take, queue included, before a 503 (default 60)");
  c->add_option("--confidence", o->confidence, "reference | purity | jev")->check(CLI::IsMember({"reference", "purity", "jev"}));
  c->add_option("--model-name", o->model_name, "the id reported by /v1/models and in responses without a model (default clef)");
  add_gpu_weight_options(*c, o->quant, o->offload);
  c->add_option("--threads", o->threads, "CPU engine threads (default: all cores)");
  c->add_option("--http-threads", o->http_threads, "HTTP worker threads (default max(128, 4 x cores))");
  c->add_flag("--parse-special", o->parse_special, "parse special-token text in user content, as the reference does");
  c->add_flag("--require-instructions", o->require_instructions, "refuse missing/empty instructions (422)");
  c->add_flag("--quiet", o->quiet, "no per-request log lines");
  return [o]() -> int {
    if (o->model.empty() && o->synthetic.empty()) throw Error(Status::BadRequest, "usage", "serve needs --model DIR or --synthetic NAME");
    server::ServerOptions so;
    so.host = o->host;
    so.port = o->port;
    so.api_key = o->api_key;
    if (!o->api_key_file.empty()) {
      std::string t = read_file(o->api_key_file);
      so.api_key = t.substr(0, t.find_first_of("\r\n"));
      if (so.api_key.empty()) throw Error(Status::BadRequest, "usage", "--api-key-file " + o->api_key_file + " is empty");
    }
    so.model_name = o->model_name;
    so.timeout_s = o->timeout;
    so.http_threads = o->http_threads;
    so.log_requests = !o->quiet;
    so.scheduler.max_batch_tokens = o->max_batch_tokens;
    so.scheduler.max_batch_requests = o->max_batch_requests;
    so.scheduler.max_queue = o->max_queue;
    so.limits.require_instructions = o->require_instructions;
    so.answers.confidence = parse_confidence(o->confidence);
    EngineOptions eo;
    eo.quant = parse_quant_mode(o->quant);
    eo.offload_embeddings = o->offload;
    eo.threads = o->threads;
    eo.encode.max_length = o->max_length;
    eo.encode.user_text = o->parse_special ? AddedTokens::Parse : AddedTokens::Plain;
    eo.device = o->device == "cuda" || (o->device == "auto" && cuda_available()) ? Device::Cuda : Device::Cpu;
    eo.max_batch_tokens = int64_t(std::max(o->max_batch_tokens, o->max_length));
    eo.max_batch_requests = int64_t(o->max_batch_requests);
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
    std::fprintf(stderr, "{\"event\":\"listening\",\"host\":\"%s\",\"port\":%d}\n", so.host.c_str(), port);
    std::thread watcher([&] {
      char sig = 0;
      if (read(g_signal_pipe[0], &sig, 1) == 1 && sig != 0) {
        std::fprintf(stderr, "{\"event\":\"stopping\",\"signal\":%d}\n", int(sig));
        srv.stop();
      }
    });
    srv.run();
    srv.stop();
    const char zero = 0;  // wakes the watcher if run() ended for another reason
    [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &zero, 1);
    watcher.join();
    std::fprintf(stderr, "{\"event\":\"stopped\"}\n");
    return 0;
  };
}

}  // namespace clefrt::cli

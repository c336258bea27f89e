// `clefrt eval`: the Decision Index kit's benchmarks (eval/suite.h) run through this engine in
// process, batched; every answer written to DIR/predictions.jsonl as it comes (a rerun with
// --resume skips what is answered), then scored the kit's way into DIR/report.json and .md.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "common/progress.h"
#include "common/error.h"
#include "common/file.h"
#include "common/json.h"
#include "eval/suite.h"

namespace clefrt::cli {

namespace {

struct EvalOptions {
  EngineFlags engine;
  std::string model, synthetic, tokenizer = ".deps/qwen3/tokenizer.json", endpoint, endpoint_model = "clef", api_key, data = "../shared/data", out, suite = "banking77,clinc150,finentity,cruxeval";
  std::vector<std::string> compare;
  size_t limit = 0, batch = 32, concurrency = 4;
  double timeout_s = 600;
  bool resume = false;
};

// --endpoint URL: "http://host:port" (a path after it is ignored: requests go to /v1/systemone).
struct Endpoint {
  std::string base;
};
Endpoint parse_endpoint(const std::string& url) {
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
    throw Error(Status::BadRequest, "usage", "--endpoint must be an http:// URL, not " + url);
  if (url.rfind("https://", 0) == 0) throw Error(Status::BadRequest, "usage", "--endpoint https:// is not supported (this build's client is plain HTTP): put a local proxy in front");
  const size_t slash = url.find('/', 7);
  return {slash == std::string::npos ? url : url.substr(0, slash)};
}

// httplib's error as a reader would say it
std::string client_error(httplib::Error e, double timeout_s) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect (refused, or no route to the host)";
    case httplib::Error::ConnectionTimeout: return "connect timed out";
    case httplib::Error::Read: return "reading the answer failed or took over " + std::to_string(int(timeout_s)) + " s (--timeout)";
    case httplib::Error::Write: return "sending the request failed";
    default: return httplib::to_string(e);
  }
}

// Before any row: a server that does not answer /health is a usage error, not a report of 0%.
void check_reachable(const Endpoint& ep, const std::string& api_key) {
  httplib::Client cl(ep.base);
  cl.set_connection_timeout(std::chrono::seconds(10));
  cl.set_read_timeout(std::chrono::seconds(30));
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  auto res = cl.Get("/health", h);
  if (!res) throw Error(Status::BadRequest, "usage", "--endpoint " + ep.base + ": " + client_error(res.error(), 30) + " (GET /health)");
}

// --compare A B: the card table (A, B, B - A per benchmark) and per-question agreement over the
// rows both answered: top-1 (the same choice / the same side of 0.5 for noul) and |dp| over
// every option's probability.
int compare_runs(const std::string& a, const std::string& b) {
  const json::Value ra = json::parse(read_file(a + "/report.json")), rb = json::parse(read_file(b + "/report.json"));
  auto probs_of = [](const std::string& dir) {
    std::map<std::string, json::Value> m;
    std::ifstream in(dir + "/predictions.jsonl");
    if (!in) throw Error(Status::BadRequest, "usage", dir + "/predictions.jsonl: cannot read");
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      json::Value v = json::parse(line);
      const json::Value* ans = v.find("answers");
      if (ans && ans->is_object()) m[v.find("id")->s] = *ans;
    }
    return m;
  };
  const auto pa = probs_of(a), pb = probs_of(b);
  std::printf("| benchmark | %s | %s | delta |\n|---|---|---|---|\n", a.c_str(), b.c_str());
  for (const auto& [name, va] : ra.find("benchmarks")->obj) {
    const json::Value* vb = rb.find("benchmarks")->find(name);
    if (!vb) continue;
    const double x = va.find("raw")->d, y = vb->find("raw")->d;
    std::printf("| %s (raw) | %.2f | %.2f | %+.2f |\n", va.find("title")->s.c_str(), 100 * x, 100 * y, 100 * (y - x));
  }
  size_t questions = 0, same = 0, values = 0;
  double sum = 0, worst = 0;
  for (const auto& [id, aa] : pa) {
    auto it = pb.find(id);
    if (it == pb.end()) continue;
    for (const auto& [qid, qa] : aa.obj) {
      const json::Value* qb = it->second.find(qid);
      if (!qb) continue;
      ++questions;
      const json::Value *ca = qa.find("choice"), *cb = qb->find("choice");
      if (ca && cb) same += ca->s == cb->s;
      const json::Value *na = qa.find("noul"), *nb = qb->find("noul");
      if (na && nb) {
        same += (na->d >= 0.5) == (nb->d >= 0.5);
        const double d = std::fabs(na->d - nb->d);
        sum += d, worst = std::max(worst, d), ++values;
      }
      const json::Value *xa = qa.find("probabilities"), *xb = qb->find("probabilities");
      if (xa && xb)
        for (const auto& [opt, p] : xa->obj)
          if (const json::Value* q = xb->find(opt)) {
            const double d = std::fabs(p.d - q->d);
            sum += d, worst = std::max(worst, d), ++values;
          }
    }
  }
  std::printf("\nper question, over the %zu questions both answered: top-1 agreement %.2f%%, |dp| mean %.4f, max %.4f (answers as "
              "rounded in the responses)\n",
              questions, questions ? 100.0 * double(same) / double(questions) : 0.0, values ? sum / double(values) : 0.0, worst);
  return 0;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) v.push_back(x);
  return v;
}

// The kit counts a refusal whose text names the engine's capacity as unsupported, not failed
// (the markers clefrt's own refusals carry).
bool names_capacity(const std::string& m) {
  for (const char* marker : {"maximum context length", "a choice needs at least two options", "options per choice", "a score takes 2 to 10 levels"})
    if (m.find(marker) != std::string::npos) return true;
  return false;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", 100 * x);
  return b;
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* c = app.add_subcommand("eval",
                                   "Rebuild Decision Index benchmarks from their public source files as the kit's exact\n"
                                   "requests, run them through this engine and score them with the kit's rules (macro-F1 or\n"
                                   "accuracy, coverage, chance-corrected skill). Built: banking77 (3,080 rows), clinc150\n"
                                   "(CLINC150 + OOS, 5,500), finentity (979 documents, 2,129 entity questions), cruxeval (570),\n"
                                   "in process (--model) or against a System One server (--endpoint).\n"
                                   "Writes OUT/predictions.jsonl (one line per row: id, request, answers or null + error, gold),\n"
                                   "OUT/report.json and OUT/report.md.");
  c->add_option("--model", o->model, "the Clef folder (run in process)")->check(CLI::ExistingDirectory);
  c->add_option("--synthetic", o->synthetic, "instead of --model: random weights of a preset made on the GPU (clef-27b, clef-flash, small, tiny):\n"
                                             "throughput only, the answers are noise")
      ->check(CLI::IsMember({"clef-27b", "clef-flash", "small", "tiny"}));
  c->add_option("--tokenizer", o->tokenizer, "--synthetic's tokenizer.json (default the pinned Qwen3 one)");
  c->add_option("--endpoint", o->endpoint, "instead of --model: a System One server (ours or another engine's), http://host:port");
  c->add_option("--endpoint-model", o->endpoint_model, "the `model` field sent to --endpoint (default clef)");
  c->add_option("--api-key", o->api_key, "--endpoint's Bearer key (or CLEFRT_API_KEY)")->envname("CLEFRT_API_KEY");
  c->add_option("--concurrency", o->concurrency, "--endpoint: requests in flight (default 4)")->check(positive());
  c->add_option("--timeout", o->timeout_s, "--endpoint: seconds per request (default 600, as the kit)")->check(positive());
  c->add_option("--compare", o->compare, "two finished --out folders: the card table (A, B, delta) and per-question agreement")
      ->expected(2);
  c->add_option("--suite", o->suite, "benchmarks, comma-separated: banking77, clinc150, finentity, cruxeval (default: all four)");
  c->add_option("--data", o->data, "the benchmarks' source files (default ../shared/data; see its SOURCES.md)")->check(CLI::ExistingDirectory);
  c->add_option("--out", o->out, "the output folder (created)");
  c->add_option("--limit", o->limit, "only the first N rows of each benchmark, in the kit's order (0: all)")->check(non_negative());
  c->add_option("--batch", o->batch, "requests handed to the engine at once (default 32)")->check(positive());
  c->add_flag("--resume", o->resume, "keep the answered rows of OUT/predictions.jsonl and run only the others");
  add_engine_flags(*c, o->engine);
  add_env_names(*c);
  return [o]() -> int {
    namespace fs = std::filesystem;
    if (!o->compare.empty()) return compare_runs(o->compare[0], o->compare[1]);
    if (o->out.empty()) throw Error(Status::BadRequest, "usage", "--out is needed (or --compare A B)");
    if (int(!o->model.empty()) + int(!o->endpoint.empty()) + int(!o->synthetic.empty()) != 1)
      throw Error(Status::BadRequest, "usage", "give one of --model DIR, --synthetic PRESET or --endpoint URL");
    std::vector<eval::Benchmark> benches;
    for (const std::string& name : split_commas(o->suite)) benches.push_back(eval::build(name, o->data));
    if (benches.empty()) throw Error(Status::BadRequest, "usage", "--suite names no benchmark");
    fs::create_directories(o->out);
    const std::string pred_path = o->out + "/predictions.jsonl";
    std::map<std::string, json::Value> done;  // id -> answers, from an earlier run
    if (o->resume && fs::exists(pred_path)) {
      std::ifstream in(pred_path);
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        try {
          json::Value v = json::parse(line);
          const json::Value* a = v.find("answers");
          if (a && a->is_object()) done[v.find("id")->s] = *a;
        } catch (const Error&) {  // a line cut by an interrupted run: run that row again
        }
      }
    } else if (fs::exists(pred_path)) {
      throw Error(Status::BadRequest, "usage", pred_path + " exists: pass --resume to continue it, or another --out");
    }
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Endpoint> endpoint;
    if (!o->endpoint.empty()) {
      endpoint = std::make_unique<Endpoint>(parse_endpoint(o->endpoint));
      check_reachable(*endpoint, o->api_key);
    }
    else if (!o->synthetic.empty()) {
      EngineOptions eo = engine_options(o->engine);
      eo.device = Device::Cuda;
      if (eo.quant == QuantMode::Auto) eo.quant = QuantMode::BF16;
      engine = Engine::synthetic(o->synthetic, o->tokenizer, eo);
    } else engine = Engine::load(o->model, engine_options(o->engine));
    std::ofstream pred(pred_path, std::ios::app);
    json::Value report = json::Value::object(), per = json::Value::object();
    std::string md = "| benchmark | metric | native | coverage | raw | skill | rows | answered |\n|---|---|---|---|---|---|---|---|\n";
    size_t failed = 0;  // rows that failed (not capacity refusals) over all benchmarks
    for (const eval::Benchmark& b : benches) {
      const size_t n = o->limit ? std::min(o->limit, b.rows.size()) : b.rows.size();
      std::vector<eval::Outcome> outcomes(n);
      size_t unsupported = 0, errors = 0, resumed = 0;
      const auto t0 = std::chrono::steady_clock::now();
      size_t ran = 0;
      StatusLine status;
      auto progress = [&](size_t at) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rate = secs > 0 ? double(ran) / secs : 0;
        char line[256];
        std::snprintf(line, sizeof line, "eval %s: %zu/%zu rows, %.1f rows/s, ETA %.0f s", b.name.c_str(), at, n, rate,
                      rate > 0 ? double(n - at) / rate : 0.0);
        status.update(line);
      };
      auto write_line = [&](const eval::Row& r, const json::Value* answers, const std::string& error) {
        json::Value line = json::Value::object();
        line.add("id", json::Value::string(r.id));
        line.add("request", r.request);
        line.add("answers", answers ? *answers : json::Value());
        if (!answers) line.add("error", json::Value::string(error));
        line.add("gold", r.gold);
        line.add("payload_sha256", json::Value::string(eval::payload_sha256(r)));
        pred << json::write(line) << "\n";
      };
      std::mutex mu;  // predictions file and counters, for the endpoint's threads
      if (endpoint) {
        std::atomic<size_t> next{0};
        std::vector<std::thread> ts;
        for (size_t c = 0; c < o->concurrency; ++c)
          ts.emplace_back([&] {
            httplib::Client cl(endpoint->base);
            cl.set_read_timeout(std::chrono::duration<double>(o->timeout_s));
            cl.set_write_timeout(std::chrono::duration<double>(o->timeout_s));
            httplib::Headers h;
            if (!o->api_key.empty()) h.emplace("Authorization", "Bearer " + o->api_key);
            for (size_t i; (i = next++) < n;) {
              const eval::Row& r = b.rows[i];
              {
                std::lock_guard<std::mutex> l(mu);
                if (auto it = done.find(r.id); it != done.end()) {
                  outcomes[i] = {true, it->second};
                  ++resumed;
                  continue;
                }
              }
              json::Value body = json::Value::object();
              body.add("model", json::Value::string(o->endpoint_model));
              body.add("state", *r.request.find("state"));
              body.add("questions", *r.request.find("questions"));
              auto res = cl.Post("/v1/systemone", h, json::write(body), "application/json");
              std::lock_guard<std::mutex> l(mu);
              ++ran;
              if (!res) {
                ++errors;
                write_line(r, nullptr, "no response: " + client_error(res.error(), o->timeout_s));
                continue;
              }
              if (res->status != 200) {
                ((res->status == 400 || res->status == 413 || res->status == 422) && names_capacity(res->body) ? unsupported : errors)++;
                write_line(r, nullptr, "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300));
                continue;
              }
              try {
                const json::Value resp = json::parse(res->body);
                const json::Value* ans = resp.find("answers");
                if (!ans || !ans->is_object()) throw Error(Status::Internal, "invalid_response", "no answers object");
                for (const auto& [qid, q] : r.request.find("questions")->obj)
                  if (!ans->find(qid)) throw Error(Status::Internal, "invalid_response", "question " + qid + " unanswered");
                outcomes[i] = {true, *ans};
                write_line(r, ans, "");
              } catch (const Error& e) {
                ++errors;
                write_line(r, nullptr, std::string("invalid response: ") + e.what());
              }
              if (ran % 16 == 0) progress(std::min(n, next.load()));
            }
          });
        for (auto& t : ts) t.join();
        pred.flush();
      }
      for (size_t i0 = 0; !endpoint && i0 < n; i0 += o->batch) {
        std::vector<Prepared> ps;
        std::vector<size_t> idx;
        for (size_t i = i0; i < std::min(n, i0 + o->batch); ++i) {
          const eval::Row& r = b.rows[i];
          if (auto it = done.find(r.id); it != done.end()) {
            outcomes[i] = {true, it->second};
            ++resumed;
            continue;
          }
          try {
            ps.push_back(engine->prepare(json::write(r.request)));
            idx.push_back(i);
          } catch (const Error& e) {
            (names_capacity(e.what()) ? unsupported : errors)++;
            write_line(r, nullptr, e.what());
          }
        }
        std::vector<const Prepared*> pp;
        for (auto& p : ps) pp.push_back(&p);
        std::vector<Probs> probs;
        try {
          probs = engine->probs(pp);
        } catch (const Error&) {  // one failed: run them alone to know which
          probs.clear();
        }
        for (size_t k = 0; k < ps.size(); ++k) {
          const eval::Row& r = b.rows[idx[k]];
          try {
            const Probs p = probs.empty() ? engine->probs({&ps[k]})[0] : probs[k];
            const json::Value resp = json::parse(ps[k].answer(p, AnswerOptions{}));
            outcomes[idx[k]] = {true, *resp.find("answers")};
            write_line(r, resp.find("answers"), "");
          } catch (const Error& e) {
            (names_capacity(e.what()) ? unsupported : errors)++;
            write_line(r, nullptr, e.what());
          }
        }
        pred.flush();
        ran += ps.size();
        progress(std::min(n, i0 + o->batch));
      }
      const eval::Score s = eval::score(b, outcomes);
      status.done("eval " + b.name + ": " + std::to_string(n) + " rows, " + std::to_string(s.answered) + " answered, " +
                  std::to_string(unsupported) + " unsupported, " + std::to_string(errors) + " failed");
      failed += errors;
      json::Value v = json::Value::object();
      v.add("title", json::Value::string(b.title));
      v.add("metric", json::Value::string(b.metric));
      v.add("native", json::Value::number(s.native));
      v.add("raw", json::Value::number(s.raw));
      v.add("coverage", json::Value::number(s.coverage));
      v.add("skill", json::Value::number(s.skill));
      v.add("chance", json::Value::number(b.chance));
      v.add("rows", json::Value::integer(int64_t(s.rows)));
      v.add("answered", json::Value::integer(int64_t(s.answered)));
      v.add("unsupported", json::Value::integer(int64_t(unsupported)));
      v.add("errors", json::Value::integer(int64_t(errors)));
      v.add("resumed", json::Value::integer(int64_t(resumed)));
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      v.add("seconds", json::Value::number(secs));
      v.add("rows_per_s", json::Value::number(secs > 0 ? double(ran) / secs : 0));  // the rows run here (not resumed)
      per.add(b.name, std::move(v));
      md += "| " + b.title + " | " + b.metric + " | " + pct(s.native) + " | " + pct(s.coverage) + " | " + pct(s.raw) + " | " + pct(s.skill) +
            " | " + std::to_string(s.rows) + " | " + std::to_string(s.answered) + " |\n";
    }
    report.add("benchmarks", std::move(per));
    report.add("model", json::Value::string(endpoint ? o->endpoint : !o->synthetic.empty() ? "synthetic " + o->synthetic : o->model));
    report.add("format", json::Value::string(engine ? engine->format() : "endpoint"));
    report.add("version", json::Value::string(version()));
    std::ofstream(o->out + "/report.json") << json::write(report) << "\n";
    std::ofstream(o->out + "/report.md") << "# clefrt eval\n\n" << "Model `" << (endpoint ? o->endpoint : !o->synthetic.empty() ? "synthetic " + o->synthetic : o->model) << "` ("
                                         << (engine ? engine->format() : "endpoint") << "), " << version()
                                         << ". Percent; raw = round(native, 4) x coverage; skill is chance-corrected.\n\n"
                                         << md;
    std::cout << md;
    if (failed) {
      std::fprintf(stderr, "clefrt eval: %zu row(s) failed; their \"error\" field in %s says why\n", failed, pred_path.c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace clefrt::cli

// `clefrt eval`: the Decision Index kit's benchmarks (eval/suite.h) run through this engine in
// process, batched; every answer written to DIR/predictions.jsonl as it comes (a rerun with
// --resume skips what is answered), then scored the kit's way into DIR/report.json and .md.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "common/error.h"
#include "common/file.h"
#include "common/json.h"
#include "eval/suite.h"

namespace clefrt::cli {

namespace {

struct EvalOptions {
  EngineFlags engine;
  std::string model, data = "../shared/data", out, suite = "banking77,clinc150";
  size_t limit = 0, batch = 32;
  bool resume = false;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) v.push_back(x);
  return v;
}

// The kit counts a refusal that names the engine's capacity as unsupported, not failed.
bool is_capacity(const Error& e) {
  const std::string m = e.what();
  return m.find("maximum context length") != std::string::npos || m.find("a choice needs at least two options") != std::string::npos ||
         m.find("options per choice") != std::string::npos || m.find("a score takes 2 to 10 levels") != std::string::npos;
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
                                   "(CLINC150 + OOS, 5,500), finentity (979 documents, 2,129 entity questions). Not yet:\n"
                                   "cruxeval, --endpoint, --compare.\n"
                                   "Writes OUT/predictions.jsonl (one line per row: id, request, answers or null + error, gold),\n"
                                   "OUT/report.json and OUT/report.md.");
  c->add_option("--model", o->model, "the Clef folder")->required()->check(CLI::ExistingDirectory);
  c->add_option("--suite", o->suite, "benchmarks, comma-separated: banking77, clinc150, finentity (default banking77,clinc150)");
  c->add_option("--data", o->data, "the benchmarks' source files (default ../shared/data; see its SOURCES.md)")->check(CLI::ExistingDirectory);
  c->add_option("--out", o->out, "the output folder (created)")->required();
  c->add_option("--limit", o->limit, "only the first N rows of each benchmark, in the kit's order (0: all)")->check(non_negative());
  c->add_option("--batch", o->batch, "requests handed to the engine at once (default 32)")->check(positive());
  c->add_flag("--resume", o->resume, "keep the answered rows of OUT/predictions.jsonl and run only the others");
  add_engine_flags(*c, o->engine);
  add_env_names(*c);
  return [o]() -> int {
    namespace fs = std::filesystem;
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
    EngineOptions eo = engine_options(o->engine);
    std::unique_ptr<Engine> engine = Engine::load(o->model, eo);
    std::ofstream pred(pred_path, std::ios::app);
    json::Value report = json::Value::object(), per = json::Value::object();
    std::string md = "| benchmark | metric | native | coverage | raw | skill | rows | answered |\n|---|---|---|---|---|---|---|---|\n";
    for (const eval::Benchmark& b : benches) {
      const size_t n = o->limit ? std::min(o->limit, b.rows.size()) : b.rows.size();
      std::vector<eval::Outcome> outcomes(n);
      size_t unsupported = 0, errors = 0, resumed = 0;
      const auto t0 = std::chrono::steady_clock::now();
      size_t ran = 0;
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
      for (size_t i0 = 0; i0 < n; i0 += o->batch) {
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
            (is_capacity(e) ? unsupported : errors)++;
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
            (is_capacity(e) ? unsupported : errors)++;
            write_line(r, nullptr, e.what());
          }
        }
        pred.flush();
        ran += ps.size();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const size_t at = std::min(n, i0 + o->batch);
        const double rate = secs > 0 ? double(ran) / secs : 0;
        std::fprintf(stderr, "\reval %s: %zu/%zu rows, %.1f rows/s, ETA %.0f s   ", b.name.c_str(), at, n, rate,
                     rate > 0 ? double(n - at) / rate : 0.0);
      }
      std::fprintf(stderr, "\n");
      const eval::Score s = eval::score(b, outcomes);
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
      per.add(b.name, std::move(v));
      md += "| " + b.title + " | " + b.metric + " | " + pct(s.native) + " | " + pct(s.coverage) + " | " + pct(s.raw) + " | " + pct(s.skill) +
            " | " + std::to_string(s.rows) + " | " + std::to_string(s.answered) + " |\n";
    }
    report.add("benchmarks", std::move(per));
    report.add("model", json::Value::string(o->model));
    report.add("format", json::Value::string(engine->format()));
    report.add("version", json::Value::string(version()));
    std::ofstream(o->out + "/report.json") << json::write(report) << "\n";
    std::ofstream(o->out + "/report.md") << "# clefrt eval\n\n" << "Model `" << o->model << "` (" << engine->format() << "), " << version()
                                         << ". Percent; raw = round(native, 4) x coverage; skill is chance-corrected.\n\n"
                                         << md;
    std::cout << md;
    return 0;
  };
}

}  // namespace clefrt::cli

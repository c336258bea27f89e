// `clefrt decide`: answer requests with a model folder; System One responses on stdout.
#include <chrono>
#include <deque>
#include <future>
#include <iostream>
#include <memory>

#include "cli/commands.h"

namespace clefrt::cli {

namespace {

// Every record prepared and submitted as it is read, at most `window` in flight, so the
// scheduler packs them as the server would; answers printed in input order.
int decide_records(Engine& engine, const std::vector<std::string>& inputs, bool jsonl, const AnswerOptions& ao) {
  struct Item {
    std::string where, body;  // body: kept only for a refused record's hint
    Prepared prepared;
    std::future<Outcome> outcome;
    std::exception_ptr error;  // refused before it could run
  };
  constexpr size_t window = 128;  // under EngineOptions::max_queue's default of 256
  std::deque<Item> pending;
  int status = 0;
  auto print_front = [&] {
    Item it = std::move(pending.front());
    pending.pop_front();
    try {
      if (it.error) std::rethrow_exception(it.error);
      Outcome o = it.outcome.get();
      if (o.kind == Outcome::Kind::Failed) std::rethrow_exception(o.error);
      if (o.kind != Outcome::Kind::Answered) throw Error(Status::Unavailable, "unavailable", "the engine stopped before the request ran");
      std::cout << it.prepared.answer(o.probs, ao, "clef", o.cached_tokens) << "\n";
    } catch (const Error& e) {
      std::cout << e.to_json() << "\n";
      std::cerr << "clefrt decide: " << it.where << ": " << e.http_status() << " " << e.what() << "\n";
      hint_json_lines(e, it.body, it.where);
      status = 1;
    }
  };
  for_each_record(inputs, jsonl, [&](const std::string& body, const std::string& where) {
    Item it;
    it.where = where;
    try {
      it.prepared = engine.prepare(body);
      auto promise = std::make_shared<std::promise<Outcome>>();
      it.outcome = promise->get_future();
      engine.submit(it.prepared, std::chrono::steady_clock::time_point::max(),
                    [promise](const Prepared&, Outcome o) { promise->set_value(std::move(o)); });
    } catch (...) {
      it.error = std::current_exception();
      it.body = body;
    }
    pending.push_back(std::move(it));
    while (pending.size() >= window) print_front();
  });
  while (!pending.empty()) print_front();
  std::cout.flush();
  return status;
}

}  // namespace

Runner add_decide(CLI::App& app) {
  struct Opts {
    EngineFlags engine;
    std::string model, confidence = "reference";
    bool no_batch_invariant = false, precise = false, jsonl = false;
    std::vector<std::string> inputs;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("decide",
                                   "Answer requests with a model folder: prints one System One response per request.\n"
                                   "An invalid request prints the protocol's error JSON and the exit status is 1.\n"
                                   "The requests of a .jsonl file run through the engine's scheduler together (packed\n"
                                   "forwards, as the server runs them); the answers are printed in input order.");
  c->add_option("--model", o->model, "a Clef release folder (bf16/f16/f32 safetensors, NVFP4 or FP8 compressed-tensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  add_engine_flags(*c, o->engine);
  c->add_flag("--no-batch-invariant", o->no_batch_invariant, "cuda: let cuBLASLt choose GEMM algorithms per batch size");
  c->add_flag("--precise", o->precise, "print probabilities, score and confidence unrounded");
  c->add_option("--confidence", o->confidence, "reference (max p, default) | purity | jev")
      ->check(CLI::IsMember({"reference", "purity", "jev"}));
  c->add_flag("--jsonl", o->jsonl, "read stdin ('-') as JSON lines");
  c->add_option("requests", o->inputs, "request files (.json, or .jsonl for one per line); '-' reads stdin")->required();
  add_env_names(*c);
  return [o]() -> int {
    check_request_files(o->inputs);  // a mistyped path costs no model load
    EngineOptions eo = engine_options(o->engine);
    eo.batch_invariant = !o->no_batch_invariant;
    auto engine = Engine::load(o->model, eo);
    AnswerOptions ao;
    ao.precise = o->precise;
    ao.confidence = parse_confidence(o->confidence);
    return decide_records(*engine, o->inputs, o->jsonl, ao);
  };
}

}  // namespace clefrt::cli

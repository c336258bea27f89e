// Subcommands of the `clefrt` binary. Each registers its options on the CLI11 app and
// returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <clefrt/clefrt.h>

#include <functional>
#include <string>
#include <vector>

namespace clefrt::cli {

using Runner = std::function<int()>;

Runner add_encode(CLI::App& app);
Runner add_decide(CLI::App& app);
Runner add_synth(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_quantize(CLI::App& app);
Runner add_eval(CLI::App& app);

// The engine flags `decide` and `serve` share (engine_flags.cpp): --device, --quant,
// --offload-embeddings, --w4a16-fused, --threads, --max-length, --parse-special, --require-instructions,
// --no-check-weights.
struct EngineFlags {
  std::string device = "auto", quant = "auto", attention = "auto";
  // the --no-X flags bind variables named as the flags, so CLEFRT_NO_X=true means what it says
  // (a negated "!--no-x" flag takes its environment value uninverted)
  bool no_vision = false, offload = false, w4a16_fused = false, no_native_fp4 = false, portable_kernels = false, parse_special = false,
       require_instructions = false, no_check_weights = false;
  int threads = 0;
  size_t max_length = 16384;
  double prefix_cache_gib = -1;  // -1: the engine's default
  double prefix_cache_host_gib = 0;
  size_t step_tokens = 0;        // 0: the engine's default
  size_t step_layers = 0;        // 0: the engine's default
  size_t cuda_graphs = kCudaGraphsAfter;
};
void add_engine_flags(CLI::App& c, EngineFlags& f);
// Number checks with readable refusals ("--max-queue: must be at least 1, not 0"; CLI11's own
// print the whole double range): positive() > 0, non_negative() >= 0.
CLI::Validator positive();
CLI::Validator non_negative();
// --max-length: 1 .. kMaxContext tokens (Clef's window), refused while the flags are read
CLI::Validator max_length_range();
CLI::Validator graph_sightings();  // --cuda-graphs: 0 or >= 2

// Every long option of `c` that has no environment variable yet gets CLEFRT_<NAME> (--max-queue:
// CLEFRT_MAX_QUEUE), read when the option is not on the command line: services are configured
// from an environment file. Call after the options are added.
void add_env_names(CLI::App& c);
EngineOptions engine_options(const EngineFlags& f);

// Throws a clear error for a request path that cannot be read (before a model is loaded for
// it); "-" (stdin) passes.
void check_request_files(const std::vector<std::string>& inputs);

// Reads each input: a file, "-" for stdin; a `.jsonl` file (or stdin with --jsonl) gives one
// record per non-empty line. Calls fn(record, where) in order.
void for_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl,
                     const std::function<void(const std::string&, const std::string&)>& fn);

// After a malformed-JSON error on a whole file (or stdin) that holds several lines each starting
// an object: a line on stderr saying it looks like JSON lines.
void hint_json_lines(const Error& e, const std::string& body, const std::string& where);

// Prints answer(record) for each record, one line each. A clefrt::Error prints the protocol's
// error JSON in its place and a line on stderr; the result is then 1, else 0.
int print_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl, const char* command,
                      const std::function<std::string(const std::string&)>& answer);

}  // namespace clefrt::cli

// Subcommands of the `clefrt` binary. Each registers its options on the CLI11 app and
// returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>

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

// --quant and --offload-embeddings, as `decide` and `serve` take them (defined in decide_cmd.cpp).
void add_gpu_weight_options(CLI::App& c, std::string& quant, bool& offload);
// --no-check-weights (CoreOptions::check_weights), as `decide` and `serve` take it.
void add_check_weights_option(CLI::App& c, bool& check);

// Reads each input: a file, "-" for stdin; a `.jsonl` file (or stdin with --jsonl) gives one
// record per non-empty line. Calls fn(record, where) in order.
void for_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl,
                     const std::function<void(const std::string&, const std::string&)>& fn);

// Prints answer(record) for each record, one line each. A clefrt::Error prints the protocol's
// error JSON in its place and a line on stderr; the result is then 1, else 0.
int print_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl, const char* command,
                      const std::function<std::string(const std::string&)>& answer);

}  // namespace clefrt::cli

// `clefrt inspect`: what a model folder holds, without loading the weights (clefrt::inspect).
#include <iostream>
#include <memory>

#include "cli/commands.h"

namespace clefrt::cli {

Runner add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<size_t>(16384);
  CLI::App* c = app.add_subcommand("inspect",
                                   "Print what a Clef folder holds: architecture, sizes, dtypes, parameter counts\n"
                                   "(backbone, vision, head) and the memory each device plan needs. Reads headers only.");
  c->add_option("--model", *dir, "a Clef release folder")->required()->check(CLI::ExistingDirectory);
  c->add_option("--max-length", *max_tokens, "tokens the GPU activation plan is sized for (default 16384)")->check(CLI::PositiveNumber);
  return [dir, max_tokens]() -> int {
    EngineOptions o;
    o.max_length = *max_tokens;
    std::cout << inspect(*dir, o);
    return 0;
  };
}

}  // namespace clefrt::cli

// `clefrt inspect`: what a model folder holds, without loading the weights (clefrt::inspect).
#include <iostream>
#include <memory>

#include "cli/commands.h"

namespace clefrt::cli {

Runner add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<size_t>(16384);
  auto fused = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand("inspect",
                                   "Print what a Clef folder holds: architecture, sizes, dtypes, parameter counts\n"
                                   "(backbone, vision, head) and the memory each device plan needs. Reads headers only.");
  c->add_option("--model", *dir, "a Clef release folder")->required()->check(CLI::ExistingDirectory);
  c->add_option("--max-length", *max_tokens, "tokens the GPU activation plan is sized for, at most 65536 (default 16384)")
      ->check(max_length_range());
  c->add_flag("--w4a16-fused", *fused, "plan NVFP4 with the fused W4A16 GEMM (no staging slots)");
  return [dir, max_tokens, fused]() -> int {
    EngineOptions o;
    o.max_length = *max_tokens;
    o.w4a16_fused = *fused;
    std::cout << inspect(*dir, o);
    return 0;
  };
}

}  // namespace clefrt::cli

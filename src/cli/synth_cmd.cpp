// `clefrt synth`: write a random-weight Clef folder.
#include <iostream>
#include <memory>

#include "cli/commands.h"

namespace clefrt::cli {

Runner add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  CLI::App* c = app.add_subcommand("synth",
                                   "Write a random-weight model folder in the exact Clef release layout (sharded bf16\n"
                                   "safetensors, config.json, joint_head.*, tokenizer.json). Random weights give\n"
                                   "meaningless answers: this is for tests and benchmarks without the real weights.");
  c->add_option("--out", o->out_dir, "output folder (created)")->required();
  c->add_option("--config", o->preset,
                "tiny | small | small-gdn128 (small with the Clef models' 128-wide GDN heads) | clef-flash | clef-27b (default tiny)")
      ->check(CLI::IsMember({"tiny", "small", "small-gdn128", "clef-flash", "clef-27b"}));
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json to ship with the model")->required()->check(CLI::ExistingFile);
  c->add_option("--seed", o->seed, "random seed (default 1)");
  c->add_option("--linear-gain", o->linear_gain,
                "Linear weights ~ normal(0, gain / sqrt(fan_in)) (default 1; 0.5 gives a well-conditioned model whose answers "
                "bf16 compute moves by ~1e-3 rather than ~1e-2)");
  return [o]() {
    synthesize(*o);
    std::cerr << "synth: wrote " << o->preset << " model to " << o->out_dir << "\n";
    return 0;
  };
}

}  // namespace clefrt::cli

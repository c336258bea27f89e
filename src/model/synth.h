// `clefrt synth`: random-weight release folders in the exact Clef layout (sharded bf16
// safetensors, config.json, joint_head.*, tokenizer files). Random weights give meaningless
// answers; they exist to test and benchmark the engine without the real weights.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace clefrt::model {

struct SynthOptions {
  std::string out_dir, preset = "tiny", tokenizer;
  uint64_t seed = 1;
  bool progress = true;
};

// Presets: tiny, small, clef-flash, clef-27b. Throws on an unknown preset or unwritable folder.
void synthesize(const SynthOptions& o);

// The configuration of a preset without writing anything (for `clefrt bench --synthetic`).
ModelConfig synthetic_config(const std::string& preset);

}  // namespace clefrt::model

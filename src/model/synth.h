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
  // Linear weights are normal(0, linear_gain / sqrt(fan_in)). At 1 (unit gain) these random
  // models amplify rounding by orders of magnitude per layer: bf16 compute moves their answers
  // by up to ~0.05 (tiny) and their hidden states by ~10%. At 0.5 the same bf16 rounding moves
  // hidden states by ~0.3-0.5% and answers by ~1e-3 (measured with the CPU engine's bf16
  // rounding points), which is what a GPU accuracy check needs.
  float linear_gain = 1.0f;
};

// Presets: tiny, small, small-gdn128 (small with 128-wide GDN heads), clef-flash, clef-27b. Throws on an unknown preset or unwritable folder.
void synthesize(const SynthOptions& o);

// The configuration of a preset without writing anything (for `clefrt bench --synthetic`).
ModelConfig synthetic_config(const std::string& preset);

}  // namespace clefrt::model

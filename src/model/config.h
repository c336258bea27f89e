// The numbers of a Clef release folder: config.json (text_config, vision_config,
// quantization_config) and joint_head_config.json. Every number is read from the files;
// nothing is derived from the model's name (head_dim is not hidden/heads).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/json.h"

namespace clefrt::model {

enum class LayerType : uint8_t { LinearAttention, FullAttention };  // GDN or gated attention

struct TextConfig {
  int64_t hidden = 0, layers = 0, ffn = 0, vocab = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;                       // full attention
  int64_t k_heads = 0, v_heads = 0, k_head_dim = 0, v_head_dim = 0;       // GDN
  int64_t conv_kernel = 4;
  double rms_eps = 1e-6, rope_theta = 1e7, partial_rotary = 0.25;
  std::vector<int64_t> mrope_section;  // [t, h, w] frequency counts
  std::vector<LayerType> layer_types;
  bool tie_word_embeddings = false;
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary); }
  // Interleaved mRoPE: frequencies below mrope_limit(1) with i % 3 == 1 read the h row, below
  // mrope_limit(2) with i % 3 == 2 the w row (3 x mrope_section[row]; 0 without sections).
  int64_t mrope_limit(int row) const { return mrope_section.size() == 3 ? 3 * mrope_section[size_t(row)] : 0; }
};

struct VisionConfig {
  bool present = false;
  int64_t depth = 0, hidden = 0, heads = 0, ffn = 0, patch = 16, temporal_patch = 2, spatial_merge = 2;
  int64_t in_channels = 3, out_hidden = 0, num_position_embeddings = 0;
};

struct HeadConfig {
  int64_t hidden = 0, width = 0, routing_layers = 0, layers = 0, heads = 0, ffn = 0;
};

struct ModelConfig {
  std::string architecture, model_type;
  TextConfig text;
  VisionConfig vision;
  HeadConfig head;
  std::optional<json::Value> quantization;  // the raw quantization_config block, if any
};

// Reads config.json and joint_head_config.json from `dir`. Throws load_error naming the file
// and the field that is missing or inconsistent.
ModelConfig load_config(const std::string& dir);
TextConfig parse_text_config(const json::Value& tc, const std::string& where);
HeadConfig parse_head_config(const json::Value& hc, const std::string& where);

}  // namespace clefrt::model

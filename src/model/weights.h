// The model as data: every tensor the forward pass and the joint head read, converted to fp32
// once at load and checked against config.json (names and shapes from spec/model.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace clefrt::model {

struct Tensor {
  std::vector<float> v;
  std::vector<int64_t> shape;
  const float* data() const { return v.data(); }
  int64_t dim(size_t i) const { return shape[i]; }
};

struct GdnWeights {
  Tensor in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj;
};
struct AttnWeights {
  Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
};
struct LayerWeights {
  LayerType type = LayerType::LinearAttention;
  Tensor input_norm, post_norm, gate_proj, up_proj, down_proj;
  GdnWeights gdn;
  AttnWeights attn;
};
struct TextWeights {
  Tensor embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
};

struct Mha {
  Tensor in_w, in_b, out_w, out_b;
};
struct LayerNormW {
  Tensor w, b;
};
struct HeadWeights {
  LayerNormW hidden_norm, option_summary_norm, field_norm, option_norm;
  Tensor memory_proj, question_proj, option_question_proj, global_proj, option_context_proj, option_lexical_proj;
  Tensor type_embedding;
  struct Evidence {
    LayerNormW query_norm, memory_norm, ff_norm;
    Mha attn;
    Tensor ff0_w, ff0_b, ff3_w, ff3_b;
  };
  std::vector<Evidence> evidence;
  struct Decoder {
    Mha self_attn, cross_attn;
    Tensor lin1_w, lin1_b, lin2_w, lin2_b;
    LayerNormW norm1, norm2, norm3;
  };
  std::vector<Decoder> layers;
  Tensor scorer0_w, scorer0_b, scorer3_w, scorer3_b;
  float prior_logit_scale = 0, joint_logit_scale = 0, residual_gate = 0;
};

// Reads and checks every tensor (shape, dtype BF16/F16/F32). Throws load_error naming the file,
// the tensor and the expected vs found shape.
TextWeights load_text_weights(const io::TensorStore& store, const TextConfig& cfg);
HeadWeights load_head_weights(const io::TensorStore& store, const HeadConfig& cfg);

// bf16 / f16 / f32 bytes -> fp32.
std::vector<float> to_f32(const io::TensorInfo& t);

}  // namespace clefrt::model

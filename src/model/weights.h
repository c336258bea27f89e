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
  std::vector<float> v;  // empty when loaded lazily (the GPU engine reads `src` itself)
  std::vector<int64_t> shape;
  std::string name;  // as the checkpoint names it (empty for synthetic)
  // The mapped tensor it came from: valid only while its TensorStore lives (the CPU engine drops
  // its store after loading; the GPU loader uploads while it is open). Null for synthetic.
  const io::TensorInfo* src = nullptr;
  // Quantized checkpoints (spec/quant.md), dequantized at load for the CPU engine:
  enum class Quant : uint8_t { None, Nvfp4, Fp8 } quant = Quant::None;
  float input_global_scale = 0;   // NVFP4 W4A4: activations are fake-quantized before the product
  // The raw quantized form, kept for the GPU engine (LoadMode::Lazy): `src` is weight_packed
  // (NVFP4) or the e4m3 weight (FP8); `scale_src` its weight_scale (NVFP4 e4m3 [out, in/16];
  // FP8 F32 [1] or [out, 1]).
  const io::TensorInfo* scale_src = nullptr;
  float weight_global_scale = 0;  // NVFP4
  bool fp8_dynamic_activations = false;  // FP8 W8A8: per-token e4m3 activations
  const float* data() const { return v.data(); }
  int64_t dim(size_t i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t numel_rows() const { return shape.empty() ? 1 : numel() / shape.back(); }  // rows of a [.., cols] matrix
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

// The vision tower (`model.visual.`, spec/model.md 2), Qwen3-VL without deepstack.
struct VisionBlockWeights {
  LayerNormW norm1, norm2;
  Tensor qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b;
};
struct VisionWeights {
  Tensor patch_w, patch_b;  // Conv3d [hidden, C, T, P, P] (read as a Linear over C*T*P*P) + bias
  Tensor pos_embed;         // [num_position_embeddings, hidden]: a side x side grid
  std::vector<VisionBlockWeights> blocks;
  LayerNormW merger_norm;
  Tensor merger_fc1_w, merger_fc1_b, merger_fc2_w, merger_fc2_b;
};

// Every tensor of the tower, in load order (memory plans, tests).
std::vector<const Tensor*> vision_tensors(const VisionWeights& v);

// Reads and checks every tensor (shape, dtype BF16/F16/F32). Throws load_error naming the file,
// the tensor and the expected vs found shape.
// Full: every tensor converted to fp32 (the CPU engine).
// Lazy: names, shapes and dtypes checked, nothing converted; each Tensor keeps only `src` (the
//   store must outlive it). The GPU engine uploads from there without an fp32 copy of the model.
// ShapeOnly: no store at all; every Tensor has just its shape (v empty, src null). The GPU
//   benchmark fills such tensors with random values directly in GPU memory.
enum class LoadMode { Full, Lazy, ShapeOnly };

// How a quantized checkpoint's activations are quantized (from quantization_config), applied to
// every quantized Linear the loader finds.
struct QuantActivations {
  bool fp8_dynamic = false;  // FP8 scheme with dynamic per-token input activations
};
TextWeights load_text_weights(const io::TensorStore& store, const TextConfig& cfg, LoadMode mode = LoadMode::Full,
                              QuantActivations qa = {});
HeadWeights load_head_weights(const io::TensorStore& store, const HeadConfig& cfg, LoadMode mode = LoadMode::Full);
// From the backbone's store; throws load_error naming the tensor when the folder has a
// vision_config but not its weights.
VisionWeights load_vision_weights(const io::TensorStore& store, const VisionConfig& cfg, LoadMode mode = LoadMode::Full);
// The shapes of every tensor of a configuration, no data (LoadMode::ShapeOnly).
TextWeights shape_only_text(const TextConfig& cfg);
HeadWeights shape_only_head(const HeadConfig& cfg);
VisionWeights shape_only_vision(const VisionConfig& cfg);

// bf16 / f16 / f32 bytes -> fp32.
std::vector<float> to_f32(const io::TensorInfo& t);

}  // namespace clefrt::model

// The model resident in GPU memory: bf16 matrices (fused where one input feeds several
// projections), fp32 vectors. Built from weights loaded lazily from a folder (no fp32 copy of
// the model on the host) or, for the benchmark, from shapes alone with random values filled on
// the GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda/buffer.h"
#include "cuda/kernels.h"
#include "model/config.h"
#include "model/weights.h"

namespace clefrt::cuda {

struct DevLinear {
  const bf16* w = nullptr;  // [n, k] row-major
  int64_t n = 0, k = 0;
};
// The joint head's matrices stay fp32: it is under 1% of the work and its logits feed a
// softmax directly, so bf16 rounding there would cost accuracy for nothing.
struct DevLinear32 {
  const float* w = nullptr;  // [n, k] row-major
  int64_t n = 0, k = 0;
};
struct DevLN {
  const float *w = nullptr, *b = nullptr;
};

struct DevLayer {
  model::LayerType type;
  const float *input_norm, *post_norm;
  DevLinear gate_up, down;  // gate rows then up rows
  // GDN: in = [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a] rows
  DevLinear gdn_in, gdn_out;
  const float *conv_w = nullptr, *neg_A = nullptr, *dt_bias = nullptr, *gdn_norm = nullptr;
  // attention: qkv = [q_proj (q|gate per head) | k_proj | v_proj] rows
  DevLinear qkv, o;
  const float *q_norm = nullptr, *k_norm = nullptr;
};

struct DevMha {
  DevLinear32 in, out;  // in: [3W, W] (q, k, v rows)
  const float *in_b, *out_b;
};

struct DevHead {
  DevLN hidden_norm, option_summary_norm, field_norm, option_norm;
  DevLinear32 memory_proj, question_proj, option_question_proj, global_proj, option_context_proj, option_lexical_proj;
  const float* type_emb;
  struct Evidence {
    DevLN query_norm, memory_norm, ff_norm;
    DevMha attn;
    DevLinear32 ff0, ff3;
    const float *ff0_b, *ff3_b;
  };
  std::vector<Evidence> evidence;
  struct Decoder {
    DevMha self_attn, cross_attn;
    DevLinear32 lin1, lin2;
    const float *lin1_b, *lin2_b;
    DevLN norm1, norm2, norm3;
  };
  std::vector<Decoder> layers;
  DevLinear32 scorer0;
  const float *scorer0_b, *scorer3_w;
  float scorer3_b = 0;
  HeadScalars scalars{};
};

struct DevModel {
  model::TextConfig c;
  model::HeadConfig hc;
  const bf16 *embed = nullptr, *lm_head = nullptr;
  const float* final_norm = nullptr;
  const float* inv_freq = nullptr;  // RoPE, R/2 values computed as the CPU twin does
  std::vector<DevLayer> layers;
  DevHead head;
  size_t weight_bytes = 0;
  std::vector<DeviceBuffer> owned;
};

// From weights loaded with LoadMode::Lazy (or Full): BF16 uploaded as is, F16/F32 rounded to
// bf16 (matrices) or kept fp32 (vectors). Tensors with no data (LoadMode::ShapeOnly) are filled
// with deterministic random values on the GPU (seed), scaled like `clefrt synth`'s.
DevModel build_device_model(const model::TextWeights& tw, const model::HeadWeights& hw, const model::TextConfig& c,
                            const model::HeadConfig& hc, uint64_t seed = 1, bool progress = false);

}  // namespace clefrt::cuda

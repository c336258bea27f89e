// The model resident in GPU memory: bf16 matrices (fused where one input feeds several
// projections), fp32 vectors. Built from weights loaded lazily from a folder (no fp32 copy of
// the model on the host) or, for the benchmark, from shapes alone with random values filled on
// the GPU.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/runtime/buffer.h"
#include "cuda/runtime/device_pool.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/mode.h"

namespace clefrt::cuda {

// How a block of a Linear's output rows is stored (spec/quant.md).
enum class WFormat : uint8_t { BF16, NVFP4, FP8 };

// Rows [row0, row0 + n) of a (possibly fused) Linear, all in one format.
struct DevLinearPart {
  WFormat fmt = WFormat::BF16;
  int64_t row0 = 0, n = 0, k = 0;
  const bf16* w = nullptr;             // BF16: [n, k] row-major
  const uint8_t* packed = nullptr;     // NVFP4: [n, k/2], even column in the low nibble
  const uint8_t* scales = nullptr;     // NVFP4: e4m3 [n, k/16]
  const float* row_gs = nullptr;       // NVFP4: each row's global scale [n]
  // NVFP4 on Hopper (BuildOptions::w4a16_rs): the short-input GEMM's tables (nvfp4_gemm_rs), made
  // at load where the part's 64-row groups take at most 2 global scales each. Set means `packed`
  // holds the codes in that GEMM's order (nvfp4_rs_repack; the staging reads them with
  // nvfp4_dequantize_rs); unset, the file's order (staged always).
  Nvfp4RsTables rs;
  float input_global_scale = 0;        // NVFP4: > 0 = W4A4 (activations quantized first), 0 = W4A16
  // NVFP4 W4A4 on Blackwell (compute capability >= 10; UNTESTED here): the scales in cuBLASLt's
  // swizzled layout and the part's one global scale; set means the native FP4 GEMM runs it.
  const uint8_t* scales_swizzled = nullptr;
  float part_gs = 0;
  const uint8_t* w8 = nullptr;         // FP8: e4m3 [n, kp], zero in columns [k, kp)
  int64_t kp = 0;                      // FP8: k rounded up to 16 (cuBLASLt's FP8 alignment)
  const float* row_scale = nullptr;    // FP8: per output row [n]
};
// y[m, n] = x[m, k] W^T for W = the parts stacked by rows (q|k|v, gate|up, ...).
struct DevLinear {
  std::vector<DevLinearPart> parts;
  int64_t n = 0, k = 0;
};
// A joint head matrix. The head computes in fp32 (it is under 1% of the work and its logits
// feed a softmax directly). Matrices that only head_gemm reads are held as bf16 when that is
// exact (a bf16 file, as the release's head is, or random weights): half the memory, the same
// values; the memory projection and the memory keys / values (cuBLASLt fp32 GEMMs over every
// token) stay fp32.
struct DevLinear32 {
  const float* w = nullptr;  // [n, k] row-major fp32, or
  const bf16* wh = nullptr;  // [n, k] row-major bf16
  int64_t n = 0, k = 0;
  // w's TF32 hi / lo planes (f32_split_tf32_planes) for f32_gemm_3xtf32_wgmma, made at load for
  // the token-row matrices where that kernel runs; null elsewhere
  const float *whi = nullptr, *wlo = nullptr;
};
struct DevLN {
  const float *w = nullptr, *b = nullptr;
};

struct DevLayer {
  model::LayerType type;
  const float *input_norm, *post_norm;
  DevLinear gate_up, down;  // gate rows then up rows
  // GDN: in = [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a] rows (b and a are kept in bf16
  // by the quantization recipe, so in a quantized model they are a part of their own)
  DevLinear gdn_in, gdn_out;
  const float *conv_w = nullptr, *neg_A = nullptr, *dt_bias = nullptr, *gdn_norm = nullptr;
  // attention: qkv = [q_proj (q|gate per head) | k_proj | v_proj] rows
  DevLinear qkv, o;
  const float *q_norm = nullptr, *k_norm = nullptr;
};

struct DevMha {
  DevLinear32 in, out;  // in: [3W, W] (q, k, v rows); fp32 where its k / v rows run over memory tokens
  const float *in_b, *out_b;
  const float *kv_hi = nullptr, *kv_lo = nullptr;  // in's k | v rows as TF32 planes (DevLinear32::whi / wlo)
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

// The vision tower (spec/model.md 2): bf16 matrices and fp32 vectors whatever --quant says (the
// community NVFP4 build keeps the tower bf16 too; `clefrt quantize` leaves model.visual.* alone).
struct DevVisionBlock {
  DevLN norm1, norm2;
  const bf16 *qkv = nullptr, *proj = nullptr, *fc1 = nullptr, *fc2 = nullptr;  // [out, in]
  // qkv's and fc1's biases in bf16 (cuBLASLt's epilogue takes them in the output's type; a bf16
  // release holds them so); proj's and fc2's in fp32 (the residual's, DevVision::bias_before)
  const bf16 *qkv_b = nullptr, *fc1_b = nullptr;
  const float *proj_b = nullptr, *fc2_b = nullptr;
};
struct DevVision {
  model::VisionConfig c;
  const bf16* patch = nullptr;  // the Conv3d as a Linear [hidden, C * T * P * P]
  const float *patch_b = nullptr, *pos_table = nullptr;  // pos_table [num_position_embeddings, hidden] fp32
  const float* inv_freq = nullptr;                       // the 2-D rotary's hd / 4 frequencies
  std::vector<DevVisionBlock> blocks;
  // The residual stream leaves out proj's and fc2's biases (their GEMMs accumulate into it); the
  // LayerNorms read x + the biases of every earlier proj / fc2, in order: [2 l] before block l's
  // norm1 (null for block 0), [2 l + 1] before its norm2, the last before the merger's norm.
  std::vector<const float*> bias_before;
  DevLN merger_norm;
  const bf16 *merger_fc1 = nullptr, *merger_fc2 = nullptr;
  const float *merger_fc1_b = nullptr, *merger_fc2_b = nullptr;
};

struct DevModel {
  model::TextConfig c;
  model::HeadConfig hc;
  // In GPU memory, or (offload_embeddings) in mapped host memory read by the kernels over PCIe.
  const bf16 *embed = nullptr, *lm_head = nullptr;
  const float* final_norm = nullptr;
  const float* inv_freq = nullptr;  // RoPE, R/2 values computed as the CPU twin does
  std::vector<DevLayer> layers;
  DevHead head;
  bool has_vision = false;  // the folder's tower was uploaded (images run on the GPU)
  DevVision vision;
  size_t weight_bytes = 0;       // bytes of the weights on the GPU
  size_t weight_reserved_bytes = 0;  // GPU memory the pool holds for them (granule-rounded)
  size_t host_weight_bytes = 0;  // pinned host memory (offloaded embeddings)
  size_t bytes_by_format[3] = {0, 0, 0};  // backbone Linears, by WFormat
  bool has_nvfp4 = false, has_w4a4 = false, has_fp8 = false, has_native_fp4 = false;
  int64_t max_k = 0;  // widest Linear input (activation scratch of the quantized paths)
  DevicePool pool;  // every weight on the GPU
  std::vector<HostBuffer> owned_host;
};

struct BuildOptions {
  uint64_t seed = 1;
  bool progress = false;
  std::function<void(size_t layer, size_t layers)> on_layer;  // after each layer's upload (load progress)
  // What the backbone's Linears become (Auto: what each tensor holds). bf16 <-> fp8 <-> nvfp4
  // conversions run on the GPU at load; --quant nvfp4 (W4A4) needs calibrated input scales,
  // which only a W4A4 folder has (or the synthetic model, which makes one up).
  QuantMode quant = QuantMode::Auto;
  bool offload_embeddings = false;
  // W4A4 parts run on native FP4 tensor cores when the GPU has them (compute capability >= 10,
  // Blackwell); false keeps the emulated path (dequantized weights, fake-quantized activations),
  // which is also what runs on Hopper (EngineOptions::native_fp4).
  bool native_fp4 = true;
  // The head's token-row matrices also as TF32 hi / lo planes for f32_gemm_3xtf32_wgmma where it
  // runs (DevLinear32::whi / wlo); false (EngineOptions::portable_kernels: mma.sync reads w) makes
  // none.
  bool head_tf32_planes = true;
  // NVFP4 parts with the short-input GEMM's tables and codes in its order where it runs (Hopper,
  // DevLinearPart::rs); false (EngineOptions::portable_kernels, w4a16_fused: kernels that read the
  // file's order) makes none.
  bool w4a16_rs = true;
  // Synthetic W4A4: the static activation global scale random weights get (448 * 6 / 8: inputs
  // of magnitude up to ~8, which (1+w) RMSNorm outputs are).
  float synthetic_input_global_scale = 336.0f;
};

// The CUDA context reserves local memory for every thread the GPU can hold at the default
// 1 KiB stack (264 MiB on an H200) although clefrt's kernels use at most 112 bytes. Sets the
// stack limit to 0: the driver then grows the reservation to what each launched kernel needs
// (measured: 527 -> 263 MiB of context). build_device_model calls it first.
void trim_stack_reservation();

// From weights loaded with LoadMode::Lazy (or Full): BF16 uploaded as is, F16/F32 rounded to
// bf16 (matrices) or kept fp32 (vectors), NVFP4 / FP8 kept or converted as `o.quant` says.
// Tensors with no data (LoadMode::ShapeOnly) are filled with deterministic random values on the
// GPU (seed), scaled like `clefrt synth`'s. Throws load_error for what cannot be run.
// vw / vc: the vision tower's weights and numbers, or null for a model that takes no images.
DevModel build_device_model(const model::TextWeights& tw, const model::HeadWeights& hw, const model::TextConfig& c,
                            const model::HeadConfig& hc, const BuildOptions& o = {}, const model::VisionWeights* vw = nullptr,
                            const model::VisionConfig* vc = nullptr);

}  // namespace clefrt::cuda

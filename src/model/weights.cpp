#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "quant/formats.h"

namespace clefrt::model {

using io::DType;

static float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) f = std::ldexp(float(man), -24);
  else if (exp == 31) f = man ? NAN : INFINITY;
  else f = std::ldexp(float(man | 0x400), int(exp) - 25);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<float> to_f32(const io::TensorInfo& t) {
  std::vector<float> out(size_t(t.numel()));
  switch (t.dtype) {
    case DType::F32: std::memcpy(out.data(), t.data, t.nbytes); break;
    case DType::BF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint32_t bits = uint32_t(uint16_t(t.data[2 * i] | (t.data[2 * i + 1] << 8))) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = half_to_float(uint16_t(t.data[2 * i] | (t.data[2 * i + 1] << 8)));
      break;
    default:
      throw load_error(*t.file, "tensor " + t.name + " has dtype " + io::dtype_name(t.dtype) +
                                    "; the CPU engine reads BF16, F16 or F32 (quantized formats are not supported yet)");
  }
  return out;
}

namespace {
const std::vector<DType> kFloat = {DType::BF16, DType::F16, DType::F32};

struct Loader {
  const io::TensorStore& s;
  LoadMode mode = LoadMode::Full;
  QuantActivations qa{};

  static bool ends_with(const std::string& a, const std::string& b) {
    return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  }
  float scalar_f32(const std::string& name) const {
    const io::TensorInfo* t = s.find(name);
    if (!t) throw load_error(name, "tensor is missing from the weights");
    if (t->dtype != DType::F32 || t->numel() != 1)
      throw load_error(*t->file, "tensor " + name + " must be one F32 value, is " + io::dtype_name(t->dtype) + " " + t->shape_str());
    float v;
    std::memcpy(&v, t->data, 4);
    if (!std::isfinite(v) || v <= 0) throw load_error(*t->file, "tensor " + name + " must be a positive finite scale, is " + std::to_string(v));
    return v;
  }
  // NVFP4 (compressed-tensors nvfp4-pack-quantized): weight_packed, weight_scale, weight_global_scale
  // [, input_global_scale], dequantized bit for bit as spec/quant.md says.
  Tensor nvfp4(const std::string& base, std::vector<int64_t> shape) const {
    if (shape.size() != 2 || shape[1] % 16 != 0)
      throw load_error(base + ".weight_packed", "NVFP4 needs a matrix whose inputs are a multiple of 16, expected " + io::shape_str(shape));
    const io::TensorInfo& p = s.require(base + ".weight_packed", {shape[0], shape[1] / 2}, {DType::U8});
    const io::TensorInfo& sc = s.require(base + ".weight_scale", {shape[0], shape[1] / 16}, {DType::F8_E4M3});
    const float gs = scalar_f32(base + ".weight_global_scale");
    // Lazy (GPU): kept packed; the GPU dequantizes with the same formula (or keeps it packed).
    std::vector<float> v = mode == LoadMode::Lazy ? std::vector<float>{} : quant::nvfp4_dequantize(p.data, sc.data, gs, shape[0], shape[1]);
    Tensor t{std::move(v), std::move(shape), base + ".weight", &p};
    t.quant = Tensor::Quant::Nvfp4;
    t.scale_src = &sc;
    t.weight_global_scale = gs;
    if (s.find(base + ".input_global_scale")) t.input_global_scale = scalar_f32(base + ".input_global_scale");
    return t;
  }
  // FP8 (compressed-tensors float-quantized): weight in e4m3 and weight_scale per tensor [1] or
  // per output channel [out, 1]; W = e4m3 * scale.
  Tensor fp8(const io::TensorInfo& w, const std::string& base, std::vector<int64_t> shape) const {
    if (w.shape != shape) throw load_error(*w.file, "tensor " + w.name + " has shape " + w.shape_str() + ", expected " + io::shape_str(shape));
    const io::TensorInfo* sc = s.find(base + ".weight_scale");
    if (!sc) throw load_error(base + ".weight_scale", "missing: an F8_E4M3 weight needs its weight_scale");
    if (sc->dtype != DType::F32 || !(sc->numel() == 1 || (sc->numel() == shape[0] && sc->shape.size() == 2 && sc->shape[1] == 1)))
      throw load_error(*sc->file, "tensor " + sc->name + " must be F32 [1] or [" + std::to_string(shape[0]) + ", 1], is " +
                                      io::dtype_name(sc->dtype) + " " + sc->shape_str());
    if (s.find(base + ".input_scale"))
      throw load_error(base + ".input_scale", "static FP8 activation scales are not supported yet (dynamic per-token ones are)");
    std::vector<float> scale(size_t(sc->numel()));
    std::memcpy(scale.data(), sc->data, scale.size() * 4);
    for (float f : scale)
      if (!std::isfinite(f) || f <= 0) throw load_error(*sc->file, "tensor " + sc->name + " holds a scale that is not positive and finite");
    const int64_t cols = shape.size() == 2 ? shape[1] : 1;
    std::vector<float> v;
    if (mode != LoadMode::Lazy) {
      v.resize(size_t(w.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = quant::e4m3_value(w.data[i]) * scale[scale.size() == 1 ? 0 : i / size_t(cols)];
    }
    Tensor t{std::move(v), std::move(shape), w.name, &w};
    t.quant = Tensor::Quant::Fp8;
    t.scale_src = sc;
    t.fp8_dynamic_activations = qa.fp8_dynamic;
    return t;
  }
  Tensor get(const std::string& name, std::vector<int64_t> shape) const {
    if (mode == LoadMode::ShapeOnly) return Tensor{{}, std::move(shape), name, nullptr};
    if (ends_with(name, ".weight")) {
      const std::string base = name.substr(0, name.size() - 7);
      if (!s.find(name) && s.find(base + ".weight_packed")) return nvfp4(base, std::move(shape));
      if (const io::TensorInfo* t = s.find(name); t && t->dtype == DType::F8_E4M3) return fp8(*t, base, std::move(shape));
    }
    const io::TensorInfo& t = s.require(name, shape, kFloat);
    return Tensor{mode == LoadMode::Lazy ? std::vector<float>{} : to_f32(t), std::move(shape), name, &t};
  }
  LayerNormW ln(const std::string& name, int64_t d) const { return {get(name + ".weight", {d}), get(name + ".bias", {d})}; }
  Mha mha(const std::string& name, int64_t w) const {
    return {get(name + ".in_proj_weight", {3 * w, w}), get(name + ".in_proj_bias", {3 * w}), get(name + ".out_proj.weight", {w, w}),
            get(name + ".out_proj.bias", {w})};
  }
  float scalar(const std::string& name, float shape_only_value) const {
    if (mode == LoadMode::ShapeOnly) return shape_only_value;
    const io::TensorInfo* t = s.find(name);
    if (!t) throw load_error(name, "tensor is missing from joint_head.safetensors");
    if (t->numel() != 1) throw load_error(*t->file, "tensor " + name + " must be a scalar, has shape " + t->shape_str());
    return to_f32(*t)[0];
  }
  // Shape [rows, cols] where rows is read from the file (hidden sizes the config does not name).
  Tensor get_rows(const std::string& name, int64_t cols, int64_t shape_only_rows) const {
    if (mode == LoadMode::ShapeOnly) return get(name, {shape_only_rows, cols});
    const io::TensorInfo* t = s.find(name);
    if (!t) throw load_error(name, "tensor is missing from the weights");
    if (t->shape.size() != 2 || t->shape[1] != cols)
      throw load_error(*t->file, "tensor " + name + " has shape " + t->shape_str() + ", expected [*, " + std::to_string(cols) + "]");
    return get(name, t->shape);
  }
};
}  // namespace

VisionWeights load_vision_weights(const io::TensorStore& store, const VisionConfig& c, LoadMode mode) {
  Loader L{store, mode, {}};
  VisionWeights v;
  const std::string p = "model.visual.";
  const int64_t H = c.hidden, m2 = c.spatial_merge * c.spatial_merge;
  v.patch_w = L.get(p + "patch_embed.proj.weight", {H, c.in_channels, c.temporal_patch, c.patch, c.patch});
  v.patch_b = L.get(p + "patch_embed.proj.bias", {H});
  v.pos_embed = L.get(p + "pos_embed.weight", {c.num_position_embeddings, H});
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    VisionBlockWeights w;
    w.norm1 = L.ln(b + "norm1", H);
    w.norm2 = L.ln(b + "norm2", H);
    w.qkv_w = L.get(b + "attn.qkv.weight", {3 * H, H});
    w.qkv_b = L.get(b + "attn.qkv.bias", {3 * H});
    w.proj_w = L.get(b + "attn.proj.weight", {H, H});
    w.proj_b = L.get(b + "attn.proj.bias", {H});
    w.fc1_w = L.get(b + "mlp.linear_fc1.weight", {c.ffn, H});
    w.fc1_b = L.get(b + "mlp.linear_fc1.bias", {c.ffn});
    w.fc2_w = L.get(b + "mlp.linear_fc2.weight", {H, c.ffn});
    w.fc2_b = L.get(b + "mlp.linear_fc2.bias", {H});
    v.blocks.push_back(std::move(w));
  }
  v.merger_norm = L.ln(p + "merger.norm", H);
  v.merger_fc1_w = L.get(p + "merger.linear_fc1.weight", {m2 * H, m2 * H});
  v.merger_fc1_b = L.get(p + "merger.linear_fc1.bias", {m2 * H});
  v.merger_fc2_w = L.get(p + "merger.linear_fc2.weight", {c.out_hidden, m2 * H});
  v.merger_fc2_b = L.get(p + "merger.linear_fc2.bias", {c.out_hidden});
  return v;
}

TextWeights load_text_weights(const io::TensorStore& store, const TextConfig& c, LoadMode mode, QuantActivations qa) {
  Loader L{store, mode, qa};
  TextWeights w;
  const std::string p = "model.language_model.";
  w.embed = L.get(p + "embed_tokens.weight", {c.vocab, c.hidden});
  w.final_norm = L.get(p + "norm.weight", {c.hidden});
  if (mode == LoadMode::ShapeOnly || store.find("lm_head.weight")) w.lm_head = L.get("lm_head.weight", {c.vocab, c.hidden});
  else if (c.tie_word_embeddings) w.lm_head = w.embed;
  else throw load_error("lm_head.weight", "tensor is missing and tie_word_embeddings is false");
  const int64_t key_dim = c.k_heads * c.k_head_dim, value_dim = c.v_heads * c.v_head_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string lp = p + "layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.type = c.layer_types[size_t(i)];
    lw.input_norm = L.get(lp + "input_layernorm.weight", {c.hidden});
    lw.post_norm = L.get(lp + "post_attention_layernorm.weight", {c.hidden});
    lw.gate_proj = L.get(lp + "mlp.gate_proj.weight", {c.ffn, c.hidden});
    lw.up_proj = L.get(lp + "mlp.up_proj.weight", {c.ffn, c.hidden});
    lw.down_proj = L.get(lp + "mlp.down_proj.weight", {c.hidden, c.ffn});
    if (lw.type == LayerType::LinearAttention) {
      const std::string g = lp + "linear_attn.";
      lw.gdn.in_proj_qkv = L.get(g + "in_proj_qkv.weight", {conv_dim, c.hidden});
      lw.gdn.in_proj_z = L.get(g + "in_proj_z.weight", {value_dim, c.hidden});
      lw.gdn.in_proj_b = L.get(g + "in_proj_b.weight", {c.v_heads, c.hidden});
      lw.gdn.in_proj_a = L.get(g + "in_proj_a.weight", {c.v_heads, c.hidden});
      lw.gdn.conv1d = L.get(g + "conv1d.weight", {conv_dim, 1, c.conv_kernel});
      lw.gdn.dt_bias = L.get(g + "dt_bias", {c.v_heads});
      lw.gdn.A_log = L.get(g + "A_log", {c.v_heads});
      lw.gdn.norm = L.get(g + "norm.weight", {c.v_head_dim});
      lw.gdn.out_proj = L.get(g + "out_proj.weight", {c.hidden, value_dim});
    } else {
      const std::string a = lp + "self_attn.";
      lw.attn.q_proj = L.get(a + "q_proj.weight", {c.q_heads * 2 * c.head_dim, c.hidden});
      lw.attn.k_proj = L.get(a + "k_proj.weight", {c.kv_heads * c.head_dim, c.hidden});
      lw.attn.v_proj = L.get(a + "v_proj.weight", {c.kv_heads * c.head_dim, c.hidden});
      lw.attn.o_proj = L.get(a + "o_proj.weight", {c.hidden, c.q_heads * c.head_dim});
      lw.attn.q_norm = L.get(a + "q_norm.weight", {c.head_dim});
      lw.attn.k_norm = L.get(a + "k_norm.weight", {c.head_dim});
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

HeadWeights load_head_weights(const io::TensorStore& store, const HeadConfig& c, LoadMode mode) {
  Loader L{store, mode, {}};
  HeadWeights h;
  const int64_t d = c.hidden, W = c.width;
  h.hidden_norm = L.ln("hidden_norm", d);
  h.memory_proj = L.get("memory_projection.weight", {W, d});
  h.question_proj = L.get("question_projection.weight", {W, d});
  h.option_question_proj = L.get("option_question_projection.weight", {W, d});
  h.global_proj = L.get("global_projection.weight", {W, d});
  h.option_context_proj = L.get("option_context_projection.weight", {W, d});
  h.option_lexical_proj = L.get("option_lexical_projection.weight", {W, d});
  h.type_embedding = L.get("type_embedding.weight", {3, W});
  for (int64_t n = 0; n < c.routing_layers; ++n) {
    const std::string e = "evidence_layers." + std::to_string(n) + ".";
    HeadWeights::Evidence ev;
    ev.query_norm = L.ln(e + "query_norm", W);
    ev.memory_norm = L.ln(e + "memory_norm", W);
    ev.ff_norm = L.ln(e + "feedforward_norm", W);
    ev.attn = L.mha(e + "attention", W);
    ev.ff0_w = L.get(e + "feedforward.0.weight", {c.ffn, W});
    ev.ff0_b = L.get(e + "feedforward.0.bias", {c.ffn});
    ev.ff3_w = L.get(e + "feedforward.3.weight", {W, c.ffn});
    ev.ff3_b = L.get(e + "feedforward.3.bias", {W});
    h.evidence.push_back(std::move(ev));
  }
  h.option_summary_norm = L.ln("option_summary_norm", W);
  for (int64_t n = 0; n < c.layers; ++n) {
    const std::string l = "layers." + std::to_string(n) + ".";
    HeadWeights::Decoder dl;
    dl.self_attn = L.mha(l + "self_attn", W);
    dl.cross_attn = L.mha(l + "multihead_attn", W);
    dl.lin1_w = L.get(l + "linear1.weight", {c.ffn, W});
    dl.lin1_b = L.get(l + "linear1.bias", {c.ffn});
    dl.lin2_w = L.get(l + "linear2.weight", {W, c.ffn});
    dl.lin2_b = L.get(l + "linear2.bias", {W});
    dl.norm1 = L.ln(l + "norm1", W);
    dl.norm2 = L.ln(l + "norm2", W);
    dl.norm3 = L.ln(l + "norm3", W);
    h.layers.push_back(std::move(dl));
  }
  h.field_norm = L.ln("field_norm", W);
  h.option_norm = L.ln("option_norm", W);
  h.scorer0_w = L.get_rows("residual_scorer.0.weight", 4 * W, W);
  const int64_t sh = h.scorer0_w.dim(0);
  h.scorer0_b = L.get("residual_scorer.0.bias", {sh});
  h.scorer3_w = L.get("residual_scorer.3.weight", {1, sh});
  h.scorer3_b = L.get("residual_scorer.3.bias", {1});
  h.prior_logit_scale = L.scalar("prior_logit_scale", 1.0f);
  h.joint_logit_scale = L.scalar("joint_logit_scale", 2.0f);
  h.residual_gate = L.scalar("residual_gate", 0.0f);
  return h;
}

TextWeights shape_only_text(const TextConfig& cfg) {
  static const io::TensorStore none;
  return load_text_weights(none, cfg, LoadMode::ShapeOnly);
}

std::vector<const Tensor*> vision_tensors(const VisionWeights& v) {
  std::vector<const Tensor*> t = {&v.patch_w, &v.patch_b, &v.pos_embed};
  for (const auto& b : v.blocks)
    for (const Tensor* x : {&b.norm1.w, &b.norm1.b, &b.norm2.w, &b.norm2.b, &b.qkv_w, &b.qkv_b, &b.proj_w, &b.proj_b, &b.fc1_w, &b.fc1_b,
                            &b.fc2_w, &b.fc2_b})
      t.push_back(x);
  for (const Tensor* x : {&v.merger_norm.w, &v.merger_norm.b, &v.merger_fc1_w, &v.merger_fc1_b, &v.merger_fc2_w, &v.merger_fc2_b})
    t.push_back(x);
  return t;
}

VisionWeights shape_only_vision(const VisionConfig& cfg) {
  static const io::TensorStore none;
  return load_vision_weights(none, cfg, LoadMode::ShapeOnly);
}

HeadWeights shape_only_head(const HeadConfig& cfg) {
  static const io::TensorStore none;
  return load_head_weights(none, cfg, LoadMode::ShapeOnly);
}

}  // namespace clefrt::model

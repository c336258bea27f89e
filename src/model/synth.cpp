#include "model/synth.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.h"
#include "common/json.h"
#include "common/progress.h"
#include "io/safetensors_write.h"
#include "tokenizer/tokenizer.h"

namespace clefrt::model {

namespace fs = std::filesystem;
using json::Value;

namespace {

struct Preset {
  int64_t hidden, layers, ffn, q_heads, kv_heads, head_dim, k_heads, v_heads, k_dim, v_dim;
  std::vector<int64_t> mrope;
  int64_t width, heads, head_ffn, routing, head_layers, shards;
  int64_t min_vocab;
};

// The vision tower's numbers per preset (patch 16, 2 frames, 2 x 2 merge, 3 channels throughout).
struct VisionPreset {
  int64_t hidden, depth, heads, ffn, positions;
};
VisionPreset vision_preset(const std::string& name) {
  if (name == "tiny") return {32, 2, 2, 48, 64};
  if (name == "small" || name == "small-gdn128") return {64, 2, 4, 128, 256};
  return {1152, 27, 16, 4304, 2304};  // Clef and Clef-flash
}

Preset preset(const std::string& name) {
  if (name == "tiny") return {64, 4, 128, 4, 2, 32, 2, 4, 16, 16, {2, 1, 1}, 32, 4, 64, 1, 1, 2, 0};
  if (name == "small") return {256, 8, 768, 8, 2, 64, 4, 8, 32, 32, {3, 3, 2}, 128, 4, 256, 2, 2, 2, 0};
  // small with the Clef models' GDN head dims (Dk = Dv = 128: the shapes the Hopper GDN scan
  // tiles), for engine-level tests of those kernels
  if (name == "small-gdn128") return {256, 8, 768, 8, 2, 64, 2, 4, 128, 128, {3, 3, 2}, 128, 4, 256, 2, 2, 2, 0};
  if (name == "clef-flash") return {4096, 32, 12288, 16, 4, 256, 16, 32, 128, 128, {11, 11, 10}, 1024, 16, 4096, 2, 4, 4, 248320};
  if (name == "clef-27b") return {5120, 64, 17408, 24, 4, 256, 16, 48, 128, 128, {11, 11, 10}, 1024, 16, 4096, 2, 4, 12, 248320};
  throw std::invalid_argument("unknown synth config '" + name + "' (tiny, small, small-gdn128, clef-flash, clef-27b)");
}

Value ints(const std::vector<int64_t>& v) {
  Value a = Value::array();
  for (int64_t x : v) a.arr.push_back(Value::integer(x));
  return a;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  if (!(f << s)) throw load_error(p.string(), "cannot write");
}

struct Gen {
  std::mt19937_64 rng;
  std::vector<float> normal(int64_t n, float std, float mean = 0) {
    std::normal_distribution<float> d(mean, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  }
  std::vector<float> uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  }
};

Value text_config_json(const Preset& P, int64_t vocab) {
  const int64_t H = P.hidden;
  std::vector<std::string> layer_types;
  for (int64_t i = 0; i < P.layers; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  Value tc = Value::object();
  tc.add("model_type", Value::string("qwen3_5_text"));
  tc.add("hidden_size", Value::integer(H));
  tc.add("num_hidden_layers", Value::integer(P.layers));
  tc.add("intermediate_size", Value::integer(P.ffn));
  tc.add("vocab_size", Value::integer(vocab));
  tc.add("num_attention_heads", Value::integer(P.q_heads));
  tc.add("num_key_value_heads", Value::integer(P.kv_heads));
  tc.add("head_dim", Value::integer(P.head_dim));
  tc.add("linear_num_key_heads", Value::integer(P.k_heads));
  tc.add("linear_num_value_heads", Value::integer(P.v_heads));
  tc.add("linear_key_head_dim", Value::integer(P.k_dim));
  tc.add("linear_value_head_dim", Value::integer(P.v_dim));
  tc.add("linear_conv_kernel_dim", Value::integer(4));
  tc.add("rms_norm_eps", Value::number(1e-6));
  tc.add("tie_word_embeddings", Value::boolean(false));
  Value lt = Value::array();
  for (auto& s : layer_types) lt.arr.push_back(Value::string(s));
  tc.add("layer_types", lt);
  Value rope = Value::object();
  rope.add("rope_type", Value::string("default"));
  rope.add("rope_theta", Value::number(10000000.0));
  rope.add("partial_rotary_factor", Value::number(0.25));
  rope.add("mrope_section", ints(P.mrope));
  rope.add("mrope_interleaved", Value::boolean(true));
  tc.add("rope_parameters", rope);
  return tc;
}

Value head_config_json(const Preset& P) {
  const int64_t H = P.hidden;
  Value hc = Value::object();
  hc.add("hidden_size", Value::integer(H));
  hc.add("width", Value::integer(P.width));
  hc.add("routing_layers", Value::integer(P.routing));
  hc.add("layers", Value::integer(P.head_layers));
  hc.add("heads", Value::integer(P.heads));
  hc.add("feedforward", Value::integer(P.head_ffn));
  return hc;
}

}  // namespace

void synthesize(const SynthOptions& o) {
  const Preset P = preset(o.preset);
  if (!(o.linear_gain > 0.0f) || !std::isfinite(o.linear_gain))
    throw std::invalid_argument("synth: linear gain must be a positive number, got " + std::to_string(o.linear_gain));

  Tokenizer tok = Tokenizer::load(o.tokenizer);
  const int64_t vocab = std::max<int64_t>(P.min_vocab, (int64_t(tok.vocab_size()) + 63) / 64 * 64);
  fs::create_directories(o.out_dir);
  const fs::path dir(o.out_dir);
  Gen g{std::mt19937_64(o.seed)};
  const int64_t H = P.hidden, key_dim = P.k_heads * P.k_dim, value_dim = P.v_heads * P.v_dim, conv_dim = 2 * key_dim + value_dim;
  std::vector<std::string> layer_types;
  for (int64_t i = 0; i < P.layers; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");

  // config.json in the Qwen3_5ForConditionalGeneration shape
  Value tc = text_config_json(P, vocab);
  Value cfg = Value::object();
  Value arch = Value::array();
  arch.arr.push_back(Value::string("Qwen3_5ForConditionalGeneration"));
  cfg.add("architectures", arch);
  cfg.add("model_type", Value::string("qwen3_5"));
  cfg.add("text_config", tc);
  const VisionPreset V = vision_preset(o.preset);
  {
    Value vc = Value::object();
    vc.add("model_type", Value::string("qwen3_5_vision"));
    vc.add("depth", Value::integer(V.depth));
    vc.add("hidden_size", Value::integer(V.hidden));
    vc.add("num_heads", Value::integer(V.heads));
    vc.add("intermediate_size", Value::integer(V.ffn));
    vc.add("hidden_act", Value::string("gelu_pytorch_tanh"));
    vc.add("patch_size", Value::integer(16));
    vc.add("temporal_patch_size", Value::integer(2));
    vc.add("spatial_merge_size", Value::integer(2));
    vc.add("in_channels", Value::integer(3));
    vc.add("out_hidden_size", Value::integer(P.hidden));
    vc.add("num_position_embeddings", Value::integer(V.positions));
    vc.add("deepstack_visual_indexes", Value::array());
    cfg.add("vision_config", vc);
  }
  cfg.add("clefrt_synthetic", Value::string("random weights from `clefrt synth --config " + o.preset + "`: answers are meaningless"));
  write_text(dir / "config.json", json::write(cfg) + "\n");
  Value hc = head_config_json(P);
  write_text(dir / "joint_head_config.json", json::write(hc) + "\n");
  fs::copy_file(o.tokenizer, dir / "tokenizer.json", fs::copy_options::overwrite_existing);

  // Backbone tensors, split into shards by layer.
  auto lin = [&](int64_t out, int64_t in) { return g.normal(out * in, o.linear_gain / std::sqrt(float(in))); };
  std::vector<std::vector<io::OutTensor>> shards(size_t(P.shards));
  auto put = [&](size_t shard, std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
    shards[shard].push_back({std::move(name), io::DType::BF16, std::move(shape), io::bf16_bytes(v)});
  };
  const std::string p = "model.language_model.";
  put(0, p + "embed_tokens.weight", {vocab, H}, g.normal(vocab * H, 1.0f));
  StatusLine status;
  for (int64_t i = 0; i < P.layers; ++i) {
    if (o.progress) status.update("synth: layer " + std::to_string(i + 1) + "/" + std::to_string(P.layers));
    const size_t sh = size_t(i * P.shards / P.layers);
    const std::string l = p + "layers." + std::to_string(i) + ".";
    put(sh, l + "input_layernorm.weight", {H}, g.normal(H, 0.1f));
    put(sh, l + "post_attention_layernorm.weight", {H}, g.normal(H, 0.1f));
    put(sh, l + "mlp.gate_proj.weight", {P.ffn, H}, lin(P.ffn, H));
    put(sh, l + "mlp.up_proj.weight", {P.ffn, H}, lin(P.ffn, H));
    put(sh, l + "mlp.down_proj.weight", {H, P.ffn}, lin(H, P.ffn));
    if (layer_types[size_t(i)] == "linear_attention") {
      const std::string a = l + "linear_attn.";
      put(sh, a + "in_proj_qkv.weight", {conv_dim, H}, lin(conv_dim, H));
      put(sh, a + "in_proj_z.weight", {value_dim, H}, lin(value_dim, H));
      put(sh, a + "in_proj_b.weight", {P.v_heads, H}, lin(P.v_heads, H));
      put(sh, a + "in_proj_a.weight", {P.v_heads, H}, lin(P.v_heads, H));
      put(sh, a + "conv1d.weight", {conv_dim, 1, 4}, g.normal(conv_dim * 4, 0.5f));
      put(sh, a + "dt_bias", {P.v_heads}, g.normal(P.v_heads, 1.0f));
      std::vector<float> alog = g.uniform(P.v_heads, 0.0f, 2.7f);  // A in [1, 15]
      put(sh, a + "A_log", {P.v_heads}, alog);
      put(sh, a + "norm.weight", {P.v_dim}, g.normal(P.v_dim, 0.1f, 1.0f));
      put(sh, a + "out_proj.weight", {H, value_dim}, lin(H, value_dim));
    } else {
      const std::string a = l + "self_attn.";
      put(sh, a + "q_proj.weight", {P.q_heads * 2 * P.head_dim, H}, lin(P.q_heads * 2 * P.head_dim, H));
      put(sh, a + "k_proj.weight", {P.kv_heads * P.head_dim, H}, lin(P.kv_heads * P.head_dim, H));
      put(sh, a + "v_proj.weight", {P.kv_heads * P.head_dim, H}, lin(P.kv_heads * P.head_dim, H));
      put(sh, a + "o_proj.weight", {H, P.q_heads * P.head_dim}, lin(H, P.q_heads * P.head_dim));
      put(sh, a + "q_norm.weight", {P.head_dim}, g.normal(P.head_dim, 0.1f));
      put(sh, a + "k_norm.weight", {P.head_dim}, g.normal(P.head_dim, 0.1f));
    }
  }
  if (o.progress) status.done("synth: " + std::to_string(P.layers) + " layers");
  put(size_t(P.shards - 1), p + "norm.weight", {H}, g.normal(H, 0.1f));
  put(size_t(P.shards - 1), "lm_head.weight", {vocab, H}, g.normal(vocab * H, 1.0f));
  // The vision tower, from its own generator so the text weights of a seed stay what they were
  // before synthetic folders had one.
  {
    Gen gv{std::mt19937_64(o.seed ^ 0x76697369ull)};
    auto vlin = [&](int64_t out, int64_t in) { return gv.normal(out * in, o.linear_gain / std::sqrt(float(in))); };
    const size_t sh = size_t(P.shards - 1);
    const std::string v = "model.visual.";
    const int64_t VH = V.hidden, in = 3 * 2 * 16 * 16, m2 = 4;
    put(sh, v + "patch_embed.proj.weight", {VH, 3, 2, 16, 16}, vlin(VH, in));
    put(sh, v + "patch_embed.proj.bias", {VH}, gv.normal(VH, 0.1f));
    put(sh, v + "pos_embed.weight", {V.positions, VH}, gv.normal(V.positions * VH, 0.5f));
    for (int64_t i = 0; i < V.depth; ++i) {
      const std::string b = v + "blocks." + std::to_string(i) + ".";
      for (const char* n : {"norm1", "norm2"}) {
        put(sh, b + n + ".weight", {VH}, gv.normal(VH, 0.1f, 1.0f));
        put(sh, b + n + ".bias", {VH}, gv.normal(VH, 0.1f));
      }
      put(sh, b + "attn.qkv.weight", {3 * VH, VH}, vlin(3 * VH, VH));
      put(sh, b + "attn.qkv.bias", {3 * VH}, gv.normal(3 * VH, 0.1f));
      put(sh, b + "attn.proj.weight", {VH, VH}, vlin(VH, VH));
      put(sh, b + "attn.proj.bias", {VH}, gv.normal(VH, 0.1f));
      put(sh, b + "mlp.linear_fc1.weight", {V.ffn, VH}, vlin(V.ffn, VH));
      put(sh, b + "mlp.linear_fc1.bias", {V.ffn}, gv.normal(V.ffn, 0.1f));
      put(sh, b + "mlp.linear_fc2.weight", {VH, V.ffn}, vlin(VH, V.ffn));
      put(sh, b + "mlp.linear_fc2.bias", {VH}, gv.normal(VH, 0.1f));
    }
    put(sh, v + "merger.norm.weight", {VH}, gv.normal(VH, 0.1f, 1.0f));
    put(sh, v + "merger.norm.bias", {VH}, gv.normal(VH, 0.1f));
    put(sh, v + "merger.linear_fc1.weight", {m2 * VH, m2 * VH}, vlin(m2 * VH, m2 * VH));
    put(sh, v + "merger.linear_fc1.bias", {m2 * VH}, gv.normal(m2 * VH, 0.1f));
    put(sh, v + "merger.linear_fc2.weight", {H, m2 * VH}, vlin(H, m2 * VH));
    put(sh, v + "merger.linear_fc2.bias", {H}, gv.normal(H, 0.1f));
  }
  Value wm = Value::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    io::write_safetensors((dir / name).string(), shards[s]);
    for (const auto& t : shards[s]) wm.add(t.name, Value::string(name));
  }
  Value index = Value::object();
  index.add("metadata", Value::object());
  index.add("weight_map", wm);
  write_text(dir / "model.safetensors.index.json", json::write(index) + "\n");

  // The joint head.
  const int64_t W = P.width, F = P.head_ffn;
  std::vector<io::OutTensor> head;
  auto hput = [&](std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
    head.push_back({std::move(name), io::DType::BF16, std::move(shape), io::bf16_bytes(v)});
  };
  auto ln = [&](const std::string& n, int64_t d) {
    hput(n + ".weight", {d}, g.normal(d, 0.1f, 1.0f));
    hput(n + ".bias", {d}, g.normal(d, 0.1f));
  };
  auto mha = [&](const std::string& n) {
    hput(n + ".in_proj_weight", {3 * W, W}, lin(3 * W, W));
    hput(n + ".in_proj_bias", {3 * W}, g.normal(3 * W, 0.02f));
    hput(n + ".out_proj.weight", {W, W}, lin(W, W));
    hput(n + ".out_proj.bias", {W}, g.normal(W, 0.02f));
  };
  ln("hidden_norm", H);
  for (const char* n : {"memory", "question", "option_question", "global", "option_context", "option_lexical"})
    hput(std::string(n) + "_projection.weight", {W, H}, lin(W, H));
  hput("type_embedding.weight", {3, W}, g.normal(3 * W, 1.0f));
  for (int64_t n = 0; n < P.routing; ++n) {
    const std::string e = "evidence_layers." + std::to_string(n) + ".";
    ln(e + "query_norm", W);
    ln(e + "memory_norm", W);
    ln(e + "feedforward_norm", W);
    mha(e + "attention");
    hput(e + "feedforward.0.weight", {F, W}, lin(F, W));
    hput(e + "feedforward.0.bias", {F}, g.normal(F, 0.02f));
    hput(e + "feedforward.3.weight", {W, F}, lin(W, F));
    hput(e + "feedforward.3.bias", {W}, g.normal(W, 0.02f));
  }
  ln("option_summary_norm", W);
  for (int64_t n = 0; n < P.head_layers; ++n) {
    const std::string l = "layers." + std::to_string(n) + ".";
    mha(l + "self_attn");
    mha(l + "multihead_attn");
    hput(l + "linear1.weight", {F, W}, lin(F, W));
    hput(l + "linear1.bias", {F}, g.normal(F, 0.02f));
    hput(l + "linear2.weight", {W, F}, lin(W, F));
    hput(l + "linear2.bias", {W}, g.normal(W, 0.02f));
    ln(l + "norm1", W);
    ln(l + "norm2", W);
    ln(l + "norm3", W);
  }
  ln("field_norm", W);
  ln("option_norm", W);
  hput("residual_scorer.0.weight", {W, 4 * W}, lin(W, 4 * W));
  hput("residual_scorer.0.bias", {W}, g.normal(W, 0.02f));
  hput("residual_scorer.3.weight", {1, W}, lin(1, W));
  hput("residual_scorer.3.bias", {1}, g.normal(1, 0.02f));
  // Scales large enough that answers are peaked rather than uniform.
  hput("prior_logit_scale", {}, {std::log(10.0f)});
  hput("joint_logit_scale", {}, {std::log(20.0f)});
  hput("residual_gate", {}, {0.5f});
  io::write_safetensors((dir / "joint_head.safetensors").string(), head);
}

ModelConfig synthetic_config(const std::string& name) {
  const Preset P = preset(name);
  const int64_t vocab = std::max<int64_t>(P.min_vocab, 151680);  // the Qwen3 tokenizer rounded up, as synthesize() does
  ModelConfig c;
  c.architecture = "Qwen3_5ForConditionalGeneration";
  c.model_type = "qwen3_5";
  c.text = parse_text_config(text_config_json(P, vocab), "synthetic " + name);
  c.head = parse_head_config(head_config_json(P), "synthetic " + name);
  const VisionPreset V = vision_preset(name);  // the release's tower, as `clefrt synth` writes it
  c.vision.present = true;
  c.vision.depth = V.depth;
  c.vision.hidden = V.hidden;
  c.vision.heads = V.heads;
  c.vision.ffn = V.ffn;
  c.vision.num_position_embeddings = V.positions;
  c.vision.out_hidden = c.text.hidden;
  return c;
}

}  // namespace clefrt::model

#include "model/config.h"

#include <filesystem>

#include "common/error.h"
#include "common/file.h"

namespace clefrt::model {

namespace fs = std::filesystem;

namespace {

json::Value read_json(const std::string& path) {
  std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const Error& e) {
    throw load_error(path, std::string("not valid JSON: ") + e.message());
  }
}

int64_t get_int(const json::Value& o, const char* key, const std::string& where, std::optional<int64_t> dflt = {}) {
  const json::Value* v = o.find(key);
  if (!v || v->is_null()) {
    if (dflt) return *dflt;
    throw load_error(where, std::string("missing \"") + key + "\"");
  }
  if (v->kind != json::Value::Kind::Int || v->i <= 0) throw load_error(where, std::string("\"") + key + "\" must be a positive integer");
  return v->i;
}

double get_num(const json::Value& o, const char* key, const std::string& where, double dflt) {
  const json::Value* v = o.find(key);
  if (!v || v->is_null()) return dflt;
  if (v->kind == json::Value::Kind::Int) return double(v->i);
  if (v->kind == json::Value::Kind::Double) return v->d;
  throw load_error(where, std::string("\"") + key + "\" must be a number");
}

}  // namespace

TextConfig parse_text_config(const json::Value& tc, const std::string& where) {
  TextConfig t;
  t.hidden = get_int(tc, "hidden_size", where);
  t.layers = get_int(tc, "num_hidden_layers", where);
  t.ffn = get_int(tc, "intermediate_size", where);
  t.vocab = get_int(tc, "vocab_size", where);
  t.q_heads = get_int(tc, "num_attention_heads", where);
  t.kv_heads = get_int(tc, "num_key_value_heads", where);
  t.head_dim = get_int(tc, "head_dim", where);
  t.k_heads = get_int(tc, "linear_num_key_heads", where);
  t.v_heads = get_int(tc, "linear_num_value_heads", where);
  t.k_head_dim = get_int(tc, "linear_key_head_dim", where);
  t.v_head_dim = get_int(tc, "linear_value_head_dim", where);
  t.conv_kernel = get_int(tc, "linear_conv_kernel_dim", where, 4);
  t.rms_eps = get_num(tc, "rms_norm_eps", where, 1e-6);
  // transformers 5 keeps RoPE settings in `rope_parameters`; older files have them at the top.
  const json::Value* rp = tc.find("rope_parameters");
  if (!rp || !rp->is_object()) rp = tc.find("rope_scaling");
  const json::Value& rope = (rp && rp->is_object()) ? *rp : tc;
  t.rope_theta = get_num(rope, "rope_theta", where, get_num(tc, "rope_theta", where, 1e7));
  t.partial_rotary = get_num(rope, "partial_rotary_factor", where, get_num(tc, "partial_rotary_factor", where, 0.25));
  if (const json::Value* ms = rope.find("mrope_section"); ms && ms->is_array())
    for (const auto& x : ms->arr) t.mrope_section.push_back(x.i);
  if (const json::Value* tw = tc.find("tie_word_embeddings"); tw && tw->kind == json::Value::Kind::Bool) t.tie_word_embeddings = tw->b;
  if (const json::Value* lt = tc.find("layer_types"); lt && lt->is_array()) {
    for (const auto& x : lt->arr) {
      if (x.s == "linear_attention") t.layer_types.push_back(LayerType::LinearAttention);
      else if (x.s == "full_attention") t.layer_types.push_back(LayerType::FullAttention);
      else throw load_error(where, "unknown layer type \"" + x.s + "\" in layer_types");
    }
    if (int64_t(t.layer_types.size()) != t.layers)
      throw load_error(where, "layer_types has " + std::to_string(t.layer_types.size()) + " entries for " + std::to_string(t.layers) + " layers");
  } else {
    // spec: layer i is full attention when (i+1) % 4 == 0
    for (int64_t i = 0; i < t.layers; ++i)
      t.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  }
  if (t.q_heads % t.kv_heads != 0) throw load_error(where, "num_attention_heads is not a multiple of num_key_value_heads");
  if (t.v_heads % t.k_heads != 0) throw load_error(where, "linear_num_value_heads is not a multiple of linear_num_key_heads");
  if (t.rotary_dim() % 2 != 0 || t.rotary_dim() > t.head_dim) throw load_error(where, "partial_rotary_factor gives an odd or oversized rotary dimension");
  int64_t sec = 0;
  for (int64_t s : t.mrope_section) sec += s;
  if (!t.mrope_section.empty() && sec != t.rotary_dim() / 2)
    throw load_error(where, "mrope_section sums to " + std::to_string(sec) + ", expected rotary_dim/2 = " + std::to_string(t.rotary_dim() / 2));
  return t;
}

HeadConfig parse_head_config(const json::Value& hc, const std::string& where) {
  HeadConfig h;
  h.hidden = get_int(hc, "hidden_size", where);
  h.width = get_int(hc, "width", where);
  h.routing_layers = get_int(hc, "routing_layers", where);
  h.layers = get_int(hc, "layers", where);
  h.heads = get_int(hc, "heads", where);
  h.ffn = get_int(hc, "feedforward", where);
  if (h.width % h.heads != 0) throw load_error(where, "width is not a multiple of heads");
  return h;
}

ModelConfig load_config(const std::string& dir) {
  ModelConfig m;
  std::string cpath = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  const bool folder = fs::is_directory(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw load_error(dir, ec.message());  // e.g. permission denied
  if (!folder) throw load_error(dir, "not a folder (a Clef model is a folder: config.json, safetensors, tokenizer)");
  const bool has_config = fs::exists(cpath, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw load_error(cpath, ec.message());
  if (!has_config) throw load_error(dir, "not a Clef model folder: it has no config.json");
  json::Value c = read_json(cpath);
  if (const json::Value* a = c.find("architectures"); a && a->is_array() && !a->arr.empty()) m.architecture = a->arr[0].s;
  if (const json::Value* t = c.find("model_type"); t && t->is_string()) m.model_type = t->s;
  const json::Value* tc = c.find("text_config");
  if (!tc || !tc->is_object()) throw load_error(cpath, "missing \"text_config\" (expected a Qwen3_5ForConditionalGeneration config)");
  m.text = parse_text_config(*tc, cpath + " text_config");
  if (const json::Value* vc = c.find("vision_config"); vc && vc->is_object()) {
    std::string w = cpath + " vision_config";
    m.vision.present = true;
    m.vision.depth = get_int(*vc, "depth", w);
    m.vision.hidden = get_int(*vc, "hidden_size", w);
    m.vision.heads = get_int(*vc, "num_heads", w);
    m.vision.ffn = get_int(*vc, "intermediate_size", w);
    m.vision.patch = get_int(*vc, "patch_size", w, 16);
    m.vision.temporal_patch = get_int(*vc, "temporal_patch_size", w, 2);
    m.vision.spatial_merge = get_int(*vc, "spatial_merge_size", w, 2);
    m.vision.in_channels = get_int(*vc, "in_channels", w, 3);
    m.vision.out_hidden = get_int(*vc, "out_hidden_size", w, m.text.hidden);
    m.vision.num_position_embeddings = get_int(*vc, "num_position_embeddings", w, 2304);
  }
  if (const json::Value* q = c.find("quantization_config"); q && q->is_object()) m.quantization = *q;
  std::string hpath = (fs::path(dir) / "joint_head_config.json").string();
  m.head = parse_head_config(read_json(hpath), hpath);
  if (m.head.hidden != m.text.hidden)
    throw load_error(hpath, "hidden_size " + std::to_string(m.head.hidden) + " differs from the backbone's " + std::to_string(m.text.hidden));
  return m;
}

}  // namespace clefrt::model

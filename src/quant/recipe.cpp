#include "quant/recipe.h"

#include <utility>

namespace clefrt::quant {

namespace {
bool ends_with(std::string_view a, std::string_view b) { return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0; }
}  // namespace

bool recipe_keeps_bf16(std::string_view name) {
  for (const char* keep : {"in_proj_a", "in_proj_b", "conv1d", "norm"})
    if (name.find(keep) != std::string_view::npos) return true;
  return false;
}

bool recipe_quantizes(std::string_view n, const std::vector<int64_t>& shape, bool nvfp4) {
  if (n.rfind("model.language_model.layers.", 0) != 0 || !ends_with(n, ".weight") || shape.size() != 2) return false;
  if (recipe_keeps_bf16(n)) return false;
  return !nvfp4 || shape[1] % 16 == 0;
}

std::string recipe_scale_group(const std::string& name) {
  const std::string base = name.substr(0, name.size() - 7);  // without ".weight"
  for (auto [member, group] : {std::pair{".self_attn.q_proj", ".self_attn.qkv"}, {".self_attn.k_proj", ".self_attn.qkv"},
                               {".self_attn.v_proj", ".self_attn.qkv"}, {".mlp.gate_proj", ".mlp.gate_up"}, {".mlp.up_proj", ".mlp.gate_up"},
                               {".linear_attn.in_proj_qkv", ".linear_attn.in_proj_qkvz"},
                               {".linear_attn.in_proj_z", ".linear_attn.in_proj_qkvz"}})
    if (ends_with(base, member)) return base.substr(0, base.size() - std::string(member).size()) + group;
  return base;
}

}  // namespace clefrt::quant

// The one quantization recipe (spec/quant.md): which of a decoder layer's Linears a scheme
// quantizes, which stay in bf16, and which share a global scale. The quantizer writes folders by
// it, the GPU loader converts by it at load (--quant), and the memory plan counts by it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace clefrt::quant {

// Kept in bf16 by every scheme: the GDN's in_proj_a / in_proj_b (per-head gates, tiny and
// sensitive), the conv and every norm. `name`: a checkpoint name or just the module's own part
// ("in_proj_a").
bool recipe_keeps_bf16(std::string_view name);

// A checkpoint tensor the scheme quantizes: a 2-D `.weight` of a decoder layer that is not kept,
// and for NVFP4 one whose input width is a multiple of its 16-wide blocks.
bool recipe_quantizes(std::string_view name, const std::vector<int64_t>& shape, bool nvfp4);

// The module whose global scale this Linear's shares (q/k/v; gate/up; in_proj_qkv with
// in_proj_z): fused at run time, so one scale serves the fused GEMM.
std::string recipe_scale_group(const std::string& weight_name);

}  // namespace clefrt::quant

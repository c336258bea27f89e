// What the GPU engine runs the backbone's Linears in (`--quant`). Auto: what the folder holds,
// tensor by tensor (bf16 for the synthetic benchmark's random weights).
#pragma once
#include <string>

namespace clefrt {

enum class QuantMode { Auto, BF16, FP8, NVFP4, NVFP4_W4A16 };

// "auto", "bf16", "fp8", "nvfp4", "nvfp4-w4a16"; throws a usage error naming the flag otherwise.
QuantMode parse_quant_mode(const std::string& s);
const char* quant_mode_name(QuantMode m);

}  // namespace clefrt

// Writing safetensors files (for `clefrt synth` and tests).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace clefrt::io {

struct OutTensor {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const std::string& path, const std::vector<OutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

uint16_t f32_to_bf16(float f);  // round to nearest even; NaN stays NaN
std::vector<uint8_t> bf16_bytes(const std::vector<float>& v);
std::vector<uint8_t> f32_bytes(const std::vector<float>& v);

}  // namespace clefrt::io

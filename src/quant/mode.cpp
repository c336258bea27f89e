#include "quant/mode.h"

#include "common/error.h"

namespace clefrt {

QuantMode parse_quant_mode(const std::string& s) {
  if (s == "auto") return QuantMode::Auto;
  if (s == "bf16") return QuantMode::BF16;
  if (s == "fp8") return QuantMode::FP8;
  if (s == "nvfp4") return QuantMode::NVFP4;
  if (s == "nvfp4-w4a16") return QuantMode::NVFP4_W4A16;
  throw Error(Status::BadRequest, "usage", "--quant " + s + ": expected auto, bf16, fp8, nvfp4 or nvfp4-w4a16");
}

const char* quant_mode_name(QuantMode m) {
  switch (m) {
    case QuantMode::Auto: return "auto";
    case QuantMode::BF16: return "bf16";
    case QuantMode::FP8: return "fp8";
    case QuantMode::NVFP4: return "nvfp4";
    case QuantMode::NVFP4_W4A16: return "nvfp4-w4a16";
  }
  return "?";
}

}  // namespace clefrt

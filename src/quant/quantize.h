// `clefrt quantize`: a bf16 Clef folder -> a compressed-tensors folder (spec/quant.md).
//   nvfp4-w4a16: NVFP4 weights, bf16 activations
//   nvfp4:       NVFP4 weights + static activation global scales calibrated (min/max observer)
//                over records run through our own engine in Clef's prompt format (W4A4)
//   fp8:         e4m3 weights with per-output-channel scales, dynamic per-token activations
// The recipe's keep-list stays bf16: embeddings, lm_head, vision, GDN in_proj_a/b and conv1d,
// norms, the joint head. Global scales are shared across q/k/v, gate/up and GDN
// in_proj_qkv + in_proj_z.
#pragma once
#include <cstddef>
#include <string>

namespace clefrt::quant {

struct QuantizeOptions {
  std::string model_dir, out_dir, scheme = "nvfp4-w4a16", calib_file;
  size_t calib_records = 256;
  bool progress = true;
};

// Throws clefrt::Error (load_error / usage) with the file or option at fault.
void quantize_folder(const QuantizeOptions& o);

}  // namespace clefrt::quant

// NVFP4 (compressed-tensors `nvfp4-pack-quantized`) and FP8 e4m3, bit for bit as
// spec/quant.md defines them. Used by the loader (dequantize to fp32 for the CPU engine), by
// the CPU engine's W4A4 activation fake-quantization, and as the oracle of the GPU kernels.
#pragma once
#include <cstdint>
#include <vector>

namespace clefrt::quant {

// e2m1: bit 3 = sign, bits 0-2 index [0, 0.5, 1, 1.5, 2, 3, 4, 6].
float e2m1_value(uint8_t code);
// Round to nearest even onto the e2m1 grid after clamping to [-6, 6].
uint8_t e2m1_encode(float x);
// float8_e4m3fn: bias 7, no infinities, 0x7f / 0xff are NaN, largest finite 448.
float e4m3_value(uint8_t bits);
// Round to nearest even, saturating to +-448 (NaN stays NaN).
uint8_t e4m3_encode(float x);
// Round to bf16 (nearest even) and back.
float bf16_round(float x);

// W[out, in] from weight_packed [out, in/2] (even column in the low nibble), weight_scale
// e4m3 [out, in/16] and the global scale: s32 = bf16(scale) / gs in fp32, W = bf16(code * s32)
// (what transformers computes).
std::vector<float> nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, float global_scale, int64_t out, int64_t in);

struct Nvfp4Weight {
  std::vector<uint8_t> packed, scales;
  float global_scale = 1.0f;
};
// spec/quant.md "Quantize (weights)": gs = 448*6/amax (1 if amax is 0 or not finite), per-16
// scale e4m3(clamp(gs * amax16 / 6)) with exact zeros replaced by the smallest usable value,
// codes rne_e2m1(clamp(W / (scale / gs), -6, 6)). `global_scale` > 0 forces a shared one.
Nvfp4Weight nvfp4_quantize(const float* w, int64_t out, int64_t in, float global_scale = 0.0f);
float nvfp4_global_scale(const float* w, int64_t n);  // 448*6/amax

// W4A4 activations, in place on x [rows, in]: per row, per 16 inputs s = e4m3(gs_in * amax16 / 6),
// x_q = rne_e2m1(clamp(x / (s / gs_in), -6, 6)), x = bf16(x_q * s / gs_in).
void nvfp4_fake_quantize_activations(float* x, int64_t rows, int64_t in, float input_global_scale);

// FP8 W8A8 activations, in place: per token row s = amax / 448, x = e4m3(x / s) * s.
void fp8_fake_quantize_activations(float* x, int64_t rows, int64_t in);

}  // namespace clefrt::quant

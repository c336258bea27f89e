#include "quant/formats.h"

#include "io/safetensors_write.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace clefrt::quant {

namespace {
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}

float e2m1_value(uint8_t code) {
  const float v = kE2m1[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  float a = std::fabs(x);
  if (a > 6.0f) a = 6.0f;
  // nearest grid point; ties go to the even code (the one whose lowest bit is 0)
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(a - kE2m1[i]), db = std::fabs(a - kE2m1[best]);
    if (d < db || (d == db && (i & 1) == 0)) best = i;
  }
  return uint8_t(sign | best);
}

float e4m3_value(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -v : v;
}

uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return uint8_t(sign | 0x7e);  // saturate
  // Below 2^-6 the grid is uniform (subnormals, step 2^-9): the code is the rounded count of
  // steps, and 8 steps is the first normal code 0x08. Above, round the 3 mantissa bits; a carry
  // into the exponent is the next binade's code. nearbyint rounds half to even (the default
  // mode), which on these grids is the code with the even last bit.
  if (a < 0.015625f) return uint8_t(sign | int(std::nearbyint(a * 512.0f)));
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int mant = int(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  const int code = ((e - 1 + 7) << 3) + mant;  // mant == 8 carries into the exponent
  return uint8_t(sign | code);
}

float bf16_round(float x) {
  const uint32_t b = uint32_t(io::f32_to_bf16(x)) << 16;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

std::vector<float> nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, float gs, int64_t out, int64_t in) {
  std::vector<float> w(size_t(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) {
      const uint8_t byte = packed[r * (in / 2) + c / 2];
      const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 15);
      const float s32 = bf16_round(e4m3_value(scales[r * (in / 16) + c / 16])) / gs;
      w[size_t(r * in + c)] = bf16_round(e2m1_value(code) * s32);
    }
  return w;
}

float nvfp4_global_scale(const float* w, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  return 448.0f * 6.0f / amax;
}

Nvfp4Weight nvfp4_quantize(const float* w, int64_t out, int64_t in, float gs) {
  Nvfp4Weight q;
  q.global_scale = gs > 0 ? gs : nvfp4_global_scale(w, out * in);
  q.packed.assign(size_t(out * in / 2), 0);
  q.scales.assign(size_t(out * in / 16), 0);
  const uint8_t smallest = 0x01;  // the smallest positive e4m3 (2^-9)
  for (int64_t r = 0; r < out; ++r)
    for (int64_t b = 0; b < in / 16; ++b) {
      const float* blk = w + r * in + b * 16;
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(blk[i]));
      float sv = q.global_scale * amax / 6.0f;
      if (sv > 448.0f) sv = 448.0f;
      uint8_t s = e4m3_encode(sv);
      if (e4m3_value(s) == 0.0f) s = smallest;
      q.scales[size_t(r * (in / 16) + b)] = s;
      const float step = e4m3_value(s) / q.global_scale;
      for (int i = 0; i < 16; ++i) {
        const int64_t c = b * 16 + i;
        const uint8_t code = e2m1_encode(blk[i] / step);
        uint8_t& byte = q.packed[size_t(r * (in / 2) + c / 2)];
        byte = (c & 1) ? uint8_t(byte | (code << 4)) : uint8_t(byte | code);
      }
    }
  return q;
}

void nvfp4_fake_quantize_activations(float* x, int64_t rows, int64_t in, float gs_in) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / 16; ++b) {
      float* blk = x + r * in + b * 16;
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(blk[i]));
      const float s = e4m3_value(e4m3_encode(gs_in * amax / 6.0f));
      if (s == 0.0f) {
        for (int i = 0; i < 16; ++i) blk[i] = 0.0f;
        continue;
      }
      const float step = s / gs_in;
      for (int i = 0; i < 16; ++i) blk[i] = bf16_round(e2m1_value(e2m1_encode(blk[i] / step)) * s / gs_in);
    }
}

void fp8_fake_quantize_activations(float* x, int64_t rows, int64_t in) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * in;
    float amax = 0;
    for (int64_t i = 0; i < in; ++i) amax = std::fmax(amax, std::fabs(row[i]));
    if (!(amax > 0)) continue;
    const float s = amax / 448.0f;
    for (int64_t i = 0; i < in; ++i) row[i] = e4m3_value(e4m3_encode(row[i] / s)) * s;
  }
}

}  // namespace clefrt::quant

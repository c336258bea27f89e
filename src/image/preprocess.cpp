#include "image/preprocess.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace clefrt {
namespace {

// Keys' cubic convolution with a = -0.5, the antialias filter ATen and Pillow use for bicubic
double cubic_aa(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis' taps: per output index the first input index, the count, and int16 weights at a
// precision chosen from the largest weight so that it still fits 15 bits.
struct Taps {
  std::vector<int> first, count;
  std::vector<int16_t> weights;  // [out, stride]
  int stride = 0;
  int precision = 0;
};

Taps make_taps(int in, int out) {
  const double scale = double(in) / out;
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  Taps t;
  t.stride = int(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  std::vector<double> w(size_t(out) * t.stride, 0.0);
  double wt_max = 0.0;
  for (int i = 0; i < out; ++i) {
    const double center = scale * (i + 0.5);
    const int64_t lo = std::max<int64_t>(int64_t(center - support + 0.5), 0);
    const int64_t n = std::min<int64_t>(int64_t(center + support + 0.5), in) - lo;
    t.first[i] = int(lo);
    t.count[i] = int(n);
    double* wi = w.data() + size_t(i) * t.stride;
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      wi[j] = cubic_aa((double(j + lo) - center + 0.5) * invscale);
      total += wi[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < n; ++j) {
        wi[j] /= total;
        wt_max = std::max(wt_max, wi[j]);
      }
  }
  int p = 0;
  for (; p < 22; ++p)
    if (int(0.5 + wt_max * double(1 << (p + 1))) >= (1 << 15)) break;
  t.precision = p;
  t.weights.resize(w.size());
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * double(1 << p);
    t.weights[k] = int16_t(v < 0 ? int(v - 0.5) : int(v + 0.5));
  }
  return t;
}

uint8_t clamp_shift(int32_t acc, int precision) {
  const int32_t v = acc >> precision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

RgbImage resize_bicubic_aa(const RgbImage& in, uint32_t out_w, uint32_t out_h) {
  RgbImage cur = in;
  if (out_w != in.width) {  // the width pass first, stored as uint8
    const Taps t = make_taps(int(in.width), int(out_w));
    RgbImage o;
    o.width = out_w;
    o.height = cur.height;
    o.pixels.resize(size_t(out_w) * o.height * 3);
    const int32_t half = 1 << (t.precision - 1);
    for (uint32_t y = 0; y < cur.height; ++y) {
      const uint8_t* row = cur.pixels.data() + size_t(y) * cur.width * 3;
      uint8_t* dst = o.pixels.data() + size_t(y) * out_w * 3;
      for (uint32_t x = 0; x < out_w; ++x) {
        const int16_t* w = t.weights.data() + size_t(x) * t.stride;
        const uint8_t* src = row + size_t(t.first[x]) * 3;
        for (int c = 0; c < 3; ++c) {
          int32_t acc = half;
          for (int j = 0; j < t.count[x]; ++j) acc += int32_t(src[j * 3 + c]) * w[j];
          dst[x * 3 + c] = clamp_shift(acc, t.precision);
        }
      }
    }
    cur = std::move(o);
  }
  if (out_h != cur.height) {
    const Taps t = make_taps(int(cur.height), int(out_h));
    RgbImage o;
    o.width = cur.width;
    o.height = out_h;
    const size_t row_len = size_t(cur.width) * 3;
    o.pixels.resize(row_len * out_h);
    const int32_t half = 1 << (t.precision - 1);
    std::vector<int32_t> acc(row_len);
    for (uint32_t y = 0; y < out_h; ++y) {
      const int16_t* w = t.weights.data() + size_t(y) * t.stride;
      std::fill(acc.begin(), acc.end(), half);
      for (int j = 0; j < t.count[y]; ++j) {
        const uint8_t* src = cur.pixels.data() + size_t(t.first[y] + j) * row_len;
        const int32_t wj = w[j];
        for (size_t k = 0; k < row_len; ++k) acc[k] += int32_t(src[k]) * wj;
      }
      uint8_t* dst = o.pixels.data() + size_t(y) * row_len;
      for (size_t k = 0; k < row_len; ++k) dst[k] = clamp_shift(acc[k], t.precision);
    }
    cur = std::move(o);
  }
  return cur;
}

model::ImagePatches image_patches(const RgbImage& img, const VisionGeometry& g) {
  const uint32_t P = g.patch_size, M = g.merge_size, T = g.temporal_patch_size;
  if (img.width % (P * M) || img.height % (P * M))
    throw unprocessable("images", "internal: image size " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                                      " is not a multiple of " + std::to_string(P * M));
  model::ImagePatches out;
  out.grid_t = 1;
  out.grid_h = img.height / P;
  out.grid_w = img.width / P;
  const size_t cols = size_t(3) * T * P * P;
  out.pixels.resize(size_t(out.grid_h) * out.grid_w * cols);
  // the fused rescale + normalise of the reference: mean' = std' = 0.5 * 255 = 127.5 in fp32
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = (float(v) - 127.5f) / 127.5f;
  const int64_t bw_n = out.grid_w / M;
  for (int64_t ph = 0; ph < out.grid_h; ++ph)
    for (int64_t pw = 0; pw < out.grid_w; ++pw) {
      const int64_t bh = ph / M, mh = ph % M, bw = pw / M, mw = pw % M;
      const int64_t row = ((bh * bw_n + bw) * M + mh) * M + mw;
      float* dst = out.pixels.data() + size_t(row) * cols;
      for (uint32_t c = 0; c < 3; ++c)
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t y = 0; y < P; ++y) {
            const uint8_t* src = img.pixels.data() + (size_t(ph * P + y) * img.width + size_t(pw) * P) * 3 + c;
            float* d = dst + ((size_t(c) * T + t) * P + y) * P;
            for (uint32_t x = 0; x < P; ++x) d[x] = lut[src[x * 3]];
          }
    }
  return out;
}

model::ImagePatches preprocess_image(const ImageInput& image, const VisionGeometry& g, uint64_t max_pixels, const std::string& where,
                                     bool rgb_only) {
  RgbImage img = decode_image(image.format, image.bytes, max_pixels, where);
  uint32_t w = 0, h = 0;
  g.resize(img.width, img.height, w, h);
  if (w != img.width || h != img.height) img = resize_bicubic_aa(img, w, h);
  if (!rgb_only) return image_patches(img, g);
  const uint32_t P = g.patch_size, M = g.merge_size;
  if (img.width % (P * M) || img.height % (P * M))
    throw unprocessable("images", "internal: image size " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                                      " is not a multiple of " + std::to_string(P * M));
  model::ImagePatches out;
  out.grid_h = img.height / P;
  out.grid_w = img.width / P;
  out.rgb = std::move(img.pixels);
  return out;
}

}  // namespace clefrt

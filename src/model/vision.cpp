#include "model/vision.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "cpu/ops.h"

namespace clefrt::model {

using std::vector;

namespace {

vector<float> linear(const vector<float>& x, int64_t rows, const Tensor& w, const Tensor& b) {
  const int64_t n = w.dim(0), k = w.numel() / n;
  vector<float> y(size_t(rows * n));
  cpu::linear(x.data(), rows, k, w.data(), n, y.data(), b.data());
  return y;
}

vector<float> layer_norm(const vector<float>& x, int64_t rows, const LayerNormW& n, float eps) {
  vector<float> y(x.size());
  cpu::layer_norm(x.data(), rows, n.w.dim(0), n.w.data(), n.b.data(), eps, y.data());
  return y;
}

// PyTorch's gelu(approximate="tanh") in fp32.
float gelu_tanh(float x) {
  const float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

}  // namespace

vector<float> torch_linspace(float start, float end, int64_t steps) {
  vector<float> v(size_t(std::max<int64_t>(steps, 0)));
  if (steps == 1) v[0] = start;
  if (steps <= 1) return v;
  const float step = (end - start) / float(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i) v[size_t(i)] = i < half ? start + step * float(i) : end - step * float(steps - i - 1);
  return v;
}

vector<std::pair<int64_t, int64_t>> vision_patch_rows_cols(const VisionConfig& c, int64_t gt, int64_t gh, int64_t gw) {
  const int64_t m = c.spatial_merge;
  vector<std::pair<int64_t, int64_t>> rc;
  rc.reserve(size_t(gt * gh * gw));
  for (int64_t t = 0; t < gt; ++t)
    for (int64_t hb = 0; hb < gh / m; ++hb)
      for (int64_t wb = 0; wb < gw / m; ++wb)
        for (int64_t hi = 0; hi < m; ++hi)
          for (int64_t wi = 0; wi < m; ++wi) rc.emplace_back(hb * m + hi, wb * m + wi);
  return rc;
}

vector<float> vision_rotary_inv_freq(const VisionConfig& c) {
  const int64_t hd = c.hidden / c.heads, nf = hd / 4, half = hd / 2;
  vector<float> inv(static_cast<size_t>(nf));
  for (int64_t j = 0; j < nf; ++j) inv[size_t(j)] = 1.0f / std::pow(10000.0f, float(2 * j) / float(half));
  return inv;
}

vector<PositionTaps> vision_position_taps(const VisionConfig& c, int64_t gh, int64_t gw) {
  const int64_t side = int64_t(std::lround(std::sqrt(double(c.num_position_embeddings))));
  if (side * side != c.num_position_embeddings)
    throw Error(Status::Internal, "internal_error", "vision_config num_position_embeddings " + std::to_string(c.num_position_embeddings) + " is not a square");
  const vector<float> hs = torch_linspace(0.0f, float(side - 1), gh), ws = torch_linspace(0.0f, float(side - 1), gw);
  vector<PositionTaps> taps(size_t(gh * gw));
  for (int64_t i = 0; i < gh; ++i) {
    const int64_t h0 = int64_t(hs[size_t(i)]), h1 = std::min(h0 + 1, side - 1);
    const float dh = hs[size_t(i)] - float(h0);
    for (int64_t j = 0; j < gw; ++j) {
      const int64_t w0 = int64_t(ws[size_t(j)]), w1 = std::min(w0 + 1, side - 1);
      const float dw = ws[size_t(j)] - float(w0);
      taps[size_t(i * gw + j)] = {{h0 * side + w0, h0 * side + w1, h1 * side + w0, h1 * side + w1},
                                  {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw}};
    }
  }
  return taps;
}

vector<float> vision_position_embeddings(const VisionWeights& w, const VisionConfig& c, int64_t gt, int64_t gh, int64_t gw) {
  const int64_t H = c.hidden;
  const vector<PositionTaps> taps = vision_position_taps(c, gh, gw);
  vector<float> out;
  out.reserve(size_t(gt * gh * gw * H));
  for (auto [r, col] : vision_patch_rows_cols(c, gt, gh, gw)) {
    const PositionTaps& p = taps[size_t(r * gw + col)];
    for (int64_t x = 0; x < H; ++x) {
      float acc = w.pos_embed.data()[p.idx[0] * H + x] * p.wt[0];
      for (int k = 1; k < 4; ++k) acc += w.pos_embed.data()[p.idx[k] * H + x] * p.wt[k];
      out.push_back(acc);
    }
  }
  return out;
}

vector<float> vision_forward(const VisionWeights& w, const VisionConfig& c, const ImagePatches& im) {
  const int64_t H = c.hidden, heads = c.heads, hd = H / heads, m = c.spatial_merge;
  const int64_t per_patch = c.in_channels * c.temporal_patch * c.patch * c.patch;
  const int64_t S = im.grid_t * im.grid_h * im.grid_w;
  if (im.grid_h <= 0 || im.grid_w <= 0 || im.grid_t <= 0 || im.grid_h % m || im.grid_w % m || int64_t(im.pixels.size()) != S * per_patch)
    throw Error(Status::Unprocessable, "invalid_image",
                "an image of " + std::to_string(im.grid_t) + " x " + std::to_string(im.grid_h) + " x " + std::to_string(im.grid_w) +
                    " patches (" + std::to_string(im.pixels.size()) + " values) that the vision tower cannot take");
  vector<float> x = linear(im.pixels, S, w.patch_w, w.patch_b);
  const vector<float> pos = vision_position_embeddings(w, c, im.grid_t, im.grid_h, im.grid_w);
  for (size_t i = 0; i < x.size(); ++i) x[i] += pos[i];
  // 2-D rotary over all hd dims: hd/4 frequencies for the row, hd/4 for the column, emb = [f_h, f_w, f_h, f_w]
  const int64_t nf = hd / 4, half = hd / 2;
  const vector<float> inv = vision_rotary_inv_freq(c);
  const auto rc = vision_patch_rows_cols(c, im.grid_t, im.grid_h, im.grid_w);
  vector<float> cosv(size_t(S * half)), sinv(size_t(S * half));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t j = 0; j < half; ++j) {
      const float ang = (j < nf ? float(rc[size_t(s)].first) : float(rc[size_t(s)].second)) * inv[size_t(j % nf)];
      cosv[size_t(s * half + j)] = std::cos(ang);
      sinv[size_t(s * half + j)] = std::sin(ang);
    }
  auto rotate = [&](float* v, int64_t s) {  // v: one head's hd values; dim d pairs with d + hd/2
    for (int64_t d = 0; d < half; ++d) {
      const float cs = cosv[size_t(s * half + d)], sn = sinv[size_t(s * half + d)];
      const float a = v[d], b = v[d + half];
      v[d] = a * cs - b * sn;
      v[d + half] = b * cs + a * sn;
    }
  };
  const int64_t frame = im.grid_h * im.grid_w;  // attention stays within a frame (cu_seqlens per t)
  for (const VisionBlockWeights& b : w.blocks) {
    vector<float> qkv = linear(layer_norm(x, S, b.norm1, 1e-6f), S, b.qkv_w, b.qkv_b);
    vector<float> q(size_t(S * H)), k(size_t(S * H)), v(size_t(S * H));
    for (int64_t s = 0; s < S; ++s) {
      std::copy_n(qkv.data() + s * 3 * H, H, q.data() + s * H);
      std::copy_n(qkv.data() + s * 3 * H + H, H, k.data() + s * H);
      std::copy_n(qkv.data() + s * 3 * H + 2 * H, H, v.data() + s * H);
      for (int64_t hh = 0; hh < heads; ++hh) {
        rotate(q.data() + s * H + hh * hd, s);
        rotate(k.data() + s * H + hh * hd, s);
      }
    }
    vector<float> att(size_t(S * H));
    for (int64_t f0 = 0; f0 < S; f0 += frame)
      cpu::attention_full(q.data() + f0 * H, frame, k.data() + f0 * H, v.data() + f0 * H, frame, H, heads, att.data() + f0 * H);
    vector<float> o = linear(att, S, b.proj_w, b.proj_b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    vector<float> hmid = linear(layer_norm(x, S, b.norm2, 1e-6f), S, b.fc1_w, b.fc1_b);
    for (auto& e : hmid) e = gelu_tanh(e);
    vector<float> o2 = linear(hmid, S, b.fc2_w, b.fc2_b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o2[i];
  }
  // merger: LayerNorm per patch, each 2x2 block's four rows side by side, fc1, exact GELU, fc2
  vector<float> n = layer_norm(x, S, w.merger_norm, 1e-6f);
  const int64_t tokens = S / (m * m);
  vector<float> mid = linear(n, tokens, w.merger_fc1_w, w.merger_fc1_b);
  for (auto& e : mid) e = cpu::gelu_erf(e);
  return linear(mid, tokens, w.merger_fc2_w, w.merger_fc2_b);
}

}  // namespace clefrt::model

#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "cpu/ops.h"
#include "quant/formats.h"

namespace clefrt::model {

using std::vector;

namespace {

thread_local bool t_bf16_points = false;  // backbone_forward_bf16_points
// first_non_finite_layer: the least stage (-1 embeddings, i after layer i, layers the final
// norm) where some chunk's values were not finite; a chunk goes on through every layer, since
// a later chunk may go non-finite at an earlier layer than an earlier one did.
thread_local bool t_check_finite = false;
thread_local int64_t t_first_bad = 0;
void check_finite(const vector<float>& v, int64_t layer) {
  if (!t_check_finite || layer >= t_first_bad) return;
  for (float f : v)
    if (!std::isfinite(f)) {
      t_first_bad = layer;
      return;
    }
}
thread_local ActivationObserver t_observer = nullptr;
thread_local void* t_observer_ctx = nullptr;

vector<float> bf16_point(vector<float> v) {
  if (t_bf16_points)
    for (auto& x : v) x = quant::bf16_round(x);
  return v;
}

vector<float> lin(const vector<float>& x, int64_t rows, const Tensor& w, const Tensor* b = nullptr) {
  vector<float> y(size_t(rows * w.dim(0)));
  if (t_observer) t_observer(t_observer_ctx, w, x.data(), rows, w.dim(1));
  if (w.input_global_scale > 0 || w.fp8_dynamic_activations) {  // quantized activations (spec/quant.md)
    vector<float> xq = bf16_point(x);  // the GPU quantizes its bf16 GEMM input
    if (w.input_global_scale > 0) quant::nvfp4_fake_quantize_activations(xq.data(), rows, w.dim(1), w.input_global_scale);
    else quant::fp8_fake_quantize_activations(xq.data(), rows, w.dim(1));
    cpu::linear(xq.data(), rows, w.dim(1), w.data(), w.dim(0), y.data(), b ? b->data() : nullptr);
  } else if (t_bf16_points) {
    vector<float> xr = bf16_point(x);
    cpu::linear(xr.data(), rows, w.dim(1), w.data(), w.dim(0), y.data(), b ? b->data() : nullptr);
  } else {
    cpu::linear(x.data(), rows, w.dim(1), w.data(), w.dim(0), y.data(), b ? b->data() : nullptr);
  }
  return y;
}

// Gated DeltaNet layer (spec 1.1) over n rows of one sequence that continue `st` (layer li).
vector<float> gdn_layer(const GdnWeights& w, const TextConfig& c, const vector<float>& h, int64_t n, BackboneState& st, size_t li,
                        GdnForm form) {
  const int64_t Hk = c.k_heads, Hv = c.v_heads, Dk = c.k_head_dim, Dv = c.v_head_dim, K = c.conv_kernel;
  const int64_t key_dim = Hk * Dk, value_dim = Hv * Dv, conv_dim = 2 * key_dim + value_dim;
  vector<float> mixed_raw = lin(h, n, w.in_proj_qkv), z = lin(h, n, w.in_proj_z), b = lin(h, n, w.in_proj_b), a = lin(h, n, w.in_proj_a);
  vector<float> mixed(mixed_raw.size());
  vector<float>& hist = st.conv[li];
  cpu::causal_conv_silu_after(hist.data(), mixed_raw.data(), n, conv_dim, w.conv1d.data(), K, mixed.data());
  // the conv's history for the next rows: the last K - 1 input rows, older history first when n < K - 1
  const int64_t keep = std::min(n, K - 1);
  std::copy(hist.begin() + keep * conv_dim, hist.end(), hist.begin());
  std::copy(mixed_raw.end() - keep * conv_dim, mixed_raw.end(), hist.end() - keep * conv_dim);
  vector<float> beta(size_t(n * Hv)), g(size_t(n * Hv));
#pragma omp parallel for if (n > 64)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < Hv; ++j) {
      beta[size_t(t * Hv + j)] = cpu::sigmoid(b[size_t(t * Hv + j)]);
      g[size_t(t * Hv + j)] = -std::exp(w.A_log.v[size_t(j)]) * cpu::softplus(a[size_t(t * Hv + j)] + w.dt_bias.v[size_t(j)]);
    }
  // L2-normalise q and k per head (q also by 1/sqrt(Dk)), in place inside `mixed`.
  const float qscale = 1.0f / std::sqrt(float(Dk));
#pragma omp parallel for if (n > 64)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t hh = 0; hh < Hk; ++hh) {
        float* x = mixed.data() + t * conv_dim + part * key_dim + hh * Dk;
        double ss = 0;
        for (int64_t i = 0; i < Dk; ++i) ss += double(x[i]) * x[i];
        float inv = float(1.0 / std::sqrt(ss + 1e-6)) * (part == 0 ? qscale : 1.0f);
        for (int64_t i = 0; i < Dk; ++i) x[i] *= inv;
      }
  vector<float> o(size_t(n * value_dim));
  const int64_t per_key = Hv / Hk;
  float* state = st.gdn[li].data();
#pragma omp parallel for schedule(dynamic)
  for (int64_t j = 0; j < Hv; ++j) {
    const int64_t kh = j / per_key;  // repeat_interleave: consecutive value heads share a key head
    cpu::GdnHead gh{mixed.data() + kh * Dk,
                    mixed.data() + key_dim + kh * Dk,
                    mixed.data() + 2 * key_dim + j * Dv,
                    g.data() + j,
                    beta.data() + j,
                    n, Dk, Dv, conv_dim, conv_dim, conv_dim, Hv, value_dim,
                    o.data() + j * Dv,
                    state + j * Dk * Dv};
    if (form == GdnForm::Chunked) cpu::gdn_chunked(gh, 64);
    else cpu::gdn_recurrent(gh);
  }
  // Gated norm per head: plain-w RMSNorm, times silu(z).
  vector<float> normed(o.size());
  cpu::rms_norm(o.data(), n * Hv, Dv, w.norm.data(), float(c.rms_eps), normed.data());
#pragma omp parallel for if (normed.size() > 65536)
  for (size_t i = 0; i < normed.size(); ++i) normed[i] *= cpu::silu(z[i]);
  return lin(normed, n, w.out_proj);
}

// Gated full attention (spec 1.2) with partial RoPE over n rows of one sequence that continue
// `st` (layer li): their keys and values join the state's, positions go on from st.length.
vector<float> attn_layer(const AttnWeights& w, const TextConfig& c, const vector<float>& h, int64_t n, BackboneState& st, size_t li,
                         const SequenceMedia* media) {
  const int64_t Hq = c.q_heads, Hkv = c.kv_heads, D = c.head_dim, R = c.rotary_dim(), pos0 = st.length;
  vector<float> qg = bf16_point(lin(h, n, w.q_proj)), kraw = bf16_point(lin(h, n, w.k_proj)), v = bf16_point(lin(h, n, w.v_proj));
  vector<float> q(size_t(n * Hq * D)), gate(size_t(n * Hq * D)), k(size_t(n * Hkv * D));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < Hq; ++hh) {
      const float* src = qg.data() + t * Hq * 2 * D + hh * 2 * D;
      std::copy(src, src + D, q.data() + (t * Hq + hh) * D);
      std::copy(src + D, src + 2 * D, gate.data() + (t * Hq + hh) * D);
    }
  cpu::rms_norm_1p(q.data(), n * Hq, D, w.q_norm.data(), float(c.rms_eps), q.data());
  cpu::rms_norm_1p(kraw.data(), n * Hkv, D, w.k_norm.data(), float(c.rms_eps), k.data());
  // The reference computes inv_freq and the angle in fp32 (inv_freq = 1 / theta^(2i/R), then
  // inv_freq * pos rounded to fp32); at positions in the thousands that rounding moves the angle
  // by ~1e-4 rad, so we follow it exactly rather than computing a more accurate angle.
  vector<float> inv_freq(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(R));
  // mRoPE, interleaved: frequency i takes its position from row h when i % 3 == 1 and
  // i < 3 * section[1], from row w when i % 3 == 2 and i < 3 * section[2], else from row t
  // (the same for text, whose three rows agree).
  const int64_t sec_h = c.mrope_limit(1), sec_w = c.mrope_limit(2);
  auto rope = [&](float* x, int64_t tok) {
    const int64_t pt = media ? media->pos_t[size_t(tok)] : tok, ph = media ? media->pos_h[size_t(tok)] : tok,
                  pw = media ? media->pos_w[size_t(tok)] : tok;
    for (int64_t i = 0; i < R / 2; ++i) {
      const int64_t pos = (i % 3 == 1 && i < sec_h) ? ph : (i % 3 == 2 && i < sec_w) ? pw : pt;
      const float ang = inv_freq[size_t(i)] * float(pos);
      const float cs = std::cos(ang), sn = std::sin(ang);
      const float x1 = x[i], x2 = x[i + R / 2];
      x[i] = x1 * cs - x2 * sn;
      x[i + R / 2] = x2 * cs + x1 * sn;
    }
  };
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t hh = 0; hh < Hq; ++hh) rope(q.data() + (t * Hq + hh) * D, pos0 + t);
    for (int64_t hh = 0; hh < Hkv; ++hh) rope(k.data() + (t * Hkv + hh) * D, pos0 + t);
  }
  q = bf16_point(std::move(q));
  k = bf16_point(std::move(k));
  vector<float>& K = st.k[li];
  vector<float>& V = st.v[li];
  K.insert(K.end(), k.begin(), k.end());
  V.insert(V.end(), v.begin(), v.end());
  vector<float> out(size_t(n * Hq * D));
  cpu::attention_causal_rows(q.data(), pos0, n, K.data(), V.data(), Hq, Hkv, D, Hq * D, Hkv * D, out.data());
#pragma omp parallel for if (out.size() > 65536)
  for (size_t i = 0; i < out.size(); ++i) out[i] *= cpu::sigmoid(gate[i]);
  return lin(out, n, w.o_proj);
}

// One chunk of n rows through every layer and the final norm.
vector<float> backbone_chunk(const TextWeights& w, const TextConfig& c, const int32_t* ids, int64_t n, BackboneState& st, GdnForm form,
                             const SequenceMedia* media) {
  const int64_t H = c.hidden;
  vector<float> x(size_t(n * H)), h(size_t(n * H));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id >= c.vocab)
      throw Error(Status::Internal, "internal_error", "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                          std::to_string(c.vocab) + " (tokenizer and model disagree)");
    std::copy_n(w.embed.data() + int64_t(id) * H, H, x.data() + t * H);
  }
  if (media)  // the vision tower's rows in place of the image pad embeddings
    for (const SequenceMedia::Image& im : media->images) {
      if (!im.rows) throw Error(Status::Internal, "internal_error", "the CPU backbone got an image without the tower's rows");
      for (int64_t t = std::max(im.first, st.length); t < std::min(im.first + im.count, st.length + n); ++t)
        std::copy_n(im.rows + (t - im.first) * H, H, x.data() + (t - st.length) * H);
    }
  check_finite(x, -1);
  int64_t layer = 0;
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& lw = w.layers[li];
    cpu::rms_norm_1p(x.data(), n, H, lw.input_norm.data(), float(c.rms_eps), h.data());
    vector<float> mix = lw.type == LayerType::LinearAttention ? gdn_layer(lw.gdn, c, h, n, st, li, form) : attn_layer(lw.attn, c, h, n, st, li, media);
#pragma omp parallel for if (x.size() > 65536)
    for (size_t i = 0; i < x.size(); ++i) x[i] += mix[i];
    cpu::rms_norm_1p(x.data(), n, H, lw.post_norm.data(), float(c.rms_eps), h.data());
    vector<float> gt = bf16_point(lin(h, n, lw.gate_proj)), up = bf16_point(lin(h, n, lw.up_proj));
#pragma omp parallel for if (gt.size() > 65536)
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = cpu::silu(gt[i]) * up[i];
    vector<float> down = lin(gt, n, lw.down_proj);
#pragma omp parallel for if (x.size() > 65536)
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    check_finite(x, layer++);
  }
  st.length += n;
  cpu::rms_norm_1p(x.data(), n, H, w.final_norm.data(), float(c.rms_eps), h.data());
  check_finite(h, layer);
  return h;
}

}  // namespace

BackboneState BackboneState::start(const TextConfig& c) {
  BackboneState s;
  const size_t n = c.layer_types.size();
  s.k.resize(n);
  s.v.resize(n);
  s.gdn.resize(n);
  s.conv.resize(n);
  const int64_t conv_dim = 2 * c.k_heads * c.k_head_dim + c.v_heads * c.v_head_dim;
  for (size_t i = 0; i < n; ++i)
    if (c.layer_types[i] == LayerType::LinearAttention) {
      s.gdn[i].assign(size_t(c.v_heads * c.k_head_dim * c.v_head_dim), 0.0f);
      s.conv[i].assign(size_t((c.conv_kernel - 1) * conv_dim), 0.0f);
    }
  return s;
}

void BackboneState::reserve(const TextConfig& c, int64_t tokens) {
  const size_t want = size_t(tokens * c.kv_heads * c.head_dim);
  for (size_t li = 0; li < k.size(); ++li)
    if (c.layer_types[li] == LayerType::FullAttention)
      for (auto* kv : {&k[li], &v[li]})
        if (kv->capacity() < want) kv->reserve(std::max(want, 2 * kv->capacity()));
}

size_t BackboneState::bytes() const {
  size_t b = 0;
  for (const auto* part : {&k, &v, &gdn, &conv})
    for (const auto& x : *part) b += x.size() * sizeof(float);
  return b;
}

void set_activation_observer(ActivationObserver fn, void* ctx) {
  t_observer = fn;
  t_observer_ctx = ctx;
}

SequenceMedia mrope_positions(int64_t length, const std::vector<MediaSpan>& images) {
  SequenceMedia m;
  m.pos_t.resize(size_t(length));
  m.pos_h.resize(size_t(length));
  m.pos_w.resize(size_t(length));
  int64_t p = 0;
  size_t next = 0;
  for (int64_t t = 0; t < length;) {
    if (next < images.size() && images[next].first == t) {
      const MediaSpan& im = images[next++];
      for (int64_t k = 0; k < im.rows * im.cols && t < length; ++k, ++t) {
        m.pos_t[size_t(t)] = p;
        m.pos_h[size_t(t)] = p + k / im.cols;
        m.pos_w[size_t(t)] = p + k % im.cols;
      }
      p += std::max(im.rows, im.cols);
      if (im.embeddings || im.patches) m.images.push_back({im.first, im.rows * im.cols, im.embeddings, im.patches});
      continue;
    }
    m.pos_t[size_t(t)] = m.pos_h[size_t(t)] = m.pos_w[size_t(t)] = p++;
    ++t;
  }
  return m;
}

void backbone_run(const TextWeights& w, const TextConfig& c, const int32_t* ids, int64_t end, BackboneState& st, GdnForm form,
                  const ChunkSink& sink, const SequenceMedia* media) {
  if (st.length % kChunkTokens != 0 || st.length > end)
    throw Error(Status::Internal, "internal_error", "backbone_run: a state of " + std::to_string(st.length) + " tokens continued to " +
                                                        std::to_string(end) + " (states continue at multiples of the chunk)");
  st.reserve(c, end);
  while (st.length < end) {
    const int64_t first = st.length, n = std::min(kChunkTokens, end - first);
    vector<float> hidden = backbone_chunk(w, c, ids + first, n, st, form, media);
    if (sink) sink(first, n, hidden.data());
  }
}

vector<float> backbone_forward(const TextWeights& w, const TextConfig& c, const vector<int32_t>& ids, const vector<int64_t>& offsets,
                               GdnForm form) {
  const int64_t L = int64_t(ids.size()), H = c.hidden;
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != L)
    throw Error(Status::Internal, "internal_error", "backbone_forward: offsets do not cover the ids");
  vector<float> out(size_t(L * H));
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    BackboneState st = BackboneState::start(c);
    const int64_t t0 = offsets[s];
    backbone_run(w, c, ids.data() + t0, offsets[s + 1] - t0, st, form,
                 [&](int64_t first, int64_t n, const float* hidden) { std::copy_n(hidden, n * H, out.data() + (t0 + first) * H); });
  }
  return out;
}

vector<float> backbone_forward_bf16_points(const TextWeights& w, const TextConfig& c, const vector<int32_t>& ids,
                                           const vector<int64_t>& offsets) {
  t_bf16_points = true;
  try {
    auto h = backbone_forward(w, c, ids, offsets);
    t_bf16_points = false;
    return h;
  } catch (...) {
    t_bf16_points = false;
    throw;
  }
}

int64_t first_non_finite_layer(const TextWeights& w, const TextConfig& c, const vector<int32_t>& ids, const vector<int64_t>& offsets,
                               const SequenceMedia* media) {
  if (media && offsets.size() != 2)
    throw Error(Status::Internal, "internal_error", "first_non_finite_layer: media go with one sequence");
  t_check_finite = true;
  t_first_bad = int64_t(w.layers.size()) + 1;
  try {
    if (media) {
      BackboneState st = BackboneState::start(c);
      backbone_run(w, c, ids.data(), int64_t(ids.size()), st, GdnForm::Chunked, {}, media);
    } else {
      backbone_forward(w, c, ids, offsets);
    }
  } catch (...) {
    t_check_finite = false;
    throw;
  }
  t_check_finite = false;
  return t_first_bad > int64_t(w.layers.size()) ? -2 : t_first_bad;
}

}  // namespace clefrt::model

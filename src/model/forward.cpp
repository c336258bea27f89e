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
thread_local bool t_check_finite = false;  // first_non_finite_layer: throw NonFiniteAt
struct NonFiniteAt {
  int64_t layer;
};
void check_finite(const vector<float>& v, int64_t layer) {
  if (!t_check_finite) return;
  for (float f : v)
    if (!std::isfinite(f)) throw NonFiniteAt{layer};
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

// Gated DeltaNet layer (spec 1.1) over packed sequences.
vector<float> gdn_layer(const GdnWeights& w, const TextConfig& c, const vector<float>& h, const vector<int64_t>& offsets,
                        GdnForm form) {
  const int64_t L = offsets.back();
  const int64_t Hk = c.k_heads, Hv = c.v_heads, Dk = c.k_head_dim, Dv = c.v_head_dim;
  const int64_t key_dim = Hk * Dk, value_dim = Hv * Dv, conv_dim = 2 * key_dim + value_dim;
  vector<float> mixed_raw = lin(h, L, w.in_proj_qkv), z = lin(h, L, w.in_proj_z), b = lin(h, L, w.in_proj_b),
                a = lin(h, L, w.in_proj_a);
  vector<float> mixed(mixed_raw.size());
  for (size_t s = 0; s + 1 < offsets.size(); ++s)
    cpu::causal_conv_silu(mixed_raw.data() + offsets[s] * conv_dim, offsets[s + 1] - offsets[s], conv_dim, w.conv1d.data(),
                          c.conv_kernel, mixed.data() + offsets[s] * conv_dim);
  vector<float> beta(size_t(L * Hv)), g(size_t(L * Hv));
#pragma omp parallel for if (L > 64)
  for (int64_t t = 0; t < L; ++t)
    for (int64_t j = 0; j < Hv; ++j) {
      beta[size_t(t * Hv + j)] = cpu::sigmoid(b[size_t(t * Hv + j)]);
      g[size_t(t * Hv + j)] = -std::exp(w.A_log.v[size_t(j)]) * cpu::softplus(a[size_t(t * Hv + j)] + w.dt_bias.v[size_t(j)]);
    }
  // L2-normalise q and k per head (q also by 1/sqrt(Dk)), in place inside `mixed`.
  const float qscale = 1.0f / std::sqrt(float(Dk));
#pragma omp parallel for if (L > 64)
  for (int64_t t = 0; t < L; ++t)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t hh = 0; hh < Hk; ++hh) {
        float* x = mixed.data() + t * conv_dim + part * key_dim + hh * Dk;
        double ss = 0;
        for (int64_t i = 0; i < Dk; ++i) ss += double(x[i]) * x[i];
        float inv = float(1.0 / std::sqrt(ss + 1e-6)) * (part == 0 ? qscale : 1.0f);
        for (int64_t i = 0; i < Dk; ++i) x[i] *= inv;
      }
  vector<float> o(size_t(L * value_dim));
  const int64_t per_key = Hv / Hk;
  const int64_t nseq = int64_t(offsets.size()) - 1;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t s = 0; s < nseq; ++s)
    for (int64_t j = 0; j < Hv; ++j) {
      const int64_t t0 = offsets[size_t(s)], len = offsets[size_t(s) + 1] - t0;
      const int64_t kh = j / per_key;  // repeat_interleave: consecutive value heads share a key head
      cpu::GdnHead gh{mixed.data() + t0 * conv_dim + kh * Dk,
                      mixed.data() + t0 * conv_dim + key_dim + kh * Dk,
                      mixed.data() + t0 * conv_dim + 2 * key_dim + j * Dv,
                      g.data() + t0 * Hv + j,
                      beta.data() + t0 * Hv + j,
                      len, Dk, Dv, conv_dim, conv_dim, conv_dim, Hv, value_dim,
                      o.data() + t0 * value_dim + j * Dv};
      if (form == GdnForm::Chunked) cpu::gdn_chunked(gh, 64);
      else cpu::gdn_recurrent(gh);
    }
  // Gated norm per head: plain-w RMSNorm, times silu(z).
  vector<float> normed(o.size());
  cpu::rms_norm(o.data(), L * Hv, Dv, w.norm.data(), float(c.rms_eps), normed.data());
#pragma omp parallel for if (normed.size() > 65536)
  for (size_t i = 0; i < normed.size(); ++i) normed[i] *= cpu::silu(z[i]);
  return lin(normed, L, w.out_proj);
}

// Gated full attention (spec 1.2) with partial RoPE; text positions restart at 0 per sequence.
vector<float> attn_layer(const AttnWeights& w, const TextConfig& c, const vector<float>& h, const vector<int64_t>& offsets) {
  const int64_t L = offsets.back();
  const int64_t Hq = c.q_heads, Hkv = c.kv_heads, D = c.head_dim, R = c.rotary_dim();
  vector<float> qg = bf16_point(lin(h, L, w.q_proj)), kraw = bf16_point(lin(h, L, w.k_proj)), v = bf16_point(lin(h, L, w.v_proj));
  vector<float> q(size_t(L * Hq * D)), gate(size_t(L * Hq * D)), k(size_t(L * Hkv * D));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t hh = 0; hh < Hq; ++hh) {
      const float* src = qg.data() + t * Hq * 2 * D + hh * 2 * D;
      std::copy(src, src + D, q.data() + (t * Hq + hh) * D);
      std::copy(src + D, src + 2 * D, gate.data() + (t * Hq + hh) * D);
    }
  cpu::rms_norm_1p(q.data(), L * Hq, D, w.q_norm.data(), float(c.rms_eps), q.data());
  cpu::rms_norm_1p(kraw.data(), L * Hkv, D, w.k_norm.data(), float(c.rms_eps), k.data());
  // The reference computes inv_freq and the angle in fp32 (inv_freq = 1 / theta^(2i/R), then
  // inv_freq * pos rounded to fp32); at positions in the thousands that rounding moves the angle
  // by ~1e-4 rad, so we follow it exactly rather than computing a more accurate angle.
  vector<float> inv_freq(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(R));
  auto rope = [&](float* x, int64_t pos) {
    for (int64_t i = 0; i < R / 2; ++i) {
      const float ang = inv_freq[size_t(i)] * float(pos);
      const float cs = std::cos(ang), sn = std::sin(ang);
      const float x1 = x[i], x2 = x[i + R / 2];
      x[i] = x1 * cs - x2 * sn;
      x[i + R / 2] = x2 * cs + x1 * sn;
    }
  };
  for (size_t s = 0; s + 1 < offsets.size(); ++s)
    for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) {
      for (int64_t hh = 0; hh < Hq; ++hh) rope(q.data() + (t * Hq + hh) * D, t - offsets[s]);
      for (int64_t hh = 0; hh < Hkv; ++hh) rope(k.data() + (t * Hkv + hh) * D, t - offsets[s]);
    }
  q = bf16_point(std::move(q));
  k = bf16_point(std::move(k));
  vector<float> out(size_t(L * Hq * D));
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    const int64_t t0 = offsets[s];
    cpu::attention_causal(q.data() + t0 * Hq * D, k.data() + t0 * Hkv * D, v.data() + t0 * Hkv * D, offsets[s + 1] - t0, Hq, Hkv, D,
                          Hq * D, Hkv * D, out.data() + t0 * Hq * D);
  }
#pragma omp parallel for if (out.size() > 65536)
  for (size_t i = 0; i < out.size(); ++i) out[i] *= cpu::sigmoid(gate[i]);
  return lin(out, L, w.o_proj);
}

}  // namespace

void set_activation_observer(ActivationObserver fn, void* ctx) {
  t_observer = fn;
  t_observer_ctx = ctx;
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

vector<float> backbone_forward(const TextWeights& w, const TextConfig& c, const vector<int32_t>& ids, const vector<int64_t>& offsets,
                               GdnForm form) {
  const int64_t L = int64_t(ids.size()), H = c.hidden;
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != L)
    throw Error(Status::Internal, "internal_error", "backbone_forward: offsets do not cover the ids");
  vector<float> x(size_t(L * H)), h(size_t(L * H));
  for (int64_t t = 0; t < L; ++t) {
    const int32_t id = ids[size_t(t)];
    if (id < 0 || id >= c.vocab)
      throw Error(Status::Internal, "internal_error", "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                          std::to_string(c.vocab) + " (tokenizer and model disagree)");
    std::copy_n(w.embed.data() + int64_t(id) * H, H, x.data() + t * H);
  }
  check_finite(x, -1);
  int64_t layer = 0;
  for (const LayerWeights& lw : w.layers) {
    cpu::rms_norm_1p(x.data(), L, H, lw.input_norm.data(), float(c.rms_eps), h.data());
    vector<float> mix = lw.type == LayerType::LinearAttention ? gdn_layer(lw.gdn, c, h, offsets, form) : attn_layer(lw.attn, c, h, offsets);
#pragma omp parallel for if (x.size() > 65536)
    for (size_t i = 0; i < x.size(); ++i) x[i] += mix[i];
    cpu::rms_norm_1p(x.data(), L, H, lw.post_norm.data(), float(c.rms_eps), h.data());
    vector<float> gt = bf16_point(lin(h, L, lw.gate_proj)), up = bf16_point(lin(h, L, lw.up_proj));
#pragma omp parallel for if (gt.size() > 65536)
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = cpu::silu(gt[i]) * up[i];
    vector<float> down = lin(gt, L, lw.down_proj);
#pragma omp parallel for if (x.size() > 65536)
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    check_finite(x, layer++);
  }
  cpu::rms_norm_1p(x.data(), L, H, w.final_norm.data(), float(c.rms_eps), h.data());
  check_finite(h, layer);
  return h;
}

int64_t first_non_finite_layer(const TextWeights& w, const TextConfig& c, const vector<int32_t>& ids, const vector<int64_t>& offsets) {
  t_check_finite = true;
  try {
    backbone_forward(w, c, ids, offsets);
  } catch (const NonFiniteAt& at) {
    t_check_finite = false;
    return at.layer;
  } catch (...) {
    t_check_finite = false;
    throw;
  }
  t_check_finite = false;
  return -2;
}

namespace {

vector<float> layer_norm(const vector<float>& x, int64_t rows, const LayerNormW& n) {
  vector<float> y(x.size());
  cpu::layer_norm(x.data(), rows, n.w.dim(0), n.w.data(), n.b.data(), 1e-5f, y.data());
  return y;
}

// nn.MultiheadAttention: packed in_proj (q, k, v rows), no mask.
vector<float> mha(const Mha& m, const vector<float>& q_in, int64_t lq, const vector<float>& kv_in, int64_t lk, int64_t W, int64_t heads) {
  vector<float> q(size_t(lq * W)), k(size_t(lk * W)), v(size_t(lk * W));
  cpu::linear(q_in.data(), lq, W, m.in_w.data(), W, q.data(), m.in_b.data());
  cpu::linear(kv_in.data(), lk, W, m.in_w.data() + W * W, W, k.data(), m.in_b.data() + W);
  cpu::linear(kv_in.data(), lk, W, m.in_w.data() + 2 * W * W, W, v.data(), m.in_b.data() + 2 * W);
  vector<float> o(size_t(lq * W));
  cpu::attention_full(q.data(), lq, k.data(), v.data(), lk, W, heads, o.data());
  return lin(o, lq, m.out_w, &m.out_b);
}

void gelu_inplace(vector<float>& x) {
  for (auto& v : x) v = cpu::gelu_erf(v);
}

void add(vector<float>& x, const vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

}  // namespace

vector<vector<double>> joint_head(const HeadWeights& hw, const HeadConfig& c, const Tensor& lm_head, const float* hidden, const Sequence& e) {
  const int64_t L = e.length, d = c.hidden, W = c.width;
  vector<float> H(hidden, hidden + L * d);
  vector<float> Hn = layer_norm(H, L, hw.hidden_norm);
  vector<float> M = lin(Hn, L, hw.memory_proj);
  auto span_mean = [&](const float* rows, Span s, int64_t width, const int32_t* gather) {
    vector<float> m(size_t(width), 0.0f);
    for (int32_t t = s.begin; t < s.end; ++t) {
      const float* r = gather ? lm_head.data() + int64_t(gather[t]) * width : rows + int64_t(t) * width;
      for (int64_t x = 0; x < width; ++x) m[size_t(x)] += r[x];
    }
    const float n = float(std::max(1, s.end - s.begin));
    for (auto& v : m) v /= n;
    return m;
  };
  const int64_t Q = int64_t(e.questions.size());
  vector<float> g(Hn.end() - d, Hn.end());
  vector<float> qm(size_t(Q * d)), cm, lm;
  vector<int64_t> qof;  // question of each option
  for (int64_t i = 0; i < Q; ++i) {
    auto m = span_mean(Hn.data(), e.questions[size_t(i)].question, d, nullptr);
    std::copy(m.begin(), m.end(), qm.begin() + i * d);
    for (const Span& s : e.questions[size_t(i)].options) {
      auto c1 = span_mean(Hn.data(), s, d, nullptr);
      auto l1 = span_mean(nullptr, s, d, e.ids);
      cm.insert(cm.end(), c1.begin(), c1.end());
      lm.insert(lm.end(), l1.begin(), l1.end());
      qof.push_back(i);
    }
  }
  const int64_t O = int64_t(qof.size());
  vector<float> qo(size_t(O * d));
  for (int64_t j = 0; j < O; ++j) std::copy_n(qm.begin() + qof[size_t(j)] * d, d, qo.begin() + j * d);
  vector<float> R = lin(cm, O, hw.option_context_proj);
  add(R, lin(lm, O, hw.option_lexical_proj));
  add(R, lin(qo, O, hw.option_question_proj));
  for (const auto& ev : hw.evidence) {
    vector<float> mem = layer_norm(M, L, ev.memory_norm);
    add(R, mha(ev.attn, layer_norm(R, O, ev.query_norm), O, mem, L, W, c.heads));
    vector<float> f = lin(layer_norm(R, O, ev.ff_norm), O, ev.ff0_w, &ev.ff0_b);
    gelu_inplace(f);
    add(R, lin(f, O, ev.ff3_w, &ev.ff3_b));
  }
  vector<float> B = lin(qm, Q, hw.question_proj);
  vector<float> summary(size_t(Q * W), 0.0f);
  {
    int64_t j0 = 0;
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t n = int64_t(e.questions[size_t(i)].options.size());
      vector<double> s(static_cast<size_t>(n));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < W; ++x) dot += double(R[size_t((j0 + j) * W + x)]) * B[size_t(i * W + x)];
        s[size_t(j)] = dot / std::sqrt(double(W));
        mx = std::max(mx, s[size_t(j)]);
      }
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t x = 0; x < W; ++x) summary[size_t(i * W + x)] += float(s[size_t(j)] / sum) * R[size_t((j0 + j) * W + x)];
      j0 += n;
    }
  }
  vector<float> F = B;
  add(F, layer_norm(summary, Q, hw.option_summary_norm));
  vector<float> gp = lin(g, 1, hw.global_proj);
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t x = 0; x < W; ++x)
      F[size_t(i * W + x)] += gp[size_t(x)] + hw.type_embedding.v[size_t(int64_t(e.questions[size_t(i)].type) * W + x)];
  for (const auto& dl : hw.layers) {
    vector<float> n1 = layer_norm(F, Q, dl.norm1);
    add(F, mha(dl.self_attn, n1, Q, n1, Q, W, c.heads));
    add(F, mha(dl.cross_attn, layer_norm(F, Q, dl.norm2), Q, M, L, W, c.heads));
    vector<float> f = lin(layer_norm(F, Q, dl.norm3), Q, dl.lin1_w, &dl.lin1_b);
    gelu_inplace(f);
    add(F, lin(f, Q, dl.lin2_w, &dl.lin2_b));
  }
  F = layer_norm(F, Q, hw.field_norm);
  vector<float> On = layer_norm(R, O, hw.option_norm);
  const double prior_scale = std::exp(std::min(double(hw.prior_logit_scale), std::log(100.0)));
  const double joint_scale = std::exp(std::min(double(hw.joint_logit_scale), std::log(100.0)));
  const double gate = 1.0 / (1.0 + std::exp(-double(hw.residual_gate)));
  // residual scorer input [F_i, o_ij, F_i*o_ij, |F_i - o_ij|]
  vector<float> feat(size_t(O * 4 * W));
  for (int64_t j = 0; j < O; ++j)
    for (int64_t x = 0; x < W; ++x) {
      const float f = F[size_t(qof[size_t(j)] * W + x)], o = On[size_t(j * W + x)];
      float* r = feat.data() + j * 4 * W;
      r[x] = f;
      r[W + x] = o;
      r[2 * W + x] = f * o;
      r[3 * W + x] = std::fabs(f - o);
    }
  vector<float> hid = lin(feat, O, hw.scorer0_w, &hw.scorer0_b);
  gelu_inplace(hid);
  vector<float> resid = lin(hid, O, hw.scorer3_w, &hw.scorer3_b);
  vector<vector<double>> probs(static_cast<size_t>(Q));
  for (int64_t j = 0; j < O; ++j) {
    const int64_t i = qof[size_t(j)];
    // prior: cosine in d dims between the option's lexical mean and (question mean + last token)
    double ll = 0, qq = 0, lq = 0;
    for (int64_t x = 0; x < d; ++x) {
      const double a = lm[size_t(j * d + x)], b = double(qm[size_t(i * d + x)]) + g[size_t(x)];
      ll += a * a;
      qq += b * b;
      lq += a * b;
    }
    const double prior = prior_scale * lq / (std::max(std::sqrt(ll), 1e-12) * std::max(std::sqrt(qq), 1e-12));
    double ff = 0, oo = 0, fo = 0;
    for (int64_t x = 0; x < W; ++x) {
      const double a = F[size_t(i * W + x)], b = On[size_t(j * W + x)];
      ff += a * a;
      oo += b * b;
      fo += a * b;
    }
    const double joint = joint_scale * fo / std::max(std::sqrt(ff) * std::sqrt(oo), 1e-8) + resid[size_t(j)];
    probs[size_t(i)].push_back(prior + gate * joint);
  }
  for (auto& p : probs) {  // softmax per question
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (auto& v : p) sum += (v = std::exp(v - mx));
    for (auto& v : p) v /= sum;
  }
  return probs;
}

}  // namespace clefrt::model

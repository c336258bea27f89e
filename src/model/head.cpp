#include "model/head.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "cpu/ops.h"
#include "model/forward.h"

namespace clefrt::model {

using std::vector;

namespace {

vector<float> lin(const vector<float>& x, int64_t rows, const Tensor& w, const Tensor* b = nullptr) {
  vector<float> y(size_t(rows * w.dim(0)));
  cpu::linear(x.data(), rows, w.dim(1), w.data(), w.dim(0), y.data(), b ? b->data() : nullptr);
  return y;
}

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

void append_head_rows(const HeadWeights& hw, const HeadConfig& c, const float* hidden, int64_t n, HeadRows& out) {
  const int64_t d = c.hidden;
  vector<float> Hn = layer_norm(vector<float>(hidden, hidden + n * d), n, hw.hidden_norm);
  vector<float> M = lin(Hn, n, hw.memory_proj);
  out.memory.insert(out.memory.end(), M.begin(), M.end());
  const int64_t first = out.rows;
  out.rows += n;
  if (out.rows > out.normed_first) {
    const int64_t from = std::max(first, out.normed_first);
    out.normed.insert(out.normed.end(), Hn.begin() + (from - first) * d, Hn.end());
  }
}

vector<vector<double>> joint_head(const HeadWeights& hw, const HeadConfig& c, const Tensor& lm_head, const float* hidden, const Sequence& e) {
  HeadRows hr;
  for (int64_t t = 0; t < e.length; t += kChunkTokens) append_head_rows(hw, c, hidden + t * c.hidden, std::min(kChunkTokens, e.length - t), hr);
  return joint_head(hw, c, lm_head, hr, e);
}

vector<vector<double>> joint_head(const HeadWeights& hw, const HeadConfig& c, const Tensor& lm_head, const HeadRows& hr, const Sequence& e) {
  const int64_t L = e.length, d = c.hidden, W = c.width;
  if (hr.rows != L || int64_t(hr.memory.size()) != L * W || int64_t(hr.normed.size()) != (L - hr.normed_first) * d || hr.normed_first >= L)
    throw Error(Status::Internal, "internal_error", "joint_head: the head rows do not cover the sequence");
  const vector<float>& M = hr.memory;
  // Hn row t (t >= normed_first)
  auto normed_row = [&](int64_t t) {
    if (t < hr.normed_first) throw Error(Status::Internal, "internal_error", "joint_head: a span reads a row before the head's normed rows");
    return hr.normed.data() + (t - hr.normed_first) * d;
  };
  auto span_mean = [&](Span s, int64_t width, const int32_t* gather) {
    vector<float> m(size_t(width), 0.0f);
    for (int32_t t = s.begin; t < s.end; ++t) {
      const float* r = gather ? lm_head.data() + int64_t(gather[t]) * width : normed_row(t);
      for (int64_t x = 0; x < width; ++x) m[size_t(x)] += r[x];
    }
    const float n = float(std::max(1, s.end - s.begin));
    for (auto& v : m) v /= n;
    return m;
  };
  const int64_t Q = int64_t(e.questions.size());
  vector<float> g(normed_row(L - 1), normed_row(L - 1) + d);
  vector<float> qm(size_t(Q * d)), cm, lm;
  vector<int64_t> qof;  // question of each option
  for (int64_t i = 0; i < Q; ++i) {
    auto m = span_mean(e.questions[size_t(i)].question, d, nullptr);
    std::copy(m.begin(), m.end(), qm.begin() + i * d);
    for (const Span& s : e.questions[size_t(i)].options) {
      auto c1 = span_mean(s, d, nullptr);
      auto l1 = span_mean(s, d, e.ids);
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

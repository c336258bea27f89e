#include "cuda/device_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "cuda/check.h"
#include "io/safetensors_write.h"

namespace clefrt::cuda {

namespace {


class Builder {
 public:
  Builder(DevModel& m, uint64_t seed) : m_(m), seed_(seed) {}

  // Rows of several tensors stacked into one [sum rows, cols] bf16 matrix.
  DevLinear matrix(std::vector<const model::Tensor*> parts) {
    int64_t rows = 0;
    const int64_t cols = parts[0]->shape.back();
    for (auto* t : parts) rows += t->numel_rows();
    DeviceBuffer buf(size_t(rows * cols) * 2, "weights");
    char* dst = buf.as<char>();
    for (auto* t : parts) {
      const int64_t n = t->numel_rows() * cols;
      put_bf16(*t, reinterpret_cast<bf16*>(dst), n, 1.0f / std::sqrt(float(cols)), 0.0f);
      dst += n * 2;
    }
    DevLinear l{buf.as<bf16>(), rows, cols};
    keep(std::move(buf));
    return l;
  }
  DevLinear32 matrix32(const model::Tensor& t) {
    const int64_t cols = t.shape.back(), rows = t.numel_rows();
    return {vec(t, 0.0f, 1.0f / std::sqrt(float(cols))), rows, cols};
  }
  const bf16* table(const model::Tensor& t, float std) {
    DeviceBuffer buf(size_t(t.numel()) * 2, "weights");
    put_bf16(t, buf.as<bf16>(), t.numel(), std, 0.0f);
    const bf16* p = buf.as<bf16>();
    keep(std::move(buf));
    return p;
  }
  // fp32 vector; random ones are normal(mean, std)
  const float* vec(const model::Tensor& t, float mean, float std, int64_t offset = 0, int64_t count = -1) {
    const int64_t n = count < 0 ? t.numel() - offset : count;
    DeviceBuffer buf(size_t(n) * 4, "weights");
    if (has_data(t)) {
      std::vector<float> v = host_f32(t);
      check(cudaMemcpy(buf.get(), v.data() + offset, size_t(n) * 4, cudaMemcpyHostToDevice), "upload weights");
    } else {
      fill_normal_f32(buf.as<float>(), n, next_seed(), mean, std, nullptr);
    }
    const float* p = buf.as<float>();
    keep(std::move(buf));
    return p;
  }
  const float* host_vec(const std::vector<float>& v) {
    DeviceBuffer buf = upload(v, "weights");
    const float* p = buf.as<float>();
    keep(std::move(buf));
    return p;
  }
  static bool has_data(const model::Tensor& t) { return t.src || !t.v.empty(); }
  static std::vector<float> host_f32(const model::Tensor& t) { return t.v.empty() ? model::to_f32(*t.src) : t.v; }

 private:
  void put_bf16(const model::Tensor& t, bf16* dst, int64_t n, float std, float mean) {
    if (t.src && t.src->dtype == io::DType::BF16) {
      check(cudaMemcpy(dst, t.src->data, size_t(n) * 2, cudaMemcpyHostToDevice), "upload weights");
    } else if (has_data(t)) {
      std::vector<float> v = host_f32(t);
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = io::f32_to_bf16(v[i]);
      check(cudaMemcpy(dst, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "upload weights");
    } else {
      fill_normal_bf16(dst, n, next_seed(), mean, std, nullptr);
    }
  }
  void keep(DeviceBuffer b) {
    m_.weight_bytes += b.bytes();
    m_.owned.push_back(std::move(b));
  }
  uint64_t next_seed() { return seed_ * 1000003ull + counter_++; }

  DevModel& m_;
  uint64_t seed_, counter_ = 0;
};

DevLN ln(Builder& b, const model::LayerNormW& n) { return {b.vec(n.w, 1.0f, 0.1f), b.vec(n.b, 0.0f, 0.1f)}; }

DevMha mha(Builder& b, const model::Mha& m) {
  return {b.matrix32(m.in_w), b.matrix32(m.out_w), b.vec(m.in_b, 0.0f, 0.02f), b.vec(m.out_b, 0.0f, 0.02f)};
}

}  // namespace

DevModel build_device_model(const model::TextWeights& tw, const model::HeadWeights& hw, const model::TextConfig& c,
                            const model::HeadConfig& hc, uint64_t seed, bool progress) {
  DevModel m;
  m.c = c;
  m.hc = hc;
  Builder b(m, seed);
  m.embed = b.table(tw.embed, 1.0f);
  m.lm_head = (tw.embed.src && tw.lm_head.src == tw.embed.src) ? m.embed : b.table(tw.lm_head, 1.0f);
  m.final_norm = b.vec(tw.final_norm, 0.0f, 0.1f);
  {
    const int64_t R = c.rotary_dim();
    std::vector<float> inv(size_t(R / 2));
    for (int64_t i = 0; i < R / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(R));
    m.inv_freq = b.host_vec(inv);
  }
  for (size_t i = 0; i < tw.layers.size(); ++i) {
    if (progress) std::fprintf(stderr, "\rupload: layer %zu/%zu", i + 1, tw.layers.size());
    const model::LayerWeights& lw = tw.layers[i];
    DevLayer d{};
    d.type = lw.type;
    d.input_norm = b.vec(lw.input_norm, 0.0f, 0.1f);
    d.post_norm = b.vec(lw.post_norm, 0.0f, 0.1f);
    d.gate_up = b.matrix({&lw.gate_proj, &lw.up_proj});
    d.down = b.matrix({&lw.down_proj});
    if (lw.type == model::LayerType::LinearAttention) {
      const auto& g = lw.gdn;
      d.gdn_in = b.matrix({&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a});
      d.gdn_out = b.matrix({&g.out_proj});
      d.conv_w = b.vec(g.conv1d, 0.0f, 0.5f);
      d.dt_bias = b.vec(g.dt_bias, 0.0f, 1.0f);
      std::vector<float> negA(size_t(c.v_heads));
      if (Builder::has_data(g.A_log)) {
        std::vector<float> alog = Builder::host_f32(g.A_log);
        for (size_t j = 0; j < negA.size(); ++j) negA[j] = -std::exp(alog[j]);
      } else {
        for (size_t j = 0; j < negA.size(); ++j) negA[j] = -std::exp(2.7f * float(j) / float(negA.size()));
      }
      d.neg_A = b.host_vec(negA);
      d.gdn_norm = b.vec(g.norm, 1.0f, 0.1f);
    } else {
      const auto& a = lw.attn;
      d.qkv = b.matrix({&a.q_proj, &a.k_proj, &a.v_proj});
      d.o = b.matrix({&a.o_proj});
      d.q_norm = b.vec(a.q_norm, 0.0f, 0.1f);
      d.k_norm = b.vec(a.k_norm, 0.0f, 0.1f);
    }
    m.layers.push_back(d);
  }
  if (progress) std::fprintf(stderr, "\n");
  DevHead& h = m.head;
  h.hidden_norm = ln(b, hw.hidden_norm);
  h.option_summary_norm = ln(b, hw.option_summary_norm);
  h.field_norm = ln(b, hw.field_norm);
  h.option_norm = ln(b, hw.option_norm);
  h.memory_proj = b.matrix32(hw.memory_proj);
  h.question_proj = b.matrix32(hw.question_proj);
  h.option_question_proj = b.matrix32(hw.option_question_proj);
  h.global_proj = b.matrix32(hw.global_proj);
  h.option_context_proj = b.matrix32(hw.option_context_proj);
  h.option_lexical_proj = b.matrix32(hw.option_lexical_proj);
  h.type_emb = b.vec(hw.type_embedding, 0.0f, 1.0f);
  for (const auto& ev : hw.evidence) {
    DevHead::Evidence e;
    e.query_norm = ln(b, ev.query_norm);
    e.memory_norm = ln(b, ev.memory_norm);
    e.ff_norm = ln(b, ev.ff_norm);
    e.attn = mha(b, ev.attn);
    e.ff0 = b.matrix32(ev.ff0_w);
    e.ff3 = b.matrix32(ev.ff3_w);
    e.ff0_b = b.vec(ev.ff0_b, 0.0f, 0.02f);
    e.ff3_b = b.vec(ev.ff3_b, 0.0f, 0.02f);
    h.evidence.push_back(e);
  }
  for (const auto& dl : hw.layers) {
    DevHead::Decoder d;
    d.self_attn = mha(b, dl.self_attn);
    d.cross_attn = mha(b, dl.cross_attn);
    d.lin1 = b.matrix32(dl.lin1_w);
    d.lin2 = b.matrix32(dl.lin2_w);
    d.lin1_b = b.vec(dl.lin1_b, 0.0f, 0.02f);
    d.lin2_b = b.vec(dl.lin2_b, 0.0f, 0.02f);
    d.norm1 = ln(b, dl.norm1);
    d.norm2 = ln(b, dl.norm2);
    d.norm3 = ln(b, dl.norm3);
    h.layers.push_back(d);
  }
  h.scorer0 = b.matrix32(hw.scorer0_w);
  h.scorer0_b = b.vec(hw.scorer0_b, 0.0f, 0.02f);
  h.scorer3_w = b.vec(hw.scorer3_w, 0.0f, 1.0f / std::sqrt(float(hw.scorer3_w.numel())));
  h.scorer3_b = Builder::has_data(hw.scorer3_b) ? Builder::host_f32(hw.scorer3_b)[0] : 0.0f;
  h.scalars.prior_scale = float(std::exp(std::min(double(hw.prior_logit_scale), std::log(100.0))));
  h.scalars.joint_scale = float(std::exp(std::min(double(hw.joint_logit_scale), std::log(100.0))));
  h.scalars.gate = float(1.0 / (1.0 + std::exp(-double(hw.residual_gate))));
  h.scalars.b3 = h.scorer3_b;
  check(cudaDeviceSynchronize(), "upload weights");
  return m;
}

}  // namespace clefrt::cuda

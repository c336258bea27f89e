#include "cuda/forward.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/kernels_quant.h"

namespace clefrt::cuda {

using model::LayerType;

namespace {
constexpr int64_t kChunk = 64, kTile = 64;
}

// Everything one forward needs: the host-side index arrays and the device buffers carved from
// the arena. carve() is also run on a counting arena to plan the memory.
struct Forward::Batch {
  int64_t L = 0, nseq = 0, O = 0, Q = 0, nchunks = 0, ntiles = 0;
  // host index arrays, uploaded in one copy
  std::vector<int32_t> meta;
  size_t off_ids, off_seq_start, off_chunk_start, off_chunk_len, off_seq_chunk, off_tile_q0, off_tile_seq0, off_tile_end;
  size_t off_qbeg, off_qend, off_obeg, off_oend, off_last, off_qof, off_oreq, off_optbeg, off_type, off_qreq, off_otok_b, off_otok_e,
      off_qtok_b, off_qtok_e, off_qq_b, off_qq_e;
  int32_t* dmeta = nullptr;
  const int32_t* d(size_t off) const { return dmeta + off; }

  // backbone
  float *x, *mixed, *g, *beta, *gdn_o, *hidden;
  bf16 *h, *big, *act, *q, *k;
  float* big32;  // the same memory as big, read as fp32 (the GDN in_proj output)
  GdnScratch gs{};
  int64_t gdn_pass = 0;               // chunks a GDN pass covers (the scratch holds that many)
  float* gdn_state[2] = {nullptr, nullptr};  // a sequence's state between passes [Hv, Dk, Dv]
  QuantScratch qs{};
  // head
  float *Hn, *M, *mem, *KV, *qm, *cm, *lm, *glast, *qo, *R, *B, *summary, *F, *Fn, *On, *tmpq, *att, *nrm, *ff, *feat, *gp, *logits;

  void carve(Arena& a, const DevModel& m, const ForwardOptions& o) {
    const auto& c = m.c;
    const auto& hc = m.hc;
    const int64_t H = c.hidden, key_dim = c.k_heads * c.k_head_dim, value_dim = c.v_heads * c.v_head_dim;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    const int64_t n_gdn = conv_dim + value_dim + 2 * c.v_heads;
    const int64_t n_qkv = c.q_heads * 2 * c.head_dim + 2 * c.kv_heads * c.head_dim;
    // bf16 elements: the GDN in_proj output is kept in fp32 (2 slots each): its conv output is
    // L2-normalised per head, which turns small absolute rounding errors into large ones
    // bf16 elements per buffer: the MLP's rows are a block of at most MB tokens
    const int64_t MB = o.mlp_block_tokens > 0 ? std::min(L, o.mlp_block_tokens) : L;
    const int64_t big_elems = std::max({2 * c.ffn * MB, 2 * n_gdn * L, n_qkv * L});
    const int64_t act_elems = std::max({c.ffn * MB, value_dim * L, c.q_heads * c.head_dim * L});
    // quantized Linear inputs: MLP down's (ffn wide) for a block, the rest for every token
    const int64_t k_rest = (std::max({H, value_dim, c.q_heads * c.head_dim}) + 15) / 16 * 16;
    const int64_t xq_elems = std::max(MB * m.max_k, L * std::min(m.max_k, k_rest));
    const int64_t d = hc.hidden, W = hc.width, sh = W * 4;  // scorer hidden <= 4W is checked at load
    dmeta = a.carve<int32_t>(meta_capacity(), "batch index arrays");
    hidden = a.carve<float>(L * H, "hidden");
    // The backbone's scratch and the head's share one region: the head reads only `hidden` (and
    // the index arrays), and the backbone is done with its scratch once the final norm has
    // written `hidden`. (About a third of the arena at 4,096 tokens on the 27B shapes.)
    const size_t shared_from = a.used();
    x = a.carve<float>(L * H, "residual");
    h = a.carve<bf16>(L * H, "normed");
    big = a.carve<bf16>(big_elems, "projections");
    big32 = reinterpret_cast<float*>(big);
    // Two phases share the rest. A: the GDN's conv output, gates, chunk scratch and output,
    // live from the conv to the gated norm. B: the Linear inputs (act), their quantized copies
    // and the attention's q / k, live in attention and MLP blocks and from the gated norm on
    // (which reads gdn_o and writes act, so B starts after gdn_o). Nothing in B is live while
    // A's buffers are, except gdn_o. (-0.32 GiB at 4,096 tokens on the 27B shapes.)
    gdn_o = a.carve<float>(L * value_dim, "gdn out");
    const size_t phase_b_from = a.used();
    g = a.carve<float>(L * c.v_heads, "gdn g");
    beta = a.carve<float>(L * c.v_heads, "gdn beta");
    mixed = a.carve<float>(L * conv_dim, "gdn conv out");
    gdn_pass = o.gdn_pass_chunks > 0 ? std::min(nchunks, o.gdn_pass_chunks) : nchunks;
    gs.w = a.carve<float>(gdn_pass * c.v_heads * kChunk * c.k_head_dim, "gdn W");
    gs.u = a.carve<float>(gdn_pass * c.v_heads * kChunk * c.v_head_dim, "gdn U");
    gs.aqk = a.carve<float>(gdn_pass * c.v_heads * kChunk * kChunk, "gdn A");
    if (gdn_pass < nchunks)
      for (float*& st : gdn_state) st = a.carve<float>(c.v_heads * c.k_head_dim * c.v_head_dim, "gdn state between passes");
    const size_t phase_a_end = a.used();
    a.rewind(phase_b_from);
    act = a.carve<bf16>(act_elems, "activations");
    q = a.carve<bf16>(L * c.q_heads * c.head_dim, "attn q");
    k = a.carve<bf16>(L * c.kv_heads * c.head_dim, "attn k");
    if (m.has_w4a4) qs.xq16 = a.carve<bf16>(xq_elems, "W4A4 activations");
    if (m.has_native_fp4) {
      qs.xq4 = a.carve<uint8_t>(xq_elems / 2, "FP4 activations");
      qs.xsc = a.carve<uint8_t>(size_t(std::max(nvfp4_swizzled_bytes(MB, m.max_k), nvfp4_swizzled_bytes(L, std::min(m.max_k, k_rest)))),
                                "FP4 activation scales");
    }
    if (m.has_fp8) {
      qs.xq8 = a.carve<uint8_t>(xq_elems, "FP8 activations");
      qs.xs = a.carve<float>(L, "FP8 activation scales");
      qs.acc = a.carve<float>(L * LinearRunner::fp8_scratch_cols(m), "FP8 GEMM out");
    }
    const size_t backbone_end = std::max(a.used(), phase_a_end);
    a.rewind(shared_from);
    Hn = hidden;  // the head's layer norm runs in place (d == H: the head reads the backbone's width)
    M = a.carve<float>(L * W, "head memory");
    mem = a.carve<float>(L * W, "head memory norm");
    KV = a.carve<float>(L * 2 * W, "head kv");
    qm = a.carve<float>(Q * d, "qm");
    cm = a.carve<float>(O * d, "cm");
    lm = a.carve<float>(O * d, "lm");
    glast = a.carve<float>(nseq * d, "g");
    qo = a.carve<float>(O * d, "qo");
    const int64_t rows = std::max(O, Q);
    R = a.carve<float>(O * W, "R");
    B = a.carve<float>(Q * W, "B");
    summary = a.carve<float>(Q * W, "summary");
    F = a.carve<float>(Q * W, "F");
    Fn = a.carve<float>(Q * W, "Fn");
    On = a.carve<float>(O * W, "On");
    tmpq = a.carve<float>(rows * 3 * W, "head q");
    att = a.carve<float>(rows * W, "head att");
    nrm = a.carve<float>(rows * W, "head norm");
    ff = a.carve<float>(rows * std::max(hc.ffn, sh), "head ff");
    feat = a.carve<float>(O * 4 * W, "scorer features");
    gp = a.carve<float>(nseq * W, "gp");
    logits = a.carve<float>(O, "logits");
    a.rewind(std::max(a.used(), backbone_end));
  }
  size_t meta_capacity() const { return size_t(L * 2 + 3 * nchunks + nseq + 1 + 3 * ntiles + 10 * Q + 8 * O + nseq + 64); }
};

Forward::Forward(const DevModel& m, ForwardOptions o) : m_(m), o_(o) {
  const char* pe = std::getenv("CLEFRT_PROFILE");
  profile_ = pe && *pe && std::strcmp(pe, "0") != 0;
  if (!flash_attention_supports(m.c.head_dim))
    throw load_error("config.json", "head_dim " + std::to_string(m.c.head_dim) + " is not supported by the CUDA attention kernel");
  if (m.c.k_head_dim > 128 || m.c.v_head_dim > 256)
    throw load_error("config.json", "GDN head dims (k " + std::to_string(m.c.k_head_dim) + ", v " + std::to_string(m.c.v_head_dim) +
                                        ") are not supported by the CUDA GDN kernels (k <= 128, v <= 256)");
  if (m.head.scorer0.n > 4 * m.hc.width)
    throw load_error("joint_head.safetensors", "residual_scorer hidden size above 4 x width is not supported by the CUDA head");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  gemm_ = std::make_unique<Gemm>(stream_, o.batch_invariant, gemm_workspace_bytes());
  lin_ = std::make_unique<LinearRunner>(m, *gemm_, stream_, LinearRunner::kStageBytes,
                                        o.w4a16_fused ? W4A16Kernel::Fused : w4a16_kernel_from_env());
  if (o.gdn_pass_chunks < 0) throw Error(Status::Internal, "internal_error", "gdn_pass_chunks < 0");
  arena_.reserve(plan_bytes(m, o));
}

Forward::~Forward() {
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

size_t Forward::plan_bytes(const DevModel& m, const ForwardOptions& o) {
  Batch b;
  b.L = o.max_tokens;
  b.nseq = o.max_seqs;
  b.O = o.max_tokens;  // every option span covers at least one token
  b.Q = std::min(o.max_tokens, o.max_seqs * o.max_questions);
  b.nchunks = o.max_tokens / kChunk + o.max_seqs;
  b.ntiles = o.max_tokens / kTile + o.max_seqs;
  Arena a = Arena::counter();
  b.carve(a, m, o);
  return a.used() + (size_t(1) << 20);
}

size_t Forward::arena_bytes(const model::TextConfig& c, const model::HeadConfig& hc, const ForwardOptions& o, QuantMode q) {
  DevModel shapes;
  shapes.c = c;
  shapes.hc = hc;
  shapes.has_w4a4 = q == QuantMode::NVFP4;
  shapes.has_fp8 = q == QuantMode::FP8;
  shapes.max_k = std::max({c.hidden, c.ffn, c.v_heads * c.v_head_dim, c.q_heads * c.head_dim});
  return plan_bytes(shapes, o);
}

void Forward::mark(const char* op) {
  if (!profile_) return;
  if (marks_.size() >= event_pool_.size()) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "profile event");
    event_pool_.push_back(e);
  }
  cudaEvent_t e = event_pool_[marks_.size()];
  check(cudaEventRecord(e, stream_), "profile event");
  marks_.emplace_back(op, e);
}

void Forward::collect_profile() {
  if (!profile_ || marks_.empty()) return;
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, marks_[i].second, marks_[i + 1].second), "profile event");
    const std::string name = marks_[i].first;
    auto it = std::find_if(prof_totals_.begin(), prof_totals_.end(), [&](auto& p) { return p.first == name; });
    if (it == prof_totals_.end()) prof_totals_.emplace_back(name, ms);
    else it->second += ms;
  }
  marks_.clear();
}

std::vector<std::vector<std::vector<double>>> Forward::head_only(const std::vector<const Encoded*>& batch,
                                                                 const std::vector<float>& hidden) {
  return run_impl(batch, &hidden);
}

std::vector<std::vector<std::vector<double>>> Forward::run(const std::vector<const Encoded*>& batch) { return run_impl(batch, nullptr); }

std::vector<std::vector<std::vector<double>>> Forward::run_impl(const std::vector<const Encoded*>& batch, const std::vector<float>* hidden) {
  Batch b;
  prepare(b, batch);
  if (b.L == 0) return {};
  if (hidden) {
    if (hidden->size() != size_t(b.L * m_.c.hidden)) throw Error(Status::Internal, "internal_error", "head_only: hidden has the wrong size");
    check(cudaMemcpyAsync(b.hidden, hidden->data(), hidden->size() * 4, cudaMemcpyHostToDevice, stream_), "upload hidden");
  } else {
    backbone(b);
  }
  head(b);
  mark("end");
  std::vector<float> probs(size_t(b.O));
  check(cudaMemcpyAsync(probs.data(), b.logits, probs.size() * 4, cudaMemcpyDeviceToHost, stream_), "download probabilities");
  check(cudaStreamSynchronize(stream_), "forward (set CLEFRT_CUDA_SYNC=1 to find the failing kernel)");
  collect_profile();
  std::vector<std::vector<std::vector<double>>> out;
  size_t j = 0;
  for (const Encoded* e : batch) {
    std::vector<std::vector<double>> per;
    for (const auto& q : e->questions) {
      std::vector<double> p;
      for (size_t k = 0; k < q.option_spans.size(); ++k) p.push_back(double(probs[j++]));
      per.push_back(std::move(p));
    }
    out.push_back(std::move(per));
  }
  return out;
}

std::vector<float> Forward::hidden_states(const std::vector<const Encoded*>& batch) {
  Batch b;
  prepare(b, batch);
  if (b.L == 0) return {};
  backbone(b);
  mark("end");
  std::vector<float> h(size_t(b.L * m_.c.hidden));
  check(cudaMemcpyAsync(h.data(), b.hidden, h.size() * 4, cudaMemcpyDeviceToHost, stream_), "download hidden states");
  check(cudaStreamSynchronize(stream_), "forward (set CLEFRT_CUDA_SYNC=1 to find the failing kernel)");
  collect_profile();
  return h;
}

void Forward::prepare(Batch& b, const std::vector<const Encoded*>& batch) {
  b.nseq = int64_t(batch.size());
  std::vector<int64_t> offs = {0};
  for (const Encoded* e : batch) {
    if (!e->images.empty())
      throw Error(Status::Unprocessable, "unsupported", "images are not supported yet: the vision tower is not implemented", "images");
    offs.push_back(offs.back() + int64_t(e->input_ids.size()));
    b.Q += int64_t(e->questions.size());
    for (const auto& q : e->questions) b.O += int64_t(q.option_spans.size());
  }
  b.L = offs.back();
  if (b.L > o_.max_tokens)
    throw context_exceeded("the batch holds " + std::to_string(b.L) + " tokens; the GPU memory plan allows at most " +
                           std::to_string(o_.max_tokens) + " (this engine's maximum context length)");
  if (b.nseq > o_.max_seqs)
    throw Error(Status::Internal, "internal_error",
                "batch of " + std::to_string(b.nseq) + " requests exceeds the plan's " + std::to_string(o_.max_seqs));
  for (const Encoded* e : batch)
    if (int64_t(e->questions.size()) > o_.max_questions)
      throw Error(Status::Unprocessable, "invalid_request",
                  "a request has " + std::to_string(e->questions.size()) + " questions; the GPU memory plan allows " +
                      std::to_string(o_.max_questions) + " per request",
                  "questions");
  if (b.L == 0) return;

  // ---- index arrays ----
  auto& v = b.meta;
  auto mark = [&](size_t& off) { off = v.size(); };
  mark(b.off_ids);
  for (const Encoded* e : batch) v.insert(v.end(), e->input_ids.begin(), e->input_ids.end());
  for (int32_t id : v)
    if (id < 0 || id >= m_.c.vocab)
      throw Error(Status::Internal, "internal_error", "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                          std::to_string(m_.c.vocab) + " (tokenizer and model disagree)");
  mark(b.off_seq_start);
  for (int64_t s = 0; s < b.nseq; ++s)
    for (int64_t t = offs[s]; t < offs[s + 1]; ++t) v.push_back(int32_t(offs[s]));
  std::vector<int32_t> cs, cl, sc = {0}, tq, ts, te;
  for (int64_t s = 0; s < b.nseq; ++s) {
    for (int64_t t = offs[s]; t < offs[s + 1]; t += kChunk) {
      cs.push_back(int32_t(t));
      cl.push_back(int32_t(std::min(kChunk, offs[s + 1] - t)));
    }
    sc.push_back(int32_t(cs.size()));
    for (int64_t t = offs[s]; t < offs[s + 1]; t += kTile) {
      tq.push_back(int32_t(t));
      ts.push_back(int32_t(offs[s]));
      te.push_back(int32_t(offs[s + 1]));
    }
  }
  // longest causal rows first so the last wave is short
  std::vector<size_t> order(tq.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return tq[a] - ts[a] > tq[c] - ts[c]; });
  b.nchunks = int64_t(cs.size());
  b.ntiles = int64_t(tq.size());
  mark(b.off_chunk_start);
  v.insert(v.end(), cs.begin(), cs.end());
  mark(b.off_chunk_len);
  v.insert(v.end(), cl.begin(), cl.end());
  mark(b.off_seq_chunk);
  v.insert(v.end(), sc.begin(), sc.end());
  mark(b.off_tile_q0);
  for (size_t i : order) v.push_back(tq[i]);
  mark(b.off_tile_seq0);
  for (size_t i : order) v.push_back(ts[i]);
  mark(b.off_tile_end);
  for (size_t i : order) v.push_back(te[i]);
  // head: spans as global token rows; options question by question, questions request by request
  std::vector<int32_t> qb, qe, ob, oe, last, qof, oreq, optb = {0}, type, qreq, otb, ote, qtb, qte, qqb, qqe;
  int32_t qi = 0;
  for (int64_t s = 0; s < b.nseq; ++s) {
    const Encoded& e = *batch[size_t(s)];
    const int32_t base = int32_t(offs[s]), qfirst = qi;
    last.push_back(int32_t(offs[s + 1] - 1));
    for (const auto& q : e.questions) {
      qb.push_back(base + q.question_span.begin);
      qe.push_back(base + q.question_span.end);
      type.push_back(int32_t(q.type));
      qreq.push_back(int32_t(s));
      qtb.push_back(base);
      qte.push_back(int32_t(offs[s + 1]));
      for (const Span& o : q.option_spans) {
        ob.push_back(base + o.begin);
        oe.push_back(base + o.end);
        qof.push_back(qi);
        oreq.push_back(int32_t(s));
        otb.push_back(base);
        ote.push_back(int32_t(offs[s + 1]));
      }
      optb.push_back(int32_t(ob.size()));
      ++qi;
    }
    for (size_t k = 0; k < e.questions.size(); ++k) {
      qqb.push_back(qfirst);
      qqe.push_back(qi);
    }
  }
  auto put = [&](size_t& off, const std::vector<int32_t>& a) {
    mark(off);
    v.insert(v.end(), a.begin(), a.end());
  };
  put(b.off_qbeg, qb);
  put(b.off_qend, qe);
  put(b.off_obeg, ob);
  put(b.off_oend, oe);
  put(b.off_last, last);
  put(b.off_qof, qof);
  put(b.off_oreq, oreq);
  put(b.off_optbeg, optb);
  put(b.off_type, type);
  put(b.off_qreq, qreq);
  put(b.off_otok_b, otb);
  put(b.off_otok_e, ote);
  put(b.off_qtok_b, qtb);
  put(b.off_qtok_e, qte);
  put(b.off_qq_b, qqb);
  put(b.off_qq_e, qqe);

  arena_.reset();
  b.carve(arena_, m_, o_);
  if (v.size() > b.meta_capacity()) throw Error(Status::Internal, "internal_error", "batch index arrays exceed their plan");
  check(cudaMemcpyAsync(b.dmeta, v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream_), "upload batch indices");

}

void Forward::backbone(Batch& b) {
  const auto& c = m_.c;
  const int64_t L = b.L, H = c.hidden;
  const float eps = float(c.rms_eps);
  const int64_t key_dim = c.k_heads * c.k_head_dim, value_dim = c.v_heads * c.v_head_dim, conv_dim = 2 * key_dim + value_dim;
  const int64_t Hq = c.q_heads, Hkv = c.kv_heads, D = c.head_dim;
  cudaStream_t s = stream_;
  const GdnChunks ch{b.d(b.off_chunk_start), b.d(b.off_chunk_len), b.d(b.off_seq_chunk), b.nchunks, b.nseq};
  const AttnTiles tiles{b.d(b.off_tile_q0), b.d(b.off_tile_seq0), b.d(b.off_tile_end), b.ntiles};

  mark("embed");
  embed_gather(b.d(b.off_ids), L, m_.embed, H, b.x, s);
  lin_->begin(b.qs);
  LinearRunner& lin = *lin_;
  const int64_t mlp_block = o_.mlp_block_tokens > 0 ? std::min(L, o_.mlp_block_tokens) : L;
  int64_t done = 0;
  for (const DevLayer& l : m_.layers) {
    if (o_.debug_layers >= 0 && done++ >= o_.debug_layers) break;
    mark("rms_norm");
    rms_norm_1p(b.x, L, H, l.input_norm, eps, b.h, nullptr, s);
    if (l.type == LayerType::LinearAttention) {
      const int64_t n = l.gdn_in.n;
      mark("gemm gdn in_proj");
      lin.run(b.h, L, H, l.gdn_in, b.big32, OutType::F32, n, false, "gdn in_proj");
      mark("gdn conv+prep");
      conv_silu(b.big32, n, b.d(b.off_seq_start), L, conv_dim, l.conv_w, c.conv_kernel, b.mixed, s);
      const float* bcol = b.big32 + conv_dim + value_dim;
      gdn_prep(b.mixed, conv_dim, L, c.k_heads, c.k_head_dim, bcol, bcol + c.v_heads, n, c.v_heads, l.neg_A, l.dt_bias, b.g, b.beta, s);
      for (int64_t c0 = 0, pass = 0; c0 < b.nchunks; c0 += b.gdn_pass, ++pass) {
        GdnScratch gp = b.gs;
        gp.c0 = c0;
        gp.c1 = std::min(b.nchunks, c0 + b.gdn_pass);
        gp.state_in = b.gdn_state[pass % 2];
        gp.state_out = b.gdn_state[(pass + 1) % 2];
        mark("gdn chunk prep");
        gdn_chunk_prep(b.mixed, c.k_heads, c.v_heads, c.k_head_dim, c.v_head_dim, b.g, b.beta, ch, gp, s);
        mark("gdn chunk scan");
        gdn_chunk_scan(b.mixed, c.k_heads, c.v_heads, c.k_head_dim, c.v_head_dim, b.g, ch, gp, b.gdn_o, s);
      }
      mark("gdn gated_norm");
      gated_norm(b.gdn_o, L, c.v_heads, c.v_head_dim, l.gdn_norm, eps, b.big32 + conv_dim, n, b.act, s);
      mark("gemm gdn out_proj");
      lin.run(b.act, L, value_dim, l.gdn_out, b.x, OutType::F32, H, true, "gdn out_proj");
    } else {
      const int64_t n = l.qkv.n;
      mark("gemm attn qkv");
      lin.run(b.h, L, H, l.qkv, b.big, OutType::BF16, n, false, "attention qkv_proj");
      mark("attn prep");
      attn_prep(b.big, n, L, Hq, Hkv, D, c.rotary_dim(), m_.inv_freq, b.d(b.off_seq_start), l.q_norm, l.k_norm, eps, b.q, b.k, s);
      mark("flash attention");
      flash_attention(b.q, b.k, b.big + Hq * 2 * D + Hkv * D, n, b.big + D, n, 2 * D, Hq, Hkv, D, tiles, b.act, s);
      mark("gemm attn o_proj");
      lin.run(b.act, L, Hq * D, l.o, b.x, OutType::F32, H, true, "attention o_proj");
    }
    mark("rms_norm");
    rms_norm_1p(b.x, L, H, l.post_norm, eps, b.h, nullptr, s);
    const size_t mlp_weights = lin.position();
    for (int64_t t0 = 0; t0 < L; t0 += mlp_block) {
      const int64_t rows = std::min(mlp_block, L - t0);
      lin.replay_from(mlp_weights);
      mark("gemm mlp gate_up");
      // FP8: the GEMMs' scales are applied by the SwiGLU as it reads gate|up (same bits, one pass less)
      LinearRunner::Fp8Scales gsc;
      const bool fp8_fused = lin.run_fp8_unscaled(b.h + t0 * H, rows, H, l.gate_up, b.big, 2 * c.ffn, "mlp gate_up_proj", gsc);
      if (!fp8_fused) lin.run(b.h + t0 * H, rows, H, l.gate_up, b.big, OutType::BF16, 2 * c.ffn, false, "mlp gate_up_proj");
      mark("swiglu");
      if (fp8_fused) swiglu_fp8_scaled(b.big, rows, c.ffn, gsc.rs, gsc.cs_lo, gsc.cs_hi, gsc.split, b.act, s);
      else swiglu(b.big, rows, c.ffn, b.act, s);
      mark("gemm mlp down");
      lin.run(b.act, rows, c.ffn, l.down, b.x + t0 * H, OutType::F32, H, true, "mlp down_proj");
    }
  }
  mark("rms_norm");
  rms_norm_1p(b.x, L, H, m_.final_norm, eps, nullptr, b.hidden, s);
}

void Forward::head(Batch& b) {
  const DevHead& h = m_.head;
  const int64_t L = b.L, d = m_.hc.hidden, W = m_.hc.width, heads = m_.hc.heads, O = b.O, Q = b.Q, N = b.nseq;
  cudaStream_t s = stream_;
  Gemm& G = *gemm_;
  constexpr float eps = 1e-5f;
  // Linears over all L tokens (memory_projection and the memory keys / values): cuBLASLt's
  // batch-invariant fp32 GEMM. Over question / option / sequence rows (a handful a request):
  // head_gemm, whose per-row result does not depend on m either.
  auto lin_tokens = [&](const float* x, int64_t m, const DevLinear32& w, float* y, bool acc, const char* op) {
    if (!w.w) throw Error(Status::Internal, "internal_error", std::string(op) + ": token-row head matrix not held in fp32");
    G.run_f32(x, m, w.k, w.k, w.w, w.n, y, w.n, acc, op);
  };
  auto lin = [&](const float* x, int64_t m, const DevLinear32& w, float* y, bool acc, const char*) {
    if (w.wh) head_gemm(x, w.k, m, w.k, w.wh, w.n, y, w.n, acc, s);
    else if (w.w) head_gemm(x, w.k, m, w.k, w.w, w.n, y, w.n, acc, s);
    else throw Error(Status::Internal, "internal_error", "head matrix without weights");
  };

  mark("head inputs");
  // in place: nothing reads the final hidden states after their layer norm
  layer_norm(b.hidden, L, d, d, h.hidden_norm.w, h.hidden_norm.b, eps, nullptr, b.Hn, s);
  lin_tokens(b.Hn, L, h.memory_proj, b.M, false, "head memory_projection");
  span_mean(b.Hn, d, nullptr, nullptr, b.d(b.off_qbeg), b.d(b.off_qend), Q, d, b.qm, nullptr, s);
  span_mean(b.Hn, d, nullptr, nullptr, b.d(b.off_obeg), b.d(b.off_oend), O, d, b.cm, nullptr, s);
  span_mean(nullptr, 0, m_.lm_head, b.d(b.off_ids), b.d(b.off_obeg), b.d(b.off_oend), O, d, b.lm, nullptr, s);
  gather_rows(b.Hn, d, b.d(b.off_last), N, b.glast, nullptr, s);
  gather_rows(b.qm, d, b.d(b.off_qof), O, b.qo, nullptr, s);
  lin(b.cm, O, h.option_context_proj, b.R, false, "head option_context_projection");
  lin(b.lm, O, h.option_lexical_proj, b.R, true, "head option_lexical_projection");
  lin(b.qo, O, h.option_question_proj, b.R, true, "head option_question_projection");

  // q rows of an MHA's packed in_proj: [W, W] at row 0; k|v rows: [2W, W] at row W
  auto q_part = [&](const DevMha& m) { return DevLinear32{m.in.w, nullptr, W, W}; };
  auto kv_part = [&](const DevMha& m) { return DevLinear32{m.in.w + W * W, nullptr, 2 * W, W}; };
  // y += MHA(q rows xq [nq], keys/values KV [.., 2W]) with per-row key ranges
  auto cross = [&](const DevMha& m, const float* xq, int64_t nq, const int32_t* kb, const int32_t* ke, float* y) {
    lin(xq, nq, q_part(m), b.tmpq, false, "head mha q");
    bias_act(b.tmpq, nq, W, W, m.in_b, false, s);
    mha_attend(b.tmpq, W, nq, b.KV, 2 * W, b.KV + W, 2 * W, kb, ke, W, heads, b.att, s);
    lin(b.att, nq, m.out, y, true, "head mha out_proj");
    bias_act(y, nq, W, W, m.out_b, false, s);
  };
  auto memory_kv = [&](const DevMha& m, const float* mem) {
    lin_tokens(mem, L, kv_part(m), b.KV, false, "head mha kv");
    bias_act(b.KV, L, 2 * W, 2 * W, m.in_b + W, false, s);
  };
  auto ffn = [&](const DevLinear32& w1, const float* b1, const DevLinear32& w2, const float* b2, const float* x, int64_t rows, float* y) {
    lin(x, rows, w1, b.ff, false, "head feedforward 1");
    bias_act(b.ff, rows, w1.n, w1.n, b1, true, s);
    lin(b.ff, rows, w2, y, true, "head feedforward 2");
    bias_act(y, rows, W, W, b2, false, s);
  };

  mark("head evidence layers");
  for (const auto& ev : h.evidence) {
    layer_norm(b.M, L, W, W, ev.memory_norm.w, ev.memory_norm.b, eps, nullptr, b.mem, s);
    memory_kv(ev.attn, b.mem);
    layer_norm(b.R, O, W, W, ev.query_norm.w, ev.query_norm.b, eps, nullptr, b.nrm, s);
    cross(ev.attn, b.nrm, O, b.d(b.off_otok_b), b.d(b.off_otok_e), b.R);
    layer_norm(b.R, O, W, W, ev.ff_norm.w, ev.ff_norm.b, eps, nullptr, b.nrm, s);
    ffn(ev.ff0, ev.ff0_b, ev.ff3, ev.ff3_b, b.nrm, O, b.R);
  }
  mark("head fields + decoder");
  lin(b.qm, Q, h.question_proj, b.B, false, "head question_projection");
  option_summary(b.R, b.B, b.d(b.off_optbeg), Q, W, b.summary, s);
  layer_norm(b.summary, Q, W, W, h.option_summary_norm.w, h.option_summary_norm.b, eps, nullptr, b.F, s);
  lin(b.qm, Q, h.question_proj, b.F, true, "head question_projection");
  lin(b.glast, N, h.global_proj, b.gp, false, "head global_projection");
  field_init(b.F, b.gp, h.type_emb, b.d(b.off_type), b.d(b.off_qreq), Q, W, s);
  for (const auto& dl : h.layers) {
    // self-attention among the questions of the same request
    layer_norm(b.F, Q, W, W, dl.norm1.w, dl.norm1.b, eps, nullptr, b.nrm, s);
    lin(b.nrm, Q, dl.self_attn.in, b.tmpq, false, "head self_attn in_proj");
    bias_act(b.tmpq, Q, 3 * W, 3 * W, dl.self_attn.in_b, false, s);
    mha_attend(b.tmpq, 3 * W, Q, b.tmpq + W, 3 * W, b.tmpq + 2 * W, 3 * W, b.d(b.off_qq_b), b.d(b.off_qq_e), W, heads, b.att, s);
    lin(b.att, Q, dl.self_attn.out, b.F, true, "head self_attn out_proj");
    bias_act(b.F, Q, W, W, dl.self_attn.out_b, false, s);
    // cross-attention to the request's memory
    memory_kv(dl.cross_attn, b.M);
    layer_norm(b.F, Q, W, W, dl.norm2.w, dl.norm2.b, eps, nullptr, b.nrm, s);
    cross(dl.cross_attn, b.nrm, Q, b.d(b.off_qtok_b), b.d(b.off_qtok_e), b.F);
    layer_norm(b.F, Q, W, W, dl.norm3.w, dl.norm3.b, eps, nullptr, b.nrm, s);
    ffn(dl.lin1, dl.lin1_b, dl.lin2, dl.lin2_b, b.nrm, Q, b.F);
  }
  mark("head scorer");
  layer_norm(b.F, Q, W, W, h.field_norm.w, h.field_norm.b, eps, nullptr, b.Fn, s);
  layer_norm(b.R, O, W, W, h.option_norm.w, h.option_norm.b, eps, nullptr, b.On, s);
  scorer_features(b.Fn, b.On, b.d(b.off_qof), O, W, b.feat, s);
  const int64_t sh = h.scorer0.n;
  lin(b.feat, O, h.scorer0, b.ff, false, "head residual_scorer.0");
  bias_act(b.ff, O, sh, sh, h.scorer0_b, true, s);
  head_logits(b.lm, b.qm, b.glast, b.d(b.off_qof), b.d(b.off_oreq), O, d, b.Fn, b.On, W, b.ff, h.scorer3_w, sh, h.scalars, b.logits, s);
  question_softmax(b.logits, b.d(b.off_optbeg), Q, s);
}

}  // namespace clefrt::cuda

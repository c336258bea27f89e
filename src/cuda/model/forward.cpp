#include "cuda/model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>

#include "common/error.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/graph_cache.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/model/vision_tower.h"
#include "model/forward.h"

namespace clefrt::cuda {

using model::LayerType;

namespace {
constexpr int64_t kChunk = 64, kTile = 64;

// A buffer holding rows [r0, ...) of a row-major [tokens, ld] array, as a pointer that kernels
// indexing by global token can use (row t at ptr + t * ld). Computed on the address as an
// integer: the pointer may lie before the buffer, which only rows >= r0 are ever read through.
template <class T>
T* rows_before(T* p, int64_t r0, int64_t ld) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) - uintptr_t(r0) * uintptr_t(ld) * sizeof(T));
}

// A prefix state's copy into the batch's rows: through the graph cache when there is one (a
// capture notes its node, which a replay points at the next batch's cache entry)
void prefix_copy(GraphCache* graphs, const GraphCache::Copy& c, cudaStream_t s) {
  if (graphs) graphs->copy(c, s);
  else check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, s), "prefix state copy");
}

// Whether a kernel reading row scales `in` [rows] may write `out` [rows] as it goes: the same rows
// (each read before its own write) or none shared
bool scales_may_share(const float* in, const float* out, int64_t rows) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(in), b = reinterpret_cast<uintptr_t>(out), n = uintptr_t(rows) * sizeof(float);
  return !in || a == b || a + n <= b || b + n <= a;
}
}

// Everything one forward needs: the host-side index arrays and the device buffers carved from
// the arena. carve() is also run on a counting arena to plan the memory.
struct Forward::Batch {
  int64_t L = 0, nseq = 0, O = 0, Q = 0, nchunks = 0, ntiles = 0;
  // images: their patches (the tower's input), where their rows go, and the mRoPE rows
  int64_t VS = 0;
  struct Image {
    int64_t row = 0, count = 0;  // the pad tokens' rows in the batch
    const model::ImagePatches* patches = nullptr;
  };
  // The prefix cache. pfx: some sequence continues a cached prefix, so keys / values and the
  // head's memory rows live in rows of their own, Lm of them (each sequence's cached rows, then
  // its rows of this batch); otherwise Lm = L and they share the tokens' rows. Per sequence:
  struct Prefix {
    int64_t from = 0;                     // cached tokens it continues after (0: none)
    int64_t mrow = 0;                     // its first key / memory row
    int64_t row = 0;                      // its first token row in this batch
    const DevPrefixState* in = nullptr;   // what it continues
    DevPrefixState* out = nullptr;        // where its state after `at` tokens goes (null: nowhere)
    int64_t at = 0;
    int64_t out_from = 0;                 // the rows out holds already (out == in: a step)
    PrefixLayout lin, lout;               // in's and out's layouts (of their capacities)
  };
  std::vector<Prefix> pre;
  bool pfx = false, snaps = false;
  // pfx: the copies of the continued states into this batch's rows, in the order the forward
  // issues them: per attention layer (i-th: [i * pin_layer, (i + 1) * pin_layer)) each continuing
  // sequence's keys then values, then each one's memory rows (prefix_in_copies)
  std::vector<GraphCache::Copy> pin;
  size_t pin_layer = 0;
  int64_t Lm = 0;
  size_t off_kv_row = 0, off_seq_of = 0, off_snap_chunk = 0, off_tile_delta = 0;
  // cuDNN's attention: its ragged arrays (cudnn_attention.h) for ragged_b sequences (the plan's
  // bound), the longest sequence's keys
  size_t off_ragged = 0;
  int64_t ragged_b = 0, max_kv = 0;
  // device pointers per sequence: GDN state in, conv history in, GDN state out
  std::vector<const void*> ptrs;
  const void** dptrs = nullptr;
  bf16* vv = nullptr;  // pfx or blocked: the attention layer's values in the keys' rows (k has Lm rows then)
  std::vector<Image> images;
  VisionScratch vs{};
  float* vout = nullptr;  // a group of images' rows out of the tower, before they go into x
  bool mrope = false;
  size_t off_mrope = 0;
  // host index arrays, uploaded in one copy
  std::vector<int32_t> meta;
  size_t off_ids, off_seq_start, off_chunk_start, off_chunk_len, off_seq_chunk, off_tile_q0, off_tile_seq0, off_tile_end;
  size_t off_qbeg, off_qend, off_obeg, off_oend, off_last, off_qof, off_oreq, off_optbeg, off_type, off_qreq, off_otok_b, off_otok_e,
      off_qtok_b, off_qtok_e, off_qq_b, off_qq_e;
  int32_t* dmeta = nullptr;
  const int32_t* d(size_t off) const { return dmeta + off; }

  // backbone: the residual stream, which the final norm turns into the hidden states in place
  float *x, *hidden;
  // each phase's input norm of the rows it runs at a time (a GDN pass and the K - 1 before it,
  // an attention block, an MLP block)
  bf16 *h_gdn, *h_attn, *h_mlp;
  // GDN passes: the conv's K - 1 history rows of the next pass, normed before this pass's
  // out_proj changed them in x
  bf16* h_hist = nullptr;
  // GDN layer, per pass of gdn_pass chunks (64 tokens at most each): the in_proj output of the pass's
  // tokens and the K - 1 before them (fp32: its conv output is L2-normalised per head, which turns
  // small absolute rounding errors into large ones), conv output, gates, chunk scratch, output
  float *gtmp, *mixed, *g, *beta, *gdn_o;
  bf16* gact;
  GdnScratch gs{};
  int64_t gdn_pass = 0;
  float* gdn_state[2] = {nullptr, nullptr};  // a sequence's state between passes [Hv, Dk, Dv]
  // attention layer, per block of at most AB tokens: qkv output; for all tokens: normed q, k
  // (gates and values of their own when blocked: `gate` null then reads them from abig),
  // attention output
  bf16 *abig, *q, *k, *aact, *gate = nullptr;
  int64_t AB = 0;
  // MLP, per block of at most MB tokens: gate|up output, SwiGLU output
  bf16 *mbig, *mact;
  int64_t MB = 0;
  int64_t OB = 0;  // the head's option rows at a time (its per-option scratch holds a block of them)
  // each phase's quantized Linear inputs (W4A4 / FP8 / native FP4)
  QuantScratch qs_gdn{}, qs_attn{}, qs_mlp{};
  // head
  float *Hn, *M, *mem, *KV, *qm, *cm, *lm, *glast, *qp, *R, *B, *summary, *F, *Fn, *On, *tmpq, *att, *nrm, *ff, *feat, *gp, *logits;

  // A phase's quantization scratch for Linears of up to `rows` rows and inputs up to kmax wide;
  // `own_xs`: the FP8 row scales are `xs`, carved elsewhere (else carved here; a counting arena's
  // carves are null, hence the flag).
  static QuantScratch carve_qs(Arena& a, const DevModel& m, int64_t rows, int64_t kmax, bool own_xs = false, float* xs = nullptr) {
    QuantScratch q{};
    const int64_t k = std::min(m.max_k, (kmax + 15) / 16 * 16);
    if (m.has_w4a4) q.xq16 = a.carve<bf16>(rows * k, "W4A4 activations");
    if (m.has_native_fp4) {
      q.xq4 = a.carve<uint8_t>(rows * k / 2, "FP4 activations");
      q.xsc = a.carve<uint8_t>(size_t(nvfp4_swizzled_bytes(rows, k)), "FP4 activation scales");
    }
    if (m.has_fp8) {
      q.xq8 = a.carve<uint8_t>(rows * k, "FP8 activations");
      q.xs = own_xs ? xs : a.carve<float>(rows, "FP8 activation scales");
      q.acc = a.carve<float>(rows * LinearRunner::fp8_scratch_cols(m), "FP8 GEMM out");
    }
    return q;
  }

  void carve(Arena& a, const DevModel& m, const ForwardOptions& o) {
    const auto& c = m.c;
    const auto& hc = m.hc;
    const int64_t H = c.hidden, key_dim = c.k_heads * c.k_head_dim, value_dim = c.v_heads * c.v_head_dim;
    const int64_t conv_dim = 2 * key_dim + value_dim, hist = c.conv_kernel - 1;
    const int64_t n_gdn = conv_dim + value_dim + 2 * c.v_heads;
    const int64_t n_qkv = c.q_heads * 2 * c.head_dim + 2 * c.kv_heads * c.head_dim, attn_dim = c.q_heads * c.head_dim;
    MB = o.mlp_block_tokens > 0 ? std::min(L, o.mlp_block_tokens) : L;
    AB = o.attn_block_tokens > 0 ? std::min(L, o.attn_block_tokens) : L;
    gdn_pass = o.gdn_pass_chunks > 0 ? std::min(nchunks, o.gdn_pass_chunks) : nchunks;
    const int64_t Tb = std::min(L, kChunk * gdn_pass);  // a pass's tokens: chunks hold at most 64
    const int64_t d = hc.hidden, W = hc.width, sh = W * 4;  // scorer hidden <= 4W is checked at load
    OB = o.head_option_block > 0 ? std::min(O, o.head_option_block) : O;
    dmeta = a.carve<int32_t>(meta_capacity(), "batch index arrays");
    dptrs = a.carve<const void*>(size_t(3 * nseq), "prefix state pointers");
    x = hidden = a.carve<float>(L * H, "residual, then hidden");
    // The backbone's scratch and the head's share one region: the head reads only `hidden` (and
    // the index arrays), and the backbone is done with its scratch once the final norm has
    // written `hidden`. (About a third of the arena at 4,096 tokens on the 27B shapes.)
    const size_t shared_from = a.used();
    // GDN layers, attention blocks and MLP blocks run one after another and share one region;
    // within each, buffers live at the same time are carved apart. (Planned for 4,096 tokens on
    // the 27B shapes this was 1.27 GiB with every buffer separate and full length.)
    const size_t phase_from = a.used();
    // GDN: the state between passes first (it outlives each pass); the quantized in_proj /
    // out_proj inputs share the space of the conv output, gates and chunk scratch, which are
    // dead at both of those GEMMs, all but the FP8 row scales: the in_proj's are read after
    // it (its readers apply them: run_fp8_first_unscaled)
    if (gdn_pass < nchunks) {
      for (float*& st : gdn_state) st = a.carve<float>(c.v_heads * c.k_head_dim * c.v_head_dim, "gdn state between passes");
      h_hist = a.carve<bf16>(std::max<int64_t>(hist, 1) * H, "gdn normed history rows between passes");
    }
    h_gdn = a.carve<bf16>((Tb + hist) * H, "gdn normed");
    gtmp = a.carve<float>((Tb + hist) * n_gdn, "gdn in_proj out");
    gdn_o = a.carve<float>(Tb * value_dim, "gdn out");
    gact = a.carve<bf16>(Tb * value_dim, "gdn gated norm out");
    float* gdn_xs = m.has_fp8 ? a.carve<float>(Tb + hist, "gdn FP8 row scales") : nullptr;
    const size_t gdn_shared = a.used();
    g = a.carve<float>(Tb * c.v_heads, "gdn g");
    beta = a.carve<float>(Tb * c.v_heads, "gdn beta");
    mixed = a.carve<float>(Tb * conv_dim, "gdn conv out");
    gs.w = a.carve<float>(gdn_pass * c.v_heads * kChunk * c.k_head_dim, "gdn W");
    gs.u = a.carve<float>(gdn_pass * c.v_heads * kChunk * c.v_head_dim, "gdn U");
    gs.aqk = a.carve<float>(gdn_pass * c.v_heads * kChunk * kChunk, "gdn A");
    if (!o.portable_kernels && gdn_wgmma_default() && gdn_wgmma_built(c.k_head_dim, c.v_head_dim)) {
      // the Wgmma path's operands: W's and A's planes take the bytes of fp32 W and A (the prep
      // writes one form or the other), Q's and K's their own
      const GdnPlaneBytes pb = gdn_plane_bytes(c.k_heads, c.v_heads);
      if (pb.w != c.v_heads * kChunk * c.k_head_dim * 4 || pb.a != c.v_heads * kChunk * kChunk * 4)
        throw Error(Status::Internal, "internal_error", "gdn planes: W / A planes and fp32 sizes differ");
      gs.wp = reinterpret_cast<uint8_t*>(gs.w);
      gs.ap = reinterpret_cast<uint8_t*>(gs.aqk);
      gs.qp = a.carve<uint8_t>(size_t(gdn_pass * pb.q), "gdn Q planes");
      gs.kp = a.carve<uint8_t>(size_t(gdn_pass * pb.k), "gdn K planes");
      gs.ready = a.carve<int>(gdn_pass * c.v_heads, "gdn prep flags");  // the T form's overlap (gdn_wgmma_overlap)
    }
    size_t phase_end = a.used();
    a.rewind(gdn_shared);
    qs_gdn = carve_qs(a, m, Tb + hist, std::max(H, value_dim), m.has_fp8, gdn_xs);
    phase_end = std::max(phase_end, a.used());
    // attention block
    a.rewind(phase_from);
    h_attn = a.carve<bf16>(AB * H, "attn normed");
    abig = a.carve<bf16>(AB * n_qkv, "attn qkv");
    q = a.carve<bf16>(L * attn_dim, "attn q");
    if (AB < L) gate = a.carve<bf16>(L * attn_dim, "attn gates");
    // a batch continuing cached prefixes keeps keys and values in rows of their own, Lm of them
    // (values also when the qkv output is blocked)
    k = a.carve<bf16>((pfx ? Lm : L) * c.kv_heads * c.head_dim, "attn k");
    if (pfx || AB < L) vv = a.carve<bf16>((pfx ? Lm : L) * c.kv_heads * c.head_dim, "attn values in the keys' rows");
    // flash attention writes each (query tile, head)'s output over the queries it loaded first
    aact = q;
    qs_attn = carve_qs(a, m, L, std::max(H, attn_dim));
    phase_end = std::max(phase_end, a.used());
    // MLP block: its quantization scratch first, below the GDN and attention phases' FP8 GEMM
    // outputs (acc), which an FP8 out_proj / o_proj leaves pending for this phase's norm to add
    // (ForwardOptions::fp8_residual_in_norm; Forward's take_add still checks the ranges)
    a.rewind(phase_from);
    qs_mlp = carve_qs(a, m, MB, std::max(H, c.ffn));
    h_mlp = a.carve<bf16>(MB * H, "mlp normed");
    mbig = a.carve<bf16>(MB * 2 * c.ffn, "mlp gate|up");
    mact = a.carve<bf16>(MB * c.ffn, "mlp act");
    phase_end = std::max(phase_end, a.used());
    const size_t backbone_end = phase_end;
    a.rewind(shared_from);
    Hn = hidden;  // the head's layer norm runs in place (d == H: the head reads the backbone's width)
    M = a.carve<float>(Lm * W, "head memory");
    mem = a.carve<float>(Lm * W, "head memory norm");
    KV = a.carve<float>(Lm * 2 * W, "head kv");
    qm = a.carve<float>(Q * d, "qm");
    lm = a.carve<float>(OB * d, "lm");
    glast = a.carve<float>(nseq * d, "g");
    qp = a.carve<float>(Q * W, "option_question_projection of the question rows");
    const int64_t rows = std::max(OB, Q);
    R = a.carve<float>(O * W, "R");
    B = a.carve<float>(Q * W, "B");
    summary = a.carve<float>(Q * W, "summary");
    F = a.carve<float>(Q * W, "F");
    Fn = a.carve<float>(Q * W, "Fn");
    On = a.carve<float>(O * W, "On");
    gp = a.carve<float>(nseq * W, "gp");
    logits = a.carve<float>(O, "logits");
    // the option span means (cm) are read once, into R, before the evidence layers first use
    // these buffers: they share their space
    const size_t late_from = a.used();
    tmpq = a.carve<float>(rows * 3 * W, "head q");
    att = a.carve<float>(rows * W, "head att");
    nrm = a.carve<float>(rows * W, "head norm");
    ff = a.carve<float>(rows * std::max(hc.ffn, sh), "head ff");
    feat = a.carve<float>(OB * 4 * W, "scorer features");
    const size_t late_end = a.used();
    a.rewind(late_from);
    cm = a.carve<float>(OB * d, "cm");
    a.rewind(std::max(a.used(), late_end));
    a.rewind(std::max(a.used(), backbone_end));
    // the tower runs after the embeddings, before the first layer: its scratch shares the
    // backbone's region, and a group's rows go from vout into x, or an image's straight into x
    // (out_hidden == hidden, checked at load)
    if (VS > 0) {
      const size_t end = a.used();
      a.rewind(shared_from);
      vs = VisionScratch::carve(a, m.vision.c, VS);
      const int64_t m2 = m.vision.c.spatial_merge * m.vision.c.spatial_merge;
      if (o.vision_groups) vout = a.carve<float>((VS + m2 - 1) / m2 * H, "vision rows out");
      a.rewind(std::max(a.used(), end));
    }
  }
  size_t meta_capacity() const {
    return size_t(L * 7 + 3 * nchunks + 2 * nseq + 1 + 4 * ntiles + 10 * Q + 8 * O + nseq + 64) + ragged_ints(cudnn_bound(nseq, 1));
  }
};

Forward::Forward(const DevModel& m, ForwardOptions o) : m_(m), o_(o) {
  if (!flash_attention_supports(m.c.head_dim))
    throw load_error("config.json", "head_dim " + std::to_string(m.c.head_dim) + " is not supported by the CUDA attention kernel");
  if (m.c.k_head_dim > 128 || m.c.v_head_dim > 256)
    throw load_error("config.json", "GDN head dims (k " + std::to_string(m.c.k_head_dim) + ", v " + std::to_string(m.c.v_head_dim) +
                                        ") are not supported by the CUDA GDN kernels (k <= 128, v <= 256)");
  if (m.has_vision && m.vision.c.out_hidden != m.c.hidden)
    throw load_error("config.json", "vision_config out_hidden_size " + std::to_string(m.vision.c.out_hidden) + " differs from the text hidden size " +
                                        std::to_string(m.c.hidden));
  if (m.head.scorer0.n > 4 * m.hc.width)
    throw load_error("joint_head.safetensors", "residual_scorer hidden size above 4 x width is not supported by the CUDA head");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  // CLEFRT_LAB_FP8_FAST_ACCUM=1: the FP8 GEMMs without fp32 promotion of their partial sums (other
  // answers: a lab A/B of what the promotion costs in the model, never the product's)
  GemmLab gemm_lab;
  gemm_lab.fp8_fast_accum = env_count("CLEFRT_LAB_FP8_FAST_ACCUM", 0, 0, 1) == 1;
  // CLEFRT_LAB_FP8_OWN_GEMM=1..4: the FP8 GEMMs on the GEMM of our own (fp8_gemm_wgmma.cuh; 1: a
  // CTA a 128 x 128 tile, 2: warp-specialized and persistent, 3: 2 in clusters of 2, 4: 128 x 192
  // tiles; kernels_quant.h)
  // instead of cuBLASLt's: batch-invariant, the same answers so far; a lab A/B until it is faster in
  // the model (at the power cap it was not: bench/results/2026-12-06-h100-session38.md)
  gemm_lab.fp8_own = int(env_count("CLEFRT_LAB_FP8_OWN_GEMM", 0, 0, 4));
  if (gemm_lab.fp8_own != 0 && !fp8_gemm_own_available())
    throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_FP8_OWN_GEMM needs an sm_90a build on a compute capability 9.0 GPU");
  gemm_ = std::make_unique<Gemm>(stream_, o.batch_invariant, gemm_workspace_bytes(), gemm_lab);
  lin_ = std::make_unique<LinearRunner>(m, *gemm_, stream_, LinearRunner::kStageBytes,
                                        o.w4a16_fused ? W4A16Kernel::Fused : W4A16Kernel::Staged,
                                        o.portable_kernels ? W4A16Gemm::MmaSync : W4A16Gemm::Auto);
  if (o.gdn_pass_chunks < 0) throw Error(Status::Internal, "internal_error", "gdn_pass_chunks < 0");
  residual_in_norm_ = m.has_fp8 && env_count("CLEFRT_LAB_FP8_RESIDUAL_IN_NORM", o.fp8_residual_in_norm ? 1 : 0, 0, 1) == 1;
  gated_norm_quantizes_ = m.has_fp8 && env_count("CLEFRT_LAB_GATED_NORM_FP8", o.fp8_gated_norm_quantizes ? 1 : 0, 0, 1) == 1;
  gate_quantizes_ = m.has_fp8 && env_count("CLEFRT_LAB_OUTPUT_GATE_FP8", o.fp8_output_gate_quantizes ? 1 : 0, 0, 1) == 1;
  gdn_path_ = gdn_path(GdnPath::Auto, m.c.k_head_dim, m.c.v_head_dim);
  if (o.portable_kernels && gdn_path_ == GdnPath::Wgmma) gdn_path_ = GdnPath::TensorCores;
  // CLEFRT_GDN_PRODUCTS read at load: a bad value fails here, not in a forward
  if (gdn_path_ == GdnPath::Wgmma) (void)gdn_wgmma_one_pass_bf16(), (void)gdn_wgmma_scan_regs(), (void)gdn_wgmma_overlap();
  // CLEFRT_LAB_GDN_MIXED_FP32=1: the conv's rows in fp32 for the one-pass Wgmma prep too (the
  // earlier form, for the lab's A/B; other answers in the last bits)
  gdn_mixed16_ = env_count("CLEFRT_LAB_GDN_MIXED_FP32", 0, 0, 1) == 0;
  if (o.cudnn_attention) {
    std::string why;
    if (!cudnn_available(&why)) throw load_error("--attention cudnn", why);
    cudnn_ = std::make_unique<CudnnAttention>(m.c.q_heads, m.c.kv_heads, m.c.head_dim);
    if (m.has_vision) {  // the tower's frames too
      try {
        cudnn_frames_ = tower_attention(m.vision.c);
      } catch (const Error& e) {  // a tower shape cuDNN does not run: clefrt's kernel, and the kernel line says why
        tower_note_ = "; the vision tower on clefrt's (cuDNN: " + std::string(e.what()) + ")";
      }
    }
  }
  if (o.graph_after != 0) graphs_ = std::make_unique<GraphCache>(o.graph_after);  // which refuses under 2
  for (const DevLayer& l : m.layers) n_attn_ += l.type == LayerType::LinearAttention ? 0 : 1;
  arena_.reserve(plan_bytes(m, o));
}

int64_t Forward::qkv_width() const { return 2 * m_.c.q_heads * m_.c.head_dim + 2 * m_.c.kv_heads * m_.c.head_dim; }

std::string Forward::attention_kernel() const {
  return cudnn_ ? cudnn_->describe() + tower_note_ : "clefrt flash (mma.sync, gate fused)";
}

std::string Forward::gdn_kernel() const {
  if (gdn_path_ == GdnPath::Wgmma) {
    if (!gdn_wgmma_one_pass_bf16()) return "wgmma bf16x3 (CLEFRT_GDN_PRODUCTS)";
    if (!gdn_wgmma_scan_regs()) return "wgmma bf16, the state in planes (CLEFRT_GDN_SCAN)";
    // the T form needs the conv's bf16 rows (GdnScratch::mixed16), which the one-pass prep reads
    if (!gdn_mixed16_ || !gdn_wgmma_t_form()) return "wgmma bf16, the state in registers";
    // the overlap runs where the scan takes one warpgroup a CTA (fewer sequence x value heads than SMs)
    return gdn_wgmma_overlap() ? "wgmma bf16, the state in registers, T form, prep beside the scan (" + std::to_string(gdn_wgmma_overlap()) +
                                     " CTAs an SM) at few sequences"
                               : "wgmma bf16, the state in registers, T form";
  }
  return gdn_path_ == GdnPath::TensorCores ? "mma.sync 3xTF32" : "CUDA cores";
}

size_t Forward::graphs_held() const { return graphs_ ? graphs_->held() : 0; }
size_t Forward::graph_replays() const { return graphs_ ? graphs_->replays() : 0; }

Forward::~Forward() {
  graphs_.reset();
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  gemm_.reset();
  cudnn_.reset();  // their handles have stream_ set: destroyed before the stream
  cudnn_frames_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

int64_t Forward::vision_plan(const DevModel& m, const ForwardOptions& o) {
  if (!m.has_vision) return 0;
  const int64_t all = m.vision.c.spatial_merge * m.vision.c.spatial_merge * o.max_tokens;
  return o.vision_patches > 0 ? std::min(all, o.vision_patches) : all;
}

size_t Forward::plan_bytes(const DevModel& m, const ForwardOptions& o) {
  Batch b;
  b.L = o.max_tokens;
  b.nseq = o.max_seqs;
  b.O = std::min(o.max_tokens, o.max_options);  // every option span covers at least one token
  b.Q = std::min(o.max_tokens, o.max_seqs * o.max_questions);
  b.nchunks = o.max_tokens / kChunk + o.max_seqs;
  b.ntiles = o.max_tokens / kTile + o.max_seqs;
  // every image token is one merge block of patches, and image tokens are batch tokens
  b.VS = vision_plan(m, o);
  b.Lm = b.L;
  b.pfx = true;  // the keys' own rows are planned: any batch may continue cached prefixes
  Arena a = Arena::counter();
  b.carve(a, m, o);
  return a.used() + (size_t(1) << 20);
}

size_t Forward::arena_bytes(const model::TextConfig& c, const model::HeadConfig& hc, const ForwardOptions& o, QuantMode q,
                            const model::VisionConfig* vc) {
  DevModel shapes;
  shapes.c = c;
  shapes.hc = hc;
  if (vc && vc->present) {
    shapes.has_vision = true;
    shapes.vision.c = *vc;
  }
  shapes.has_w4a4 = q == QuantMode::NVFP4;
  shapes.has_fp8 = q == QuantMode::FP8;
  shapes.max_k = std::max({c.hidden, c.ffn, c.v_heads * c.v_head_dim, c.q_heads * c.head_dim});
  return plan_bytes(shapes, o);
}

void Forward::mark(const char* op) {
  if (profile_ == ProfileDetail::Ops) record(op);
}

void Forward::stage(const char* op) {
  if (profile_ == ProfileDetail::Stages) record(op);
}

void Forward::mark_end() {
  if (profile_ != ProfileDetail::Off) record("end");
}

void Forward::record(const char* op) {
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
  if (marks_.empty()) return;
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

std::vector<std::vector<std::vector<double>>> Forward::head_only(const model::Batch& batch, const std::vector<float>& hidden) {
  return run_impl(batch, &hidden);
}

std::vector<std::vector<std::vector<double>>> Forward::run(const model::Batch& batch) { return run_impl(batch, nullptr); }

std::vector<std::vector<std::vector<double>>> Forward::run(const model::Batch& batch, const std::vector<SeqPrefix>& prefixes) {
  return run_impl(batch, nullptr, prefixes.empty() ? nullptr : &prefixes);
}

std::vector<std::vector<std::vector<double>>> Forward::run(const model::Batch& batch, const std::vector<SeqPrefix>& prefixes,
                                                           const LayerGroup& group) {
  if (group.first < 0 || group.first >= group.end || group.end > layers() || (group.end < layers() && !group.residual) ||
      (group.first > 0 && !group.residual))
    throw Error(Status::Internal, "internal_error", "Forward::run: a layer group outside the backbone, or without its residual");
  return run_impl(batch, nullptr, prefixes.empty() ? nullptr : &prefixes, &group);
}

PrefixLayout PrefixLayout::of(const DevModel& m, int64_t capacity) {
  const int64_t length = capacity;
  const auto& c = m.c;
  int64_t n_attn = 0, n_gdn = 0;
  for (const DevLayer& l : m.layers) (l.type == LayerType::LinearAttention ? n_gdn : n_attn) += 1;
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  PrefixLayout p;
  p.length = length;
  p.kv_width = c.kv_heads * c.head_dim;
  const int64_t conv_dim = 2 * c.k_heads * c.k_head_dim + c.v_heads * c.v_head_dim;
  p.gdn_state_floats = size_t(c.v_heads * c.k_head_dim * c.v_head_dim);
  p.gdn_block_floats = p.gdn_state_floats + size_t((c.conv_kernel - 1) * conv_dim);
  p.gdn_at = align(p.k_at(n_attn));
  p.memory_at = align(p.gdn_at + size_t(n_gdn) * p.gdn_block_floats * 4);
  p.bytes = p.memory_at + size_t(length * m.hc.width) * 4;
  return p;
}

std::vector<std::vector<std::vector<double>>> Forward::run_impl(const model::Batch& batch, const std::vector<float>* hidden,
                                                                const std::vector<SeqPrefix>* prefixes, const LayerGroup* group) {
  Batch b;
  prepare(b, batch, prefixes);
  if (b.L == 0) return {};
  bool whole = false;  // backbone and head enqueued together (run_graphed)
  if (hidden) {
    if (hidden->size() != size_t(b.L * m_.c.hidden)) throw Error(Status::Internal, "internal_error", "head_only: hidden has the wrong size");
    check(cudaMemcpyAsync(b.hidden, hidden->data(), hidden->size() * 4, cudaMemcpyHostToDevice, stream_), "upload hidden");
  } else if (!group && run_graphed(b, batch)) {
    whole = true;
  } else {
    backbone(b, group);
  }
  if (group && group->end < layers()) {  // the step goes on with the next group: nothing is whole yet
    mark_end();
    check(cudaStreamSynchronize(stream_), "forward (set CLEFRT_CUDA_SYNC=1 to find the failing kernel)");
    collect_profile();
    return std::vector<std::vector<std::vector<double>>>(batch.size());
  }
  if (!whole) head(b);
  mark_end();
  std::vector<float> probs(size_t(b.O));
  if (b.O) check(cudaMemcpyAsync(probs.data(), b.logits, probs.size() * 4, cudaMemcpyDeviceToHost, stream_), "download probabilities");
  check(cudaStreamSynchronize(stream_), "forward (set CLEFRT_CUDA_SYNC=1 to find the failing kernel)");
  for (const Batch::Prefix& pr : b.pre)
    if (pr.out) pr.out->length = pr.at;
  collect_profile();
  std::vector<std::vector<std::vector<double>>> out;
  size_t j = 0;
  for (const model::Sequence& e : batch) {
    std::vector<std::vector<double>> per;
    for (const auto& q : e.questions) {
      std::vector<double> p;
      for (size_t k = 0; k < q.options.size(); ++k) p.push_back(double(probs[j++]));
      per.push_back(std::move(p));
    }
    out.push_back(std::move(per));
  }
  return out;
}

std::vector<float> Forward::hidden_states(const model::Batch& batch) {
  Batch b;
  prepare(b, batch);
  if (b.L == 0) return {};
  backbone(b);
  mark_end();
  std::vector<float> h(size_t(b.L * m_.c.hidden));
  check(cudaMemcpyAsync(h.data(), b.hidden, h.size() * 4, cudaMemcpyDeviceToHost, stream_), "download hidden states");
  check(cudaStreamSynchronize(stream_), "forward (set CLEFRT_CUDA_SYNC=1 to find the failing kernel)");
  collect_profile();
  return h;
}

int64_t Forward::first_non_finite_layer(const model::Batch& batch) {
  const int64_t saved = o_.debug_layers, n = int64_t(m_.layers.size());
  auto bad_after = [&](int64_t layers) {
    o_.debug_layers = layers;
    for (float v : hidden_states(batch))
      if (!std::isfinite(v)) return true;
    return false;
  };
  try {
    int64_t at = -2;
    if (bad_after(n)) {
      if (bad_after(0)) {
        at = -1;
      } else {  // the fewest layers whose output is non-finite: bad_after(lo - 1) false, bad_after(hi) true
        int64_t lo = 1, hi = n;
        while (lo < hi) {
          const int64_t mid = (lo + hi) / 2;
          if (bad_after(mid)) hi = mid;
          else lo = mid + 1;
        }
        at = lo - 1;
      }
    }
    o_.debug_layers = saved;
    return at;
  } catch (...) {
    o_.debug_layers = saved;
    throw;
  }
}

// The batch's shape determines every launch of backbone + head when no sequence leaves prefix
// state and there are no images: the scalars in Batch (L, nseq, Q, O, chunks, tiles, the cuDNN
// bounds), the host-side chunk starts the GDN passes split at, and the arena's carve (the same
// addresses). A sequence continuing a cached prefix adds its length to the shape; its state's
// GDN blocks are read through device pointer tables (b.dptrs) and its keys, values and memory
// rows come by the copies in b.pin, whose addresses a replay sets. The index arrays' contents
// differ between batches of one shape; prepare() uploads them before the graph runs, and the
// kernels read them from there. True:
// backbone and head are enqueued (replayed, captured and launched, or run as always).
bool Forward::run_graphed(Batch& b, const model::Batch& batch) {
  if (!graphs_ || b.snaps || !b.images.empty() || profile_ != ProfileDetail::Off || sync_each_launch() || o_.debug_layers >= 0 ||
      lin_->stages(b.L))
    return false;
  // mrope: its rows shift the index arrays after them (with images or prefix state)
  std::vector<int64_t> key = {b.L, b.nseq, b.mrope, b.pfx};
  for (size_t i = 0; i < batch.size(); ++i) {
    const model::Sequence& e = batch[i];
    key.push_back(e.length);
    key.push_back(b.pre[i].from);
    key.push_back(int64_t(e.questions.size()));
    for (const auto& q : e.questions) key.push_back(int64_t(q.options.size()));
  }
  graphs_->run(
      key, stream_,
      [&] {
        backbone(b);
        head(b);
      },
      b.pin);
  return true;
}

void Forward::prepare(Batch& b, const model::Batch& batch, const std::vector<SeqPrefix>* prefixes) {
  b.nseq = int64_t(batch.size());
  if (prefixes && prefixes->size() != batch.size())
    throw Error(Status::Internal, "internal_error", "Forward::run: one SeqPrefix per sequence");
  // per sequence: the cached tokens it skips, and its rows (only the rest is computed)
  b.pre.assign(batch.size(), {});
  for (size_t i = 0; i < batch.size() && prefixes; ++i) {
    const SeqPrefix& p = (*prefixes)[i];
    const int64_t n = batch[i].length;
    Batch::Prefix& q = b.pre[i];
    auto fits = [&](const DevPrefixState& st, PrefixLayout& lay) {
      lay = PrefixLayout::of(m_, st.capacity);
      return st.length <= st.capacity && st.buf.bytes() >= lay.bytes;
    };
    if (p.from) {
      q.from = p.from->length;
      q.in = p.from;
      if (q.from <= 0 || q.from % kChunk != 0 || q.from >= n || !fits(*p.from, q.lin))
        throw Error(Status::Internal, "internal_error", "Forward::run: a cached prefix of " + std::to_string(q.from) + " tokens for a sequence of " +
                                                            std::to_string(n));
      b.pfx = true;
    }
    if (p.into) {
      q.at = p.at;
      if (q.at <= q.from || q.at % kChunk != 0 || q.at > n || q.at > p.into->capacity || !fits(*p.into, q.lout))
        throw Error(Status::Internal, "internal_error", "Forward::run: a prefix state to leave at " + std::to_string(q.at) + " tokens of " +
                                                            std::to_string(n));
      q.out = p.into;
      q.out_from = p.into == p.from ? q.from : 0;
      b.snaps = true;
    }
  }
  std::vector<int64_t> offs = {0};
  int64_t full = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const model::Sequence& e = batch[i];
    offs.push_back(offs.back() + e.length - b.pre[i].from);
    b.pre[i].mrow = b.pfx ? full : offs[i];
    b.pre[i].row = offs[i];
    full += e.length;
    b.Q += int64_t(e.questions.size());
    for (const auto& q : e.questions) b.O += int64_t(q.options.size());
  }
  b.L = offs.back();
  b.Lm = b.pfx ? full : b.L;
  if (full > o_.max_tokens)
    throw context_exceeded("the batch holds " + std::to_string(full) + " tokens; the GPU memory plan allows at most " +
                           std::to_string(o_.max_tokens) + " (this engine's maximum context length)");
  if (b.nseq > o_.max_seqs)
    throw Error(Status::Internal, "internal_error",
                "batch of " + std::to_string(b.nseq) + " requests exceeds the plan's " + std::to_string(o_.max_seqs));
  if (b.O > o_.max_options)  // the scheduler packs at most that many (a request has at most 64 x 255)
    throw Error(Status::Internal, "internal_error",
                "batch of " + std::to_string(b.O) + " options exceeds the plan's " + std::to_string(o_.max_options));
  for (const model::Sequence& e : batch)
    if (int64_t(e.questions.size()) > o_.max_questions)
      throw Error(Status::Unprocessable, "invalid_request",
                  "a request has " + std::to_string(e.questions.size()) + " questions; the GPU memory plan allows " +
                      std::to_string(o_.max_questions) + " per request",
                  "questions");
  if (b.L == 0) return;

  // ---- index arrays ----
  auto& v = b.meta;
  auto mark = [&](size_t& off) { off = v.size(); };
  mark(b.off_ids);
  for (size_t i = 0; i < batch.size(); ++i) v.insert(v.end(), batch[i].ids + b.pre[i].from, batch[i].ids + batch[i].length);
  for (int32_t id : v)
    if (id < 0 || id >= m_.c.vocab)
      throw Error(Status::Internal, "internal_error", "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                          std::to_string(m_.c.vocab) + " (tokenizer and model disagree)");
  mark(b.off_seq_start);
  for (int64_t s = 0; s < b.nseq; ++s)
    for (int64_t t = offs[s]; t < offs[s + 1]; ++t) v.push_back(int32_t(offs[s]));
  if (b.pfx) {  // each token's key / memory row and its sequence
    mark(b.off_kv_row);
    for (int64_t s = 0; s < b.nseq; ++s)
      for (int64_t t = offs[s]; t < offs[s + 1]; ++t) v.push_back(int32_t(b.pre[size_t(s)].mrow + b.pre[size_t(s)].from + (t - offs[s])));
    mark(b.off_seq_of);
    for (int64_t s = 0; s < b.nseq; ++s)
      for (int64_t t = offs[s]; t < offs[s + 1]; ++t) v.push_back(int32_t(s));
  }
  // images: the patches go through the tower; every sequence's positions become mRoPE rows
  // (those of an image inside a cached prefix are in its state: it does not run again)
  const int64_t m2 = m_.vision.c.spatial_merge * m_.vision.c.spatial_merge, plan = vision_plan(m_, o_);
  for (int64_t s = 0; s < b.nseq; ++s) {
    const model::SequenceMedia* md = batch[size_t(s)].media;
    if (!md) continue;
    b.mrope = true;
    const int64_t from = b.pre[size_t(s)].from;
    for (const model::SequenceMedia::Image& im : md->images) {
      if (!im.patches) throw Error(Status::Internal, "internal_error", "the GPU forward got an image without its patches");
      if (!m_.has_vision) throw Error(Status::Unprocessable, "unsupported", "this model has no vision tower (model.visual.*)", "images");
      const model::ImagePatches& p = *im.patches;
      if (p.grid_t * p.grid_h * p.grid_w != im.count * m2 || im.first < 0)
        throw Error(Status::Internal, "internal_error", "an image's patches do not fill its pad tokens");
      // a step's forward holds the images before its end; a cached prefix those before its start
      if (im.first >= batch[size_t(s)].length || im.first + im.count <= from) continue;
      if (im.first < from || im.first + im.count > batch[size_t(s)].length)
        throw Error(Status::Internal, "internal_error", "a cached prefix or a step ends inside an image");
      b.images.push_back({offs[s] + im.first - from, im.count, im.patches});
      b.VS += im.count * m2;
      if (im.count * m2 > plan)
        throw Error(Status::Unprocessable, "invalid_image",
                    "an image of " + std::to_string(im.count * m2) + " patches is over the GPU plan's " + std::to_string(plan), "images");
    }
  }
  b.VS = std::min(b.VS, plan);
  if (b.pfx) b.mrope = true;  // positions continue after the cached tokens
  if (b.mrope) {
    mark(b.off_mrope);
    v.resize(v.size() + size_t(3 * b.L));
    int32_t* pos = v.data() + b.off_mrope;
    for (int64_t s = 0; s < b.nseq; ++s) {
      const model::SequenceMedia* md = batch[size_t(s)].media;
      const int64_t from = b.pre[size_t(s)].from;
      for (int64_t t = 0; t < offs[s + 1] - offs[s]; ++t) {
        const int64_t r = offs[s] + t, at = from + t;
        pos[r] = int32_t(md ? md->pos_t[size_t(at)] : at);
        pos[b.L + r] = int32_t(md ? md->pos_h[size_t(at)] : at);
        pos[2 * b.L + r] = int32_t(md ? md->pos_w[size_t(at)] : at);
      }
    }
  }
  std::vector<int32_t> cs, cl, sc = {0}, tq, ts, te, td, snap;
  for (int64_t s = 0; s < b.nseq; ++s) {
    const Batch::Prefix& pr = b.pre[size_t(s)];
    for (int64_t t = offs[s]; t < offs[s + 1]; t += kChunk) {
      cs.push_back(int32_t(t));
      cl.push_back(int32_t(std::min(kChunk, offs[s + 1] - t)));
    }
    snap.push_back(pr.out ? int32_t(sc.back() + (pr.at - pr.from) / kChunk) : -1);  // == the next sequence's first: after the last
    sc.push_back(int32_t(cs.size()));
    // key rows: the sequence's own from mrow, its queries' at + delta
    const int64_t delta = pr.mrow + pr.from - offs[s];
    for (int64_t t = offs[s]; t < offs[s + 1]; t += kTile) {
      tq.push_back(int32_t(t));
      ts.push_back(int32_t(pr.mrow));
      te.push_back(int32_t(offs[s + 1] + delta));
      td.push_back(int32_t(delta));
    }
  }
  // longest causal rows first so the last wave is short
  std::vector<size_t> order(tq.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return tq[a] + td[a] - ts[a] > tq[c] + td[c] - ts[c]; });
  b.nchunks = int64_t(cs.size());
  b.ntiles = int64_t(tq.size());
  mark(b.off_chunk_start);
  v.insert(v.end(), cs.begin(), cs.end());
  mark(b.off_chunk_len);
  v.insert(v.end(), cl.begin(), cl.end());
  mark(b.off_seq_chunk);
  v.insert(v.end(), sc.begin(), sc.end());
  mark(b.off_snap_chunk);
  v.insert(v.end(), snap.begin(), snap.end());
  mark(b.off_tile_q0);
  for (size_t i : order) v.push_back(tq[i]);
  mark(b.off_tile_seq0);
  for (size_t i : order) v.push_back(ts[i]);
  mark(b.off_tile_end);
  for (size_t i : order) v.push_back(te[i]);
  mark(b.off_tile_delta);
  for (size_t i : order) v.push_back(td[i]);
  // head: spans as global token rows (the memory's as key / memory rows); options question by
  // question, questions request by request
  std::vector<int32_t> qb, qe, ob, oe, last, qof, oreq, optb = {0}, type, qreq, otb, ote, qtb, qte, qqb, qqe;
  int32_t qi = 0;
  for (int64_t s = 0; s < b.nseq; ++s) {
    const model::Sequence& e = batch[size_t(s)];
    const Batch::Prefix& pr = b.pre[size_t(s)];
    const int32_t base = int32_t(offs[s] - pr.from), qfirst = qi;
    const int32_t mb = int32_t(pr.mrow), me = int32_t(pr.mrow + e.length);
    auto row = [&](int64_t at) {
      if (at < pr.from) throw Error(Status::Internal, "internal_error", "a question or option span lies inside the cached prefix");
      return base + int32_t(at);
    };
    last.push_back(int32_t(offs[s + 1] - 1));
    for (const auto& q : e.questions) {
      qb.push_back(row(q.question.begin));
      qe.push_back(base + q.question.end);
      type.push_back(int32_t(q.type));
      qreq.push_back(int32_t(s));
      qtb.push_back(mb);
      qte.push_back(me);
      for (const Span& o : q.options) {
        ob.push_back(row(o.begin));
        oe.push_back(base + o.end);
        qof.push_back(qi);
        oreq.push_back(int32_t(s));
        otb.push_back(mb);
        ote.push_back(me);
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
  if (cudnn_) {  // after carve: the values' rows (ldv) depend on where they live
    const int64_t Hq = m_.c.q_heads, Hkv = m_.c.kv_heads, D = m_.c.head_dim, kvw = Hkv * D;
    std::vector<RaggedSeq> rs;
    b.max_kv = 0;
    for (int64_t s = 0; s < b.nseq; ++s) {
      const Batch::Prefix& pr = b.pre[size_t(s)];
      const int64_t qlen = offs[s + 1] - offs[s];
      rs.push_back({offs[s], qlen, pr.mrow, pr.from + qlen});
      b.max_kv = std::max(b.max_kv, pr.from + qlen);
    }
    b.ragged_b = cudnn_bound(b.nseq, 1);
    b.off_ragged = append_ragged(v, rs, b.ragged_b, Hq * D, kvw, b.vv ? kvw : qkv_width(), Hq * D);
  }
  if (b.pfx) {  // the continued states' copies (their order: Batch::pin)
    const int64_t kvw = m_.c.kv_heads * m_.c.head_dim, W = m_.hc.width;
    const size_t row_bytes = size_t(kvw) * 2;
    b.pin.clear();
    b.pin_layer = 2 * size_t(std::count_if(b.pre.begin(), b.pre.end(), [](const Batch::Prefix& pr) { return pr.in != nullptr; }));
    for (int64_t ai = 0; ai < n_attn_; ++ai)
      for (const Batch::Prefix& pr : b.pre) {
        if (!pr.in) continue;
        const uint8_t* st = pr.in->buf.as<uint8_t>();
        b.pin.push_back({b.k + pr.mrow * kvw, st + pr.lin.k_at(ai), size_t(pr.from) * row_bytes});
        b.pin.push_back({b.vv + pr.mrow * kvw, st + pr.lin.v_at(ai), size_t(pr.from) * row_bytes});
      }
    for (const Batch::Prefix& pr : b.pre)
      if (pr.in) b.pin.push_back({b.M + pr.mrow * W, pr.in->buf.as<uint8_t>() + pr.lin.memory_at, size_t(pr.from * W) * 4});
  }
  if (v.size() > b.meta_capacity()) throw Error(Status::Internal, "internal_error", "batch index arrays exceed their plan");
  check(cudaMemcpyAsync(b.dmeta, v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream_), "upload batch indices");
  if (b.pfx || b.snaps) {  // the states' GDN blocks: state in, conv history in, state out
    b.ptrs.assign(size_t(3 * b.nseq), nullptr);
    for (int64_t s = 0; s < b.nseq; ++s) {
      const Batch::Prefix& pr = b.pre[size_t(s)];
      if (pr.in) {
        const float* g = reinterpret_cast<const float*>(pr.in->buf.as<const uint8_t>() + pr.lin.gdn_at);
        b.ptrs[size_t(s)] = g;
        b.ptrs[size_t(b.nseq + s)] = g + pr.lin.gdn_state_floats;
      }
      if (pr.out)
        b.ptrs[size_t(2 * b.nseq + s)] = pr.out->buf.as<uint8_t>() + pr.lout.gdn_at;
    }
    check(cudaMemcpyAsync(b.dptrs, b.ptrs.data(), b.ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, stream_), "upload prefix state pointers");
  }
}

void Forward::backbone(Batch& b, const LayerGroup* group) {
  const auto& c = m_.c;
  const int64_t L = b.L, H = c.hidden;
  const float eps = float(c.rms_eps);
  const int64_t key_dim = c.k_heads * c.k_head_dim, value_dim = c.v_heads * c.v_head_dim, conv_dim = 2 * key_dim + value_dim;
  const int64_t Hq = c.q_heads, Hkv = c.kv_heads, D = c.head_dim;
  cudaStream_t s = stream_;
  const GdnChunks ch{b.d(b.off_chunk_start), b.d(b.off_chunk_len), b.d(b.off_seq_chunk), b.nchunks, b.nseq};
  const AttnTiles tiles{b.d(b.off_tile_q0), b.d(b.off_tile_seq0), b.d(b.off_tile_end), b.ntiles, b.pfx ? b.d(b.off_tile_delta) : nullptr};
  const int64_t kvw = Hkv * D;
  // the prefix cache: what sequences continue (copied in per layer) and leave (copied out)
  auto d2d = [&](void* to, const void* from, size_t bytes, const char* what) {
    if (bytes) check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, s), what);
  };
  int64_t attn_i = 0, gdn_i = 0;
  const PrefixLayout gdn = PrefixLayout::of(m_, 0);  // a GDN layer's block in a prefix state (any capacity)
  const size_t block = gdn.gdn_block_floats;
  MropePositions mrope;
  if (b.mrope) {
    mrope.pos = b.d(b.off_mrope);
    mrope.sec_h = int(c.mrope_limit(1));
    mrope.sec_w = int(c.mrope_limit(2));
  }

  const int64_t first = group ? group->first : 0, end = group ? group->end : layers();
  if (first > 0) d2d(b.x, group->residual, size_t(L * H) * 4, "a step's residual stream in");
  else {
    mark("embed");
    stage("embed");
  }
  if (first == 0) embed_gather(b.d(b.off_ids), L, m_.embed, H, b.x, s);
  if (first == 0 && !b.images.empty()) {
    // lab: the GPU held back this long first, so the tower's stage time is its kernels' alone
    static const int64_t lead_us = env_count("CLEFRT_LAB_TOWER_LEAD_US", 0, 0, 1000000);
    if (lead_us) gpu_wait_us(lead_us, s);
    stage("vision tower");
  }
  // the images through the tower in groups that fit its scratch, their rows in place of the
  // image pad embeddings
  const int64_t m2 = m_.vision.c.spatial_merge * m_.vision.c.spatial_merge;
  for (size_t i = 0; first == 0 && i < b.images.size();) {
    std::vector<const model::ImagePatches*> imgs;
    const size_t img0 = i;
    for (int64_t patches = 0; i < b.images.size() && patches + b.images[i].count * m2 <= b.vs.S && (b.vout || imgs.empty()); ++i) {
      imgs.push_back(b.images[i].patches);
      patches += b.images[i].count * m2;
    }
    if (!b.vout) {  // one image, straight into its rows
      vision_tower(m_.vision, *gemm_, imgs, b.vs, b.x + b.images[img0].row * H, s, [this](const char* op) { mark(op); },
                   cudnn_frames_.get());
      continue;
    }
    vision_tower(m_.vision, *gemm_, imgs, b.vs, b.vout, s, [this](const char* op) { mark(op); }, cudnn_frames_.get());
    for (size_t j = img0, rows = 0; j < i; rows += size_t(b.images[j++].count))
      d2d(b.x + b.images[j].row * H, b.vout + rows * H, size_t(b.images[j].count * H) * 4, "image rows into the embeddings");
  }
  stage("backbone");
  lin_->begin(b.qs_gdn, size_t(first), L);
  LinearRunner& lin = *lin_;
  // The same Linears over the tokens in blocks of `block` (attention projections, MLP): each block
  // replays the NVFP4 staging from its first Linear and norms its rows of x into `hn` first, or,
  // when `feeds` (the Linear the rows go to) is all FP8, straight into its FP8 input buffers
  // (rms_norm_1p_fp8: the codes quantizing hn would give); body(t0, rows, quantized).
  // A pending FP8 residual add (ForwardOptions::fp8_residual_in_norm: the scale pass of the last
  // down_proj, GDN out_proj or attention o_proj) for the norm over x's rows [t0, t0 + rows): taken
  // where it covers exactly the rows the add does and none of the norm's outputs (`outs`:
  // pointer, bytes) overlaps the add's buffers (a race between rows: the phases share arena
  // space); otherwise its pass runs now, as always.
  auto take_add = [&](int64_t t0, int64_t rows, std::initializer_list<std::pair<const void*, size_t>> outs) -> std::optional<ResidualFp8> {
    if (!lin.has_pending()) return std::nullopt;
    const LinearRunner::PendingResidual p = lin.pending();
    const auto overlaps = [](const void* a, size_t an, const void* c, size_t cn) {
      const auto pa = reinterpret_cast<uintptr_t>(a), pc = reinterpret_cast<uintptr_t>(c);
      return a && c && an && cn && pa < pc + cn && pc < pa + an;
    };
    bool ok = p.y == b.x + t0 * H && p.rows == rows && p.n == H && p.ldy == H && residual_fp8_fits(H, p.add);
    for (const auto& [o, bytes] : outs)
      ok = ok && !overlaps(o, bytes, p.add.t, size_t(p.rows * p.add.ldt) * 4) && !overlaps(o, bytes, p.add.rs, size_t(p.rows) * 4);
    if (!ok) {
      lin.flush_pending();
      return std::nullopt;
    }
    lin.take_pending();
    ++adds_taken_;
    return p.add;
  };
  // The (1+w) RMSNorm of x's rows [t0, t0 + rows): into the FP8 input buffers `fin` when given
  // (and bf16 rows into y16 as well when y16 is not null), else into y16; a pending residual add
  // taken first where take_add allows.
  auto norm_rows = [&](int64_t t0, int64_t rows, const float* w, bf16* y16, const LinearRunner::Fp8Input* fin) {
    const size_t y16_bytes = y16 ? size_t(rows * H) * 2 : 0;
    const std::optional<ResidualFp8> add =
        fin ? take_add(t0, rows, {{y16, y16_bytes}, {fin->q, size_t(rows * fin->kp)}, {fin->scale, size_t(rows) * 4}}) : take_add(t0, rows, {{y16, y16_bytes}});
    float* x = b.x + t0 * H;
    if (add && fin) rms_norm_1p_fp8_add(x, rows, H, *add, w, eps, y16, fin->q, fin->kp, fin->scale, s);
    else if (add) rms_norm_1p_add(x, rows, H, *add, w, eps, y16, s);
    else if (fin) rms_norm_1p_fp8(x, rows, H, w, eps, y16, fin->q, fin->kp, fin->scale, s);
    else rms_norm_1p(x, rows, H, w, eps, y16, nullptr, s);
  };
  auto in_blocks = [&](int64_t block, const float* norm_w, bf16* hn, const DevLinear& feeds,
                       const std::function<void(int64_t, int64_t, bool)>& body) {
    const size_t weights = lin.position();
    LinearRunner::Fp8Input fin;
    const bool quantized = lin.fp8_input(feeds, fin) && fin.k == H && rms_norm_1p_fp8_fits(H, fin.kp);
    for (int64_t t0 = 0; t0 < L; t0 += block) {
      const int64_t rows = std::min(block, L - t0);
      lin.replay_from(weights);
      mark("rms_norm");
      norm_rows(t0, rows, norm_w, quantized ? nullptr : hn, quantized ? &fin : nullptr);
      body(t0, rows, quantized);
    }
  };
  for (int64_t li = 0; li < end; ++li) {
    const DevLayer& l = m_.layers[size_t(li)];
    if (o_.debug_layers >= 0 && li >= o_.debug_layers) break;
    const int64_t ai = attn_i, gi = gdn_i;
    (l.type == LayerType::LinearAttention ? gdn_i : attn_i) += 1;
    if (li < first) continue;
    if (l.type == LayerType::LinearAttention) {
      // The whole GDN layer runs per pass of chunks, tokens [T0, T1): in_proj over those rows
      // and the conv's K - 1 rows of history before them (recomputed: a GEMM row does not depend
      // on the others), conv, gates, the chunked scan (its state carried between passes), gated
      // norm, out_proj into the residual. The same bits as one pass over everything.
      const int64_t n = l.gdn_in.n, hist = c.conv_kernel - 1;
      lin.use_scratch(b.qs_gdn);
      const size_t gdn_weights = lin.position();
      for (int64_t c0 = 0, pass = 0; c0 < b.nchunks; c0 += b.gdn_pass, ++pass) {
        const int64_t c1 = std::min(b.nchunks, c0 + b.gdn_pass);
        const int32_t* starts = b.meta.data() + b.off_chunk_start;  // the chunks' first tokens, host side
        const int64_t T0 = starts[c0], T1 = c1 < b.nchunks ? starts[c1] : L, rows = T1 - T0;
        const int64_t R0 = std::max<int64_t>(0, T0 - hist);
        lin.replay_from(gdn_weights);
        // the rows before the pass were normed by the pass before, from x as the layer began
        // (its out_proj has changed them since); the pass's own rows from x now
        const int64_t before = T0 - R0;
        if (before > 0) d2d(b.h_gdn, b.h_hist, size_t(before * H) * 2, "gdn normed history rows in");
        mark("rms_norm");
        // FP8: a pass without history rows (the first) also quantizes its rows for the in_proj's
        // FP8 part as the norm writes them (the codes its run would make; the bf16 rows still
        // feed its bf16 parts and the next pass's history)
        LinearRunner::Fp8Input gin;
        const bool gdn_quantized = before == 0 && lin.fp8_shared_input(l.gdn_in, gin) && gin.k == H && rms_norm_1p_fp8_fits(H, gin.kp);
        norm_rows(T0, rows, l.input_norm, b.h_gdn + before * H, gdn_quantized ? &gin : nullptr);  // gdn_quantized: before == 0
        if (c1 < b.nchunks) {  // the next pass's history rows, before out_proj writes x
          const int64_t h0 = std::max<int64_t>(0, T1 - hist);
          d2d(b.h_hist, b.h_gdn + (h0 - R0) * H, size_t((T1 - h0) * H) * 2, "gdn normed history rows out");
        }
        mark("gemm gdn in_proj");
        // FP8: the in_proj's scales are applied by its readers (the conv, the conv history out,
        // the gated norm's z) instead of a pass over its fp32 output: the same bits
        LinearRunner::Fp8Scales isc;
        const bool in_unscaled = gdn_conv_prep_fuses(c.conv_kernel, c.k_head_dim, conv_dim, n, rows, c.v_heads) &&
                                 lin.run_fp8_first_unscaled(b.h_gdn, T1 - R0, H, l.gdn_in, b.gtmp, n, conv_dim + value_dim, "gdn in_proj", isc,
                                                            gdn_quantized);
        if (!in_unscaled) lin.run(b.h_gdn, T1 - R0, H, l.gdn_in, b.gtmp, OutType::F32, n, false, "gdn in_proj");
        mark("gdn conv+prep");
        ConvHistory from;
        if (b.pfx) from = {b.d(b.off_seq_of), reinterpret_cast<const float* const*>(b.dptrs + b.nseq), int64_t(gi * block)};
        const float* own = b.gtmp + (T0 - R0) * n;  // the pass's own rows of the in_proj output
        const float* bcol = own + conv_dim + value_dim;
        // the one-pass Wgmma prep reads the conv's rows in bf16 (GdnScratch::mixed16): half the
        // bytes written here and read there; its operands are bf16 either way
        const bool mixed16 = gdn_mixed16_ && gdn_path_ == GdnPath::Wgmma && gdn_wgmma_one_pass_bf16() &&
                             gdn_conv_prep_fuses(c.conv_kernel, c.k_head_dim, conv_dim, n, rows, c.v_heads);
        gdn_conv_prep(b.gtmp, n, R0, b.d(b.off_seq_start), T0, rows, l.conv_w, c.conv_kernel, conv_dim, c.k_heads, c.k_head_dim, bcol,
                      bcol + c.v_heads, n, c.v_heads, l.neg_A, l.dt_bias, mixed16 ? nullptr : b.mixed, b.g, b.beta, s, from,
                      in_unscaled ? RowColScales{isc.rs, isc.cs_lo} : RowColScales{}, -1, mixed16 ? reinterpret_cast<bf16*>(b.mixed) : nullptr);
        // a state left at `at`: the conv's K - 1 in_proj rows before it, when this pass has them
        // (after the conv read the history: out may be the state it continues)
        for (const Batch::Prefix& pr : b.pre) {
          if (!pr.out) continue;
          const int64_t rb = pr.row + (pr.at - pr.from);  // the boundary's token row
          if (rb - 1 < T0 || rb - 1 >= T1) continue;
          float* to = reinterpret_cast<float*>(pr.out->buf.as<uint8_t>() + pr.lout.gdn_at) + gi * block + gdn.gdn_state_floats;
          if (in_unscaled)  // the rows as the scale pass would have left them
            scale_rows_cols_store(b.gtmp + (rb - hist - R0) * n, hist, conv_dim, n, isc.rs + (rb - hist - R0), isc.cs_lo, to, false, conv_dim, s);
          else
            check(cudaMemcpy2DAsync(to, size_t(conv_dim) * 4, b.gtmp + (rb - hist - R0) * n, size_t(n) * 4, size_t(conv_dim) * 4, size_t(hist),
                                    cudaMemcpyDeviceToDevice, s),
                  "prefix state: conv history out");
        }
        GdnScratch gp = b.gs;
        gp.c0 = c0;
        gp.c1 = c1;
        gp.state_in = b.gdn_state[pass % 2];
        gp.state_out = b.gdn_state[(pass + 1) % 2];
        if (b.pfx) gp.seq_state_in = reinterpret_cast<const float* const*>(b.dptrs);
        if (b.snaps) {
          gp.seq_state_out = reinterpret_cast<float* const*>(const_cast<void**>(b.dptrs + 2 * b.nseq));
          gp.snap_chunk = b.d(b.off_snap_chunk);
        }
        gp.layer_off = int64_t(gi * block);
        if (mixed16) gp.mixed16 = rows_before(reinterpret_cast<const bf16*>(b.mixed), T0, conv_dim);
        // the chunk kernels index tokens globally: the pass's buffers seen from token 0
        const float* mixed_t = rows_before(b.mixed, T0, conv_dim);
        const float* g_t = rows_before(b.g, T0, c.v_heads);
        const RowColScales zs = in_unscaled ? RowColScales{isc.rs + (T0 - R0), isc.cs_lo + conv_dim} : RowColScales{};
        // the gated norm in the scan's epilogue where it can (gdn_scan_norms: a batch with two
        // warpgroups a scan CTA): act then, and no O; the same act either way
        gp.gn = {rows_before(own + conv_dim, T0, n), n, {zs.rs ? rows_before(zs.rs, T0, 1) : nullptr, zs.cs}, l.gdn_norm, eps,
                 rows_before(b.gact, T0, value_dim)};
        const bool scan_norms = gdn_scan_norms(gp, ch, c.v_heads, c.k_head_dim, c.v_head_dim, gdn_path_);
        if (!scan_norms) gp.gn = {};
        else ++norms_in_scan_;
        // FP8 out_proj (ForwardOptions::fp8_gated_norm_quantizes): the gated norm quantizes its rows
        // into the GEMM's input buffers (the codes and scales the GEMM's own quantization makes);
        // after the scan's norm the GEMM quantizes act itself (the same codes)
        LinearRunner::Fp8Input oin;
        const bool norm_quantizes = !scan_norms && gated_norm_quantizes_ && lin.fp8_input(l.gdn_out, oin) && oin.k == value_dim &&
                                    gated_norm_fp8_fits(c.v_heads, c.v_head_dim, oin.kp) &&
                                    gated_norm_fp8_aligned(b.gdn_o, l.gdn_norm, own + conv_dim, n, zs, oin.q) &&
                                    scales_may_share(zs.rs, oin.scale, rows);
        mark("gdn chunk prep");
        gdn_chunk_prep(mixed_t, c.k_heads, c.v_heads, c.k_head_dim, c.v_head_dim, g_t, rows_before(b.beta, T0, c.v_heads), ch, gp, s,
                       gdn_path_);
        mark("gdn chunk scan");
        gdn_chunk_scan(mixed_t, c.k_heads, c.v_heads, c.k_head_dim, c.v_head_dim, g_t, ch, gp, rows_before(b.gdn_o, T0, value_dim), s,
                       gdn_path_);
        mark("gdn gated_norm");
        if (norm_quantizes) {
          lin.flush_pending();  // a pending add reads the scales this kernel writes
          gated_norm_fp8(b.gdn_o, rows, c.v_heads, c.v_head_dim, l.gdn_norm, eps, own + conv_dim, n, zs, oin.q, oin.kp, oin.scale, s);
          ++norms_quantized_;
        } else if (!scan_norms) {
          gated_norm(b.gdn_o, rows, c.v_heads, c.v_head_dim, l.gdn_norm, eps, own + conv_dim, n, b.gact, s, zs);
        }
        mark("gemm gdn out_proj");
        // one pass over every token: its scale pass is left to the MLP's norm (fp8_residual_in_norm)
        if (residual_in_norm_ && T0 == 0 && rows == L && b.MB >= L) lin.defer_next_accumulate();
        if (norm_quantizes) lin.run_fp8_quantized(rows, l.gdn_out, b.x + T0 * H, OutType::F32, H, true, "gdn out_proj");
        else lin.run(b.gact, rows, value_dim, l.gdn_out, b.x + T0 * H, OutType::F32, H, true, "gdn out_proj");
      }
    } else {
      const int64_t n = l.qkv.n;
      lin.use_scratch(b.qs_attn);
      const size_t row_bytes = size_t(kvw) * 2;
      if (b.pfx) {  // keys / values in their own rows: the cached ones, then this batch's after them
        lin.flush_pending();  // these copies write arena rows a pending residual add may read
        mark("prefix state in");
        for (size_t i = size_t(ai) * b.pin_layer; i < size_t(ai + 1) * b.pin_layer; ++i) prefix_copy(graphs_.get(), b.pin[i], s);
      }
      // per block: the input norm, qkv, then q / k normed and rotated into their rows for all
      // tokens (gates and values too when blocked)
      in_blocks(b.AB, l.input_norm, b.h_attn, l.qkv, [&](int64_t t0, int64_t rows, bool quantized) {
        mark("gemm attn qkv");
        if (quantized) lin.run_fp8_quantized(rows, l.qkv, b.abig, OutType::BF16, n, false, "attention qkv_proj");
        else lin.run(b.h_attn, rows, H, l.qkv, b.abig, OutType::BF16, n, false, "attention qkv_proj");
        mark("attn prep");
        attn_prep(rows_before<const bf16>(b.abig, t0, n), n, L, t0, rows, Hq, Hkv, D, c.rotary_dim(), m_.inv_freq, b.d(b.off_seq_start), mrope,
                  l.q_norm, l.k_norm, eps, b.q, b.k, s, b.pfx ? b.d(b.off_kv_row) : nullptr, b.vv, b.gate);
      });
      const bf16 *keys = b.k, *values = b.vv ? b.vv : b.abig + Hq * 2 * D + Hkv * D;
      const int64_t ldv = b.vv ? kvw : n;
      if (b.snaps) mark("prefix state out");
      for (const Batch::Prefix& pr : b.pre) {  // states left: the keys / values of their tokens [out_from, at)
        if (!pr.out) continue;
        const PrefixLayout& lay = pr.lout;
        const int64_t r0 = pr.out_from, nr = pr.at - pr.out_from;
        d2d(pr.out->buf.as<uint8_t>() + lay.k_at(ai) + size_t(r0) * row_bytes, keys + (pr.mrow + r0) * kvw, size_t(nr) * row_bytes,
            "prefix state: keys out");
        check(cudaMemcpy2DAsync(pr.out->buf.as<uint8_t>() + lay.v_at(ai) + size_t(r0) * row_bytes, row_bytes, values + (pr.mrow + r0) * ldv,
                                size_t(ldv) * 2, row_bytes, size_t(nr), cudaMemcpyDeviceToDevice, s),
              "prefix state: values out");
      }
      mark("flash attention");
      bool gate_quantized = false;  // the o_proj's FP8 input written by the gate (ForwardOptions::fp8_output_gate_quantizes)
      if (cudnn_) {  // cuDNN's attention, then the gate (q | gate rows: the gate after its head's q)
        if (n != qkv_width()) throw Error(Status::Internal, "internal_error", "attention qkv_proj width differs from the ragged arrays' plan");
        cudnn_->run(b.q, keys, values, ldv, b.aact, ragged_at(b.d(b.off_ragged), b.ragged_b), b.nseq, b.max_kv, s);
        const bf16* gate = b.gate ? b.gate : b.abig + D;
        const int64_t ldg = b.gate ? Hq * D : n, gate_hs = b.gate ? D : 2 * D;
        LinearRunner::Fp8Input oin;
        gate_quantized = gate_quantizes_ && lin.fp8_input(l.o, oin) && oin.k == Hq * D &&
                         attention_output_gate_fp8_fits(Hq, D, ldg, gate_hs, oin.kp) && attention_output_gate_fp8_aligned(b.aact, gate, oin.q);
        if (gate_quantized) {
          lin.flush_pending();  // a pending add reads the scales this kernel writes
          attention_output_gate_fp8(b.aact, L, Hq, D, gate, ldg, gate_hs, oin.q, oin.kp, oin.scale, s);
          ++gates_quantized_;
        } else {
          attention_output_gate(b.aact, L, Hq, D, gate, ldg, gate_hs, s);
        }
      } else if (b.gate) {
        flash_attention(b.q, keys, values, ldv, b.gate, Hq * D, D, Hq, Hkv, D, tiles, b.aact, s);
      } else {
        flash_attention(b.q, keys, values, ldv, b.abig + D, n, 2 * D, Hq, Hkv, D, tiles, b.aact, s);
      }
      mark("gemm attn o_proj");
      if (residual_in_norm_ && b.MB >= L) lin.defer_next_accumulate();  // the MLP's norm adds it
      if (gate_quantized) lin.run_fp8_quantized(L, l.o, b.x, OutType::F32, H, true, "attention o_proj");
      else lin.run(b.aact, L, Hq * D, l.o, b.x, OutType::F32, H, true, "attention o_proj");
    }
    lin.use_scratch(b.qs_mlp);
    // the down_proj of one block over every token leaves its scale pass to the next layer's norm
    // (ForwardOptions::fp8_residual_in_norm); the last layer of the call runs it. An out_proj's /
    // o_proj's pending pass is taken by this phase's norm (in_blocks), or run there first.
    const bool defer_down = residual_in_norm_ && b.MB >= L && li + 1 < end && (o_.debug_layers < 0 || li + 1 < o_.debug_layers);
    in_blocks(b.MB, l.post_norm, b.h_mlp, l.gate_up, [&](int64_t t0, int64_t rows, bool quantized) {
      mark("gemm mlp gate_up");
      // FP8: the GEMMs' scales are applied by the SwiGLU as it reads gate|up (same bits, one pass less)
      LinearRunner::Fp8Scales gsc;
      const bool fp8_fused = lin.run_fp8_unscaled(b.h_mlp, rows, H, l.gate_up, b.mbig, 2 * c.ffn, "mlp gate_up_proj", gsc, quantized);
      if (!fp8_fused && quantized) lin.run_fp8_quantized(rows, l.gate_up, b.mbig, OutType::BF16, 2 * c.ffn, false, "mlp gate_up_proj");
      else if (!fp8_fused) lin.run(b.h_mlp, rows, H, l.gate_up, b.mbig, OutType::BF16, 2 * c.ffn, false, "mlp gate_up_proj");
      mark("swiglu");
      // FP8 down_proj: the SwiGLU also quantizes its output into the GEMM's input buffers
      LinearRunner::Fp8Input din;
      if (fp8_fused && lin.fp8_input(l.down, din) && din.k == c.ffn && swiglu_fp8_quant_fits(c.ffn, din.kp)) {
        swiglu_fp8_quant(b.mbig, rows, c.ffn, gsc.rs, gsc.cs_lo, gsc.cs_hi, gsc.split, din.q, din.kp, din.scale, s);
        mark("gemm mlp down");
        if (defer_down) lin.defer_next_accumulate();
        lin.run_fp8_quantized(rows, l.down, b.x + t0 * H, OutType::F32, H, true, "mlp down_proj");
        return;
      }
      if (fp8_fused) swiglu_fp8_scaled(b.mbig, rows, c.ffn, gsc.rs, gsc.cs_lo, gsc.cs_hi, gsc.split, b.mact, s);
      else swiglu(b.mbig, rows, c.ffn, b.mact, s);
      mark("gemm mlp down");
      if (defer_down) lin.defer_next_accumulate();
      lin.run(b.mact, rows, c.ffn, l.down, b.x + t0 * H, OutType::F32, H, true, "mlp down_proj");
    });
  }
  lin.flush_pending();  // a safety net: the deferring sites leave nothing past the loop (defer_down excludes the last layer and debug_layers)
  if (end < layers()) {  // the next group goes on from here
    d2d(group->residual, b.x, size_t(L * H) * 4, "a step's residual stream out");
    return;
  }
  mark("rms_norm");
  rms_norm_1p(b.x, L, H, m_.final_norm, eps, nullptr, b.hidden, s);  // in place (hidden == x)
}

void Forward::head(Batch& b) {
  stage("head");
  const DevHead& h = m_.head;
  const int64_t L = b.L, d = m_.hc.hidden, W = m_.hc.width, heads = m_.hc.heads, O = b.O, Q = b.Q, N = b.nseq;
  cudaStream_t s = stream_;
  Gemm& G = *gemm_;
  constexpr float eps = 1e-5f;
  // Linears over all L tokens (memory_projection and the memory keys / values): f32_gemm_3xtf32
  // (tensor cores, fp32-level products; cuBLASLt's batch-invariant fp32 GEMM where a head's
  // widths do not allow its 16-byte copies, a property of the model, never of the request).
  // Over question / option / sequence rows (a handful a request): head_gemm. Both give a row a
  // result that does not depend on m.
  // --profile: the token-row GEMMs, the row Linears and the MHAs are timed apart from the rest
  // of their section (section: the op the time between them goes to)
  const char* section = "head inputs";
  auto timed = [&](const char* op, auto&& run) {
    mark(op);
    run();
    mark(section);
  };
  // y (+)= x w^T (+ bias: the wgmma form adds it as it writes, bias_act's bits, one pass fewer)
  auto lin_tokens = [&](const float* x, int64_t m, const DevLinear32& w, float* y, bool acc, const char* op, const float* bias = nullptr) {
    if (!w.w) throw Error(Status::Internal, "internal_error", std::string(op) + ": token-row head matrix not held in fp32");
    bool biased = false;
    timed("head token-row GEMMs", [&] {
      if (head_wgmma() && w.whi && f32_gemm_3xtf32_wgmma_fits(x, w.k, w.k, w.whi, w.wlo, w.k)) {
        f32_gemm_3xtf32_wgmma(x, w.k, m, w.k, w.whi, w.wlo, w.k, w.n, y, w.n, acc, s, bias);
        biased = true;
      } else if (f32_gemm_3xtf32_fits(x, w.k, w.k, w.w, w.k)) {
        f32_gemm_3xtf32(x, w.k, m, w.k, w.w, w.k, w.n, y, w.n, acc, s);
      } else {
        G.run_f32(x, m, w.k, w.k, w.w, w.n, y, w.n, acc, op);
      }
    });
    if (bias && !biased) bias_act(y, m, w.n, w.n, bias, false, s);
  };
  // bias (and GELU) applied by head_gemm as it writes: bias_act's bits, one launch fewer
  auto lin = [&](const float* x, int64_t m, const DevLinear32& w, float* y, bool acc, const char*, const float* bias = nullptr,
                 bool gelu = false) {
    if (!w.wh && !w.w) throw Error(Status::Internal, "internal_error", "head matrix without weights");
    timed("head row Linears", [&] {
      if (w.wh) head_gemm(x, w.k, m, w.k, w.wh, w.n, y, w.n, acc, s, bias, gelu);
      else head_gemm(x, w.k, m, w.k, w.w, w.n, y, w.n, acc, s, bias, gelu);
    });
  };
  auto attend = [&](const float* q, int64_t ldq, int64_t nq, const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* kb,
                    const int32_t* ke) { timed("head mha", [&] { mha_attend(q, ldq, nq, k, ldk, v, ldv, kb, ke, W, heads, b.att, s); }); };

  mark(section);
  // in place: nothing reads the final hidden states after their layer norm
  layer_norm(b.hidden, L, d, d, h.hidden_norm.w, h.hidden_norm.b, eps, nullptr, b.Hn, s);
  const int64_t Lm = b.Lm;  // the memory's rows
  if (b.pfx) {  // this batch's memory rows after each sequence's cached ones
    lin_tokens(b.Hn, L, h.memory_proj, b.mem, false, "head memory_projection");
    scatter_rows(b.mem, W, b.d(b.off_kv_row), L, b.M, s);
    for (size_t i = size_t(n_attn_) * b.pin_layer; i < b.pin.size(); ++i) prefix_copy(graphs_.get(), b.pin[i], s);
  } else {
    lin_tokens(b.Hn, L, h.memory_proj, b.M, false, "head memory_projection");
  }
  for (const Batch::Prefix& pr : b.pre)
    if (pr.out)
      check(cudaMemcpyAsync(pr.out->buf.as<uint8_t>() + pr.lout.memory_at + size_t(pr.out_from * W) * 4,
                            b.M + (pr.mrow + pr.out_from) * W, size_t((pr.at - pr.out_from) * W) * 4, cudaMemcpyDeviceToDevice, s),
            "prefix state: memory rows out");
  if (b.Q == 0) return;  // a step: the memory rows were all it had to leave
  span_mean(b.Hn, d, nullptr, nullptr, b.d(b.off_qbeg), b.d(b.off_qend), Q, d, b.qm, nullptr, s);
  gather_rows(b.Hn, d, b.d(b.off_last), N, b.glast, nullptr, s);
  // option_question_projection of each option's question mean: projected once per question, then
  // added per option (a head_gemm row does not depend on the other rows: the same bits as
  // projecting every option's copy of the row, with Q rows instead of O)
  lin(b.qm, Q, h.option_question_proj, b.qp, false, "head option_question_projection");
  // The option rows' per-row work runs over blocks of OB options (their scratch holds one block;
  // every op is per row, so the bits do not depend on the block): the lexical span means into lm
  auto lexical = [&](int64_t o0, int64_t nb) {
    span_mean(nullptr, 0, m_.lm_head, b.d(b.off_ids), b.d(b.off_obeg) + o0, b.d(b.off_oend) + o0, nb, d, b.lm, nullptr, s);
  };
  for (int64_t o0 = 0; o0 < O; o0 += b.OB) {
    const int64_t nb = std::min(b.OB, O - o0);
    float* R = b.R + o0 * W;
    span_mean(b.Hn, d, nullptr, nullptr, b.d(b.off_obeg) + o0, b.d(b.off_oend) + o0, nb, d, b.cm, nullptr, s);
    lexical(o0, nb);
    lin(b.cm, nb, h.option_context_proj, R, false, "head option_context_projection");
    lin(b.lm, nb, h.option_lexical_proj, R, true, "head option_lexical_projection");
    gather_rows_add(b.qp, W, b.d(b.off_qof) + o0, nb, R, s);
  }

  // q rows of an MHA's packed in_proj: [W, W] at row 0; k|v rows: [2W, W] at row W
  auto q_part = [&](const DevMha& m) { return DevLinear32{m.in.w, nullptr, W, W}; };
  auto kv_part = [&](const DevMha& m) { return DevLinear32{m.in.w + W * W, nullptr, 2 * W, W, m.kv_hi, m.kv_lo}; };
  // y += MHA(q rows xq [nq], keys/values KV [.., 2W]) with per-row key ranges
  auto cross = [&](const DevMha& m, const float* xq, int64_t nq, const int32_t* kb, const int32_t* ke, float* y) {
    lin(xq, nq, q_part(m), b.tmpq, false, "head mha q", m.in_b);
    attend(b.tmpq, W, nq, b.KV, 2 * W, b.KV + W, 2 * W, kb, ke);
    lin(b.att, nq, m.out, y, true, "head mha out_proj", m.out_b);
  };
  auto memory_kv = [&](const DevMha& m, const float* mem) {
    lin_tokens(mem, Lm, kv_part(m), b.KV, false, "head mha kv", m.in_b + W);
  };
  auto ffn = [&](const DevLinear32& w1, const float* b1, const DevLinear32& w2, const float* b2, const float* x, int64_t rows, float* y) {
    lin(x, rows, w1, b.ff, false, "head feedforward 1", b1, true);
    lin(b.ff, rows, w2, y, true, "head feedforward 2", b2);
  };

  mark(section = "head evidence layers");
  for (const auto& ev : h.evidence) {
    layer_norm(b.M, Lm, W, W, ev.memory_norm.w, ev.memory_norm.b, eps, nullptr, b.mem, s);
    memory_kv(ev.attn, b.mem);
    for (int64_t o0 = 0; o0 < O; o0 += b.OB) {
      const int64_t nb = std::min(b.OB, O - o0);
      float* R = b.R + o0 * W;
      layer_norm(R, nb, W, W, ev.query_norm.w, ev.query_norm.b, eps, nullptr, b.nrm, s);
      cross(ev.attn, b.nrm, nb, b.d(b.off_otok_b) + o0, b.d(b.off_otok_e) + o0, R);
      layer_norm(R, nb, W, W, ev.ff_norm.w, ev.ff_norm.b, eps, nullptr, b.nrm, s);
      ffn(ev.ff0, ev.ff0_b, ev.ff3, ev.ff3_b, b.nrm, nb, R);
    }
  }
  mark(section = "head fields + decoder");
  lin(b.qm, Q, h.question_proj, b.B, false, "head question_projection");
  option_summary(b.R, b.B, b.d(b.off_optbeg), Q, W, b.summary, s);
  layer_norm(b.summary, Q, W, W, h.option_summary_norm.w, h.option_summary_norm.b, eps, nullptr, b.F, s);
  lin(b.glast, N, h.global_proj, b.gp, false, "head global_projection");
  // F = norm(summary) + question_projection(qm) + ...: B holds that projection already (a
  // head_gemm row's sum does not depend on the call), so field_init adds it first rather than a
  // second GEMM accumulating it: the same bits
  field_init(b.F, b.B, b.gp, h.type_emb, b.d(b.off_type), b.d(b.off_qreq), Q, W, s);
  for (const auto& dl : h.layers) {
    // self-attention among the questions of the same request
    layer_norm(b.F, Q, W, W, dl.norm1.w, dl.norm1.b, eps, nullptr, b.nrm, s);
    lin(b.nrm, Q, dl.self_attn.in, b.tmpq, false, "head self_attn in_proj", dl.self_attn.in_b);
    attend(b.tmpq, 3 * W, Q, b.tmpq + W, 3 * W, b.tmpq + 2 * W, 3 * W, b.d(b.off_qq_b), b.d(b.off_qq_e));
    lin(b.att, Q, dl.self_attn.out, b.F, true, "head self_attn out_proj", dl.self_attn.out_b);
    // cross-attention to the request's memory
    memory_kv(dl.cross_attn, b.M);
    layer_norm(b.F, Q, W, W, dl.norm2.w, dl.norm2.b, eps, nullptr, b.nrm, s);
    cross(dl.cross_attn, b.nrm, Q, b.d(b.off_qtok_b), b.d(b.off_qtok_e), b.F);
    layer_norm(b.F, Q, W, W, dl.norm3.w, dl.norm3.b, eps, nullptr, b.nrm, s);
    ffn(dl.lin1, dl.lin1_b, dl.lin2, dl.lin2_b, b.nrm, Q, b.F);
  }
  mark(section = "head scorer");
  layer_norm(b.F, Q, W, W, h.field_norm.w, h.field_norm.b, eps, nullptr, b.Fn, s);
  layer_norm(b.R, O, W, W, h.option_norm.w, h.option_norm.b, eps, nullptr, b.On, s);
  const int64_t sh = h.scorer0.n;
  for (int64_t o0 = 0; o0 < O; o0 += b.OB) {
    const int64_t nb = std::min(b.OB, O - o0);
    const int32_t* qof = b.d(b.off_qof) + o0;
    scorer_features(b.Fn, b.On + o0 * W, qof, nb, W, b.feat, s);
    lin(b.feat, nb, h.scorer0, b.ff, false, "head residual_scorer.0", h.scorer0_b, true);
    if (b.OB < O) lexical(o0, nb);  // one block: lm still holds it
    head_logits(b.lm, b.qm, b.glast, qof, b.d(b.off_oreq) + o0, nb, d, b.Fn, b.On + o0 * W, W, b.ff, h.scorer3_w, sh, h.scalars,
                b.logits + o0, s);
  }
  question_softmax(b.logits, b.d(b.off_optbeg), Q, s);
}

}  // namespace clefrt::cuda

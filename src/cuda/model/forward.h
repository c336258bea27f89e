// The Clef forward pass on one GPU for a packed batch of encoded requests: the backbone over all
// tokens at once (each request keeps its own attention and GDN state), then the joint head over
// all requests at once. Memory is planned up front for a token budget; a batch over the budget
// is refused before anything runs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <clefrt/clefrt.h>

#include "cuda/runtime/buffer.h"
#include "cuda/runtime/cudnn_attention.h"
#include "cuda/model/device_model.h"
#include "cuda/runtime/gemm.h"
#include "cuda/model/qlinear.h"
#include "model/batch.h"
#include "schema/encode.h"

namespace clefrt::cuda {

class GraphCache;  // cuda/runtime/graph_cache.h

struct ForwardOptions {
  int64_t max_tokens = 16384;  // the activation arena holds a batch of this many tokens
  int64_t max_seqs = 256;      // requests per batch
  int64_t max_questions = 64;  // per request: the protocol's limit (schema::Limits), which plans the head's question rows
  // Option spans per batch, which plan the head's option rows (else one per token: at 32k tokens
  // on the 27B shapes ~0.85 GiB more). At least one request's worth: the protocol allows 64
  // questions of at most 255 options (schema/request.h RequestLimits); the scheduler packs no more.
  int64_t max_options = 16384;
  bool batch_invariant = true; // GEMM algorithms fixed per shape class (see gemm.h)
  bool w4a16_fused = false;    // NVFP4 parts on the fused W4A16 GEMM (qlinear.h)
  bool portable_kernels = false;  // the W4A16 GEMM, the GDN prep / scan and the head's token-row GEMMs on mma.sync even where their wgmma kernels run
  // The backbone's and the vision tower's attention: cuDNN's fused kernel (true: the Forward
  // refuses to open without it)
  // or clefrt's (false). EngineCore resolves AttentionKernel::Auto before.
  bool cudnn_attention = false;
  // A GDN layer runs in passes of at most this many 64-token chunks (0: one pass), all
  // sequences and heads at once: in_proj over the pass's tokens (and the conv's history rows
  // before them), conv, gates, chunked scan with the state carried between passes, gated norm,
  // out_proj. Its buffers are planned for one pass (on the 27B shapes ~0.2 GiB a 1,024-token
  // pass) instead of the batch; the same bits as one pass (GEMM rows do not depend on m).
  // 256 (16,384 tokens): measured with 64, the fp8 bench lost ~2% at 8,192+ tokens (GEMMs
  // split at m = 4,096); at 256 one pass covers every single-request bench point.
  int64_t gdn_pass_chunks = 256;
  // The MLP (gate|up, SwiGLU, down: all per token) runs over blocks of at most this many tokens
  // (0: all at once), so its [tokens, 2 x ffn] intermediate is planned for a block. The GEMMs
  // are batch-invariant, so a row's bits do not depend on its block. Staged NVFP4 dequantizes
  // the MLP weights once per block: a memory-for-time trade (--offload-embeddings turns it on).
  int64_t mlp_block_tokens = 0;
  // An attention layer's input norm, qkv GEMM and q / k norms + RoPE run over blocks of at most
  // this many tokens (0: all at once); queries, gates, keys and values then wait in buffers of
  // their own for every token (28 KiB a token on the 27B shapes instead of the qkv output's 44).
  // Row-invariant GEMMs and per-token kernels: the same bits.
  int64_t attn_block_tokens = 0;
  // The joint head's per-option work (span means, evidence layers, scorer) runs over blocks of at
  // most this many options (0: all at once), so its option scratch (~90 KiB an option on the 27B
  // shapes: the 5,120-wide span means, the attention and feed-forward rows) is planned for a
  // block. Per-row ops throughout: the same bits.
  int64_t head_option_block = 0;
  // The vision tower's scratch holds this many patches (0: merge^2 x max_tokens, every image
  // token's). The processor's largest image (max_pixels / patch^2) is enough: a batch's images
  // run through the tower in groups that fit, with the same bits as all at once.
  int64_t vision_patches = 0;
  // A batch's images go through the tower in groups that fit its scratch, their rows staged in a
  // buffer as large (up to 0.3 GiB for the processor's largest image on the 27B shapes); false:
  // one image at a time, its rows straight into the residual stream (the lean plan).
  bool vision_groups = true;
  // CUDA graphs: a batch shape (its sequences' lengths, questions and options per question) seen
  // this many times has its backbone + head captured into a graph then, and replayed from then on
  // (the kernels back to back without the host's launches between them; the same bits). 0: off.
  // At least 2: a shape's first forward tunes its GEMMs (which synchronizes; capture cannot). Only
  // batches without images or states to leave, with profiling off, CLEFRT_CUDA_SYNC unset and no
  // NVFP4 staging (its side stream); the others run as always. A batch continuing cached prefixes
  // is graphed too: the cached lengths are part of its shape, and each replay points the graph's
  // copies of the states at that batch's cache entries.
  int64_t graph_after = 0;
  // FP8: the accumulating Linears leave their scale pass (x += the scaled output) to the norm
  // that reads x next (rms_norm_1p_add / _fp8_add: one read of x less, the same bits): down_proj
  // to the next layer's input norm, the GDN out_proj and the attention o_proj to their layer's
  // MLP norm; where the Linear and the norm each take every row in one call, the norm's outputs
  // do not overlap the pending output's buffers, and no prefix copy comes between; elsewhere the
  // pass runs as always. On by default since its GPU tests passed, prefix cache included
  // (bench/results/2026-12-05-h100-session34.md); CLEFRT_LAB_FP8_RESIDUAL_IN_NORM=0 or 1 overrides
  // this field either way (the lab's A/B of one binary).
  bool fp8_residual_in_norm = true;
  // FP8: the GDN gated norm quantizes its rows into the out_proj's FP8 input buffers
  // (gated_norm_fp8, one CTA a token) instead of writing bf16 rows the GEMM's quantization reads
  // back: the same codes and scales. On by default since measured in the model
  // (bench/results/2026-12-06-h100-session36.md); CLEFRT_LAB_GATED_NORM_FP8=0 or 1 overrides this
  // field either way.
  bool fp8_gated_norm_quantizes = true;
  // FP8, cuDNN's attention: the output gate after it quantizes the gated rows into the o_proj's
  // FP8 input buffers (attention_output_gate_fp8) instead of writing them back in bf16 for the
  // GEMM's quantization to read: the same codes and scales. On by default since measured in the
  // model (bench/results/2026-12-06-h100-session36.md); CLEFRT_LAB_OUTPUT_GATE_FP8=0 or 1
  // overrides this field either way.
  bool fp8_output_gate_quantizes = true;
  int64_t debug_layers = -1;   // tests: run only the first N backbone layers (-1: all)
};

// The lean-memory plan that goes with --offload-embeddings: the MLP and the attention layers'
// projections over 1,024-token blocks, the GDN layers in passes of 16 chunks, the head's options
// in blocks of 1,024, images through the tower one at a time (the same
// answers bit for bit; a little slower on long inputs, more so for staged NVFP4, which
// dequantizes those weights once per block / pass).
inline void use_lean_memory_plan(ForwardOptions& o) {
  o.mlp_block_tokens = 1024;
  o.attn_block_tokens = 1024;
  o.head_option_block = 1024;
  o.vision_groups = false;
  o.gdn_pass_chunks = 16;
}

// What a sequence continues from, or leaves for the prefix cache (engine/prefix_cache.h; the
// CPU's twin is model::PrefixState) or for its own next step (a long request in steps): the
// state after its first `length` tokens (a multiple of 64, the GDN chunk), in one device buffer
// laid out by PrefixLayout::of(m, capacity). A batch continuing it gives the same bits as one
// computing the whole sequence (positions, chunks and key blocks keep their places relative to
// the sequence's start).
constexpr int64_t kPrefixGranularity = 64;  // cached prefixes end at multiples of the GDN chunk
struct DevPrefixState {
  int64_t length = 0;    // tokens it holds the state after
  int64_t capacity = 0;  // rows its buffer is laid out for (>= length)
  DeviceBuffer buf;
};
// Byte offsets in a DevPrefixState of `capacity` rows: per full-attention layer (i-th of them) K
// then V [capacity, kv_heads * head_dim] bf16 (after k_norm + RoPE); per GDN layer (i-th) a
// block of the state [v_heads, k_head_dim, v_head_dim] fp32 and the conv's last K - 1 in_proj
// rows [K - 1, conv_dim] fp32; the joint head's memory rows [capacity, width] fp32.
struct PrefixLayout {
  int64_t length = 0, kv_width = 0;  // length: the capacity in rows
  size_t gdn_at = 0, gdn_block_floats = 0, gdn_state_floats = 0, memory_at = 0, bytes = 0;
  static PrefixLayout of(const DevModel& m, int64_t capacity);
  size_t k_at(int64_t attn_layer) const { return size_t(2 * attn_layer) * size_t(length * kv_width) * 2; }
  size_t v_at(int64_t attn_layer) const { return k_at(attn_layer) + size_t(length * kv_width) * 2; }
};
// Per sequence of a batch (Forward::run): continue after `from` (null: from the start), and
// leave the state after `at` tokens in `into` (null: nothing; at <= into->capacity, at <= the
// sequence's length); into->length is `at` once run() returns. into may be from itself (a
// long request's steps): then only the rows after from->length are written.
struct SeqPrefix {
  const DevPrefixState* from = nullptr;
  DevPrefixState* into = nullptr;
  int64_t at = 0;
};

// A long request's step a group of layers at a time (EngineCore's GPU steps: other requests run
// between the groups): layers [first, end) of the backbone over the batch's tokens, the residual
// stream carried from one group to the next in `residual` ([tokens, hidden] fp32, the caller's).
// The first group embeds; the last (end == the model's layers) ends as run() does (final norm,
// head, the states' lengths); the others leave the states' lengths as they were (a state is
// whole only after the last group). The same bits as all layers in one run.
struct LayerGroup {
  int64_t first = 0, end = 0;
  float* residual = nullptr;
};

class Forward {
 public:
  Forward(const DevModel& m, ForwardOptions o);
  ~Forward();

  // Per request, per question, option probabilities (encoded option order). Throws a 413
  // context_length_exceeded Error when the batch exceeds the plan (max_tokens / max_seqs).
  std::vector<std::vector<std::vector<double>>> run(const model::Batch& batch);
  // The same with the prefix cache's states: prefixes[i] for batch[i] (empty: none). A state
  // given to `into` is complete when this returns. A batch without questions (a long
  // request's step) runs the backbone and the head's memory rows only and answers nothing.
  std::vector<std::vector<std::vector<double>>> run(const model::Batch& batch, const std::vector<SeqPrefix>& prefixes);
  // The same over a group of layers (LayerGroup); a group before the last answers nothing.
  std::vector<std::vector<std::vector<double>>> run(const model::Batch& batch, const std::vector<SeqPrefix>& prefixes,
                                                    const LayerGroup& group);
  int64_t layers() const { return int64_t(m_.layers.size()); }
  std::vector<std::vector<std::vector<double>>> run(const std::vector<const Encoded*>& batch) { return run(model::batch_of(batch)); }
  // The backbone alone: final-norm hidden states [tokens, hidden] (tests compare them with the
  // CPU engine's).
  std::vector<float> hidden_states(const model::Batch& batch);
  std::vector<float> hidden_states(const std::vector<const Encoded*>& batch) { return hidden_states(model::batch_of(batch)); }
  // Where the backbone first goes non-finite for this batch (the engine's error path; bisects
  // over the number of layers run, so ~log2(layers) backbone passes): -1 the embeddings, i the
  // residual stream after layer i, -2 finite throughout.
  int64_t first_non_finite_layer(const model::Batch& batch);
  // The joint head alone on given hidden states [tokens, hidden] (tests feed it the CPU's).
  std::vector<std::vector<std::vector<double>>> head_only(const model::Batch& batch, const std::vector<float>& hidden);
  std::vector<std::vector<std::vector<double>>> head_only(const std::vector<const Encoded*>& batch, const std::vector<float>& hidden) {
    return head_only(model::batch_of(batch), hidden);
  }

  // set_profile (EngineOptions::profile, `clefrt bench --profile`): CUDA events at every op
  // (ProfileDetail::Ops) or only at the stages' bounds ("embed", "vision tower", "backbone",
  // "head": ProfileDetail::Stages, whose few events leave the forward's kernels back to back);
  // totals by name in milliseconds, summed over the runs since the last clear.
  void set_profile(ProfileDetail d) { profile_ = d; }
  const std::vector<std::pair<std::string, double>>& profile() const { return prof_totals_; }
  void clear_profile() { prof_totals_.clear(); }

  // Bytes of the activation arena for a plan (weights not included); `q`: the scratch of the
  // quantized paths (NVFP4 W4A4 / FP8 activations) is planned as if every Linear ran so.
  // `vc`: the vision tower's numbers when the model has one (its scratch shares the backbone's).
  static size_t arena_bytes(const model::TextConfig& c, const model::HeadConfig& hc, const ForwardOptions& o,
                            QuantMode q = QuantMode::BF16, const model::VisionConfig* vc = nullptr);
  size_t arena_bytes() const { return arena_.capacity(); }
  // GPU memory this engine holds besides the weights: arena, cuBLASLt workspace, NVFP4 staging.
  std::string attention_kernel() const;  // the backbone's attention, in words
  // the head's token-row GEMMs' kernel, in words
  std::string head_kernel() const { return head_wgmma() && m_.head.memory_proj.whi ? "wgmma 3xTF32" : "mma.sync 3xTF32"; }
  std::string gdn_kernel() const;        // the GDN layers' chunk scan, in words
  size_t working_bytes() const { return arena_.capacity() + gemm_workspace_bytes() + lin_->staging_bytes(); }
  static size_t gemm_workspace_bytes() { return size_t(64) << 20; }
  const ForwardOptions& options() const { return o_; }
  cudaStream_t stream() const { return stream_; }
  // CUDA graphs (ForwardOptions::graph_after): the executable graphs held now, and the forwards
  // that replayed one since the Forward opened (tests, bench)
  size_t graphs_held() const;
  size_t graph_replays() const;
  // Pending FP8 residual adds a norm took (ForwardOptions::fp8_residual_in_norm), since load.
  size_t residual_adds_taken() const { return adds_taken_; }
  // GDN gated norms that quantized the out_proj's input (ForwardOptions::fp8_gated_norm_quantizes),
  // since load (host-side: a replayed graph does not count).
  size_t gated_norms_quantized() const { return norms_quantized_; }
  // The same for the attention output gate (ForwardOptions::fp8_output_gate_quantizes).
  size_t output_gates_quantized() const { return gates_quantized_; }
  // GDN gated norms the scan applied in its epilogue (gdn_scan_norms), since load (host-side).
  size_t gated_norms_in_scan() const { return norms_in_scan_; }

 private:
  struct Batch;
  // The arena a model needs for batches of up to max_tokens tokens / max_seqs requests.
  static size_t plan_bytes(const DevModel& m, const ForwardOptions& o);
  static int64_t vision_plan(const DevModel& m, const ForwardOptions& o);  // the tower's scratch in patches
  void prepare(Batch& b, const model::Batch& batch, const std::vector<SeqPrefix>* prefixes = nullptr);
  std::vector<std::vector<std::vector<double>>> run_impl(const model::Batch& batch, const std::vector<float>* hidden,
                                                         const std::vector<SeqPrefix>* prefixes = nullptr, const LayerGroup* group = nullptr);
  void backbone(Batch& b, const LayerGroup* group = nullptr);
  void head(Batch& b);
  // backbone + head through the graph cache when graphs are on and the batch qualifies: true when
  // it enqueued them (replayed, captured, or eagerly for a shape not yet seen enough); false: the
  // caller runs them
  bool run_graphed(Batch& b, const model::Batch& batch);
  std::unique_ptr<GraphCache> graphs_;
  int64_t n_attn_ = 0;  // the backbone's full-attention layers
  void mark(const char* op);   // profiling (Ops): the op that starts here
  void stage(const char* op);  // profiling (Stages): the stage that starts here
  void mark_end();             // profiling (either): the last one's end
  void collect_profile();      // after a sync: events -> totals

  ProfileDetail profile_ = ProfileDetail::Off;
  void record(const char* op);
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> event_pool_;
  std::vector<std::pair<std::string, double>> prof_totals_;

  const DevModel& m_;
  ForwardOptions o_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<LinearRunner> lin_;
  std::unique_ptr<CudnnAttention> cudnn_;
  std::unique_ptr<CudnnFrameAttention> cudnn_frames_;  // the vision tower's, beside cudnn_
  std::string tower_note_;  // why the tower keeps clefrt's attention beside cudnn_ (empty: it does not)
  // The GDN prep's and scan's path (one for both: the Wgmma prep writes the planes its scan
  // reads): Auto's choice, with --portable-kernels the mma.sync one where Auto picks Wgmma
  GdnPath gdn_path_ = GdnPath::Auto;
  bool gdn_mixed16_ = true;        // the one-pass Wgmma prep reads the conv's rows in bf16 (GdnScratch::mixed16)
  // the head's token-row GEMMs on wgmma where the model holds their TF32 planes (DevLinear32::whi),
  // mma.sync with --portable-kernels
  bool head_wgmma() const { return !o_.portable_kernels; }
  bool residual_in_norm_ = false;  // ForwardOptions::fp8_residual_in_norm or its lab switch
  bool gated_norm_quantizes_ = false;  // ForwardOptions::fp8_gated_norm_quantizes or its lab switch
  size_t norms_quantized_ = 0;
  size_t norms_in_scan_ = 0;
  bool gate_quantizes_ = false;  // ForwardOptions::fp8_output_gate_quantizes or its lab switch
  size_t gates_quantized_ = 0;
  size_t adds_taken_ = 0;
  int64_t qkv_width() const;  // the attention layers' q | gate, k, v GEMM output row  // the backbone's attention when ForwardOptions::cudnn_attention
  Arena arena_;
};

}  // namespace clefrt::cuda

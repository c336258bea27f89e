// Running a backbone Linear whatever its parts hold (device_model.h):
// - BF16: cuBLASLt bf16 GEMM.
// - NVFP4 (W4A16 / W4A4): the weights stay packed in GPU memory (4.5 bits per weight). Hopper
//   has no FP4 tensor cores. Default: each part is dequantized (bit-exact, spec/quant.md) into
//   one of two bf16 staging slots by a side stream, in row chunks, one chunk ahead of the
//   cuBLASLt GEMM that reads it (the dequantization of chunk i+1 overlaps the GEMM of chunk i).
//   Short passes (at most rs_max_tokens() tokens) skip the staging where every staged part has
//   its register-A tables (DevLinearPart::rs; Hopper): nvfp4_gemm_rs reads the packed weights
//   directly, bit for bit the staged path's results (the GPU tests compare them), so a row's
//   answer does not depend on which path its batch took; its tile is timed per m bucket and
//   shape at the first call (W4A16RsTuner).
//   With W4A16Kernel::Fused parts whose k is a multiple of 64 run the
//   W4A16 GEMM of kernels_w4a16.cu instead (dequantized per tile in shared memory, no staging
//   slots): measured on the H200 at the 27B shapes it is slower than staging at every size a Clef
//   prompt has (blog 113 vs 98 ms, 8,192 tokens 1,702 vs 948 ms; bench/results), so it is not the
//   default. W4A4 first quantizes-dequantizes the activations per token and per 16 inputs (the
//   exact W4A4 numerics).
// - FP8: activations quantized per token to e4m3, cuBLASLt FP8 GEMM (fp32 accumulation), then
//   the per-token x per-channel scales in a separate pass (sm_90 cuBLASLt takes scalar scales only);
//   for the MLP's gate|up, run_fp8_unscaled leaves them to the SwiGLU, which reads that output
//   anyway (swiglu_fp8_scaled: the same bits, one pass less).
// - NVFP4 W4A4 on Blackwell (parts with scales_swizzled; UNTESTED, no such GPU here): activations
//   quantized to packed FP4 + swizzled scales, cuBLASLt block-scaled FP4 GEMM, no staging.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/runtime/buffer.h"
#include "cuda/model/device_model.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/gemm.h"
#include "cuda/runtime/w4a16_rs_tune.h"

namespace clefrt::cuda {

// Activation scratch of the quantized paths, carved per batch from the arena (null when the
// model has no such part).
struct QuantScratch {
  bf16* xq16 = nullptr;   // W4A4 activations [L, max_k]
  uint8_t* xq8 = nullptr; // FP8 activations [L, max_k]
  float* xs = nullptr;    // FP8 per-token scales [L]
  uint8_t* xq4 = nullptr; // native FP4 activations [L, max_k / 2] (Blackwell)
  uint8_t* xsc = nullptr; // their swizzled scales (nvfp4_swizzled_bytes(L, max_k))
  float* acc = nullptr;   // FP8 unscaled GEMM output [L, fp8_scratch_cols]: residual GEMMs, and
                          // outputs the FP8 GEMM cannot write in place (alignment)
};

enum class W4A16Kernel { Staged, Fused };

class LinearRunner {
 public:
  // `stage_bytes`: each of the two NVFP4 staging slots holds row chunks of at most this size
  // (a part is split into chunks of whole rows).
  static constexpr size_t kStageBytes = size_t(96) << 20;
  LinearRunner(const DevModel& m, Gemm& gemm, cudaStream_t s, size_t stage_bytes = kStageBytes,
               W4A16Kernel w4a16 = W4A16Kernel::Staged, W4A16Gemm w4a16_gemm = W4A16Gemm::Auto);
  ~LinearRunner();
  LinearRunner(const LinearRunner&) = delete;
  LinearRunner& operator=(const LinearRunner&) = delete;

  // Call at the start of each backbone pass of `tokens` tokens (the most any of its runs has):
  // restarts the NVFP4 schedule at layer `layer`'s first Linear (a pass over a group of layers
  // starts there) and stages its first chunk, or, for a short pass, chooses nvfp4_gemm_rs.
  void begin(const QuantScratch& sc, size_t layer, int64_t tokens);
  // The longest pass that runs nvfp4_gemm_rs instead of the staging (0: never, as without the
  // tables or under portable kernels). CLEFRT_LAB_W4A16_RS_MAX_M=M sets it (0 turns it off).
  int64_t rs_max_tokens() const { return rs_max_tokens_; }
  static constexpr int64_t kRsMaxTokens = 512;
  // The quantization scratch from here on (each backbone phase plans its own).
  void use_scratch(const QuantScratch& sc) { sc_ = sc; }
  // Running the same Linears again (the MLP over its next token block): position() before
  // the first run, replay_from(it) before each repeat. The staged chunks are dequantized again
  // from there (one chunk is prefetched for nothing at each repeat).
  size_t position() const { return cursor_; }
  void replay_from(size_t pos);
  // y (+)= x W^T. x: bf16 [m, k] with row stride ldx; y: [m, n] of type yt with row stride ldy.
  // Linears must come in the order of schedule_order() (checked).
  void run(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op);

  // The FP8 scales a caller applies itself after run_fp8_unscaled: y[t, c] * rs[t] * cs(c), cs(c)
  // = cs_lo[c] for c < split, else cs_hi[c - split].
  struct Fp8Scales {
    const float* rs = nullptr;
    const float* cs_lo = nullptr;
    const float* cs_hi = nullptr;
    int64_t split = 0;
  };
  // When every part of `l` is FP8 (at most two) and writes its bf16 output in place: quantizes x,
  // runs the GEMMs into y without the scale pass, fills `sc` and returns true (the fused SwiGLU
  // applies them: one pass over gate|up instead of two). Otherwise runs nothing, returns false.
  // x_quantized: the input is already in fp8_input's buffers (x unused; rms_norm_1p_fp8).
  bool run_fp8_unscaled(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, bf16* y, int64_t ldy, const char* op, Fp8Scales& sc,
                        bool x_quantized = false);

  // When `l`'s first part is FP8 over exactly its first `cols` output columns (those its readers
  // scale) and writes its fp32 output in place, and the parts after it are bf16: runs them all,
  // the FP8 part without its scale pass, fills `sc` (the first part's scales, split = cols) and
  // returns true; the readers of y apply the scales (RowColScales) and need sc.rs, QuantScratch's
  // xs, intact until they have run. Otherwise runs nothing, returns false.
  // x_quantized: its FP8 parts' input is already in fp8_shared_input's buffers (x still feeds
  // the bf16 parts).
  bool run_fp8_first_unscaled(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, float* y, int64_t ldy, int64_t cols,
                              const char* op, Fp8Scales& sc, bool x_quantized = false);
  // Where an all-FP8 Linear takes its quantized input (QuantScratch's xq8 / xs: rows kp apart, a
  // scale per row; its parts share it), so that a kernel can write it there (swiglu_fp8_quant,
  // rms_norm_1p_fp8) and run_fp8_quantized skip the quantization. False for other Linears.
  struct Fp8Input {
    uint8_t* q = nullptr;
    int64_t k = 0, kp = 0;  // the input's columns, and its rows' stride in q
    float* scale = nullptr;
  };
  bool fp8_input(const DevLinear& l, Fp8Input& in) const;
  // The same buffers for a Linear with FP8 parts among others (they share its quantized input;
  // run_parts still gives x to the others). False without an FP8 part.
  bool fp8_shared_input(const DevLinear& l, Fp8Input& in) const;
  // run() for such a Linear, its input [m, k] already in fp8_input's buffers.
  void run_fp8_quantized(int64_t m, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op);
  size_t staging_bytes() const { return slots_[0].bytes() + slots_[1].bytes(); }
  // Whether a pass of this many tokens stages (a side stream and host-side chunk order, which a
  // CUDA graph cannot replay); short passes run nvfp4_gemm_rs on the main stream only.
  bool stages(int64_t tokens) const { return staging_bytes() > 0 && tokens > rs_max_tokens_; }

  // An accumulating FP8 Linear's scale pass left for the norm that reads the residual stream next
  // (Forward's ForwardOptions::fp8_residual_in_norm). defer_next_accumulate(): the next run of an
  // all-FP8 single-part Linear accumulating into fp32 y records its scale pass here instead of
  // running it (other runs clear the request). The add reads QuantScratch's acc and xs as they
  // were then: nothing may write them before it is taken (take_pending) or run (flush_pending).
  struct PendingResidual {
    ResidualFp8 add;
    float* y = nullptr;  // the rows of the residual stream it adds to
    int64_t rows = 0, n = 0, ldy = 0;
  };
  void defer_next_accumulate() { defer_ = true; }
  bool has_pending() const { return pending_.y != nullptr; }
  const PendingResidual& pending() const { return pending_; }
  void take_pending() { pending_ = {}; }  // a norm applied it
  void flush_pending();                   // runs the scale pass (scale_rows_cols_acc) now

  // Columns of QuantScratch::acc: the hidden size, or a wider FP8 part whose output rows are not
  // 16-byte aligned (small test models).
  static int64_t fp8_scratch_cols(const DevModel& m);

  // The backbone's Linears in the order Forward::backbone runs them, kLinearsPerLayer a layer.
  static constexpr size_t kLinearsPerLayer = 4;
  static std::vector<const DevLinear*> schedule_order(const DevModel& m);
  // Whether part p runs the fused W4A16 GEMM (else staging or another format).
  bool fused_nvfp4(const DevLinearPart& p) const;

 private:
  struct Chunk {
    const DevLinearPart* part;
    int64_t r0, rows;
  };
  void issue(size_t i);  // dequantize chunk i into slot i % 2 on the side stream
  // run()'s body. x_quantized: the FP8 parts' input is already in sc_.xq8 / sc_.xs (x unused);
  // fp8_unscaled: FP8 parts written in place skip their scale pass (the callers checked that each
  // is written in place and leave the scales to the output's readers).
  struct PartsMode {
    bool x_quantized = false, fp8_unscaled = false;
  };
  void run_parts(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op,
                 PartsMode mode);
  void run_nvfp4(const bf16* x, int64_t m, int64_t ldx, const DevLinearPart& p, char* y, size_t es, OutType yt, int64_t ldy, bool acc,
                 const char* op);

  const DevModel& m_;
  Gemm& gemm_;
  cudaStream_t s_;
  W4A16Kernel w4a16_;
  W4A16Gemm w4a16_gemm_;  // MmaSync: the portable kernel even where wgmma runs (EngineOptions::portable_kernels)
  int64_t fp8_cols_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t ready_[2] = {nullptr, nullptr}, free_[2] = {nullptr, nullptr};
  DeviceBuffer slots_[2];
  std::vector<Chunk> chunks_;
  std::vector<size_t> layer_chunk_;  // per layer (and one past the last): its first chunk
  size_t cursor_ = 0;
  int64_t rs_max_tokens_ = 0;
  bool rs_pass_ = false;  // this pass runs nvfp4_gemm_rs (nothing staged)
  std::unique_ptr<Nvfp4RsWork> rs_work_;  // its stream-K scratch
  std::unique_ptr<W4A16RsTuner> rs_tune_;  // its tile per m bucket and shape
  QuantScratch sc_{};
  bool defer_ = false;
  PendingResidual pending_{};
};

}  // namespace clefrt::cuda

// The engine's core: a loaded Clef folder (tokenizer, config, weights) and the forward on the
// CPU or the GPU, one batch at a time from one thread. The public clefrt::Engine
// (include/clefrt/clefrt.h, engine.cpp) puts the scheduler and the protocol around it.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <clefrt/clefrt.h>

#include "engine/prefix_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/sequence_forward.h"
#include "model/weights.h"
#include "quant/mode.h"
#include "schema/encode.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {

struct CoreOptions {
  EncodeOptions encode;
  int threads = 0;  // 0 = all cores (CPU engine)
  Device device = Device::Cpu;  // Cpu or Cuda (Auto is resolved before)
  // CUDA: the activation memory is planned for batches of up to this many tokens (0: the
  // encoder's max_length) and requests; larger batches are refused before they run.
  int64_t max_batch_tokens = 0;
  int64_t max_batch_requests = 64;
  // A request's answer does not depend on its batch: CUDA fixes GEMM algorithms per shape
  // class. (The CPU runs a batch's requests one at a time whatever this says.)
  bool batch_invariant = true;
  // CUDA: what the backbone's Linears run in (quant/mode.h); the CPU engine runs what the folder
  // holds (dequantized at load) and accepts only Auto.
  QuantMode quant = QuantMode::Auto;
  // CUDA: embed_tokens / lm_head stay in pinned host memory; kernels read only the rows they need.
  bool offload_embeddings = false;
  // Load the folder's vision tower (EngineOptions::vision); false: text only (the memory plan
  // leaves it out, images are a 422).
  bool vision = true;
  // CUDA, NVFP4 parts: the fused W4A16 GEMM instead of staging (cuda/qlinear.h; slower on the
  // H200 at Clef's shapes, no staging memory).
  bool w4a16_fused = false;
  // CUDA, W4A4 parts on Blackwell (compute capability >= 10): native FP4 tensor cores; false
  // keeps the emulated path (its oracle) there. Hopper and older always emulate.
  bool native_fp4 = true;
  // CUDA: the kernels every supported GPU runs (clefrt::EngineOptions::portable_kernels).
  bool portable_kernels = false;
  // CUDA graphs of repeated batch shapes (clefrt::EngineOptions::cuda_graphs; 0: off).
  int64_t cuda_graphs = int64_t(kCudaGraphsAfter);
  // CUDA: the backbone's attention kernel (clefrt::EngineOptions::attention).
  AttentionKernel attention = AttentionKernel::Auto;
  // Loading reports its stages on stderr (common/progress.h).
  bool progress = false;
  // CUDA, quant Auto and no offload / fused kernel asked for: a plan over the free memory loads
  // the first format + offload + W4A16 kernel that fits instead of being refused (memory_plan.h).
  bool fit_memory = false;
  // Every floating-point weight is tested for NaN / infinity at load (io/finite_check.h), and a
  // folder holding any is refused naming the tensor. Off: such weights surface later, as a
  // request's 500 naming the layer whose output turned non-finite.
  bool check_weights = true;
  // false: config, tokenizer and encoder only (`clefrt encode`, clefrt::EngineOptions::load_weights).
  bool load_weights = true;
  // The prefix cache's budget in bytes (0: off; engine/prefix_cache.h): host memory on the CPU,
  // GPU memory on the GPU.
  size_t prefix_cache_bytes = 0;
  // The budget is the default (not asked for): at load it shrinks to half of the host memory left
  // after the weights when that is less (and says so); an asked-for budget over it is refused.
  bool prefix_cache_default = false;
  // GPU engines: the host tier's budget in bytes (0: off; EngineOptions::prefix_cache_host_gib).
  size_t prefix_cache_host_bytes = 0;
};

struct GpuBackend;

// A request's images through the processor and, on the CPU, the vision tower: the rows that
// replace its <|image_pad|> embeddings (one vector per image; the CPU engine) or the processor's
// patches, which the GPU forward runs through its tower with the batch's other images; and its
// mRoPE positions, which point at them.
struct ImageMedia {
  std::vector<std::vector<float>> rows;
  std::vector<model::ImagePatches> patches;
  model::SequenceMedia media;
};

struct GpuSteps;  // engine_core.cpp (CUDA builds)

// One request in steps: how much came from the cache and, on the CPU, the runner and whether
// its own prefix state goes to the cache at the limit; on the GPU its state between steps.
struct StepRun {
  model::Sequence seq;
  model::GdnForm form = model::GdnForm::Chunked;
  size_t cached_tokens = 0;  // the prefix read from the cache (its entry is let go once copied in)
  std::unique_ptr<model::SequenceRunner> runner;
  bool snapshot_pending = false;
  std::shared_ptr<GpuSteps> gpu;
};


// The GPU architectures this build holds code for ("sm_90a"; "" without CUDA): version.cpp.
const char* cuda_build_architectures();

class EngineCore {
 public:
  // Loads and validates everything; throws load_error naming the file/tensor at fault.
  static std::unique_ptr<EngineCore> load(const std::string& dir, CoreOptions opts = {});
  // Random weights at a preset's real shapes created directly in GPU memory (no files), with a
  // real tokenizer: for benchmarks (`clefrt serve --synthetic`). CUDA only; answers are noise.
  static std::unique_ptr<EngineCore> synthetic(const std::string& preset, const std::string& tokenizer, CoreOptions opts);
  // A tokenizer.json alone: encoder() works, probs() throws (`clefrt encode --tokenizer`).
  static std::unique_ptr<EngineCore> tokenizer_only(const std::string& tokenizer, CoreOptions opts);
  ~EngineCore();

  const model::ModelConfig& config() const { return cfg_; }
  const Encoder& encoder() const { return *encoder_; }
  // Null for a request without images. Decodes, resizes and runs the tower (the CPU engine; the
  // GPU engine and a folder without a tower answer a 422); an image that does not decode is a
  // 422 naming images[i].
  std::shared_ptr<const ImageMedia> image_media(const Request& req, const Encoded& e) const;
  const Tokenizer& tokenizer() const { return *tok_; }

  // One request in steps, so the scheduler can interleave a long request with short ones:
  // start() looks up the prefix cache; step() runs about `tokens` more (whole chunks; the prefix
  // state goes to the cache on the way) and says whether the steps are through (on the GPU a
  // call runs `layers` backbone layers of a step, 0: all; the step's tokens go on through the
  // next layers at the next call, their residual stream held between); finish() runs
  // the rest (on the GPU: the tokens after the last step, with the head) and gives the
  // probabilities (a 500 for non-finite ones, as probs()). The same bits as probs(). On the GPU
  // the request's state between steps is device memory of its own (~68 KiB a token at Clef
  // 27B's shapes); when that cannot be had, the steps are skipped and finish() runs it whole.
  bool runs_in_steps() const { return opts_.load_weights; }
  int64_t default_step_tokens() const { return gpu_ ? 2048 : 1024; }
  // Layers a GPU step's call runs: 4 (at 2,048 tokens of a 64k request ~20 ms on an H200:
  // bench/results/2026-12-03-h200-long-and-interleave.md).
  int64_t default_step_layers() const { return 4; }
  // Which requests run in steps of `step` tokens: on the CPU any longer one (it runs one request
  // at a time anyway); on the GPU those over 4 steps (a step there costs a forward's fixed part
  // again: bench/results/2026-12-03-h200-prefix-reuse.md). step 0: default_step_tokens().
  int64_t steps_above(int64_t step) const {
    if (step <= 0) step = default_step_tokens();
    return gpu_ ? 4 * step : step;
  }
  // Option spans one forward may hold: the GPU's plan (cuda::ForwardOptions::max_options, at
  // least one request's worth); the CPU has no such bound.
  int64_t max_batch_options() const;
  std::unique_ptr<StepRun> start(const model::Sequence& e, model::GdnForm form = model::GdnForm::Chunked) const;
  bool step(StepRun& r, int64_t tokens, int64_t layers = 0) const;
  std::vector<std::vector<double>> finish(StepRun& r, size_t* cached_tokens = nullptr) const;

  // Per-question probabilities (encoded option order) for several encoded requests, run as one
  // packed forward: each request keeps its own attention and GDN state. A probability that is
  // not finite is never returned: the call throws a 500 Error naming where the forward first
  // went non-finite (a backbone layer, the final norm or the joint head).
  // cached_tokens (optional): per request, the leading tokens read from the prefix cache.
  std::vector<std::vector<std::vector<double>>> probs(const model::Batch& batch, model::GdnForm form = model::GdnForm::Chunked,
                                                      std::vector<size_t>* cached_tokens = nullptr) const;
  // The same for encoded requests (tests; the engine above converts once, in the scheduler).
  std::vector<std::vector<std::vector<double>>> probs(const std::vector<const Encoded*>& batch,
                                                      model::GdnForm form = model::GdnForm::Chunked) const {
    return probs(model::batch_of(batch), form);
  }

  // The GPU forward of `batch` with its answers dropped and the prefix cache left alone: the
  // warm-up's (engine/warmup.h). Nothing on the CPU.
  void warm_forward(const model::Batch& batch) const;

  Device device() const { return opts_.device; }
  // What the Linears run in: "f32" (CPU), "bf16", "fp8", "nvfp4" (W4A4), "nvfp4-w4a16", "mixed".
  const char* format() const;
  MemoryUse memory() const;
  PrefixCacheStats prefix_cache_stats() const;
  double forward_flops(const std::vector<int64_t>& lengths) const;  // clefrt::Engine::forward_flops
  // Calibration (clefrt::quantize): the CPU forward reports the input of every backbone Linear
  // to it, on the thread that runs the forward (clefrt::LinearInputObserver). Empty: none.
  // Throws on the GPU engine.
  void set_linear_input_observer(LinearInputObserver o);

  // CUDA: per-op or per-stage times (cuda::Forward::set_profile); nothing on the CPU.
  void set_profile(ProfileDetail detail);
  std::vector<std::pair<std::string, double>> profile() const;
  void clear_profile();
  // Bytes of GPU memory held (weights, activation arena, workspaces); 0 on the CPU.
  size_t gpu_bytes() const;
  // CUDA: a line saying what the Linears run in and where the memory goes ("" on the CPU).
  std::string gpu_summary() const;

 private:
  EngineCore();
  std::vector<std::vector<std::vector<double>>> forward(const model::Batch& batch, model::GdnForm form, std::vector<size_t>* cached) const;
  [[noreturn]] void throw_non_finite(const model::Sequence& e, size_t question) const;
  LinearInputObserver observer() const;
  CoreOptions opts_;
  model::ModelConfig cfg_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Encoder> encoder_;
  model::TextWeights text_;
  model::HeadWeights head_;
  model::VisionWeights vision_;
  bool has_vision_ = false;  // the folder has model.visual.* tensors (on the GPU: uploaded)
  std::unique_ptr<GpuBackend> gpu_;
  std::unique_ptr<PrefixCache> cache_;  // null: off
  void make_prefix_cache(double avail_bytes, const char* where, int64_t granularity);
#ifdef CLEFRT_HAVE_CUDA
  std::vector<std::vector<std::vector<double>>> gpu_forward(const model::Batch& batch, std::vector<size_t>* cached) const;
  std::unique_ptr<StepRun> gpu_start(const model::Sequence& e) const;
  std::shared_ptr<const PrefixEntry> gpu_find(const int32_t* ids, int64_t limit) const;
  static std::function<std::shared_ptr<const CachedState>(const CachedState&)> host_copy_out();
  bool gpu_step(StepRun& r, int64_t tokens, int64_t layers) const;
  std::vector<std::vector<double>> gpu_finish(StepRun& r) const;
#endif
  mutable std::mutex observer_mu_;
  LinearInputObserver observer_;
};

}  // namespace clefrt

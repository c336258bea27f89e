// The memory an engine needs, from the config and the tensor headers alone: what `inspect`
// prints, and what loading checks before it reads a weight (a plan that does not fit is refused
// with its figure and what would fit, instead of failing an allocation minutes later).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/config.h"
#include "quant/mode.h"

namespace clefrt {

struct FolderSizes {
  double cpu_params = 0;   // parameters the CPU engine holds in fp32 (backbone + embeddings + head; no vision, no MTP)
  double head_params = 0;  // the joint head's
};
FolderSizes folder_sizes(const io::TensorStore& backbone, const io::TensorStore& head);

// Auto resolved: what the folder's Linears hold (bf16 for an unquantized folder).
QuantMode folder_quant(const model::ModelConfig& cfg);

// The CUDA engine's plan in bytes: the backbone's Linears in format q (the recipe's keep-list in
// bf16) + the joint head + the vision tower (bf16, when the config has one); embeddings in bf16
// on the GPU (none with offload); the activation arena for a batch of max_tokens tokens (64
// requests; the tower's scratch shares it), the lean one with offload; cuBLASLt's workspace and
// NVFP4's staging slots (none with the fused W4A16 GEMM).
// GPU memory the plan keeps free for what a first forward takes beyond it (kernels loaded on
// first use, cuBLASLt's state). Not measured yet: a bound above the ~20 MiB that was too little.
constexpr double kFirstForwardReserveBytes = double(size_t(128) << 20);
struct CudaPlan {
  double weights = 0, embeddings = 0, arena = 0, arena_lean = 0, workspaces = 0;
  double total(bool offload) const { return weights + workspaces + (offload ? arena_lean : arena + embeddings); }
};
CudaPlan cuda_plan(const model::ModelConfig& cfg, double head_params, QuantMode q, bool w4a16_fused, int64_t max_tokens);

std::string gib_text(double bytes);  // "13.92 GiB" / "512.00 MiB"

// MemAvailable of /proc/meminfo in bytes; negative where it cannot be read.
double host_memory_available();

// Throws a 503 "insufficient_memory" Error naming the plan's figure, what the device has and the
// options that would fit, when the CPU engine's fp32 weights or the CUDA plan for these options
// exceed what is free. `free_bytes` is the device's free memory (GPU) or MemAvailable (CPU).
struct PlanRequest {
  bool cuda = false;
  QuantMode quant = QuantMode::Auto;  // as asked (Auto: the folder's)
  bool offload = false, w4a16_fused = false, fp8_capable = true;
  int64_t max_tokens = 16384;
};
// With may_adjust (CUDA, the format and offload left to the engine), a plan that does not fit
// is not refused when another format / offload / W4A16 kernel at the same context fits: the
// first such one is returned (with why, for the log) and the caller loads that.
struct PlanChoice {
  QuantMode quant = QuantMode::Auto;
  bool offload = false, fused = false;
  std::string why;  // "bf16 needs 55.1 GiB, the GPU has 15.2 GiB free: nvfp4-w4a16 + offload (13.9 GiB)"
};
std::optional<PlanChoice> check_memory_fits(const model::ModelConfig& cfg, const FolderSizes& sizes, const PlanRequest& r,
                                            double free_bytes, bool may_adjust = false);

}  // namespace clefrt

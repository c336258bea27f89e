#include "engine/memory_plan.h"

#include <algorithm>
#include <optional>
#include <cstdio>
#include <vector>

#include "common/error.h"

#ifdef CLEFRT_HAVE_CUDA
#include "cuda/model/forward.h"
#include "cuda/model/qlinear.h"
#endif
#include "common/json.h"
#include "model/weights.h"
#include "quant/recipe.h"

namespace clefrt {

std::string gib_text(double bytes) {
  char buf[32];
  if (bytes < double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

FolderSizes folder_sizes(const io::TensorStore& backbone, const io::TensorStore& head) {
  FolderSizes f;
  for (const auto* t : backbone.all())
    if (t->name.rfind("model.visual.", 0) != 0 && t->name.rfind("mtp.", 0) != 0) f.cpu_params += double(t->numel());
  for (const auto* t : head.all()) {
    f.cpu_params += double(t->numel());
    f.head_params += double(t->numel());
  }
  return f;
}

QuantMode folder_quant(const model::ModelConfig& cfg) {
  if (!cfg.quantization) return QuantMode::BF16;
  const json::Value* f = cfg.quantization->find("format");
  if (f && f->is_string() && f->s == "float-quantized") return QuantMode::FP8;
  if (f && f->is_string() && f->s == "nvfp4-pack-quantized") {
    // W4A4 when the group quantizes input activations too
    if (const json::Value* groups = cfg.quantization->find("config_groups"); groups && groups->is_object())
      for (const auto& [name, g] : groups->obj)
        if (const json::Value* a = g.find("input_activations"); a && !a->is_null()) return QuantMode::NVFP4;
    return QuantMode::NVFP4_W4A16;
  }
  return QuantMode::BF16;
}

CudaPlan cuda_plan(const model::ModelConfig& cfg, double head_params, QuantMode q, bool w4a16_fused, int64_t max_tokens) {
  CudaPlan p;
#ifdef CLEFRT_HAVE_CUDA
  const model::TextWeights shapes = model::shape_only_text(cfg.text);
  double lin = 0, lin_rows = 0, other = 0;
  // a Linear in the format, or in bf16 where the recipe keeps it
  auto part = [&](const model::Tensor& t, const char* module) {
    if (quant::recipe_keeps_bf16(module)) {
      other += double(t.numel());
    } else {
      lin += double(t.numel());
      lin_rows += double(t.numel_rows());
    }
  };
  for (const auto& l : shapes.layers) {
    part(l.gate_proj, "gate_proj");
    part(l.up_proj, "up_proj");
    part(l.down_proj, "down_proj");
    if (l.type == model::LayerType::LinearAttention) {
      part(l.gdn.in_proj_qkv, "in_proj_qkv");
      part(l.gdn.in_proj_z, "in_proj_z");
      part(l.gdn.out_proj, "out_proj");
      part(l.gdn.in_proj_a, "in_proj_a");
      part(l.gdn.in_proj_b, "in_proj_b");
    } else {
      part(l.attn.q_proj, "q_proj");
      part(l.attn.k_proj, "k_proj");
      part(l.attn.v_proj, "v_proj");
      part(l.attn.o_proj, "o_proj");
    }
  }
  p.embeddings = double(shapes.embed.numel()) * 2 * (cfg.text.tie_word_embeddings ? 1 : 2);
  // the head's memory projection and memory key / value matrices fp32, the rest bf16 (as a bf16
  // file holds them; the vectors, fp32 on the GPU, are under 1% and counted as bf16)
  const double W = double(cfg.head.width);
  const double head_f32 = double(cfg.text.hidden) * W + double(cfg.head.routing_layers + cfg.head.layers) * 3 * W * W;
  // + the TF32 hi / lo planes of the memory projection and the memory k | v rows (DevLinear32::whi /
  // wlo), made where the head's wgmma GEMM runs (Hopper, not --portable-kernels); counted always (0.13 GiB at 27B)
  const double head_planes = (double(cfg.text.hidden) * W + double(cfg.head.routing_layers + cfg.head.layers) * 2 * W * W) * 8;
  const double head = head_f32 * 4 + (head_params - head_f32) * 2 + head_planes;
  const double per_weight = q == QuantMode::FP8 ? 1 : (q == QuantMode::NVFP4 || q == QuantMode::NVFP4_W4A16) ? 0.5625 : 2;
  // a row's scale (fp32); NVFP4 also its byte of the short-input GEMM's tables (DevLinearPart::rs,
  // whose per-gs tables and group sets are kilobytes a part)
  const double per_row = q == QuantMode::FP8 ? 4 : q == QuantMode::NVFP4 || q == QuantMode::NVFP4_W4A16 ? 5 : 0;
  // the vision tower stays bf16 whatever q is (its position table fp32)
  double vision = 0;
  if (cfg.vision.present) {
    const model::VisionWeights vs = model::shape_only_vision(cfg.vision);
    for (const model::Tensor* t : model::vision_tensors(vs)) vision += double(t->numel()) * (t == &vs.pos_embed ? 4 : 2);
  }
  p.weights = lin * per_weight + lin_rows * per_row + other * 2 + head + vision;
  cuda::ForwardOptions fo;
  fo.max_tokens = max_tokens;
  fo.max_seqs = 64;
  const VisionGeometry g;  // the processor's default largest image (the engine plans the folder's)
  fo.vision_patches = int64_t(g.max_pixels / (uint64_t(g.patch_size) * g.patch_size));
  const model::VisionConfig* vc = cfg.vision.present ? &cfg.vision : nullptr;
  p.arena = double(cuda::Forward::arena_bytes(cfg.text, cfg.head, fo, q, vc));
  cuda::use_lean_memory_plan(fo);  // what --offload-embeddings plans
  p.arena_lean = double(cuda::Forward::arena_bytes(cfg.text, cfg.head, fo, q, vc));
  const bool nvfp4 = q == QuantMode::NVFP4 || q == QuantMode::NVFP4_W4A16;
  // cuBLASLt's workspace, NVFP4's staging slots, and a reserve for what the first forward takes
  // beyond the plan (the CUDA runtime loads kernels when they first run, cuBLASLt its state): a
  // 27B engine loaded with ~20 MiB free failed in its first forward (bench/results/
  // 2026-12-03-h200-long-and-interleave.md); refused at load instead, with what would fit
  // (+ the short-input GEMM's stream-K partial sums, Nvfp4RsWork: a CTA's accumulators per SM, for
  // up to 144 SMs)
  p.workspaces = double(cuda::Forward::gemm_workspace_bytes()) +
                 (nvfp4 && !w4a16_fused ? 2.0 * double(cuda::LinearRunner::kStageBytes) + 144.0 * double(cuda::Nvfp4RsWork::kBytesPerSm) : 0.0) +
                 kFirstForwardReserveBytes;
#else
  (void)cfg;
  (void)head_params;
  (void)q;
  (void)w4a16_fused;
  (void)max_tokens;
#endif
  return p;
}

double host_memory_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

std::optional<PlanChoice> check_memory_fits(const model::ModelConfig& cfg, const FolderSizes& sizes, const PlanRequest& r,
                                            double free_bytes, bool may_adjust) {
  if (free_bytes < 0) return std::nullopt;  // unknown: nothing to check against
  if (!r.cuda) {
    const double need = sizes.cpu_params * 4;
    if (need <= free_bytes) return std::nullopt;
    throw Error(Status::Unavailable, "insufficient_memory",
                "the CPU engine holds the weights in fp32: " + gib_text(need) + " plus activations, and this machine has " +
                    gib_text(free_bytes) + " available: run it on a GPU (--device cuda), or on a machine with more memory");
  }
  const QuantMode q = r.quant == QuantMode::Auto ? folder_quant(cfg) : r.quant;
  const CudaPlan plan = cuda_plan(cfg, sizes.head_params, q, r.w4a16_fused, r.max_tokens);
  const double need = plan.total(r.offload);
  if (need <= free_bytes) return std::nullopt;
  // what would fit, cheapest change first: offload, then the fused W4A16 GEMM, then a lighter
  // format (converted at load), then a shorter context
  struct Alt {
    QuantMode q;
    bool offload, fused;
    int64_t tokens;
  };
  std::vector<Alt> alts;
  const QuantMode folder = folder_quant(cfg);
  std::vector<QuantMode> formats = {q};
  if (folder != QuantMode::NVFP4 && q != QuantMode::NVFP4_W4A16) {
    if (r.fp8_capable && q == QuantMode::BF16) formats.push_back(QuantMode::FP8);
    formats.push_back(QuantMode::NVFP4_W4A16);
  }
  for (QuantMode f : formats)
    for (int64_t tokens : {r.max_tokens, std::min<int64_t>(r.max_tokens, 4096)})
      for (bool off : {false, true})
        for (bool fused : {false, true}) {
          if (fused && f != QuantMode::NVFP4_W4A16 && f != QuantMode::NVFP4) continue;
          alts.push_back({f, off, fused, tokens});
        }
  if (may_adjust)
    for (const Alt& a : alts) {
      if (a.tokens != r.max_tokens) continue;  // never a shorter context than asked for
      const double n = cuda_plan(cfg, sizes.head_params, a.q, a.fused, a.tokens).total(a.offload);
      if (n > free_bytes) continue;
      PlanChoice c;
      c.quant = a.q;
      c.offload = a.offload;
      c.fused = a.fused;
      c.why = std::string(quant_mode_name(q)) + (r.offload ? " with offloaded embeddings" : "") + " needs " + gib_text(need) +
              " and the GPU has " + gib_text(free_bytes) + " free: " + quant_mode_name(a.q) + (a.offload ? " + offloaded embeddings" : "") +
              (a.fused ? " + the fused W4A16 GEMM" : "") + " (" + gib_text(n) + ")";
      return c;
    }
  std::string fits;
  int shown = 0;
  for (const Alt& a : alts) {
    const double n = cuda_plan(cfg, sizes.head_params, a.q, a.fused, a.tokens).total(a.offload);
    if (n > free_bytes || shown >= 3) continue;
    std::string flags = std::string("--quant ") + quant_mode_name(a.q);
    if (a.offload) flags += " --offload-embeddings";
    if (a.fused) flags += " --w4a16-fused";
    if (a.tokens != r.max_tokens) flags += " --max-length " + std::to_string(a.tokens);
    fits += (shown++ ? "; " : "") + flags + " (" + gib_text(n) + ")";
  }
  throw Error(Status::Unavailable, "insufficient_memory",
              std::string("this model needs ") + gib_text(need) + " of GPU memory in " + quant_mode_name(q) +
                  (r.offload ? " with offloaded embeddings" : "") + " for " + std::to_string(r.max_tokens) + "-token batches (weights " +
                  gib_text(plan.weights) + (r.offload ? "" : ", embeddings " + gib_text(plan.embeddings)) + ", activations " +
                  gib_text(r.offload ? plan.arena_lean : plan.arena) + ", workspaces " + gib_text(plan.workspaces) + ") and the GPU has " +
                  gib_text(free_bytes) + " free: " +
                  (fits.empty() ? std::string("no option of this engine fits it") : "what would fit: " + fits));
}

}  // namespace clefrt

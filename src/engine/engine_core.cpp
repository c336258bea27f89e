#include "engine/engine_core.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <optional>
#include <cstdio>
#include <filesystem>

#include "common/digest.h"
#include "common/error.h"
#include "common/json.h"
#include "common/log_event.h"
#include "common/progress.h"
#include "cpu/ops.h"
#include "engine/memory_plan.h"
#include "io/finite_check.h"
#include "image/preprocess.h"
#include "io/safetensors.h"
#include "model/sequence_forward.h"
#include "model/synth.h"
#include "model/vision.h"
#ifdef CLEFRT_HAVE_CUDA
#include "cuda/model/device_model.h"
#include "cuda/model/forward.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/cudnn_attention.h"
#include "cuda/runtime/hardware.h"
#include "cuda/runtime/power.h"
#endif

namespace clefrt {

namespace fs = std::filesystem;

#ifdef CLEFRT_HAVE_CUDA
// Before any weight is read: a GPU this build cannot run, or FP8 Linears on a GPU without FP8
// tensor cores, is refused with what would work instead.
void check_gpu_runs(const model::ModelConfig& cfg, const CoreOptions& opts) {
  cuda::check_device_supported(cuda_build_architectures());
  const cuda::DeviceInfo d = cuda::device_info();
  bool fp8 = opts.quant == QuantMode::FP8;
  if (opts.quant == QuantMode::Auto && cfg.quantization) {
    const json::Value* f = cfg.quantization->find("format");
    fp8 = f && f->is_string() && f->s == "float-quantized";
  }
  if (fp8 && d.capability() < 89)
    throw Error(Status::Unavailable, "device_unavailable",
                "FP8 Linears need FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, Blackwell); " + d.name +
                    " is " + std::to_string(d.major) + "." + std::to_string(d.minor) +
                    ": load a bf16 or NVFP4 folder, or convert at load with --quant bf16 or --quant nvfp4-w4a16");
}

struct GpuBackend {
  cuda::DevModel model;
  std::unique_ptr<cuda::Forward> forward;
  std::string attention_note;  // why the backbone's attention is clefrt's (empty: cuDNN's)

  // Weights in GPU memory as the options ask, and the forward planned for their batches.
  GpuBackend(const model::TextWeights& tw, const model::HeadWeights& hw, const model::VisionWeights* vw, const model::ModelConfig& cfg,
             const CoreOptions& opts, bool progress) {
    cuda::BuildOptions bo;
    bo.progress = progress;
    Progress up(progress, "upload weights", double(tw.layers.size()), "layers");
    bo.on_layer = [&up](size_t, size_t) { up.add(1); };
    bo.quant = opts.quant;
    bo.offload_embeddings = opts.offload_embeddings;
    bo.native_fp4 = opts.native_fp4 && !opts.portable_kernels;
    bo.head_tf32_planes = !opts.portable_kernels;
    bo.w4a16_rs = !opts.portable_kernels && !opts.w4a16_fused;
    model = cuda::build_device_model(tw, hw, cfg.text, cfg.head, bo, vw, vw ? &cfg.vision : nullptr);
    cuda::ForwardOptions fo;
    fo.max_tokens = opts.max_batch_tokens > 0 ? opts.max_batch_tokens : int64_t(opts.encode.max_length);
    fo.max_seqs = opts.max_batch_requests;
    fo.batch_invariant = opts.batch_invariant;
    fo.w4a16_fused = opts.w4a16_fused;
    fo.portable_kernels = opts.portable_kernels;
    fo.graph_after = opts.cuda_graphs;
    // the attention kernel: cuDNN's where asked or (auto) where it loads; refused when asked and
    // absent (Forward names why); the choice and the reason are in describe()
    std::string no_cudnn;
    const bool has_cudnn = cuda::cudnn_available(&no_cudnn);
    fo.cudnn_attention = opts.attention == AttentionKernel::Cudnn || (opts.attention == AttentionKernel::Auto && has_cudnn);
    attention_note = fo.cudnn_attention ? "" : opts.attention == AttentionKernel::Clefrt ? " (--attention clefrt)" : " (cuDNN: " + no_cudnn + ")";
    const VisionGeometry& g = opts.encode.vision;
    fo.vision_patches = int64_t(g.max_pixels / (uint64_t(g.patch_size) * g.patch_size));
    if (opts.offload_embeddings) cuda::use_lean_memory_plan(fo);
    forward = std::make_unique<cuda::Forward>(model, fo);
  }
};
#else
struct GpuBackend {};
#endif

EngineCore::EngineCore() = default;
EngineCore::~EngineCore() = default;

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : d == Device::Cpu ? "cpu" : "auto"; }

const char* attention_kernel_name(AttentionKernel a) {
  return a == AttentionKernel::Cudnn ? "cudnn" : a == AttentionKernel::Clefrt ? "clefrt" : "auto";
}

AttentionKernel parse_attention_kernel(const std::string& name) {
  if (name == "auto") return AttentionKernel::Auto;
  if (name == "cudnn") return AttentionKernel::Cudnn;
  if (name == "clefrt") return AttentionKernel::Clefrt;
  throw Error(Status::BadRequest, "invalid_request", "attention kernel \"" + name + "\": expected auto, cudnn or clefrt");
}

bool cuda_available(std::string* reason) {
#ifdef CLEFRT_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (reason) {
      // the runtime reports a machine without the NVIDIA driver as an old driver: say what it is
      if (e == cudaErrorInsufficientDriver && !fs::exists("/dev/nvidiactl") && !fs::exists("/dev/nvidia0"))
        *reason = "no NVIDIA GPU driver on this machine (no /dev/nvidia*)";
      else
        *reason = e != cudaSuccess ? std::string("no usable GPU: ") + cudaGetErrorString(e) : "no GPU found";
    }
    cudaGetLastError();
    return false;
  }
  return true;
#else
  if (reason) *reason = "this build has no CUDA backend (nvcc was not found when it was configured)";
  return false;
#endif
}

GpuInfo gpu_info() {
#ifdef CLEFRT_HAVE_CUDA
  std::string why;
  if (!cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", why);
  const cuda::DeviceInfo d = cuda::device_info();
  return GpuInfo{d.name, d.major, d.minor, d.mem_total_gib};
#else
  throw Error(Status::Unavailable, "device_unavailable", "this build has no CUDA backend");
#endif
}

GpuPower gpu_power() {
  GpuPower out;
#ifdef CLEFRT_HAVE_CUDA
  std::string why;
  if (!cuda_available(&why)) {
    out.why = why;
    return out;
  }
  const cuda::PowerReading r = cuda::read_power();
  out.available = r.available;
  out.why = r.why;
  out.energy_j = r.energy_j;
  out.sm_clock_mhz = r.sm_clock_mhz;
  out.power_w = r.power_w;
  out.power_capped = r.power_capped;
#else
  out.why = "this build has no CUDA backend";
#endif
  return out;
}

void gpu_profiler_range(bool start) {
#ifdef CLEFRT_HAVE_CUDA
  std::string why;
  if (!cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", why);
  cuda::profiler_range(start);
#else
  (void)start;
  throw Error(Status::Unavailable, "device_unavailable", "this build has no CUDA backend");
#endif
}

Hardware measure_hardware() {
#ifdef CLEFRT_HAVE_CUDA
  std::string why;
  if (!cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", why);
  const cuda::HardwareLimits h = cuda::measure_hardware();
  Hardware out;
  out.gpu = h.gpu;
  out.mem_total_gib = h.mem_total_gib;
  out.peak_bf16_tflops = h.peak_bf16_tflops;
  out.copy_gbps = h.copy_gbps;
  return out;
#else
  throw Error(Status::Unavailable, "device_unavailable", "this build has no CUDA backend");
#endif
}

std::shared_ptr<void> hold_gpu_memory_beyond(double card_gib, double* held_gib) {
#ifdef CLEFRT_HAVE_CUDA
  if (!cuda_available()) throw Error(Status::Unavailable, "device_unavailable", "no CUDA device to limit");
  cuda::trim_stack_reservation();
  size_t free_b = 0, total = 0;  // what is in use now counts against the card: hold total - card
  cuda::check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  const double gib = double(1ull << 30), extra = double(total) - card_gib * gib;
  if (extra < 0)
    throw Error(Status::BadRequest, "usage", "this GPU has " + std::to_string(double(total) / gib) + " GiB, less than the " +
                                                 std::to_string(card_gib) + " GiB asked for");
  void* p = nullptr;
  const size_t bytes = size_t(extra) / (2u << 20) * (2u << 20);
  if (bytes) cuda::check(cudaMalloc(&p, bytes), "holding GPU memory beyond the card limit");
  if (held_gib) *held_gib = double(bytes) / gib;
  return std::shared_ptr<void>(p, [](void* q) { if (q) cudaFree(q); });
#else
  (void)card_gib;
  (void)held_gib;
  throw Error(Status::Unavailable, "device_unavailable", "this build has no CUDA");
#endif
}

double gpu_memory_in_use_gib() {
#ifdef CLEFRT_HAVE_CUDA
  if (!cuda_available()) return 0;
  cuda::trim_stack_reservation();  // as loading does, so that figures before and after compare
  return cuda::gpu_used_gib();
#else
  return 0;
#endif
}

size_t EngineCore::gpu_bytes() const {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) return gpu_->model.weight_bytes + gpu_->forward->working_bytes();
#endif
  return 0;
}

PrefixCacheStats EngineCore::prefix_cache_stats() const { return cache_ ? cache_->stats() : PrefixCacheStats{}; }

MemoryUse EngineCore::memory() const {
  MemoryUse m;
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) {
    const cuda::DevModel& d = gpu_->model;
    m.weights = d.weight_bytes;
    m.weights_reserved = d.weight_reserved_bytes;
    m.weights_host = d.host_weight_bytes;
    m.working = gpu_->forward->working_bytes();
    m.linear_bf16 = d.bytes_by_format[0];
    m.linear_nvfp4 = d.bytes_by_format[1];
    m.linear_fp8 = d.bytes_by_format[2];
  }
#endif
  return m;
}

double EngineCore::forward_flops(const std::vector<int64_t>& lengths) const {
  const auto& c = cfg_.text;
  const auto& h = cfg_.head;
  const double H = double(c.hidden), key_dim = double(c.k_heads * c.k_head_dim), value_dim = double(c.v_heads * c.v_head_dim);
  double per_token = 0, attn_layers = 0;
  for (auto t : c.layer_types) {
    per_token += 3 * H * double(c.ffn);
    if (t == model::LayerType::LinearAttention)
      per_token += H * (2 * key_dim + 2 * value_dim + 2 * double(c.v_heads)) + value_dim * H;
    else {
      per_token += H * double(c.q_heads * 2 * c.head_dim + 2 * c.kv_heads * c.head_dim) + double(c.q_heads * c.head_dim) * H;
      attn_layers += 1;
    }
  }
  per_token += double(h.hidden) * double(h.width) + double(h.routing_layers + h.layers) * 2.0 * double(h.width) * double(h.width);
  double f = 0;
  for (int64_t L : lengths) {
    f += 2.0 * per_token * double(L);
    f += attn_layers * 4.0 * double(c.q_heads * c.head_dim) * double(L) * double(L + 1) / 2.0;
  }
  return f;
}

const char* EngineCore::format() const {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) {
    if (opts_.quant != QuantMode::Auto) return quant_mode_name(opts_.quant);
    const auto& b = gpu_->model.bytes_by_format;  // bf16, nvfp4, fp8
    const int kinds = (b[0] > 0) + (b[1] > 0) + (b[2] > 0);
    if (kinds > 1) return "mixed";
    if (b[1] > 0) return gpu_->model.has_w4a4 ? "nvfp4" : "nvfp4-w4a16";
    if (b[2] > 0) return "fp8";
    return "bf16";
  }
#endif
  return "f32";
}

void EngineCore::set_profile(ProfileDetail detail) {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) gpu_->forward->set_profile(detail);
#endif
  (void)detail;
}

std::vector<std::pair<std::string, double>> EngineCore::profile() const {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) return gpu_->forward->profile();
#endif
  return {};
}

void EngineCore::clear_profile() {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) gpu_->forward->clear_profile();
#endif
}

std::string EngineCore::gpu_summary() const {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) {
    const cuda::DevModel& m = gpu_->model;
    auto gib = [](size_t b) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(size_t(1) << 30));
      return std::string(buf);
    };
    const cuda::DeviceInfo d = cuda::device_info();
    const bool wgmma = !opts_.portable_kernels && cuda::nvfp4_gemm_wgmma_available();
    char gpu[320];
    std::snprintf(gpu, sizeof gpu, "GPU %s (compute capability %d.%d, %.1f GiB); kernels: W4A16 GEMM %s, W4A4 %s, GDN scan %s, head token rows %s, attention ",
                  d.name.c_str(), d.major, d.minor, d.mem_total_gib, wgmma ? "wgmma + TMA" : "mma.sync", m.has_native_fp4 ? "FP4 tensor cores" : "emulated",
                  gpu_->forward->gdn_kernel().c_str(), gpu_->forward->head_kernel().c_str());
    std::string s = std::string(gpu) + gpu_->forward->attention_kernel() + gpu_->attention_note + "; quant " + quant_mode_name(opts_.quant) + ": Linears bf16 " + gib(m.bytes_by_format[0]) + ", nvfp4 " +
                    gib(m.bytes_by_format[1]) + (m.has_w4a4 ? " (W4A4)" : "") + ", fp8 " + gib(m.bytes_by_format[2]) + "; weights " +
                    gib(m.weight_bytes) + " on the GPU" + (m.host_weight_bytes ? ", " + gib(m.host_weight_bytes) + " in pinned host memory" : "") +
                    "; activations + workspaces " + gib(gpu_->forward->working_bytes());
    return s;
  }
#endif
  return "";
}

namespace {
std::string host_tier_on_cpu() {
  return "--prefix-cache-host-gib is a GPU engine's second tier; the CPU engine's prefix cache is in host memory already "
         "(--prefix-cache-gib)";
}
// The host tier's budget against the host memory available: at most half of it.
void check_host_tier_budget(size_t bytes) {
  const double avail = host_memory_available();
  if (bytes == 0 || avail < 0 || double(bytes) <= avail / 2) return;
  throw Error(Status::Unavailable, "insufficient_memory",
              "--prefix-cache-host-gib " + json::float_repr(double(bytes) / double(size_t(1) << 30)) +
                  " is over half of the host memory available (" + std::to_string(int64_t(avail / double(1 << 20))) + " MiB): ask for less");
}
}  // namespace

std::unique_ptr<EngineCore> EngineCore::load(const std::string& dir, CoreOptions opts) {
  if (opts.threads > 0) omp_set_num_threads(opts.threads);
  if (opts.device != Device::Cuda) cpu::keep_freed_memory();
  auto e = std::unique_ptr<EngineCore>(new EngineCore());
  e->opts_ = opts;
  std::string why;
  e->cfg_ = model::load_config(dir);
  if (!opts.vision) e->cfg_.vision.present = false;  // text only: nothing of the tower is planned or read
  model::QuantActivations qa;
  if (e->cfg_.quantization) {
    // compressed-tensors checkpoints (spec/quant.md): NVFP4 (W4A16 / W4A4 by input_global_scale)
    // and FP8 run on the CPU engine, dequantized at load; each tensor is read by what it holds.
    const json::Value& q = *e->cfg_.quantization;
    const json::Value* method = q.find("quant_method");
    const json::Value* format = q.find("format");
    const std::string where = (fs::path(dir) / "config.json").string();
    if (!method || !method->is_string() || method->s != "compressed-tensors")
      throw load_error(where, "quantization_config.quant_method must be \"compressed-tensors\" (the formats clefrt reads)");
    const std::string f = format && format->is_string() ? format->s : "";
    if (f != "nvfp4-pack-quantized" && f != "float-quantized" && f != "mixed-precision")
      throw load_error(where, "quantization_config.format \"" + f + "\" is not supported (nvfp4-pack-quantized, float-quantized, mixed-precision)");
    if (const json::Value* groups = q.find("config_groups"); groups && groups->is_object())
      for (const auto& [name, g] : groups->obj) {
        const json::Value* w = g.find("weights");
        const json::Value* a = g.find("input_activations");
        const bool fp8 = w && w->find("num_bits") && w->find("num_bits")->i == 8;
        if (fp8 && a && a->is_object()) {
          const json::Value* dyn = a->find("dynamic");
          if (dyn && dyn->kind == json::Value::Kind::Bool && dyn->b) qa.fp8_dynamic = true;
          else throw load_error(where, "config_groups." + name + ": static FP8 input activations are not supported yet");
        }
      }
  }
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load((fs::path(dir) / "tokenizer.json").string()));
  if (int64_t(e->tok_->vocab_size()) > e->cfg_.text.vocab)
    throw load_error((fs::path(dir) / "tokenizer.json").string(),
                     "tokenizer has ids up to " + std::to_string(e->tok_->vocab_size() - 1) + " but the model's vocab_size is " +
                         std::to_string(e->cfg_.text.vocab));
  opts.encode.vision = VisionGeometry::from_model_dir(dir);
  e->encoder_ = std::make_unique<Encoder>(*e->tok_, opts.encode);
  if (!opts.load_weights) return e;
  if (opts.device == Device::Cuda && !cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", "--device cuda: " + why);
#ifdef CLEFRT_HAVE_CUDA
  if (opts.device == Device::Cuda) check_gpu_runs(e->cfg_, opts);
#endif
  io::TensorStore backbone = io::TensorStore::open_folder(dir);
  io::TensorStore head;
  fs::path hp = fs::path(dir) / "joint_head.safetensors";
  if (!fs::exists(hp)) throw load_error(hp.string(), "missing: a Clef folder holds the joint head here");
  head.add_file(hp.string());
  if (opts.device == Device::Cpu) {
    if (opts.quant != QuantMode::Auto)
      throw Error(Status::BadRequest, "usage", std::string("--quant ") + quant_mode_name(opts.quant) +
                                                   " is a CUDA option; the CPU engine runs what the folder holds (leave --quant out)");
    if (opts.offload_embeddings) throw Error(Status::BadRequest, "usage", "--offload-embeddings is a CUDA option");
    // the other CUDA options are refused too rather than ignored: a flag that does nothing is a
    // wrong belief about what ran
    if (opts.w4a16_fused) throw Error(Status::BadRequest, "usage", "--w4a16-fused is a CUDA option (the CPU engine dequantizes NVFP4 at load)");
    if (opts.portable_kernels) throw Error(Status::BadRequest, "usage", "--portable-kernels is a CUDA option");
    // 0 (off) is what the CPU engine does anyway; another count asks for graphs it has none of
    if (opts.cuda_graphs != 0 && opts.cuda_graphs != int64_t(kCudaGraphsAfter))
      throw Error(Status::BadRequest, "usage", "--cuda-graphs is a CUDA option");
    if (opts.attention != AttentionKernel::Auto)
      throw Error(Status::BadRequest, "usage", "--attention picks a CUDA kernel; the CPU engine has one attention (leave --attention out)");
    if (!opts.batch_invariant)
      throw Error(Status::BadRequest, "usage", "--no-batch-invariant is a CUDA option (the CPU engine's answers are always batch-invariant)");
    if (opts.prefix_cache_host_bytes > 0) throw Error(Status::BadRequest, "usage", host_tier_on_cpu());
  }
  check_host_tier_budget(opts.prefix_cache_host_bytes);  // before the weights go anywhere
  {  // does the plan fit? (headers only; refused now rather than by an allocation minutes later)
    PlanRequest pr;
    pr.cuda = opts.device == Device::Cuda;
    pr.quant = opts.quant;
    pr.offload = opts.offload_embeddings;
    pr.w4a16_fused = opts.w4a16_fused;
    pr.max_tokens = opts.max_batch_tokens > 0 ? opts.max_batch_tokens : int64_t(opts.encode.max_length);
    double free_bytes = host_memory_available();
#ifdef CLEFRT_HAVE_CUDA
    if (pr.cuda) {
      free_bytes = cuda::gpu_free_bytes();
      pr.fp8_capable = cuda::device_info().capability() >= 89;
    }
#endif
    const bool may_adjust = pr.cuda && opts.fit_memory && opts.quant == QuantMode::Auto && !opts.offload_embeddings && !opts.w4a16_fused;
    if (const auto c = check_memory_fits(e->cfg_, folder_sizes(backbone, head), pr, free_bytes, may_adjust)) {
      opts.quant = c->quant;
      opts.offload_embeddings = c->offload;
      opts.w4a16_fused = c->fused;
      e->opts_ = opts;
      if (opts.progress)
        log_event(std::string("\"event\":\"fit\",\"quant\":\"") + quant_mode_name(c->quant) + "\",\"offload_embeddings\":" +
                  (c->offload ? "true" : "false") + ",\"w4a16_fused\":" + (c->fused ? "true" : "false") +
                  ",\"why\":" + json::write(json::Value::string(c->why)));
    }
  }
  if (opts.check_weights) {
    Progress p(opts.progress, "check weights", double(backbone.total_bytes() + head.total_bytes()), "GB");
    io::check_finite(backbone, [&](size_t b) { p.add(double(b)); });
    io::check_finite(head, [&](size_t b) { p.add(double(b)); });
  }
  if (opts.device == Device::Cpu) {
    Progress p(opts.progress, "weights to fp32", double(backbone.total_bytes() + head.total_bytes()), "GB");
    e->text_ = model::load_text_weights(backbone, e->cfg_.text, model::LoadMode::Full, qa);
    e->head_ = model::load_head_weights(head, e->cfg_.head);
    if (opts.vision && backbone.find("model.visual.patch_embed.proj.weight")) {
      e->vision_ = model::load_vision_weights(backbone, e->cfg_.vision);
      e->has_vision_ = true;
    }
    p.add(double(backbone.total_bytes() + head.total_bytes()));
    e->make_prefix_cache(host_memory_available(), "host memory", model::kChunkTokens);
    return e;
  }
#ifdef CLEFRT_HAVE_CUDA
  // Checked lazily (no fp32 copy), uploaded as bf16; the mapped files close after the upload.
  const auto tw = model::load_text_weights(backbone, e->cfg_.text, model::LoadMode::Lazy, qa);
  const auto hw = model::load_head_weights(head, e->cfg_.head, model::LoadMode::Lazy);
  std::optional<model::VisionWeights> vw;
  if (opts.vision && backbone.find("model.visual.patch_embed.proj.weight"))
    vw = model::load_vision_weights(backbone, e->cfg_.vision, model::LoadMode::Lazy);
  e->gpu_ = std::make_unique<GpuBackend>(tw, hw, vw ? &*vw : nullptr, e->cfg_, opts, opts.progress);
  e->has_vision_ = vw.has_value();
  e->make_prefix_cache(cuda::gpu_free_bytes(), "GPU memory", cuda::kPrefixGranularity);
#endif
  return e;
}

// The budget asked for (or the default), held to half of the memory left after the weights:
// over it the default shrinks (logged with progress), an explicit budget is refused.
void EngineCore::make_prefix_cache(double avail, const char* where, int64_t granularity) {
  size_t budget = opts_.prefix_cache_bytes;
  if (budget == 0) return;
  if (avail >= 0 && double(budget) > avail / 2) {
    const std::string left = std::to_string(int64_t(avail / double(1 << 20))) + " MiB";
    if (!opts_.prefix_cache_default)
      throw Error(Status::Unavailable, "insufficient_memory",
                  "--prefix-cache-gib " + json::float_repr(double(budget) / double(size_t(1) << 30)) + " is over half of the " + where +
                      " left after the weights (" + left + "): ask for less, or 0 to turn the cache off");
    budget = size_t(avail / 2);
    if (opts_.progress)
      log_event("\"event\":\"prefix_cache\",\"budget_bytes\":" + std::to_string(budget) + ",\"why\":" +
                json::write(json::Value::string("the default 4 GiB is over half of the " + left + " " + where + " left after the weights")));
  }
  if (budget == 0) return;
  HostTier host;  // asked for on a GPU engine only (load() and synthetic() checked it)
#ifdef CLEFRT_HAVE_CUDA
  if (opts_.prefix_cache_host_bytes > 0 && gpu_) {
    host.budget_bytes = opts_.prefix_cache_host_bytes;
    host.copy_out = host_copy_out();
  }
#endif
  cache_ = std::make_unique<PrefixCache>(budget, granularity, std::move(host));
}

std::unique_ptr<EngineCore> EngineCore::tokenizer_only(const std::string& tokenizer, CoreOptions opts) {
  auto e = std::unique_ptr<EngineCore>(new EngineCore());
  opts.load_weights = false;
  e->opts_ = opts;
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer));
  e->encoder_ = std::make_unique<Encoder>(*e->tok_, opts.encode);
  return e;
}

std::unique_ptr<EngineCore> EngineCore::synthetic(const std::string& preset, const std::string& tokenizer, CoreOptions opts) {
#ifdef CLEFRT_HAVE_CUDA
  std::string why;
  if (!cuda_available(&why)) throw Error(Status::Unavailable, "device_unavailable", "--synthetic needs a GPU: " + why);
  check_host_tier_budget(opts.prefix_cache_host_bytes);
  auto e = std::unique_ptr<EngineCore>(new EngineCore());
  opts.device = Device::Cuda;
  e->opts_ = opts;
  e->cfg_ = model::synthetic_config(preset);
  if (!opts.vision) e->cfg_.vision.present = false;
  check_gpu_runs(e->cfg_, opts);
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer));
  e->encoder_ = std::make_unique<Encoder>(*e->tok_, opts.encode);
  const auto tw = model::shape_only_text(e->cfg_.text);
  const auto hw = model::shape_only_head(e->cfg_.head);
  std::optional<model::VisionWeights> vw;
  if (e->cfg_.vision.present) vw = model::shape_only_vision(e->cfg_.vision);
  e->gpu_ = std::make_unique<GpuBackend>(tw, hw, vw ? &*vw : nullptr, e->cfg_, opts, true);
  e->has_vision_ = vw.has_value();
  e->make_prefix_cache(cuda::gpu_free_bytes(), "GPU memory", cuda::kPrefixGranularity);
  return e;
#else
  (void)preset;
  (void)tokenizer;
  (void)opts;
  throw Error(Status::BadRequest, "usage", "--synthetic needs the CUDA backend; this build has none");
#endif
}

std::vector<std::vector<std::vector<double>>> EngineCore::probs(const model::Batch& batch, model::GdnForm form,
                                                                std::vector<size_t>* cached_tokens) const {
  std::vector<size_t> cached(batch.size(), 0);
  auto out = forward(batch, form, &cached);
  if (cached_tokens) *cached_tokens = cached;
  for (size_t k = 0; k < out.size(); ++k)
    for (size_t q = 0; q < out[k].size(); ++q)
      for (double p : out[k][q])
        if (!std::isfinite(p)) throw_non_finite(batch[k], q);
  return out;
}

// Runs the request again alone with a finiteness check after each stage, to say where it went
// wrong. Only on this failure path: the normal forward pays nothing for it.
void EngineCore::throw_non_finite(const model::Sequence& e, size_t question) const {
  std::string where;
  const int64_t n = int64_t(cfg_.text.layer_types.size());
  int64_t layer = -2;  // -2: the backbone stayed finite
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) layer = gpu_->forward->first_non_finite_layer({e});
#endif
  if (!gpu_) {
    const std::vector<int64_t> offsets = {0, e.length};
    layer = model::first_non_finite_layer(text_, cfg_.text, std::vector<int32_t>(e.ids, e.ids + e.length), offsets, e.media);
  }
  if (layer == -1) where = e.media ? "in the token embeddings or the image rows (the vision tower's output)" : "in the token embeddings";
  else if (layer >= 0 && layer < n)
    where = "after backbone layer " + std::to_string(layer) + " (" +
            (cfg_.text.layer_types[size_t(layer)] == model::LayerType::LinearAttention ? "linear_attention" : "full_attention") +
            "; layers are numbered 0 to " + std::to_string(n - 1) + " as in the weight names)";
  else if (layer == n) where = "in the backbone's final norm";
  else where = "in the joint head (question " + std::to_string(question) + "), the backbone's hidden states being finite";
  throw Error(Status::Internal, "non_finite",
              "the forward produced non-finite values " + where +
                  ": the weights hold NaN or infinity (loading with the weight check on finds which tensor) or the activations overflowed");
}

void EngineCore::set_linear_input_observer(LinearInputObserver o) {
  if (gpu_ && o) throw Error(Status::BadRequest, "usage", "Linear input observers run on the CPU engine only (open it with device = cpu)");
  std::lock_guard<std::mutex> lock(observer_mu_);
  observer_ = std::move(o);
}

namespace {
struct CpuPrefixState : CachedState {
  model::PrefixState s;
  size_t bytes() const override { return s.bytes(); }
};

// What a CPU forward sets on the thread it runs on: OpenMP's thread count is per thread (the
// thread that runs forwards, the server's engine thread or a Python caller's, is not the one
// that loaded the engine), and so is the model's Linear-input observer (calibration).
struct CpuThreadScope {
  CpuThreadScope(int threads, const LinearInputObserver& o) : observer(o) {
    if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
    if (observer) model::set_activation_observer(&CpuThreadScope::call, &observer);
  }
  ~CpuThreadScope() { model::set_activation_observer(nullptr, nullptr); }
  static void call(void* ctx, const model::Tensor& w, const float* x, int64_t rows, int64_t cols) {
    (*static_cast<LinearInputObserver*>(ctx))(w.name, x, rows, cols);
  }
  LinearInputObserver observer;
};
}  // namespace

LinearInputObserver EngineCore::observer() const {
  std::lock_guard<std::mutex> lock(observer_mu_);
  return observer_;
}

std::shared_ptr<const ImageMedia> EngineCore::image_media(const Request& req, const Encoded& e) const {
  if (req.images.empty()) return nullptr;
  if (!opts_.load_weights) throw Error(Status::Unavailable, "unavailable", "this engine was opened without its weights");
  if (!opts_.vision)
    throw Error(Status::Unprocessable, "unsupported",
                "this engine was opened text only (--no-vision / vision=False): open it with its vision tower to send images", "images");
  if (!has_vision_) throw Error(Status::Unprocessable, "unsupported", "this model folder has no vision tower (model.visual.*)", "images");
  if (e.images.size() != req.images.size())
    throw Error(Status::Internal, "internal_error", "image_media: the encoding does not hold the request's images");
  CpuThreadScope scope(opts_.threads, {});
  auto m = std::make_shared<ImageMedia>();
  m->patches.reserve(req.images.size());  // the spans point into it
  std::vector<model::MediaSpan> spans;
  const VisionGeometry& g = encoder_->options().vision;
  const int64_t H = cfg_.text.hidden, merge = int64_t(g.merge_size);
  for (size_t i = 0; i < req.images.size(); ++i) {
    const std::string where = "images[" + std::to_string(i) + "]";
    // validation held each header to the protocol's pixel limit, which is under the processor's
    // the GPU normalises and cuts the resized image itself
    model::ImagePatches p = preprocess_image(req.images[i], g, g.max_pixels, where, gpu_ != nullptr);
    const EncodedImage& ei = e.images[i];
    if (p.grid_h != ei.grid_h || p.grid_w != ei.grid_w)
      throw unprocessable(where, "the decoded image has a " + std::to_string(p.grid_w) + "x" + std::to_string(p.grid_h) +
                                     "-patch grid but its header promised " + std::to_string(ei.grid_w) + "x" + std::to_string(ei.grid_h));
    const int64_t count = int64_t(ei.pad_span.end - ei.pad_span.begin);
    if (gpu_) {  // the forward runs the tower on the GPU
      if (p.grid_t * p.grid_h * p.grid_w != count * merge * merge)
        throw Error(Status::Internal, "internal_error", "image_media: the patches do not fill " + where + "'s pad tokens");
      m->patches.push_back(std::move(p));
      spans.push_back({int64_t(ei.pad_span.begin), m->patches.back().grid_h / merge, m->patches.back().grid_w / merge, nullptr,
                       &m->patches.back()});
      continue;
    }
    m->rows.push_back(model::vision_forward(vision_, cfg_.vision, p));
    if (int64_t(m->rows.back().size()) != count * H)
      throw Error(Status::Internal, "internal_error", "image_media: the tower's rows do not fill " + where + "'s pad tokens");
    spans.push_back({int64_t(ei.pad_span.begin), p.grid_h / merge, p.grid_w / merge, m->rows.back().data()});
  }
  m->media = model::mrope_positions(int64_t(e.input_ids.size()), spans);
  m->media.key_ids = e.input_ids;
  for (size_t i = 0; i < req.images.size(); ++i) {
    const std::string hex = sha256_hex(req.images[i].bytes);
    const Span pads = e.images[i].pad_span;
    for (int64_t w = 0; w < 8 && pads.begin + w < pads.end; ++w)
      m->media.key_ids[size_t(pads.begin + w)] = int32_t(0x80000000u | uint32_t(std::stoul(hex.substr(size_t(8 * w), 8), nullptr, 16)));
  }
  return m;
}

#ifdef CLEFRT_HAVE_CUDA
namespace {
struct GpuPrefixState : CachedState {
  cuda::DevPrefixState s;
  size_t bytes() const override { return s.buf.bytes(); }
};

// A GPU prefix state copied to the host tier (EngineOptions::prefix_cache_host_gib): its bytes
// in pinned host memory, its length and layout as they were.
struct HostPrefixState : CachedState {
  int64_t length = 0, capacity = 0;
  cuda::HostBuffer buf;
  size_t bytes() const override { return buf.bytes(); }
};

// A whole-chunk boundary that is not inside an image (the tower's rows of an image are all or
// nothing): `limit` rounded down, moved before every image it would cut, or (later) after them,
// no further than `cap`.
int64_t chunk_boundary(const model::Sequence& e, int64_t limit, int64_t granularity, bool later = false, int64_t cap = 0) {
  if (!later) limit = limit / granularity * granularity;
  for (bool moved = e.media != nullptr; moved && !(later && limit >= cap);) {  // one move may land inside another image
    moved = false;
    for (const model::SequenceMedia::Image& im : e.media->images)
      if (im.first < limit && limit < im.first + im.count) {
        limit = later ? std::min(cap, (im.first + im.count + granularity - 1) / granularity * granularity) : im.first / granularity * granularity;
        moved = true;
      }
  }
  return limit;
}
// Where a request's cached prefix may end: its prefix limit, short of its last token.
int64_t prefix_boundary(const model::Sequence& e, int64_t granularity) {
  return chunk_boundary(e, std::min(e.prefix_limit, e.length - 1), granularity);
}
const int64_t kG = cuda::kPrefixGranularity;

cuda::DevPrefixState new_state(const cuda::DevModel& m, int64_t capacity, const char* what) {
  cuda::DevPrefixState st;
  st.capacity = capacity;
  st.buf = cuda::DeviceBuffer(cuda::PrefixLayout::of(m, capacity).bytes, what);
  return st;
}
}  // namespace

// A prefix the cache's GPU budget evicts, copied into pinned host memory (null without room
// there: it goes). The state is complete: a forward that wrote it has returned.
std::function<std::shared_ptr<const CachedState>(const CachedState&)> EngineCore::host_copy_out() {
  return [](const CachedState& c) -> std::shared_ptr<const CachedState> {
    const auto& g = static_cast<const GpuPrefixState&>(c);
    try {
      auto h = std::make_shared<HostPrefixState>();
      h->length = g.s.length;
      h->capacity = g.s.capacity;
      h->buf = cuda::HostBuffer(g.s.buf.bytes(), "prefix cache host tier");
      cuda::check(cudaMemcpy(h->buf.host(), g.s.buf.get(), g.s.buf.bytes(), cudaMemcpyDeviceToHost), "prefix cache entry to host memory");
      return h;
    } catch (const std::exception&) {  // no pinned memory for it (Error) or no host memory at all
      cudaGetLastError();
      return nullptr;
    }
  };
}

// The longest cached prefix in either tier (PrefixCache::find); a host-tier one is copied back
// into GPU memory as an entry of its own (the same bytes) or, without room there, is a miss.
std::shared_ptr<const PrefixEntry> EngineCore::gpu_find(const int32_t* ids, int64_t limit) const {
  for (;;) {
    std::shared_ptr<const PrefixEntry> e = cache_->find(ids, limit);
    if (!e || !e->host) return e;
    const auto& h = static_cast<const HostPrefixState&>(*e->state);
    const int64_t n = int64_t(e->ids.size());
    std::shared_ptr<const PrefixEntry> back;
    if (cache_->make_room(n, h.buf.bytes())) {
      try {
        auto st = std::make_shared<GpuPrefixState>();
        st->s.length = h.length;
        st->s.capacity = h.capacity;
        st->s.buf = cuda::DeviceBuffer(h.buf.bytes(), "prefix cache entry back from host memory");
        cuda::check(cudaMemcpy(st->s.buf.get(), h.buf.host(), h.buf.bytes(), cudaMemcpyHostToDevice),
                    "prefix cache entry back from host memory");
        back = cache_->insert(ids, n, std::move(st));
      } catch (const Error&) {
        cudaGetLastError();  // out of GPU memory: computed instead
      }
    }
    if (back) return back;
    cache_->copy_back_failed(*e);
    limit = n - cache_->granularity();  // a shorter prefix may still be in GPU memory
  }
}

// The GPU forward with the prefix cache: per request the longest cached prefix it starts with
// (it computes only the rest) and, when its own prefix is longer and would be kept, a new state
// the forward fills as it goes. Entries are GPU memory; a request that cannot get one runs
// uncached.
std::vector<std::vector<std::vector<double>>> EngineCore::gpu_forward(const model::Batch& batch, std::vector<size_t>* cached) const {
  if (!cache_) return gpu_->forward->run(batch);
  const int64_t G = cache_->granularity();
  std::vector<cuda::SeqPrefix> pre(batch.size());
  std::vector<std::shared_ptr<const PrefixEntry>> held(batch.size());  // not evicted while this runs
  std::vector<std::shared_ptr<GpuPrefixState>> keep(batch.size());
  std::vector<int64_t> at(batch.size(), 0);
  for (size_t k = 0; k < batch.size(); ++k) {
    const model::Sequence& e = batch[k];
    const int64_t limit = prefix_boundary(e, G);
    if (limit <= 0) continue;
    held[k] = gpu_find(e.cache_key(), limit);
    const int64_t hit = held[k] ? int64_t(held[k]->ids.size()) : 0;
    if (held[k]) pre[k].from = &static_cast<const GpuPrefixState&>(*held[k]->state).s;
    if (cached) (*cached)[k] = size_t(hit);
    if (limit <= hit) continue;
    // one new state per prefix in a batch (requests sharing a new state all compute it this time)
    bool dup = false;
    for (size_t j = 0; j < k && !dup; ++j)
      dup = keep[j] && at[j] == limit && std::equal(e.cache_key(), e.cache_key() + limit, batch[j].cache_key());
    const size_t bytes = cuda::PrefixLayout::of(gpu_->model, limit).bytes;
    if (dup || !cache_->would_keep(e.cache_key(), limit, bytes) || !cache_->make_room(limit, bytes)) continue;
    try {
      auto st = std::make_shared<GpuPrefixState>();
      st->s = new_state(gpu_->model, limit, "prefix cache entry");
      keep[k] = std::move(st);
      at[k] = limit;
      pre[k].into = &keep[k]->s;
      pre[k].at = limit;
    } catch (const Error&) {
      cudaGetLastError();  // out of GPU memory: this request runs uncached
    }
  }
  auto out = gpu_->forward->run(batch, pre);
  for (size_t k = 0; k < batch.size(); ++k)
    if (keep[k]) cache_->insert(batch[k].cache_key(), at[k], std::move(keep[k]));
  return out;
}

// A long request in steps on the GPU: each step a forward of its next tokens (no head) that
// continues its state and leaves it, grown in place, at the step's end; the steps stop at its
// prefix boundary (the last chunk of its system prompt + media + state; with a cache their
// state then goes there); finish() runs the rest (the schema and questions) with the head.
struct GpuSteps {
  std::shared_ptr<const PrefixEntry> hit;  // the cached prefix it starts from, held until the first step copies it
  std::shared_ptr<GpuPrefixState> own;     // null: no steps (finish runs it whole)
  int64_t pos = 0, stop = 0;
  bool to_cache = false;                   // own goes to the cache at stop
  // the step under way, a group of layers a call: its end, the next layer, its residual stream
  int64_t target = 0, layer = 0;
  cuda::DeviceBuffer residual;
  const cuda::DevPrefixState* from() const { return own && own->s.length > 0 ? &own->s : hit ? &static_cast<const GpuPrefixState&>(*hit->state).s : nullptr; }
};

std::unique_ptr<StepRun> EngineCore::gpu_start(const model::Sequence& e) const {
  auto r = std::make_unique<StepRun>();
  r->seq = e;
  auto g = std::make_shared<GpuSteps>();
  r->gpu = g;
  // the steps cover the prefix (system prompt, media, state): every span the head reads is after it
  g->stop = prefix_boundary(e, kG);
  const int64_t boundary = cache_ ? g->stop : 0;  // (media without their key have no prefix: model/batch.h)
  if (boundary > 0) {
    g->hit = gpu_find(e.cache_key(), boundary);
    g->pos = g->hit ? int64_t(g->hit->ids.size()) : 0;
    r->cached_tokens = size_t(g->pos);
  }
  if (g->stop <= g->pos) return r;
  try {
    g->own = std::make_shared<GpuPrefixState>();
    g->own->s = new_state(gpu_->model, g->stop, "a long request's state between steps");
  } catch (const Error&) {
    cudaGetLastError();  // no room for it: finish() runs the request in one forward, as the plan holds
    g->own.reset();
    return r;
  }
  g->to_cache = boundary > 0 && cache_->would_keep(e.cache_key(), boundary, cuda::PrefixLayout::of(gpu_->model, boundary).bytes);
  return r;
}

bool EngineCore::gpu_step(StepRun& r, int64_t tokens, int64_t layers) const {
  GpuSteps& g = *r.gpu;
  if (!g.own || g.pos >= g.stop) return true;
  const model::Sequence& e = r.seq;
  cuda::Forward& fw = *gpu_->forward;
  if (g.layer == 0) {  // a new step
    const int64_t want = std::min(g.stop, g.pos + std::max(kG, tokens / kG * kG));
    g.target = chunk_boundary(e, want, kG);
    // an image across the step's end that starts in it: the step takes it whole (and any it runs into)
    if (g.target <= g.pos) g.target = chunk_boundary(e, want, kG, true, g.stop);
  }
  model::Sequence part = e;  // its first `target` tokens, no questions: the backbone and the memory rows
  part.length = g.target;
  part.questions.clear();
  int64_t end = layers > 0 ? std::min(fw.layers(), g.layer + layers) : fw.layers();
  const size_t residual_bytes = size_t(g.target - g.pos) * size_t(gpu_->model.c.hidden) * 4;
  if (end < fw.layers() && g.residual.bytes() < residual_bytes) {
    try {
      g.residual = {};  // the smaller one first: both at once may not fit where this one would
      g.residual = cuda::DeviceBuffer(residual_bytes, "a long request's residual stream between layer groups");
    } catch (const Error&) {
      cudaGetLastError();  // no room for it: this step runs its layers at once
      if (g.layer == 0) end = fw.layers();
    }
  }
  if (g.residual.bytes() < residual_bytes && g.layer > 0)
    throw Error(Status::Internal, "internal_error", "a step's residual stream went missing between its layer groups");
  fw.run({part}, {cuda::SeqPrefix{g.from(), &g.own->s, g.target}}, cuda::LayerGroup{g.layer, end, g.residual.as<float>()});
  if (end < fw.layers()) {
    g.layer = end;
    return false;
  }
  g.layer = 0;
  g.pos = g.target;
  g.hit.reset();
  if (g.pos >= g.stop) g.residual = {};  // the steps are through: finish() runs without it
  if (g.pos == g.stop && g.to_cache && cache_->make_room(g.stop, g.own->bytes())) cache_->insert(e.cache_key(), g.stop, g.own);
  return g.pos >= g.stop;
}

std::vector<std::vector<double>> EngineCore::gpu_finish(StepRun& r) const {
  GpuSteps& g = *r.gpu;
  auto p = gpu_->forward->run({r.seq}, {cuda::SeqPrefix{g.from(), nullptr, 0}})[0];
  g.own.reset();
  g.hit.reset();
  return p;
}
#endif

void EngineCore::warm_forward(const model::Batch& batch) const {
  if (!opts_.load_weights) throw Error(Status::Unavailable, "unavailable", "this engine was opened without its weights");
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) gpu_->forward->run(batch);
#endif
  (void)batch;
}

int64_t EngineCore::max_batch_options() const {
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) return gpu_->forward->options().max_options;
#endif
  return std::numeric_limits<int64_t>::max() / 2;
}

std::unique_ptr<StepRun> EngineCore::start(const model::Sequence& e, model::GdnForm form) const {
  if (!opts_.load_weights) throw Error(Status::Unavailable, "unavailable", "this engine was opened without its weights");
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) return gpu_start(e);
#endif
  auto r = std::make_unique<StepRun>();
  r->seq = e;
  r->form = form;
  const int64_t limit = std::min(e.prefix_limit, e.length - 1) / model::kChunkTokens * model::kChunkTokens;
  // the cache holds states of the chunked GDN form only (the recurrent one rounds differently)
  std::shared_ptr<const PrefixEntry> hit;
  if (cache_ && limit > 0 && form == model::GdnForm::Chunked) {
    hit = cache_->find(e.cache_key(), limit);
    r->cached_tokens = hit ? hit->ids.size() : 0;
    r->snapshot_pending = limit > int64_t(r->cached_tokens);
  }
  // the runner copies the state in: the entry is free for eviction from then on
  r->runner = std::make_unique<model::SequenceRunner>(text_, head_, cfg_, r->seq, form,
                                                      hit ? &static_cast<const CpuPrefixState&>(*hit->state).s : nullptr);
  return r;
}

bool EngineCore::step(StepRun& r, int64_t tokens, int64_t layers) const {
#ifdef CLEFRT_HAVE_CUDA
  if (r.gpu) return gpu_step(r, tokens, layers);
#endif
  (void)layers;  // the CPU runs a step's layers together
  CpuThreadScope scope(opts_.threads, observer());
  model::SequenceRunner& run = *r.runner;
  const int64_t chunks = std::max<int64_t>(1, tokens / model::kChunkTokens);
  const int64_t target = std::min(run.length(), run.position() + chunks * model::kChunkTokens);
  if (r.snapshot_pending && run.prefix_limit() <= target) {
    run.advance(run.prefix_limit());
    r.snapshot_pending = false;
    if (cache_->would_keep(r.seq.cache_key(), run.prefix_limit(), run.state_bytes())) {
      std::shared_ptr<CpuPrefixState> keep;
      try {
        keep = std::make_shared<CpuPrefixState>();
        keep->s = run.snapshot();
      } catch (const std::bad_alloc&) {
        keep.reset();  // caching is optional: the request goes on without it
      }
      if (keep) cache_->insert(r.seq.cache_key(), run.prefix_limit(), std::move(keep));
    }
  }
  run.advance(target);
  return run.position() == run.length();
}

std::vector<std::vector<double>> EngineCore::finish(StepRun& r, size_t* cached_tokens) const {
  std::vector<std::vector<double>> p;
#ifdef CLEFRT_HAVE_CUDA
  if (r.gpu) p = gpu_finish(r);
#endif
  if (!r.gpu) {
    CpuThreadScope scope(opts_.threads, observer());
    p = r.runner->finish();
  }
  for (size_t q = 0; q < p.size(); ++q)
    for (double x : p[q])
      if (!std::isfinite(x)) throw_non_finite(r.seq, q);
  if (cached_tokens) *cached_tokens = r.cached_tokens;
  return p;
}

std::vector<std::vector<std::vector<double>>> EngineCore::forward(const model::Batch& batch, model::GdnForm form,
                                                                  std::vector<size_t>* cached) const {
  if (!opts_.load_weights) throw Error(Status::Unavailable, "unavailable", "this engine was opened without its weights");
#ifdef CLEFRT_HAVE_CUDA
  if (gpu_) return gpu_forward(batch, cached);
#endif
  // One request at a time, each cut into the backbone's chunks from its start (model/forward.h):
  // its bits do not depend on its batch nor on whether its prefix came from the cache.
  std::vector<std::vector<std::vector<double>>> out;
  for (size_t k = 0; k < batch.size(); ++k) {
    auto r = start(batch[k], form);
    while (!step(*r, std::numeric_limits<int64_t>::max() / 2)) {
    }
    out.push_back(finish(*r, cached ? &(*cached)[k] : nullptr));
  }
  return out;
}

}  // namespace clefrt

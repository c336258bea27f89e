// clefrt::inspect (`clefrt inspect`): what a model folder holds and the memory each device plan
// needs, from the headers alone.
#include <clefrt/clefrt.h>

#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#ifdef CLEFRT_HAVE_CUDA
#include "cuda/model/forward.h"
#endif

#include "common/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "engine/memory_plan.h"
#include "quant/recipe.h"

namespace clefrt {

namespace {

std::string gib(double bytes) {
  char buf[32];
  if (bytes < double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

std::string count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

void appendf(std::ostream& out, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  out << buf;
}

struct Group {
  double params = 0, bytes = 0;
  std::map<std::string, int> dtypes;
};

}  // namespace

std::string inspect(const std::string& dir_path, const EngineOptions& opts) {
  const std::string* dir = &dir_path;
  const int64_t max_tokens_v = int64_t(opts.max_length);
  const int64_t* max_tokens = &max_tokens_v;
  std::ostringstream out;
  {
    namespace fs = std::filesystem;
    model::ModelConfig cfg = model::load_config(*dir);
    io::TensorStore store = io::TensorStore::open_folder(*dir);
    io::TensorStore head;
    fs::path hp = fs::path(*dir) / "joint_head.safetensors";
    if (fs::exists(hp)) head.add_file(hp.string());
    std::map<std::string, Group> groups;
    auto add = [&](const std::string& g, const io::TensorInfo* t) {
      Group& x = groups[g];
      x.params += double(t->numel());
      x.bytes += double(t->nbytes);
      x.dtypes[io::dtype_name(t->dtype)]++;
    };
    for (const auto* t : store.all()) {
      const std::string& n = t->name;
      if (n.rfind("model.visual.", 0) == 0) add("vision", t);
      else if (n.rfind("mtp.", 0) == 0) add("mtp (ignored)", t);
      else if (n == "lm_head.weight" || n.find("embed_tokens") != std::string::npos) add("embeddings + lm_head", t);
      else add("backbone", t);
    }
    for (const auto* t : head.all()) add("joint head", t);
    const auto& tc = cfg.text;
    int64_t gdn = 0;
    for (auto t : tc.layer_types) gdn += t == model::LayerType::LinearAttention;
    out << "folder        " << *dir << "\n"
              << "architecture  " << cfg.architecture << " (" << cfg.model_type << ")\n"
              << "format        " << (cfg.quantization ? "quantized (compressed-tensors: the CPU engine dequantizes NVFP4 / FP8 at load; CUDA keeps them packed, see --quant)" : "unquantized") << "\n"
              << "text          hidden " << tc.hidden << ", " << tc.layers << " layers (" << gdn << " GDN, " << tc.layers - gdn
              << " attention), ffn " << tc.ffn << ", vocab " << tc.vocab << "\n"
              << "attention     " << tc.q_heads << " query / " << tc.kv_heads << " KV heads of " << tc.head_dim << ", rotary "
              << tc.rotary_dim() << " dims, theta " << tc.rope_theta << "\n"
              << "GDN           " << tc.k_heads << " key / " << tc.v_heads << " value heads of " << tc.k_head_dim << "/" << tc.v_head_dim
              << ", conv " << tc.conv_kernel << "\n";
    if (cfg.vision.present)
      out << "vision        depth " << cfg.vision.depth << ", hidden " << cfg.vision.hidden << ", " << cfg.vision.heads
                << " heads, patch " << cfg.vision.patch << " (bf16 on the GPU, fp32 on the CPU; --no-vision leaves it on disk)\n";
    out << "joint head    width " << cfg.head.width << ", " << cfg.head.routing_layers << " routing + " << cfg.head.layers
              << " layers, " << cfg.head.heads << " heads, ffn " << cfg.head.ffn << "\n\n";
    double total_params = 0, total_bytes = 0, cpu_params = 0, head_params = 0;
    for (const auto& [name, g] : groups) {
      std::string dts;
      for (const auto& [d, n] : g.dtypes) dts += (dts.empty() ? "" : ", ") + d + " x" + std::to_string(n);
      appendf(out, "%-22s %10s params  %10s  %s\n", name.c_str(), count(g.params).c_str(), gib(g.bytes).c_str(), dts.c_str());
      total_params += g.params;
      total_bytes += g.bytes;
      if (name != "mtp (ignored)") cpu_params += g.params;  // the CPU engine loads the vision tower too
      if (name == "joint head") head_params += g.params;
    }
    appendf(out, "%-22s %10s params  %10s on disk\n\n", "total", count(total_params).c_str(), gib(total_bytes).c_str());
    out << "memory plan\n"
              << "  cpu (fp32 weights, what `decide --device cpu` holds): " << gib(cpu_params * 4) << " + activations\n";
    {  // what one cached prefix holds on the CPU (model/prefix_state.h), per its length
      const auto& t = cfg.text;
      double attn = 0, gdn = 0;
      for (auto lt : t.layer_types) (lt == model::LayerType::FullAttention ? attn : gdn) += 1;
      const double conv_dim = double(2 * t.k_heads * t.k_head_dim + t.v_heads * t.v_head_dim);
      const double per_token = (attn * 2 * double(t.kv_heads * t.head_dim) + double(cfg.head.width)) * 4 + 4;
      const double fixed = gdn * (double(t.v_heads * t.k_head_dim * t.v_head_dim) + double(t.conv_kernel - 1) * conv_dim) * 4;
      appendf(out, "  cpu prefix cache: %s per cached prefix + %s per 1,000 of its tokens (K/V, head memory rows); %s for a %lld-token one\n",
              gib(fixed).c_str(), gib(per_token * 1000).c_str(), gib(fixed + per_token * double(opts.max_length)).c_str(),
              (long long)opts.max_length);
    }
#ifdef CLEFRT_HAVE_CUDA
    // The CUDA engine: the backbone's Linears in the --quant format (the recipe's keep-list --
    // GDN in_proj_a/b, conv, norms -- in bf16), embeddings in bf16 (or pinned host memory with
    // --offload-embeddings, which also plans the lean arena), the joint head (bf16 matrices,
    // fp32 token-row ones), the activation arena for a batch of --max-length tokens (64
    // requests), cuBLASLt's workspace, NVFP4's two staging slots and the first forward's
    // reserve (kFirstForwardReserveBytes).
    {
      struct Mode {
        const char* name;
        QuantMode q;
      };
      for (Mode m : {Mode{"bf16", QuantMode::BF16}, Mode{"fp8", QuantMode::FP8}, Mode{"nvfp4-w4a16", QuantMode::NVFP4_W4A16},
                     Mode{"nvfp4 (W4A4)", QuantMode::NVFP4}}) {
        const CudaPlan p = cuda_plan(cfg, head_params, m.q, opts.w4a16_fused, *max_tokens);
        appendf(out, "  cuda --quant %-12s weights %s + embeddings %s + activations (%lld tokens) %s + workspaces %s = %s; "
                    "with --offload-embeddings %s\n",
                    m.name, gib(p.weights).c_str(), gib(p.embeddings).c_str(), (long long)*max_tokens, gib(p.arena).c_str(),
                    gib(p.workspaces).c_str(), gib(p.total(false)).c_str(), gib(p.total(true)).c_str());
      }
      out << "  (workspaces: cuBLASLt's, NVFP4 staging, 128 MiB kept free for the first forward; plus the CUDA context: ~0.26 GiB\n"
             "  on an H200)\n";
    }
#else
    out << "  cuda: this build has no CUDA backend\n";
#endif
  }
  return out.str();
}

}  // namespace clefrt

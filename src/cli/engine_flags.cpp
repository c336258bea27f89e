// The engine options `decide` and `serve` share, as flags, and their translation into the
// public clefrt::EngineOptions.
#include <cctype>
#include <stdexcept>

#include "cli/commands.h"

namespace clefrt::cli {

void add_engine_flags(CLI::App& c, EngineFlags& f) {
  c.add_option("--device", f.device, "auto (cuda when this build has it and a GPU is present, else cpu) | cuda | cpu")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  c.add_option("--quant", f.quant,
               "cuda: auto (what the folder holds) | bf16 | fp8 (W8A8, e4m3, per-channel weights, per-token activations) |\n"
               "nvfp4 (W4A4; needs a W4A4 folder) | nvfp4-w4a16; bf16/fp8/nvfp4 weights are converted on the GPU at load")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "nvfp4", "nvfp4-w4a16"}));
  c.add_flag("--offload-embeddings", f.offload,
             "cuda, lean GPU memory: embed_tokens / lm_head in pinned host memory, the MLP in 1,024-token blocks, the GDN in "
             "16-chunk passes (same answers, a little slower on long inputs)");
  c.add_flag("--w4a16-fused", f.w4a16_fused,
             "cuda, NVFP4 Linears: the fused W4A16 GEMM (weights dequantized in shared memory; no staging memory, the lowest\n"
             "GPU memory; on the H200 slower than the default staging from ~1,000 tokens)");
  c.add_flag("--no-native-fp4", f.no_native_fp4,
             "cuda, W4A4 folders on Blackwell: the emulated path (dequantized weights, fake-quantized activations: the oracle)\n"
             "instead of the FP4 tensor cores; without effect elsewhere");
  c.add_flag("--no-vision", f.no_vision,
             "text only: leave the folder's vision tower on disk (~0.9 GiB of GPU memory for Clef's); requests with images\n"
             "are then a 422");
  c.add_flag("--portable-kernels", f.portable_kernels,
             "cuda: only the kernels every supported GPU runs (mma.sync W4A16 GEMM instead of wgmma / TMA, W4A4 emulated,\n"
             "the GDN scan on mma.sync 3xTF32 where Hopper's runs wgmma bf16x3):\n"
             "to compare them with the fast ones on a Hopper or Blackwell card");
  c.add_option("--attention", f.attention,
               "cuda: the attention kernel (backbone and vision tower): auto (cuDNN's fused attention where libcudnn.so.9, 9.5 or newer, loads;\n"
               "else clefrt's, and the load line says why) | cudnn (refused at load without it) | clefrt (clefrt's own kernel).\n"
               "Both keep answers batch-invariant and the prefix cache's bits; they differ from each other in the last bits")
      ->check(CLI::IsMember({"auto", "cudnn", "clefrt"}));
  c.add_option("--cuda-graphs", f.cuda_graphs,
               "cuda: a batch shape (its requests' token counts, questions and options) seen N times (N >= 2) is captured\n"
               "into a CUDA graph and replayed from then on, its kernels back to back (the same answers). Batches with images\n"
               "or that use the prefix cache, and NVFP4 staging, run as always. 0: off (default 2)")
      ->check(graph_sightings());
  c.add_option("--threads", f.threads, "CPU engine threads (default: all cores)")->check(non_negative());
  c.add_option("--max-length", f.max_length,
               "context length in tokens, at most 65536 (Clef's window); longer states are cut, longer schemas refused with 413\n"
               "(default 16384)")
      ->check(max_length_range());
  c.add_option("--prefix-cache-gib", f.prefix_cache_gib,
               "the prefix cache's budget in GiB (host memory on the CPU, GPU memory on the GPU): a request whose ids start with\n"
               "a cached system prompt + state (in multiples of 256 tokens on the CPU, 64 on the GPU) computes only the rest, the\n"
               "same answer bit for bit; least recently used prefixes go first. 0 turns it off. Default 4, or half of the memory\n"
               "the weights leave if that is less")
      ->check(non_negative());
  c.add_option("--prefix-cache-host-gib", f.prefix_cache_host_gib,
               "GPU: a second tier of the prefix cache in this many GiB of pinned host memory: prefixes the GPU budget evicts\n"
               "wait there and come back by a copy on their next hit (the same answers; a copy of an 8,000-token 27B state is\n"
               "~0.5 GB over PCIe instead of its prefill). Default 0 (off: evicted prefixes go)")
      ->check(non_negative());
  c.add_option("--step-tokens", f.step_tokens,
               "a longer request (on the GPU: over 4x as long) runs in steps of about this many tokens, one at a time, with\n"
               "the requests that arrive meanwhile answered between its steps (they wait one step at most); the same answers.\n"
               "Default 1024 on the CPU, 2048 on the GPU (there a step costs some speed: smaller steps answer others sooner)")
      ->check(positive());
  c.add_option("--step-layers", f.step_layers,
               "GPU: a step runs this many backbone layers at a time, with the requests that arrived meanwhile answered between\n"
               "them, so they wait a few layers of a step rather than a whole one; the same answers. Default 4")
      ->check(positive());
  c.add_flag("--parse-special", f.parse_special, "parse special-token text in user content, as the reference does");
  c.add_flag("--require-instructions", f.require_instructions, "refuse missing/empty instructions (422)");
  c.add_flag("--no-check-weights", f.no_check_weights,
             "skip the load-time test of every weight for NaN / infinity (a folder with any is refused, naming the tensor; the test\n"
             "reads each weight once more); without it such weights give a request a 500 naming the layer");
}

namespace {
CLI::Validator number_check(bool strict, const char* tag) {
  return CLI::Validator(
      [strict](std::string& in) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(in, &used);
        } catch (...) {
          return "not a number: " + in;
        }
        if (used != in.size()) return "not a number: " + in;
        if (strict ? !(v > 0) : !(v >= 0)) return std::string(strict ? "must be above 0" : "must be 0 or more") + ", not " + in;
        return {};
      },
      tag);
}
}  // namespace

CLI::Validator graph_sightings() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(in, &used);
        } catch (const std::out_of_range&) {
          return "out of range: " + in;
        } catch (...) {
          return "not a whole number: " + in;
        }
        if (used != in.size()) return "not a whole number: " + in;
        if (v != 0 && v < 2) return "0 (off) or at least 2 (a shape's first forward tunes its GEMMs), not " + in;
        return {};
      },
      "0|N>=2");
}
CLI::Validator max_length_range() { return CLI::Range(size_t(1), kMaxContext, "TOKENS"); }
CLI::Validator positive() { return number_check(true, "POSITIVE"); }
CLI::Validator non_negative() { return number_check(false, "NONNEGATIVE"); }

void add_env_names(CLI::App& c) {
  for (CLI::Option* o : c.get_options()) {
    const std::string name = o->get_single_name();
    if (o->get_lnames().empty() || !o->get_envname().empty() || name == "help") continue;
    std::string env = "CLEFRT_";
    for (char ch : o->get_lnames()[0]) env += ch == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(ch)));
    o->envname(env);
  }
}

EngineOptions engine_options(const EngineFlags& f) {
  EngineOptions o;
  o.device = f.device == "cuda" ? Device::Cuda : f.device == "cpu" ? Device::Cpu : Device::Auto;
  o.quant = parse_quant_mode(f.quant);
  o.offload_embeddings = f.offload;
  o.w4a16_fused = f.w4a16_fused;
  o.native_fp4 = !f.no_native_fp4;
  o.portable_kernels = f.portable_kernels;
  o.attention = parse_attention_kernel(f.attention);
  o.cuda_graphs = f.cuda_graphs;
  o.vision = !f.no_vision;
  o.progress = true;  // the CLI's loads report their stages (decide, serve)
  // the format and offload left to the engine: it fits them to the GPU (and says which)
  o.fit_memory = f.quant == "auto" && !f.offload && !f.w4a16_fused;
  o.threads = f.threads;
  o.max_length = f.max_length;
  o.prefix_cache_gib = f.prefix_cache_gib;
  o.prefix_cache_host_gib = f.prefix_cache_host_gib;
  o.step_tokens = f.step_tokens;
  o.step_layers = f.step_layers;
  o.parse_special = f.parse_special;
  o.require_instructions = f.require_instructions;
  o.check_weights = !f.no_check_weights;
  return o;
}

}  // namespace clefrt::cli

// The memory plan checked at load (engine/memory_plan.h): a plan over what is free is refused
// with its figure and options that fit, before any weight is read; one that fits passes.
#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/memory_plan.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/synth.h"
#include "test_util.h"

#ifdef CLEFRT_HAVE_CUDA
#include "cuda/model/forward.h"
#endif

namespace clefrt {
namespace {

struct Folder {
  model::ModelConfig cfg;
  FolderSizes sizes;
};

Folder small_folder() {
  const std::string dir = test::synth_folder("plan-small", 3, "small");
  Folder f;
  f.cfg = model::load_config(dir);
  io::TensorStore st = io::TensorStore::open_folder(dir), head;
  head.add_file(dir + "/joint_head.safetensors");
  f.sizes = folder_sizes(st, head);
  return f;
}

std::string refusal(const Folder& f, const PlanRequest& r, double free_bytes) {
  try {
    check_memory_fits(f.cfg, f.sizes, r, free_bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 503);
    EXPECT_EQ(e.type(), "insufficient_memory");
    return e.message();
  }
  return "";
}

TEST(MemoryPlan, CpuRefusesFp32WeightsOverWhatIsAvailable) {
  const Folder f = small_folder();
  PlanRequest r;
  const double need = f.sizes.cpu_params * 4;
  EXPECT_EQ(refusal(f, r, need * 1.01), "");
  const std::string m = refusal(f, r, need * 0.5);
  EXPECT_NE(m.find("fp32"), std::string::npos) << m;
  EXPECT_NE(m.find(gib_text(need)), std::string::npos) << m;
  EXPECT_EQ(refusal(f, r, -1), "");  // unknown: nothing to check
}

TEST(MemoryPlan, CudaRefusalNamesThePlanAndWhatFits) {
  const Folder f = small_folder();
  PlanRequest r;
  r.cuda = true;
  r.quant = QuantMode::BF16;
  r.max_tokens = 16384;
  const CudaPlan bf16 = cuda_plan(f.cfg, f.sizes.head_params, QuantMode::BF16, false, 16384);
  const CudaPlan w4 = cuda_plan(f.cfg, f.sizes.head_params, QuantMode::NVFP4_W4A16, true, 16384);
  ASSERT_GT(bf16.total(false), 0);  // this build has the CUDA plan
  EXPECT_GT(bf16.total(false), bf16.total(true));
  EXPECT_LT(w4.weights, bf16.weights);
  EXPECT_EQ(refusal(f, r, bf16.total(false) + 1), "");
  // room for the lean NVFP4 plan only: the refusal names the bf16 figure and that option
  const std::string m = refusal(f, r, w4.total(true) + 1);
  EXPECT_NE(m.find(gib_text(bf16.total(false))), std::string::npos) << m;
  EXPECT_NE(m.find("--quant nvfp4-w4a16 --offload-embeddings --w4a16-fused"), std::string::npos) << m;
  EXPECT_EQ(m.find("--quant bf16 ("), std::string::npos) << "bf16 does not fit: " << m;
  // no room at all
  EXPECT_NE(refusal(f, r, 1024).find("no option of this engine fits it"), std::string::npos);
  // FP8 is offered only where the GPU has FP8 tensor cores
  r.fp8_capable = false;
  EXPECT_EQ(refusal(f, r, bf16.total(false) - 1).find("--quant fp8"), std::string::npos);
}

// The format left to the engine (EngineOptions::fit_memory): the first format / offload / W4A16
// kernel that fits at the same context is chosen and explained; nothing fitting is still refused.
TEST(MemoryPlan, FitMemoryChoosesWhatFitsAtTheSameContext) {
  const Folder f = small_folder();
  PlanRequest r;
  r.cuda = true;
  r.quant = QuantMode::Auto;  // an unquantized folder: bf16
  r.max_tokens = 16384;
  const CudaPlan bf16 = cuda_plan(f.cfg, f.sizes.head_params, QuantMode::BF16, false, 16384);
  EXPECT_FALSE(check_memory_fits(f.cfg, f.sizes, r, bf16.total(false) + 1, true).has_value()) << "it fits as asked";
  const double free_bytes = bf16.total(true) - 1;  // not even bf16 with offload
  const auto c = check_memory_fits(f.cfg, f.sizes, r, free_bytes, true);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->quant, QuantMode::BF16);
  EXPECT_LE(cuda_plan(f.cfg, f.sizes.head_params, c->quant, c->fused, 16384).total(c->offload), free_bytes);
  EXPECT_NE(c->why.find("needs"), std::string::npos) << c->why;
  EXPECT_THROW(check_memory_fits(f.cfg, f.sizes, r, free_bytes, false), Error);  // not allowed to adjust: refused
  EXPECT_THROW(check_memory_fits(f.cfg, f.sizes, r, 1024, true), Error);         // nothing fits: refused
}

#ifdef CLEFRT_HAVE_CUDA
// The GPU plan's lean arena (counted without a GPU) for one 32,768-token request on the 27B
// shapes: what the 16 GiB-card target leaves it. NVFP4 + offloaded embeddings hold 13.10 GiB of
// weights and the context ~0.26 (bench/results/2026-12-02-h200-long-memory-*), so the arena,
// the 64 MiB GEMM workspace and the NVFP4 staging (~0.17) must stay under ~2.4 GiB. The option
// rows are one request's worth (64 questions x 255 options) and the head works through them in
// blocks: more options cost only their 8 KiB rows of R / On. The plan still grows with tokens.
TEST(MemoryPlan, LeanArenaAt32kTokensLeavesRoomOnA16GiBCard) {
  const model::ModelConfig c = model::synthetic_config("clef-27b");
  cuda::ForwardOptions o;
  o.max_tokens = 32768;
  o.max_seqs = 1;
  cuda::use_lean_memory_plan(o);
  EXPECT_GE(o.max_options, 64 * 255);
  const double gib = double(size_t(1) << 30);
  auto arena = [&](const cuda::ForwardOptions& f) {
    return double(cuda::Forward::arena_bytes(c.text, c.head, f, QuantMode::NVFP4_W4A16, nullptr)) / gib;
  };
  const double lean = arena(o);
  cuda::ForwardOptions plain;
  plain.max_tokens = o.max_tokens;
  plain.max_seqs = 1;
  cuda::ForwardOptions per_token = o;
  per_token.max_options = o.max_tokens;
  std::cout << "[ plan    ] 27B lean arena at 32,768 tokens: " << lean << " GiB (plain plan " << arena(plain) << ", one option row per token "
            << arena(per_token) << ")\n";
  EXPECT_LT(lean, 1.7);
  EXPECT_LT(lean, arena(plain) - 2.0);
  EXPECT_LT(arena(per_token), lean + 0.2);
  cuda::ForwardOptions half = o;
  half.max_tokens = 16384;
  EXPECT_LT(arena(half), lean - 0.5);
}
#endif

}  // namespace
}  // namespace clefrt
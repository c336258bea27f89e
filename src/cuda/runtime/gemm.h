// y[m, n] (+)= x[m, k] * w[n, k]^T through cuBLASLt: bf16 inputs, fp32 accumulation, output
// bf16 or fp32. The algorithm is chosen once per shape and cached.
//
// Batch invariance: cuBLASLt's heuristic picks different kernels (and split-K) for different m,
// which changes a row's rounding with the batch it runs in. With batch_invariant the algorithm
// is chosen per (n, k) at a fixed reference m, with split-K off and no reduction scheme, so every
// output element is one CTA's sequential sum over k, whatever m is (checked bit for bit by the GPU
// tests and by `clefrt bench`'s invariance point at the real shapes).
//
// m buckets (measured: clefrt_bench_fp8 and clefrt_bench_bf16, bench/results): cuBLASLt's
// batch-invariant candidates round bit for bit like the reference-m algorithm at the 27B shapes
// (FP8 and bf16 at m = 318, 1,024 and 8,192), while the fastest is up to 1.6x (FP8) and 1.6-2.4x
// (bf16 at m = 318; 1.0-1.24x at 1,024, 1.0-1.10x at 8,192) faster, and the heuristic's first pick
// is not the fastest. So per m bucket (<= 512, <= 2,048, <= 8,192, above) and
// shape, the first call times the reference algorithm and the heuristic's invariant candidates at
// its m and keeps the fastest among those whose output on the call's first (up to) 64 rows equals
// the reference's in every bit (tune). Answers stay batch-invariant either way; which candidate
// wins may differ between processes.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include <tuple>

#include "cuda/runtime/buffer.h"

namespace clefrt::cuda {

enum class OutType { BF16, F32 };

// What cuBLASLt adds to a bf16-output GEMM before it rounds: + bias (bf16 [n]: cuBLASLt takes the
// bias in the output's type), then GELU (cuBLASLt's, the tanh form). One rounding to bf16, as a
// bf16 Linear with bias (and torch's fused addmm + gelu) rounds.
enum class Epilogue { None, Bias, BiasGelu };

// Switches only the dev/cuda lab's benches turn (the product runs the defaults).
struct GemmLab {
  bool fp8_m_buckets = true;    // false: the reference-m FP8 algorithm at every m (no tuning)
  bool bf16_m_buckets = true;   // false: the reference-m bf16 algorithm at every m (no tuning)
  bool fp8_fast_accum = false;  // true: no fp32 promotion of FP8 partial sums (faster, less exact over long k)
  int fp8_own = 0;              // 1 .. 4: run_fp8 runs the FP8 GEMM of our own (kernels_quant.h fp8_gemm_own's forms)
  // Set: run_fp8's alpha is this device vector, one float per output feature (n of the one shape
  // this Gemm runs), through cuBLASLt's CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO (the
  // per-channel scale inside the GEMM: dev/cuda/fp8_gemm.cpp asks whether sm_90 takes it)
  const float* fp8_alpha_vector = nullptr;
  // Set (both): run_fp8 multiplies output [row, col] by fp8_channel_scales[col] (one float per
  // output feature, n of the one shape this Gemm runs) x fp8_token_scales[row] (one per row of x)
  // inside the GEMM, through cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on A (the
  // weights) and B (the activations): both FP8 scales in the epilogue, the pass after it gone
  // (dev/cuda/fp8_gemm.cpp asks whether sm_90 takes it)
  const float* fp8_channel_scales = nullptr;
  const float* fp8_token_scales = nullptr;
  bool fp8_accumulate = false;  // run_fp8 adds into y (fp32 only: the residual stream) instead of overwriting it
};

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream, bool batch_invariant = false, size_t workspace_bytes = size_t(64) << 20, GemmLab lab = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // accumulate: y += x w^T (y must be F32 then: the residual stream).
  void run(const __nv_bfloat16* x, int64_t m, int64_t k, int64_t ldx, const __nv_bfloat16* w, int64_t n, void* y, OutType yt,
           int64_t ldy, bool accumulate, const char* op);
  // y = epilogue(x w^T + bias) in bf16, rows of ldy. Batch-invariant like run(): the epilogue is
  // per element.
  void run_epilogue(const __nv_bfloat16* x, int64_t m, int64_t k, int64_t ldx, const __nv_bfloat16* w, int64_t n, Epilogue ep,
                    const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t ldy, const char* op);
  // All fp32 (CUBLAS_COMPUTE_32F, no TF32): the joint head, where exactness costs little.
  void run_f32(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, int64_t n, float* y, int64_t ldy, bool accumulate,
               const char* op);

  // FP8 e4m3 x [m, k] and w [n, k], fp32 accumulation, no scales: the caller applies the
  // per-token and per-channel ones (kernels_quant.h), since cuBLASLt on sm_90 takes only scalar
  // scales for FP8 (its outer-vector mode answers CUBLAS_STATUS_INVALID_VALUE there; measured).
  void run_fp8(const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, void* y, OutType yt, int64_t ldy, const char* op);

  // Native NVFP4 (Blackwell, sm_100 / sm_120 only; UNTESTED here): x [m, k] and w [n, k] e2m1
  // packed two per byte, each with e4m3 scales per 16 inputs in cuBLASLt's swizzled layout
  // (kernels_quant.h), y (+)= alpha * x w^T with alpha = 1 / (gs_in * gs_w).
  void run_fp4(const uint8_t* x, const uint8_t* x_scales, int64_t m, int64_t k, const uint8_t* w, const uint8_t* w_scales, int64_t n,
               float alpha, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op);

  bool batch_invariant() const { return batch_invariant_; }
  // m buckets (see above, FP8 and bf16): buckets that adopted another algorithm than the
  // reference, and candidates dropped because some output bit differed from the reference
  int fp8_buckets_adopted() const { return fp8_adopted_; }
  int fp8_buckets_refused() const { return fp8_refused_; }

  // For benchmarks: the cuBLASLt heuristic's candidates (up to 16) for an FP8 (fp8 = true) or
  // bf16 shape at this m, each with its configuration in words and whether it is batch-invariant
  // (no split-K, no reduction); run_candidate runs one of them (y = x w^T, no accumulation).
  struct Candidate {
    cublasLtMatmulAlgo_t algo{};
    std::string config;
    bool invariant = false;
  };
  std::vector<Candidate> candidates(bool fp8, int64_t m, int64_t n, int64_t k, OutType yt, const char* op);
  // Beyond the heuristic: every configuration cuBLASLt's algorithms take for the shape (their
  // tiles, stages, CTA swizzling and a few cluster shapes; one K split, no reduction scheme), each
  // passed by cublasLtMatmulAlgoCheck with room in the workspace, at most `max`.
  std::vector<Candidate> search(bool fp8, int64_t m, int64_t n, int64_t k, OutType yt, const char* op, size_t max);
  void run_candidate(const Candidate& c, bool fp8, const void* x, int64_t m, int64_t k, const void* w, int64_t n, void* y, OutType yt,
                     const char* op);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // m buckets: the reference algorithm, until tune has decided the bucket's
    bool probe = false;
    cublasLtMatmulAlgo_t reference{};
    int64_t bucket = 0;
    int ep = 0;  // Epilogue: the desc carries it; launch sets its bias pointer
    bool alpha_vector = false;  // the desc takes alpha as GemmLab::fp8_alpha_vector
  };
  enum class In { BF16, F32, FP8, FP4 };
  // m, n, k, ldx, ldy, yt, acc, input type, epilogue
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int, int>;
  Plan& plan(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, bool acc, In in, const char* op, int ep = 0);
  cublasLtMatmulAlgo_t choose(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, bool acc, In in, const char* op,
                              int ep);
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, In in,
                                                          const char* op, int ep = 0);
  void launch(Plan& p, const void* x, const void* w, void* y, bool accumulate, const char* op, float alpha = 1.0f);

  cudaStream_t stream_;
  bool batch_invariant_;
  GemmLab lab_;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Key, Plan> plans_;
  std::map<Key, Plan> candidate_layouts_;  // run_candidate's (the algorithm set per call)
  int fp8_adopted_ = 0, fp8_refused_ = 0;
  const void* bias_ = nullptr;  // the epilogue's bias for the launches of the current call
  // (n, k, ldx, ldy, yt, acc, input type, epilogue) -> algorithm
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, int, int>, cublasLtMatmulAlgo_t> invariant_algos_;
  // (bucket, n, k, ldx, ldy, yt, acc, input type, epilogue) -> the algorithm the probe settled on
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int, int>, cublasLtMatmulAlgo_t> bucket_algos_;
  void tune(Plan& p, In in, const void* x, int64_t m, int64_t k, int64_t ldx, const void* w, int64_t n, void* y, OutType yt, int64_t ldy,
            bool acc, const char* op);
};

}  // namespace clefrt::cuda

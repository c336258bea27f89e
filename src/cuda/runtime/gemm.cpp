#include "cuda/runtime/gemm.h"

#include "cuda/runtime/check.h"
#include "cuda/runtime/event_timer.h"
#include "cuda/ops/kernels_quant.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace clefrt::cuda {

namespace {

struct Layouts {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

// m's FP8 bucket, named by its largest m (the last one: everything above 8,192). A bucket's
// algorithm is timed at its first call (gemm.h, tune).
int64_t fp8_bucket(int64_t m) { return m <= 512 ? 512 : m <= 2048 ? 2048 : m <= 8192 ? 8192 : 16384; }
bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// No split-K and no reduction scheme: one CTA sums the whole k of its outputs, in order.
bool invariant_algo(const cublasLtMatmulAlgo_t& a) {
  int32_t splitk = 1;
  uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &got);
  return splitk <= 1 && red == CUBLASLT_REDUCTION_SCHEME_NONE;
}

// Column-major view: D^T[n, m] = W[n, k] * X^T[k, m]; W row-major [n, k] is column-major
// [k, n] (op T), X row-major [m, k] is column-major [k, m] (op N). FP8 needs this "TN" form
// too: A (the weights) transposed, B not.
Layouts make_layouts(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, int in_kind, const GemmLab& lab, const char* op,
                     int ep = 0) {
  const cudaDataType in = in_kind == 1 ? CUDA_R_32F : in_kind == 2 ? CUDA_R_8F_E4M3 : in_kind == 3 ? CUDA_R_4F_E2M1 : CUDA_R_16BF;
  Layouts l;
  check(cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), op);
  check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), op);
  if (in_kind == 3) {  // block-scaled FP4: e4m3 scales per 16 inputs on both operands
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), op);
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), op);
  }
  if (ep) {  // D^T's rows are y's columns: the bias vector runs along n
    const cublasLtEpilogue_t e = Epilogue(ep) == Epilogue::BiasGelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), op);
  }
  if (in_kind == 2 && lab.fp8_fast_accum) {
    const int8_t on = 1;
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on), op);
  }
  if (in_kind == 2 && lab.fp8_channel_scales) {  // the scales' pointers are the lab's, fixed for this Gemm
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), op);
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), op);
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lab.fp8_channel_scales, sizeof lab.fp8_channel_scales),
          op);
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lab.fp8_token_scales, sizeof lab.fp8_token_scales), op);
  }
  if (in_kind == 2 && lab.fp8_alpha_vector) {
    const int32_t mode = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
    check(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode), op);
  }
  check(cublasLtMatrixLayoutCreate(&l.a, in, uint64_t(k), uint64_t(n), k), op);
  check(cublasLtMatrixLayoutCreate(&l.b, in, uint64_t(k), uint64_t(m), ldx), op);
  check(cublasLtMatrixLayoutCreate(&l.c, yt == OutType::F32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n), uint64_t(m), ldy), op);
  return l;
}

void destroy(Layouts& l) {
  if (l.a) cublasLtMatrixLayoutDestroy(l.a);
  if (l.b) cublasLtMatrixLayoutDestroy(l.b);
  if (l.c) cublasLtMatrixLayoutDestroy(l.c);
  if (l.desc) cublasLtMatmulDescDestroy(l.desc);
}

}  // namespace

Gemm::Gemm(cudaStream_t stream, bool batch_invariant, size_t workspace_bytes, GemmLab lab)
    : stream_(stream), batch_invariant_(batch_invariant), lab_(lab), workspace_(workspace_bytes, "cuBLASLt workspace") {
  check(cublasLtCreate(&lt_), "cublasLtCreate");
}

Gemm::~Gemm() {
  for (auto* plans : {&plans_, &candidate_layouts_})
    for (auto& [key, p] : *plans) {
      Layouts l{p.desc, p.a, p.b, p.c};
      destroy(l);
    }
  if (lt_) cublasLtDestroy(lt_);
}

// Up to 16 of cuBLASLt's heuristic candidates for the shape, best first.
std::vector<cublasLtMatmulHeuristicResult_t> Gemm::heuristics(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, In in,
                                                              const char* op, int ep) {
  Layouts l = make_layouts(m, n, k, ldx, ldy, yt, int(in), lab_, op, ep);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), op);
  size_t ws = workspace_.bytes();
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), op);
  std::vector<cublasLtMatmulHeuristicResult_t> res(16);
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, l.desc, l.a, l.b, l.c, l.c, pref, int(res.size()), res.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  destroy(l);
  check(st, op);
  res.resize(size_t(found));
  return res;
}

cublasLtMatmulAlgo_t Gemm::choose(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, bool acc, In in,
                                  const char* op, int ep) {
  (void)acc;
  const std::vector<cublasLtMatmulHeuristicResult_t> res = heuristics(m, n, k, ldx, ldy, yt, in, op, ep);
  if (res.empty())
    throw Error(Status::Internal, "device_error",
                std::string(op) + ": cuBLASLt has no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  if (!batch_invariant_) return res[0].algo;
  // The first candidate that runs without split-K or a reduction scheme (one CTA reduces the
  // whole k for its tile, in order).
  for (const auto& r : res)
    if (invariant_algo(r.algo)) return r.algo;
  cublasLtMatmulAlgo_t a = res[0].algo;
  int32_t one = 1;
  uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  check(cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one), op);
  check(cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none), op);
  return a;
}

Gemm::Plan& Gemm::plan(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, OutType yt, bool acc, In in, const char* op, int ep) {
  Key key{m, n, k, ldx, ldy, int(yt), acc, int(in), ep};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  p.ep = ep;
  p.alpha_vector = in == In::FP8 && lab_.fp8_alpha_vector;
  if (batch_invariant_) {
    // One algorithm per (n, k, ...) chosen at a reference m large enough for the biggest tiles.
    auto ik = std::make_tuple(n, k, ldx, ldy, int(yt), acc, int(in), ep);
    auto a = invariant_algos_.find(ik);
    if (a == invariant_algos_.end()) a = invariant_algos_.emplace(ik, choose(4096, n, k, ldx, ldy, yt, acc, in, op, ep)).first;
    p.algo = a->second;
    const int64_t bucket = fp8_bucket(m);
    if ((in == In::FP8 && !acc && lab_.fp8_m_buckets) || (in == In::BF16 && lab_.bf16_m_buckets)) {
      auto d = bucket_algos_.find(std::make_tuple(bucket, n, k, ldx, ldy, int(yt), acc, int(in), ep));
      if (d != bucket_algos_.end()) {
        p.algo = d->second;
      } else {  // decided by tune at the first call, which has operands
        p.probe = true;
        p.reference = p.algo;
        p.bucket = bucket;
      }
    }
  } else {
    p.algo = choose(m, n, k, ldx, ldy, yt, acc, in, op, ep);
  }
  Layouts l = make_layouts(m, n, k, ldx, ldy, yt, int(in), lab_, op, ep);
  p.desc = l.desc;
  p.a = l.a;
  p.b = l.b;
  p.c = l.c;
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(const __nv_bfloat16* x, int64_t m, int64_t k, int64_t ldx, const __nv_bfloat16* w, int64_t n, void* y, OutType yt,
               int64_t ldy, bool accumulate, const char* op) {
  if (m == 0) return;
  if (accumulate && yt != OutType::F32) throw Error(Status::Internal, "internal_error", std::string(op) + ": accumulate needs an F32 output");
  Plan& p = plan(m, n, k, ldx, ldy, yt, accumulate, In::BF16, op);
  if (p.probe) tune(p, In::BF16, x, m, k, ldx, w, n, y, yt, ldy, accumulate, op);
  launch(p, x, w, y, accumulate, op);
}

void Gemm::run_epilogue(const __nv_bfloat16* x, int64_t m, int64_t k, int64_t ldx, const __nv_bfloat16* w, int64_t n, Epilogue ep,
                        const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t ldy, const char* op) {
  if (m == 0) return;
  if (ep != Epilogue::None && !bias) throw Error(Status::Internal, "internal_error", std::string(op) + ": a bias epilogue without its bias");
  bias_ = bias;
  Plan& p = plan(m, n, k, ldx, ldy, OutType::BF16, false, In::BF16, op, int(ep));
  if (p.probe) tune(p, In::BF16, x, m, k, ldx, w, n, y, OutType::BF16, ldy, false, op);
  launch(p, x, w, y, false, op);
}

void Gemm::run_fp8(const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, void* y, OutType yt, int64_t ldy, const char* op) {
  if (m == 0) return;
  if (lab_.fp8_own != 0) {  // the FP8 GEMM of our own in cuBLASLt's place (GemmLab)
    fp8_gemm_own(lab_.fp8_own, x, m, k, w, n, y, yt == OutType::F32, ldy, stream_);
    return;
  }
  const bool acc = lab_.fp8_accumulate;
  if (acc && yt != OutType::F32) throw Error(Status::Internal, "internal_error", std::string(op) + ": an FP8 GEMM adds into fp32 outputs only");
  if (!lab_.fp8_channel_scales != !lab_.fp8_token_scales)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": GemmLab's outer-vector scales come as a pair (channel and token)");
  Plan& p = plan(m, n, k, k, ldy, yt, acc, In::FP8, op);
  if (p.probe) tune(p, In::FP8, x, m, k, k, w, n, y, yt, ldy, acc, op);
  launch(p, x, w, y, acc, op);
}

namespace {
Gemm::Candidate candidate_of(const cublasLtMatmulAlgo_t& algo);  // (below: the GEMM labs' list)
}

// The first call of an m bucket and shape picks the bucket's algorithm: the reference and the
// heuristic's batch-invariant candidates at this m (up to 8 more) each run the call's first
// min(m, 64) rows into a scratch, and a candidate that differs from the reference in any output
// bit is dropped; the rest are timed on the whole call, writing into y (which the real GEMM
// overwrites next) or, when the call accumulates into y, into a scratch as large, and the
// fastest is kept for every m of the bucket and this shape. Synchronizes the stream; once per
// (bucket, shape). Without room for the scratch, or when an accumulating call's would pass
// kMaxTimingScratch: the reference.
// Lab switches, read once: CLEFRT_GEMM_TUNE_LOG=1 prints each decision (the candidates' times and
// the pick) on stderr; CLEFRT_GEMM_TUNE_ROUNDS=N times each candidate N times (3 launches each)
// and compares the medians, to see whether a pick is noise.
void Gemm::tune(Plan& p, In in, const void* x, int64_t m, int64_t k, int64_t ldx, const void* w, int64_t n, void* y, OutType yt,
                int64_t ldy, bool acc, const char* op) {
  // a CUDA graph's capture cannot hold the timing (it synchronizes and allocates): refused, so the
  // capture fails and the forward runs eagerly and tunes, rather than settling on the reference
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream_, &capturing), op);
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": a GEMM shape first met inside a CUDA graph capture");
  const int64_t rows = m < 64 ? m : 64;
  const size_t es = yt == OutType::F32 ? 4 : 2, bytes = size_t(rows) * size_t(ldy) * es;
  constexpr size_t kMaxTimingScratch = size_t(256) << 20;
  auto decide = [&](const cublasLtMatmulAlgo_t& algo) {
    p.algo = algo;
    p.probe = false;
    bucket_algos_.emplace(std::make_tuple(p.bucket, n, k, ldx, ldy, int(yt), acc, int(in), p.ep), algo);
    // other m of this bucket planned before the decision take it too
    for (auto& [key, q] : plans_)
      if (q.probe && q.bucket == p.bucket && std::get<1>(key) == n && std::get<2>(key) == k && std::get<3>(key) == ldx &&
          std::get<4>(key) == ldy && std::get<5>(key) == int(yt) && std::get<6>(key) == acc && std::get<7>(key) == int(in) &&
          std::get<8>(key) == p.ep) {
        q.algo = algo;
        q.probe = false;
      }
  };
  std::vector<cublasLtMatmulAlgo_t> algos = {p.reference};
  for (const auto& r : heuristics(m, n, k, ldx, ldy, yt, in, op, p.ep)) {
    if (algos.size() >= 9) break;
    if (!invariant_algo(r.algo)) continue;
    bool seen = false;
    for (const auto& a : algos) seen |= same_algo(a, r.algo);
    if (!seen) algos.push_back(r.algo);
  }
  DeviceBuffer ref, cand, timed;
  if (acc && size_t(m) * size_t(ldy) * es > kMaxTimingScratch) {
    decide(p.reference);
    return;
  }
  try {
    ref = DeviceBuffer(bytes, "GEMM algorithm probe");
    cand = DeviceBuffer(bytes, "GEMM algorithm probe");
    if (acc) timed = DeviceBuffer(size_t(m) * size_t(ldy) * es, "GEMM algorithm timing");
  } catch (const Error&) {  // no room for the probe (a card near full): the reference algorithm, untuned
    decide(p.reference);
    return;
  }
  void* into = acc ? timed.get() : y;
  EventTimer timer(op);
  Layouts l = make_layouts(rows, n, k, ldx, ldy, yt, int(in), lab_, op, p.ep);
  std::vector<char> want(bytes), got(bytes);
  auto rows_of = [&](const cublasLtMatmulAlgo_t& algo, DeviceBuffer& out, std::vector<char>& host) {
    Plan probe{l.desc, l.a, l.b, l.c, algo};
    probe.ep = p.ep;
    probe.alpha_vector = p.alpha_vector;
    check(cudaMemsetAsync(out.get(), 0, bytes, stream_), op);
    launch(probe, x, w, out.get(), false, op);
    check(cudaMemcpyAsync(host.data(), out.get(), bytes, cudaMemcpyDeviceToHost, stream_), op);
    check(cudaStreamSynchronize(stream_), op);
  };
  static const bool log = env_flag("CLEFRT_GEMM_TUNE_LOG");
  static const int64_t rounds = env_count("CLEFRT_GEMM_TUNE_ROUNDS", 1, 1, 99);
  std::string report;
  auto time_ms = [&](const cublasLtMatmulAlgo_t& algo) {
    Plan full = p;
    full.algo = algo;
    launch(full, x, w, into, false, op);  // warm
    std::vector<float> each;
    for (int64_t round = 0; round < rounds; ++round) {
      timer.start(stream_);
      for (int r = 0; r < 3; ++r) launch(full, x, w, into, false, op);
      const float ms = float(timer.stop_ms(stream_));  // (cudaEventElapsedTime's float)
      each.push_back(ms / 3);
    }
    std::sort(each.begin(), each.end());
    const float ms = each[each.size() / 2];
    if (log) report += "\n  " + std::to_string(ms * 1000) + " us  " + candidate_of(algo).config;
    return ms;
  };
  cublasLtMatmulAlgo_t best = p.reference;
  try {
    rows_of(p.reference, ref, want);
    float best_ms = time_ms(p.reference);
    for (size_t i = 1; i < algos.size(); ++i) {
      rows_of(algos[i], cand, got);
      if (got != want) {
        ++fp8_refused_;
        std::fprintf(stderr, "gemm: %s: an %s candidate for m bucket %lld rounds differently from the reference one; not used\n", op,
                     in == In::FP8 ? "FP8" : "bf16", (long long)p.bucket);
        continue;
      }
      const float ms = time_ms(algos[i]);
      if (ms < best_ms) {
        best_ms = ms;
        best = algos[i];
      }
    }
  } catch (...) {
    destroy(l);
    throw;
  }
  destroy(l);
  if (!same_algo(best, p.reference)) ++fp8_adopted_;
  if (log)
    std::fprintf(stderr, "gemm tune: %s m %lld n %lld k %lld (bucket %lld, %s): picked %s%s\n", op, (long long)m, (long long)n, (long long)k,
                 (long long)p.bucket, in == In::FP8 ? "FP8" : "bf16", candidate_of(best).config.c_str(), report.c_str());
  decide(best);
}

void Gemm::run_f32(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, int64_t n, float* y, int64_t ldy, bool accumulate,
                   const char* op) {
  if (m == 0) return;
  launch(plan(m, n, k, ldx, ldy, OutType::F32, accumulate, In::F32, op), x, w, y, accumulate, op);
}

void Gemm::run_fp4(const uint8_t* x, const uint8_t* x_scales, int64_t m, int64_t k, const uint8_t* w, const uint8_t* w_scales, int64_t n,
                   float alpha, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op) {
  if (m == 0) return;
  if (accumulate && yt != OutType::F32) throw Error(Status::Internal, "internal_error", std::string(op) + ": accumulate needs an F32 output");
  Plan& p = plan(m, n, k, k, ldy, yt, accumulate, In::FP4, op);
  // A is the weight operand (see make_layouts), B the activations
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales), op);
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales), op);
  launch(p, x, w, y, accumulate, op, alpha);
}

namespace {
// An algorithm's configuration in words: id, tile, stages, K splits, reduction, swizzling, cluster
Gemm::Candidate candidate_of(const cublasLtMatmulAlgo_t& algo) {
  Gemm::Candidate c;
  c.algo = algo;
  int32_t id = 0, tile = 0, stages = 0, splitk = 1, swizzle = 0, cluster = 0;
  uint32_t red = 0;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &got);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &got);
  c.config = "algo " + std::to_string(id) + " tile " + std::to_string(tile) + " stages " + std::to_string(stages) + " splitk " +
             std::to_string(splitk) + " reduction " + std::to_string(red) + " swizzle " + std::to_string(swizzle) + " cluster " +
             std::to_string(cluster);
  c.invariant = invariant_algo(c.algo);
  return c;
}

// The uint32 array of an algorithm capability (empty: none reported)
std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes < 4) return {};
  std::vector<uint32_t> v(bytes / 4);
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), v.size() * 4, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}
}  // namespace

std::vector<Gemm::Candidate> Gemm::candidates(bool fp8, int64_t m, int64_t n, int64_t k, OutType yt, const char* op) {
  std::vector<Candidate> out;
  for (const auto& r : heuristics(m, n, k, k, n, yt, fp8 ? In::FP8 : In::BF16, op)) out.push_back(candidate_of(r.algo));
  return out;
}

std::vector<Gemm::Candidate> Gemm::search(bool fp8, int64_t m, int64_t n, int64_t k, OutType yt, const char* op, size_t max) {
  Layouts l = make_layouts(m, n, k, k, n, yt, fp8 ? int(In::FP8) : int(In::BF16), lab_, op);
  const cudaDataType ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, cd = yt == OutType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  std::vector<int> ids(256);
  int nids = 0;
  check(cublasLtMatmulAlgoGetIds(lt_, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, cd, cd, int(ids.size()), ids.data(), &nids), op);
  ids.resize(size_t(nids));
  // the algorithms the heuristic offers first (Hopper's own kernels), so that `max` is not spent
  // on older architectures' ones
  std::vector<int> first;
  for (const auto& r : heuristics(m, n, k, k, n, yt, fp8 ? In::FP8 : In::BF16, op)) {
    int32_t id = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
    if (std::find(first.begin(), first.end(), id) == first.end()) first.push_back(id);
  }
  std::stable_partition(ids.begin(), ids.end(), [&](int id) { return std::find(first.begin(), first.end(), id) != first.end(); });
  std::vector<Candidate> out;
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
  for (int id : ids) {
    if (out.size() >= max) break;
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(lt_, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, cd, cd, id, &base) != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<uint32_t> tiles = cap_ids(base, CUBLASLT_ALGO_CAP_TILE_IDS), stages = cap_ids(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles = {CUBLASLT_MATMUL_TILE_UNDEFINED};
    if (stages.empty()) stages = {CUBLASLT_MATMUL_STAGES_UNDEFINED};
    uint32_t swizzle_cap = 0;
    size_t got = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_cap, sizeof swizzle_cap, &got);
    for (uint32_t tile : tiles)
      for (uint32_t stage : stages)
        for (uint32_t swizzle = 0; swizzle <= (swizzle_cap ? 1u : 0u); ++swizzle)
          for (uint16_t cluster : clusters) {
            if (out.size() >= max) break;
            cublasLtMatmulAlgo_t a = base;
            const int32_t one = 1;
            const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
            if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof stage) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle) != CUBLAS_STATUS_SUCCESS)
              continue;
            // (an algorithm without cluster shapes refuses the attribute: AUTO only)
            if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster) != CUBLAS_STATUS_SUCCESS &&
                cluster != CUBLASLT_CLUSTER_SHAPE_AUTO)
              continue;
            cublasLtMatmulHeuristicResult_t r{};
            if (cublasLtMatmulAlgoCheck(lt_, l.desc, l.a, l.b, l.c, l.c, &a, &r) != CUBLAS_STATUS_SUCCESS || r.workspaceSize > workspace_.bytes())
              continue;
            out.push_back(candidate_of(a));
          }
  }
  destroy(l);
  return out;
}

// The layouts are kept per shape (as plan() keeps the engine's), so that timing a candidate
// over many calls times the GEMMs, not their descriptors.
void Gemm::run_candidate(const Candidate& c, bool fp8, const void* x, int64_t m, int64_t k, const void* w, int64_t n, void* y, OutType yt,
                         const char* op) {
  Key key{m, n, k, k, n, int(yt), false, int(fp8 ? In::FP8 : In::BF16), 0};
  auto it = candidate_layouts_.find(key);
  if (it == candidate_layouts_.end()) {
    Layouts l = make_layouts(m, n, k, k, n, yt, fp8 ? int(In::FP8) : int(In::BF16), lab_, op);
    Plan p;
    p.desc = l.desc;
    p.a = l.a;
    p.b = l.b;
    p.c = l.c;
    p.alpha_vector = fp8 && lab_.fp8_alpha_vector;
    it = candidate_layouts_.emplace(key, p).first;
  }
  Plan p = it->second;
  p.algo = c.algo;
  launch(p, x, w, y, false, op);
}

void Gemm::launch(Plan& p, const void* x, const void* w, void* y, bool accumulate, const char* op, float alpha) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (p.ep) check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_, sizeof bias_), op);
  const void* a = p.alpha_vector ? static_cast<const void*>(lab_.fp8_alpha_vector) : &alpha;
  check(cublasLtMatmul(lt_, p.desc, a, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_.get(), workspace_.bytes(),
                       stream_),
        op);
  if (sync_each_launch()) check(cudaStreamSynchronize(stream_), op);
}

}  // namespace clefrt::cuda

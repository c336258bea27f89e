#pragma once
// cuDNN's fused (flash) attention through its backend graph API, for the backbone's packed batches:
// causal, GQA, each sequence's queries at the end of its keys (a continuation of a cached prefix
// sees the prefix's keys first), any number of sequences of any lengths in one call. libcudnn.so.9
// is opened at run time (dlopen): the build needs cuDNN's headers only, and an engine without
// cuDNN says so and keeps clefrt's kernel (EngineOptions::attention).
//
// The bits of a query's output depend on its own keys only, not on its batch, its position in
// the call, the plan's bounds or how many of its sequence's queries the call holds (measured:
// bench/results/2026-12-04-h200-cudnn-attention-and-bf16-buckets.md; the GPU tests check it), so batch
// invariance, the prefix cache's warm = cold and the steps' bits hold on this path as on ours.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/runtime/buffer.h"

namespace clefrt::cuda {

using bf16 = __nv_bfloat16;

// Opens libcudnn.so.9 once. false with the reason when it does not load, lacks a function or is
// older than kCudnnMinVersion (the graph's padding mask with a bottom-right causal mask).
bool cudnn_available(std::string* why);
size_t cudnn_loaded_version();  // cudnnGetVersion() of the loaded library (0: not loaded)
constexpr size_t kCudnnMinVersion = 90500;

// One cuDNN graph and its plan: the attention of `b` sequences, bf16 in and out. q rows of `ldq`
// elements (head h's d dims at h * hsq), k / v likewise (hkv heads), o rows of `ldo` (head h at
// h * d, or at h * hso when hso is set: o written over q's padded rows). Dense: sequence i is
// rows [i * sq, (i + 1) * sq) of every tensor, sq = skv. Ragged:
// sequence i's rows start at the element offsets of CudnnRagged, its lengths are seq_q[i] <= sq,
// seq_kv[i] <= skv (sq / skv: the plan's bounds) and the causal mask is aligned bottom-right.
struct CudnnShape {
  int64_t b, sq, skv, hq, hkv, d;
  int64_t ldq, hsq, ldk, hsk, ldv, hsv, ldo;
  bool causal, ragged = false;
  int64_t hso = 0;  // o's head stride (0: d)
};
// Device arrays: element offsets [b + 1] of each sequence's first row, lengths [b] (int32).
struct CudnnRagged {
  const int32_t *q_off, *k_off, *v_off, *o_off, *seq_q, *seq_kv;
};

class CudnnGraph {
 public:
  CudnnGraph(void* handle, const CudnnShape& g);  // builds and plans; throws Error naming cuDNN's reason
  ~CudnnGraph();
  CudnnGraph(const CudnnGraph&) = delete;
  CudnnGraph& operator=(const CudnnGraph&) = delete;
  void run(const bf16* q, const bf16* k, const bf16* v, bf16* o, cudaStream_t s, const CudnnRagged* r = nullptr);
  double build_ms() const { return build_ms_; }
  int config() const { return config_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Descs;
  void* handle_;
  CudnnShape g_;
  std::unique_ptr<Descs> d_;
  DeviceBuffer workspace_;
  int config_ = -1;
  int64_t workspace_bytes_ = 0;
  double build_ms_ = 0;
  float scale_ = 1, neg_ = 0;  // by value: read at each execution
};

// A cuDNN handle (cudnnHandle_t) for the current device, destroyed with it.
class CudnnHandle {
 public:
  CudnnHandle();  // throws when cuDNN is not available
  ~CudnnHandle();
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  void* get() const { return h_; }

 private:
  void* h_ = nullptr;
};

// The ragged arrays of a packed batch as int32 for the device, each of its six arrays starting at
// a multiple of 4 ints (16 bytes): sequences i < n with query rows [qrow, qrow + qlen) and key rows
// [krow, krow + kvlen); b >= n (the rest empty). Appended to `out`; returns where they start.
struct RaggedSeq {
  int64_t qrow, qlen, krow, kvlen;
};
size_t append_ragged(std::vector<int32_t>& out, const std::vector<RaggedSeq>& seqs, int64_t b, int64_t ldq, int64_t ldk, int64_t ldv,
                     int64_t ldo);
size_t ragged_ints(int64_t b);  // what append_ragged adds for b
CudnnRagged ragged_at(const int32_t* base, int64_t b);  // the arrays of append_ragged's block at `base`

// The plans' bounds: powers of two from 64 (sequences: from 1).
int64_t cudnn_bound(int64_t n, int64_t from = 64);

// The backbone's attention: q [rows, hq, d], k [rows, hkv, d], v rows of ldv (head h at h * d),
// o [rows, hq, d]; plans by (sequences, longest keys, ldv) bounds, built on first use (~50 ms each,
// not logged).
class CudnnAttention {
 public:
  CudnnAttention(int64_t hq, int64_t hkv, int64_t d);
  void run(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, bf16* o, const CudnnRagged& r, int64_t b, int64_t max_kv,
           cudaStream_t s);
  std::string describe() const;  // "cuDNN 9.19.0 fused attention"

 private:
  int64_t hq_, hkv_, d_;
  CudnnHandle handle_;
  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<CudnnGraph>> plans_;
};

// The vision tower's attention: bidirectional within each frame (an image's patches see every
// patch of their own frame and nothing else), q / k / v rows `ld` elements apart (heads * dp
// unless given: the tower hands its qkv GEMM's rows, q | k | v, 3 * hidden apart), head h's d <= dp
// dims at h * dp (dp = d: heads packed, as the tower runs it where d % 8 == 0; else zero-padded),
// the output written over q's rows (head stride dp).
// Frames under kDenseFrame patches share a launch as ragged sequences (plans by (frames, longest
// frame) bounds); a larger frame runs alone in a dense plan of its own length, which has no
// padding mask (0.124 vs 0.149 ms at 3,072 patches, 3.10 vs 3.35 at 16,384:
// bench/results/2026-12-04-h200-lab-cudnn-05d4ad4.txt); a plan per length, built when the length
// first comes (~50 ms), up to kDensePlans of them kept (the least recently used goes). Either
// way a frame's outputs depend on its own size only, not on the other frames of its batch
// (measured in the lab; the GPU tests check an image alone vs packed, bit for bit).
class CudnnFrameAttention {
 public:
  static constexpr int64_t kDenseFrame = 2048;
  static constexpr size_t kDensePlans = 64;
  static bool dense(int64_t frame) { return frame >= kDenseFrame; }  // run_dense's frames, else run's
  // Builds the smallest plan (one frame of 64 patches) up front: throws Error with cuDNN's reason
  // when it cannot run this shape, before any image needs it.
  CudnnFrameAttention(int64_t heads, int64_t d, int64_t dp, int64_t ld = 0);
  // `r`: ragged arrays for b frames, each under kDenseFrame patches (append_ragged with ld() for
  // q, k, v and o)
  void run(bf16* q, const bf16* k, const bf16* v, const CudnnRagged& r, int64_t b, int64_t longest, cudaStream_t s);
  // One frame of n >= kDenseFrame patches: rows [0, n) of q, k, v
  void run_dense(bf16* q, const bf16* k, const bf16* v, int64_t n, cudaStream_t s);
  int64_t ld() const { return ld_; }  // the rows' stride in q, k, v and o
  int64_t dp() const { return dp_; }  // a head's stride in q, k, v and o (d: packed heads)

 private:
  int64_t heads_, d_, dp_, ld_;
  CudnnHandle handle_;
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<CudnnGraph>> plans_;
  std::map<int64_t, std::pair<std::unique_ptr<CudnnGraph>, uint64_t>> dense_;  // length -> plan, last use
  uint64_t uses_ = 0;
  CudnnGraph& plan(int64_t nb, int64_t ns);
  CudnnShape shape(int64_t nb, int64_t ns, bool ragged) const;
};

}  // namespace clefrt::cuda

// The Clef forward pass on one GPU for a packed batch of encoded requests: the backbone over all
// tokens at once (each request keeps its own attention and GDN state), then the joint head over
// all requests at once. Memory is planned up front for a token budget; a batch over the budget
// is refused before anything runs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/buffer.h"
#include "cuda/device_model.h"
#include "cuda/gemm.h"
#include "schema/encode.h"

namespace clefrt::cuda {

struct ForwardOptions {
  int64_t max_tokens = 16384;  // the activation arena holds a batch of this many tokens
  int64_t max_seqs = 256;      // requests per batch
  bool batch_invariant = true; // GEMM algorithms fixed per shape class (see gemm.h)
};

class Forward {
 public:
  Forward(const DevModel& m, ForwardOptions o);
  ~Forward();

  // Per request, per question, option probabilities (encoded option order). Throws a 413
  // context_length_exceeded Error when the batch exceeds the plan (max_tokens / max_seqs).
  std::vector<std::vector<std::vector<double>>> run(const std::vector<const Encoded*>& batch);

  // Bytes of the activation arena for a plan (weights not included).
  static size_t arena_bytes(const model::TextConfig& c, const model::HeadConfig& hc, int64_t max_tokens, int64_t max_seqs);
  size_t arena_bytes() const { return arena_.capacity(); }
  const ForwardOptions& options() const { return o_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Batch;
  void backbone(Batch& b);
  void head(Batch& b);

  const DevModel& m_;
  ForwardOptions o_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  Arena arena_;
};

}  // namespace clefrt::cuda

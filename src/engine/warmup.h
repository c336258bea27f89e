// The warm-up (EngineOptions::warmup): forwards of made-up requests run when the engine opens,
// before it takes any, so that the work a GPU engine does the first time it meets a size is not
// paid by the first real requests of that size: the GEMM algorithm of each m bucket is timed
// at its first call (cuda/runtime/gemm.h, tune: up to 9 candidates on the whole call), and the
// cuDNN attention plan of each (sequences, longest keys) bound is built at its first use (~50 ms
// each, not logged). Without it, a busy server's first large batches paid for both.
// The smallest m bucket (<= 512 tokens: one short request) is left to the first real request:
// the candidates cuBLASLt's heuristic offers change with m, and a warm-up at 320 tokens left the
// blog request (318) a slower tile than its own first call chose (measured:
// bench/results/2026-12-06-h100-session42.md, call 3); its tuning costs little there.
#pragma once
#include <cstdint>
#include <vector>

#include <clefrt/clefrt.h>

namespace clefrt {

class EngineCore;
struct RequestLimits;

// What a forward of the engine may hold, and the warm-up request's size.
struct WarmupLimits {
  int64_t max_batch_tokens = 0;    // the scheduler's (EngineOptions::max_batch_tokens)
  int64_t max_batch_requests = 0;  // EngineOptions::max_batch_requests
  int64_t max_batch_options = 0;   // option spans a forward holds (EngineCore::max_batch_options)
  int64_t max_single_tokens = 0;   // the longest request that runs as one forward (not in steps, within max_length)
  int64_t request_tokens = 0;      // the short requests' length
  int64_t request_options = 0;     // option spans of one request
};

// One forward of the warm-up: `requests` requests of `tokens` tokens each.
struct WarmupForward {
  int64_t requests = 0, tokens = 0;
};

// The warm-up's forwards, in order: batches of 2, 4, 8, ... short requests up to as many as a
// forward holds (the sequence-count bounds of the attention plans from 2 at the short requests'
// keys bound, and the GEMMs' m buckets above 512 first met at the sizes such batches have), then
// one request each of 2,048 and 8,192 tokens where a request that long runs as one forward (the
// long keys' plans). Every forward within the limits; none repeated.
std::vector<WarmupForward> warmup_plan(const WarmupLimits& l);

// The short requests' length: a classification request of a few hundred tokens (keys bound 512,
// the blog request's).
constexpr int64_t kWarmupRequestTokens = 320;

// Runs the warm-up on `core` (a GPU engine's; nothing on the CPU, which has nothing to warm),
// reporting a "warm-up" stage when opts.progress is on. The forwards bypass the prefix cache and
// their answers are dropped. Returns how many forwards ran.
size_t warm_up(const EngineCore& core, const EngineOptions& opts, const RequestLimits& limits);

}  // namespace clefrt

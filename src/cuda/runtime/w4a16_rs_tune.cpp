#include "cuda/runtime/w4a16_rs_tune.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/event_timer.h"

namespace clefrt::cuda {

W4A16RsTuner::W4A16RsTuner(cudaStream_t s, Nvfp4RsWork* work, bool tune) : s_(s), work_(work), tune_(tune) {}

void W4A16RsTuner::launch(const Choice& c, const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales,
                          const Nvfp4RsTables& tables, int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate) {
  nvfp4_gemm_rs(x, m, k, ldx, packed, scales, tables, n, y, y_f32, ldy, accumulate, s_, work_, &c);
}

void W4A16RsTuner::run(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales,
                       const Nvfp4RsTables& tables, int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, const char* op) {
  if (m == 0 || n == 0) return;
  Choice c;
  if (!tune_) {
    c = nvfp4_gemm_rs_tile(m, n);
  } else {
    const Key key{(m + 63) / 64, n, k, ldx, ldy, y_f32, accumulate};
    auto it = chosen_.find(key);
    if (it == chosen_.end()) it = chosen_.emplace(key, tune(x, m, k, ldx, packed, scales, tables, n, y, y_f32, ldy, accumulate, op)).first;
    c = it->second;
  }
  launch(c, x, m, k, ldx, packed, scales, tables, n, y, y_f32, ldy, accumulate);
}

W4A16RsTuner::Choice W4A16RsTuner::tune(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales,
                                        const Nvfp4RsTables& tables, int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate,
                                        const char* op) {
  // a CUDA graph's capture cannot hold the timing (it synchronizes and allocates): refused, so the
  // capture fails and the forward runs eagerly and tunes
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s_, &capturing), op);
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": a W4A16 short-input GEMM shape first met inside a CUDA graph capture");
  const std::vector<Choice> cands = nvfp4_gemm_rs_candidates(m, n, work_);
  const Choice& reference = cands[0];
  const size_t es = y_f32 ? 4 : 2;
  const int64_t rows = std::min<int64_t>(m, 64);
  const size_t probe_bytes = size_t(rows) * size_t(n) * es;
  // accumulate: the timing runs go to scratch, not into the sums y holds
  DeviceBuffer want_d, got_d, timed;
  try {
    want_d = DeviceBuffer(probe_bytes, "W4A16 tile probe");
    got_d = DeviceBuffer(probe_bytes, "W4A16 tile probe");
    if (accumulate) timed = DeviceBuffer(size_t(m) * size_t(ldy) * es, "W4A16 tile timing");
  } catch (const Error&) {  // no room for the probe (a card near full): nvfp4_gemm_rs_tile's, untimed
    std::fprintf(stderr, "w4a16 tune: %s: no GPU memory left to time the tiles; %s untimed\n", op, reference.name().c_str());
    return reference;
  }
  void* into = accumulate ? timed.get() : y;
  std::vector<char> want(probe_bytes), got(probe_bytes);
  auto probe = [&](const Choice& c, DeviceBuffer& out, std::vector<char>& host) {
    check(cudaMemsetAsync(out.get(), 0, probe_bytes, s_), op);
    nvfp4_gemm_rs(x, rows, k, ldx, packed, scales, tables, n, out.get(), y_f32, n, false, s_, nullptr, &c);
    check(cudaMemcpyAsync(host.data(), out.get(), probe_bytes, cudaMemcpyDeviceToHost, s_), op);
    check(cudaStreamSynchronize(s_), op);
  };
  static const bool log = env_flag("CLEFRT_GEMM_TUNE_LOG");
  std::string report;
  EventTimer timer(op);
  auto describe = [&](size_t i) {
    const int64_t g = nvfp4_gemm_rs_grid(m, n, cands[i], work_);
    return cands[i].name() + (g > 0 ? ", stream-K over " + std::to_string(g) + " CTAs" : std::string());
  };
  auto time_ms = [&](size_t i) {
    const Choice& c = cands[i];
    launch(c, x, m, k, ldx, packed, scales, tables, n, into, y_f32, ldy, false);  // warm
    constexpr int kRuns = 5;
    timer.start(s_);
    for (int r = 0; r < kRuns; ++r) launch(c, x, m, k, ldx, packed, scales, tables, n, into, y_f32, ldy, false);
    const float ms = float(timer.stop_ms(s_)) / kRuns;
    if (log) report += "\n  " + std::to_string(ms * 1000) + " us  " + describe(i);
    return ms;
  };
  // a kernel's bits do not depend on its grid (the probe runs a CTA a tile): probed once a kernel
  std::vector<std::pair<Choice, bool>> verdicts{{reference, true}};
  auto same_bits = [&](const Choice& c) {
    for (const auto& [t, ok] : verdicts)
      if (t.same_kernel(c)) return ok;
    probe(c, got_d, got);
    const bool ok = got == want;
    if (!ok)
      std::fprintf(stderr, "w4a16 tune: %s: the %s tile rounds differently from %s; not used\n", op, c.name().c_str(), reference.name().c_str());
    verdicts.emplace_back(c, ok);
    return ok;
  };
  probe(reference, want_d, want);
  size_t best = 0;
  float best_ms = time_ms(0);
  for (size_t i = 1; i < cands.size(); ++i) {
    if (!same_bits(cands[i])) continue;
    const float ms = time_ms(i);
    if (ms < best_ms) best_ms = ms, best = i;
  }
  if (log)
    std::fprintf(stderr, "w4a16 tune: %s m %lld n %lld k %lld: picked %s%s\n", op, (long long)m, (long long)n, (long long)k,
                 describe(best).c_str(), report.c_str());
  return cands[best];
}

}  // namespace clefrt::cuda

// The short-input W4A16 GEMM (nvfp4_gemm_rs) with its tile timed, as Gemm::tune times cuBLASLt's
// candidates: every compiled tile gives the same bits (the sums of every output element run over
// k in the same order, whatever the tile: the GPU tests compare them), but which is fastest
// depends on m, n, k and the GPU's SM count, the channel tiles of the narrow shapes (n 5,120: 80
// of 64 channels) filling too few SMs at one CTA a tile. So per m bucket (64 tokens wide) and
// shape, the first call times the candidates (each compiled tile not mostly padding, a CTA a tile
// and each distinct stream-K grid: every resident CTA, 1, 2 or 3 an SM) on the whole call and
// keeps the fastest among those whose output on the call's first (up to) 64 rows equals
// nvfp4_gemm_rs_tile's in every bit.
// CLEFRT_GEMM_TUNE_LOG=1 prints the timings.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cuda/ops/kernels_quant.h"

namespace clefrt::cuda {

class W4A16RsTuner {
 public:
  // work: the stream-K scratch (none: a CTA a tile always); tune false: nvfp4_gemm_rs_tile's
  // tile, untimed (the lab's comparison)
  W4A16RsTuner(cudaStream_t s, Nvfp4RsWork* work, bool tune);
  // nvfp4_gemm_rs with the key's chosen tile (timed first if this is the key's first call;
  // refused inside a CUDA graph capture, as Gemm's tuning is)
  void run(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const Nvfp4RsTables& tables,
           int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, const char* op);

 private:
  using Choice = RsTile;  // with its stream-K grid (per_sm)
  // m bucket, n, k, ldx, ldy, y_f32, accumulate
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  Choice tune(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const Nvfp4RsTables& tables,
              int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, const char* op);
  void launch(const Choice& c, const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales,
              const Nvfp4RsTables& tables, int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate);

  cudaStream_t s_;
  Nvfp4RsWork* work_;
  bool tune_;
  std::map<Key, Choice> chosen_;
};

}  // namespace clefrt::cuda

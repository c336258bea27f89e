// The FP8 GEMM of our own (fp8_gemm_wgmma.cuh) as the forward calls it: unscaled, in cuBLASLt's
// place (Gemm::run_fp8 under the lab switch CLEFRT_LAB_FP8_OWN_GEMM); and with its epilogues
// (scales, fp32 add, SwiGLU: the GPU tests).
#include <string>

#include "common/error.h"
#include "cuda/ops/fp8_gemm_wgmma.cuh"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {

bool fp8_gemm_own_available() { return sm90a_kernels_run_here(); }

void fp8_gemm_own_epilogue(int form, const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, const float* rs, const float* cs, void* y,
                           Fp8OwnOut out, int64_t ldy, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  if (!fp8_gemm_own_available())
    throw Error(Status::Internal, "internal_error", "fp8_gemm_own: needs an sm_90a build on a compute capability 9.0 GPU");
  if (form < 1 || form > 4) throw Error(Status::Internal, "internal_error", "fp8_gemm_own: form " + std::to_string(form) + " (1 to 4)");
  if (out == Fp8OwnOut::SwiGLU && (!rs || !cs || n % 16 != 0))
    throw Error(Status::Internal, "internal_error",
                "fp8_gemm_own: SwiGLU needs the scales and n a multiple of 16 (gate|up rows interleaved in groups of 8), n " + std::to_string(n));
  if (form == 1) fp8own::fp8_gemm_wgmma<5>(x, m, k, w, n, rs, cs, y, ldy, out, s);
  else if (form == 4) fp8own::fp8_gemm_ws<4, 1, 16, 1, 192>(x, m, k, w, n, rs, cs, y, ldy, out, s);
  // 256-row tiles where m fills the SMs' waves with them; 128 below (the lab's faster form at m
  // 318); the same bits either way
  else if (m >= 2048 && form == 3) fp8own::fp8_gemm_ws<4, 2, 8, 2>(x, m, k, w, n, rs, cs, y, ldy, out, s);
  else if (m >= 2048) fp8own::fp8_gemm_ws<4, 2, 8>(x, m, k, w, n, rs, cs, y, ldy, out, s);
  else fp8own::fp8_gemm_ws<6, 1, 16>(x, m, k, w, n, rs, cs, y, ldy, out, s);
}

void fp8_gemm_own(int form, const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, void* y, bool y_f32, int64_t ldy, cudaStream_t s) {
  fp8_gemm_own_epilogue(form, x, m, k, w, n, nullptr, nullptr, y, y_f32 ? Fp8OwnOut::F32 : Fp8OwnOut::BF16, ldy, s);
}

}  // namespace clefrt::cuda

// The card's own limits, measured rather than taken from a datasheet: bf16 GEMM rate through
// cuBLASLt (8192^3, fp32 accumulate) and device-to-device copy bandwidth.
#pragma once
#include <string>

namespace clefrt::cuda {

struct HardwareLimits {
  std::string gpu;
  double mem_total_gib = 0;
  double peak_bf16_tflops = 0;  // best of several timed 8192 x 8192 x 8192 GEMMs
  double copy_gbps = 0;         // bytes read + written per second by cudaMemcpy device->device (2 GiB)
};

HardwareLimits measure_hardware();
double gpu_used_gib();  // total - free, as cudaMemGetInfo reports it

}  // namespace clefrt::cuda

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

// cudaProfilerStart (start) or cudaProfilerStop: the region a profiler started with collection
// off records (Nsight Compute's --profile-from-start off), so that what runs before it (loading,
// the GEMMs' tuning: its timings under the profiler are not the card's) stays unprofiled.
void profiler_range(bool start);

// The GPU this process runs on (device 0), as the load line and /health name it.
struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  double mem_total_gib = 0;
  int capability() const { return major * 10 + minor; }  // 90 for 9.0
};
DeviceInfo device_info();
// Throws a 503 "device_unavailable" Error for a GPU this build cannot run: compute capability
// below 8.0 (Ampere), or none of the build's architectures (`build`, e.g. "sm_90a") runs on it.
void check_device_supported(const std::string& build);
// The build has sm_90a code (wgmma, TMA) and the current device is compute capability 9.0: the
// W4A16 GEMM's and the GDN scan's Hopper kernels may run (queried once).
bool sm90a_kernels_run_here();
// The current device's SMs (queried once): the W4A16 GEMM's tile and the GDN scan's CTA shape.
int sm_count();
double gpu_used_gib();  // total - free, as cudaMemGetInfo reports it
double gpu_free_bytes();  // free, as cudaMemGetInfo reports it

}  // namespace clefrt::cuda

#include "cuda/runtime/hardware.h"

#include <cuda_profiler_api.h>

#include <algorithm>

#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/event_timer.h"
#include "cuda/runtime/gemm.h"
#include "cuda/ops/kernels.h"

namespace clefrt::cuda {

DeviceInfo device_info() {
  DeviceInfo d;
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.mem_total_gib = double(p.totalGlobalMem) / double(1ull << 30);
  return d;
}

void check_device_supported(const std::string& build) {
  const DeviceInfo d = device_info();
  const std::string which = d.name + " (compute capability " + std::to_string(d.major) + "." + std::to_string(d.minor) + ")";
  if (d.capability() < 80)
    throw Error(Status::Unavailable, "device_unavailable",
                "clefrt's CUDA engine needs compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell); this GPU is " + which +
                    ": run with --device cpu");
  std::string why;
  if (!kernels_have_image(&why))
    throw Error(Status::Unavailable, "device_unavailable",
                "this build has no GPU code for " + which + " (" + build + "): rebuild with CUDAARCHS set to its architecture (" +
                    std::to_string(d.major) + std::to_string(d.minor) + (d.major >= 9 ? "a" : "") +
                    "), or scripts/build_release.sh for every supported one (" + why + ")");
}

HardwareLimits measure_hardware() {
  HardwareLimits h;
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  h.gpu = p.name;
  h.mem_total_gib = double(p.totalGlobalMem) / double(1ull << 30);
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  {
    const int64_t n = 8192;
    DeviceBuffer a(size_t(n * n) * 2), b(size_t(n * n) * 2), c(size_t(n * n) * 2);
    fill_normal_bf16(a.as<bf16>(), n * n, 1, 0, 1, s);
    fill_normal_bf16(b.as<bf16>(), n * n, 2, 0, 1, s);
    Gemm g(s, false);
    EventTimer t("event");
    for (int i = 0; i < 3; ++i) g.run(a.as<bf16>(), n, n, n, b.as<bf16>(), n, c.get(), OutType::BF16, n, false, "peak gemm");
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      t.start(s);
      for (int i = 0; i < 10; ++i) g.run(a.as<bf16>(), n, n, n, b.as<bf16>(), n, c.get(), OutType::BF16, n, false, "peak gemm");
      best = std::min(best, t.stop_ms(s) / 10);
    }
    h.peak_bf16_tflops = 2.0 * double(n) * n * n / (best * 1e-3) / 1e12;
  }
  {
    const size_t bytes = size_t(2) << 30;
    DeviceBuffer a(bytes), b(bytes);
    check(cudaMemsetAsync(a.get(), 1, bytes, s), "memset");
    EventTimer t("event");
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {
      t.start(s);
      check(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s), "copy");
      best = std::min(best, t.stop_ms(s));
    }
    h.copy_gbps = 2.0 * double(bytes) / (best * 1e-3) / 1e9;
  }
  cudaStreamDestroy(s);
  return h;
}

double gpu_free_bytes() {
  size_t free_b = 0, total = 0;
  check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  return double(free_b);
}

double gpu_used_gib() {
  size_t free_b = 0, total = 0;
  check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  return double(total - free_b) / double(1ull << 30);
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    check(cudaGetDevice(&dev), "sm_count");
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev), "sm_count");
    return v;
  }();
  return n;
}

bool sm90a_kernels_run_here() {
#ifdef CLEFRT_SM90A
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    check(cudaGetDevice(&dev), "sm90a_kernels_run_here");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "sm90a_kernels_run_here");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "sm90a_kernels_run_here");
    return major == 9 && minor == 0;
  }();
  return ok;
#else
  return false;
#endif
}

void profiler_range(bool start) { check(start ? cudaProfilerStart() : cudaProfilerStop(), start ? "cudaProfilerStart" : "cudaProfilerStop"); }

}  // namespace clefrt::cuda

#include "cuda/runtime/power.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

namespace clefrt::cuda {

namespace {
// NVML's C API as far as read_power needs it (nvml.h's types: a device is an opaque pointer,
// results are ints with 0 for success, NVML_CLOCK_SM is 1)
using Device = void*;
struct Nvml {
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Device*) = nullptr;
  int (*energy)(Device, unsigned long long*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;
  int (*power)(Device, unsigned*) = nullptr;
  int (*reasons)(Device, unsigned long long*) = nullptr;
  Device dev = nullptr;
  std::string why;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.why = "libnvidia-ml.so.1 not found (the NVIDIA driver's NVML)";
      return;
    }
    auto sym = [&](auto& f, const char* name) { f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name)); };
    sym(n.init, "nvmlInit_v2");
    sym(n.by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
    sym(n.energy, "nvmlDeviceGetTotalEnergyConsumption");
    sym(n.clock, "nvmlDeviceGetClockInfo");
    sym(n.power, "nvmlDeviceGetPowerUsage");
    sym(n.reasons, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!n.reasons) sym(n.reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // older drivers' name
    if (!n.init || !n.by_pci || !n.energy || !n.clock || !n.power) {
      n.why = "libnvidia-ml.so.1 lacks the energy / clock functions";
      return;
    }
    if (const int r = n.init(); r != 0) {
      n.why = "nvmlInit failed (NVML error " + std::to_string(r) + ")";
      return;
    }
    int dev = 0;
    char bus[32] = {0};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
      n.why = "the CUDA device's PCI bus id is unknown";
      return;
    }
    if (const int r = n.by_pci(bus, &n.dev); r != 0) {
      n.why = std::string("NVML has no device at ") + bus + " (NVML error " + std::to_string(r) + ")";
      n.dev = nullptr;
    }
  });
  return n;
}
}  // namespace

PowerReading read_power() {
  const Nvml& n = nvml();
  PowerReading p;
  if (!n.dev) {
    p.why = n.why;
    return p;
  }
  unsigned long long mj = 0, reasons = 0;
  unsigned mhz = 0, mw = 0;
  if (n.energy(n.dev, &mj) != 0) {
    p.why = "the GPU reports no energy counter (NVML: Volta and later)";
    return p;
  }
  p.available = true;
  p.energy_j = double(mj) * 1e-3;
  if (n.clock(n.dev, 1, &mhz) == 0) p.sm_clock_mhz = mhz;
  if (n.power(n.dev, &mw) == 0) p.power_w = double(mw) * 1e-3;
  if (n.reasons && n.reasons(n.dev, &reasons) == 0) p.power_capped = (reasons & 0x4ull) != 0;  // nvmlClocksEventReasonSwPowerCap
  return p;
}

}  // namespace clefrt::cuda

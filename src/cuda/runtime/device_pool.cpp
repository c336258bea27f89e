#include "cuda/runtime/device_pool.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cuda/runtime/check.h"

namespace clefrt::cuda {

namespace {

// The driver's virtual memory functions, or null members when this driver lacks one.
struct Vmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 free_va = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  bool ok() const { return granularity && reserve && free_va && create && release && map && unmap && set_access; }
};

template <class F>
void entry(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 10020, cudaEnableDefault, &q) == cudaSuccess && q == cudaDriverEntryPointSuccess)
    fn = reinterpret_cast<F>(p);
  else
    cudaGetLastError();
}

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm x;
    entry("cuMemGetAllocationGranularity", x.granularity);
    entry("cuMemAddressReserve", x.reserve);
    entry("cuMemAddressFree", x.free_va);
    entry("cuMemCreate", x.create);
    entry("cuMemRelease", x.release);
    entry("cuMemMap", x.map);
    entry("cuMemUnmap", x.unmap);
    entry("cuMemSetAccess", x.set_access);
    return x;
  }();
  return v;
}

[[noreturn]] void out_of_memory(const char* what, size_t bytes) {
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  throw Error(Status::Internal, "device_error",
              std::string(what) + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory (" +
                  std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB)");
}

void driver_check(CUresult r, const char* op) {
  if (r != CUDA_SUCCESS) throw Error(Status::Internal, "device_error", std::string(op) + " failed (CUresult " + std::to_string(int(r)) + ")");
}

}  // namespace

struct DevicePool::Impl {
  CUdeviceptr base = 0;
  size_t va = 0, mapped = 0, used = 0, gran = 0;
  CUmemAllocationProp prop{};
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> maps;  // in address order from base

  void init() {
    const Vmm& v = vmm();
    if (!v.ok())
      throw Error(Status::Internal, "device_error", "the CUDA driver lacks the virtual memory functions (cuMemCreate / cuMemMap) the weight pool uses");
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaFree(nullptr), "CUDA context");  // the primary context current for the driver calls
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    driver_check(v.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
    size_t free_b = 0, total = 0;
    check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
    va = (total + gran - 1) / gran * gran;  // address space for every byte the GPU has
    driver_check(v.reserve(&base, va, gran, 0, 0), "cuMemAddressReserve");
  }
  ~Impl() {
    const Vmm& v = vmm();
    size_t at = 0;
    for (auto& [h, bytes] : maps) {
      v.unmap(base + at, bytes);
      v.release(h);
      at += bytes;
    }
    if (base) v.free_va(base, va);
  }
  void* alloc(size_t bytes, const char* what) {
    if (!base) init();
    const size_t at = (used + 255) & ~size_t(255), end = at + bytes;
    if (end > va) out_of_memory(what, bytes);
    if (end > mapped) {
      const Vmm& v = vmm();
      const size_t more = (end - mapped + gran - 1) / gran * gran;
      CUmemGenericAllocationHandle h{};
      if (v.create(&h, more, &prop, 0) != CUDA_SUCCESS) out_of_memory(what, bytes);
      CUresult r = v.map(base + mapped, more, 0, h, 0);
      if (r != CUDA_SUCCESS) {
        v.release(h);
        driver_check(r, "cuMemMap");
      }
      maps.emplace_back(h, more);  // unmapped + released by the destructor from here on
      CUmemAccessDesc acc{};
      acc.location = prop.location;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      driver_check(v.set_access(base + mapped, more, &acc, 1), "cuMemSetAccess");
      mapped += more;
    }
    used = end;
    return reinterpret_cast<void*>(base + at);
  }
};

DevicePool::DevicePool() : p_(std::make_unique<Impl>()) {}
DevicePool::~DevicePool() = default;
DevicePool::DevicePool(DevicePool&&) noexcept = default;
DevicePool& DevicePool::operator=(DevicePool&&) noexcept = default;

void* DevicePool::alloc(size_t bytes, const char* what) { return p_->alloc(bytes, what); }
size_t DevicePool::used() const { return p_ ? p_->used : 0; }
size_t DevicePool::reserved() const { return p_ ? p_->mapped : 0; }

}  // namespace clefrt::cuda

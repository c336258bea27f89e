// Long-lived device memory (the weights), handed out by a bump pointer from one contiguous range.
// cudaMalloc rounds every allocation up to a multiple of 2 MiB, which cost ~0.4 GiB over the
// ~700 weight tensors of the 27B NVFP4 model (measured on the H200: 200 x 10.6 MiB took 2,400
// MiB). The pool reserves address space once and maps physical memory behind the pointer in
// 2 MiB granules as it advances (the driver's virtual memory API, reached through the runtime's
// entry points, no libcuda link), so the model holds what it uses plus less than one granule.
// Pieces are 256-byte aligned and live as long as the pool.
#pragma once
#include <cstddef>
#include <memory>

namespace clefrt::cuda {

class DevicePool {
 public:
  DevicePool();
  ~DevicePool();
  DevicePool(DevicePool&&) noexcept;
  DevicePool& operator=(DevicePool&&) noexcept;

  // Throws Error (500, device_error) naming `what` when the GPU has no memory left.
  void* alloc(size_t bytes, const char* what);
  template <class T>
  T* alloc(size_t count, const char* what) { return static_cast<T*>(alloc(count * sizeof(T), what)); }
  size_t used() const;      // bytes handed out (with alignment)
  size_t reserved() const;  // GPU memory held for them

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace clefrt::cuda

// Owned device memory. Weights and the activation arena are DeviceBuffers; nothing is
// allocated while a forward runs (the arena is planned up front).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/runtime/check.h"

namespace clefrt::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const char* what = "cudaMalloc");
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Pinned host memory mapped into the GPU's address space: kernels read it over PCIe, row by
// row, only what they touch (--offload-embeddings keeps embed_tokens / lm_head here).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes, const char* what = "cudaHostAlloc");
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), d_(std::exchange(o.d_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(d_, o.d_);
    std::swap(n_, o.n_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* host() const { return p_; }
  void* device() const { return d_; }  // the address kernels use
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  void* d_ = nullptr;
  size_t n_ = 0;
};

// A bump allocator over one buffer: carve() hands out 256-byte aligned pieces.
class Arena {
 public:
  // An arena that only counts: carve() returns null and used() is the plan's size.
  static Arena counter() {
    Arena a;
    a.counting_ = true;
    return a;
  }
  void reserve(size_t bytes) { buf_ = DeviceBuffer(bytes, "activation arena"); used_ = 0; }
  void reset() { used_ = 0; }
  // Back (or forward) to an earlier used() mark: what was carved after it may be carved again
  // for buffers that are never live at the same time as it.
  void rewind(size_t used) { used_ = used; }
  template <class T>
  T* carve(size_t count, const char* what) { return static_cast<T*>(carve_bytes(count * sizeof(T), what)); }
  void* carve_bytes(size_t bytes, const char* what);
  size_t used() const { return used_; }
  size_t capacity() const { return buf_.bytes(); }

 private:
  DeviceBuffer buf_;
  size_t used_ = 0;
  bool counting_ = false;
};

// Host vector -> new device buffer.
template <class T>
DeviceBuffer upload(const std::vector<T>& v, const char* what) {
  DeviceBuffer b(v.size() * sizeof(T) + (v.empty() ? 16 : 0), what);
  if (!v.empty()) check(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return b;
}

}  // namespace clefrt::cuda

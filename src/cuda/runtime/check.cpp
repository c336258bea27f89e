#include "cuda/runtime/check.h"

#include <cstdlib>
#include <cstring>

#include "cuda/runtime/buffer.h"

namespace clefrt::cuda {

void throw_cuda(cudaError_t e, const char* op) {
  throw Error(Status::Internal, "device_error", std::string(op) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void throw_cublas(cublasStatus_t s, const char* op) {
  // cuBLASLt names few causes; a launch that fails for want of memory (its kernels are loaded on
  // first use) says only "execution failed": the free memory tells which
  const cudaError_t last = cudaGetLastError();  // reported, not lost
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  const char* what = s == CUBLAS_STATUS_EXECUTION_FAILED ? " (execution failed)"
                     : s == CUBLAS_STATUS_ALLOC_FAILED   ? " (allocation failed)"
                     : s == CUBLAS_STATUS_NOT_SUPPORTED  ? " (not supported)"
                                                         : "";
  throw Error(Status::Internal, "device_error", std::string(op) + ": cuBLASLt status " + std::to_string(int(s)) + what + "; " +
                                                    std::to_string(free_b >> 20) + " MiB of GPU memory free of " + std::to_string(total >> 20) +
                                                    (last != cudaSuccess ? std::string("; last CUDA error ") + cudaGetErrorName(last) : std::string()));
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

int64_t env_count(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || n < lo || n > hi)
    throw Error(Status::BadRequest, "usage", std::string(name) + "=" + v + ": a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
  return int64_t(n);
}

bool pdl_enabled() {  // pdl.cuh
  static const bool on = [] {
    if (env_count("CLEFRT_LAB_PDL", 0, 0, 1) == 0) return false;
    int dev = 0, major = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    return major >= 9;
  }();
  return on;
}

bool sync_each_launch() {
  static const bool on = env_flag("CLEFRT_CUDA_SYNC");
  return on;
}

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    throw Error(Status::Internal, "device_error",
                std::string(what) + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory (" +
                    std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

HostBuffer::HostBuffer(size_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  cudaError_t e = cudaHostAlloc(&p_, bytes, cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    throw Error(Status::Internal, "device_error",
                std::string(what) + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB of pinned host memory: " + cudaGetErrorString(e));
  }
  check(cudaHostGetDevicePointer(&d_, p_, 0), what);
}

HostBuffer::~HostBuffer() {
  if (p_) cudaFreeHost(p_);
}

void* Arena::carve_bytes(size_t bytes, const char* what) {
  const size_t at = (used_ + 255) & ~size_t(255);
  if (counting_) {
    used_ = at + bytes;
    return nullptr;
  }
  if (at + bytes > buf_.bytes())
    throw Error(Status::Internal, "internal_error",
                std::string("activation arena too small for ") + what + " (" + std::to_string(at + bytes) + " > " +
                    std::to_string(buf_.bytes()) + " bytes): the memory plan is wrong");
  used_ = at + bytes;
  return static_cast<char*>(buf_.get()) + at;
}

}  // namespace clefrt::cuda

// Every CUDA runtime / cuBLASLt call and kernel launch goes through these: a failure becomes a
// clefrt::Error (500, "device_error") naming the operation, never a silent wrong answer.
// CLEFRT_CUDA_SYNC=1 synchronizes after each launch so an asynchronous fault is reported
// against the kernel that caused it rather than the next call that notices.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace clefrt::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* op);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* op);
bool sync_each_launch();  // CLEFRT_CUDA_SYNC=1
// The lab's environment switches: env_flag is on for any value but "" and "0"; env_count is the
// whole number `name` holds in [lo, hi], or `fallback` when unset (an Error naming the variable
// for anything else).
bool env_flag(const char* name);
int64_t env_count(const char* name, int64_t fallback, int64_t lo, int64_t hi);
// Programmatic dependent launch (pdl.cuh): CLEFRT_LAB_PDL=1 on a compute capability 9.0+ device.
bool pdl_enabled();

inline void check(cudaError_t e, const char* op) {
  if (e != cudaSuccess) throw_cuda(e, op);
}
inline void check(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas(s, op);
}
// After a <<<>>> launch: launch errors now, execution errors too when CLEFRT_CUDA_SYNC=1.
inline void check_launch(const char* op) {
  check(cudaGetLastError(), op);
  if (sync_each_launch()) check(cudaDeviceSynchronize(), op);
}

}  // namespace clefrt::cuda

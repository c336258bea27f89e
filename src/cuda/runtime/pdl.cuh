// Programmatic dependent launch (compute capability 9.0+): a kernel launched with
// launch_after() may be scheduled while the kernel before it in the stream is still finishing, so
// its launch latency hides under that kernel's tail. Correct only for kernels whose first act is
// pdl_wait(): griddepcontrol.wait returns once every grid it depends on has completed and its
// writes are visible, so nothing such a kernel reads or writes can race with its predecessor.
// Stream capture records the dependency as a programmatic graph edge; the forward's graphs keep it.
//
// A lab switch (CLEFRT_LAB_PDL=1; measured without a clear gain on an H100 in session 41:
// docs/notes/cuda-graphs.md): off, launch_after() is a plain launch and pdl_wait() returns at once
// (a kernel launched without the attribute has no programmatic dependency).
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "cuda/runtime/check.h"

namespace clefrt::cuda {

// Call first in a kernel launched by launch_after().
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), with the programmatic-serialization attribute when
// pdl_enabled(); `extra` adds launch attributes of the caller's (a cluster shape), up to 3.
template <typename... Params, typename... Args>
void launch_after_ex(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                     const cudaLaunchAttribute* extra, int n_extra, Args&&... args) {
  if (n_extra < 0 || n_extra > 3)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": " + std::to_string(n_extra) + " extra launch attributes (0 to 3)");
  cudaLaunchAttribute attrs[4];
  int n = 0;
  for (int i = 0; i < n_extra; ++i) attrs[n++] = extra[i];
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = unsigned(n);
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op);
  check_launch(op);
}

template <typename... Params, typename... Args>
void launch_after(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_after_ex(op, kernel, grid, block, smem, s, nullptr, 0, std::forward<Args>(args)...);
}

}  // namespace clefrt::cuda

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

// Lets the kernel launched after this one by launch_programmatic() begin once every CTA of this
// grid has executed it (or exited): for a consumer that waits on flags the producer sets, not on
// the whole grid (gdn_prep_wgmma_k and gdn_scan_rs_k: GdnScratch::ready).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), with the programmatic-serialization attribute when
// `always` or pdl_enabled(); `extra` adds launch attributes of the caller's (a cluster shape), up to 3.
template <typename... Params, typename... Args>
void launch_pdl_ex(bool always, const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   const cudaLaunchAttribute* extra, int n_extra, Args&&... args) {
  if (n_extra < 0 || n_extra > 3)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": " + std::to_string(n_extra) + " extra launch attributes (0 to 3)");
  cudaLaunchAttribute attrs[4];
  int n = 0;
  for (int i = 0; i < n_extra; ++i) attrs[n++] = extra[i];
  if (always || pdl_enabled()) {
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

// launch_pdl_ex with the attribute when pdl_enabled()
template <typename... Params, typename... Args>
void launch_after_ex(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                     const cudaLaunchAttribute* extra, int n_extra, Args&&... args) {
  launch_pdl_ex(false, op, kernel, grid, block, smem, s, extra, n_extra, std::forward<Args>(args)...);
}

// A launch that may begin while the kernel before it in the stream runs, whether or not
// CLEFRT_LAB_PDL is on: its kernel must not read what that one writes before it knows it is
// written (a flag), nor call pdl_wait() if the overlap is the point (compute capability 9.0+).
template <typename... Params, typename... Args>
void launch_programmatic(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl_ex(true, op, kernel, grid, block, smem, s, nullptr, 0, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
void launch_after(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_after_ex(op, kernel, grid, block, smem, s, nullptr, 0, std::forward<Args>(args)...);
}

}  // namespace clefrt::cuda

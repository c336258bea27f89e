// Kernels on thread block clusters (compute capability 9.0 on): whether one can run here, and
// its launch.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime/hardware.h"

namespace clefrt::cuda {

// The most threads a CTA of `kernel` takes as compiled; 0 where it cannot run here: no thread
// block clusters, or no code of it for this device (a JIT of older PTX would run the body such
// kernels compile below sm_90, a trap).
inline int cluster_kernel_max_threads(const void* kernel) {
  if (device_info().major < 9) return 0;
  cudaFuncAttributes a{};
  const bool ok = cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.binaryVersion >= 90;
  cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  return ok ? a.maxThreadsPerBlock : 0;
}

// The launch attribute of clusters of `cl` CTAs along x.
inline cudaLaunchAttribute cluster_dim_x(unsigned cl) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = cl;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// `grid` CTAs along x in clusters of `cl` along x (grid a multiple of cl, cl at most 8: the
// portable size), with `smem` bytes of dynamic shared memory each, through cudaLaunchKernelEx. Its
// error is returned for check().
template <class... Params, class... Args>
cudaError_t launch_on_clusters_smem(void (*kernel)(Params...), unsigned grid, unsigned block, unsigned cl, size_t smem, cudaStream_t s,
                                    Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1] = {cluster_dim_x(cl)};
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
// The same without dynamic shared memory
template <class... Params, class... Args>
cudaError_t launch_on_clusters(void (*kernel)(Params...), unsigned grid, unsigned block, unsigned cl, cudaStream_t s, Args&&... args) {
  return launch_on_clusters_smem(kernel, grid, block, cl, 0, s, std::forward<Args>(args)...);
}

}  // namespace clefrt::cuda

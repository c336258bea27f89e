// A kernel launched on thread block clusters (compute capability 9.0 on): `grid` CTAs along x in
// clusters of `cl` along x (grid a multiple of cl, cl at most 8: the portable size), through
// cudaLaunchKernelEx. Its error is returned for check().
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace clefrt::cuda {

template <class... Params, class... Args>
cudaError_t launch_on_clusters(void (*kernel)(Params...), unsigned grid, unsigned block, unsigned cl, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = cl;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace clefrt::cuda

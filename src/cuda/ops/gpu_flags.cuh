// Flags between the CTAs of two kernels running at once (gdn_scan_rs_k waiting on the items of
// gdn_prep_wgmma_k, GdnScratch::ready): a release store by the writer once its data is written,
// relaxed or acquire loads by the reader, all at GPU scope (L2, where both kernels' SMs meet).
#pragma once
#include <cstdint>

namespace clefrt::cuda {

__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Issued early and its value tested later: the load does not hold the thread up until then.
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

}  // namespace clefrt::cuda

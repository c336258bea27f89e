// Shared-memory mbarriers (sm_90): split arrive / wait barriers between warp roles in a CTA
// (producer warps filling a pipeline stage, consumer warpgroups releasing it). A barrier of
// count c completes a phase when c arrivals have come; waiters name the phase by its parity
// (0, 1, 0, ...: the k-th completion has parity k % 2). PTX ISA, "Parallel Synchronization and
// Communication Instructions: mbarrier".
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace clefrt::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// One thread initializes; a __syncthreads() must follow before any other thread uses it.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Release semantics: this thread's earlier shared-memory writes are visible to whoever waits
// for the phase this arrival helps complete.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the phase of the given parity has completed (acquire semantics).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "retry:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra retry;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace clefrt::cuda

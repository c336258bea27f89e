// Hopper tensor-memory-accelerator copies (sm_90): one thread moves a whole 2-D box of a global
// tensor into shared memory (swizzled as the tensor map says), and the block learns of its arrival
// through an mbarrier whose transaction count the copy decrements. The threads spend no issue
// slots on addresses. PTX ISA: "cp.async.bulk.tensor", "mbarrier".
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda/runtime/check.h"

#include "cuda/ops/async_copy.cuh"

namespace clefrt::cuda {

// The driver's cuTensorMapEncodeTiled, reached through the runtime (no libcuda link), looked up
// once a process; `what` names the caller in the error when the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* what) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [&] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q), what);
    if (q != cudaDriverEntryPointSuccess || !fn)
      throw Error(Status::Internal, "internal_error", std::string(what) + ": the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A bf16 matrix [rows, k], rows ldx elements apart, as a TMA tensor map of [box_rows, box_k]
// boxes with the 128-byte swizzle (what wgmma_desc expects); rows past `rows` arrive as zeros.
// `what` names the caller in the error.
inline CUtensorMap bf16_tensor_map_sw128(const void* x, int64_t rows, int64_t k, int64_t ldx, int box_k, int box_rows, const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder(what);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)}, strides[1] = {cuuint64_t(ldx) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_k), cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(x), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(Status::Internal, "internal_error",
                std::string(what) + ": cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ") for x [" + std::to_string(rows) + ", " +
                    std::to_string(k) + "], row stride " + std::to_string(ldx));
  return map;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLEFRT_TMA 1
#endif

// One thread initializes; a __syncthreads() must follow before the barrier is used.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#ifdef CLEFRT_TMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
// The calling thread's arrival, announcing `bytes` of copies that will complete on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef CLEFRT_TMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// Blocks until the barrier's phase of the given parity (the k-th completion has parity k % 2)
// has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef CLEFRT_TMA
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}
// The box at (c0 = innermost coordinate, c1) of the tensor map into shared memory at dst;
// completes `bytes` (the box's size, out-of-bounds elements zero-filled and counted) on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#ifdef CLEFRT_TMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
#endif
}

// As tma_load_2d, the box written at the same shared-memory offset of every CTA of the cluster in
// cta_mask (bit r: rank r), each CTA's barrier at bar's offset completing the bytes it received.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar, uint16_t cta_mask) {
#ifdef CLEFRT_TMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(cta_mask)
      : "memory");
#endif
}
// The calling thread's arrival (no bytes announced: an empty barrier's release)
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifdef CLEFRT_TMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// An arrival on the barrier at bar's offset in the shared memory of the cluster's CTA `rank`
// (release at the CTA's scope, as CUTLASS's ClusterBarrier::arrive: .release.cluster made every
// arrival wait on the thread's outstanding memory operations, ERRBAR / CGAERRBAR in the SASS, and
// the FP8 GEMM's clusters 1.7x slower; s38 call 4).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
#ifdef CLEFRT_TMA
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
#endif
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#ifdef CLEFRT_TMA
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
// Every thread of every CTA of the cluster that has not exited (not .aligned: callable where a
// warp's threads diverged).
__device__ __forceinline__ void cluster_sync_all() {
#ifdef CLEFRT_TMA
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

}  // namespace clefrt::cuda

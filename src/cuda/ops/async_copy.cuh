// Asynchronous global -> shared copies (cp.async, sm_80+) and ldmatrix fragment loads, shared by
// the GDN and attention kernels.
//
// cp.async: every thread issues its 16-byte copies and none waits for one before issuing the
// next; a plain load-then-store loop waits a global-memory round trip per iteration. A copy with
// `valid` false reads nothing and zero-fills its 16 bytes. Both addresses 16-byte aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace clefrt::cuda {

// a generic pointer into shared memory as the 32-bit shared-window address PTX takes
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows (64 bf16) whose chunks are
// XOR-swizzled by row % 8: the 8 rows an ldmatrix phase or a wgmma core-matrix read touches sit in
// distinct banks. It is also wgmma's and TMA's "128-byte swizzle" when the tile is 1024-byte
// aligned (wgmma.cuh).
__device__ __forceinline__ int swizzle128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src, bool valid) {
  const unsigned d = smem_u32(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 bytes (through L1: .cg takes 16-byte copies only); both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* src, bool valid) {
  const unsigned d = smem_u32(smem_dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for this thread's copies (all but the newest `n` committed groups); a __syncthreads()
// after it makes every thread's copies visible to the block.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// rows x cols of T (cols a multiple of 16 bytes' worth) from src (row stride lds elements) to
// dst (row stride ldd), in 16-byte copies; rows >= valid_rows and columns >= valid_cols are
// zero-filled. All threads of the block take part. fp32 tiles (GDN) and bf16 ones (attention).
template <class T>
__device__ __forceinline__ void load_tile_async(T* dst, int ldd, const T* src, int64_t lds, int rows, int cols, int valid_rows,
                                                int valid_cols) {
  constexpr int V = 16 / int(sizeof(T));
  const int q = cols / V;
  for (int e = int(threadIdx.x); e < rows * q; e += int(blockDim.x)) {
    const int i = e / q, x = (e - i * q) * V;
    const bool in = i < valid_rows && x < valid_cols;
    cp_async16(dst + i * ldd + x, in ? src + i * lds + x : src, in);
  }
}

// ldmatrix: four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and
// receives in r[m] its fragment of matrix m (with .trans: of the transposed matrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  const unsigned a = smem_u32(row_addr);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  const unsigned a = smem_u32(row_addr);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

}  // namespace clefrt::cuda

// Hopper warpgroup MMA (wgmma, sm_90a only): shared-memory matrix descriptors and the bf16
// m64nNk16 instructions with fp32 accumulators, A K-major and B K-major or N-major in shared
// memory. PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate".
//
// Operand layout: K-major tiles of 64 bf16 (128 bytes) a row, "128-byte swizzle" (swizzle128 in
// async_copy.cuh): row r at r * 128, its 16-byte chunk c at ((c ^ (r % 8)) * 16), tiles
// 1024-byte aligned (the hardware swizzles by address bits). The descriptor of the 16-wide k step s starts 32 s bytes into the
// tile; SBO (next 8 rows) = 1024. The swizzle spreads the 8 rows the tensor cores read together
// over all 32 banks (the unswizzled "core matrix" layout measured 15% slower than mma.sync).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops/async_copy.cuh"  // smem_u32, swizzle128 (the layout below)

namespace clefrt::cuda {

__device__ __forceinline__ uint64_t wgmma_desc(const void* smem) {
  const uint64_t a = smem_u32(smem);
  // start address, LBO 1 (unused by swizzled K-major layouts), SBO 1024 (both >> 4), layout
  // type 1 = 128-byte swizzle (bits 62-63)
  return ((a & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// An N-major B operand (the wgmma's trans-b, 16-bit types only): B (K x N) stored with N
// contiguous, i.e. a K-major tile of the transposed matrix in the layout above with its rows as
// B's k and its 64-element panels as 64-wide slices of N: row k of the panel holding column n at
// (n / 64) * panel_bytes + k * 128, 16-byte chunk ((n % 64) / 8) ^ (k % 8). In the canonical
// N-major 128-byte-swizzle form (8 16-byte units of N contiguous, then the next N slice LBO
// bytes on; 8 rows of k 128 bytes apart, then the next 8 SBO bytes on): LBO = panel_bytes, SBO
// = 1024. A 16-wide k step s starts 2048 s bytes in (16 rows). So a [tokens][D] plane, the A
// operand of a product over D, is also the B operand of a product over tokens.
__device__ __forceinline__ uint64_t wgmma_desc_nmajor(const void* smem, uint32_t panel_bytes) {
  const uint64_t a = smem_u32(smem);
  return ((a & 0x3FFFF) >> 4) | (uint64_t((panel_bytes >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CLEFRT_WGMMA 1
#endif

// wgmma.fence: orders this thread's register writes (accumulators) before the next wgmma's reads.
__device__ __forceinline__ void wgmma_fence() {
#ifdef CLEFRT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef CLEFRT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most n committed groups of this warpgroup are in flight.
template <int n>
__device__ __forceinline__ void wgmma_wait() {
#ifdef CLEFRT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory");
#endif
}
// Generic-proxy shared-memory writes (st.shared, cp.async) become visible to wgmma's reads
// (the async proxy) after this fence and a barrier.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef CLEFRT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator registers across an asm boundary (between a
// wgmma and its wait the hardware still writes them).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// D (64 x N fp32, N / 2 per thread: d[4j .. 4j + 3] = rows 16 w + g and + 8, columns 8j + 2t and
// + 1 for warp w of the warpgroup, g = lane / 4, t = lane % 4) (+)= A (64 x 16) B (16 x N), A
// K-major in shared memory, B K-major (TB 0) or N-major (TB 1: wgmma_desc_nmajor); accumulate
// false overwrites D (its old values are never read).
template <int N, int TB = 0>
__device__ __forceinline__ void wgmma_bf16(float* d, uint64_t da, uint64_t db, bool accumulate);

// wgmma_bf16's instructions per N (a struct: the trans-b immediate is a template parameter too)
template <int N, int TB>
struct WgmmaBf16;

// eight accumulator operands d[i .. i + 7] of a wgmma asm (also fp8_gemm_wgmma.cuh's e4m3 ones)
#define CLEFRT_WGMMA_D8(i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

template <int TB>
struct WgmmaBf16<32, TB> {
  static __device__ __forceinline__ void run(float* d, uint64_t da, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, %19;\n}\n"
      : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8)
      : "l"(da), "l"(db), "r"(int(accumulate)), "n"(TB));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
  }
};

template <int TB>
struct WgmmaBf16<64, TB> {
  static __device__ __forceinline__ void run(float* d, uint64_t da, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n}\n"
      : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24)
      : "l"(da), "l"(db), "r"(int(accumulate)), "n"(TB));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
  }
};

template <int TB>
struct WgmmaBf16<128, TB> {
  static __device__ __forceinline__ void run(float* d, uint64_t da, uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %67;\n}\n"
      : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24), CLEFRT_WGMMA_D8(32), CLEFRT_WGMMA_D8(40),
        CLEFRT_WGMMA_D8(48), CLEFRT_WGMMA_D8(56)
      : "l"(da), "l"(db), "r"(int(accumulate)), "n"(TB));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
  }
};

// A from registers (wgmma's register-A form, 16-bit types): a[0..3] are this thread's bf16 pairs
// of the 64 x 16 A tile in the accumulator's own layout, rows 16 w + g and + 8, k 2t, 2t + 1
// and 2t + 8, 2t + 9 (wgmma_a_from_acc makes them from a 64 x N accumulator's 16 columns). SA:
// A's scale, +1 or -1 (D += A B or D -= A B). The register operands must not change between the
// issue and the wait.
template <int N, int TB, int SA>
struct WgmmaBf16Rs;

template <int TB, int SA>
struct WgmmaBf16Rs<64, TB, SA> {
  static __device__ __forceinline__ void run(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, %38, 1, %39;\n}\n"
        : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)), "n"(SA), "n"(TB));
#else
    (void)d, (void)a, (void)db, (void)accumulate;
    __trap();
#endif
  }
};

template <int TB, int SA>
struct WgmmaBf16Rs<128, TB, SA> {
  static __device__ __forceinline__ void run(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, %70, 1, %71;\n}\n"
        : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24), CLEFRT_WGMMA_D8(32), CLEFRT_WGMMA_D8(40),
          CLEFRT_WGMMA_D8(48), CLEFRT_WGMMA_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)), "n"(SA), "n"(TB));
#else
    (void)d, (void)a, (void)db, (void)accumulate;
    __trap();
#endif
  }
};

// 160 wide: the register-A W4A16 GEMM's token tile (kernels_w4a16_rs.cu: 318 tokens = 2 x 160)
template <int TB, int SA>
struct WgmmaBf16Rs<160, TB, SA> {
  static __device__ __forceinline__ void run(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
        "{%80, %81, %82, %83}, %84, p, %86, 1, %87;\n}\n"
        : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24), CLEFRT_WGMMA_D8(32), CLEFRT_WGMMA_D8(40),
          CLEFRT_WGMMA_D8(48), CLEFRT_WGMMA_D8(56), CLEFRT_WGMMA_D8(64), CLEFRT_WGMMA_D8(72)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)), "n"(SA), "n"(TB));
#else
    (void)d, (void)a, (void)db, (void)accumulate;
    __trap();
#endif
  }
};

// D (64 x N fp32, wgmma_bf16's layout) += A (64 x 8) B (8 x N) in TF32 (the tensor cores read an
// operand's upper 19 bits), A from registers, B K-major in shared memory (wgmma_desc: 32 fp32 a
// 128-byte row, so a k step of 8 starts 32 bytes on, as a bf16 step of 16). a[0..3]: rows 16 w + g,
// + 8, + 0, + 8 at k t, t, t + 4, t + 4 (mma.sync m16n8k8's A fragment per warp). accumulate
// false overwrites D (never zero it in code before: ptxas then serializes the wgmmas, C7515). The
// register operands must not change between the issue and the wait.
template <int N>
struct WgmmaTf32Rs;

template <>
struct WgmmaTf32Rs<32> {
  static __device__ __forceinline__ void run(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
#else
    (void)d, (void)a, (void)db, (void)accumulate;
    __trap();
#endif
  }
};

template <>
struct WgmmaTf32Rs<64> {
  static __device__ __forceinline__ void run(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
#ifdef CLEFRT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : CLEFRT_WGMMA_D8(0), CLEFRT_WGMMA_D8(8), CLEFRT_WGMMA_D8(16), CLEFRT_WGMMA_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(int(accumulate)));
#else
    (void)d, (void)a, (void)db, (void)accumulate;
    __trap();
#endif
  }
};

template <int N>
__device__ __forceinline__ void wgmma_tf32_rs(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
  WgmmaTf32Rs<N>::run(d, a, db, accumulate);
}

template <int N, int TB>
__device__ __forceinline__ void wgmma_bf16(float* d, uint64_t da, uint64_t db, bool accumulate) {
  static_assert(TB == 0 || TB == 1, "TB: B K-major (0) or N-major (1)");
  WgmmaBf16<N, TB>::run(d, da, db, accumulate);
}

// D (+)= SA * A B with A (64 x 16) in registers (WgmmaBf16Rs), B in shared memory as wgmma_bf16's.
template <int N, int TB = 0, int SA = 1>
__device__ __forceinline__ void wgmma_bf16_rs(float* d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {
  static_assert(TB == 0 || TB == 1, "TB: B K-major (0) or N-major (1)");
  static_assert(SA == 1 || SA == -1, "SA: A's scale, +1 or -1");
  WgmmaBf16Rs<N, TB, SA>::run(d, a, db, accumulate);
}

// The register-A fragment of k step s (columns 16 s .. 16 s + 15) of a 64 x N fp32 accumulator d
// (wgmma's D layout above) rounded to bf16 pairs: the accumulator layout is the A fragment's (row
// g: d[8s], d[8s + 1] at k 2t, 2t + 1 and d[8s + 4], d[8s + 5] at k 2t + 8, 2t + 9; row g + 8:
// d[8s + 2, 3] and d[8s + 6, 7]), so one product's output is the next one's A with no shared
// memory between.
__device__ __forceinline__ void wgmma_a_from_acc(const float* d, int s, uint32_t (&a)[4]) {
  auto pack = [](float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  };
  a[0] = pack(d[8 * s + 0], d[8 * s + 1]);
  a[1] = pack(d[8 * s + 2], d[8 * s + 3]);
  a[2] = pack(d[8 * s + 4], d[8 * s + 5]);
  a[3] = pack(d[8 * s + 6], d[8 * s + 7]);
  // made here, before the caller's wgmma_fence (volatile asms keep their order): the compiler may
  // not sink the conversions past it
  asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])::"memory");
}

// One "bf16x3" step (gdn_tiles.cuh's planes): fp32 operands as bf16 hi + lo planes, D (+)= A B as
// hi*hi + hi*lo + lo*hi (lo*lo dropped), three wgmmas in that order into D.
template <int N, int TB = 0>
__device__ __forceinline__ void wgmma_bf16x3(float* d, uint64_t ah, uint64_t al, uint64_t bh, uint64_t bl, bool accumulate) {
  wgmma_bf16<N, TB>(d, ah, bh, accumulate);
  wgmma_bf16<N, TB>(d, ah, bl, true);
  wgmma_bf16<N, TB>(d, al, bh, true);
}

// The same step as one bf16 pass (X3 false): the hi planes alone, i.e. bf16(x) operands with fp32
// accumulation, the precision FlashInfer's and fla's GDN kernels run at (the GDN path's default:
// kernels.h's gdn_wgmma_one_pass_bf16). X3 true: wgmma_bf16x3.
template <bool X3, int N, int TB = 0>
__device__ __forceinline__ void wgmma_planes(float* d, uint64_t ah, uint64_t al, uint64_t bh, uint64_t bl, bool accumulate) {
  if constexpr (X3) {
    wgmma_bf16x3<N, TB>(d, ah, al, bh, bl, accumulate);
  } else {
    (void)al, (void)bl;
    wgmma_bf16<N, TB>(d, ah, bh, accumulate);
  }
}

}  // namespace clefrt::cuda

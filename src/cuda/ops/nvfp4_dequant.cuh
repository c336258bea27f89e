// Device code shared by the W4A16 GEMMs (kernels_w4a16.cu on mma.sync, kernels_w4a16_wgmma.cu and
// kernels_w4a16_rs.cu on wgmma): NVFP4 -> bf16 dequantization in registers, exactly
// nvfp4_dequantize's values (spec/quant.md: s32 = e4m3(scale) / gs in fp32, W = bf16(code_value *
// s32)), tested bit for bit; and the output element store.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/mma.cuh"

namespace clefrt::cuda {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// The 8 magnitudes of one scale block, T[c] = bf16(e2m1(c) * s32) for c = 0..7 (the spec's
// product, computed as such), as byte tables for prmt: lo = their low bytes, hi = their high
// bytes, codes 0-3 in *0 and 4-7 in *1.
struct Table {
  uint32_t lo0, lo1, hi0, hi1;
};
__device__ __forceinline__ Table make_table(float s32) {
  const uint32_t p01 = pack_bf16(__fmul_rn(0.0f, s32), __fmul_rn(0.5f, s32));
  const uint32_t p23 = pack_bf16(s32, __fmul_rn(1.5f, s32));
  const uint32_t p45 = pack_bf16(__fmul_rn(2.0f, s32), __fmul_rn(3.0f, s32));
  const uint32_t p67 = pack_bf16(__fmul_rn(4.0f, s32), __fmul_rn(6.0f, s32));
  return {prmt(p01, p23, 0x6420), prmt(p45, p67, 0x6420), prmt(p01, p23, 0x7531), prmt(p45, p67, 0x7531)};
}

// make_table with two roundings instead of seven: for a normal s32, bf16(2^j v s32) = 2^j bf16(v
// s32), so from B1 = bf16(s32) and B15 = bf16(1.5 s32) the other magnitudes are exponent
// increments (0.5 B1, 2 B1, 2 B15, 4 B1, 4 B15), exactly make_table's values. B1's biased
// exponent must leave room (2..251); otherwise (zero, subnormal, huge, NaN) make_table itself.
// T[0] keeps make_table's sign (0 * s32 is -0 for a negative scale).
__device__ __forceinline__ Table make_table_shift(float s32) {
  const uint32_t p23 = pack_bf16(s32, __fmul_rn(1.5f, s32));
  const uint32_t e = (p23 >> 7) & 0xffu;
  if (e < 2 || e > 251) return make_table(s32);
  const uint32_t p01 = ((p23 - 0x80u) << 16) | (p23 & 0x8000u), p45 = p23 + 0x00800080u, p67 = p23 + 0x01000100u;
  return {prmt(p01, p23, 0x6420), prmt(p45, p67, 0x6420), prmt(p01, p23, 0x7531), prmt(p45, p67, 0x7531)};
}

// The spec's s32 = e4m3(scale) / gs (IEEE division), with rc = __frcp_rn(gs) precomputed per row:
// q0 = e rc corrected once by the exact residual e - q0 gs (an FMA) is the correctly rounded
// quotient when gs is well inside the normal range (Markstein; checked against division on 378
// million (scale, gs) pairs and in CudaQuant.W4A16GemmAgainstCpu). rc = 0 marks a gs outside
// 2^-63..2^64: plain division.
__device__ __forceinline__ float row_reciprocal(float gs) {
  const uint32_t e = (__float_as_uint(gs) >> 23) & 0xffu;
  return e >= 64 && e <= 190 ? __frcp_rn(gs) : 0.0f;
}
__device__ __forceinline__ float scale_quotient(float e, float gs, float rc) {
  if (rc == 0.0f) return __fdiv_rn(e, gs);
  const float q0 = __fmul_rn(e, rc);
  return __fmaf_rn(__fmaf_rn(-q0, gs, e), rc, q0);
}

// 8 codes (one packed word: code j in nibble j, k order) -> 4 bf16 pairs. Magnitudes are looked
// up 4 at a time (prmt with the 3-bit magnitudes as byte selectors, low and high bytes
// separately, then interleaved); the sign (bf16(-v s) = -bf16(v s)) is xor-ed into bit 15 / 31
// from a prmt in sign-replicating mode: code 2p's sign is bit 3 of byte p (bit 7 of byte p of
// w << 4), code 2p + 1's is bit 7 of byte p. ~19 instructions for 8 weights.
__device__ __forceinline__ void dequant_word(uint32_t w, const Table& t, uint32_t* out) {
  const uint32_t idx = w & 0x77777777u, w4 = w << 4;
  const uint32_t la = prmt(t.lo0, t.lo1, idx), ha = prmt(t.hi0, t.hi1, idx);
  const uint32_t lb = prmt(t.lo0, t.lo1, idx >> 16), hb = prmt(t.hi0, t.hi1, idx >> 16);
  out[0] = prmt(la, ha, 0x5140) ^ (prmt(w4, w, 0xCC88) & 0x80008000u);
  out[1] = prmt(la, ha, 0x7362) ^ (prmt(w4, w, 0xDD99) & 0x80008000u);
  out[2] = prmt(lb, hb, 0x5140) ^ (prmt(w4, w, 0xEEAA) & 0x80008000u);
  out[3] = prmt(lb, hb, 0x7362) ^ (prmt(w4, w, 0xFFBB) & 0x80008000u);
}

// dequant_word's lookups and sign for half a word (h): its 4 codes are one 16-bit unit, codes 2t,
// 2t + 1, 2t + 8, 2t + 9 of a block (the register-A W4A16 GEMM's order: kernels_w4a16_rs.cu and
// dev/cuda/w4a16_rs.cu) -> the bf16 pairs (2t, 2t + 1) in lo and (2t + 8, 2t + 9) in hi.
__device__ __forceinline__ void dequant_unit(uint32_t w, int h, const Table& tb, uint32_t& lo, uint32_t& hi) {
  const uint32_t idx = (h ? w >> 16 : w) & 0x7777u, w4 = w << 4;
  const uint32_t la = prmt(tb.lo0, tb.lo1, idx), ha = prmt(tb.hi0, tb.hi1, idx);
  lo = prmt(la, ha, 0x5140) ^ (prmt(w4, w, h ? 0xEEAA : 0xCC88) & 0x80008000u);
  hi = prmt(la, ha, 0x7362) ^ (prmt(w4, w, h ? 0xFFBB : 0xDD99) & 0x80008000u);
}

// One BK-wide k step of a CTA's CH channels' weights into a shared-memory stage, by cp.async (the
// wgmma W4A16 kernel and dev/cuda/w4a16_rs.cu): the packed codes, 16 bytes a thread (channel tid / 2,
// half tid % 2 of its BK / 2), at the stage's start, then the e4m3 scales, BK / 16 bytes a channel
// (threads < CH), after the CH x BK / 2 code bytes. Channels past n copy zeros: zero codes and
// scales give 0. Needs 2 CH threads and BK = 64 (32 code bytes, 4 scales a channel and step).
template <int CH, int BK>
struct Nvfp4StepCopy {
  static_assert(BK == 64, "16 code bytes a thread, 4 scale bytes a channel");
  const uint8_t *codes, *scales, *wsrc, *ssrc;
  bool win, sin;
  int tid;
  __device__ Nvfp4StepCopy(const uint8_t* codes_, const uint8_t* scales_, int n0, int n, int k, int tid_)
      : codes(codes_), scales(scales_), win(n0 + (tid_ >> 1) < n), sin(tid_ < CH && n0 + tid_ < n), tid(tid_) {
    wsrc = win ? codes + int64_t(n0 + (tid >> 1)) * (k / 2) + (tid & 1) * 16 : codes;
    ssrc = sin ? scales + int64_t(n0 + tid) * (k / 16) : scales;
  }
  // step kt into the stage at w
  __device__ void operator()(unsigned char* w, int kt) const {
    const int k0 = kt * BK;
    cp_async16(w + tid * 16, win ? wsrc + k0 / 2 : codes, win);
    if (tid < CH) cp_async4(w + CH * BK / 2 + tid * 4, sin ? ssrc + k0 / 16 : scales, sin);
  }
};

// y[r, col] = v (bf16 rounded or fp32), or += v into fp32 (nvfp4_gemm's accumulate mode)
__device__ __forceinline__ void store_output(void* y, bool y_f32, int64_t ldy, bool accumulate, int r, int col, float v) {
  if (y_f32) {
    float* d = static_cast<float*>(y) + int64_t(r) * ldy + col;
    *d = accumulate ? *d + v : v;
  } else {
    static_cast<__nv_bfloat16*>(y)[int64_t(r) * ldy + col] = __float2bfloat16_rn(v);
  }
}

}  // namespace clefrt::cuda

// GPU twins of quant/formats.h: NVFP4 and FP8 e4m3 conversions, bit for bit as the CPU ones
// (same float operations in the same order, IEEE division and multiplication: the tests compare
// bytes), plus the FP8 GEMM epilogue. Row-major; `ld*` are row strides in elements.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/runtime/buffer.h"

namespace clefrt::cuda {

using bf16 = __nv_bfloat16;

// W[r, c] = bf16(e2m1(code) * (e4m3(scale[r, c/16]) / gs[r])) for rows [0, n) of a packed
// [n, k/2] matrix; gs holds one global scale per row (fused parts may differ). k % 16 == 0.
void nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n, int64_t k, bf16* w, cudaStream_t s);
// The W4A16 GEMM: y (+)= x W^T, x bf16 [m, k] (row stride ldx), W NVFP4 [n, k] as above
// (dequantized per tile in shared memory to exactly nvfp4_dequantize's values), bf16 tensor cores
// with fp32 accumulation; y bf16 or fp32 [m, n] (row stride ldy), accumulate into fp32 only.
// Needs nvfp4_gemm_supports(k, ldx), x and packed 16-byte aligned, scales 4-byte aligned. A row's
// result does not depend on m (the batch). Two kernels: wgmma (kernels_w4a16_wgmma.cu; sm_90a
// builds on compute capability 9.0, the Auto choice there) and mma.sync (kernels_w4a16.cu; any
// sm_80+ GPU). They sum in different orders: their results differ in rounding.
enum class W4A16Gemm { Auto, MmaSync, Wgmma };
bool nvfp4_gemm_supports(int64_t k, int64_t ldx);
bool nvfp4_gemm_wgmma_available();
// The CTA tile height (tokens: 64, 128 or 256) nvfp4_gemm picks for m x n (tests).
int nvfp4_gemm_tile_rows(int64_t m, int64_t n, W4A16Gemm which = W4A16Gemm::Auto);
void nvfp4_gemm(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n,
                void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s, W4A16Gemm which = W4A16Gemm::Auto);
// The wgmma kernel with a given tile height (nvfp4_gemm's dispatch; no checks of its own).
void nvfp4_gemm_wgmma(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const float* row_gs,
                      int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, int bm, cudaStream_t s);
// The W4A16 GEMM for short inputs (kernels_w4a16_rs.cu; sm_90a builds on compute capability 9.0):
// the same results as nvfp4_gemm, bit for bit as cuBLASLt's bf16 GEMM on the dequantized weights
// (the staged path: the GPU tests compare them), with the weights as wgmma's register operand,
// their codes reordered once (nvfp4_rs_repack) and their dequantization tables made once, per
// distinct row global scale. A 64-row group's rows may take at most 2 distinct global scales
// (fused parts: one a tensor); nvfp4_rs_plan says whether a part's do. k a multiple of 64.
struct Nvfp4RsTables {
  const void* tabs = nullptr;        // per distinct gs value v, 256 tables of 16 bytes (by scale byte)
  const int* group_sets = nullptr;   // per 64-row group r, [2 r + j]: the value of its table set j
  const uint8_t* row_set = nullptr;  // per row, which of its group's 2 sets (0 or 1)
  explicit operator bool() const { return tabs != nullptr; }
};
struct Nvfp4RsPlan {
  std::vector<float> gs;         // the distinct values, in order of first appearance
  std::vector<int> group_sets;   // -> Nvfp4RsTables::group_sets
  std::vector<uint8_t> row_set;  // -> Nvfp4RsTables::row_set
};
// Host: the plan of a part with these row global scales [n]; false (plan empty) when a 64-row
// group takes more than 2 of them.
bool nvfp4_rs_plan(const float* row_gs, int64_t n, Nvfp4RsPlan& plan);
// The device memory a plan's tables take (one piece: the tables, then the gs values, group sets
// and row sets), and the tables made there (mem 16-byte aligned; synchronous copies, then the
// tables built on s).
size_t nvfp4_rs_bytes(const Nvfp4RsPlan& plan);
Nvfp4RsTables nvfp4_rs_upload(const Nvfp4RsPlan& plan, void* mem, cudaStream_t s);
bool nvfp4_gemm_rs_available();
// packed [n, k / 2] -> nvfp4_gemm_rs's order, in place (per row and 64-wide step, quad slot t's 8
// bytes: byte t and t + 4 of each 16-block). Only nvfp4_gemm_rs and nvfp4_dequantize_rs read it.
void nvfp4_rs_repack(uint8_t* packed, int64_t n, int64_t k, cudaStream_t s);
// nvfp4_dequantize from codes in that order.
void nvfp4_dequantize_rs(const uint8_t* packed, const uint8_t* scales, const float* row_gs, int64_t n, int64_t k, bf16* w, cudaStream_t s);
// A tile: tn tokens x nt token boxes a warpgroup, wgs warpgroups of 64 channels x tw warpgroups
// on the same channels (other tokens) a CTA: 64 wgs channels x tn nt tw tokens. per_sm, with a
// Nvfp4RsWork: -1 stream-K where a CTA a tile would leave the last wave's SMs idle for 5% or
// more (every resident CTA), 0 never, r > 0 with r CTAs an SM (where they fit and are fewer than
// the tiles). Every tile and grid gives the same bits.
struct RsTile {
  int tn = 160, nt = 1, wgs = 1, tw = 1;
  int per_sm = -1;
  bool same_kernel(const RsTile& o) const { return tn == o.tn && nt == o.nt && wgs == o.wgs && tw == o.tw; }
  bool operator==(const RsTile& o) const { return same_kernel(o) && per_sm == o.per_sm; }
  std::string name() const {
    return std::to_string(64 * wgs) + "ch x " + std::to_string(tn) + "x" + std::to_string(nt) + "x" + std::to_string(tw) + "tok";
  }
};
// nvfp4_gemm_rs's tile for m x n, and every tile compiled (tests and the lab run each)
RsTile nvfp4_gemm_rs_tile(int64_t m, int64_t n);
std::vector<RsTile> nvfp4_gemm_rs_tiles();
// Stream-K scratch: where a CTA a tile would leave SMs idle in the last wave, a grid of resident
// CTAs splits the (tile, k step) sequence evenly at whole k steps, a tile's second CTA continuing
// the first one's fp32 sums (published here, a flag per CTA): the same sums in the same order, so
// the same bits. One GEMM at a time per work (the launches of one stream). A flag is set by the
// CTA that publishes and cleared by the one that continues, so every launch finds them all 0
// (CUDA graph replays included).
struct Nvfp4RsWork {
  Nvfp4RsWork();
  static constexpr size_t kBytesPerSm = size_t(160) << 10;  // the largest tile's accumulators, a CTA an SM
  float* partial = nullptr;
  int* flags = nullptr;
  size_t partial_bytes = 0;
  int slots = 0;  // flags
  int64_t streamed = 0;  // stream-K launches so far (tests and the lab tell which calls ran it)

 private:
  DeviceBuffer mem_;
};
// packed: the reordered codes.
void nvfp4_gemm_rs(const bf16* x, int64_t m, int64_t k, int64_t ldx, const uint8_t* packed, const uint8_t* scales, const Nvfp4RsTables& tables,
                   int64_t n, void* y, bool y_f32, int64_t ldy, bool accumulate, cudaStream_t s, Nvfp4RsWork* work = nullptr,
                   const RsTile* tile = nullptr);  // tile: nvfp4_gemm_rs_tile's unless given (one of nvfp4_gemm_rs_tiles)
// nvfp4_gemm_rs's stream-K grid at m x n with this tile and work, 0 for a CTA a tile (always
// without work).
int64_t nvfp4_gemm_rs_grid(int64_t m, int64_t n, const RsTile& tile, const Nvfp4RsWork* work);
// The launches of a tile at m x n that differ: a CTA a tile (per_sm 0), then each stream-K grid
// (per_sm -1, 1, 2, 3) not already listed (the tuner, the lab and the GPU test run each).
std::vector<RsTile> nvfp4_gemm_rs_grids(int64_t m, int64_t n, RsTile tile, const Nvfp4RsWork* work);
// The launches worth timing at m x n (W4A16RsTuner's candidates, the lab's list):
// nvfp4_gemm_rs_tile's launch first, then each launch (nvfp4_gemm_rs_grids) of every compiled
// tile that is not mostly padding at m, each launch once.
std::vector<RsTile> nvfp4_gemm_rs_candidates(int64_t m, int64_t n, const Nvfp4RsWork* work);
// The FP8 GEMM of our own (fp8_gemm_wgmma.cuh; sm_90a builds on compute capability 9.0: available)
// in cuBLASLt's place in Gemm::run_fp8, unscaled: y [m, n] = x [m, k] w [n, k]^T in bf16 or fp32,
// rows ldy apart; k a multiple of 16, x and w 16-byte aligned. form 1: one CTA a 128 x 128 tile;
// 2: warp-specialized and persistent, 256 x 128 tiles from m 2,048, 128 x 128 below; 3: as 2, the
// 256 x 128 tiles in clusters of 2 sharing x's tile (TMA multicast: less L2 traffic); 4: 128 x 192
// tiles, one m64n192 wave a math warpgroup (the fastest of ours at m 318, s38 call 13). Every form
// gives the same bits, and a row's result does not depend on m. The model's answers came out as
// cuBLASLt's promoted GEMMs give them, bit for bit (s38 call 1). A lab switch until it is faster in
// the model (CLEFRT_LAB_FP8_OWN_GEMM).
bool fp8_gemm_own_available();
void fp8_gemm_own(int form, const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, void* y, bool y_f32, int64_t ldy, cudaStream_t s);
// The same with its epilogue's other outputs (the forward does not use them yet; the GPU tests
// compare the forms on them): y = fp8_scaled(sum, rs[row], cs[col]) (rs and cs null: the sum) in
// bf16 or fp32, or added to an fp32 y (F32Add), or gate|up's SwiGLU from w's rows interleaved in
// groups of 8 gate and 8 up (SwiGLU: scales given, n a multiple of 16, y [m, n / 2] bf16).
enum class Fp8OwnOut { BF16, F32, F32Add, SwiGLU };
void fp8_gemm_own_epilogue(int form, const uint8_t* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, const float* rs, const float* cs, void* y,
                           Fp8OwnOut out, int64_t ldy, cudaStream_t s);
// spec/quant.md "Quantize (weights)" with a given global scale gs (shared by the whole matrix).
void nvfp4_quantize(const bf16* w, int64_t n, int64_t k, float gs, uint8_t* packed, uint8_t* scales, cudaStream_t s);
// *amax = max |x| over n values (amax must hold 0 before; non-negative floats compare as ints).
void amax_bf16(const bf16* x, int64_t n, float* amax, cudaStream_t s);

// Per row: scale = amax / 448 (1 when the row is all zero), q = e4m3(x / scale) (round to
// nearest even, saturating). Weights at load and activations per token alike. q rows are kp >= k
// apart and zero in [k, kp) (FP8 GEMMs want k in multiples of 16; zeros add nothing).
void fp8_quantize_rows(const bf16* x, int64_t rows, int64_t k, int64_t ldx, uint8_t* q, int64_t kp, float* scale, cudaStream_t s);
// w = bf16(e4m3(q) * scale[r]); q rows kp apart, w rows k apart.
void fp8_dequantize_rows(const uint8_t* q, int64_t kp, const float* scale, int64_t rows, int64_t k, bf16* w, cudaStream_t s);

// W4A4 activations (spec/quant.md): per row, per 16 inputs s = e4m3(gs_in * amax16 / 6),
// x_q = rne_e2m1(clamp(x / (s / gs_in), -6, 6)), y = bf16(x_q * s / gs_in) (0 where s is 0).
void nvfp4_fake_quantize_rows(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs_in, bf16* y, int64_t ldy, cudaStream_t s);

// ---- native NVFP4 (Blackwell block-scaled FP4 GEMMs; UNTESTED on hardware here) ----
// cuBLASLt's VEC16_UE4M3 scale layout: scales of an [rows, cols] matrix (one per 16 inputs) in
// tiles of 128 rows x 4 scale columns, 512 bytes each, tiles row-major; inside a tile scale (r, c)
// sits at (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4. Rows pad to 128 and scale columns to 4
// (padding zero).
int64_t nvfp4_swizzled_bytes(int64_t rows, int64_t k);
int64_t nvfp4_swizzled_offset(int64_t r, int64_t c, int64_t k);  // host twin (tests)
void nvfp4_swizzle_scales(const uint8_t* scales, int64_t rows, int64_t k, uint8_t* out, cudaStream_t s);
// W4A4 activations for the FP4 tensor cores: the same codes and scales as
// nvfp4_fake_quantize_rows, packed two per byte (even column low) [rows, k/2] with the scales
// swizzled (zero scale -> zero codes). `out_scales` must be zeroed first (its padding).
void nvfp4_quantize_rows_packed(const bf16* x, int64_t rows, int64_t k, int64_t ldx, float gs_in, uint8_t* packed, uint8_t* out_scales,
                                cudaStream_t s);

// The FP8 GEMM's scales (cuBLASLt on sm_90 takes only scalar ones): y[r, c] *= rs[r] * cs[c]
// in place (bf16 or fp32), or acc[r, c] += t[r, c] * rs[r] * cs[c] (the residual stream).
void scale_rows_cols_bf16(bf16* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs, cudaStream_t s);
void scale_rows_cols_f32(float* y, int64_t rows, int64_t n, int64_t ldy, const float* rs, const float* cs, cudaStream_t s);
// y[r, c] = t[r, c] * rs[r] * cs[c] into bf16 or fp32 y (outputs cuBLASLt's FP8 GEMM cannot
// write in place: row strides or offsets off its 16-byte alignment).
void scale_rows_cols_store(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, void* y, bool y_bf16,
                           int64_t ldy, cudaStream_t s);
void scale_rows_cols_acc(const float* t, int64_t rows, int64_t n, int64_t ldt, const float* rs, const float* cs, float* acc, int64_t ldacc,
                         cudaStream_t s);

}  // namespace clefrt::cuda

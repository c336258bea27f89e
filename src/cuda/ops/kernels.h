// The CUDA twins of the CPU ops (cpu/ops.h) and the fused pieces of the forward pass.
// Every launcher checks its launch (check_launch) and names itself in the error.
// Layouts are row-major; "L" is the number of packed tokens of a batch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace clefrt::cuda {

using bf16 = __nv_bfloat16;

// Whether p may be read with 16-byte vector loads (the launchers' choice of a kernel's vector form)
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- basic (kernels_basic.cu) ----
// The lab's: one thread busy for `us` microseconds, so the host's launches behind it get ahead of
// the GPU (CLEFRT_LAB_TOWER_LEAD_US: is the tower's time the GPU's or the host's enqueue?)
void gpu_wait_us(int64_t us, cudaStream_t s);
// x[t, :] = float(table[ids[t], :])
void embed_gather(const int32_t* ids, int64_t L, const bf16* table, int64_t d, float* x, cudaStream_t s);
// y = x * rsqrt(mean(x^2) + eps) * (1 + w) per row; out bf16 and/or fp32 (either may be null).
void rms_norm_1p(const float* x, int64_t rows, int64_t d, const float* w, float eps, bf16* y16, float* y32, cudaStream_t s);
// rms_norm_1p's bf16 rows quantized for an FP8 GEMM in the same kernel, where
// rms_norm_1p_fp8_fits(d, kp): codes [rows, kp] (zeros past d) and a scale per row, the bits of
// rms_norm_1p then fp8_quantize_rows; y16 (optional) the bf16 rows as well.
bool rms_norm_1p_fp8_fits(int64_t d, int64_t kp);
void rms_norm_1p_fp8(const float* x, int64_t rows, int64_t d, const float* w, float eps, bf16* y16, uint8_t* q, int64_t kp, float* scale,
                     cudaStream_t s);
// A pending FP8 residual add: x[r, :] += fp8_scaled(t[r, :], rs[r], cs) as scale_rows_cols_acc
// adds an accumulating FP8 Linear's unscaled output, left for the norm that reads x next
// (rms_norm_1p_add / rms_norm_1p_fp8_add: x updated in place, then normed; the same bits as the
// pass and the plain norm). Where residual_fp8_fits(d, add): the norms' register form, t's rows
// and cs 16-byte aligned.
struct ResidualFp8 {
  const float* t = nullptr;
  int64_t ldt = 0;
  const float* rs = nullptr;
  const float* cs = nullptr;
};
bool residual_fp8_fits(int64_t d, const ResidualFp8& add);
void rms_norm_1p_add(float* x, int64_t rows, int64_t d, const ResidualFp8& add, const float* w, float eps, bf16* y16, cudaStream_t s);
void rms_norm_1p_fp8_add(float* x, int64_t rows, int64_t d, const ResidualFp8& add, const float* w, float eps, bf16* y16, uint8_t* q, int64_t kp,
                         float* scale, cudaStream_t s);
// Affine LayerNorm per row; out bf16 and/or fp32. x rows are `ldx` apart.
void layer_norm(const float* x, int64_t rows, int64_t d, int64_t ldx, const float* w, const float* b, float eps, bf16* y16,
                float* y32, cudaStream_t s);
// The same after x[r, :] += add in place (a GEMM's bias folded into the next LayerNorm's pass).
void layer_norm_add(float* x, int64_t rows, int64_t d, int64_t ldx, const float* add, const float* w, const float* b, float eps, bf16* y16,
                    float* y32, cudaStream_t s);
// The LayerNorm of x[r, :] + bias (null: none), x left as it is: the same outputs as
// layer_norm_add, bit for bit, without its write of x.
void layer_norm_biased(const float* x, int64_t rows, int64_t d, int64_t ldx, const float* bias, const float* w, const float* b, float eps,
                       bf16* y16, float* y32, cudaStream_t s);
// act[t, j] = silu(gu[t, j]) * gu[t, ffn + j] (the fused gate|up GEMM output)
void swiglu(const bf16* gu, int64_t L, int64_t ffn, bf16* act, cudaStream_t s);
// The same from an FP8 gate|up GEMM output left unscaled (LinearRunner::run_fp8_unscaled): value
// (t, c) is first rounded as the FP8 epilogue stores it, bf16(v * rs[t] * cs(c)) with cs(c) =
// cs_lo[c] for c < split, else cs_hi[c - split]; the result equals the unfused one bit for bit.
void swiglu_fp8_scaled(const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi, int64_t split,
                       bf16* act, cudaStream_t s);
// swiglu_fp8_scaled followed by fp8_quantize_rows(act, L, ffn, ffn, q, kp, scale) in one kernel
// (the down_proj's FP8 input without act's trip through memory), the same bits. Where
// swiglu_fp8_quant_fits(ffn, kp): a row of act is held in shared memory.
bool swiglu_fp8_quant_fits(int64_t ffn, int64_t kp);
void swiglu_fp8_quant(const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi, int64_t split,
                      uint8_t* q, int64_t kp, float* scale, cudaStream_t s);
// The form swiglu_fp8_quant runs for L rows (the switches read once): a row over a cluster of
// `cluster` CTAs (1-8), `ipt` 16-byte items a thread (1, 2 or 4; compute capability 9.0 on; 2
// and 4 by default), from 2,048 rows a row in one CTA's registers capped for 2 CTAs an SM
// (CLEFRT_LAB_SWIGLU_REGS_FROM_ROWS moves that bound, 0: never), or cluster 0: a row in one
// CTA's shared memory (below 9.0). Every form gives the same bits. Lab switches CLEFRT_LAB_SWIGLU_CLUSTER
// (0-8) and CLEFRT_LAB_SWIGLU_IPT pick another for A/B runs; CLEFRT_LAB_SWIGLU_MIN_BLOCKS the
// register-capped forms: 2 with cluster 0 (a row in one CTA's registers, 4 items a thread,
// registers capped for 2 CTAs an SM), 4 with a cluster of 2 of 4 items (capped for 4 CTAs).
// swiglu_fp8_quant_as runs a given form (the GPU tests: all give the same bits), and refuses one
// that does not fit ffn (swiglu_fp8_form_fits) with an error naming both.
struct SwigluFp8Form {
  int cluster = 0, ipt = 1;
  int min_blocks = 0;  // 0: uncapped; 2 (cluster 0, ipt 4) or 4 (cluster 2, ipt 4): the capped forms
};
bool swiglu_fp8_form_fits(const SwigluFp8Form& f, int64_t ffn);
SwigluFp8Form swiglu_fp8_form(int64_t L);
void swiglu_fp8_quant_as(const SwigluFp8Form& f, const bf16* gu, int64_t L, int64_t ffn, const float* rs, const float* cs_lo, const float* cs_hi,
                         int64_t split, uint8_t* q, int64_t kp, float* scale, cudaStream_t s);
// y[r, :] (+)= bias, then gelu (erf) if asked; y fp32 [rows, n] with row stride ldy.
void bias_act(float* y, int64_t rows, int64_t n, int64_t ldy, const float* bias, bool gelu, cudaStream_t s);
void f32_to_bf16_rows(const float* x, int64_t rows, int64_t d, int64_t ldx, bf16* y, int64_t ldy, cudaStream_t s);
// Deterministic pseudo-random fill (synthetic weights): normal(mean, std) by a counter hash.
void fill_normal_bf16(bf16* p, int64_t n, uint64_t seed, float mean, float std, cudaStream_t s);
void fill_normal_f32(float* p, int64_t n, uint64_t seed, float mean, float std, cudaStream_t s);
// Whether this binary holds code the current GPU runs (false: why, as CUDA says).
bool kernels_have_image(std::string* why);

// ---- Gated DeltaNet (kernels_gdn.cu) ----
// Depthwise causal conv + SiLU over packed sequences; seq_start[t] is the first token of t's
// sequence. x: [L, C] fp32 with row stride ldx; w: [C, K] fp32; y: [L, C] fp32.
void conv_silu(const float* x, int64_t ldx, const int32_t* seq_start, int64_t L, int64_t C, const float* w, int64_t K, float* y,
               cudaStream_t s);
// The same for tokens [t0, t0 + L) only (y row 0 = token t0), x's row 0 being token x_row0 <= t0
// (x holds the K - 1 rows before the block that the conv reads, where they are in the sequence).
// hist (the prefix cache): per token its sequence (seq_of), per sequence the K - 1 conv rows
// [K - 1, C] before its first token (rows[s] + layer_off; null: zeros, a sequence's start).
struct ConvHistory {
  const int32_t* seq_of = nullptr;
  const float* const* rows = nullptr;
  int64_t layer_off = 0;
};
void conv_silu_rows(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, int64_t L, int64_t C, const float* w,
                    int64_t K, float* y, cudaStream_t s, const ConvHistory& hist = {});
// In place on mixed [L, 2*Hk*Dk + Hv*Dv]: q and k heads L2-normalised (q also * 1/sqrt(Dk)).
// beta = sigmoid(b), g = negA * softplus(a + dt_bias) from the b and a columns of `ba`.
void gdn_prep(float* mixed, int64_t conv_dim, int64_t L, int64_t Hk, int64_t Dk, const float* b, const float* a, int64_t ldba, int64_t Hv,
              const float* negA, const float* dt_bias, float* g, float* beta, cudaStream_t s);
// FP8 scales that a reader of an FP8 GEMM's unscaled fp32 output applies as it reads
// (LinearRunner::run_fp8_first_unscaled): element (r, c) is used as fp8_scaled(x[r, c], rs[r],
// cs[c]), the bits of the scale pass it replaces. rs null: the values are scaled already.
struct RowColScales {
  const float* rs = nullptr;
  const float* cs = nullptr;
};
// conv_silu_rows into mixed, then gdn_prep on it: one kernel at Clef's shape
// (gdn_conv_prep_fuses), the two calls otherwise. b / a: the block's own rows (row 0 = token
// t0). xs (one-kernel form only): x's conv columns unscaled FP8 output, rs indexed by x's row
// (row 0 = token x_row0); cached history rows are scaled already. min_blocks (the one-kernel
// form): 3 runs it with its registers capped for 3 CTAs an SM, 0 uncapped, -1 as the lab switch
// CLEFRT_LAB_CONV_PREP_MIN_BLOCKS says (unset: 3, the product's); the same bits.
// mixed16 (the one-kernel form only): the rows written in bf16 there instead of mixed (which is
// then null), each value the fp32 one rounded to nearest: GdnScratch::mixed16's rows.
bool gdn_conv_prep_fuses(int64_t K, int64_t Dk, int64_t conv_dim, int64_t ldx, int64_t L, int64_t Hv);
void gdn_conv_prep(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, int64_t L, const float* conv_w, int64_t K,
                   int64_t conv_dim, int64_t Hk, int64_t Dk, const float* b, const float* a, int64_t ldba, int64_t Hv, const float* negA,
                   const float* dt_bias, float* mixed, float* g, float* beta, cudaStream_t s, const ConvHistory& hist = {},
                   const RowColScales& xs = {}, int min_blocks = -1, bf16* mixed16 = nullptr);

// The chunked GDN prefill (chunk 64). Chunks never cross a sequence: chunk c covers tokens
// [chunk_start[c], chunk_start[c] + chunk_len[c]). Sequence s owns chunks
// [seq_chunk[s], seq_chunk[s + 1]).
struct GdnChunks {
  const int32_t* chunk_start;
  const int32_t* chunk_len;
  const int32_t* seq_chunk;
  int64_t n_chunks, n_seqs;
};
// The per-chunk products of the prep, read by the scan. A pass covers chunks [c0, c1) (c1 < 0:
// all of them) and the scratch holds that many: chunk c at index c - c0, so a long batch runs
// in passes over a bounded scratch. A sequence that goes on past c1 leaves its state [Hv, Dk, Dv]
// in state_out; one that began before c0 starts from state_in (the previous pass's state_out:
// two buffers, swapped per pass, since one sequence may end and another begin in the same
// pass). The state is fp32 either way, so passes give the same bits as one pass.
struct GdnScratch {
  float *w, *u, *aqk;  // [chunks, Hv, 64, Dk], [chunks, Hv, 64, Dv], [chunks, Hv, 64, 64]
  int64_t c0 = 0, c1 = -1;
  const float* state_in = nullptr;
  float* state_out = nullptr;
  // The prefix cache (forward.h DevPrefixState), per sequence s, each at + layer_off floats: the
  // state its first chunk starts from (seq_state_in null or its entry null: zero), and where it
  // leaves its state as it reaches chunk snap_chunk[s] (a global chunk index; -1: nowhere).
  const float* const* seq_state_in = nullptr;
  float* const* seq_state_out = nullptr;
  const int32_t* snap_chunk = nullptr;
  int64_t layer_off = 0;
  // The Wgmma path's operands, per chunk of the pass: bf16 hi / lo planes of W and A per value
  // head (written by its prep instead of w and aqk, whose bytes they may share), of Q and K
  // ([tokens][Dk]) per key head (gdn_plane_bytes); null for the other paths.
  uint8_t *wp = nullptr, *ap = nullptr, *qp = nullptr, *kp = nullptr;
  // The conv's output rows in bf16 (gdn_conv_prep's mixed16; [L, conv_dim], seen from token 0 as
  // mixed is): when set, the Wgmma prep with one-pass products reads them instead of mixed (half
  // the bytes; its Q and K planes the same bits, the scaled K and V planes rounded twice). Any
  // other path or bf16x3 products with it set is an error.
  const bf16* mixed16 = nullptr;
  // The T form's overlap of prep and scan (gdn_wgmma_overlap): a flag per (chunk of the pass, value
  // head), [chunks, Hv] ints, which the prep sets once that item's planes are written and the
  // register-state scan, launched while the prep runs, waits on. Null: no overlap (the scan
  // starts after the whole prep, in stream order).
  int* ready = nullptr;
  // The gated norm in the register-state scan's epilogue, where gdn_scan_norms says it runs: the
  // scan writes act[t, j Dv + i] (bf16, row t at act + t Hv Dv), the bits gated_norm writes from
  // its O, and no O. z: the gate, fp32 (row t at z + t ldz), with zs as gated_norm takes them (an
  // FP8 GEMM's unscaled output: rs by token, cs by column j Dv + i); w: the norm's weights [Dv].
  // z, zs.rs and act are seen from token 0, as o is. Null act: the scan writes O and the caller
  // runs gated_norm.
  struct GatedNorm {
    const float* z = nullptr;
    int64_t ldz = 0;
    RowColScales zs;
    const float* w = nullptr;
    float eps = 0;
    bf16* act = nullptr;
  } gn;
};
// Bytes a chunk takes in each of GdnScratch's planes (times the pass's chunks).
struct GdnPlaneBytes {
  int64_t w, a, q, k;
};
GdnPlaneBytes gdn_plane_bytes(int64_t Hk, int64_t Hv);
// Which kernels. TensorCores: mma.sync 3xTF32 products (fp32-level accuracy; Dk % 16 == 0,
// Dv % 8 == 0, any sm_80+ GPU). Wgmma: prep and scan on Hopper's wgmma with bf16x3 products
// (within ~1e-5 of TensorCores; gdn_wgmma_available: an sm_90a build on compute capability 9.0,
// Dk = Dv = 128; needs GdnScratch's planes; prep and scan must take the same path: the prep
// leaves W and A as planes only). Simt: fp32 CUDA cores, any
// shape. Auto: Wgmma where available and gdn_wgmma_default(), else TensorCores where the shape
// fits, else Simt. The tests run each explicitly.
enum class GdnPath { Auto, TensorCores, Wgmma, Simt };
bool gdn_wgmma_available(int64_t Dk, int64_t Dv);
bool gdn_wgmma_default();
// The build has the Wgmma path and the shape fits it (no device query: the memory plan's test,
// a superset of gdn_wgmma_available's).
bool gdn_wgmma_built(int64_t Dk, int64_t Dv);
// The path Auto resolves to (or `path` itself), for the kernel line and the memory plan.
GdnPath gdn_path(GdnPath path, int64_t Dk, int64_t Dv);
// mixed: [L, conv_dim] (q | k | v heads, q/k normalised); g, beta: [L, Hv]; o: [L, Hv * Dv] fp32.
void gdn_chunked(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                 const GdnChunks& ch, GdnScratch sc, float* o, cudaStream_t s, GdnPath path = GdnPath::Auto);
// Its two halves (gdn_chunked = prep then scan), separate so the profile can time each.
void gdn_chunk_prep(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                    const GdnChunks& ch, GdnScratch sc, cudaStream_t s, GdnPath path = GdnPath::Auto);
void gdn_chunk_scan(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const GdnChunks& ch,
                    GdnScratch sc, float* o, cudaStream_t s, GdnPath path = GdnPath::Auto);
// The Wgmma path's halves (kernels_gdn_wgmma.cu): the prep (U in fp32; W, A and the scan's Q and
// K as planes), and the scan (the fused recurrence and outputs, from the planes). Reached
// through gdn_chunk_prep / gdn_chunk_scan, which check the pass's chunk range and state buffers.
// The Wgmma path's products: one bf16 pass (the default; the hi planes alone: bf16 operands, fp32
// accumulation, FlashInfer's and fla's precision), or bf16x3 (hi*hi + hi*lo + lo*hi: fp32-level
// products at three times the tensor work). On the well-conditioned model at Clef's GDN heads the
// two answer alike against the CPU (bench/results/2026-12-05-h100-session29.md); bf16x3 stays for
// measuring that. CLEFRT_GDN_PRODUCTS=bf16 | bf16x3 when first asked (anything else is a usage
// error); gdn_wgmma_set_one_pass_bf16 sets it (the GPU tests, the lab).
bool gdn_wgmma_one_pass_bf16();
void gdn_wgmma_set_one_pass_bf16(bool on);
// The one-pass prep from bf16 rows (GdnScratch::mixed16; from fp32 rows the prep is the first
// form either way) in its second form: q, k, v loaded once by cp.async into their planes, beta
// folded onto T's columns (U and W round differently from the first form, within one bf16 pass).
// 13-15% less prep time in the model (bench/results/2026-12-06-h100-session40.md); the whole GPU
// suite passed with it (session 41), so it is the product's: CLEFRT_LAB_GDN_PREP=v1 | v2 when
// first asked (unset: v2); gdn_wgmma_set_prep_v2 sets it (the GPU tests, the lab).
bool gdn_wgmma_prep_v2();
void gdn_wgmma_set_prep_v2(bool on);
// The Wgmma path's T form (the product's since session 47, after the GDN op tests and every
// CudaEngine test passed with it; CudaPrefix, CudaVision and 24 of 30 CudaQuant tests passed with
// it in session 48):
// from bf16 rows (GdnScratch::mixed16) the prep leaves T diag(beta) as a plane in W's bytes (with
// A's), and the register-state scan reads q / k / v from the rows and forms Vn = T diag(beta) (V -
// diag(e^gamma) K S) itself: W and U are never formed (FlashInfer's organisation of the state
// products; U, W's and the Q / K planes are not written). From fp32 rows, or with the planes
// scan, the W / U form runs (bench/results/2026-12-07-h100-session46.md).
// CLEFRT_LAB_GDN_FORM=t | wu when first asked (unset: t, which the planes scan turns back to the
// W / U form; t set with CLEFRT_GDN_SCAN=planes is a usage error); gdn_wgmma_set_t_form sets it.
bool gdn_wgmma_t_form();
void gdn_wgmma_set_t_form(bool on);
// The T form's prep and register-state scan at once (a lab switch): with GdnScratch::ready, and
// where the scan runs one warpgroup a CTA (fewer (sequence, value head) pairs than SMs, its CTAs
// on the GPU together), the prep runs as a persistent grid of this many CTAs an SM (1 or 2; 0:
// off) in chunk order and flags each item, and the scan starts as the prep does, waiting on each
// chunk's flag, meant to hide the prep's work under the scan's serial chain (FlashInfer's kernel
// does the prep in the scan's CTAs instead). The same bits either way; measured no faster
// (docs/notes/gdn-prefill-designs.md, session 47). CLEFRT_LAB_GDN_OVERLAP=0 | 1 | 2 when first
// asked (unset: 0); gdn_wgmma_set_overlap sets it (the GPU tests, the lab).
int gdn_wgmma_overlap();
void gdn_wgmma_set_overlap(int ctas_per_sm);
// The Wgmma scan's form: the state as wgmma's register operand (gdn_scan_rs_k: no state or Vn
// planes through shared memory; one bf16 pass only, and its default) or through shared-memory
// planes (gdn_scan_wgmma_k: bf16x3's, and one pass's with CLEFRT_GDN_SCAN=planes).
// CLEFRT_GDN_SCAN=regs | planes when first asked (unset: by the products); anything else, or
// regs with bf16x3 products, is a usage error. gdn_wgmma_set_scan_regs sets it (the GPU tests,
// the lab): 0 planes, 1 regs, 2 by the products.
bool gdn_wgmma_scan_regs();
void gdn_wgmma_set_scan_regs(int mode);
// the register-state scan's warpgroups a CTA, for the lab: 1, 2, or 0 (by shape, the default)
void gdn_wgmma_set_scan_rs_wgs(int wgs);
// Whether gdn_chunk_scan applies the gated norm itself for this call (GdnScratch::gn.act set): the
// Wgmma path's T form with two warpgroups a scan CTA (a CTA holds a value head's 128 columns, so
// a token's row is whole there: as many (sequence, value head) pairs as SMs or more), z and w
// 16-byte aligned (zs.cs too), ldz % 4 == 0, and the switch: CLEFRT_LAB_GDN_SCAN_NORM=0 | 1 when
// first asked (unset: 0); gdn_wgmma_set_scan_norm sets it (the GPU tests, the lab). A row's act is the same
// bits either way (gated_norm.cuh), so which batches take it changes no answer. Off: faster
// standalone, not in the model at the power cap (bench/results/2026-12-07-h100-session48.md).
bool gdn_scan_norms(const GdnScratch& sc, const GdnChunks& ch, int64_t Hv, int64_t Dk, int64_t Dv, GdnPath path = GdnPath::Auto);
bool gdn_wgmma_scan_norm();
void gdn_wgmma_set_scan_norm(bool on);
void gdn_chunk_prep_wgmma(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                          const GdnChunks& ch, const GdnScratch& sc, cudaStream_t s);
void gdn_chunk_scan_wgmma(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const GdnChunks& ch,
                          const GdnScratch& sc, float* o, cudaStream_t s);
// act[t, j*Dv + i] = rms_norm(o)[...] * w[i] * silu(z[t, j*Dv + i]) -> bf16; zs: z unscaled
// FP8 output (rs by t, cs by j*Dv + i)
void gated_norm(const float* o, int64_t L, int64_t Hv, int64_t Dv, const float* w, float eps, const float* z, int64_t ldz, bf16* act,
                cudaStream_t s, const RowColScales& zs = {});
// gated_norm followed by fp8_quantize_rows(act, L, Hv Dv, Hv Dv, q, kp, scale) in one kernel (the
// FP8 out_proj's input without act's trip through memory), the same codes and scales. Where
// gated_norm_fp8_fits(Hv, Dv, kp, hpw) (Dv 128) and gated_norm_fp8_aligned (the float4 form's
// operands). Two forms: a token's heads in one CTA, hpw heads a warp (1, 2, 3, 4, 6 or 8 dividing
// Hv, Hv / hpw warps up to 32), or hpw 0, a token's heads over a thread block cluster (Hv a
// multiple of 8 up to 64; compute capability 9.0 on, with the kernel's code in the binary; measured
// slower than the two kernels on an H100 in session 33). hpw -1: CLEFRT_LAB_GATED_NORM_FP8_HPW, else
// 4 where Hv splits into fours (the lab's fastest at 318 and 8,192 rows), else 2 or 1. `scale`
// may be zs.rs only when both index the same rows. The forward's under
// ForwardOptions::fp8_gated_norm_quantizes.
bool gated_norm_fp8_fits(int64_t Hv, int64_t Dv, int64_t kp, int hpw = -1);
bool gated_norm_fp8_aligned(const float* o, const float* w, const float* z, int64_t ldz, const RowColScales& zs, const uint8_t* q);
void gated_norm_fp8(const float* o, int64_t L, int64_t Hv, int64_t Dv, const float* w, float eps, const float* z, int64_t ldz, const RowColScales& zs,
                    uint8_t* q, int64_t kp, float* scale, cudaStream_t s, int hpw = -1);

// ---- gated attention (kernels_attn.cu) ----
// From the fused q|gate, k, v GEMM output qkv (row t at qkv + t * ldqkv) of tokens [t0, t0 +
// rows) of a batch of L: q heads (rows of 2D: q then gate) and k heads get the (1+w) RMSNorm and
// partial RoPE (rotary dim R, angle inv_freq[i] * pos in fp32, pos = t - seq_start[t], or the
// mRoPE rows when mrope.pos is set). Writes their rows of q [L, Hq, D] and k [L, Hkv, D] bf16.
struct MropePositions {
  const int32_t* pos = nullptr;  // null: pos = t - seq_start[t]; else rows t, h, w: [3, L]
  int sec_h = 0, sec_w = 0;      // 3 x mrope_section[1], 3 x mrope_section[2] (spec/model.md 1.2)
};
// kv_row (a batch continuing cached prefixes): token t's k row goes to row kv_row[t] of k (null:
// row t). v_out: its v heads (copied from qkv) go to that row of v_out [.., Hkv, D] too; gate_out:
// its gate heads to row t of gate_out [L, Hq, D] (null: they stay in qkv).
void attn_prep(const bf16* qkv, int64_t ldqkv, int64_t L, int64_t t0, int64_t rows, int64_t Hq, int64_t Hkv, int64_t D, int64_t R,
               const float* inv_freq, const int32_t* seq_start, const MropePositions& mrope, const float* q_norm, const float* k_norm, float eps,
               bf16* q, bf16* k, cudaStream_t s, const int32_t* kv_row = nullptr, bf16* v_out = nullptr, bf16* gate_out = nullptr);
// Causal varlen flash attention (tensor cores, online softmax), GQA, then * sigmoid(gate).
// Tiles of 64 queries: tile i covers queries [tile_q0[i], min(tile_q0[i] + 64, tile_end[i])) of
// the sequence starting at tile_seq0[i] and ending at tile_end[i].
// With delta (sequences continuing cached prefixes), keys and values live in their own rows:
// query row r is key row r + delta[i], and seq0 / end are key rows (end - delta: the queries' end).
struct AttnTiles {
  const int32_t *q0, *seq0, *end;
  int64_t n;
  const int32_t* delta = nullptr;
};
// gate: head h's gate row is gate[t * ldgate + h * gate_head_stride + 0..D).
void flash_attention(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, const bf16* gate, int64_t ldgate,
                     int64_t gate_head_stride, int64_t Hq,
                     int64_t Hkv, int64_t D, const AttnTiles& tiles, bf16* out, cudaStream_t s);
bool flash_attention_supports(int64_t D);
// out [L, Hq, D] *= sigmoid(gate) in place (gate rows as flash_attention's; D even): the output
// gate after an attention that does not fuse it (cuDNN's)
void attention_output_gate(bf16* out, int64_t L, int64_t Hq, int64_t D, const bf16* gate, int64_t ldgate, int64_t gate_head_stride,
                           cudaStream_t s);
// attention_output_gate then fp8_quantize_rows(out, L, Hq D, Hq D, q, kp, scale) in one kernel (the
// FP8 o_proj's input without the gated rows' trip through memory; out itself is left as it was),
// the same codes and scales. Where attention_output_gate_fp8_fits (D, ldgate and the head
// stride multiples of 8, Hq D up to 8,192, kp >= Hq D a multiple of 8) and out, gate 16-byte
// and q 8-byte aligned.
bool attention_output_gate_fp8_fits(int64_t Hq, int64_t D, int64_t ldgate, int64_t gate_head_stride, int64_t kp);
bool attention_output_gate_fp8_aligned(const bf16* out, const bf16* gate, const uint8_t* q);
void attention_output_gate_fp8(const bf16* out, int64_t L, int64_t Hq, int64_t D, const bf16* gate, int64_t ldgate, int64_t gate_head_stride,
                               uint8_t* q, int64_t kp, float* scale, cudaStream_t s);
// Bidirectional attention within each tile's sequence [seq0, end) (the vision tower's frames), no
// gate, scale 1 / sqrt(dout): q, k, v [L, heads, Dp] bf16 with the head dims zero-padded to
// Dp = flash_attention_full_padded(dout) (0: unsupported); out [L, heads, dout] bf16 disjoint
// from q, k and v, or out == q exactly: each query's result over its own padded row (the first
// dout dims of each head; the padding dims are left as they are).
void flash_attention_full(const bf16* q, const bf16* k, const bf16* v, int64_t heads, int64_t dout, const AttnTiles& tiles, bf16* out,
                          cudaStream_t s);
int64_t flash_attention_full_padded(int64_t dout);
// Its query tile: the tiles given to it cover at most this many queries each.
int64_t flash_attention_full_tile();

// ---- vision tower (kernels_vision.cu, spec/model.md 2) ----
// x[s, :] += bias + sum_k table[idx[s][k], :] * wt[s][k] (k in order): the patch embedding's bias
// and its interpolated position row (model::vision_position_taps per patch).
void vision_embed_finish(float* x, int64_t S, int64_t H, const float* bias, const float* table, const int32_t* idx4, const float* wt4,
                         cudaStream_t s);
// qkv [n, 3H] bf16 (rows r0.. of the images' patches, the bias added by qkv's GEMM) -> q, k, v
// [S, heads, Dp] bf16 rows r0.., q and k rotated in fp32 by the 2-D rotary (hd/4 frequencies of the
// patch's row, hd/4 of its column, a dim d paired with d + hd/2), the padding dims zero.
void vision_qkv_rope(const bf16* qkv, int64_t n, int64_t r0, const int32_t* row, const int32_t* col, const float* inv_freq,
                     int64_t heads, int64_t hd, int64_t Dp, bf16* q, bf16* k, bf16* v, cudaStream_t s);
// The same rotation in place: q and k within qkv's [n, 3H] rows (hd % 8 == 0; v untouched), the
// packed form's bits (the tower's attention then reads q | k | v from those rows).
void vision_qkv_rope_inplace(bf16* qkv, int64_t n, int64_t r0, const int32_t* row, const int32_t* col, const float* inv_freq,
                             int64_t heads, int64_t hd, cudaStream_t s);
// The first hd dims of each row of src [rows, Dp] into dst [rows, hd] (the attention output over
// its padded queries -> [patches, heads * hd] for proj); src and dst do not overlap.
void vision_pack_heads(const bf16* src, int64_t rows, int64_t hd, int64_t Dp, bf16* dst, cudaStream_t s);
// Rows [row0, row0 + n) (merge-block order, ImagePatches::pixels' layout) of one resized image
// (rgb, width x (grid_h * P) x 3 bytes) as the processor makes them: (v - 127.5) / 127.5 in fp32
// per channel, the frame repeated T times, rounded to bf16; out [n, 3 * T * P * P].
void vision_patchify(const uint8_t* rgb, int64_t width, int64_t grid_w, int64_t merge, int64_t P, int64_t T, int64_t row0, int64_t n,
                     bf16* out, cudaStream_t s);
// y = gelu(x + bias) as bf16, exact GELU (the merger's; the blocks' fc1 takes its bias and tanh-form
// GELU in cuBLASLt's epilogue: Gemm::run_epilogue).
void bias_gelu_bf16(const float* x, int64_t rows, int64_t n, const float* bias, bf16* y, cudaStream_t s);

// ---- fp32 GEMM on tensor cores (kernels_f32_gemm.cu) ----
// y[m, n] (+)= x[m, k] w[n, k]^T (rows ldx / ldw / ldy floats apart) with 3xTF32 mma.sync
// (fp32-level products): each element summed in an order fixed by k alone, so a row's result
// does not depend on m (batch invariance). For the head's Linears over all token rows where the
// wgmma form below does not run (--portable-kernels; not an sm_90a build on Hopper). Needs
// k % 4 == 0, ldx % 4 == 0, ldw % 4 == 0 and 16-byte aligned x and w (f32_gemm_3xtf32_fits;
// else it throws).
bool f32_gemm_3xtf32_fits(const float* x, int64_t ldx, int64_t k, const float* w, int64_t ldw);
void f32_gemm_3xtf32(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t ldw, int64_t n, float* y, int64_t ldy,
                     bool accumulate, cudaStream_t s);
// The tile f32_gemm_3xtf32 uses: 0 picks by the grid (64 rows x 32 columns where 64 x 64 tiles
// would leave SMs without two CTAs, 32 x 32 where 64 x 32 ones would too), 32 or 64 (64 rows,
// that many columns), 3232 (32 x 32). dev/cuda/head_gemm.cu compares them. The same bits.
void f32_gemm_3xtf32_set_tile(int tile);
// The same products on Hopper's warpgroup MMA (sm_90a; kernels_f32_gemm_wgmma.cu), w given as
// its TF32 hi / lo planes (f32_split_tf32_planes, once at load): the same operations a row, k in
// 8-wide steps into three accumulators summed at the end; a row's result does not depend on m nor
// on the tile. f32_gemm_3xtf32_wgmma_available: an sm_90a build on compute capability 9.0 (else
// it throws); _fits: f32_gemm_3xtf32_fits and a 16-byte aligned lo plane.
bool f32_gemm_3xtf32_wgmma_available();
bool f32_gemm_3xtf32_wgmma_fits(const float* x, int64_t ldx, int64_t k, const float* whi, const float* wlo, int64_t ldw);
// bias (n values, or null) is added last, y = (y +) sum, then + bias: bias_act's bits after it.
void f32_gemm_3xtf32_wgmma(const float* x, int64_t ldx, int64_t m, int64_t k, const float* whi, const float* wlo, int64_t ldw, int64_t n,
                           float* y, int64_t ldy, bool accumulate, cudaStream_t s, const float* bias = nullptr);
// hi[i] = w[i] rounded to TF32 (to nearest, ties away), lo[i] = w[i] - hi[i] (exact in fp32; the
// tensor cores read its upper 19 bits): split_tf32's values, as planes.
void f32_split_tf32_planes(const float* w, int64_t count, float* hi, float* lo, cudaStream_t s);
// The tile f32_gemm_3xtf32_wgmma uses: 0 picks by the grid (128 x 64 where those tiles fill 70%
// of the SMs, else 64 x 64 where those fill them, else 64 x 32), 642 (128 x 64), 641 (64 x 64),
// 321 (64 x 32).
// The GPU test and dev/cuda/head_gemm.cu compare them. The same bits.
void f32_gemm_3xtf32_wgmma_set_form(int form);
// true (the default): a step's A fragments split while the step before's wgmmas run (two register
// sets; not the 64 x 32 tiles, which are for small m); false: split, wgmmas, wait, one step at a
// time. The lab compares them; the same bits.
void f32_gemm_3xtf32_wgmma_set_pipelined(bool on);

// ---- joint head (kernels_head.cu) ----
// y[m, n] (+)= x[m, k] w[n, k]^T (fp32, w rows k apart) for the head's question / option rows:
// each element summed in an order fixed by k alone, so a row's result does not depend on m
// (batch invariance), and few rows use the whole GPU's width (a warp per 4 columns and one
// 1,024-element slice of k) rather than one 128-row tile. With bias,
// then y = gelu?(y + bias) as each element is written: bias_act's bits, one launch.
void head_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t n, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s, const float* bias = nullptr, bool gelu = false);
// The same with bf16 weights, widened exactly: equal, bit for bit, to the fp32 form given the
// same values in fp32.
void head_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const bf16* w, int64_t n, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s, const float* bias = nullptr, bool gelu = false);
// out[i, :] = mean of rows [begin[i], end[i]) of x (fp32, row stride ldx), or of table rows
// ids[begin..end) when table is given (the lexical means over lm_head). Empty spans give 0.
void span_mean(const float* x, int64_t ldx, const bf16* table, const int32_t* ids, const int32_t* begin, const int32_t* end,
               int64_t n, int64_t d, float* out32, bf16* out16, cudaStream_t s);
void gather_rows(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out32, bf16* out16, cudaStream_t s);
// out[i, :] += src[idx[i], :] (fp32, rows d wide)
void gather_rows_add(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out, cudaStream_t s);
// out[idx[i], :] = src[i, :] (fp32, rows d wide; the head's memory rows of sequences continuing a cached prefix)
void scatter_rows(const float* src, int64_t d, const int32_t* idx, int64_t n, float* out, cudaStream_t s);
// Unmasked attention per query row r and head: keys [kbeg[r], kend[r]) of k/v (row strides).
// q, k, v and out are fp32; head_dim = width / heads <= 128.
void mha_attend(const float* q, int64_t ldq, int64_t nq, const float* k, int64_t ldk, const float* v, int64_t ldv,
                const int32_t* kbeg, const int32_t* kend, int64_t width, int64_t heads, float* out, cudaStream_t s);
// Per question i: options [opt_beg[i], opt_beg[i+1]) of R [O, W]; p = softmax(R_j . B_i / sqrt(W));
// summary[i] = sum_j p_j R_j.
void option_summary(const float* R, const float* B, const int32_t* opt_beg, int64_t Q, int64_t W, float* summary, cudaStream_t s);
// F[i] += gp[qreq[i]] + type_emb[type[i]] (gp: one row per request); with add (rows as F's),
// F[i] = (F[i] + add[i]) + (gp[qreq[i]] + type_emb[type[i]]): the bits of adding add first in its
// own pass, without it
void field_init(float* F, const float* add, const float* gp, const float* type_emb, const int32_t* type, const int32_t* qreq, int64_t Q, int64_t W,
                cudaStream_t s);
// feat[j] = [F_q, o, F_q * o, |F_q - o|] with q = qof[j]
void scorer_features(const float* F, const float* On, const int32_t* qof, int64_t O, int64_t W, float* feat, cudaStream_t s);
// logit_j = prior_scale * cos(lex_j, qm_q + g_req) + gate * (joint_scale * cos(F_q, On_j) + hid_j . w3 + b3)
struct HeadScalars {
  float prior_scale, joint_scale, gate, b3;
};
void head_logits(const float* lex, const float* qm, const float* glast, const int32_t* qof, const int32_t* oreq, int64_t O, int64_t d,
                 const float* F, const float* On, int64_t W, const float* hid, const float* w3, int64_t sh, HeadScalars hs,
                 float* logits, cudaStream_t s);
// In place per question: softmax over its options (fp32).
void question_softmax(float* logits, const int32_t* opt_beg, int64_t Q, cudaStream_t s);

}  // namespace clefrt::cuda

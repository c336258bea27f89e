// The reference CPU kernels (fp32). The forward pass is written once over these; the CUDA
// backend implements the same set and is tested against them.
#pragma once
#include <cstdint>

namespace clefrt::cpu {

// Once per process, before a CPU forward: the forward allocates and frees its activations layer
// by layer, and glibc's defaults handed large freed blocks back to the OS (mmap / heap trim), so
// every layer faulted in fresh zeroed pages: 15% of a 4,096-token forward of the `small` model in
// page faults (perf), 3,800 -> 5,200 tokens/s on 2 cores with them kept. Blocks up to 32 MiB
// (glibc's limit for this setting) stay in the heap and the heap is not trimmed below 1 GiB.
void keep_freed_memory();

// y[m, n] = x[m, k] * w[n, k]^T (+ bias[n] when given). OpenBLAS sgemm.
void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, const float* bias = nullptr);

// Clef's RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w), per row of d.
void rms_norm_1p(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
// Plain-weight RMSNorm (the GDN gated norm): y = x * rsqrt(mean(x^2) + eps) * w.
void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
// Affine LayerNorm (the joint head, the vision tower).
void layer_norm(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps, float* y);

// Depthwise causal conv over one sequence then SiLU: y[t,c] = silu(sum_j w[c,j] x[t-K+1+j, c]).
void causal_conv_silu(const float* x, int64_t len, int64_t channels, const float* w, int64_t kernel, float* y);
// The same over rows that continue a sequence: `history` holds the K-1 input rows before x
// (zeros before the sequence's start), so a sequence run in pieces gets its whole-run outputs.
void causal_conv_silu_after(const float* history, const float* x, int64_t len, int64_t channels, const float* w, int64_t kernel,
                            float* y);

// Gated DeltaNet over one sequence and one value head, fp32 state S[dk, dv].
// q, k: [len, dk] (already L2-normalised, q scaled); v: [len, dv]; g (log decay), beta: [len].
// Strides let the caller pass views into packed [len, heads*dim] buffers.
struct GdnHead {
  const float *q, *k, *v, *g, *beta;
  int64_t len, dk, dv;
  int64_t q_stride, k_stride, v_stride, gb_stride, o_stride;
  float* o;  // [len, dv]
  // null: S starts at zero. Otherwise S [dk, dv] row-major: read as the state before the first
  // row and overwritten with the state after the last (a sequence run in pieces; the chunked
  // form then needs each piece to start at a multiple of its chunk to keep the whole run's bits).
  float* state = nullptr;
};
void gdn_recurrent(const GdnHead& h);
void gdn_chunked(const GdnHead& h, int64_t chunk = 64);

// Causal attention over one sequence: q [len, hq, d], k/v [len, hkv, d] (row strides given),
// out [len, hq, d]; query head h reads KV head h / (hq / hkv). Query rows run in blocks of
// kAttentionBlock.
constexpr int64_t kAttentionBlock = 256;
void attention_causal(const float* q, const float* k, const float* v, int64_t len, int64_t hq, int64_t hkv, int64_t d,
                      int64_t q_stride, int64_t kv_stride, float* out);
// Query rows [first, first + rows) of a sequence (q and out point at row `first`) against its
// keys [0, first + rows) (k / v point at row 0). With `first` a multiple of kAttentionBlock the
// bits are those of the whole-sequence call's rows.
void attention_causal_rows(const float* q, int64_t first, int64_t rows, const float* k, const float* v, int64_t hq, int64_t hkv,
                           int64_t d, int64_t q_stride, int64_t kv_stride, float* out);

// Unmasked multi-head attention (the joint head): q [lq, w], k/v [lk, w], heads of w/heads.
void attention_full(const float* q, int64_t lq, const float* k, const float* v, int64_t lk, int64_t width, int64_t heads,
                    float* out);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
float gelu_erf(float x);
float softplus(float x);  // log1p(exp(x)), x > 20 -> x

}  // namespace clefrt::cpu

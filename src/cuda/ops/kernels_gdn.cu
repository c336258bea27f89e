// Gated DeltaNet on the GPU (spec/model.md 1.1): causal conv + SiLU, q/k normalisation and the
// decay/beta gates, the chunked prefill (two kernels), and the gated RMSNorm.
//
// The chunked form, per chunk of C = 64 tokens and value head (gamma = in-chunk cumulative log
// decay, kept in double like the CPU twin: with strong decay it reaches thousands within a
// chunk and fp32 differences gamma_i - gamma_j would cancel badly):
//   Lm[i,j] = beta_i k_i.k_j e^(gamma_i - gamma_j) (i > j),  A[i,j] = q_i.k_j e^(gamma_i - gamma_j) (i >= j)
//   (I + Lm) U = beta V,  (I + Lm) W = beta K e^gamma          (forward substitution)
// then, sequentially over the chunks of a sequence with the fp32 state S [Dk, Dv]:
//   Vn = U - W S;  O = e^gamma Q S + A Vn;  S = e^gamma_C S + (K e^(gamma_C - gamma))^T Vn
// gdn_chunk_prep does the first part for all chunks in parallel; gdn_chunk_scan walks the
// chunks, one CTA per (sequence, head, 32 state columns): the columns of S evolve independently,
// which is what makes the split exact. Each has a tensor-core form (3xTF32 mma.sync) and a
// CUDA-core form; on Hopper the prep and scan run on wgmma instead (kernels_gdn_wgmma.cu; GdnPath
// in kernels.h).
#include <cooperative_groups.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/gated_norm.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/mma.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"
#include "cuda/runtime/pdl.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"

namespace clefrt::cuda {

namespace {

using namespace gdn;


// Depthwise causal conv + SiLU. Clef's case (K = 4, Cn and ldx multiples of 4): four channels
// per thread, x and the taps read as float4, 32-bit index arithmetic (the per-element 64-bit
// division of the general form cost more than the data). Taps are summed in the same order in
// both forms.
// Token t0 + r of the output goes to y row r; x's row 0 is token x_row0 (a block's in_proj rows
// start up to K - 1 tokens before the block, the conv's history).
// The K - 1 rows before a sequence's first token: its cached history (ConvHistory), or none.
__device__ __forceinline__ const float* history_of(const ConvHistory& h, int64_t t) {
  return h.rows ? h.rows[h.seq_of[t]] : nullptr;
}

// conv + SiLU of four channels c0 .. c0 + 3 of token t (the taps in order j = 0 .. 3)
__device__ __forceinline__ float4 conv4_silu_at(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t, uint32_t c0,
                                                uint32_t c4n, const float* w, const ConvHistory& hist, const RowColScales& xs = {}) {
  const int64_t s0 = seq_start[t];
  const float4 cs4 = xs.rs ? *reinterpret_cast<const float4*>(xs.cs + c0) : make_float4(0, 0, 0, 0);
  const float4 w0 = reinterpret_cast<const float4*>(w)[c0], w1 = reinterpret_cast<const float4*>(w)[c0 + 1],
               w2 = reinterpret_cast<const float4*>(w)[c0 + 2], w3 = reinterpret_cast<const float4*>(w)[c0 + 3];
  const float k0[4] = {w0.x, w0.y, w0.z, w0.w}, k1[4] = {w1.x, w1.y, w1.z, w1.w}, k2[4] = {w2.x, w2.y, w2.z, w2.w},
              k3[4] = {w3.x, w3.y, w3.z, w3.w};
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t src = t - 3 + j;
    const float* row;
    float4 v;
    if (src >= s0) {
      row = x + (src - x_row0) * ldx;
      v = *reinterpret_cast<const float4*>(row + c0);
      if (xs.rs) v = fp8_scaled4(v, xs.rs[src - x_row0], cs4);  // the scale pass's bits, applied here instead
    } else {
      const float* h = history_of(hist, t);
      if (!h) continue;
      row = h + hist.layer_off + (3 + (src - s0)) * (4 * int64_t(c4n));
      v = *reinterpret_cast<const float4*>(row + c0);
    }
    a0 += k0[j] * v.x;
    a1 += k1[j] * v.y;
    a2 += k2[j] * v.z;
    a3 += k3[j] * v.w;
  }
  return make_float4(silu_f(a0), silu_f(a1), silu_f(a2), silu_f(a3));
}

__global__ void conv_silu4_k(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, uint32_t n, uint32_t c4n,
                             const float* w, float* y, ConvHistory hist) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t r = i / c4n, c0 = (i - r * c4n) * 4;
    *reinterpret_cast<float4*>(y + int64_t(r) * (4 * int64_t(c4n)) + c0) = conv4_silu_at(x, ldx, x_row0, seq_start, t0 + r, c0, c4n, w, hist);
  }
}

__global__ void conv_silu_k(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, int64_t L, int64_t Cn,
                            const float* w, int K, float* y, ConvHistory hist) {
  const int64_t n = L * Cn;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / Cn, c = i - r * Cn, t = t0 + r;
    const int64_t s0 = seq_start[t];
    float acc = 0;
    for (int j = 0; j < K; ++j) {
      const int64_t src = t - K + 1 + j;
      if (src >= s0) {
        acc += w[c * K + j] * x[(src - x_row0) * ldx + c];
      } else if (const float* h = history_of(hist, t)) {
        acc += w[c * K + j] * h[hist.layer_off + ((K - 1) + (src - s0)) * Cn + c];
      }
    }
    y[i] = silu_f(acc);
  }
}

// One warp per (token, q-or-k head).
__global__ void qk_norm_k(float* mixed, int64_t L, int64_t Hk, int64_t Dk, int64_t conv_dim, float qscale) {
  const int64_t wid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= L * 2 * Hk) return;
  const int64_t t = wid / (2 * Hk), r = wid - t * 2 * Hk;  // r < Hk: q head r; else k head r - Hk
  float* x = mixed + t * conv_dim + r * Dk;                  // q heads then k heads are contiguous
  float ss = 0;
  for (int64_t i = lane; i < Dk; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss + 1e-6f) * (r < Hk ? qscale : 1.0f);
  for (int64_t i = lane; i < Dk; i += 32) x[i] *= inv;
}

// The gate pair of (token row t, value head j): gates_k's body.
__device__ __forceinline__ void gates_at(const float* b, const float* a, int64_t ldba, int64_t t, int64_t j, int64_t i, const float* negA,
                                         const float* dt_bias, float* g, float* beta) {
  beta[i] = sigmoid_f(b[t * ldba + j]);
  const float x = a[t * ldba + j] + dt_bias[j];
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  g[i] = negA[j] * sp;
}

// Clef's shape (K = 4, Dk = 128, conv_dim % 128 == 0): the conv + SiLU, the q / k norms and the
// gates in one launch instead of three, mixed written once. A thread takes four consecutive
// channels of kConvTokens consecutive tokens: the kConvTokens + 3 input rows they need are read
// once into registers (one token a thread read each row four times). A warp's 32 lanes take 128
// consecutive channels of the same tokens, which in the q and k columns is one whole head, so the
// norm's sum is a warp sum; items [n, n + L Hv) are the gates. The conv values are
// conv_silu4_k's bits (the same taps in the same order); the norms sum in another order than
// qk_norm_k (a lane's four, then the warp), within fp32 rounding of it.
constexpr int kConvTokens = 8;
constexpr int kConvPrepThreads = 256;
// four values to y's row: fp32, or rounded to bf16 (the one-pass Wgmma prep's input, mixed16)
__device__ __forceinline__ void store4(float* y, float4 v) { *reinterpret_cast<float4*>(y) = v; }
__device__ __forceinline__ void store4(bf16* y, float4 v) { *reinterpret_cast<uint2*>(y) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w)); }
template <typename Out>
__device__ __forceinline__ void gdn_conv_prep_body(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, uint32_t L,
                                                   uint32_t n, uint32_t c4n, uint32_t q4, float qscale, const float* w, Out* y,
                                                   const ConvHistory& hist, const RowColScales& xs, const float* b, const float* a, int64_t ldba,
                                                   uint32_t Hv, uint32_t total, const float* negA, const float* dt_bias, float* g, float* beta) {
  pdl_wait();
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    if (i >= n) {  // whole warps are on one side: n is a multiple of 32
      const uint32_t e = i - n, t = e / Hv;
      gates_at(b, a, ldba, t, e - t * Hv, e, negA, dt_bias, g, beta);
      continue;
    }
    const uint32_t grp = i / c4n, q = i - grp * c4n, c0 = q * 4, r0 = grp * kConvTokens;
    const float4 cs4 = xs.rs ? *reinterpret_cast<const float4*>(xs.cs + c0) : make_float4(0, 0, 0, 0);
    const float4 w0 = reinterpret_cast<const float4*>(w)[c0], w1 = reinterpret_cast<const float4*>(w)[c0 + 1],
                 w2 = reinterpret_cast<const float4*>(w)[c0 + 2], w3 = reinterpret_cast<const float4*>(w)[c0 + 3];
    const float k0[4] = {w0.x, w0.y, w0.z, w0.w}, k1[4] = {w1.x, w1.y, w1.z, w1.w}, k2[4] = {w2.x, w2.y, w2.z, w2.w},
                k3[4] = {w3.x, w3.y, w3.z, w3.w};
    // rows t0 + r0 - 3 .. t0 + r0 + kConvTokens - 1 of x, those it has (a token reads the ones
    // of its own sequence only, below)
    float4 win[kConvTokens + 3];
#pragma unroll
    for (int m = 0; m < kConvTokens + 3; ++m) {
      const int64_t src = t0 + int64_t(r0) + m - 3;
      win[m] = make_float4(0, 0, 0, 0);
      if (src >= x_row0 && src < t0 + int64_t(L)) {
        win[m] = *reinterpret_cast<const float4*>(x + (src - x_row0) * ldx + c0);
        if (xs.rs) win[m] = fp8_scaled4(win[m], xs.rs[src - x_row0], cs4);  // the scale pass's bits, applied here instead
      }
    }
#pragma unroll
    for (int m = 0; m < kConvTokens; ++m) {
      if (r0 + m >= L) break;  // the whole warp: its lanes share the tokens
      const int64_t t = t0 + r0 + m, s0 = seq_start[t];
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // conv4_silu_at's taps
        const int64_t src = t - 3 + j;
        float4 v;
        if (src >= s0) {
          v = win[m + j];
        } else {
          const float* h = history_of(hist, t);
          if (!h) continue;
          v = *reinterpret_cast<const float4*>(h + hist.layer_off + (3 + (src - s0)) * (4 * int64_t(c4n)) + c0);
        }
        a0 += k0[j] * v.x;
        a1 += k1[j] * v.y;
        a2 += k2[j] * v.z;
        a3 += k3[j] * v.w;
      }
      float4 v = make_float4(silu_f(a0), silu_f(a1), silu_f(a2), silu_f(a3));
      if (q < 2 * q4) {  // a q or k head: the whole warp (c4n and q4 are multiples of 32)
        const float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
        const float inv = rsqrtf(ss + 1e-6f) * (q < q4 ? qscale : 1.0f);
        v = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
      }
      store4(y + int64_t(r0 + m) * (4 * int64_t(c4n)) + c0, v);
    }
  }
}
template <typename Out>
__global__ void gdn_conv_prep_k(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, uint32_t L, uint32_t n,
                                uint32_t c4n, uint32_t q4, float qscale, const float* w, Out* y, ConvHistory hist, RowColScales xs,
                                const float* b, const float* a, int64_t ldba, uint32_t Hv, uint32_t total, const float* negA,
                                const float* dt_bias, float* g, float* beta) {
  gdn_conv_prep_body(x, ldx, x_row0, seq_start, t0, L, n, c4n, q4, qscale, w, y, hist, xs, b, a, ldba, Hv, total, negA, dt_bias, g, beta);
}
// The product's form: registers capped for 3 CTAs an SM (the kernel above holds a thread's 11
// input rows of 4 channels in 96 registers: 2 CTAs an SM; CLEFRT_LAB_CONV_PREP_MIN_BLOCKS=0 runs
// it). The cap spills a few registers (ptxas warns); the third CTA's loads pay for them
// (bench/results/2026-12-06-h100-session36.md). Capped for 4 it spilled 668 bytes and was not kept.
template <typename Out>
__global__ void __launch_bounds__(kConvPrepThreads, 3)
    gdn_conv_prep_capped_k(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, uint32_t L, uint32_t n, uint32_t c4n,
                           uint32_t q4, float qscale, const float* w, Out* y, ConvHistory hist, RowColScales xs, const float* b, const float* a,
                           int64_t ldba, uint32_t Hv, uint32_t total, const float* negA, const float* dt_bias, float* g, float* beta) {
  gdn_conv_prep_body(x, ldx, x_row0, seq_start, t0, L, n, c4n, q4, qscale, w, y, hist, xs, b, a, ldba, Hv, total, negA, dt_bias, g, beta);
}

__global__ void gates_k(const float* b, const float* a, int64_t ldba, int64_t L, int64_t Hv, const float* negA, const float* dt_bias,
                        float* g, float* beta) {
  const int64_t n = L * Hv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / Hv;
    gates_at(b, a, ldba, t, i - t * Hv, i, negA, dt_bias, g, beta);
  }
}

struct PrepSmem {
  // sizes in floats, Dk/Dv padded by one to spread banks
  // UW reuses the q/k space once Lm and A are built: ~84 KiB at Dk = Dv = 128, two CTAs per SM
  __host__ __device__ static size_t qk_floats(int64_t Dk, int64_t Dv) {
    const int64_t qk = 2 * C * (Dk + 1), uw = C * (Dk + Dv + 1);
    return size_t(qk > uw ? qk : uw);
  }
  static size_t bytes(int64_t Dk, int64_t Dv) { return sizeof(double) * C + sizeof(float) * (qk_floats(Dk, Dv) + C * (C + 1) + C); }
};

__global__ void __launch_bounds__(256) gdn_chunk_prep_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                        int64_t Dv, const float* g, const float* beta, GdnChunks ch, GdnScratch sc) {
  extern __shared__ double smem_d[];
  double* gam = smem_d;
  float* ks = reinterpret_cast<float*>(gam + C);
  float* qs = ks + C * (Dk + 1);
  float* UW = ks;  // [C][Dv + Dk + 1]: U columns then W columns, over q/k once they are done
  float* Lm = ks + PrepSmem::qk_floats(Dk, Dv);
  float* bs = Lm + C * (C + 1);
  const int64_t ldu = Dv + Dk + 1;

  const int64_t ci = blockIdx.x, c = sc.c0 + ci, j = blockIdx.y;  // ci: the chunk's place in this pass's scratch
  const int64_t t0 = ch.chunk_start[c];
  const int n = ch.chunk_len[c];
  const int64_t kh = j / (Hv / Hk);
  const int64_t key_dim = Hk * Dk;
  const int tid = threadIdx.x, nt = blockDim.x;

  for (int64_t e = tid; e < C * Dk; e += nt) {
    const int64_t i = e / Dk, x = e - i * Dk;
    const bool in = i < n;
    qs[i * (Dk + 1) + x] = in ? mixed[(t0 + i) * conv_dim + kh * Dk + x] : 0.0f;
    ks[i * (Dk + 1) + x] = in ? mixed[(t0 + i) * conv_dim + key_dim + kh * Dk + x] : 0.0f;
  }
  if (tid < C) bs[tid] = tid < n ? beta[(t0 + tid) * Hv + j] : 0.0f;
  chunk_gamma(gam, g, t0, n, Hv, j);
  __syncthreads();

  float* aqk = sc.aqk + (ci * Hv + j) * C * C;
  for (int p = tid; p < C * C; p += nt) {
    const int i = p / C, jj = p % C;
    float kk = 0, qk = 0;
    if (i >= jj && i < n) {
      const float* ki = ks + i * (Dk + 1);
      const float* kj = ks + jj * (Dk + 1);
      const float* qi = qs + i * (Dk + 1);
      float kk1 = 0, qk1 = 0;
      int64_t x = 0;
      for (; x + 2 <= Dk; x += 2) {
        kk += ki[x] * kj[x];
        qk += qi[x] * kj[x];
        kk1 += ki[x + 1] * kj[x + 1];
        qk1 += qi[x + 1] * kj[x + 1];
      }
      for (; x < Dk; ++x) {
        kk += ki[x] * kj[x];
        qk += qi[x] * kj[x];
      }
      kk += kk1;
      qk += qk1;
      const float G = float(exp(gam[i] - gam[jj]));
      qk *= G;
      kk = i > jj ? bs[i] * kk * G : 0.0f;
    }
    Lm[i * (C + 1) + jj] = kk;
    aqk[p] = qk;
  }
  __syncthreads();  // q/k space becomes UW
  // right-hand sides: U = beta V, W = beta K e^gamma (k read again from global memory)
  for (int64_t e = tid; e < C * (Dv + Dk); e += nt) {
    const int64_t i = e / (Dv + Dk), x = e - i * (Dv + Dk);
    float v = 0;
    if (i < n) {
      if (x < Dv) v = bs[i] * mixed[(t0 + i) * conv_dim + 2 * key_dim + j * Dv + x];
      else v = bs[i] * mixed[(t0 + i) * conv_dim + key_dim + kh * Dk + (x - Dv)] * float(exp(gam[i]));
    }
    UW[i * ldu + x] = v;
  }
  __syncthreads();
  // forward substitution, one column per thread (columns are independent)
  // (four partial sums: the chain of dependent FMAs, not arithmetic, bounds this loop)
  for (int64_t x = tid; x < Dv + Dk; x += nt) {
    for (int i = 1; i < n; ++i) {
      const float* li = Lm + i * (C + 1);
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      int jj = 0;
      for (; jj + 4 <= i; jj += 4) {
        a0 += li[jj] * UW[jj * ldu + x];
        a1 += li[jj + 1] * UW[(jj + 1) * ldu + x];
        a2 += li[jj + 2] * UW[(jj + 2) * ldu + x];
        a3 += li[jj + 3] * UW[(jj + 3) * ldu + x];
      }
      for (; jj < i; ++jj) a0 += li[jj] * UW[jj * ldu + x];
      UW[i * ldu + x] -= (a0 + a1) + (a2 + a3);
    }
  }
  __syncthreads();
  float* u = sc.u + (ci * Hv + j) * C * Dv;
  float* w = sc.w + (ci * Hv + j) * C * Dk;
  for (int64_t e = tid; e < C * Dv; e += nt) u[e] = UW[(e / Dv) * ldu + e % Dv];
  for (int64_t e = tid; e < C * Dk; e += nt) w[e] = UW[(e / Dk) * ldu + Dv + e % Dk];
}

// ---- the prep on tensor cores ----
// Same outputs as gdn_chunk_prep_k, one CTA (8 warps) per (chunk, value head):
//   1. Lm = beta K K^T e^(gamma_i - gamma_j) and A = Q K^T e^(...) as 16 x 8 3xTF32 tiles (tiles
//      wholly above the diagonal are skipped; A's are written as zeros);
//   2. T = (I + Lm)^-1, blocked by 16: the four diagonal blocks by substitution (a column per
//      thread, in registers), then T_ib = -T_ii sum_{k = b..i-1} Lm_ik T_kb by block distance
//      (3xTF32 mma.sync; gdn_tiles.cuh's invert_unit_lower);
//   3. U = T (beta V), W = T (beta e^gamma K) as 3xTF32 tiles (T is lower triangular: k stops at
//      the tile's last row).
// The forward substitution of the SIMT kernel walked 64 dependent rows per column; here the
// sequential part is the 16-row diagonal blocks. Strides: rows read as mma A operands (or as B
// indexed [col][k]) are padded to = 4 (mod 32) floats, rows read as B [k][col] to = 8.
struct PrepTcSmem {
  int ldk, ldv, ldl;  // K / Q rows, beta V rows, Lm / T rows (floats)
  __host__ __device__ explicit PrepTcSmem(int64_t Dk, int64_t Dv)
      : ldk(int(Dk) + 4), ldv(int(Dv) + 8 > int(Dk) + 4 ? int(Dv) + 8 : int(Dk) + 4), ldl(C + 4) {}
  __host__ __device__ size_t floats() const { return size_t(C) * ldk + size_t(C) * ldv + 2 * size_t(C) * ldl + 3 * 256 + 2 * C; }
  size_t bytes() const { return sizeof(double) * C + sizeof(float) * floats(); }  // ~105 KiB at Dk = Dv = 128: two CTAs per SM
};

__global__ void __launch_bounds__(256) gdn_chunk_prep_tc_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                           int64_t Dv, const float* g, const float* beta, GdnChunks ch, GdnScratch sc) {
  extern __shared__ double smem_d[];
  const PrepTcSmem lay(Dk, Dv);
  const int ldk = lay.ldk, ldv = lay.ldv, ldl = lay.ldl;
  double* gam = smem_d;
  float* ks = reinterpret_cast<float*>(gam + C);  // [C][ldk]
  float* qs = ks + C * ldk;                        // [C][ldk], then beta V [C][ldv]
  float* vs = qs;
  float* Lm = qs + C * ldv;  // [C][ldl]
  float* T = Lm + C * ldl;   // [C][ldl]
  float* P = T + C * ldl;    // [3][16][16]: the sums of one block distance
  float* bs = P + 3 * 256;   // beta_i
  float* sk = bs + C;        // beta_i e^gamma_i

  const int64_t ci = blockIdx.x, c = sc.c0 + ci, j = blockIdx.y;  // ci: the chunk's place in this pass's scratch
  const int64_t t0 = ch.chunk_start[c];
  const int n = ch.chunk_len[c];
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;

  const float* rows = mixed + t0 * conv_dim;
  load_tile_async(qs, ldk, rows + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
  load_tile_async(ks, ldk, rows + key_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
  for (int e = tid; e < C * ldl; e += nt) T[e] = 0.0f;
  if (tid < C) bs[tid] = tid < n ? beta[(t0 + tid) * Hv + j] : 0.0f;
  chunk_gamma(gam, g, t0, n, Hv, j);
  cp_async_wait_all();
  __syncthreads();
  if (tid < C) sk[tid] = bs[tid] * float(exp(gam[tid]));

  // 1. Lm and A. Warp w owns column tile cc = 8 w of both (tiles w + 8 i: row tile rt = 16 i);
  // its tiles at or below the diagonal (i >= w / 2) share their K-column fragment.
  // A's elements (row, col), (row, col + 1)
  auto put_a = [&](int row, int col, float x0, float x1) {
    *reinterpret_cast<float2*>(sc.aqk + (ci * Hv + j) * C * C + row * C + col) = make_float2(x0, x1);
  };
  {
    static_assert(C == 64, "the tile assignment assumes 4 row tiles x 8 column tiles");
    const int cc = 8 * warp, i_min = warp / 2, jj = cc + 2 * tq;
    for (int i = 0; i < i_min; ++i) {  // wholly above the diagonal
      put_a(16 * i + gq, jj, 0.0f, 0.0f);
      put_a(16 * i + gq + 8, jj, 0.0f, 0.0f);
    }
    float d[8][4] = {};  // d[2 (i - i_min)]: K K^T, d[2 (i - i_min) + 1]: Q K^T
    mma_3xtf32_shared_b<8>(
        d, 2 * (4 - i_min), int(Dk),
        [&](int q, int r, int k) { return ((q & 1) ? qs : ks)[(16 * (i_min + q / 2) + r) * ldk + k]; },
        [&](int k, int col) { return ks[(cc + col) * ldk + k]; });
    // constant indices into d (a loop from i_min put d in local memory)
#pragma unroll
    for (int qi = 0; qi < 4; ++qi) {
      if (qi >= 4 - i_min) break;
      const int i = i_min + qi;
      const float* dk = d[2 * qi];
      const float* dq = d[2 * qi + 1];
      const int i0 = 16 * i + gq, i1 = i0 + 8;
      float a[4], l[4];
      for (int e = 0; e < 4; ++e) {
        const int ii = e < 2 ? i0 : i1, jc = jj + (e & 1);
        const float G = ii >= jc ? expf(float(gam[ii] - gam[jc])) : 0.0f;
        a[e] = ii >= jc ? dq[e] * G : 0.0f;
        l[e] = ii > jc ? bs[ii] * dk[e] * G : 0.0f;
        Lm[ii * ldl + jc] = l[e];
      }
      put_a(i0, jj, a[0], a[1]);
      put_a(i1, jj, a[2], a[3]);
    }
  }
  __syncthreads();  // Q is done: V into its space (beta is applied as it is read)
  load_tile_async(vs, ldv, rows + 2 * key_dim + j * Dv, conv_dim, C, int(Dv), n, int(Dv));
  // 2. T = (I + Lm)^-1
  invert_unit_lower(Lm, T, P, ldl, tid, nt);
  cp_async_wait_all();
  __syncthreads();
  // 3. U = T (beta V), W = T (beta e^gamma K): column tiles of U, then of W
  float* u = sc.u + (ci * Hv + j) * C * Dv;
  float* w = sc.w + (ci * Hv + j) * C * Dk;
  // Warp w's tiles (w + 8 m) share the row tile rt = 16 (w % 4), hence their T fragment; column
  // tile (w / 4 + 2 m) of U (beta V), then of W (beta e^gamma K). In groups of four.
  const int col_tiles = int(Dv / 8 + Dk / 8), rt = (warp % 4) * 16;
  const int count = (4 * col_tiles - warp + 7) / 8;
  for (int m0 = 0; m0 < count; m0 += 4) {
    const int nb = count - m0 < 4 ? count - m0 : 4;
    float d[4][4] = {};
    mma_3xtf32_shared_a<4>(
        d, nb, rt + 16, [&](int r, int k) { return T[(rt + r) * ldl + k]; },
        [&](int q, int k, int col) {
          const int col0 = (warp / 4 + 2 * (m0 + q)) * 8;
          return col0 < Dv ? bs[k] * vs[k * ldv + col0 + col] : sk[k] * ks[k * ldk + (col0 - int(Dv)) + col];
        });
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (q >= nb) break;
      const int col0 = (warp / 4 + 2 * (m0 + q)) * 8;
      float* out = col0 < Dv ? u + col0 : w + (col0 - int(Dv));
      const int64_t ldo = col0 < Dv ? Dv : Dk;
      *reinterpret_cast<float2*>(out + (rt + gq) * ldo + 2 * tq) = make_float2(d[q][0], d[q][1]);
      *reinterpret_cast<float2*>(out + (rt + gq + 8) * ldo + 2 * tq) = make_float2(d[q][2], d[q][3]);
    }
  }
}


struct ScanSmem {
  static size_t bytes(int64_t Dk) {
    // K reuses W's space (W is done after Vn): ~108 KiB at Dk = 128, two CTAs per SM
    return sizeof(double) * C + sizeof(float) * (Dk * SW + 2 * C * (Dk + 1) + C * (C + 1) + C * (SW + 1) + 2 * C);
  }
};

__global__ void __launch_bounds__(256) gdn_chunk_scan_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                        int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* o) {
  extern __shared__ double smem_d[];
  double* gam = smem_d;
  float* S = reinterpret_cast<float*>(gam + C);  // [Dk][SW]
  float* Ws = S + Dk * SW;
  float* qs = Ws + C * (Dk + 1);
  float* ks = Ws;  // loaded after Vn = U - W S
  float* As = qs + C * (Dk + 1);
  float* Vn = As + C * (C + 1);
  float* eg = Vn + C * (SW + 1);  // e^gamma_i
  float* ek = eg + C;             // e^(gamma_C - gamma_i)

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SW;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk, value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SW ? Dv - c0_col : SW);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nt >> 5;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, SW, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  for (int64_t c = cb; c < ce; ++c) {
    snap_state(S, SW, sc, s, c, j, Dk, Dv, c0_col, sw, tid, nt);
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* w = sc.w + ((c - sc.c0) * Hv + j) * C * Dk;
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;
    const float* aqk = sc.aqk + ((c - sc.c0) * Hv + j) * C * C;
    __syncthreads();  // the previous chunk's readers of q/k/Vn are done
    for (int64_t e = tid; e < C * Dk; e += nt) {
      const int64_t i = e / Dk, x = e - i * Dk;
      const bool in = i < n;
      Ws[i * (Dk + 1) + x] = w[e];
      qs[i * (Dk + 1) + x] = in ? mixed[(t0 + i) * conv_dim + kh * Dk + x] : 0.0f;
    }
    for (int e = tid; e < C * C; e += nt) As[(e / C) * (C + 1) + e % C] = aqk[e];
    for (int e = tid; e < C * SW; e += nt) {
      const int i = e / SW, x = e % SW;
      Vn[i * (SW + 1) + x] = x < sw ? u[i * Dv + c0_col + x] : 0.0f;
    }
    chunk_gamma(gam, g, t0, n, Hv, j);
    __syncthreads();
    if (tid < C) {
      eg[tid] = float(exp(gam[tid]));
      ek[tid] = tid < n ? float(exp(gam[n - 1] - gam[tid])) : 0.0f;
    }
    // Vn = U - W S   (lane = column, warps over rows)
    // (two rows per pass and four partial sums: independent FMA chains, and each S value
    // loaded from shared memory serves both rows)
    for (int i = warp; i < C; i += 2 * nwarps) {
      const int i2 = i + nwarps;
      const float* wi = Ws + i * (Dk + 1);
      const float* wj = Ws + i2 * (Dk + 1);
      float a0 = 0, a1 = 0, b0 = 0, b1 = 0;
      int64_t y = 0;
      for (; y + 2 <= Dk; y += 2) {
        const float s0 = S[y * SW + lane], s1 = S[(y + 1) * SW + lane];
        a0 += wi[y] * s0;
        a1 += wi[y + 1] * s1;
        b0 += wj[y] * s0;
        b1 += wj[y + 1] * s1;
      }
      for (; y < Dk; ++y) {
        a0 += wi[y] * S[y * SW + lane];
        b0 += wj[y] * S[y * SW + lane];
      }
      Vn[i * (SW + 1) + lane] -= a0 + a1;
      if (i2 < C) Vn[i2 * (SW + 1) + lane] -= b0 + b1;
    }
    __syncthreads();
    // O = e^gamma Q S + A Vn
    for (int i = warp; i < n; i += nwarps) {
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      const float* qi = qs + i * (Dk + 1);
      int64_t y = 0;
      for (; y + 4 <= Dk; y += 4) {
        a0 += qi[y] * S[y * SW + lane];
        a1 += qi[y + 1] * S[(y + 1) * SW + lane];
        a2 += qi[y + 2] * S[(y + 2) * SW + lane];
        a3 += qi[y + 3] * S[(y + 3) * SW + lane];
      }
      for (; y < Dk; ++y) a0 += qi[y] * S[y * SW + lane];
      float acc = ((a0 + a1) + (a2 + a3)) * eg[i];
      const float* ai = As + i * (C + 1);
      float c0 = 0, c1 = 0;
      int jj = 0;
      for (; jj + 2 <= i + 1; jj += 2) {
        c0 += ai[jj] * Vn[jj * (SW + 1) + lane];
        c1 += ai[jj + 1] * Vn[(jj + 1) * (SW + 1) + lane];
      }
      for (; jj <= i; ++jj) c0 += ai[jj] * Vn[jj * (SW + 1) + lane];
      acc += c0 + c1;
      if (lane < sw) o[(t0 + i) * value_dim + j * Dv + c0_col + lane] = acc;
    }
    for (int64_t e = tid; e < C * Dk; e += nt) {  // K into W's space (W was last read before the sync above)
      const int64_t i = e / Dk, x = e - i * Dk;
      ks[i * (Dk + 1) + x] = i < n ? mixed[(t0 + i) * conv_dim + key_dim + kh * Dk + x] : 0.0f;
    }
    __syncthreads();
    // S = e^gamma_C S + (K e^(gamma_C - gamma))^T Vn
    const float eC = float(exp(gam[n - 1]));
    for (int64_t y = warp; y < Dk; y += 2 * nwarps) {
      const int64_t y2 = y + nwarps;
      const bool two = y2 < Dk;
      float a0 = 0, a1 = 0, b0 = 0, b1 = 0;
      int i = 0;
      for (; i + 2 <= n; i += 2) {
        const float v0 = ek[i] * Vn[i * (SW + 1) + lane], v1 = ek[i + 1] * Vn[(i + 1) * (SW + 1) + lane];
        a0 += ks[i * (Dk + 1) + y] * v0;
        a1 += ks[(i + 1) * (Dk + 1) + y] * v1;
        if (two) {
          b0 += ks[i * (Dk + 1) + y2] * v0;
          b1 += ks[(i + 1) * (Dk + 1) + y2] * v1;
        }
      }
      for (; i < n; ++i) {
        const float v0 = ek[i] * Vn[i * (SW + 1) + lane];
        a0 += ks[i * (Dk + 1) + y] * v0;
        if (two) b0 += ks[i * (Dk + 1) + y2] * v0;
      }
      S[y * SW + lane] = S[y * SW + lane] * eC + (a0 + a1);
      if (two) S[y2 * SW + lane] = S[y2 * SW + lane] * eC + (b0 + b1);
    }
  }
  end_pass(S, SW, sc, ch, s, ce, j, Dk, Dv, c0_col, sw, tid, nt);
}


// ---- the scan on tensor cores ----
// The same three products per chunk as gdn_chunk_scan_k, with the 3xTF32 tiles of
// gdn_tiles.cuh. Shared-memory strides are padded so the fragment loads do not conflict: rows of
// Dk + 4 and of C + 4, state rows of SW + 8. (Split into a state kernel and a parallel output
// kernel it was slower: the dev/cuda lab's gdn_scan.cu.)
struct ScanTcSmem {
  // W, then A, then K share one region (each is done before the next arrives): ~100 KiB at
  // Dk = 128, two CTAs per SM
  static size_t bytes(int64_t Dk) {
    const int64_t ld = Dk + 4, region = C * (ld > C + 4 ? ld : C + 4);
    return sizeof(double) * C + sizeof(float) * (Dk * SWP + region + C * ld + C * SWP + 2 * C);
  }
};

// One CTA (8 warps) per (sequence, value head, 32 state columns), as gdn_chunk_scan_k. Each warp
// owns output tiles of 16 x 8: Vn and O 64 x 32 (2 tiles per warp), S 128 x 32 (Dk / 16 x 4 tiles).
__global__ void __launch_bounds__(256) gdn_chunk_scan_tc_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dk,
                                                           int64_t Dv, const float* g, GdnChunks ch, GdnScratch sc, float* o) {
  extern __shared__ double smem_d[];
  const int ld = int(Dk) + 4, lda = C + 4;
  double* gam = smem_d;
  float* S = reinterpret_cast<float*>(gam + C);  // [Dk][SWP]
  float* Ws = S + Dk * SWP;                      // [C][ld]: W, then A ([C][lda]), then K
  float* qs = Ws + C * (ld > lda ? ld : lda);    // [C][ld]
  float* ks = Ws;
  float* As = Ws;
  float* Vn = qs + C * ld;    // [C][SWP]
  float* eg = Vn + C * SWP;   // e^gamma_i
  float* ek = eg + C;         // e^(gamma_C - gamma_i)

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * SW;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk, value_dim = Hv * Dv;
  const int sw = int(Dv - c0_col < SW ? Dv - c0_col : SW);
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  // this warp's 16 x 8 tiles of the 64 x 32 outputs: rows 16 * (warp % 4), columns 8 * ct
  const int rt = (warp & 3) * 16, ct0 = (warp >> 2) * 16;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  load_state(S, SWP, sc, s, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  for (int64_t c = cb; c < ce; ++c) {
    snap_state(S, SWP, sc, s, c, j, Dk, Dv, c0_col, sw, tid, nt);
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* w = sc.w + ((c - sc.c0) * Hv + j) * C * Dk;
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;
    const float* aqk = sc.aqk + ((c - sc.c0) * Hv + j) * C * C;
    const float* rows = mixed + t0 * conv_dim;
    __syncthreads();  // the previous chunk's readers of q/k/Vn/S are done
    load_tile_async(Ws, ld, w, Dk, C, int(Dk), C, int(Dk));
    load_tile_async(qs, ld, rows + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));
    load_tile_async(Vn, SWP, u + c0_col, Dv, C, SW, C, sw);
    chunk_gamma(gam, g, t0, n, Hv, j);
    cp_async_wait_all();
    __syncthreads();
    if (tid < C) {
      eg[tid] = float(exp(gam[tid]));
      ek[tid] = tid < n ? float(exp(gam[n - 1] - gam[tid])) : 0.0f;
    }
    // Vn = U - W S: this warp's two tiles share their W fragment
    {
      float d[2][4] = {};
      mma_3xtf32_shared_a<2>(
          d, 2, int(Dk), [&](int r, int k) { return Ws[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWP + ct0 + 8 * q + col]; });
      for (int q = 0; q < 2; ++q) {
        const int cc = ct0 + 8 * q;
        Vn[(rt + gq) * SWP + cc + 2 * tq] -= d[q][0];
        Vn[(rt + gq) * SWP + cc + 2 * tq + 1] -= d[q][1];
        Vn[(rt + gq + 8) * SWP + cc + 2 * tq] -= d[q][2];
        Vn[(rt + gq + 8) * SWP + cc + 2 * tq + 1] -= d[q][3];
      }
    }
    __syncthreads();  // W is done: A into its space
    load_tile_async(As, lda, aqk, C, C, C, C, C);
    cp_async_wait_all();
    __syncthreads();
    // O = e^gamma Q S + A Vn (A is lower triangular: k stops at the tile's last row)
    {
      float d[2][4] = {};
      mma_3xtf32_shared_a<2>(
          d, 2, int(Dk), [&](int r, int k) { return qs[(rt + r) * ld + k]; },
          [&](int q, int k, int col) { return S[k * SWP + ct0 + 8 * q + col]; });
      const float e0 = eg[rt + gq], e1 = eg[rt + gq + 8];
      float a[2][4];
      for (int q = 0; q < 2; ++q) {
        a[q][0] = d[q][0] * e0;
        a[q][1] = d[q][1] * e0;
        a[q][2] = d[q][2] * e1;
        a[q][3] = d[q][3] * e1;
      }
      mma_3xtf32_shared_a<2>(
          a, 2, rt + 16, [&](int r, int k) { return As[(rt + r) * lda + k]; },
          [&](int q, int k, int col) { return Vn[k * SWP + ct0 + 8 * q + col]; });
      for (int q = 0; q < 2; ++q) {
        const int r0 = rt + gq, r1 = rt + gq + 8, col = ct0 + 8 * q + 2 * tq;
        float* out0 = o + (t0 + r0) * value_dim + j * Dv + c0_col + col;
        float* out1 = o + (t0 + r1) * value_dim + j * Dv + c0_col + col;
        if (r0 < n && col < sw) out0[0] = a[q][0];
        if (r0 < n && col + 1 < sw) out0[1] = a[q][1];
        if (r1 < n && col < sw) out1[0] = a[q][2];
        if (r1 < n && col + 1 < sw) out1[1] = a[q][3];
      }
    }
    __syncthreads();  // Q, A and Vn reads are done
    load_tile_async(ks, ld, rows + key_dim + kh * Dk, conv_dim, C, int(Dk), n, int(Dk));  // K into W's (then A's) space
    for (int e = tid; e < C * SW; e += nt) Vn[(e / SW) * SWP + e % SW] *= ek[e / SW];
    cp_async_wait_all();
    __syncthreads();
    // S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn): (Dk / 16) x 4 tiles over the 8 warps; a
    // warp's tiles (warp + 8 i) share their columns, so one Vn fragment serves them all
    const float eC = float(exp(gam[n - 1]));
    const int tiles = int(Dk / 16) * 4, na = warp < tiles ? (tiles - warp + 7) / 8 : 0;
    const int cc = (warp & 3) * 8;
    if (na > 0) {
      float d[4][4] = {};
      mma_3xtf32_shared_b<4>(
          d, na, C, [&](int q, int r, int k) { return ks[k * ld + ((warp + 8 * q) >> 2) * 16 + r]; },
          [&](int k, int col) { return Vn[k * SWP + cc + col]; });
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q >= na) break;
        const int r0 = ((warp + 8 * q) >> 2) * 16;
        float* s0 = S + (r0 + gq) * SWP + cc + 2 * tq;
        float* s1 = S + (r0 + gq + 8) * SWP + cc + 2 * tq;
        s0[0] = s0[0] * eC + d[q][0];
        s0[1] = s0[1] * eC + d[q][1];
        s1[0] = s1[0] * eC + d[q][2];
        s1[1] = s1[1] * eC + d[q][3];
      }
    }
  }
  end_pass(S, SWP, sc, ch, s, ce, j, Dk, Dv, c0_col, sw, tid, nt);
}

// GdnPath::Auto -> tensor cores or not (see kernels.h; the Wgmma path is dispatched before)
bool use_tensor_cores(GdnPath path, int64_t Dk, int64_t Dv) {
  const bool fits = Dk % 16 == 0 && Dv % 8 == 0;
  if (path == GdnPath::TensorCores && !fits)
    throw Error(Status::Internal, "internal_error", "gdn: the tensor-core kernels need Dk % 16 == 0 and Dv % 8 == 0");
  return path == GdnPath::TensorCores || (path == GdnPath::Auto && fits);
}

__global__ void gated_norm_k(const float* o, int64_t rows, int64_t Dv, const float* w, float eps, const float* z, int64_t ldz,
                             int64_t Hv, bf16* act, RowColScales zs) {
  const int64_t wid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= rows) return;
  const int64_t t = wid / Hv, j = wid - t * Hv;
  const float* x = o + wid * Dv;
  float ss = 0;
  for (int64_t i = lane; i < Dv; i += 32) ss += x[i] * x[i];
  const float inv = rsqrtf(warp_sum(ss) / float(Dv) + eps);
  for (int64_t i = lane; i < Dv; i += 32) {
    float zz = z[t * ldz + j * Dv + i];
    if (zs.rs) zz = fp8_scaled(zz, zs.rs[t], zs.cs[j * Dv + i]);
    act[wid * Dv + i] = __float2bfloat16(x[i] * inv * w[i] * silu_f(zz));
  }
}

// gated_norm_k at Dv = 128 (Clef), one lane's part: its four o, z and w as float4, all loaded
// before the warp sum (whose order differs from gated_norm_k's, within fp32 rounding of it); the
// four outputs as bf16 in 8 bytes (gated_norm.cuh, which the scan's epilogue calls too). Token t,
// value head j, the warp's row wid = t Hv + j.
__device__ __forceinline__ uint2 gated_norm128_lane(const float4* o, const float4* w, float eps, const float* z, int64_t ldz, const RowColScales& zs,
                                                    int64_t t, int64_t j, int64_t wid, int lane) {
  const float4 x = o[wid * 32 + lane], ww = w[lane];
  float4 zz = *reinterpret_cast<const float4*>(z + t * ldz + j * 128 + 4 * lane);
  if (zs.rs) zz = fp8_scaled4(zz, zs.rs[t], *reinterpret_cast<const float4*>(zs.cs + j * 128 + 4 * lane));
  return gated_norm128_values(x, ww, zz, eps);
}
__global__ void gated_norm128_k(const float4* o, int64_t rows, const float4* w, float eps, const float* z, int64_t ldz, int64_t Hv,
                                uint2* act, RowColScales zs) {
  pdl_wait();
  const int64_t wid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= rows) return;  // whole warps
  const int64_t t = wid / Hv, j = wid - t * Hv;
  act[wid * 32 + lane] = gated_norm128_lane(o, w, eps, z, ldz, zs, t, j, wid, lane);
}

// gated_norm128_k quantizing its output rows for the FP8 out_proj: the codes and row scales
// fp8_quantize_rows makes of gated_norm128_k's bf16 rows, without those rows' trip through
// memory. A token's Hv heads (a warp each, as there) over a cluster of Hv / 8 CTAs of 8 warps
// (compute capability 9.0 on); the row's amax is each CTA's block max, then the cluster's through
// distributed shared memory (max is exact in any order). `scale` may be zs.rs when both index the
// same rows: every CTA of row t reads zs.rs[t] before the cluster barrier, rank 0 writes scale[t]
// after it.
__global__ void gated_norm128_fp8_k(const float4* o, const float4* w, float eps, const float* z, int64_t ldz, int64_t Hv, RowColScales zs,
                                    uint8_t* q, int64_t kp, float* scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ float sh[32];
  __shared__ float cta_max;
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank()), ncl = int(cl.num_blocks()), lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x / ncl, j = int64_t(rank) * 8 + (threadIdx.x >> 5), wid = t * Hv + j;
  const uint2 v = gated_norm128_lane(o, w, eps, z, ldz, zs, t, j, wid, lane);  // gated_norm128_k's bf16 values
  float m = absmax4_bf16(v, 0.0f);  // from 0, as fp8_quantize_rows
  m = block_max(m, sh);
  if (threadIdx.x == 0) cta_max = m;
  cl.sync();  // every CTA's max published (and every zs.rs[t] read)
#pragma unroll 1
  for (int r = 0; r < ncl; ++r) m = fmaxf(m, *cl.map_shared_rank(&cta_max, r));
  cl.barrier_arrive();  // done with the others' shared memory: they may exit after the wait below
  const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f, inv = fp8_row_recip(m, s);
  if (rank == 0 && threadIdx.x == 0) scale[t] = s;
  uint8_t* row = q + t * kp;
  *reinterpret_cast<uint32_t*>(row + j * 128 + 4 * lane) = e4m3_encode4_bf16(v, s, inv);
  for (int64_t i = Hv * 128 + int64_t(rank) * blockDim.x + threadIdx.x; i < kp; i += int64_t(ncl) * blockDim.x) row[i] = 0;  // the GEMM's K padding
  cl.barrier_wait();
#else
  __trap();  // never launched below compute capability 9.0 (gated_norm_fp8_fits)
#endif
}

// gated_norm128_fp8_k's codes and scales with a token's heads in one CTA: Hv / kHpw warps, kHpw
// heads a warp (each head gated_norm128_lane's, its loads issued together), the row's amax one
// block max, no cluster. `scale` may be zs.rs when both index the same rows: every thread reads
// zs.rs[t] before block_max's barriers, thread 0 writes scale[t] after them.
template <int kHpw>
__global__ void __launch_bounds__(1024) gated_norm128_fp8_row_k(const float4* o, const float4* w, float eps, const float* z, int64_t ldz, int64_t Hv,
                                                                RowColScales zs, uint8_t* q, int64_t kp, float* scale) {
  pdl_wait();
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x, j0 = int64_t(threadIdx.x >> 5) * kHpw;
  uint2 v[kHpw];
  float m = 0.0f;  // from 0, as fp8_quantize_rows
#pragma unroll
  for (int h = 0; h < kHpw; ++h) {
    v[h] = gated_norm128_lane(o, w, eps, z, ldz, zs, t, j0 + h, t * Hv + j0 + h, lane);
    m = absmax4_bf16(v[h], m);
  }
  const Fp8RowScale rs = fp8_row_scale(block_max(m, sh));
  if (threadIdx.x == 0) scale[t] = rs.s;
  uint8_t* row = q + t * kp;
#pragma unroll
  for (int h = 0; h < kHpw; ++h) *reinterpret_cast<uint32_t*>(row + (j0 + h) * 128 + 4 * lane) = e4m3_encode4_bf16(v[h], rs.s, rs.inv);
  for (int64_t i = Hv * 128 + threadIdx.x; i < kp; i += blockDim.x) row[i] = 0;  // the GEMM's K padding
}

}  // namespace

GdnPath gdn_path(GdnPath path, int64_t Dk, int64_t Dv) {
  if (path != GdnPath::Auto) return path;
  if (gdn_wgmma_default() && gdn_wgmma_available(Dk, Dv)) return GdnPath::Wgmma;
  return Dk % 16 == 0 && Dv % 8 == 0 ? GdnPath::TensorCores : GdnPath::Simt;
}

void conv_silu(const float* x, int64_t ldx, const int32_t* seq_start, int64_t L, int64_t Cn, const float* w, int64_t K, float* y,
               cudaStream_t s) {
  conv_silu_rows(x, ldx, 0, seq_start, 0, L, Cn, w, K, y, s);
}

// A block's conv inputs: history rows come with their sequence map; x holds the block's rows.
static void check_conv_block(const ConvHistory& hist, int64_t x_row0, int64_t t0, const char* op) {
  if (hist.rows && !hist.seq_of) throw Error(Status::Internal, "internal_error", std::string(op) + ": history rows without seq_of");
  if (x_row0 > t0) throw Error(Status::Internal, "internal_error", std::string(op) + ": x starts after the block");
}

void conv_silu_rows(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, int64_t L, int64_t Cn, const float* w,
                    int64_t K, float* y, cudaStream_t s, const ConvHistory& hist) {
  if (L == 0) return;
  check_conv_block(hist, x_row0, t0, "gdn conv_silu");
  if (K == 4 && Cn % 4 == 0 && ldx % 4 == 0 && L * Cn / 4 < (int64_t(1) << 31)) {
    const int64_t n = L * Cn / 4;
    conv_silu4_k<<<grid_for(n), 256, 0, s>>>(x, ldx, x_row0, seq_start, t0, uint32_t(n), uint32_t(Cn / 4), w, y, hist);
  } else {
    conv_silu_k<<<grid_for(L * Cn), 256, 0, s>>>(x, ldx, x_row0, seq_start, t0, L, Cn, w, int(K), y, hist);
  }
  check_launch("gdn conv_silu");
}

void gdn_prep(float* mixed, int64_t conv_dim, int64_t L, int64_t Hk, int64_t Dk, const float* b, const float* a, int64_t ldba, int64_t Hv, const float* negA,
              const float* dt_bias, float* g, float* beta, cudaStream_t s) {
  if (L == 0) return;
  const int64_t warps = L * 2 * Hk;
  qk_norm_k<<<unsigned((warps * 32 + 255) / 256), 256, 0, s>>>(mixed, L, Hk, Dk, conv_dim, 1.0f / sqrtf(float(Dk)));
  check_launch("gdn q/k norm");
  gates_k<<<grid_for(L * Hv), 256, 0, s>>>(b, a, ldba, L, Hv, negA, dt_bias, g, beta);
  check_launch("gdn gates");
}

bool gdn_conv_prep_fuses(int64_t K, int64_t Dk, int64_t conv_dim, int64_t ldx, int64_t L, int64_t Hv) {
  return K == 4 && Dk == 128 && conv_dim % 128 == 0 && ldx % 4 == 0 && (L + kConvTokens) * (conv_dim / 4 + Hv) < (int64_t(1) << 31);
}

void gdn_conv_prep(const float* x, int64_t ldx, int64_t x_row0, const int32_t* seq_start, int64_t t0, int64_t L, const float* conv_w, int64_t K,
                   int64_t conv_dim, int64_t Hk, int64_t Dk, const float* b, const float* a, int64_t ldba, int64_t Hv, const float* negA,
                   const float* dt_bias, float* mixed, float* g, float* beta, cudaStream_t s, const ConvHistory& hist, const RowColScales& xs,
                   int min_blocks, bf16* mixed16) {
  if (L == 0) return;
  const int64_t n = (L + kConvTokens - 1) / kConvTokens * (conv_dim / 4), total = n + L * Hv;
  if ((mixed16 != nullptr) == (mixed != nullptr))
    throw Error(Status::Internal, "internal_error", "gdn conv_prep: exactly one of mixed (fp32) and mixed16 (bf16) is written");
  if (!gdn_conv_prep_fuses(K, Dk, conv_dim, ldx, L, Hv)) {
    if (mixed16) throw Error(Status::Internal, "internal_error", "gdn conv_prep: bf16 rows (mixed16) need the one-kernel form");
    if (xs.rs) throw Error(Status::Internal, "internal_error", "gdn conv_prep: FP8 scales on the reader need the one-kernel form");
    conv_silu_rows(x, ldx, x_row0, seq_start, t0, L, conv_dim, conv_w, K, mixed, s, hist);
    gdn_prep(mixed, conv_dim, L, Hk, Dk, b, a, ldba, Hv, negA, dt_bias, g, beta, s);
    return;
  }
  check_conv_block(hist, x_row0, t0, "gdn conv_prep");
  static const int64_t capped = env_count("CLEFRT_LAB_CONV_PREP_MIN_BLOCKS", 3, 0, 3);
  const bool from_env = min_blocks < 0;
  if (from_env) min_blocks = int(capped);
  if (min_blocks != 0 && min_blocks != 3)
    throw Error(Status::BadRequest, "usage", std::string(from_env ? "CLEFRT_LAB_CONV_PREP_MIN_BLOCKS" : "gdn_conv_prep's min_blocks") + " is " +
                                                 std::to_string(min_blocks) + ": 0 (uncapped) or 3");
  auto launch = [&](auto kernel, auto* y) {
    launch_after("gdn conv_prep", kernel, grid_for(total), kConvPrepThreads, 0, s, x, ldx, x_row0, seq_start, t0, uint32_t(L), uint32_t(n),
                 uint32_t(conv_dim / 4), uint32_t(Hk * Dk / 4), 1.0f / sqrtf(float(Dk)), conv_w, y, hist, xs, b, a, ldba, uint32_t(Hv),
                 uint32_t(total), negA, dt_bias, g, beta);
  };
  if (mixed16) {
    if (min_blocks == 3) launch(gdn_conv_prep_capped_k<bf16>, mixed16);
    else launch(gdn_conv_prep_k<bf16>, mixed16);
  } else {
    if (min_blocks == 3) launch(gdn_conv_prep_capped_k<float>, mixed);
    else launch(gdn_conv_prep_k<float>, mixed);
  }
}

namespace {
void set_smem_limits() {
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(gdn_chunk_prep_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "gdn_chunk_prep smem");
    check(cudaFuncSetAttribute(gdn_chunk_prep_tc_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "gdn_chunk_prep smem");
    check(cudaFuncSetAttribute(gdn_chunk_scan_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "gdn_chunk_scan smem");
    check(cudaFuncSetAttribute(gdn_chunk_scan_tc_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "gdn_chunk_scan smem");
    attr = true;
  }
}
}  // namespace

// A pass's chunk range, and the state buffers it needs when it does not cover everything.
static void check_pass(const GdnChunks& ch, const GdnScratch& sc, const char* op) {
  const int64_t c1 = sc.c1 < 0 ? ch.n_chunks : sc.c1;
  if (sc.c0 < 0 || c1 < sc.c0 || c1 > ch.n_chunks)
    throw Error(Status::Internal, "internal_error", std::string(op) + ": chunk pass [" + std::to_string(sc.c0) + ", " +
                                                        std::to_string(c1) + ") outside [0, " + std::to_string(ch.n_chunks) + ")");
  if ((sc.c0 > 0 && !sc.state_in) || (c1 < ch.n_chunks && !sc.state_out))
    throw Error(Status::Internal, "internal_error", std::string(op) + ": a partial chunk pass needs state buffers");
}

void gdn_chunk_prep(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                    const GdnChunks& ch, GdnScratch sc, cudaStream_t s, GdnPath path) {
  if (ch.n_chunks == 0) return;
  set_smem_limits();
  const int64_t conv_dim = 2 * Hk * Dk + Hv * Dv;
  check_pass(ch, sc, "gdn_chunk_prep");
  const int64_t c1 = sc.c1 < 0 ? ch.n_chunks : sc.c1;
  if (c1 == sc.c0) return;
  const dim3 grid(unsigned(c1 - sc.c0), unsigned(Hv));
  if (gdn_path(path, Dk, Dv) == GdnPath::Wgmma) {
    gdn_chunk_prep_wgmma(mixed, Hk, Hv, Dk, Dv, g, beta, ch, sc, s);
    return;
  }
  if (sc.mixed16) throw Error(Status::Internal, "internal_error", "gdn_chunk_prep: bf16 mixed rows (GdnScratch::mixed16) are the Wgmma prep's only");
  if (use_tensor_cores(path, Dk, Dv)) {
    gdn_chunk_prep_tc_k<<<grid, 256, PrepTcSmem(Dk, Dv).bytes(), s>>>(mixed, conv_dim, Hk, Hv, Dk, Dv, g, beta, ch, sc);
  } else {
    gdn_chunk_prep_k<<<grid, 256, PrepSmem::bytes(Dk, Dv), s>>>(mixed, conv_dim, Hk, Hv, Dk, Dv, g, beta, ch, sc);
  }
  check_launch("gdn_chunk_prep");
}

void gdn_chunk_scan(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const GdnChunks& ch,
                    GdnScratch sc, float* o, cudaStream_t s, GdnPath path) {
  if (ch.n_chunks == 0) return;
  set_smem_limits();
  const int64_t conv_dim = 2 * Hk * Dk + Hv * Dv;
  check_pass(ch, sc, "gdn_chunk_scan");
  if (gdn_path(path, Dk, Dv) == GdnPath::Wgmma) {
    gdn_chunk_scan_wgmma(mixed, Hk, Hv, Dk, Dv, g, ch, sc, o, s);
    return;
  }
  const dim3 grid(unsigned(ch.n_seqs), unsigned(Hv), unsigned((Dv + SW - 1) / SW));
  if (use_tensor_cores(path, Dk, Dv))
    gdn_chunk_scan_tc_k<<<grid, 256, ScanTcSmem::bytes(Dk), s>>>(mixed, conv_dim, Hk, Hv, Dk, Dv, g, ch, sc, o);
  else
    gdn_chunk_scan_k<<<grid, 256, ScanSmem::bytes(Dk), s>>>(mixed, conv_dim, Hk, Hv, Dk, Dv, g, ch, sc, o);
  check_launch("gdn_chunk_scan");
}

void gdn_chunked(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                 const GdnChunks& ch, GdnScratch sc, float* o, cudaStream_t s, GdnPath path) {
  gdn_chunk_prep(mixed, Hk, Hv, Dk, Dv, g, beta, ch, sc, s, path);
  gdn_chunk_scan(mixed, Hk, Hv, Dk, Dv, g, ch, sc, o, s, path);
}

void gated_norm(const float* o, int64_t L, int64_t Hv, int64_t Dv, const float* w, float eps, const float* z, int64_t ldz, bf16* act,
                cudaStream_t s, const RowColScales& zs) {
  if (L == 0) return;
  const int64_t rows = L * Hv;
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (Dv == 128 && ldz % 4 == 0 && aligned(o, 16) && aligned(w, 16) && aligned(z, 16) && aligned(act, 8) && (!zs.rs || aligned(zs.cs, 16)))
    return launch_after("gdn gated_norm", gated_norm128_k, unsigned((rows * 32 + 255) / 256), 256, 0, s, reinterpret_cast<const float4*>(o), rows,
                        reinterpret_cast<const float4*>(w), eps, z, ldz, Hv, reinterpret_cast<uint2*>(act), zs);
  else
    gated_norm_k<<<unsigned((rows * 32 + 255) / 256), 256, 0, s>>>(o, rows, Dv, w, eps, z, ldz, Hv, act, zs);
  check_launch("gdn gated_norm");
}

// The one-CTA form's heads a warp: `hpw` where given (0: the cluster form), else
// CLEFRT_LAB_GATED_NORM_FP8_HPW, else the default (4, or 2 or 1 where Hv does not split into
// fours); -1 where Hv does not split into that many. Why 4: at Clef 27B's 48 heads, 2 a warp is a
// 768-thread CTA, and at its 46 registers only one fits an SM (24 warps), where 4 a warp's
// 384-thread CTAs fit three (36 warps): 4 took 0.011 / 0.172 ms at 318 / 8,192 rows against
// 0.013 / 0.245 in the lab (bench/results/2026-12-06-h100-session43.md).
static int gated_norm_fp8_form(int64_t Hv, int hpw) {
  static const int64_t from_env = env_count("CLEFRT_LAB_GATED_NORM_FP8_HPW", -1, 0, 8);
  const int h = hpw >= 0 ? hpw : from_env >= 0 ? int(from_env) : Hv % 4 == 0 ? 4 : Hv % 2 == 0 ? 2 : 1;
  if (h == 0) return 0;
  return (h == 1 || h == 2 || h == 3 || h == 4 || h == 6 || h == 8) && Hv >= h && Hv % h == 0 && Hv / h <= 32 ? h : -1;
}

bool gated_norm_fp8_fits(int64_t Hv, int64_t Dv, int64_t kp, int hpw) {
  if (Dv != 128 || kp < Hv * Dv || kp % 4 != 0) return false;
  const int form = gated_norm_fp8_form(Hv, hpw);
  if (form > 0) return true;
  static const bool runs = cluster_kernel_max_threads((const void*)gated_norm128_fp8_k) >= 256;  // its CTA: 8 warps
  return form == 0 && runs && Hv % 8 == 0 && Hv / 8 >= 1 && Hv / 8 <= 8;
}

bool gated_norm_fp8_aligned(const float* o, const float* w, const float* z, int64_t ldz, const RowColScales& zs, const uint8_t* q) {
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return ldz % 4 == 0 && aligned(o, 16) && aligned(w, 16) && aligned(z, 16) && aligned(q, 4) && (!zs.rs || aligned(zs.cs, 16));
}

void gated_norm_fp8(const float* o, int64_t L, int64_t Hv, int64_t Dv, const float* w, float eps, const float* z, int64_t ldz, const RowColScales& zs,
                    uint8_t* q, int64_t kp, float* scale, cudaStream_t s, int hpw) {
  if (!gated_norm_fp8_fits(Hv, Dv, kp, hpw) || !gated_norm_fp8_aligned(o, w, z, ldz, zs, q))
    throw Error(Status::Internal, "internal_error", "gdn gated_norm_fp8: Hv " + std::to_string(Hv) + ", Dv " + std::to_string(Dv) + ", kp " +
                                                       std::to_string(kp) + ", heads a warp " + std::to_string(hpw) +
                                                       " (CLEFRT_LAB_GATED_NORM_FP8_HPW where -1) or the operands' alignment do not fit its kernel");
  if (L == 0) return;
  const int form = gated_norm_fp8_form(Hv, hpw);
  const float4 *o4 = reinterpret_cast<const float4*>(o), *w4 = reinterpret_cast<const float4*>(w);
  auto row_form = [&](auto kernel) {
    launch_after("gdn gated_norm_fp8", kernel, unsigned(L), unsigned(Hv / form * 32), 0, s, o4, w4, eps, z, ldz, Hv, zs, q, kp, scale);
  };
  switch (form) {
    case 0: {
      const int ncl = int(Hv / 8);
      check(launch_on_clusters(gated_norm128_fp8_k, unsigned(L * ncl), 256, unsigned(ncl), s, o4, w4, eps, z, ldz, Hv, zs, q, kp, scale),
            "gdn gated_norm_fp8");
      break;
    }
    case 1: row_form(gated_norm128_fp8_row_k<1>); break;
    case 2: row_form(gated_norm128_fp8_row_k<2>); break;
    case 3: row_form(gated_norm128_fp8_row_k<3>); break;
    case 4: row_form(gated_norm128_fp8_row_k<4>); break;
    case 6: row_form(gated_norm128_fp8_row_k<6>); break;
    default: row_form(gated_norm128_fp8_row_k<8>); break;
  }
  check_launch("gdn gated_norm_fp8");
}

}  // namespace clefrt::cuda

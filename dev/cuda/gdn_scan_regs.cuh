// A GDN chunk scan with the state in registers (a dev/cuda lab variant, gdn_scan.cu: slower than the
// product's shared-memory kernel, see bench/results/2026-12-04-h200-session19-6c96faa.md).
//
// Per chunk (gdn_tiles.cuh's C = 64 tokens) and value head, with the fp32 state S [Dk, Dv]:
//   Vn = U - W S;  O = e^gamma Q S + A Vn;  S = e^gamma_C S + K^T (e^(gamma_C - gamma) Vn)
// written transposed, S^T [Dv, Dk] = the accumulators of mma.sync m16n8k8 tiles: a warp owns 16
// state rows (value dims) and every Dk column of them, 4 Dk / 8 floats a thread, for the whole
// sequence. Each product then has S^T or Vn^T (both accumulators) as its A operand, read from
// the registers they live in: an m16n8k8 accumulator tile holds columns 2t and 2t + 1 where the
// A operand wants t and t + 4, so the k index inside each 8-wide step is permuted (k = t <->
// column 2t, k = t + 4 <-> 2t + 1) and the B operand is read with the same permutation (a float2
// where B's rows are contiguous). B operands (W, Q, A, K tiles) come straight from global memory
// into fragments: no shared memory, no block barrier; the warps of a CTA (the same head's other
// state rows) read the same tiles through L1, and the next chunk's tiles are prefetched into L2
// while this one computes. Products in 3xTF32 (gdn_tiles.cuh: fp32-level) or plain TF32.
// Measured: 0.65x the product at 1 x 8,192 with the same outputs bit for bit across 1 / 2 / 4
// warps a CTA, and plain TF32 no faster: each k-step waits on its global loads (latency-bound with
// one warp per scheduler); a next version would stage the tiles through shared memory a chunk
// ahead (cp.async / TMA) and read them with ldmatrix.
#pragma once
#include <cstdint>

#include "cuda/ops/gdn_tiles.cuh"

namespace clefrt::cuda::gdn {

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// d += a b with the tf32 parts of a and b given (X3: hi/lo splits, the small products first)
template <bool X3>
__device__ __forceinline__ void mma_x(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&bh)[2],
                                      const uint32_t (&bl)[2]) {
  if constexpr (X3) {
    mma_tf32(d, al, bh);
    mma_tf32(d, ah, bl);
  }
  mma_tf32(d, ah, bh);
}

template <bool X3>
__device__ __forceinline__ void split_a(float x0, float x1, float x2, float x3, uint32_t (&h)[4], uint32_t (&l)[4]) {
  split_tf32(x0, h[0], l[0]);
  split_tf32(x1, h[1], l[1]);
  split_tf32(x2, h[2], l[2]);
  split_tf32(x3, h[3], l[3]);
}

template <bool X3>
__device__ __forceinline__ void split_b(float x0, float x1, uint32_t (&h)[2], uint32_t (&l)[2]) {
  split_tf32(x0, h[0], l[0]);
  split_tf32(x1, h[1], l[1]);
}

// T^T's columns (tokens 8q + 2t, + 1 of tile q) times a per-token factor that lane l holds for its
// tokens 2l (x0) and 2l + 1 (x1): lane 4q + t holds tile q's
__device__ __forceinline__ void scale_token_columns(float (&T)[8][4], float x0, float x1) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float e0 = __shfl_sync(0xffffffffu, x0, 4 * q + t), e1 = __shfl_sync(0xffffffffu, x1, 4 * q + t);
    T[q][0] *= e0;
    T[q][1] *= e1;
    T[q][2] *= e0;
    T[q][3] *= e1;
  }
}

// The state rows of this thread: S^T[dv][dk] for dk = 8 p + 2 t + (i & 1), dv = dv0 + g + 8 (i >> 1),
// at their place in a state laid out as state_in ([Hv, Dk, Dv]): f(p, i, offset) for each one
// inside Dv
template <int NT, class F>
__device__ __forceinline__ void rs_each(int64_t j, int64_t Dv, int64_t dv0, bool ok0, bool ok1, F f) {
  constexpr int Dk = 8 * NT;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int p = 0; p < NT; ++p)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if ((i >> 1) ? ok1 : ok0) f(p, i, (j * Dk + 8 * p + 2 * t + (i & 1)) * Dv + dv0 + g + 8 * (i >> 1));
}
template <int NT>
__device__ __forceinline__ void rs_load(float (&S)[NT][4], const float* from, int64_t j, int64_t Dv, int64_t dv0, bool ok0, bool ok1) {
  for (int p = 0; p < NT; ++p)
    for (int i = 0; i < 4; ++i) S[p][i] = 0.0f;
  if (from) rs_each<NT>(j, Dv, dv0, ok0, ok1, [&](int p, int i, int64_t at) { S[p][i] = from[at]; });
}
template <int NT>
__device__ __forceinline__ void rs_save(const float (&S)[NT][4], float* to, int64_t j, int64_t Dv, int64_t dv0, bool ok0, bool ok1) {
  rs_each<NT>(j, Dv, dv0, ok0, ok1, [&](int p, int i, int64_t at) { to[at] = S[p][i]; });
}

// One warp per (sequence, value head, 16 value dims); NW warps a CTA (grid: sequences, Hv,
// ceil(Dv / (16 NW))). NT = Dk / 8.
template <int NT, int NW, bool X3>
__global__ void __launch_bounds__(32 * NW) gdn_chunk_scan_rs_k(const float* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, int64_t Dv,
                                                              const float* g, GdnChunks ch, GdnScratch sc, float* o) {
  constexpr int Dk = 8 * NT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int64_t s = blockIdx.x, j = blockIdx.y;
  const int64_t dv0 = (int64_t(blockIdx.z) * NW + warp) * 16;  // this warp's state rows
  if (dv0 >= Dv) return;                                        // (no barrier anywhere: a warp may leave)
  const bool ok0 = dv0 + gq < Dv, ok1 = dv0 + gq + 8 < Dv;
  const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk, value_dim = Hv * Dv;
  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;

  float S[NT][4];
  rs_load<NT>(S, ch.seq_chunk[s] < cb ? sc.state_in : sc.seq_state_in && sc.seq_state_in[s] ? sc.seq_state_in[s] + sc.layer_off : nullptr, j,
              Dv, dv0, ok0, ok1);
  for (int64_t c = cb; c < ce; ++c) {
    if (sc.snap_chunk && sc.snap_chunk[s] == c) rs_save<NT>(S, sc.seq_state_out[s] + sc.layer_off, j, Dv, dv0, ok0, ok1);
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* w = sc.w + ((c - sc.c0) * Hv + j) * C * Dk;
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv;
    const float* aqk = sc.aqk + ((c - sc.c0) * Hv + j) * C * C;
    const float* qrows = mixed + t0 * conv_dim + kh * Dk;
    const float* krows = qrows + key_dim;
    if (c + 1 < ce) {  // the next chunk's tiles into L2, shared out over the CTA's threads
      const int64_t t1 = ch.chunk_start[c + 1];
      const float* w1 = w + Hv * C * Dk;
      const float* u1 = u + Hv * C * Dv;
      const float* a1 = aqk + Hv * C * C;
      const float* q1 = mixed + t1 * conv_dim + kh * Dk;
      const int tid = threadIdx.x, nt = 32 * NW, n1 = ch.chunk_len[c + 1];
      for (int e = tid; e < C * Dk / 32; e += nt) prefetch_l2(w1 + 32 * e);  // 128-byte lines
      for (int e = tid; e < C * C / 32; e += nt) prefetch_l2(a1 + 32 * e);
      for (int e = tid; e < n1; e += nt) {  // rows of the batch only
        prefetch_l2(u1 + e * Dv + int64_t(blockIdx.z) * NW * 16);
        prefetch_l2(g + (t1 + e) * Hv + j);
        for (int x = 0; x < Dk; x += 32) {
          prefetch_l2(q1 + e * conv_dim + x);
          prefetch_l2(q1 + key_dim + e * conv_dim + x);
        }
      }
    }
    // the in-chunk cumulative log decay, in double (as chunk_gamma): lane l holds tokens 2l, 2l + 1
    double gam0, gam1;
    chunk_gamma_pair(g, t0, n, Hv, j, lane, gam0, gam1);
    const double x0 = __shfl_sync(0xffffffffu, gam0, (n - 1) >> 1), x1 = __shfl_sync(0xffffffffu, gam1, (n - 1) >> 1);
    const double gN = ((n - 1) & 1) ? x1 : x0;
    const float eg0 = float(exp(gam0)), eg1 = float(exp(gam1));
    const float ek0 = 2 * lane < n ? float(exp(gN - gam0)) : 0.0f, ek1 = 2 * lane + 1 < n ? float(exp(gN - gam1)) : 0.0f;
    const float eC = float(exp(gN));

    // 1. Vn^T = U^T - S^T W^T and O^T = S^T Q^T (then e^gamma, + Vn^T A^T): both take S^T as the A
    // operand, split once per k-step; 8 token tiles each, NT k-steps over Dk
    float V[8][4], O[8][4] = {};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int64_t r = 8 * q + 2 * tq;
      V[q][0] = ok0 ? u[r * Dv + dv0 + gq] : 0.0f;
      V[q][1] = ok0 ? u[(r + 1) * Dv + dv0 + gq] : 0.0f;
      V[q][2] = ok1 ? u[r * Dv + dv0 + gq + 8] : 0.0f;
      V[q][3] = ok1 ? u[(r + 1) * Dv + dv0 + gq + 8] : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < NT; ++p) {
      uint32_t ah[4], al[4];
      split_a<X3>(S[p][0], S[p][2], S[p][1], S[p][3], ah, al);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int r = 8 * q + gq;
        const float2 bw = *reinterpret_cast<const float2*>(w + r * Dk + 8 * p + 2 * tq);
        const float2 bq = r < n ? *reinterpret_cast<const float2*>(qrows + r * conv_dim + 8 * p + 2 * tq) : make_float2(0.0f, 0.0f);
        uint32_t bh[2], bl[2];
        split_b<X3>(-bw.x, -bw.y, bh, bl);  // U - S W: W negated (exact)
        mma_x<X3>(V[q], ah, al, bh, bl);
        split_b<X3>(bq.x, bq.y, bh, bl);
        mma_x<X3>(O[q], ah, al, bh, bl);
      }
    }
    scale_token_columns(O, eg0, eg1);
    // 2. O^T += Vn^T A^T: k-steps over the tokens 8r.. of Vn; A is lower triangular: tiles q >= r
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      uint32_t ah[4], al[4];
      split_a<X3>(V[r][0], V[r][2], V[r][1], V[r][3], ah, al);
#pragma unroll
      for (int q = r; q < 8; ++q) {
        const float2 b = *reinterpret_cast<const float2*>(aqk + (8 * q + gq) * C + 8 * r + 2 * tq);
        uint32_t bh[2], bl[2];
        split_b<X3>(b.x, b.y, bh, bl);
        mma_x<X3>(O[q], ah, al, bh, bl);
      }
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int r = 8 * q + 2 * tq;
      float* out = o + (t0 + r) * value_dim + j * Dv + dv0 + gq;
      if (ok0 && r < n) out[0] = O[q][0];
      if (ok0 && r + 1 < n) out[value_dim] = O[q][1];
      if (ok1 && r < n) out[8] = O[q][2];
      if (ok1 && r + 1 < n) out[value_dim + 8] = O[q][3];
    }
    // 3. S^T = e^gamma_C S^T + (Vn^T e^(gamma_C - gamma)) K: NT dk tiles, 8 k-steps over the tokens
    scale_token_columns(V, ek0, ek1);
#pragma unroll
    for (int p = 0; p < NT; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) S[p][i] *= eC;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      uint32_t ah[4], al[4];
      split_a<X3>(V[r][0], V[r][2], V[r][1], V[r][3], ah, al);
      const int r0 = 8 * r + 2 * tq;
      const float* k0 = krows + r0 * conv_dim + gq;
      const float* k1 = k0 + conv_dim;
      const bool in0 = r0 < n, in1 = r0 + 1 < n;
#pragma unroll
      for (int p = 0; p < NT; ++p) {
        uint32_t bh[2], bl[2];
        split_b<X3>(in0 ? k0[8 * p] : 0.0f, in1 ? k1[8 * p] : 0.0f, bh, bl);
        mma_x<X3>(S[p], ah, al, bh, bl);
      }
    }
  }
  // the pass's end: to the next pass when the sequence goes on, else to its prefix state when it
  // leaves one after its last chunk
  if (ch.seq_chunk[s + 1] > ce) rs_save<NT>(S, sc.state_out, j, Dv, dv0, ok0, ok1);
  else if (sc.snap_chunk && sc.snap_chunk[s] == ce) rs_save<NT>(S, sc.seq_state_out[s] + sc.layer_off, j, Dv, dv0, ok0, ok1);
}

}  // namespace clefrt::cuda::gdn

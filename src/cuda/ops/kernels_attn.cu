// Gated full attention on the GPU (spec/model.md 1.2): q/k (1+w) RMSNorm + partial RoPE (mRoPE
// rows for sequences with images), then a flash-style varlen kernel on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulate, online softmax in fp32) that never holds an L x L matrix:
// causal with the sigmoid output gate fused (the backbone), or bidirectional without a gate (the
// vision tower's frames, spec/model.md 2).
#include <cmath>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/pdl.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/ops/reduce.cuh"

namespace clefrt::cuda {

namespace {

constexpr int kMaxD = 256;

// One warp per (token, head) of tokens [t0, t0 + rows); q heads first (rows of 2D in qkv: q then
// gate), then k heads.
__global__ void attn_prep_k(const bf16* qkv, int64_t ldqkv, int64_t L, int64_t t0, int64_t rows, int64_t Hq, int64_t Hkv, int D, int R,
                            const float* inv_freq, const int32_t* seq_start, MropePositions mp, const float* q_norm, const float* k_norm,
                            float eps, bf16* q, bf16* k, const int32_t* kv_row, bf16* v_out, bf16* gate_out) {
  pdl_wait();
  __shared__ float buf[8][kMaxD];
  const int lane = threadIdx.x & 31, wl = threadIdx.x >> 5;
  const int64_t wid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (wid >= rows * (Hq + Hkv)) return;
  const int64_t t = t0 + wid / (Hq + Hkv), hh = wid % (Hq + Hkv);
  const bool is_q = hh < Hq;
  const bf16* src = qkv + t * ldqkv + (is_q ? hh * 2 * D : Hq * 2 * D + (hh - Hq) * D);
  if (is_q && gate_out) {  // the gate head into [L, Hq, D]
    bf16* gd = gate_out + (t * Hq + hh) * D;
    for (int i = lane; i < D; i += 32) gd[i] = src[D + i];
  }
  const float* w = is_q ? q_norm : k_norm;
  const int64_t kr = kv_row ? kv_row[t] : t;
  bf16* dst = is_q ? q + (t * Hq + hh) * D : k + (kr * Hkv + (hh - Hq)) * D;
  if (!is_q && v_out) {  // the value head into the key rows' layout
    const bf16* vs = qkv + t * ldqkv + Hq * 2 * D + Hkv * D + (hh - Hq) * D;
    bf16* vd = v_out + (kr * Hkv + (hh - Hq)) * D;
    for (int i = lane; i < D; i += 32) vd[i] = vs[i];
  }
  float* x = buf[wl];
  float ss = 0;
  for (int i = lane; i < D; i += 32) {
    const float v = __bfloat162float(src[i]);
    x[i] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
  for (int i = lane; i < D; i += 32) x[i] = x[i] * inv * (1.0f + w[i]);
  __syncwarp();
  const float pos = float(t - seq_start[t]);
  const int half = R / 2;
  for (int i = lane; i < D; i += 32) {
    float v = x[i];
    if (i < R) {
      const int f = i < half ? i : i - half;
      // mRoPE, interleaved as the CPU twin: frequency f reads row h when f % 3 == 1 and
      // f < sec_h, row w when f % 3 == 2 and f < sec_w, else row t
      const float p = !mp.pos ? pos
                      : (f % 3 == 1 && f < mp.sec_h) ? float(mp.pos[L + t])
                      : (f % 3 == 2 && f < mp.sec_w) ? float(mp.pos[2 * L + t])
                                                      : float(mp.pos[t]);
      const float ang = inv_freq[f] * p;
      const float cs = cosf(ang), sn = sinf(ang);
      v = i < half ? x[i] * cs - x[i + half] * sn : x[i] * cs + x[i - half] * sn;
    }
    dst[i] = __float2bfloat16(v);
  }
}

// Keys per step; the query tile is 16 rows per warp: 4 warps (64 queries) for the causal
// kernel, 8 (128) for the bidirectional one (clefrt_bench_vision_attn: the same bits, 7-10%
// faster at the tower's shapes, bench/results).
constexpr int BK = 64;
constexpr int kCausalWarps = 4, kFullWarps = 8;
constexpr int query_tile(bool causal) { return 16 * (causal ? kCausalWarps : kFullWarps); }

template <int D, int BQ>
struct FlashSmem {
  // Q, K and V tiles row-major (bf16), rows padded by 8 elements: a row is an odd multiple of
  // 16 bytes, so the 8 row addresses of an ldmatrix hit distinct bank groups
  static constexpr int LD = D + 8;
  static constexpr size_t bytes = sizeof(bf16) * size_t(BQ + 2 * BK) * LD;
};

// rows x D bf16 from src (row stride lds elements) into a tile (row stride D + 8); rows >= valid
// (which may lie outside [0, rows]) are zero-filled.
template <int D>
__device__ __forceinline__ void load_rows_async(bf16* dst, const bf16* src, int64_t lds, int rows, int64_t valid) {
  const int v = int(valid < 0 ? 0 : valid > rows ? rows : valid);
  load_tile_async(dst, D + 8, src, lds, rows, D, v, D);
}

// grid (tiles, Hq), query_tile(Causal) * 2 threads; each warp owns 16 query rows of the tile. Per key block: V's
// copy is issued before S = Q K^T and the softmax, the next K's before O += P V, so the copies
// run under the tensor-core work (cp.async); fragments come from shared memory by ldmatrix
// (V through its transposing form, so V is stored as it arrives).
// Causal: keys up to the query's row (the backbone); else every key of [seq0, end) (the tower's
// frames). gate null: no output gate. The output row is `ldo` apart, head h at h * out_hs, only
// its first dout <= D dims written (D may be the head dim zero-padded to a multiple of 16). out
// may be q itself (exactly, not overlapping k or v): a tile's queries are in shared memory
// before any of its rows is written, and no other block reads them.
template <int D, bool Causal>
__global__ void __launch_bounds__(query_tile(Causal) * 2) flash_k(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, const bf16* gate,
                                               int64_t ldgate, int64_t gate_hs, int Hq, int Hkv, AttnTiles tiles, bf16* out,
                                               int64_t ldo, int64_t out_hs, int dout, float scale_log2) {
  constexpr int BQ = query_tile(Causal);
  using S = FlashSmem<D, BQ>;
  constexpr int LD = S::LD;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BQ * LD;
  bf16* Vs = Ks + BK * LD;

  const int tile = blockIdx.x, h = blockIdx.y, kvh = h / (Hq / Hkv);
  // key rows: seq0, end and the queries' rows + dl (dl = 0 unless keys live in their own rows)
  const int64_t q0 = tiles.q0[tile], seq0 = tiles.seq0[tile], end = tiles.end[tile], dl = tiles.delta ? tiles.delta[tile] : 0;
  const int64_t qend = end - dl;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t q_last = (q0 + BQ < qend ? q0 + BQ : qend) - 1;
  const int64_t k_last = Causal ? q_last + dl : end - 1;
  const bf16* kbase = k + int64_t(kvh) * D;  // row t at kbase + t * Hkv * D
  const bf16* vbase = v + int64_t(kvh) * D;  // row t at vbase + t * ldv

  load_rows_async<D>(Qs, q + (q0 * Hq + h) * D, int64_t(Hq) * D, BQ, qend - q0);
  load_rows_async<D>(Ks, kbase + seq0 * Hkv * D, int64_t(Hkv) * D, BK, end - seq0);
  cp_async_commit();

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int64_t qi0 = q0 + warp * 16 + g, qi1 = qi0 + 8;
  // ldmatrix row addresses: lane l serves row l % 8 of matrix l / 8
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;  // A (Q) and V^T: rows +8 for odd matrices
  const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;  // K: matrices 2, 3 are the next 8 keys

  for (int64_t kb = seq0; kb <= k_last; kb += BK) {
    cp_async_wait<0>();
    __syncthreads();  // K (and Q) are in; every warp is done with the previous V
    load_rows_async<D>(Vs, vbase + kb * ldv, ldv, BK, end - kb);
    cp_async_commit();

    float s[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, Qs + (warp * 16 + lr) * LD + ks * 16 + lc);
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt += 2) {
        uint32_t b[4];  // b[0], b[1]: keys nt * 8 + 0..7; b[2], b[3]: the next 8
        ldmatrix_x4(b, Ks + (nt * 8 + kr) * LD + ks * 16 + kc);
        mma_bf16(s[nt], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_bf16(s[nt + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    // scale, causal + length mask, online softmax (rows qi0 and qi1 of this thread); blocks wholly
    // before this warp's first row and inside the sequence need no mask
    const bool masked = (Causal && kb + BK - 1 > q0 + dl + warp * 16) || kb + BK > end;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kj = kb + nt * 8 + 2 * tq + (e & 1);
        const int64_t qi = e < 2 ? qi0 : qi1;
        const bool ok = !masked || ((!Causal || kj <= qi + dl) && kj < end);
        s[nt][e] = ok ? s[nt][e] * scale_log2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // a row with no visible key yet (only padding rows) keeps m = -inf: use 0 as its base
    const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0, rs1 = 0;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - b0);
      s[nt][1] = exp2f(s[nt][1] - b0);
      s[nt][2] = exp2f(s[nt][2] - b1);
      s[nt][3] = exp2f(s[nt][3] - b1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + rs0;
    l1 = l1 * c1 + rs1;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= c0;
      o[dn][1] *= c0;
      o[dn][2] *= c1;
      o[dn][3] *= c1;
    }
    cp_async_wait<0>();
    __syncthreads();  // V is in; every warp is done with K
    if (kb + BK <= k_last) {
      load_rows_async<D>(Ks, kbase + (kb + BK) * Hkv * D, int64_t(Hkv) * D, BK, end - (kb + BK));
      cp_async_commit();
    }
    // O += P V
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 8; dn += 2) {
        uint32_t b[4];  // b[0], b[1]: dims dn * 8 + 0..7; b[2], b[3]: the next 8
        ldmatrix_x4_trans(b, Vs + (kk * 16 + lr) * LD + dn * 8 + lc);
        mma_bf16(o[dn], a0, a1, a2, a3, b[0], b[1]);
        mma_bf16(o[dn + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0 ? 1.0f / l0 : 0.0f, inv1 = l1 > 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int d = dn * 8 + 2 * tq;
    if (d >= dout) continue;  // padding dims (dout is even: pairs stay whole)
    if (qi0 < qend) {
      float g0 = 1.0f, g1 = 1.0f;
      if (gate) {
        const bf16* gr = gate + qi0 * ldgate + int64_t(h) * gate_hs + d;
        g0 = sigmoid_f(__bfloat162float(gr[0]));
        g1 = sigmoid_f(__bfloat162float(gr[1]));
      }
      *reinterpret_cast<__nv_bfloat162*>(out + qi0 * ldo + int64_t(h) * out_hs + d) = __floats2bfloat162_rn(o[dn][0] * inv0 * g0, o[dn][1] * inv0 * g1);
    }
    if (qi1 < qend) {
      float g0 = 1.0f, g1 = 1.0f;
      if (gate) {
        const bf16* gr = gate + qi1 * ldgate + int64_t(h) * gate_hs + d;
        g0 = sigmoid_f(__bfloat162float(gr[0]));
        g1 = sigmoid_f(__bfloat162float(gr[1]));
      }
      *reinterpret_cast<__nv_bfloat162*>(out + qi1 * ldo + int64_t(h) * out_hs + d) = __floats2bfloat162_rn(o[dn][2] * inv1 * g0, o[dn][3] * inv1 * g1);
    }
  }
}

template <int D, bool Causal>
void launch_flash(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, const bf16* gate, int64_t ldgate, int64_t gate_hs, int64_t Hq,
                  int64_t Hkv, const AttnTiles& tiles, bf16* out, int64_t ldo, int64_t out_hs, int64_t dout, cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(flash_k<D, Causal>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(FlashSmem<D, query_tile(Causal)>::bytes)),
          "flash_attention smem");
    attr = true;
  }
  const float scale_log2 = float(1.0 / std::sqrt(double(dout)) * 1.4426950408889634);
  flash_k<D, Causal><<<dim3(unsigned(tiles.n), unsigned(Hq)), query_tile(Causal) * 2, FlashSmem<D, query_tile(Causal)>::bytes, s>>>(
      q, k, v, ldv, gate, ldgate, gate_hs, int(Hq), int(Hkv), tiles, out, ldo, out_hs, int(dout), scale_log2);
  check_launch(Causal ? "flash_attention" : "flash_attention_full");
}

}  // namespace

void attn_prep(const bf16* qkv, int64_t ldqkv, int64_t L, int64_t t0, int64_t rows, int64_t Hq, int64_t Hkv, int64_t D, int64_t R,
               const float* inv_freq, const int32_t* seq_start, const MropePositions& mrope, const float* q_norm, const float* k_norm, float eps,
               bf16* q, bf16* k, cudaStream_t s, const int32_t* kv_row, bf16* v_out, bf16* gate_out) {
  if (t0 < 0 || rows < 0 || t0 + rows > L) throw Error(Status::Internal, "internal_error", "attn_prep: rows outside [0, L)");
  if (rows == 0) return;
  if (D > kMaxD) throw Error(Status::Internal, "unsupported", "attn_prep: head_dim " + std::to_string(D) + " > 256");
  const int64_t warps = rows * (Hq + Hkv);
  launch_after("attn_prep", attn_prep_k, unsigned((warps + 7) / 8), 256, 0, s, qkv, ldqkv, L, t0, rows, Hq, Hkv, int(D), int(R), inv_freq, seq_start,
               mrope, q_norm, k_norm, eps, q, k, kv_row, v_out, gate_out);
}

// D % 16 == 0 (mma k-steps and ldmatrix pairs of 8-column tiles)
bool flash_attention_supports(int64_t D) { return D == 32 || D == 48 || D == 64 || D == 96 || D == 128 || D == 256; }

namespace {
// Two dims a thread: the pairs of a (token, head) row stay together
__global__ void output_gate_k(bf16* out, int64_t L, int Hq, int D, const bf16* gate, int64_t ldgate, int64_t gate_hs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = int64_t(Hq) * D / 2;
  if (i >= L * per_row) return;
  const int64_t t = i / per_row, c = (i % per_row) * 2, h = c / D, d = c % D;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + t * Hq * D + c);
  const bf16* gr = gate + t * ldgate + h * gate_hs + d;
  const float2 x = __bfloat1622float2(*o);
  *o = __floats2bfloat162_rn(x.x * sigmoid_f(__bfloat162float(gr[0])), x.y * sigmoid_f(__bfloat162float(gr[1])));
}
// output_gate_k's operations on 8 values a thread (16-byte loads and store, a row per grid row:
// no 64-bit division per pair), the same bits; where the rows, heads and both pointers are
// 16-byte aligned and D % 8 == 0.
constexpr int kGateThreads = 256;
__global__ void output_gate8_k(bf16* out, int Hq, int D, const bf16* gate, int64_t ldgate, int64_t gate_hs) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int c = (int(blockIdx.y) * kGateThreads + int(threadIdx.x)) * 8;
  if (c >= Hq * D) return;
  const int h = c / D, d = c - h * D;
  uint4* o = reinterpret_cast<uint4*>(out + t * Hq * D + c);
  const uint4 gv = *reinterpret_cast<const uint4*>(gate + t * ldgate + h * gate_hs + d);
  uint4 ov = *o;
  __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(&ov);
  const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(op[j]), g = __bfloat1622float2(gp[j]);
    op[j] = __floats2bfloat162_rn(x.x * sigmoid_f(g.x), x.y * sigmoid_f(g.y));
  }
  *o = ov;
}
// output_gate8_k's gated values quantized for the FP8 o_proj as fp8_quantize_rows would from them
// (amax of the bf16 values from 0, s = amax / 448, codes of x / s, zeros to kp): a token's row in
// one CTA, kG groups of 8 values a thread, held in registers across the row's block max. `out` is
// only read.
template <int kG>
__global__ void __launch_bounds__(kGateThreads) output_gate8_fp8_k(const bf16* out, int Hq, int D, const bf16* gate, int64_t ldgate, int64_t gate_hs,
                                                                  uint8_t* q, int64_t kp, float* scale) {
  pdl_wait();
  __shared__ float sh[32];
  const int64_t t = blockIdx.x;
  const int n = Hq * D;
  uint4 v[kG];
  float m = 0.0f;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const int c = (g * kGateThreads + int(threadIdx.x)) * 8;
    v[g] = make_uint4(0u, 0u, 0u, 0u);
    if (c >= n) continue;
    const int h = c / D, d = c - h * D;
    const uint4 gv = *reinterpret_cast<const uint4*>(gate + t * ldgate + h * gate_hs + d);
    v[g] = *reinterpret_cast<const uint4*>(out + t * int64_t(n) + c);
    __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(&v[g]);
    const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 x = __bfloat1622float2(op[j]), gg = __bfloat1622float2(gp[j]);
      op[j] = __floats2bfloat162_rn(x.x * sigmoid_f(gg.x), x.y * sigmoid_f(gg.y));
    }
    m = absmax8_bf16(v[g], m);
  }
  const Fp8RowScale rs = fp8_row_scale(block_max(m, sh));
  if (threadIdx.x == 0) scale[t] = rs.s;
  uint8_t* row = q + t * kp;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const int c = (g * kGateThreads + int(threadIdx.x)) * 8;
    if (c < n) *reinterpret_cast<uint2*>(row + c) = e4m3_encode8_bf16(v[g], rs.s, rs.inv);
  }
  for (int64_t i = n + threadIdx.x; i < kp; i += kGateThreads) row[i] = 0;  // the GEMM's K padding
}
}  // namespace

bool attention_output_gate_fp8_fits(int64_t Hq, int64_t D, int64_t ldgate, int64_t gate_head_stride, int64_t kp) {
  const int64_t groups = Hq * D / 8, per = (groups + kGateThreads - 1) / kGateThreads;
  return D % 8 == 0 && ldgate % 8 == 0 && gate_head_stride % 8 == 0 && per >= 1 && per <= 4 && kp >= Hq * D && kp % 8 == 0;
}

bool attention_output_gate_fp8_aligned(const bf16* out, const bf16* gate, const uint8_t* q) {
  return aligned16(out) && aligned16(gate) && reinterpret_cast<uintptr_t>(q) % 8 == 0;
}

void attention_output_gate_fp8(const bf16* out, int64_t L, int64_t Hq, int64_t D, const bf16* gate, int64_t ldgate, int64_t gate_head_stride,
                               uint8_t* q, int64_t kp, float* scale, cudaStream_t s) {
  if (!attention_output_gate_fp8_fits(Hq, D, ldgate, gate_head_stride, kp) || !attention_output_gate_fp8_aligned(out, gate, q))
    throw Error(Status::Internal, "internal_error", "attention_output_gate_fp8: Hq " + std::to_string(Hq) + ", D " + std::to_string(D) + ", kp " +
                                                       std::to_string(kp) + " or the operands' alignment do not fit its kernel");
  if (L == 0) return;
  const int64_t per = (Hq * D / 8 + kGateThreads - 1) / kGateThreads;
  auto launch = [&](auto kernel) {
    launch_after("attention_output_gate_fp8", kernel, unsigned(L), kGateThreads, 0, s, out, int(Hq), int(D), gate, ldgate, gate_head_stride, q, kp,
                 scale);
  };
  switch (per) {
    case 1: launch(output_gate8_fp8_k<1>); break;
    case 2: launch(output_gate8_fp8_k<2>); break;
    case 3: launch(output_gate8_fp8_k<3>); break;
    default: launch(output_gate8_fp8_k<4>); break;
  }
}

void attention_output_gate(bf16* out, int64_t L, int64_t Hq, int64_t D, const bf16* gate, int64_t ldgate, int64_t gate_head_stride,
                           cudaStream_t s) {
  const int64_t n = L * Hq * D / 2;
  if (n == 0) return;
  const int64_t per = (Hq * D / 8 + kGateThreads - 1) / kGateThreads;
  if (D % 8 == 0 && ldgate % 8 == 0 && gate_head_stride % 8 == 0 && aligned16(out) && aligned16(gate) && per <= 65535) {
    return launch_after("attention_output_gate", output_gate8_k, dim3(unsigned(L), unsigned(per)), kGateThreads, 0, s, out, int(Hq), int(D), gate,
                        ldgate, gate_head_stride);
  } else {
    output_gate_k<<<unsigned((n + 255) / 256), 256, 0, s>>>(out, L, int(Hq), int(D), gate, ldgate, gate_head_stride);
  }
  check_launch("attention_output_gate");
}

void flash_attention(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, const bf16* gate, int64_t ldgate, int64_t gate_head_stride,
                     int64_t Hq, int64_t Hkv, int64_t D, const AttnTiles& tiles, bf16* out, cudaStream_t s) {
  if (tiles.n == 0) return;
  const int64_t ldo = Hq * D;
  switch (D) {
#define CLEFRT_FLASH(d) \
  case d: return launch_flash<d, true>(q, k, v, ldv, gate, ldgate, gate_head_stride, Hq, Hkv, tiles, out, ldo, D, D, s);
    CLEFRT_FLASH(32) CLEFRT_FLASH(48) CLEFRT_FLASH(64) CLEFRT_FLASH(96) CLEFRT_FLASH(128) CLEFRT_FLASH(256)
#undef CLEFRT_FLASH
    default: throw Error(Status::Internal, "unsupported", "flash_attention: head_dim " + std::to_string(D) + " (32, 48, 64, 96, 128, 256)");
  }
}

int64_t flash_attention_full_tile() { return query_tile(false); }

int64_t flash_attention_full_padded(int64_t dout) {
  for (int64_t d : {16, 32, 48, 64, 80, 96, 128})
    if (dout <= d && dout % 2 == 0) return d;
  return 0;
}

void flash_attention_full(const bf16* q, const bf16* k, const bf16* v, int64_t heads, int64_t dout, const AttnTiles& tiles, bf16* out,
                          cudaStream_t s) {
  if (tiles.n == 0) return;
  const int64_t D = flash_attention_full_padded(dout), ld = heads * D;
  // over the queries: their padded layout; elsewhere packed [L, heads, dout]
  const int64_t ldo = out == q ? ld : heads * dout, out_hs = out == q ? D : dout;
  switch (D) {
#define CLEFRT_FLASH(d) \
  case d: return launch_flash<d, false>(q, k, v, ld, nullptr, 0, 0, heads, heads, tiles, out, ldo, out_hs, dout, s);
    CLEFRT_FLASH(16) CLEFRT_FLASH(32) CLEFRT_FLASH(48) CLEFRT_FLASH(64) CLEFRT_FLASH(80) CLEFRT_FLASH(96) CLEFRT_FLASH(128)
#undef CLEFRT_FLASH
    default: throw Error(Status::Internal, "unsupported", "flash_attention_full: head_dim " + std::to_string(dout) + " (even, at most 128)");
  }
}

}  // namespace clefrt::cuda

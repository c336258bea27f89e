// The GDN chunk prep and scan on Hopper's warpgroup MMA (sm_90a, Dk = Dv = 128): the outputs of
// gdn_chunk_prep_tc_k and gdn_chunk_scan_tc_k (kernels_gdn.cu), the scan's recurrence and outputs
// in one kernel, their products as "bf16x3" wgmmas.
//
// bf16x3: an fp32 operand x goes in as two bf16 planes, hi = bf16(x) and lo = bf16(x - hi)
// (|x - hi - lo| <= 2^-16 |x|, bf16 keeping 8 significant bits), and a product as three bf16
// wgmmas with fp32 accumulation, hi*hi + hi*lo + lo*hi (the dropped lo*lo is within 2^-16 of
// it). The outputs stay within ~1e-5 of the 3xTF32 kernel's (TF32 alone: ~5e-4; bf16, fla's
// choice: ~4e-3) at half its tensor work (bf16 runs at twice TF32's rate) and with no split
// instructions in the product's loop: the planes are made once per chunk (dev/cuda/gdn_scan.cu
// measures the variants).
//
// Operands are K-major 128-byte-swizzled bf16 tiles (wgmma.cuh), "planes" of 64-element k
// panels: W [tokens][Dk] and A [tokens][tokens] per (chunk, value head), Q and K [tokens][Dk] per
// (chunk, key head), all written by the prep (gdn_prep_wgmma_k; Q's and K's by the first value
// head of each key head); inside the scan S^T [state columns][Dk] and Vn^T [state
// columns][tokens] (gdn_tiles.cuh: the layout). A [tokens][D] plane is also read as the N-major B
// of a product over tokens (wgmma_desc_nmajor: the wgmma transposes it), so no plane is written
// transposed from global memory.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/formats.cuh"
#include "cuda/ops/gated_norm.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/gpu_flags.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/wgmma.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"
#include "cuda/runtime/pdl.cuh"

namespace clefrt::cuda {

namespace {

using namespace gdn;

constexpr int kDk = 128;   // the key head dim these kernels tile
constexpr int kCols = 64;  // state columns per CTA
[[maybe_unused]] constexpr int kPanel = C * 128;  // a [tokens][D] plane's 64-wide panel: 64 token rows of 128 bytes

// The scans' per-chunk decays: read() takes a chunk's g (lane l: tokens 2l and 2l + 1; zeros past
// the chunk) a chunk ahead, make() turns the last read into a decay buffer ([C] e^(gamma_C -
// gamma_i), e^gamma_C, [C] e^gamma_i) with gamma in double, summed as chunk_gamma_pair does.
// Where they run matters: a warp's four double-precision exps a lane take longer than a chunk's
// last wgmmas, so made there by one warp they held every warp at the next barrier (the planes
// scan's one-pass time rose by a quarter). The planes scan makes a chunk's at its start, under
// its U loads; the register-state scan, whose U is already in shared memory, splits them over
// four warps (make_part) under its last wgmmas.
struct ChunkDecays {
  const float* g;
  const int32_t *chunk_start, *chunk_len;  // GdnChunks' (a copy: no reference to a kernel parameter)
  int64_t Hv, j;
  int lane;
  float ga = 0, gb = 0;
  __device__ void read(int64_t c) {
    const int64_t t0 = chunk_start[c];
    const int n = chunk_len[c], i0 = 2 * lane;
    ga = i0 < n ? g[(t0 + i0) * Hv + j] : 0.0f;
    gb = i0 + 1 < n ? g[(t0 + i0 + 1) * Hv + j] : 0.0f;
  }
  // gamma at this lane's two tokens (2 lane, 2 lane + 1) and at the chunk's last, n - 1
  __device__ void gammas(int n, double& gam0, double& gam1, double& gl) const {
    double sum = double(ga) + double(gb);
    for (int of = 1; of < 32; of <<= 1) {
      const double v = __shfl_up_sync(0xffffffffu, sum, of);
      if (lane >= of) sum += v;
    }
    gam1 = sum, gam0 = sum - double(gb);
    gl = __shfl_sync(0xffffffffu, (n - 1) & 1 ? gam1 : gam0, (n - 1) >> 1);
  }
  __device__ void make(float* ek, int n) const {
    float* eg = ek + C + 1;
    double gam0, gam1, gl;
    gammas(n, gam0, gam1, gl);
    ek[2 * lane] = 2 * lane < n ? float(exp(gl - gam0)) : 0.0f;
    ek[2 * lane + 1] = 2 * lane + 1 < n ? float(exp(gl - gam1)) : 0.0f;
    eg[2 * lane] = float(exp(gam0));
    eg[2 * lane + 1] = float(exp(gam1));
    if (lane == 0) ek[C] = float(exp(gl));
  }
  // make()'s values by four warps, one exp a lane (each warp read() the chunk's g and sums it
  // alike): warps 0, 1 the e^(gamma_C - gamma_i), warps 2, 3 the e^gamma_i and e^gamma_C (token
  // n - 1's e^gamma_i: the same double). One warp's four dependent-latency exps a lane were on
  // the register-state scan's serial path.
  __device__ void make_part(float* ek, int n, int w) const {
    double gam0, gam1, gl;
    gammas(n, gam0, gam1, gl);
    const int t = (32 * w + lane) & (C - 1);
    const double g0 = __shfl_sync(0xffffffffu, gam0, t >> 1), g1 = __shfl_sync(0xffffffffu, gam1, t >> 1);
    const double gt = t & 1 ? g1 : g0;
    if (w < 2) {
      ek[t] = t < n ? float(exp(gl - gt)) : 0.0f;
    } else {
      const float e = float(exp(gt));
      ek[C + 1 + t] = e;
      if (t == n - 1) ek[C] = e;
    }
  }
};

struct ScanSmem {
  // W, Q, K, S^T planes (32 KiB each), A's, Vn'^T's and Vn^T's (16 KiB each), the chunk's decays;
  // 1 KiB to align the tiles (the swizzle is computed from address bits)
  static constexpr int kDecays = 2 * C + 1;  // [C] e^(gamma_C - gamma_i), e^gamma_C, [C] e^gamma_i
  static constexpr size_t bytes() { return 1024 + 4 * size_t(kTile) + 3 * size_t(kSmallTile) + sizeof(float) * kDecays; }
};

// One CTA (two warpgroups) per (sequence, value head, 64 state columns). Warpgroup w holds S^T's
// Dk columns [64 w, 64 w + 64) for the CTA's 64 state columns in registers (m64n64
// accumulators, fp32, carried across chunks) and forms Vn's and O's state columns
// [32 w, 32 w + 32). Per chunk:
//   barrier; Vn = U - W S and Q S (M = 64 tokens, N = 32 columns, K = Dk: 48 wgmma m64n32k16
//   a warpgroup, both reading S^T's planes); Vn^T's and (e^(gamma_C - gamma) Vn)^T's planes; Q S's
//   rows times e^gamma;
//   barrier; S^T = e^gamma_C S^T + Vn'^T K (M = 64 columns, N = 64 Dk, K = 64 tokens; K's plane
//   read N-major) and
//   O += A Vn (M = 64 tokens, N = 32 columns): 24 wgmma; O out; S^T's planes for the next chunk.
// W and Q of the next chunk load during the second half, K and A during the first.
template <bool X3>
__global__ void __launch_bounds__(256, 1) gdn_scan_wgmma_k(const float* g, int64_t Hk, int64_t Hv, int64_t Dv, GdnChunks ch, GdnScratch sc,
                                                           float* o) {
#ifndef CLEFRT_WGMMA
  __trap();  // other architectures of a fat binary: never launched there (gdn_wgmma_available)
#else
  extern __shared__ uint8_t smem_raw[];
  // the tiles on 1024-byte boundaries (the swizzle is computed from address bits), as an offset
  // from smem_raw: a pointer rebuilt from an integer loses its address space, and every access
  // through it compiled to a generic load or store (ld / st, not ld.shared / st.shared)
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* Wb = base;              // [64 tokens][128 Dk]
  uint8_t* Qb = Wb + kTile;        // [64 tokens][128 Dk]
  uint8_t* Kb = Qb + kTile;        // [64 tokens][128 Dk] (B of S's update, N-major)
  uint8_t* St = Kb + kTile;        // [64 columns][128 Dk]
  uint8_t* Ab = St + kTile;        // [64 tokens][64 tokens]
  uint8_t* Vt = Ab + kSmallTile;   // (e^(gamma_C - gamma) Vn)^T [64 columns][64 tokens]
  uint8_t* Vu = Vt + kSmallTile;   // Vn^T
  float* ek = reinterpret_cast<float*>(Vu + kSmallTile);  // the chunk's decays (ChunkDecays::make's buffer)
  const float* eg = ek + C + 1;

  const int64_t s = blockIdx.x, j = blockIdx.y, c0_col = int64_t(blockIdx.z) * kCols;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wi = warp & 3;
  const int gq = lane >> 2, tq = lane & 3;

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  // sacc[4 jj + 2 h + cc]: S^T at state column 16 wi + gq + 8 h, Dk index 64 wg + 8 jj + 2 tq + cc
  // (wgmma's accumulator layout); sidx: its place in a state [Dk][Dv]
  float sacc[32];
  auto sidx = [&](int i) { return int64_t(64 * wg + 8 * (i >> 2) + 2 * tq + (i & 1)) * Dv + c0_col + 16 * wi + gq + 8 * ((i >> 1) & 1); };
  {
    const float* from = scan_state_source(ch, sc, s, cb);
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] = from ? from[j * kDk * Dv + sidx(i)] : 0.0f;
  }
  auto store_s = [&](float* to) {
#pragma unroll
    for (int i = 0; i < 32; ++i) to[j * kDk * Dv + sidx(i)] = sacc[i];
  };
  // S^T's planes from sacc: a thread's pairs sit in row 16 wi + gq + 8 h (swizzle phase gq) of
  // Dk panel wg, 16-byte chunk jj
  auto write_st = [&] {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        __nv_bfloat162 hh, ll;
        split_pair(sacc[4 * jj + 2 * h], sacc[4 * jj + 2 * h + 1], hh, ll, X3);
        const int off = wg * (kCols * 128) + (16 * wi + gq + 8 * h) * 128 + ((jj ^ gq) << 4) + 4 * tq;
        *reinterpret_cast<__nv_bfloat162*>(St + off) = hh;
        if (X3) *reinterpret_cast<__nv_bfloat162*>(St + kTile / 2 + off) = ll;
      }
  };
  // the accumulators pinned around the wgmmas (wgmma.cuh's fence_operand)
  auto fence_acc = [](float* a, int n) {
    for (int i = 0; i < n; ++i) fence_operand(a[i]);
  };
  auto copy = [&](uint8_t* dst, const uint8_t* src, int bytes) {
    for (int e = tid; e < bytes / 16; e += 256) cp_async16(dst + 16 * e, src + 16 * e, true);
  };
  // one pass reads the hi planes alone (the first half of each tile; the prep wrote no lo plane)
  constexpr int kLoad = X3 ? kTile : kTile / 2, kSmallLoad = X3 ? kSmallTile : kSmallTile / 2;
  auto load_wq = [&](int64_t c) {
    if (c < ce) {
      copy(Wb, sc.wp + ((c - sc.c0) * Hv + j) * kTile, kLoad);
      copy(Qb, sc.qp + ((c - sc.c0) * Hk + kh) * kTile, kLoad);
    }
    cp_async_commit();
  };
  auto load_ka = [&](int64_t c) {
    copy(Kb, sc.kp + ((c - sc.c0) * Hk + kh) * kTile, kLoad);
    copy(Ab, sc.ap + ((c - sc.c0) * Hv + j) * kSmallTile, kSmallLoad);
    cp_async_commit();
  };
  ChunkDecays dec{g, ch.chunk_start, ch.chunk_len, Hv, j, lane};  // warp 0's (ChunkDecays: g a chunk ahead)
  load_wq(cb);
  if (warp == 0) dec.read(cb);
  write_st();
  for (int64_t c = cb; c < ce; ++c) {
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv + c0_col;
    if (sc.snap_chunk && sc.snap_chunk[s] == c) store_s(sc.seq_state_out[s] + sc.layer_off);
    // this chunk's decays, made by warp 0 while the others' U loads are in flight (the last
    // chunk's readers are past its second barrier), then the next chunk's g
    if (warp == 0) {
      dec.make(ek, n);
      if (c + 1 < ce) dec.read(c + 1);
    }
    // this thread's U: Vn's tokens 16 wi + gq (+8), state columns 32 wg + 8 jj + 2 tq (+1)
    float2 ur[8];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ur[2 * jj + h] = *reinterpret_cast<const float2*>(u + (16 * wi + gq + 8 * h) * Dv + 32 * wg + 8 * jj + 2 * tq);
    cp_async_wait<0>();  // W and Q
    fence_proxy_async();
    __syncthreads();  // W, Q, S^T's planes and the decays visible; the last chunk's readers done
    load_ka(c);
    float vacc[16], oacc[16];
    fence_acc(vacc, 16);
    fence_acc(oacc, 16);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDk / 16; ++k) {
      const int po = (k >> 2) * (C * 128) + (k & 3) * 32;  // Dk panel, 16-element step
      const uint64_t sh = wgmma_desc(St + 32 * wg * 128 + po), sl = wgmma_desc(St + kTile / 2 + 32 * wg * 128 + po);
      const uint64_t wh = wgmma_desc(Wb + po), wl = wgmma_desc(Wb + kTile / 2 + po);
      const uint64_t qh = wgmma_desc(Qb + po), ql = wgmma_desc(Qb + kTile / 2 + po);
      wgmma_planes<X3, 32>(vacc, wh, wl, sh, sl, k > 0);
      wgmma_planes<X3, 32>(oacc, qh, ql, sh, sl, k > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(vacc, 16);
    fence_acc(oacc, 16);
    const float eC = ek[C];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * wi + gq + 8 * h, col = 32 * wg + 8 * jj + 2 * tq;
        const float v0 = ur[2 * jj + h].x - vacc[4 * jj + 2 * h], v1 = ur[2 * jj + h].y - vacc[4 * jj + 2 * h + 1];
        const float e = ek[row], eo = eg[row];
        oacc[4 * jj + 2 * h] *= eo;
        oacc[4 * jj + 2 * h + 1] *= eo;
        // (col, row), (col + 1, row) of [columns][tokens] planes: swizzle phases 2 tq, 2 tq + 1
        const int o0 = col * 128 + (((row >> 3) ^ (2 * tq)) << 4) + 2 * gq;
        const int o1 = (col + 1) * 128 + (((row >> 3) ^ (2 * tq + 1)) << 4) + 2 * gq;
        auto put_t = [&](uint8_t* plane, float x0, float x1) {  // two rows of the planes: no pair store
          __nv_bfloat162 hh, ll;
          split_pair(x0, x1, hh, ll, X3);
          *reinterpret_cast<bf16*>(plane + o0) = __low2bfloat16(hh);
          *reinterpret_cast<bf16*>(plane + o1) = __high2bfloat16(hh);
          if (X3) {
            *reinterpret_cast<bf16*>(plane + kSmallTile / 2 + o0) = __low2bfloat16(ll);
            *reinterpret_cast<bf16*>(plane + kSmallTile / 2 + o1) = __high2bfloat16(ll);
          }
        };
        put_t(Vt, v0 * e, v1 * e);
        put_t(Vu, v0, v1);
      }
    cp_async_wait<0>();  // K and A
    fence_proxy_async();
    __syncthreads();  // Vn's planes whole, K and A visible; W, Q and S^T's planes read by all
    load_wq(c + 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) sacc[i] *= eC;
    fence_acc(sacc, 32);
    fence_acc(oacc, 16);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < C / 16; ++k) {
      const uint64_t vh = wgmma_desc(Vt + 32 * k), vl = wgmma_desc(Vt + kSmallTile / 2 + 32 * k);
      // K [tokens][Dk] as B (k = token, n = Dk), N-major: warpgroup wg's 64 Dk are panel wg,
      // tokens 16 k .. 2048 k bytes in
      const uint64_t kh_ = wgmma_desc_nmajor(Kb + kPanel * wg + 2048 * k, kPanel),
                     kl = wgmma_desc_nmajor(Kb + kTile / 2 + kPanel * wg + 2048 * k, kPanel);
      const uint64_t ah = wgmma_desc(Ab + 32 * k), al = wgmma_desc(Ab + kSmallTile / 2 + 32 * k);
      const uint64_t uh = wgmma_desc(Vu + 32 * wg * 128 + 32 * k), ul = wgmma_desc(Vu + kSmallTile / 2 + 32 * wg * 128 + 32 * k);
      wgmma_planes<X3, 64, 1>(sacc, vh, vl, kh_, kl, true);
      wgmma_planes<X3, 32>(oacc, ah, al, uh, ul, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(sacc, 32);
    fence_acc(oacc, 16);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * wi + gq + 8 * h;
        if (row < n)
          *reinterpret_cast<float2*>(o + (t0 + row) * value_dim + j * Dv + c0_col + 32 * wg + 8 * jj + 2 * tq) =
              make_float2(oacc[4 * jj + 2 * h], oacc[4 * jj + 2 * h + 1]);
      }
    write_st();
  }
  cp_async_wait_all();
  if (ch.seq_chunk[s + 1] > ce) store_s(sc.state_out);
  else if (sc.snap_chunk && sc.snap_chunk[s] == ce) store_s(sc.seq_state_out[s] + sc.layer_off);
#endif
}

// The scan with the state as wgmma's register operand (one bf16 pass's: gdn_wgmma_scan_regs;
// CLEFRT_GDN_SCAN=planes runs gdn_scan_wgmma_k instead). One CTA (two warpgroups) per (sequence, value head); warpgroup w
// holds S^T [64 state columns 64 w .. 64 w + 63][128 Dk] as an m64n128 accumulator (64 fp32 a
// thread), and every product takes its A from registers, the previous product's output:
//   Vn^T = U^T - S^T W^T and O^T = S^T Q^T (M = 64 columns, N = 64 tokens, K = Dk; B: W's and Q's
//   planes, K-major); O^T's tokens times e^gamma;
//   O^T += Vn^T A^T (K = tokens; B: A's plane) and S^T = e^gamma_C S^T + (e^(gamma_C - gamma)
//   Vn)^T K (N = Dk, K = tokens; B: K's plane, N-major); O^T out.
// So nothing goes through shared memory but the prep's planes (W, Q, K, A: two stages, the next
// chunk's copies under this one's products), one barrier a chunk, 48 CTAs at 1 x 8,192 on the
// serial path where gdn_scan_wgmma_k has 96 with three barriers and S^T's and Vn's planes written
// and read a chunk (FlashInfer's state warpgroups work this way: docs/notes/gdn-prefill-designs.md).
// kWgs warpgroups a CTA (1 or 2: the same instructions a warpgroup either way, so the same bits;
// gdn_scan_rs_wgs picks): one a CTA puts twice as many CTAs on the serial path where there are
// fewer (sequence, value head) pairs than SMs.
template <int kWgs, bool TF = false, bool NORM = false>
struct ScanRsSmem {
  static_assert(!NORM || (TF && kWgs == 2), "the gated norm in the scan: the T form, a value head's 128 columns a CTA");
  static constexpr int kUCols = 64 * kWgs, kULd = kUCols + 4;  // U's rows padded: a warp's reads hit 32 banks
  // TF: V's rows (bf16), padded so the four rows a warp reads at once (tokens 2 tq) start 32 bytes apart
  static constexpr int kVLd = kUCols + 8;
  // NORM: O's tile [64 tokens][kOLd] fp32 for the gated norm (over the stage's Q, K and A planes,
  // once the chunk's products are done with them), its rows padded so the accumulators' stores
  // (tokens 2 tq, columns gq) hit 32 banks
  static constexpr int kOLd = kUCols + 4;
  // a stage: W (TF: T, 8 KiB), Q, K hi planes (16 KiB each), A's hi plane (8 KiB), U [64 tokens][kULd]
  // fp32 (TF: V [64 tokens][kVLd] bf16; NORM: then z [64 tokens][kUCols] fp32)
  static constexpr int kStage = TF ? 2 * (kTile / 2) + 2 * (kSmallTile / 2) + C * kVLd * 2 + (NORM ? C * kUCols * 4 : 0)
                                   : 3 * (kTile / 2) + kSmallTile / 2 + C * kULd * 4;
  static_assert(kStage % 1024 == 0, "a stage's planes on 1024-byte boundaries");
  static_assert(!NORM || C * kOLd * 4 <= 2 * (kTile / 2) + kSmallTile / 2, "O's tile fits over Q's, K's and A's planes");
  static constexpr size_t bytes() { return 1024 + 2 * size_t(kStage) + sizeof(float) * 2 * ScanSmem::kDecays; }
};

// TF (the T form, gdn_wgmma_t_form): the prep leaves Tb = T diag(beta) (T = (I + Lm)^-1) and A
// as planes, not W and U (FlashInfer's organisation of the state products: W and U are never
// formed); the scan loads q, k and v from the conv's bf16 rows (GdnScratch::mixed16) and forms
//   Y^T = V^T - S^T K^T diag(e^gamma),  Vn^T = Y^T Tb^T
// where the W / U form has Vn^T = U^T - S^T W^T with U = Tb V, W = Tb diag(e^gamma) K: the same
// Vn in exact arithmetic, rounded elsewhere (Y to bf16 instead of W and U). One product more on
// the serial path (4 wgmma m64n64k16), against the prep's U and W products and most of the bytes
// between the two kernels.
//
// NORM (gdn_scan_norms): the gated norm in the epilogue. O's chunk tile goes through shared memory,
// and a warp a token computes gated_norm128_k's values from it (gated_norm.cuh, the same bits) with
// z's rows, loaded with the chunk's planes; act is written instead of O (half O's bytes, and none
// read back by a kernel of its own).
template <int kWgs, bool TF = false, bool NORM = false>
__global__ void __launch_bounds__(128 * kWgs, 1) gdn_scan_rs_k(const float* g, int64_t Hk, int64_t Hv, int64_t Dv, GdnChunks ch, GdnScratch sc,
                                                                float* o) {
#ifndef CLEFRT_WGMMA
  __trap();  // other architectures of a fat binary: never launched there (gdn_wgmma_available)
#else
  // (the overlap: launched while the prep runs, it waits on the prep's flags instead, below)
  if (!(TF && sc.ready)) pdl_wait();
  using Sm = ScanRsSmem<kWgs, TF, NORM>;
  constexpr int kThreads = 128 * kWgs;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  float* decay_buf = reinterpret_cast<float*>(base + 2 * Sm::kStage);  // [2][ScanSmem::kDecays]: this chunk's, the next one's
  // TF: the stage holds T where W would be (8 KiB), then Q, K, A and V
  auto Wb = [&](int st) { return base + st * Sm::kStage; };  // [64 tokens][128 Dk] (TF: T [64 tokens][64 tokens])
  auto Qb = [&](int st) { return Wb(st) + (TF ? kSmallTile / 2 : kTile / 2); };  // [64 tokens][128 Dk]
  auto Kb = [&](int st) { return Qb(st) + kTile / 2; };     // [64 tokens][128 Dk] (B N-major)
  auto Ab = [&](int st) { return Kb(st) + kTile / 2; };     // [64 tokens][64 tokens]
  auto Ub = [&](int st) { return reinterpret_cast<float*>(Ab(st) + kSmallTile / 2); };  // [64 tokens][kULd]: the CTA's columns
  auto Vb = [&](int st) { return reinterpret_cast<bf16*>(Ab(st) + kSmallTile / 2); };   // TF: [64 tokens][kVLd]: the CTA's columns
  auto Zb = [&](int st) { return reinterpret_cast<float*>(Vb(st) + C * Sm::kVLd); };   // NORM: [64 tokens][kUCols]: z's columns
  const int64_t key_dim = Hk * kDk, conv_dim = 2 * key_dim + Hv * Dv;

  const int64_t s = blockIdx.x, j = blockIdx.y;
  const int64_t kh = j / (Hv / Hk), value_dim = Hv * Dv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wi = warp & 3;
  const int gq = lane >> 2, tq = lane & 3;
  const int64_t cta_col = int64_t(blockIdx.z) * Sm::kUCols, c0_col = cta_col + 64 * wg;  // this warpgroup's state columns

  int64_t cb, ce;
  if (!scan_pass_chunks(ch, sc, s, cb, ce)) return;
  // sacc[4 jj + 2 h + cc]: S^T at state column c0_col + 16 wi + gq + 8 h, Dk index 8 jj + 2 tq + cc;
  // its place in a state [Dk][Dv]
  float sacc[64];
  auto sidx = [&](int i) { return int64_t(8 * (i >> 2) + 2 * tq + (i & 1)) * Dv + c0_col + 16 * wi + gq + 8 * ((i >> 1) & 1); };
  {
    const float* from = scan_state_source(ch, sc, s, cb);
#pragma unroll
    for (int i = 0; i < 64; ++i) sacc[i] = from ? from[j * kDk * Dv + sidx(i)] : 0.0f;
  }
  auto store_s = [&](float* to) {
#pragma unroll
    for (int i = 0; i < 64; ++i) to[j * kDk * Dv + sidx(i)] = sacc[i];
  };
  auto fence_acc = [](float* a, int n) {
    for (int i = 0; i < n; ++i) fence_operand(a[i]);
  };
  // a chunk's planes and U (the CTA's columns) into stage st: U's loads were on the serial path
  // when read from global memory at the chunk's start
  auto copy = [&](uint8_t* dst, const uint8_t* src, int bytes) {
    for (int e = tid; e < bytes / 16; e += kThreads) cp_async16(dst + 16 * e, src + 16 * e, true);
  };
  // TF with the overlap (GdnScratch::ready, set where the prep runs beside this kernel): a chunk's
  // T and A planes are asked for once the prep has flagged them. The flag of the chunk after is
  // loaded (relaxed) as this one's planes are asked for and tested a chunk later, so its latency is
  // off the serial path; seen unset, the thread spins on acquire loads. Seen set, the planes'
  // copies are issued after the test (a branch: not speculated) and read L2 (cp.async.cg), where
  // the prep's release store put its planes before the flag.
  int next_ready = 0;
  auto await_item = [&](int64_t c) {
    const int* f = sc.ready + (c - sc.c0) * Hv + j;
    // a flag not set within ~2^31 clocks (about a second) is a bug (a prep run without the overlap
    // before a scan with it): trap, which names the kernel, rather than hang
    if (!next_ready)
      for (const long long t = clock64(); !ld_acquire_gpu(f);)
        if (clock64() - t > (1ll << 31)) __trap();
    next_ready = c + 1 < ce ? ld_relaxed_gpu(f + Hv) : 0;
  };
  auto load = [&](int64_t c, int st) {
    if (TF && c < ce) {
      // q and k rows into their planes, v's (the CTA's columns) into V's rows; past the chunk zeros
      const int64_t tc = ch.chunk_start[c];
      const int nc = ch.chunk_len[c];
      const bf16* rows = sc.mixed16 + tc * conv_dim;
      for (int e = tid; e < C * 16; e += kThreads) {
        const int row = e >> 4, col = (e & 15) * 8;
        const bool in = row < nc;
        const bf16* r = in ? rows + row * conv_dim : rows;
        cp_async16(Qb(st) + kmajor_off(row, col, C), r + (in ? kh * kDk + col : 0), in);
        cp_async16(Kb(st) + kmajor_off(row, col, C), r + (in ? key_dim + kh * kDk + col : 0), in);
      }
      constexpr int kRow = Sm::kUCols / 8;  // 16-byte pieces a row
      for (int e = tid; e < C * kRow; e += kThreads) {
        const int row = e / kRow, q = e % kRow;
        const bool in = row < nc;
        cp_async16(Vb(st) + row * Sm::kVLd + 8 * q, in ? rows + row * conv_dim + 2 * key_dim + j * Dv + cta_col + 8 * q : rows, in);
      }
      if constexpr (NORM) {  // the gate's rows (the CTA's columns), read by the chunk's epilogue
        constexpr int kZRow = Sm::kUCols / 4;
        for (int e = tid; e < C * kZRow; e += kThreads) {
          const int row = e / kZRow, q = e % kZRow;
          const bool in = row < nc;
          cp_async16(Zb(st) + row * Sm::kUCols + 4 * q, in ? sc.gn.z + (tc + row) * sc.gn.ldz + j * Dv + cta_col + 4 * q : sc.gn.w, in);
        }
      }
      if (sc.ready) await_item(c);
      copy(Wb(st), sc.wp + ((c - sc.c0) * Hv + j) * kTile, kSmallTile / 2);  // T
      copy(Ab(st), sc.ap + ((c - sc.c0) * Hv + j) * kSmallTile, kSmallTile / 2);
    } else if (c < ce) {
      copy(Wb(st), sc.wp + ((c - sc.c0) * Hv + j) * kTile, kTile / 2);
      copy(Qb(st), sc.qp + ((c - sc.c0) * Hk + kh) * kTile, kTile / 2);
      copy(Kb(st), sc.kp + ((c - sc.c0) * Hk + kh) * kTile, kTile / 2);
      copy(Ab(st), sc.ap + ((c - sc.c0) * Hv + j) * kSmallTile, kSmallTile / 2);
      const float* u = sc.u + ((c - sc.c0) * Hv + j) * C * Dv + cta_col;
      constexpr int kRow = Sm::kUCols / 4;  // 16-byte pieces a row
      for (int e = tid; e < C * kRow; e += kThreads)
        cp_async16(Ub(st) + (e / kRow) * Sm::kULd + 4 * (e % kRow), u + (e / kRow) * Dv + 4 * (e % kRow), true);
    }
    cp_async_commit();
  };
  // warps 0 .. 3 make a chunk's decays (ChunkDecays::make_part), the next chunk's while this one's
  // last wgmmas run; each reads g a chunk before it makes the decays
  ChunkDecays dec{g, ch.chunk_start, ch.chunk_len, Hv, j, lane};
  auto next_decays = [&](int64_t c, int b) {
    dec.make_part(decay_buf + b * ScanSmem::kDecays, ch.chunk_len[c], warp);
    if (c + 1 < ce) dec.read(c + 1);
  };
  load(cb, 0);
  if (warp < 4) {
    dec.read(cb);
    next_decays(cb, 0);
  }
  // NORM: the norm's weights and z's column scales (FP8) at the lane's four columns (a warp's row
  // is a value head's 128), the same for every token
  const float4 gn_w = NORM ? reinterpret_cast<const float4*>(sc.gn.w)[lane] : make_float4(0, 0, 0, 0);
  const float4 gn_cs = NORM && sc.gn.zs.rs ? reinterpret_cast<const float4*>(sc.gn.zs.cs + j * Dv)[lane] : make_float4(0, 0, 0, 0);
  for (int64_t c = cb; c < ce; ++c) {
    const int st = int((c - cb) & 1);
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    if (sc.snap_chunk && sc.snap_chunk[s] == c) store_s(sc.seq_state_out[s] + sc.layer_off);
    cp_async_wait<0>();  // this chunk's planes and U
    fence_proxy_async();
    __syncthreads();     // the planes, U and the decays visible; the other stage's readers (the last chunk) done
    load(c + 1, st ^ 1);
    float vacc[32], oacc[32];
    const float* ek = decay_buf + st * ScanSmem::kDecays;
    const float* eg = ek + C + 1;
    // S^T as bf16 A fragments, 8 k steps over Dk
    uint32_t sa[8][4];
#pragma unroll
    for (int k = 0; k < 8; ++k) wgmma_a_from_acc(sacc, k, sa[k]);
    if constexpr (TF) {
      // -S^T K^T, then S^T Q^T (M = 64 columns, N = 64 tokens, K = Dk), two commit groups: Y^T =
      // V^T + (-S^T K^T) diag(e^gamma) as A fragments and Vn^T = Y^T Tb^T (K = 64 tokens; Tb's plane
      // [tokens][tokens] is the K-major B, as A's below) wait on the first only; S^T Q^T runs under
      // them (O is read after Vn^T's wait)
      float pacc[32];
      fence_acc(pacc, 32);
      fence_acc(oacc, 32);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kDk / 16; ++k) {
        const int po = (k >> 2) * (C * 128) + (k & 3) * 32;  // Dk panel, 16-element step of the K-major K / Q planes
        wgmma_bf16_rs<64, 0, -1>(pacc, sa[k], wgmma_desc(Kb(st) + po), k > 0);  // -S^T K^T
      }
      wgmma_commit();
#pragma unroll
      for (int k = 0; k < kDk / 16; ++k) {
        const int po = (k >> 2) * (C * 128) + (k & 3) * 32;
        wgmma_bf16_rs<64>(oacc, sa[k], wgmma_desc(Qb(st) + po), k > 0);  // S^T Q^T
      }
      wgmma_commit();
      wgmma_wait<1>();  // -S^T K^T's group (groups complete in order); S^T Q^T's may still run
      fence_acc(pacc, 32);
      const bf16* v = Vb(st) + 64 * wg + 16 * wi + gq;
      uint32_t xa[4][4];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int tok = 8 * (i >> 2) + 2 * tq + (i & 1);
        pacc[i] = __bfloat162float(v[tok * Sm::kVLd + 8 * ((i >> 1) & 1)]) + eg[tok] * pacc[i];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma_a_from_acc(pacc, k, xa[k]);
      fence_acc(vacc, 32);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < C / 16; ++k) wgmma_bf16_rs<64>(vacc, xa[k], wgmma_desc(Wb(st) + 32 * k), k > 0);  // Y^T Tb^T
      wgmma_commit();
      // S^T's decay for the state update under the two groups in flight (they read sa, a copy)
      const float eC = ek[C];
#pragma unroll
      for (int i = 0; i < 64; ++i) sacc[i] *= eC;
      wgmma_wait<0>();
      fence_acc(vacc, 32);
      fence_acc(oacc, 32);
    } else {
      // U^T into Vn^T's accumulator: vacc[4 jj + 2 h + cc] = U[token 8 jj + 2 tq + cc][column c0_col + 16 wi + gq + 8 h]
      const float* u = Ub(st) + 64 * wg + 16 * wi + gq;
#pragma unroll
      for (int i = 0; i < 32; ++i) vacc[i] = u[(8 * (i >> 2) + 2 * tq + (i & 1)) * Sm::kULd + 8 * ((i >> 1) & 1)];
      fence_acc(vacc, 32);
      fence_acc(oacc, 32);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kDk / 16; ++k) {
        const int po = (k >> 2) * (C * 128) + (k & 3) * 32;  // Dk panel, 16-element step of the K-major W / Q planes
        wgmma_bf16_rs<64, 0, -1>(vacc, sa[k], wgmma_desc(Wb(st) + po), true);  // U^T - S^T W^T
        wgmma_bf16_rs<64>(oacc, sa[k], wgmma_desc(Qb(st) + po), k > 0);        // S^T Q^T
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(vacc, 32);
      fence_acc(oacc, 32);
    }
    // columns of the 64 x 64 accumulators are tokens: O^T's times e^gamma, Vn's decayed copy
    uint32_t va[4][4], vd[4][4];
    {
      float dec[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int tok = 8 * (i >> 2) + 2 * tq + (i & 1);
        oacc[i] *= eg[tok];
        dec[i] = vacc[i] * ek[tok];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma_a_from_acc(vacc, k, va[k]);
        wgmma_a_from_acc(dec, k, vd[k]);
      }
    }
    if constexpr (!TF) {
      const float eC = ek[C];
#pragma unroll
      for (int i = 0; i < 64; ++i) sacc[i] *= eC;
    }
    fence_acc(sacc, 64);
    fence_acc(oacc, 32);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < C / 16; ++k) {
      wgmma_bf16_rs<64>(oacc, va[k], wgmma_desc(Ab(st) + 32 * k), true);                          // O^T += Vn^T A^T
      wgmma_bf16_rs<128, 1>(sacc, vd[k], wgmma_desc_nmajor(Kb(st) + 2048 * k, kPanel), true);      // S^T += Vn'^T K
    }
    wgmma_commit();
    if (warp < 4 && c + 1 < ce) next_decays(c + 1, st ^ 1);  // while these run (no accumulator or fragment touched)
    wgmma_wait<0>();
    fence_acc(sacc, 64);
    fence_acc(oacc, 32);
    // O^T out: oacc[4 jj + 2 h + cc] is O at token 8 jj + 2 tq + cc, column c0_col + 16 wi + gq + 8 h
    if constexpr (NORM) {
      // O's tile over the stage's Q, K and A planes: both warpgroups' products must be done with them
      __syncthreads();
      float* ot = reinterpret_cast<float*>(Qb(st)) + 64 * wg + 16 * wi + gq;
#pragma unroll
      for (int i = 0; i < 32; ++i) ot[(8 * (i >> 2) + 2 * tq + (i & 1)) * Sm::kOLd + 8 * ((i >> 1) & 1)] = oacc[i];
      __syncthreads();
      // a warp a token: gated_norm128_k's row (value head j, all 128 columns), act instead of O;
      // the next chunk's first barrier keeps this stage's tile and z until every warp is done
      const float* ob = reinterpret_cast<const float*>(Qb(st));
      const float* zb = Zb(st);
      for (int tok = warp; tok < n; tok += kThreads / 32) {
        const float4 x = *reinterpret_cast<const float4*>(ob + tok * Sm::kOLd + 4 * lane);
        float4 zz = *reinterpret_cast<const float4*>(zb + tok * Sm::kUCols + 4 * lane);
        if (sc.gn.zs.rs) zz = fp8_scaled4(zz, sc.gn.zs.rs[t0 + tok], gn_cs);
        reinterpret_cast<uint2*>(sc.gn.act + (t0 + tok) * value_dim + j * Dv)[lane] = gated_norm128_values(x, gn_w, zz, sc.gn.eps);
      }
    } else {
      float* orow = o + t0 * value_dim + j * Dv + c0_col + 16 * wi + gq;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int tok = 8 * (i >> 2) + 2 * tq + (i & 1);
        if (tok < n) orow[int64_t(tok) * value_dim + 8 * ((i >> 1) & 1)] = oacc[i];
      }
    }
  }
  cp_async_wait_all();
  if (ch.seq_chunk[s + 1] > ce) store_s(sc.state_out);
  else if (sc.snap_chunk && sc.snap_chunk[s] == ce) store_s(sc.seq_state_out[s] + sc.layer_off);
#endif
}

// The chunk prep on the same wgmmas (GdnPath::Wgmma's prep): the outputs of the 3xTF32 prep
// (gdn_chunk_prep_tc_k in kernels_gdn.cu), U in fp32, W and A as planes for the scan, one CTA
// (two warpgroups) per (chunk, value head):
//   1. Q, K as planes [tokens][Dk], from global memory;
//   2. K K^T (warpgroup 0) and Q K^T (warpgroup 1), 24 wgmma m64n64k16 each; gated into Lm
//      (fp32, shared) and A (planes, global);
//   3. (beta e^gamma K) and (beta V) as planes [tokens][Dk / Dv] over Q's and K's (row loads, as
//      in 1.), T = (I + Lm)^-1 (gdn_tiles.cuh's, as the 3xTF32 prep), T as planes over Lm;
//   4. U = T (beta V) (warpgroup 0) and W = T (beta e^gamma K) (warpgroup 1), 12 wgmma
//      m64n128k16 each, B read N-major; U to global in fp32, W as planes.
// Item e of the prep's plane loops, eight values of one plane row: items [0, C Dk / 8) are the
// first matrix's, the rest the second's; row (the token) and col (a multiple of 8) of a
// [tokens][Dk] plane (Q and K in step 1, beta e^gamma K and beta V in step 3; Dv = Dk).
struct PlaneItem {
  bool first;
  int row, col;
};
__device__ __forceinline__ PlaneItem token_item(int e) {
  const bool first = e < C * kDk / 8;
  const int ee = first ? e : e - C * kDk / 8;
  return {first, ee / (kDk / 8), (ee % (kDk / 8)) * 8};
}

struct PrepSmem {
  static constexpr int ldl = C + 4;
  // A matrix's planes in shared memory: hi and lo (bf16x3), or hi alone (one pass)
  static constexpr int plane(bool x3) { return x3 ? kTile : kTile / 2; }
  // R1 (two matrices' planes): Q's and K's, then (beta e^gamma K)'s and (beta V)'s; Lm (fp32),
  // then T's planes; T (fp32); P; beta, beta e^gamma; gamma; 1 KB to align. bf16x3 ~103 KB: two
  // CTAs an SM; one pass ~72 KB: three (the prep waits on latency: more CTAs hide more of it).
  static size_t bytes(bool x3) { return 1024 + 2 * size_t(plane(x3)) + sizeof(float) * (2 * C * ldl + 3 * 256 + 2 * C) + sizeof(double) * C; }
  // The T form's: T (fp32) and P over Q's and K's planes, which step 2 is done with when the
  // inverse begins (Lm cannot go there: warpgroup 0 writes it while warpgroup 1's products may
  // still read them). ~51 KB: four CTAs an SM, or two beside a register-state scan CTA.
  static constexpr size_t bytes_tf() { return 1024 + 2 * size_t(plane(false)) + sizeof(float) * (C * ldl + 2 * C) + sizeof(double) * C; }
  static_assert(sizeof(float) * (C * ldl + 3 * 256) <= 2 * size_t(kTile / 2), "TF: T and P fit in Q's and K's planes");
};

// Eight consecutive values of a mixed row (fp32: two 16-byte loads; bf16: one), zeros when `in` is
// false. From bf16 the values are exact in fp32, so a plane made from them is the plane the fp32
// row's bf16 rounding would give: Q's and K's planes are the same bits either way.
__device__ __forceinline__ void load8(const float* p, bool in, float (&v)[8]) {
  const float4 a = in ? reinterpret_cast<const float4*>(p)[0] : make_float4(0, 0, 0, 0);
  const float4 b = in ? reinterpret_cast<const float4*>(p)[1] : make_float4(0, 0, 0, 0);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, bool in, float (&v)[8]) {
  const uint4 q = in ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// V2 (the product's; CLEFRT_LAB_GDN_PREP=v1 runs the first form; one pass from bf16 rows only):
// q, k and v loaded once, by cp.async straight into their planes (a bf16 row's eight values are
// one 16-byte chunk of a plane), v into Q's slot after step 2 (landing under the inverse); beta
// folded onto T's columns, U = (T diag beta) V and W = (T diag(beta e^gamma)) K (FlashInfer's
// placement), where the form before scales K's and V's rows and loads them a second time in step
// 3. A, Q's and K's planes keep their bits; U and W round differently (one bf16 pass either way).
// TF (the T form, with V2; gdn_scan_rs_k's TF says what the scan does instead): steps 1-3 without
// V and without the scan's Q and K planes, T diag(beta) as a plane into W's bytes (V2's bits of
// it), no step 4.
template <bool X3, typename In, bool V2 = false, bool TF = false>
__global__ void __launch_bounds__(256, X3 ? 2 : TF ? 4 : 3) gdn_prep_wgmma_k(const In* mixed, int64_t conv_dim, int64_t Hk, int64_t Hv, const float* g,
                                                           const float* beta, GdnChunks ch, GdnScratch sc) {
  static_assert(!V2 || (!X3 && sizeof(In) == 2), "V2: one bf16 pass from bf16 rows");
  static_assert(!TF || V2, "TF: the second form's loads");
#ifndef CLEFRT_WGMMA
  __trap();  // other architectures of a fat binary: never launched there (gdn_wgmma_available)
#else
  pdl_wait();
  constexpr int Dk = 128, Dv = 128, ldl = PrepSmem::ldl;
  static_assert(C * ldl * 4 >= kSmallTile && (C * ldl * 4) % 1024 == 0, "T's planes go over Lm, whose end keeps 1 KB alignment");
  extern __shared__ uint8_t smem_raw[];
  // the tiles on 1024-byte boundaries (the swizzle is computed from address bits), as an offset
  // from smem_raw: a pointer rebuilt from an integer loses its address space, and every access
  // through it compiled to a generic load or store (ld / st, not ld.shared / st.shared)
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  constexpr int kPlane = PrepSmem::plane(X3);  // one matrix's planes (the lo plane, when X3, kTile / 2 after the hi)
  uint8_t* Qp = base;                    // [64 tokens][128 Dk]
  uint8_t* Kp = Qp + kPlane;             // [64 tokens][128 Dk]
  uint8_t* Ks = V2 ? Kp : base;          // after 2: (beta e^gamma K) [64 tokens][128 Dk] (V2: K itself)
  uint8_t* Vp = V2 ? base : base + kPlane;  // after 2: (beta V) [64 tokens][128 Dv] (V2: V, over Q's)
  float* Lm = reinterpret_cast<float*>(base + 2 * kPlane);  // [C][ldl]
  uint8_t* Tp = reinterpret_cast<uint8_t*>(Lm);             // after the inverse: [64 tokens][64 tokens]
  uint8_t* Tk = Tp + kSmallTile / 2;                        // V2: T diag(beta) at Tp, T diag(beta e^gamma) here
  float* T = TF ? reinterpret_cast<float*>(base) : Lm + C * ldl;  // [C][ldl] (TF: over Q's and K's planes, PrepSmem::bytes_tf)
  float* P = T + C * ldl;                                   // [3][16][16]
  float* bs = TF ? Lm + C * ldl : P + 3 * 256;              // beta_i
  float* sk = bs + C;                                       // beta_i e^gamma_i
  double* gam = reinterpret_cast<double*>(sk + C);

  // The items (chunk of the pass ci, value head j) in the order w = ci Hv + j: one a CTA on the
  // grid (Hv, chunks), or in turn on a persistent grid (the T form's overlap with the scan,
  // GdnScratch::ready). Value heads vary fastest: the CTAs of one chunk's key head (Hv / Hk value
  // heads) run together and read its Q and K rows once from DRAM, later ones from L2 (chunks
  // fastest, the earlier order, let a key head's later value heads miss L2 at many chunks).
  const int64_t n_items = ((sc.c1 < 0 ? ch.n_chunks : sc.c1) - sc.c0) * Hv, stride = int64_t(gridDim.x) * gridDim.y;
  if (TF && sc.ready) pdl_launch_dependents();  // the scan may start now: it waits on each item's flag
#pragma unroll 1
  for (int64_t w = blockIdx.x + int64_t(gridDim.x) * blockIdx.y; w < n_items; w += stride) {
    const int64_t ci = w / Hv, c = sc.c0 + ci, j = w % Hv;
    const int64_t t0 = ch.chunk_start[c];
    const int n = ch.chunk_len[c];
    const int64_t kh = j / (Hv / Hk), key_dim = Hk * Dk;
    // the first value head of each key head also writes the scan's Q and K planes of (chunk, key
    // head) from the values it loads anyway (a kernel of their own read them again: ~10% of the scan)
    const bool lead = j % (Hv / Hk) == 0;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wi = warp & 3;
    const int gq = lane >> 2, tq = lane & 3;
    const In* rows = mixed + t0 * conv_dim;

    // 1. Q and K as [tokens][Dk] planes, their loads first (the setup below needs none of them and
    // had a barrier of its own before them). A thread's items (eight floats each, two float4 loads:
    // conv_dim % 4 == 0 at Dk = Dv = 128) load kPer at a time before any is stored: two global
    // latencies in a row instead of eight (all eight at once spill).
    constexpr int kItems = 2 * C * Dk / 8, kPer = 4;
    static_assert(kItems % (kPer * 256) == 0, "the plane loops give each of 256 threads whole batches of kPer items");
    // V2: a [64 tokens][128] plane of the rows' columns col0 .. col0 + 127 by cp.async, rows past n
    // zero-filled (the bits put8 writes: a bf16 value rounds to itself)
    auto plane_copy = [&](uint8_t* dst, int64_t col0) {
      for (int e = tid; e < C * 16; e += 256) {
        const int row = e >> 4, col = (e & 15) * 8;
        const bool in = row < n;
        cp_async16(dst + kmajor_off(row, col, C), in ? rows + row * conv_dim + col0 + col : rows, in);
      }
    };
    if constexpr (V2) {
      plane_copy(Qp, kh * Dk);
      plane_copy(Kp, key_dim + kh * Dk);
      cp_async_commit();
    }
    for (int e0 = tid; !V2 && e0 < kItems; e0 += kPer * 256) {
      float v[kPer][8];
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const PlaneItem it = token_item(e0 + q * 256);  // Q's (first) or K's: token row, Dk column
        load8(rows + (it.first ? kh * Dk : key_dim + kh * Dk) + it.row * conv_dim + it.col, it.row < n, v[q]);
      }
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const PlaneItem it = token_item(e0 + q * 256);
        put8(it.first ? Qp : Kp, kTile / 2, kmajor_off(it.row, it.col, C), v[q], X3);
        if (lead) put8((it.first ? sc.qp : sc.kp) + (ci * Hk + kh) * kTile, kTile / 2, kmajor_off(it.row, it.col, C), v[q], X3);  // the scan's Q, K
      }
    }
    // the setup: T zeroed for the inverse, beta, the chunk's gammas (visible after the barrier below)
    // (TF: T lies over the planes, and the plane write below takes T's upper triangle as zeros)
    for (int e = tid; !TF && e < C * ldl; e += nt) T[e] = 0.0f;
    if (tid < C) bs[tid] = tid < n ? beta[(t0 + tid) * Hv + j] : 0.0f;
    chunk_gamma(gam, g, t0, n, Hv, j);
    if constexpr (V2) cp_async_wait<0>();  // this thread's plane chunks (the barrier makes all of them visible)
    fence_proxy_async();
    __syncthreads();
    if (tid < C) sk[tid] = bs[tid] * float(exp(gam[tid]));  // read in step 3, after step 2's barrier
    if constexpr (V2 && !TF) {
      if (lead) {  // the scan's Q and K planes: the bytes just loaded
        uint4* qd = reinterpret_cast<uint4*>(sc.qp + (ci * Hk + kh) * kTile);
        uint4* kd = reinterpret_cast<uint4*>(sc.kp + (ci * Hk + kh) * kTile);
        for (int e = tid; e < kTile / 2 / 16; e += 256) {
          qd[e] = reinterpret_cast<const uint4*>(Qp)[e];
          kd[e] = reinterpret_cast<const uint4*>(Kp)[e];
        }
      }
    }
    // 2. K K^T (warpgroup 0), Q K^T (warpgroup 1): M = 64 tokens i, N = 64 tokens j, K = Dk
    {
      float acc[32];
      const uint8_t* Ap = wg == 0 ? Kp : Qp;
      for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < Dk / 16; ++k) {
        const int po = (k >> 2) * (C * 128) + (k & 3) * 32;
        const uint64_t ah = wgmma_desc(Ap + po), al = wgmma_desc(Ap + kTile / 2 + po);
        const uint64_t bh = wgmma_desc(Kp + po), bl = wgmma_desc(Kp + kTile / 2 + po);
        wgmma_planes<X3, 64>(acc, ah, al, bh, bl, k > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ii = 16 * wi + gq + 8 * h, jc = 8 * jj + 2 * tq;
          float x[2];
          for (int cc = 0; cc < 2; ++cc) {
            const float G = ii >= jc + cc ? expf(float(gam[ii] - gam[jc + cc])) : 0.0f;
            x[cc] = wg == 0 ? (ii > jc + cc ? bs[ii] * acc[4 * jj + 2 * h + cc] * G : 0.0f) : (ii >= jc + cc ? acc[4 * jj + 2 * h + cc] * G : 0.0f);
          }
          if (wg == 0) {
            Lm[ii * ldl + jc] = x[0];
            Lm[ii * ldl + jc + 1] = x[1];
          } else {
            put_pair(sc.ap + (ci * Hv + j) * kSmallTile, kSmallTile / 2, ii, jc, C, x[0], x[1], X3);
          }
        }
    }
    __syncthreads();  // Lm whole; Q's and K's planes read by both warpgroups
    // 3. beta e^gamma K and beta V as [tokens][Dk / Dv] planes (over Q's and K's; row loads and
    // items as in 1.: step 4 reads them N-major), T = (I + Lm)^-1, T's planes over Lm. V2: V's
    // plane by cp.async over Q's and no second load of K; T's planes scaled by column, T diag(beta)
    // and T diag(beta e^gamma), over Lm
    static_assert(C * (Dk + Dv) / 8 == kItems && Dv == Dk, "K's and V's planes take the items of Q's and K's");
    if constexpr (V2 && !TF) {  // V into Q's slot (step 2's wgmmas are done with it), under the inverse
      plane_copy(Vp, 2 * key_dim + j * Dv);
      cp_async_commit();
    }
    for (int e0 = tid; !V2 && e0 < kItems; e0 += kPer * 256) {
      float v[kPer][8];
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const PlaneItem it = token_item(e0 + q * 256);  // K's (first) or V's: token row, Dk / Dv column
        load8(rows + (it.first ? key_dim + kh * Dk : 2 * key_dim + j * Dv) + it.row * conv_dim + it.col, it.row < n, v[q]);
      }
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const PlaneItem it = token_item(e0 + q * 256);
        // the token's scale; past n the values and the scale (beta) are zero: the product is the
        // 0 they were written as
        const float sv = (it.first ? sk : bs)[it.row];
#pragma unroll
        for (int m = 0; m < 8; ++m) v[q][m] = sv * v[q][m];
        put8(it.first ? Ks : Vp, kTile / 2, kmajor_off(it.row, it.col, C), v[q], X3);
      }
    }
    invert_unit_lower(Lm, T, P, ldl, tid, nt);
    if constexpr (TF) {  // T diag(beta)'s plane into W's bytes of (chunk, value head): the scan's operand; done
      uint8_t* tg = sc.wp + (ci * Hv + j) * kTile;
      for (int e = tid; e < C * C / 2; e += nt) {
        const int i = e / (C / 2), k = (e % (C / 2)) * 2;
        // the inverse writes the lower triangle and the diagonal only: above it T is zero (the other
        // forms zero T first; here it lies over Q's and K's planes)
        put_pair(tg, kSmallTile / 2, i, k, C, k <= i ? T[i * ldl + k] * bs[k] : 0.0f, k + 1 <= i ? T[i * ldl + k + 1] * bs[k + 1] : 0.0f, false);
      }
      if (sc.ready) {  // the item's planes (A's in step 2, T's here) written: its flag for the scan
        __syncthreads();
        if (tid == 0) {
          __threadfence();
          st_release_gpu(sc.ready + ci * Hv + j, 1);
        }
      }
    } else {  // T's planes in shared memory and step 4
    for (int e = tid; e < C * C / 2; e += nt) {
      const int i = e / (C / 2), k = (e % (C / 2)) * 2;
      if constexpr (V2) {  // T's columns times beta and beta e^gamma (zero past n: beta is)
        put_pair(Tp, kSmallTile / 2, i, k, C, T[i * ldl + k] * bs[k], T[i * ldl + k + 1] * bs[k + 1], false);
        put_pair(Tk, kSmallTile / 2, i, k, C, T[i * ldl + k] * sk[k], T[i * ldl + k + 1] * sk[k + 1], false);
      } else {
        put_pair(Tp, kSmallTile / 2, i, k, C, T[i * ldl + k], T[i * ldl + k + 1], X3);
      }
    }
    if constexpr (V2) cp_async_wait<0>();  // V's plane
    fence_proxy_async();
    __syncthreads();
    // 4. U = T (beta V) (warpgroup 0), W = T (beta e^gamma K) (warpgroup 1) (V2: U = (T diag beta) V,
    // W = (T diag(beta e^gamma)) K, the same products rounded elsewhere): M = 64 tokens, N = 128
    // in two 64-wide halves (a half's accumulators, 32 a thread, are what lets one pass fit three
    // CTAs an SM: at most 80 registers; an m64n128 wgmma alone needs ~90), K = 64 tokens
    float* u = sc.u + (ci * Hv + j) * C * Dv;
    uint8_t* wpl = sc.wp + (ci * Hv + j) * kTile;
    const uint8_t* Bp = wg == 0 ? Vp : Ks;
    const uint8_t* Ap = V2 && wg == 1 ? Tk : Tp;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      float acc[32];
      for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < C / 16; ++k) {
        const uint64_t ah = wgmma_desc(Ap + 32 * k), al = wgmma_desc(Ap + kSmallTile / 2 + 32 * k);
        // B [tokens][Dv or Dk] N-major (k = token): tokens 16 k on, the half's 64-wide panel
        const uint8_t* bp = Bp + kPanel * half + 2048 * k;
        const uint64_t bh = wgmma_desc_nmajor(bp, kPanel), bl = wgmma_desc_nmajor(bp + kTile / 2, kPanel);
        wgmma_planes<X3, 64, 1>(acc, ah, al, bh, bl, k > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      for (int i = 0; i < 32; ++i) fence_operand(acc[i]);
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ii = 16 * wi + gq + 8 * h, col = 64 * half + 8 * jj + 2 * tq;
          if (wg == 0) *reinterpret_cast<float2*>(u + ii * Dv + col) = make_float2(acc[4 * jj + 2 * h], acc[4 * jj + 2 * h + 1]);
          else put_pair(wpl, kTile / 2, ii, col, C, acc[4 * jj + 2 * h], acc[4 * jj + 2 * h + 1], X3);
        }
    }
    }
  if (w + stride < n_items) __syncthreads();  // this item's readers of shared memory done
  }
#endif
}

}  // namespace

// Whether Auto picks the Wgmma path where it is available: on. The GPU suite checks it against the
// 3xTF32 path and the CPU, and the lab measures it no slower at every shape it runs
// (bench/results/2026-12-05-h200-session24.md). --portable-kernels keeps the 3xTF32 path.
bool gdn_wgmma_default() { return true; }

namespace {
// -1: not yet read from the environment, else 0 / 1
std::atomic<int> g_one_pass{-1}, g_scan_regs{-1};

// A lab switch's cell (-1: not yet read), filled by read() when first asked; a setter's value, or
// another thread's first read, wins over this one's.
template <typename Read>
int read_once(std::atomic<int>& cell, Read read) {
  int v = cell.load();
  if (v < 0) {
    int unread = -1;
    cell.compare_exchange_strong(unread, read());
    v = cell.load();
  }
  return v;
}

// A switch read from the environment when first asked: 0 for `off`, 1 for `on`, `unset` when the
// variable is unset; anything else a usage error naming the variable and `usage`. Set later by the
// setters.
int env_switch(std::atomic<int>& cell, const char* var, const char* off, const char* on, int unset, const char* usage) {
  return read_once(cell, [&] {
    const char* e = std::getenv(var);
    const std::string want = e ? e : "";
    if (!want.empty() && want != off && want != on) throw Error(Status::BadRequest, "usage", std::string(var) + " is '" + want + "': " + usage);
    return want.empty() ? unset : int(want == on);
  });
}
}  // namespace

bool gdn_wgmma_one_pass_bf16() {
  return env_switch(g_one_pass, "CLEFRT_GDN_PRODUCTS", "bf16x3", "bf16", 1, "bf16 (one pass, the default) or bf16x3") == 1;
}

void gdn_wgmma_set_one_pass_bf16(bool on) { g_one_pass.store(on ? 1 : 0); }

namespace {
std::atomic<int> g_prep_v2{-1};
}  // namespace

bool gdn_wgmma_prep_v2() {
  return env_switch(g_prep_v2, "CLEFRT_LAB_GDN_PREP", "v1", "v2", 1, "v2 (the product's prep: q / k / v by cp.async, beta on T) or v1 (the first form)") == 1;
}

void gdn_wgmma_set_prep_v2(bool on) { g_prep_v2.store(on ? 1 : 0); }

namespace {
std::atomic<int> g_t_form{-1};
}  // namespace

namespace {
// 0: the W / U form; 1: the T form, asked for (CLEFRT_LAB_GDN_FORM=t, gdn_wgmma_set_t_form); 2: the
// T form by default, which the planes scan (CLEFRT_GDN_SCAN=planes) turns back to the W / U form
// where an explicit t with it is a usage error
int t_form_mode() {
  return env_switch(g_t_form, "CLEFRT_LAB_GDN_FORM", "wu", "t", 2,
                    "t (the product's: the prep leaves T diag(beta), the scan forms Vn from V) or wu (the prep forms W and U)");
}
// The T form runs for this call: bf16 rows, the switch, the register-state scan; the prep and the
// scan both ask, so they agree. t asked for with the planes scan: a usage error.
bool t_form_runs(const GdnScratch& sc) {
  if (!sc.mixed16 || t_form_mode() == 0) return false;
  if (gdn_wgmma_scan_regs()) return true;
  if (t_form_mode() == 1)
    throw Error(Status::BadRequest, "usage", "CLEFRT_LAB_GDN_FORM=t runs the register-state scan only: not with CLEFRT_GDN_SCAN=planes");
  return false;
}
}  // namespace

bool gdn_wgmma_t_form() { return t_form_mode() != 0; }

void gdn_wgmma_set_t_form(bool on) { g_t_form.store(on ? 1 : 0); }

bool gdn_wgmma_scan_regs() {
  // 0 planes, 1 regs, 2 by the products
  const int v = env_switch(g_scan_regs, "CLEFRT_GDN_SCAN", "planes", "regs", 2,
                           "regs (the state as wgmma's register operand, one bf16 pass's default) or planes");
  const bool one_pass = gdn_wgmma_one_pass_bf16();
  if (v == 1 && !one_pass)
    throw Error(Status::BadRequest, "usage", "CLEFRT_GDN_SCAN=regs runs one bf16 pass only: not with CLEFRT_GDN_PRODUCTS=bf16x3");
  return v == 2 ? one_pass : v == 1;
}

void gdn_wgmma_set_scan_regs(int mode) {
  if (mode < 0 || mode > 2) throw Error(Status::BadRequest, "usage", "gdn_wgmma_set_scan_regs: 0 (planes), 1 (regs) or 2 (by the products), not " + std::to_string(mode));
  g_scan_regs.store(mode);
}

namespace {
std::atomic<int> g_scan_rs_wgs{0};  // the lab's choice (1, 2), 0: by shape

// Warpgroups a CTA of the register-state scan: one where two warpgroups a CTA would leave SMs idle
// (fewer (sequence, value head) pairs than SMs: one a CTA runs twice as many CTAs), else two (a
// CTA's planes loaded once for both). The same bits either way.
int gdn_scan_rs_wgs(int64_t n_seqs, int64_t Hv) {
  if (const int forced = g_scan_rs_wgs.load()) return forced;
  return n_seqs * Hv < sm_count() ? 1 : 2;
}
}  // namespace

namespace {
std::atomic<int> g_overlap{-1};

// Prep CTAs an SM of the overlap for this call, 0 where it does not run: the T form (bf16 rows,
// the register-state scan) with its flags planned, one warpgroup a scan CTA (all of the scan's
// CTAs fit beside the prep's: fewer (sequence, value head) pairs than SMs), and the switch on.
// The prep and the scan both ask, so they agree.
int overlap_ctas(const GdnScratch& sc, const GdnChunks& ch, int64_t Hv) {
  if (!sc.ready || !t_form_runs(sc) || gdn_scan_rs_wgs(ch.n_seqs, Hv) != 1) return 0;
  return gdn_wgmma_overlap();
}
}  // namespace

int gdn_wgmma_overlap() {
  return read_once(g_overlap, [] { return int(env_count("CLEFRT_LAB_GDN_OVERLAP", 0, 0, 2)); });
}

void gdn_wgmma_set_overlap(int ctas_per_sm) {
  if (ctas_per_sm < 0 || ctas_per_sm > 2)
    throw Error(Status::BadRequest, "usage", "gdn_wgmma_set_overlap: 0 (off), 1 or 2 prep CTAs an SM, not " + std::to_string(ctas_per_sm));
  g_overlap.store(ctas_per_sm);
}

namespace {
std::atomic<int> g_scan_norm{-1};
}  // namespace

bool gdn_wgmma_scan_norm() {
  return read_once(g_scan_norm, [] { return int(env_count("CLEFRT_LAB_GDN_SCAN_NORM", 0, 0, 1)); }) == 1;
}

void gdn_wgmma_set_scan_norm(bool on) { g_scan_norm.store(on ? 1 : 0); }

bool gdn_scan_norms(const GdnScratch& sc, const GdnChunks& ch, int64_t Hv, int64_t Dk, int64_t Dv, GdnPath path) {
  if (!sc.gn.act || !gdn_wgmma_scan_norm() || gdn_path(path, Dk, Dv) != GdnPath::Wgmma || Dv != kDk) return false;
  if (!gdn_wgmma_scan_regs() || !t_form_runs(sc) || gdn_scan_rs_wgs(ch.n_seqs, Hv) != 2) return false;
  return sc.gn.z && sc.gn.w && sc.gn.ldz % 4 == 0 && aligned16(sc.gn.z) && aligned16(sc.gn.w) && reinterpret_cast<uintptr_t>(sc.gn.act) % 8 == 0 &&
         (!sc.gn.zs.rs || (sc.gn.zs.cs && aligned16(sc.gn.zs.cs)));
}

void gdn_wgmma_set_scan_rs_wgs(int wgs) {
  if (wgs < 0 || wgs > 2) throw Error(Status::BadRequest, "usage", "gdn_wgmma_set_scan_rs_wgs: 0 (by shape), 1 or 2, not " + std::to_string(wgs));
  g_scan_rs_wgs.store(wgs);
}

bool gdn_wgmma_built(int64_t Dk, int64_t Dv) {
#ifdef CLEFRT_SM90A
  return Dk == kDk && Dv == kDk;  // the prep's U and W tiles are 128 wide
#else
  (void)Dk, (void)Dv;
  return false;
#endif
}

bool gdn_wgmma_available(int64_t Dk, int64_t Dv) { return gdn_wgmma_built(Dk, Dv) && sm90a_kernels_run_here(); }

GdnPlaneBytes gdn_plane_bytes(int64_t Hk, int64_t Hv) { return {Hv * kTile, Hv * kSmallTile, Hk * kTile, Hk * kTile}; }

namespace {
void require_wgmma(const char* op, int64_t Dk, int64_t Dv) {
  if (!gdn_wgmma_available(Dk, Dv))
    throw Error(Status::Internal, "internal_error",
                std::string(op) + ": the Wgmma path needs an sm_90a build on a compute capability 9.0 GPU and Dk = Dv = 128 (Dk " +
                    std::to_string(Dk) + ", Dv " + std::to_string(Dv) + ")");
}
}  // namespace

void gdn_chunk_prep_wgmma(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const float* beta,
                          const GdnChunks& ch, const GdnScratch& sc, cudaStream_t s) {
  require_wgmma("gdn_chunk_prep", Dk, Dv);
  if (!sc.wp || !sc.ap || !sc.qp || !sc.kp || !sc.u)
    throw Error(Status::Internal, "internal_error", "gdn_chunk_prep: the wgmma prep's W / A / Q / K planes are not planned");
  static const bool attr = [] {
    // each form's shared memory (bf16x3's planes twice one pass's), and the whole carveout as
    // shared memory: the CTAs an SM (two, three) are counted on it
    for (const auto& [k, x3] : {std::pair{(const void*)gdn_prep_wgmma_k<true, float>, true}, {(const void*)gdn_prep_wgmma_k<false, float>, false},
                                {(const void*)gdn_prep_wgmma_k<false, bf16>, false}, {(const void*)gdn_prep_wgmma_k<false, bf16, true>, false},
                                {(const void*)gdn_prep_wgmma_k<false, bf16, true, true>, false}}) {
      check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(PrepSmem::bytes(x3))), "gdn_prep_wgmma smem");
      check(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)), "gdn_prep_wgmma carveout");
    }
    return true;
  }();
  (void)attr;
  const int64_t c1 = sc.c1 < 0 ? ch.n_chunks : sc.c1;
  if (c1 == sc.c0) return;
  if (c1 - sc.c0 > 65535)
    throw Error(Status::Internal, "internal_error", "gdn_chunk_prep: " + std::to_string(c1 - sc.c0) + " chunks in one pass (a grid's y holds 65,535)");
  const dim3 grid(unsigned(Hv), unsigned(c1 - sc.c0));
  const int64_t conv_dim = 2 * Hk * Dk + Hv * Dv;
  const bool one_pass = gdn_wgmma_one_pass_bf16();
  if (sc.mixed16 && !one_pass)
    throw Error(Status::Internal, "internal_error", "gdn_chunk_prep: bf16 mixed rows (GdnScratch::mixed16) need the one-pass products, not bf16x3");
  if (t_form_runs(sc)) {
    // the overlap: the flags cleared, then a persistent grid the scan's CTAs fit beside
    // (overlap_ctas); else one CTA an item and no flags
    const int ov = overlap_ctas(sc, ch, Hv);
    GdnScratch scp = sc;
    if (!ov) scp.ready = nullptr;
    const int64_t items = (c1 - sc.c0) * Hv;
    if (ov) check(cudaMemsetAsync(sc.ready, 0, size_t(items) * sizeof(int), s), "gdn prep flags");
    const dim3 pgrid = ov ? dim3(unsigned(std::min<int64_t>(items, int64_t(ov) * sm_count()))) : grid;
    launch_after("gdn_prep_wgmma", gdn_prep_wgmma_k<false, bf16, true, true>, pgrid, 256, PrepSmem::bytes_tf(), s, sc.mixed16, conv_dim, Hk, Hv,
                 g, beta, ch, scp);
  } else if (sc.mixed16 && gdn_wgmma_prep_v2())
    launch_after("gdn_prep_wgmma", gdn_prep_wgmma_k<false, bf16, true>, grid, 256, PrepSmem::bytes(false), s, sc.mixed16, conv_dim, Hk, Hv, g, beta,
                 ch, sc);
  else if (sc.mixed16)
    launch_after("gdn_prep_wgmma", gdn_prep_wgmma_k<false, bf16>, grid, 256, PrepSmem::bytes(false), s, sc.mixed16, conv_dim, Hk, Hv, g, beta, ch,
                 sc);
  else if (one_pass)
    gdn_prep_wgmma_k<false, float><<<grid, 256, PrepSmem::bytes(false), s>>>(mixed, conv_dim, Hk, Hv, g, beta, ch, sc);
  else
    gdn_prep_wgmma_k<true, float><<<grid, 256, PrepSmem::bytes(true), s>>>(mixed, conv_dim, Hk, Hv, g, beta, ch, sc);
  check_launch("gdn_prep_wgmma");
}

void gdn_chunk_scan_wgmma(const float* mixed, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, const float* g, const GdnChunks& ch,
                          const GdnScratch& sc, float* o, cudaStream_t s) {
  require_wgmma("gdn_chunk_scan", Dk, Dv);
  if (!sc.wp || !sc.ap || !sc.qp || !sc.kp) throw Error(Status::Internal, "internal_error", "gdn_chunk_scan: the wgmma scan's planes are not planned");
  static const bool attr = [] {
    for (const void* k : {(const void*)gdn_scan_wgmma_k<true>, (const void*)gdn_scan_wgmma_k<false>})
      check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanSmem::bytes())), "gdn_scan_wgmma smem");
    return true;
  }();
  (void)attr;
  (void)mixed;  // the prep made Q's and K's planes from it
  const int64_t c1 = sc.c1 < 0 ? ch.n_chunks : sc.c1;
  if (c1 == sc.c0) return;
  // the T form where the prep took it (from bf16 rows): the scan reads the rows and T's planes
  const bool t_form = t_form_runs(sc);
  if (gdn_wgmma_scan_regs()) {
    static const bool rs_attr = [] {
      check(cudaFuncSetAttribute(gdn_scan_rs_k<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanRsSmem<1>::bytes())), "gdn_scan_rs smem");
      check(cudaFuncSetAttribute(gdn_scan_rs_k<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanRsSmem<2>::bytes())), "gdn_scan_rs smem");
      check(cudaFuncSetAttribute(gdn_scan_rs_k<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanRsSmem<1, true>::bytes())),
            "gdn_scan_rs smem");
      check(cudaFuncSetAttribute(gdn_scan_rs_k<2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanRsSmem<2, true>::bytes())),
            "gdn_scan_rs smem");
      check(cudaFuncSetAttribute(gdn_scan_rs_k<2, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ScanRsSmem<2, true, true>::bytes())),
            "gdn_scan_rs smem");
      return true;
    }();
    (void)rs_attr;
    const bool one_wg = gdn_scan_rs_wgs(ch.n_seqs, Hv) == 1;
    GdnScratch scs = sc;
    if (!overlap_ctas(sc, ch, Hv)) scs.ready = nullptr;
    if (t_form && one_wg && scs.ready)  // the overlap: begins as the prep does, waits on its flags
      launch_programmatic("gdn_scan_rs", gdn_scan_rs_k<1, true>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 64)), 128,
                          ScanRsSmem<1, true>::bytes(), s, g, Hk, Hv, Dv, ch, scs, o);
    else if (t_form && gdn_scan_norms(sc, ch, Hv, Dk, Dv, GdnPath::Wgmma))  // the gated norm in its epilogue: act, no O
      launch_after("gdn_scan_rs", gdn_scan_rs_k<2, true, true>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 128)), 256,
                   ScanRsSmem<2, true, true>::bytes(), s, g, Hk, Hv, Dv, ch, scs, o);
    else if (t_form && one_wg)
      launch_after("gdn_scan_rs", gdn_scan_rs_k<1, true>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 64)), 128, ScanRsSmem<1, true>::bytes(),
                   s, g, Hk, Hv, Dv, ch, scs, o);
    else if (t_form)
      launch_after("gdn_scan_rs", gdn_scan_rs_k<2, true>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 128)), 256,
                   ScanRsSmem<2, true>::bytes(), s, g, Hk, Hv, Dv, ch, scs, o);
    else if (one_wg)
      launch_after("gdn_scan_rs", gdn_scan_rs_k<1>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 64)), 128, ScanRsSmem<1>::bytes(), s, g,
                   Hk, Hv, Dv, ch, scs, o);
    else
      launch_after("gdn_scan_rs", gdn_scan_rs_k<2>, dim3(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / 128)), 256, ScanRsSmem<2>::bytes(), s, g,
                   Hk, Hv, Dv, ch, scs, o);
    return;
  }
  const dim3 grid(unsigned(ch.n_seqs), unsigned(Hv), unsigned(Dv / kCols));
  if (gdn_wgmma_one_pass_bf16()) gdn_scan_wgmma_k<false><<<grid, 256, ScanSmem::bytes(), s>>>(g, Hk, Hv, Dv, ch, sc, o);
  else gdn_scan_wgmma_k<true><<<grid, 256, ScanSmem::bytes(), s>>>(g, Hk, Hv, Dv, ch, sc, o);
  check_launch("gdn_scan_wgmma");
}

}  // namespace clefrt::cuda

// The GDN chunked prefill's scan, kernel variants side by side (issue 20), at the 27B model's
// GDN shapes (Hk 16, Hv 48, Dk = Dv = 128) on random inputs normalised as the engine's gdn_prep
// leaves them. Per batch shape (1 x 8,192, 8 x 1,024, 64 x 512 tokens; CUDA events, median of
// 20 after 3 warm-ups, one layer):
//   prep           gdn_chunk_prep (the product's tensor-core form)
//   scan           the product's gdn_chunk_scan: the state kernel, then the output kernel
//   fused          this file's variant: one kernel, each chunk's output formed in the walk
//   simt           the product's CUDA-core scan (GdnPath::Simt)
// and whether each variant's output equals the product's in every bit (the split must keep the
// bits). The rate is the chunk algorithm's useful FLOPs (each 3xTF32 product counted once) over
// the measured bf16 GEMM peak, for scale only. Usage: clefrt_bench_gdn [--commit ID] [--json FILE]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/gdn_tiles.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {
using namespace gdn;

// ---- variant "fused": the product's tensor-core scan until it was split (state kernel + output
// kernel): one kernel walks the chunks and forms each chunk's output in the same loop.
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
  load_state(S, SWP, sc, ch.seq_chunk[s] < cb, j, Dk, Dv, c0_col, sw, tid, nt);
  for (int64_t c = cb; c < ce; ++c) {
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
  if (ch.seq_chunk[s + 1] > ce) store_state(S, SWP, sc, j, Dk, Dv, c0_col, sw, tid, nt);
}

size_t fused_smem_bytes(int64_t Dk) { return ScanTcSmem::bytes(Dk); }

}  // namespace
}  // namespace clefrt::cuda

using namespace clefrt;
using namespace clefrt::cuda;
using bench::median_ms;

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    check(cudaFuncSetAttribute(gdn_chunk_scan_tc_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "fused smem");
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    const int64_t Hk = 16, Hv = 48, Dk = 128, Dv = 128, conv_dim = 2 * Hk * Dk + Hv * Dv;
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t seqs, len;
    };
    for (Shape sh : {Shape{"1x8192", 1, 8192}, Shape{"8x1024", 8, 1024}, Shape{"64x512", 64, 512}}) {
      const int64_t L = sh.seqs * sh.len;
      std::vector<int32_t> cs, cl, sc = {0}, seq_start(size_t(L));
      for (int64_t q = 0; q < sh.seqs; ++q) {
        for (int64_t t = 0; t < sh.len; t += 64) {
          cs.push_back(int32_t(q * sh.len + t));
          cl.push_back(int32_t(std::min<int64_t>(64, sh.len - t)));
        }
        sc.push_back(int32_t(cs.size()));
      }
      const int64_t nc = int64_t(cs.size());
      auto up = [&](const std::vector<int32_t>& v, const char* what) {
        DeviceBuffer b(v.size() * 4, what);
        check(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), what);
        return b;
      };
      DeviceBuffer dcs = up(cs, "chunk starts"), dcl = up(cl, "chunk lengths"), dsc = up(sc, "seq chunks");
      DeviceBuffer mixed(size_t(L * conv_dim) * 4, "mixed"), ba(size_t(L * 2 * Hv) * 4, "b|a"), negA(size_t(Hv) * 4, "negA"),
          dtb(size_t(Hv) * 4, "dt_bias"), g(size_t(L * Hv) * 4, "g"), beta(size_t(L * Hv) * 4, "beta");
      DeviceBuffer w(size_t(nc * Hv * 64 * Dk) * 4, "W"), u(size_t(nc * Hv * 64 * Dv) * 4, "U"), a(size_t(nc * Hv * 64 * 64) * 4, "A"),
          h(size_t(nc * Hv * Dk * Dv) * 4, "h"), o(size_t(L * Hv * Dv) * 4, "o"), o_ref(size_t(L * Hv * Dv) * 4, "o product");
      fill_normal_f32(mixed.as<float>(), L * conv_dim, 21, 0.0f, 1.0f, s);
      fill_normal_f32(ba.as<float>(), L * 2 * Hv, 22, 0.0f, 1.0f, s);
      fill_normal_f32(negA.as<float>(), Hv, 23, -1.0f, 0.3f, s);
      fill_normal_f32(dtb.as<float>(), Hv, 24, 0.0f, 0.5f, s);
      gdn_prep(mixed.as<float>(), conv_dim, L, Hk, Dk, ba.as<float>(), ba.as<float>() + Hv, 2 * Hv, Hv, negA.as<float>(), dtb.as<float>(),
               g.as<float>(), beta.as<float>(), s);
      const GdnChunks ch{dcs.as<int32_t>(), dcl.as<int32_t>(), dsc.as<int32_t>(), nc, sh.seqs};
      const GdnScratch scr{w.as<float>(), u.as<float>(), a.as<float>(), h.as<float>()};
      auto prep = [&] { gdn_chunk_prep(mixed.as<float>(), Hk, Hv, Dk, Dv, g.as<float>(), beta.as<float>(), ch, scr, s); };
      // the product's scan overwrites U with Vn: each timed run starts from a fresh prep, timed apart
      const double t_prep = median_ms(s, prep);
      const double t_prep_scan = median_ms(s, [&] {
        prep();
        gdn_chunk_scan(mixed.as<float>(), Hk, Hv, Dk, Dv, g.as<float>(), ch, scr, o_ref.as<float>(), s);
      });
      const double t_prep_fused = median_ms(s, [&] {
        prep();
        gdn_chunk_scan_tc_k<<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / SW)), 256, fused_smem_bytes(Dk), s>>>(
            mixed.as<float>(), conv_dim, Hk, Hv, Dk, Dv, g.as<float>(), ch, scr, o.as<float>());
      });
      std::vector<uint32_t> ref(size_t(L * Hv * Dv)), got(ref.size());
      auto differing = [&](const DeviceBuffer& b) {
        check(cudaMemcpy(got.data(), b.get(), got.size() * 4, cudaMemcpyDeviceToHost), "copy");
        size_t d = 0;
        for (size_t i = 0; i < got.size(); ++i) d += got[i] != ref[i];
        return d;
      };
      prep();
      gdn_chunk_scan(mixed.as<float>(), Hk, Hv, Dk, Dv, g.as<float>(), ch, scr, o_ref.as<float>(), s);
      check(cudaStreamSynchronize(s), "sync");
      check(cudaMemcpy(ref.data(), o_ref.get(), ref.size() * 4, cudaMemcpyDeviceToHost), "copy");
      prep();
      gdn_chunk_scan_tc_k<<<dim3(unsigned(sh.seqs), unsigned(Hv), unsigned(Dv / SW)), 256, fused_smem_bytes(Dk), s>>>(
          mixed.as<float>(), conv_dim, Hk, Hv, Dk, Dv, g.as<float>(), ch, scr, o.as<float>());
      check_launch("fused scan");
      check(cudaStreamSynchronize(s), "sync");
      const size_t fused_diff = differing(o);
      const double t_prep_simt = median_ms(s, [&] {
        prep();
        gdn_chunk_scan(mixed.as<float>(), Hk, Hv, Dk, Dv, g.as<float>(), ch, scr, o.as<float>(), s, GdnPath::Simt);
      });
      const double t_scan = t_prep_scan - t_prep, t_simt = t_prep_simt - t_prep, t_fused = t_prep_fused - t_prep;
      // useful FLOPs: prep (K K^T, Q K^T, T (beta V), T (beta K)) and scan (W S, Q S, A Vn, K^T Vn) per chunk and head
      const double per_chunk = 2.0 * (2 * 64 * 64 * Dk + 64 * 64 * (Dk + Dv)) + 2.0 * (64 * Dk * Dv * 3 + 64 * 64 * Dv);
      const double flop = per_chunk * double(nc * Hv);
      const double t_all = t_prep + t_scan;
      std::printf("%-7s chunks %4lld | prep %.3f ms | scan %.3f ms (fused %.3f ms, %.2fx; simt %.3f ms) | prep + scan %.3f ms, "
                  "%.1f TFLOP/s = %.3f of the bf16 peak | fused output bits differing from the product's: %zu of %zu\n",
                  sh.name, (long long)nc, t_prep, t_scan, t_fused, t_fused / t_scan, t_simt, t_all, flop / (t_all * 1e-3) / 1e12,
                  flop / (t_all * 1e-3) / 1e12 / hw.peak_bf16_tflops, fused_diff, ref.size());
      json::Value r = json::Value::object();
      r.add("m", json::Value::integer(L));
      r.add("sequences", json::Value::integer(sh.seqs));
      r.add("prep_ms", json::Value::number(t_prep));
      r.add("scan_ms", json::Value::number(t_scan));
      r.add("fused_scan_ms", json::Value::number(t_fused));
      r.add("simt_scan_ms", json::Value::number(t_simt));
      r.add("fused_outputs_differing", json::Value::integer(int64_t(fused_diff)));
      json::Value pts = json::Value::array();
      pts.arr.push_back(std::move(r));
      shapes.arr.push_back(bench::shape_record(sh.name, Hv * Dv, Dk, std::move(pts)));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_gdn", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_gdn: %s\n", e.what());
    return 1;
  }
  return 0;
}

// The FP8 model's narrow bf16 GEMM (issue 20, short requests): the GDN in_proj keeps its a | b
// rows (2 x 48 gate inputs, n 96, k 5,120) in bf16, a cuBLASLt GEMM of its own after the FP8
// part. At the blog's 318 rows the engine's batch-invariant pick takes ~11 us a layer, 48 layers
// (~0.5 ms of a ~22 ms forward: bench/results/2026-12-07-h100-session50.md), on a grid that
// leaves most SMs idle, and cuBLASLt's split-K kernels are not batch-invariant candidates.
// The variants (the lab's own; they lost to the engine's cuBLASLt on an H100, session 52 at
// 2e391fc: the best form 14.06 us against 10.70 at m 318, 0.11-0.39x at 1,024 and 8,192, so the
// product keeps cuBLASLt and the kernels live only here): k split in fixed slices (S of them,
// whatever m), each warp 16 rows x all n columns of one slice on mma.sync m16n8k16 (bf16 in,
// fp32 sums), the slices' partial sums then added in slice order by a second kernel (narrow_gemm
// below, per form); and the one-launch form over a cluster (narrow_cluster). A row's bits depend
// only on its own values (batch-invariant by construction), though not cuBLASLt's bits (other
// sums).
// Prints per m (318, 1,024, 8,192) and form: us a call (bench::per_launch_ms: 20 back to back), the error against a
// double-precision reference (|y - y_double| / sum |x w|, worst, over the first 64 rows; held to
// 1e-5: bf16 products are exact in fp32, only the fp32 sums round), whether a row alone gives the
// bits it gives inside m (row invariance), and the largest difference from the engine's output;
// for the 2-kernel form also whether m taken in 16-row blocks of the scratch gives the same bits.
// It exits 1 when a form breaks one of those checks.
// Usage: clefrt_bench_narrow_gemm [--commit ID] [--json FILE] [--m M]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cooperative_groups.h>

#include "cuda/ops/cluster_launch.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/runtime/pdl.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int kN = 96, kK = 5120;  // Clef-27B's a | b: 2 x 48 value heads, hidden 5,120
constexpr int kNT = kN / 8;

// acc[j][0..3] = sum over k in [k0, k0 + 16 steps) of x[r, k] w[c, k] for rows r0 + g, r0 + g + 8
// and columns 8 j + 2 t, + 1 (mma.sync m16n8k16's accumulator layout: lane = 4 g + t): bf16 in,
// fp32 sums, steps in order: a warp's 16 rows x all n = 8 NT columns of one k slice, for both
// forms (so that they sum alike). Fragments come from global memory as 32-bit words (w's slice
// stays in L1 across a CTA's warps), UNROLL steps' loads issued before their MMAs. Rows past m
// read as zero.
template <int NT, int UNROLL>
__device__ __forceinline__ void narrow_slice_acc(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t k, int m, int r0,
                                                 int64_t k0, int steps, float (&acc)[NT][4]) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const bool ok0 = r0 + g < m, ok1 = r0 + g + 8 < m;
  const uint32_t* xa = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g) * ldx + k0 + 2 * t);
  const uint32_t* xb = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g + 8) * ldx + k0 + 2 * t);
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(w + int64_t(g) * k + k0 + 2 * t);
  const int64_t wstep = 4 * k;  // 32-bit words from w's row c to row c + 8
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  for (int st = 0; st < steps; st += UNROLL) {
    uint32_t a[UNROLL][4], b[UNROLL][NT][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const bool in = st + u < steps;
      const int kk = (st + u) * 8;  // in 32-bit words: 16 bf16 a step
      a[u][0] = in && ok0 ? __ldg(xa + kk) : 0u;
      a[u][1] = in && ok1 ? __ldg(xb + kk) : 0u;
      a[u][2] = in && ok0 ? __ldg(xa + kk + 4) : 0u;
      a[u][3] = in && ok1 ? __ldg(xb + kk + 4) : 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t* wj = wp + j * wstep;
        b[u][j][0] = in ? __ldg(wj + kk) : 0u;
        b[u][j][1] = in ? __ldg(wj + kk + 4) : 0u;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (st + u >= steps) break;  // no product of zeros: a sum of -0 stays -0
#pragma unroll
      for (int j = 0; j < NT; ++j) mma_bf16(acc[j], a[u][0], a[u][1], a[u][2], a[u][3], b[u][j][0], b[u][j][1]);
    }
  }
}

// The 2-kernel split-k form (once the product's narrow_gemm behind CLEFRT_LAB_NARROW_SPLITK; in
// git up to 2e391fc). partial[s][r][c]: narrow_slice_acc's sums of slice s (rows past m not
// written).
template <int WARPS>
__global__ void __launch_bounds__(32 * WARPS) narrow_splitk_k(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int m, int steps,
                                                               float* __restrict__ partial) {
  pdl_wait();
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int s = int(blockIdx.y), r0 = (int(blockIdx.x) * WARPS + warp) * 16;
  if (r0 >= m) return;
  float acc[kNT][4];
  narrow_slice_acc<kNT, 2>(x, ldx, w, kK, m, r0, int64_t(s) * steps * 16, steps, acc);
  float* p = partial + (int64_t(s) * m + r0) * kN;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int c = 8 * j + 2 * t;
    if (r0 + g < m) *reinterpret_cast<float2*>(p + int64_t(g) * kN + c) = make_float2(acc[j][0], acc[j][1]);
    if (r0 + g + 8 < m) *reinterpret_cast<float2*>(p + int64_t(g + 8) * kN + c) = make_float2(acc[j][2], acc[j][3]);
  }
}
// y[r, c] (rows ldy apart) = the slices' partial sums added in slice order
__global__ void narrow_reduce_k(const float* __restrict__ partial, int m, int slices, float* __restrict__ y, int64_t ldy) {
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(m) * kN;
  if (i >= total) return;
  float v = partial[i];
  for (int s = 1; s < slices; ++s) v += partial[int64_t(s) * total + i];
  y[(i / kN) * ldy + i % kN] = v;
}
struct NarrowGemmForm {
  int slices = 16;  // k / 16 a multiple of it
  int warps = 2;    // warps a CTA (1, 2, 4), each 16 rows of one slice
};
// the scratch's rows (partial sums of every slice) in `bytes`, a multiple of 16
int64_t narrow_gemm_partial_rows(const NarrowGemmForm& f, size_t bytes) { return int64_t(bytes / (size_t(f.slices) * kN * sizeof(float))) / 16 * 16; }
template <int WARPS>
void launch_splitk(const bf16* x, int64_t ldx, const bf16* w, int m, int slices, float* partial, cudaStream_t s) {
  const dim3 grid(unsigned((m + 16 * WARPS - 1) / (16 * WARPS)), unsigned(slices));
  launch_after("narrow_gemm", narrow_splitk_k<WARPS>, grid, dim3(32 * WARPS), 0, s, x, ldx, w, m, kK / 16 / slices, partial);
}
// y [m, n 96] (fp32, rows ldy apart) = x [m, k 5,120] w [n, k]^T; `partial`: scratch of
// partial_rows x slices x n floats, m taken in blocks of partial_rows rows (a row's sums do not
// depend on its block)
void narrow_gemm(const bf16* x, int64_t m, int64_t ldx, const bf16* w, float* y, int64_t ldy, const NarrowGemmForm& f, float* partial,
                 int64_t partial_rows, cudaStream_t s) {
  if (f.slices < 1 || (kK / 16) % f.slices != 0 || (f.warps != 1 && f.warps != 2 && f.warps != 4) || ldx % 2 != 0 || partial_rows < 16)
    throw Error(Status::Internal, "internal_error",
                "narrow_gemm: " + std::to_string(f.slices) + " slices, " + std::to_string(f.warps) + " warps, ldx " + std::to_string(ldx) + " or " +
                    std::to_string(partial_rows) + " scratch rows do not fit");
  for (int64_t r0 = 0; r0 < m; r0 += partial_rows) {
    const int mb = int(std::min(partial_rows, m - r0));
    const bf16* xb = x + r0 * ldx;
    switch (f.warps) {
      case 1: launch_splitk<1>(xb, ldx, w, mb, f.slices, partial, s); break;
      case 2: launch_splitk<2>(xb, ldx, w, mb, f.slices, partial, s); break;
      default: launch_splitk<4>(xb, ldx, w, mb, f.slices, partial, s); break;
    }
    const int64_t total = int64_t(mb) * kN;
    launch_after("narrow_gemm reduce", narrow_reduce_k, dim3(unsigned((total + 255) / 256)), dim3(256), 0, s, partial, mb, f.slices, y + r0 * ldy, ldy);
  }
}

// The one-launch form (compute capability 9.0 on): the S slices of a 16 WARPS-row tile are
// a cluster of S CTAs (S <= 8, the portable size), each CTA's warps its slice's sums
// (narrow_slice_acc, as narrow_gemm's) into its shared memory; then CTA s adds rows' sums across
// the cluster's CTAs in slice order (distributed shared memory), its 1 / S of the tile's outputs:
// narrow_gemm's bits (narrow_reduce_k adds in the same order) without the partials' trip through
// memory and the second launch.
template <int S, int WARPS>
__global__ void __launch_bounds__(32 * WARPS) narrow_cluster_k(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int m,
                                                                float* __restrict__ y, int64_t ldy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_wait();
  namespace cg = cooperative_groups;
  constexpr int rows = 16 * WARPS, steps = kK / 16 / S, per = rows * kN / S;
  static_assert((kK / 16) % S == 0 && (rows * kN) % S == 0, "whole slices and shares");
  __shared__ __align__(16) float part[rows * kN];
  const cg::cluster_group cl = cg::this_cluster();
  const int s = int(cl.block_rank()), lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int tile0 = int(blockIdx.y) * rows, r0 = tile0 + warp * 16;
  float acc[kNT][4];
  narrow_slice_acc<kNT, 2>(x, ldx, w, kK, m, r0, int64_t(s) * steps * 16, steps, acc);
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int c = 8 * j + 2 * t;
    *reinterpret_cast<float2*>(part + (warp * 16 + g) * kN + c) = make_float2(acc[j][0], acc[j][1]);
    *reinterpret_cast<float2*>(part + (warp * 16 + g + 8) * kN + c) = make_float2(acc[j][2], acc[j][3]);
  }
  cl.sync();  // every slice's sums in its CTA's shared memory
  for (int i = s * per + int(threadIdx.x); i < (s + 1) * per; i += 32 * WARPS) {
    const int r = tile0 + i / kN;
    float v = *cl.map_shared_rank(part + i, 0);
#pragma unroll
    for (int o = 1; o < S; ++o) v += *cl.map_shared_rank(part + i, o);
    if (r < m) y[int64_t(r) * ldy + i % kN] = v;
  }
  cl.sync();  // the others' shared memory stays until every CTA has read it
#else
  __trap();
#endif
}
template <int S, int WARPS>
void narrow_cluster(const bf16* x, int64_t ldx, const bf16* w, int m, float* y, int64_t ldy, cudaStream_t st) {
  const cudaLaunchAttribute cluster = cluster_dim_x(unsigned(S));
  launch_after_ex("narrow_cluster", narrow_cluster_k<S, WARPS>, dim3(unsigned(S), unsigned((m + 16 * WARPS - 1) / (16 * WARPS))), dim3(32 * WARPS),
                  0, st, &cluster, 1, x, ldx, w, m, y, ldy);
}

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  int failed = 0;  // checks a form broke (the error bound, row bits, the forms' bits against each other)
  const int rc = bench::gemm_lab_main(argc, argv, "clefrt_bench_narrow_gemm", [&failed](const bench::Options& opt, const HardwareLimits&,
                                                                                      cudaStream_t st, Gemm& engine, Gemm&) {
    json::Value lines = json::Value::array();
    const int mmax = 8192;
    std::mt19937 rng(31);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16> hx(size_t(mmax) * kK), hw16(size_t(kN) * kK);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    for (auto& v : hw16) v = __float2bfloat16(0.02f * nd(rng));
    DeviceBuffer dx = upload(hx, "x"), dw = upload(hw16, "w"), y(size_t(mmax) * kN * 4), y1(size_t(mmax) * kN * 4),
                 part(size_t(64) << 20, "partials (the size of the engine Gemm's workspace, where the product form kept them)");
    for (int m : {318, 1024, 8192}) {
      if (opt.only_m > 0 && m != opt.only_m) continue;
      // the reference in double for the first 64 rows
      const int rows = std::min(m, 64);
      std::vector<double> ref(size_t(rows) * kN), mag(size_t(rows) * kN);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < kN; ++c) {
          double sum = 0, abs = 0;
          for (int k = 0; k < kK; ++k) {
            const double p = double(__bfloat162float(hx[size_t(r) * kK + k])) * double(__bfloat162float(hw16[size_t(c) * kK + k]));
            sum += p;
            abs += std::fabs(p);
          }
          ref[size_t(r) * kN + c] = sum;
          mag[size_t(r) * kN + c] = abs;
        }
      auto err = [&](const float* got) {  // over the reference's first rows
        double e = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          const double d = std::fabs(double(got[i]) - ref[i]) / std::max(mag[i], 1e-30);
          if (!(d <= e)) e = d;  // NaN stays the worst
        }
        return e;
      };
      const double t_eng = 1e3 * bench::per_launch_ms(st, [&] { engine.run(dx.as<bf16>(), m, kK, kK, dw.as<bf16>(), kN, y.get(), OutType::F32, kN, false, "a|b"); });
      engine.run(dx.as<bf16>(), m, kK, kK, dw.as<bf16>(), kN, y.get(), OutType::F32, kN, false, "a|b");
      const std::vector<float> eng = bench::download<float>(y, size_t(m) * kN, st);
      std::printf("\nm %d, n %d, k %d\n  %-34s %8.2f us  worst error %.2e\n", m, kN, kK, "engine (cuBLASLt, batch-invariant)", t_eng,
                  err(eng.data()));
      json::Value e = json::Value::object();
      e.add("m", json::Value::integer(m));
      e.add("form", json::Value::string("engine"));
      e.add("us", json::Value::number(t_eng));
      lines.arr.push_back(std::move(e));
      auto variant = [&](const char* name, auto run) {
        const double us = 1e3 * bench::per_launch_ms(st, [&] { run(m, y1); });
        check(cudaMemsetAsync(y1.get(), 0xff, y1.bytes(), st), "poison y");  // NaN where a form writes nothing
        run(m, y1);
        const std::vector<float> got = bench::download<float>(y1, size_t(m) * kN, st);
        const bool written = std::none_of(got.begin(), got.end(), [](float v) { return std::isnan(v); });
        // row invariance: the first rows alone (m 1 and 17) against inside m
        bool inv = true;
        for (int alone : {1, 17}) {
          run(alone, y1);
          const std::vector<float> a = bench::download<float>(y1, size_t(alone) * kN, st);
          inv = inv && std::equal(a.begin(), a.end(), got.begin());
        }
        double dmax = 0;
        for (size_t i = 0; i < got.size(); ++i) dmax = std::max(dmax, double(std::fabs(got[i] - eng[i])));
        const double er = err(got.data());
        const bool within = written && er <= 1e-5;  // bf16 products are exact in fp32: only the sums round
        failed += !within + !inv;
        std::printf("  %-34s %8.2f us  worst error %.2e%s  rows alone %s  max |y - engine's| %.3g  (%.2fx the engine)\n", name, us, er,
                    !written ? " NOT ALL WRITTEN" : within ? "" : " OVER 1e-5", inv ? "same bits" : "BITS DIFFER", dmax, t_eng / us);
        json::Value v = json::Value::object();
        v.add("m", json::Value::integer(m));
        v.add("form", json::Value::string(name));
        v.add("us", json::Value::number(us));
        v.add("worst_error", json::Value::number(er));
        v.add("row_invariant", json::Value::boolean(inv));
        v.add("max_diff_from_engine", json::Value::number(dmax));
        lines.arr.push_back(std::move(v));
      };
      const bf16* xp = dx.as<bf16>();
      const bf16* wp = dw.as<bf16>();
      float* pp = part.as<float>();
      int blocks_differ = 0, forms = 0;
      for (const NarrowGemmForm f : {NarrowGemmForm{8, 2}, NarrowGemmForm{16, 2}, NarrowGemmForm{16, 4}, NarrowGemmForm{20, 2},
                                     NarrowGemmForm{32, 1}, NarrowGemmForm{32, 2}, NarrowGemmForm{64, 1}}) {
        const std::string name = "split " + std::to_string(f.slices) + ", " + std::to_string(f.warps) + " warps";
        const int64_t prows = narrow_gemm_partial_rows(f, part.bytes());
        variant(name.c_str(), [&](int mm, DeviceBuffer& out) { narrow_gemm(xp, mm, kK, wp, out.as<float>(), kN, f, pp, prows, st); });
        // m in 16-row blocks of the scratch (y's engine output is on the host by now): the same bits
        narrow_gemm(xp, m, kK, wp, y1.as<float>(), kN, f, pp, prows, st);
        narrow_gemm(xp, m, kK, wp, y.as<float>(), kN, f, pp, 16, st);
        const std::vector<float> whole = bench::download<float>(y1, size_t(m) * kN, st), in16 = bench::download<float>(y, size_t(m) * kN, st);
        blocks_differ += std::memcmp(whole.data(), in16.data(), whole.size() * 4) != 0;
        ++forms;
      }
      std::printf("  split forms with m in 16-row blocks of the scratch: %d of %d forms' bits differ (expected 0)\n", blocks_differ, forms);
      failed += blocks_differ;
      // one launch, the slices over a cluster: the bits of the 2-kernel form of the same slices
      variant("cluster of 8 slices, 2 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<8, 2>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      variant("cluster of 8 slices, 4 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<8, 4>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      variant("cluster of 4 slices, 2 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<4, 2>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      {  // the cluster form's bits against the 2-kernel form's, 8 slices
        const NarrowGemmForm f8{8, 2};
        narrow_gemm(xp, m, kK, wp, y1.as<float>(), kN, f8, pp, narrow_gemm_partial_rows(f8, part.bytes()), st);
        const std::vector<float> two = bench::download<float>(y1, size_t(m) * kN, st);
        narrow_cluster<8, 4>(xp, kK, wp, m, y1.as<float>(), kN, st);
        const std::vector<float> one = bench::download<float>(y1, size_t(m) * kN, st);
        size_t differ = 0;
        for (size_t i = 0; i < one.size(); ++i) differ += std::memcmp(&one[i], &two[i], 4) != 0;
        std::printf("  cluster of 8 slices against narrow_gemm's 8 slices: %zu of %zu outputs differ (expected 0)\n", differ, one.size());
        failed += differ != 0;
      }
    }
    return lines;
  });
  if (rc == 0 && failed > 0) {
    std::fprintf(stderr, "clefrt_bench_narrow_gemm: %d checks failed (above)\n", failed);
    return 1;
  }
  return rc;
}

// The FP8 model's narrow bf16 GEMM (issue 20, short requests): the GDN in_proj keeps its a | b
// rows (2 x 48 gate inputs, n 96, k 5,120) in bf16, a cuBLASLt GEMM of its own after the FP8
// part. At the blog's 318 rows the engine's batch-invariant pick takes ~11 us a layer, 48 layers
// (~0.5 ms of a ~22 ms forward: bench/results/2026-12-07-h100-session50.md), on a grid that
// leaves most SMs idle, and cuBLASLt's split-K kernels are not batch-invariant candidates.
// This lab's variant splits k itself, in fixed slices (S of them, whatever m), each CTA a few
// 16-row tiles x all n columns of one slice on mma.sync m16n8k16 (bf16 in, fp32 sums), the
// slices' partial sums then added in slice order by a second kernel: a row's bits depend only on
// its own values (batch-invariant by construction), though not cuBLASLt's bits (other sums).
// Prints per m (318, 1,024, 8,192) and form: us a call (bench::per_launch_ms: 20 back to back), the error against a
// double-precision reference (|y - y_double| / sum |x w|, worst), whether a row alone gives the
// bits it gives inside m (row invariance), and the largest difference from the engine's output.
// Usage: clefrt_bench_narrow_gemm [--commit ID] [--json FILE] [--m M]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int kN = 96, kK = 5120;  // Clef-27B's a | b: 2 x 48 value heads, hidden 5,120
constexpr int kNT = kN / 8;        // m16n8 tiles across n

// partial[s][r][c] = sum over k in slice s of x[r, k] w[c, k]; slice s = [s K / S, (s + 1) K / S).
// A warp takes 16 rows x all kN columns of one slice (12 accumulators of 4), k in 16-wide steps,
// fragments loaded from global memory (32-bit loads; w's slice stays in L1 across the warps),
// UNROLL steps' loads issued before their MMAs. Rows past m read as zero and are not written.
template <int S, int WARPS, int UNROLL>
__global__ void __launch_bounds__(32 * WARPS) narrow_splitk_k(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int m,
                                                               float* __restrict__ partial) {
  constexpr int slice = kK / S, steps = slice / 16;
  static_assert(kK % S == 0 && slice % 16 == 0 && steps % UNROLL == 0, "slices of whole 16-wide steps");
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int s = int(blockIdx.y), r0 = (int(blockIdx.x) * WARPS + warp) * 16;
  if (r0 >= m) return;
  const int k0 = s * slice;
  const bool ok0 = r0 + g < m, ok1 = r0 + g + 8 < m;
  const uint32_t* xa = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g) * ldx + k0 + 2 * t);
  const uint32_t* xb = reinterpret_cast<const uint32_t*>(x + int64_t(r0 + g + 8) * ldx + k0 + 2 * t);
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(w + int64_t(g) * kK + k0 + 2 * t);
  float acc[kNT][4] = {};
  for (int st = 0; st < steps; st += UNROLL) {
    uint32_t a[UNROLL][4], b[UNROLL][kNT][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kk = (st + u) * 8;  // in 32-bit words: 16 bf16 a step
      a[u][0] = ok0 ? __ldg(xa + kk) : 0u;
      a[u][1] = ok1 ? __ldg(xb + kk) : 0u;
      a[u][2] = ok0 ? __ldg(xa + kk + 4) : 0u;
      a[u][3] = ok1 ? __ldg(xb + kk + 4) : 0u;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const uint32_t* wj = wp + int64_t(j) * 8 * kK / 2;  // rows 8 j + g of w
        b[u][j][0] = __ldg(wj + kk);
        b[u][j][1] = __ldg(wj + kk + 4);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int j = 0; j < kNT; ++j) mma_bf16(acc[j], a[u][0], a[u][1], a[u][2], a[u][3], b[u][j][0], b[u][j][1]);
  }
  float* p = partial + (int64_t(s) * m + r0) * kN;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int c = 8 * j + 2 * t;
    if (ok0) *reinterpret_cast<float2*>(p + int64_t(g) * kN + c) = make_float2(acc[j][0], acc[j][1]);
    if (ok1) *reinterpret_cast<float2*>(p + int64_t(g + 8) * kN + c) = make_float2(acc[j][2], acc[j][3]);
  }
}

// y[r, c] (rows ldy apart) = the S partials added in slice order
template <int S>
__global__ void narrow_reduce_k(const float* __restrict__ partial, int m, float* __restrict__ y, int64_t ldy) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(m) * kN) return;
  float v = partial[i];
#pragma unroll
  for (int s = 1; s < S; ++s) v += partial[int64_t(s) * m * kN + i];
  y[(i / kN) * ldy + i % kN] = v;
}

template <int S, int WARPS, int UNROLL>
void narrow_gemm(const bf16* x, int64_t ldx, const bf16* w, int m, float* partial, float* y, int64_t ldy, cudaStream_t st) {
  const dim3 grid(unsigned((m + 16 * WARPS - 1) / (16 * WARPS)), unsigned(S));
  narrow_splitk_k<S, WARPS, UNROLL><<<grid, 32 * WARPS, 0, st>>>(x, ldx, w, m, partial);
  const int64_t total = int64_t(m) * kN;
  narrow_reduce_k<S><<<unsigned((total + 255) / 256), 256, 0, st>>>(partial, m, y, ldy);
  check_launch("narrow_gemm");
}

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  return bench::gemm_lab_main(argc, argv, "clefrt_bench_narrow_gemm", [](const bench::Options& opt, const HardwareLimits&, cudaStream_t st,
                                                                          Gemm& engine, Gemm&) {
    json::Value lines = json::Value::array();
    const int mmax = 8192;
    std::mt19937 rng(31);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16> hx(size_t(mmax) * kK), hw16(size_t(kN) * kK);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    for (auto& v : hw16) v = __float2bfloat16(0.02f * nd(rng));
    DeviceBuffer dx = upload(hx, "x"), dw = upload(hw16, "w"), y(size_t(mmax) * kN * 4), y1(size_t(mmax) * kN * 4),
                 part(size_t(64) * mmax * kN * 4, "partials");
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
        for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(double(got[i]) - ref[i]) / std::max(mag[i], 1e-30));
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
        run(m, y1);
        const std::vector<float> got = bench::download<float>(y1, size_t(m) * kN, st);
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
        std::printf("  %-34s %8.2f us  worst error %.2e  rows alone %s  max |y - engine's| %.3g  (%.2fx the engine)\n", name, us, er,
                    inv ? "same bits" : "BITS DIFFER", dmax, t_eng / us);
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
      variant("split 8, 2 warps, unroll 2", [&](int mm, DeviceBuffer& out) { narrow_gemm<8, 2, 2>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
      variant("split 16, 2 warps, unroll 2", [&](int mm, DeviceBuffer& out) { narrow_gemm<16, 2, 2>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
      variant("split 16, 4 warps, unroll 2", [&](int mm, DeviceBuffer& out) { narrow_gemm<16, 4, 2>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
      variant("split 32, 2 warps, unroll 2", [&](int mm, DeviceBuffer& out) { narrow_gemm<32, 2, 2>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
      variant("split 32, 1 warp, unroll 2", [&](int mm, DeviceBuffer& out) { narrow_gemm<32, 1, 2>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
      variant("split 64, 1 warp, unroll 1", [&](int mm, DeviceBuffer& out) { narrow_gemm<64, 1, 1>(xp, kK, wp, mm, pp, out.as<float>(), kN, st); });
    }
    return lines;
  });
}

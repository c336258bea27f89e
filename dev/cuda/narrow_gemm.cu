// The FP8 model's narrow bf16 GEMM (issue 20, short requests): the GDN in_proj keeps its a | b
// rows (2 x 48 gate inputs, n 96, k 5,120) in bf16, a cuBLASLt GEMM of its own after the FP8
// part. At the blog's 318 rows the engine's batch-invariant pick takes ~11 us a layer, 48 layers
// (~0.5 ms of a ~22 ms forward: bench/results/2026-12-07-h100-session50.md), on a grid that
// leaves most SMs idle, and cuBLASLt's split-K kernels are not batch-invariant candidates.
// The variants: kernels.h narrow_gemm (the product's, behind CLEFRT_LAB_NARROW_SPLITK) per form,
// k split in fixed slices (S of them, whatever m), each warp 16 rows x all n columns of one slice
// on mma.sync m16n8k16 (bf16 in, fp32 sums), the slices' partial sums then added in slice order
// by a second kernel: a row's bits depend only on its own values (batch-invariant by
// construction), though not cuBLASLt's bits (other sums).
// Prints per m (318, 1,024, 8,192) and form: us a call (bench::per_launch_ms: 20 back to back), the error against a
// double-precision reference (|y - y_double| / sum |x w|, worst), whether a row alone gives the
// bits it gives inside m (row invariance), and the largest difference from the engine's output.
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
#include "cuda/ops/narrow_gemm.cuh"
#include "cuda/runtime/pdl.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int kN = 96, kK = 5120;  // Clef-27B's a | b: 2 x 48 value heads, hidden 5,120
constexpr int kNT = kN / 8;

// The lab's one-launch form (compute capability 9.0 on): the S slices of a 16 WARPS-row tile are
// a cluster of S CTAs (S <= 8, the portable size), each CTA's warps its slice's sums
// (narrow_slice_acc, as the product's) into its shared memory; then CTA s adds rows' sums across
// the cluster's CTAs in slice order (distributed shared memory), its 1 / S of the tile's outputs:
// the product's bits (narrow_reduce_k adds in the same order) without the partials' trip through
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
                 part(size_t(64) << 20, "partials (the size of the engine Gemm's workspace, where the product keeps them)");
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
      for (const NarrowGemmForm f : {NarrowGemmForm{8, 2}, NarrowGemmForm{16, 2}, NarrowGemmForm{16, 4}, NarrowGemmForm{20, 2},
                                     NarrowGemmForm{32, 1}, NarrowGemmForm{32, 2}, NarrowGemmForm{64, 1}}) {
        const std::string name = "split " + std::to_string(f.slices) + ", " + std::to_string(f.warps) + " warps";
        const int64_t prows = narrow_gemm_partial_rows(kN, f, part.bytes());
        variant(name.c_str(), [&](int mm, DeviceBuffer& out) { narrow_gemm(xp, mm, kK, kK, wp, kN, out.as<float>(), kN, f, pp, prows, st); });
      }
      // one launch, the slices over a cluster: the bits of the 2-kernel form of the same slices
      variant("cluster of 8 slices, 2 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<8, 2>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      variant("cluster of 8 slices, 4 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<8, 4>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      variant("cluster of 4 slices, 2 warps", [&](int mm, DeviceBuffer& out) { narrow_cluster<4, 2>(xp, kK, wp, mm, out.as<float>(), kN, st); });
      {  // the cluster form's bits against the 2-kernel form's, 8 slices
        const NarrowGemmForm f8{8, 2};
        narrow_gemm(xp, m, kK, kK, wp, kN, y1.as<float>(), kN, f8, pp, narrow_gemm_partial_rows(kN, f8, part.bytes()), st);
        const std::vector<float> two = bench::download<float>(y1, size_t(m) * kN, st);
        narrow_cluster<8, 4>(xp, kK, wp, m, y1.as<float>(), kN, st);
        const std::vector<float> one = bench::download<float>(y1, size_t(m) * kN, st);
        size_t differ = 0;
        for (size_t i = 0; i < one.size(); ++i) differ += std::memcmp(&one[i], &two[i], 4) != 0;
        std::printf("  cluster of 8 slices against narrow_gemm's 8 slices: %zu of %zu outputs differ (expected 0)\n", differ, one.size());
      }
    }
    return lines;
  });
}

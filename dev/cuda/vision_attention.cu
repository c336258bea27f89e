// The vision tower's attention (bidirectional within a frame, head dim 72 zero-padded to 80, 16
// heads: the 27B tower), kernel variants side by side (issue 19's 8 ms tower, issue 20's
// attention). Per shape (one 1024 x 768 image: 3,072 patches; one 2048 x 2048: 16,384; four
// 512 x 512 packed: 4 x 1,024), CUDA events, median of 20 after 3 warm-ups:
//   product            flash_attention_full, the engine's (128 queries x 64 keys per step, 8 warps:
//                      the variant bq128 bk64 exp2f won at e6656ed, whose product was bq64 bk64)
//   bq{64,128} bk{64,128} {exp2f, ex2.approx}
//                      this file's copy of its loop with the query tile (4 or 8 warps of 16 rows),
//                      the key step and the exponential as parameters; the exp2f variants at
//                      bk64 must equal the product bit for bit (the harness check)
// Error is max |o - o_product| (the GPU tests hold the product to the CPU). Rates count the
// useful FLOPs (4 x frame^2 x 72 x heads per frame), for scale against the measured bf16 GEMM
// peak. Usage: clefrt_bench_vision_attn [--commit ID] [--json FILE]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/mma.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool Fast>
__device__ __forceinline__ float ex2(float x) {
  if constexpr (Fast) return ex2_approx(x);
  else return exp2f(x);
}

template <int D, int BK, int WARPS>
struct LabSmem {
  static constexpr int LD = D + 8, BQ = WARPS * 16;
  static constexpr size_t bytes = sizeof(bf16) * size_t(BQ + 2 * BK) * LD;
};

template <int D, int BK, int WARPS, bool Fast>
__global__ void __launch_bounds__(WARPS * 32) lab_flash_k(const bf16* q, const bf16* k, const bf16* v, int Hq, AttnTiles tiles, bf16* out,
                                                          int dout, float scale_log2) {
  using S = LabSmem<D, BK, WARPS>;
  constexpr int LD = S::LD, BQ = S::BQ;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BQ * LD;
  bf16* Vs = Ks + BK * LD;
  const int tile = blockIdx.x, h = blockIdx.y;
  const int64_t q0 = tiles.q0[tile], seq0 = tiles.seq0[tile], end = tiles.end[tile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t ld = int64_t(Hq) * D;
  const bf16* kbase = k + int64_t(h) * D;
  const bf16* vbase = v + int64_t(h) * D;
  auto rows_valid = [](int64_t valid, int rows) { return int(valid < 0 ? 0 : valid > rows ? rows : valid); };
  load_tile_async(Qs, LD, q + (q0 * Hq + h) * D, ld, BQ, D, rows_valid(end - q0, BQ), D);
  load_tile_async(Ks, LD, kbase + seq0 * ld, ld, BK, D, rows_valid(end - seq0, BK), D);
  cp_async_commit();
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int64_t qi0 = q0 + warp * 16 + g, qi1 = qi0 + 8;
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
  const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;
  for (int64_t kb = seq0; kb < end; kb += BK) {
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async(Vs, LD, vbase + kb * ld, ld, BK, D, rows_valid(end - kb, BK), D);
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
        uint32_t b[4];
        ldmatrix_x4(b, Ks + (nt * 8 + kr) * LD + ks * 16 + kc);
        mma_bf16(s[nt], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_bf16(s[nt + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    const bool masked = kb + BK > end;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kj = kb + nt * 8 + 2 * tq + (e & 1);
        s[nt][e] = !masked || kj < end ? s[nt][e] * scale_log2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = ex2<Fast>(m0 - b0), c1 = ex2<Fast>(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0, rs1 = 0;
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) {
      s[nt][0] = ex2<Fast>(s[nt][0] - b0);
      s[nt][1] = ex2<Fast>(s[nt][1] - b0);
      s[nt][2] = ex2<Fast>(s[nt][2] - b1);
      s[nt][3] = ex2<Fast>(s[nt][3] - b1);
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
    __syncthreads();
    if (kb + BK < end) {
      load_tile_async(Ks, LD, kbase + (kb + BK) * ld, ld, BK, D, rows_valid(end - (kb + BK), BK), D);
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 8; dn += 2) {
        uint32_t b[4];
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
  const int64_t ldo = int64_t(Hq) * dout;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    const int d = dn * 8 + 2 * tq;
    if (d >= dout) continue;
    if (qi0 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi0 * ldo + int64_t(h) * dout + d) = __floats2bfloat162_rn(o[dn][0] * inv0, o[dn][1] * inv0);
    if (qi1 < end)
      *reinterpret_cast<__nv_bfloat162*>(out + qi1 * ldo + int64_t(h) * dout + d) = __floats2bfloat162_rn(o[dn][2] * inv1, o[dn][3] * inv1);
  }
}

// Per frame, tiles of bq queries: q0, seq0, end.
std::vector<int32_t> make_tiles(const std::vector<int64_t>& frames, int64_t bq, int64_t& n) {
  std::vector<int32_t> a, b, c;
  int64_t f0 = 0;
  for (int64_t f : frames) {
    for (int64_t t = f0; t < f0 + f; t += bq) {
      a.push_back(int32_t(t));
      b.push_back(int32_t(f0));
      c.push_back(int32_t(f0 + f));
    }
    f0 += f;
  }
  n = int64_t(a.size());
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

struct Variant {
  std::string name;
  int bq;
  void (*launch)(const bf16*, const bf16*, const bf16*, int, const AttnTiles&, bf16*, int, cudaStream_t);
};

template <int BK, int WARPS, bool Fast>
void launch_lab(const bf16* q, const bf16* k, const bf16* v, int heads, const AttnTiles& t, bf16* out, int dout, cudaStream_t s) {
  constexpr int D = 80;
  using S = LabSmem<D, BK, WARPS>;
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(lab_flash_k<D, BK, WARPS, Fast>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::bytes)), "smem");
    attr = true;
  }
  const float scale_log2 = float(1.0 / std::sqrt(double(dout)) * 1.4426950408889634);
  lab_flash_k<D, BK, WARPS, Fast><<<dim3(unsigned(t.n), unsigned(heads)), WARPS * 32, S::bytes, s>>>(q, k, v, heads, t, out, dout, scale_log2);
  check_launch("lab flash");
}

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  const HardwareLimits hw = bench::measure_and_print_hardware();
  const int heads = 16, hd = 72, Dp = int(flash_attention_full_padded(hd));
  const std::vector<Variant> variants = {
      {"bq64 bk64 exp2f", 64, launch_lab<64, 4, false>},   {"bq64 bk64 ex2.approx", 64, launch_lab<64, 4, true>},
      {"bq64 bk128 exp2f", 64, launch_lab<128, 4, false>}, {"bq64 bk128 ex2.approx", 64, launch_lab<128, 4, true>},
      {"bq128 bk64 exp2f", 128, launch_lab<64, 8, false>}, {"bq128 bk64 ex2.approx", 128, launch_lab<64, 8, true>},
      {"bq128 bk128 exp2f", 128, launch_lab<128, 8, false>}, {"bq128 bk128 ex2.approx", 128, launch_lab<128, 8, true>},
  };
  struct Shape {
    const char* name;
    std::vector<int64_t> frames;
  };
  const std::vector<Shape> shapes = {{"1x3072 (1024x768)", {3072}}, {"1x16384 (2048x2048)", {16384}}, {"4x1024 (512x512)", {1024, 1024, 1024, 1024}}};
  json::Value res = json::Value::object();
  cudaStream_t st;
  check(cudaStreamCreate(&st), "stream");
  for (const Shape& sh : shapes) {
    int64_t L = 0;
    double flops = 0;
    for (int64_t f : sh.frames) {
      L += f;
      flops += 4.0 * double(f) * double(f) * hd * heads;
    }
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16> hq(size_t(L * heads * Dp)), hk(hq.size()), hv(hq.size());
    for (size_t i = 0; i < hq.size(); ++i) {
      const bool pad = int64_t(i % size_t(Dp)) >= hd;
      hq[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
      hk[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
      hv[i] = __float2bfloat16(pad ? 0.0f : nd(rng));
    }
    DeviceBuffer q(hq.size() * 2, "q"), k(hq.size() * 2, "k"), v(hq.size() * 2, "v"), o(size_t(L * heads * hd) * 2, "o"),
        ref(size_t(L * heads * hd) * 2, "ref");
    check(cudaMemcpy(q.get(), hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "up");
    check(cudaMemcpy(k.get(), hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "up");
    check(cudaMemcpy(v.get(), hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "up");
    auto tiles_for = [&](int64_t bq, DeviceBuffer& buf) {
      int64_t n = 0;
      const std::vector<int32_t> t = make_tiles(sh.frames, bq, n);
      buf = DeviceBuffer(t.size() * 4, "tiles");
      check(cudaMemcpy(buf.get(), t.data(), t.size() * 4, cudaMemcpyHostToDevice), "up");
      return AttnTiles{buf.as<int32_t>(), buf.as<int32_t>() + n, buf.as<int32_t>() + 2 * n, n};
    };
    DeviceBuffer t64b, t128b;
    const AttnTiles t64 = tiles_for(64, t64b), t128 = tiles_for(128, t128b);
    std::vector<bf16> want(size_t(L * heads * hd)), got(want.size());
    const AttnTiles& tp = flash_attention_full_tile() == 128 ? t128 : t64;
    const double pms = bench::median_ms(st, [&] { flash_attention_full(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), heads, hd, tp, ref.as<bf16>(), st); });
    check(cudaMemcpy(want.data(), ref.get(), want.size() * 2, cudaMemcpyDeviceToHost), "down");
    std::printf("%-22s %-24s %9.3f ms %7.1f TFLOP/s %5.1f%% of peak\n", sh.name, "product", pms, flops / (pms * 1e-3) / 1e12,
                100.0 * flops / (pms * 1e-3) / 1e12 / hw.peak_bf16_tflops);
    json::Value per = json::Value::object();
    per.add("product_ms", json::Value::number(pms));
    for (const Variant& var : variants) {
      const AttnTiles& t = var.bq == 64 ? t64 : t128;
      const double ms = bench::median_ms(st, [&] { var.launch(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), heads, t, o.as<bf16>(), hd, st); });
      check(cudaMemcpy(got.data(), o.get(), got.size() * 2, cudaMemcpyDeviceToHost), "down");
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(__bfloat162float(got[i]) - __bfloat162float(want[i]))));
      const double tf = flops / (ms * 1e-3) / 1e12;
      std::printf("%-22s %-24s %9.3f ms %7.1f TFLOP/s %5.1f%% of peak  max |o - o_product| %.3g\n", sh.name, var.name.c_str(), ms, tf,
                  100.0 * tf / hw.peak_bf16_tflops, err);
      json::Value r = json::Value::object();
      r.add("ms", json::Value::number(ms));
      r.add("tflops", json::Value::number(tf));
      r.add("max_abs_diff_vs_product", json::Value::number(err));
      per.add(var.name, r);
    }
    res.add(sh.name, per);
  }
  if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_vision_attn", std::move(res));
  cudaStreamDestroy(st);
  return 0;
}

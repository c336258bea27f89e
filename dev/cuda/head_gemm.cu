// The joint head's small Linears (issue 20: the head is ~2 ms of the blog request): head_gemm over
// a request's question / option rows (m = 3 and 9: the blog's questions and options; 640: 64
// requests' options), bf16 and fp32 weights, at the head's widths (W 1,024, feedforward 4,096,
// in_proj 3 W), and f32_gemm_3xtf32 over the token rows (memory_projection k = 5,120, the
// memories' k | v n = 2,048, at the blog's 318 rows, 8,192 and 64 x 512), as mma.sync
// (f32_gemm_3xtf32) and as wgmma with w in TF32 planes (f32_gemm_3xtf32_wgmma), each with the
// product's tile and every tile forced, the bits compared.
//   product          head_gemm as the engine runs it (k in slices of 1,024, a warp a slice)
//   8 warps split k  the previous product (a CTA of 8 warps per 4 columns x 8 rows, k split over
//                    the warps, their sums through shared memory); different bits, same bound
//   empty            a kernel that does nothing, n / 8 x m / 8 CTAs of 64 threads (the product's
//                    grid where k is one slice): the launch's floor
// Per line: one launch (CUDA events around it: what a forward's op costs), 20 back to back (the
// GPU's time a launch), the weight bytes over the latter against the measured copy rate, and the
// product's worst |y - y_double| / sum |x w|.
// Usage: clefrt_bench_head_gemm [--commit ID] [--json FILE]
// CLEFRT_LAB_ONCE=1: each kernel launched once per shape, untimed (for ncu)
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/ops/kernels.h"
#include "cuda/ops/reduce.cuh"
#include "cuda/runtime/buffer.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int kOldRows = 8, kOldCols = 4, kOldWarps = 8;
static_assert(kOldRows * kOldCols == 32, "a lane per output element of the CTA's tile");
// maybe_unused: only the scalar (Vec = false) form reads them, and the lab launches the vector one
[[maybe_unused]] __device__ __forceinline__ float old_f32(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float old_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float4 old_load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 old_load4(const bf16* p) {  // 4 bf16 (8-byte aligned), element 0 in the low half
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
template <bool Vec, class WT>
__global__ void __launch_bounds__(kOldWarps * 32) old_head_gemm_k(const float* x, int64_t ldx, int64_t m, int64_t k, const WT* w, int64_t n,
                                                             float* y, int64_t ldy, bool accumulate, const float* bias,
                                                             bool gelu) {
  __shared__ float part[kOldWarps][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t c0 = int64_t(blockIdx.x) * kOldCols, r0 = int64_t(blockIdx.y) * kOldRows;
  const int nc = int(n - c0 < kOldCols ? n - c0 : kOldCols), nr = int(m - r0 < kOldRows ? m - r0 : kOldRows);
  float acc[kOldRows][kOldCols] = {};
  const int64_t chunks = (k + 3) / 4, per = (chunks + kOldWarps - 1) / kOldWarps;
  const int64_t cb = warp * per, ce = cb + per < chunks ? cb + per : chunks;
  for (int64_t i = cb + lane; i < ce; i += 32) {
    float4 wv[kOldCols];
#pragma unroll
    for (int c = 0; c < kOldCols; ++c) {
      const WT* wr = w + (c0 + (c < nc ? c : 0)) * k + 4 * i;
      if constexpr (Vec) {
        wv[c] = c < nc ? old_load4(wr) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      } else {
        const int64_t left = k - 4 * i;
        wv[c] = c < nc ? make_float4(old_f32(wr[0]), left > 1 ? old_f32(wr[1]) : 0.0f, left > 2 ? old_f32(wr[2]) : 0.0f,
                                     left > 3 ? old_f32(wr[3]) : 0.0f)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int r = 0; r < kOldRows; ++r) {
      float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < nr) {
        const float* xr = x + (r0 + r) * ldx + 4 * i;
        if constexpr (Vec) {
          xv = *reinterpret_cast<const float4*>(xr);
        } else {
          const int64_t left = k - 4 * i;
          xv = make_float4(xr[0], left > 1 ? xr[1] : 0.0f, left > 2 ? xr[2] : 0.0f, left > 3 ? xr[3] : 0.0f);
        }
      }
#pragma unroll
      for (int c = 0; c < kOldCols; ++c) {
        float a = acc[r][c];
        a = fmaf(xv.x, wv[c].x, a);
        a = fmaf(xv.y, wv[c].y, a);
        a = fmaf(xv.z, wv[c].z, a);
        acc[r][c] = fmaf(xv.w, wv[c].w, a);
      }
    }
  }
  // the slice's 32 lane sums of each element (warp_reduce_scatter32): lane l ends with element l
  float v[32];
#pragma unroll
  for (int r = 0; r < kOldRows; ++r)
#pragma unroll
    for (int c = 0; c < kOldCols; ++c) v[r * kOldCols + c] = acc[r][c];
  part[warp][lane] = warp_reduce_scatter32(v, lane);
  __syncthreads();
  if (warp != 0) return;
  const int r = lane / kOldCols, c = lane % kOldCols;
  if (r >= nr || c >= nc) return;
  float sum = part[0][lane];
#pragma unroll
  for (int s = 1; s < kOldWarps; ++s) sum += part[s][lane];
  float* out = y + (r0 + r) * ldy + c0 + c;
  float y1 = accumulate ? *out + sum : sum;
  if (bias || gelu) y1 += bias ? bias[c0 + c] : 0.0f;  // as bias_act adds
  if (gelu) y1 = gelu_f(y1);
  *out = y1;
}

template <class WT>
void old_head_gemm(const float* x, int64_t m, int64_t k, const WT* w, int64_t n, float* y, cudaStream_t s) {
  const dim3 grid(unsigned((n + kOldCols - 1) / kOldCols), unsigned((m + kOldRows - 1) / kOldRows));
  old_head_gemm_k<true, WT><<<grid, kOldWarps * 32, 0, s>>>(x, k, m, k, w, n, y, n, false, nullptr, false);
  check_launch("old head gemm");
}

__global__ void empty_k() {}

struct Shape {
  const char* name;
  int64_t m, k, n;
  bool bf16w;
};

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  bench::Options o;
  if (!bench::parse_options(argc, argv, false, o)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    cudaStream_t st = nullptr;
    json::Value recs = json::Value::array();
    auto line = [&](const std::string& shape, const std::string& form, double one, double per, double bytes, const std::string& note) {
      std::printf("%-34s %-18s one %8.2f us  back to back %8.2f us  %7.0f GB/s %5.1f%% of copy  %s\n", shape.c_str(), form.c_str(), one * 1e3,
                  per * 1e3, bytes / (per * 1e-3) / 1e9, 100.0 * bytes / (per * 1e-3) / 1e9 / hw.copy_gbps, note.c_str());
      json::Value r = json::Value::object();
      r.add("shape", json::Value::string(shape));
      r.add("form", json::Value::string(form));
      r.add("one_launch_us", json::Value::number(one * 1e3));
      r.add("back_to_back_us", json::Value::number(per * 1e3));
      r.add("weight_gbps", json::Value::number(bytes / (per * 1e-3) / 1e9));
      recs.arr.push_back(r);
    };
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto randv = [&](size_t n, float sd) {
      std::vector<float> v(n);
      for (auto& x : v) x = nd(rng) * sd;
      return v;
    };
    const Shape shapes[] = {{"blog q rows W x W", 3, 1024, 1024, true},    {"blog option rows W x W", 9, 1024, 1024, true},
                            {"blog q rows ff1 4W x W", 3, 1024, 4096, true}, {"blog q rows ff2 W x 4W", 3, 4096, 1024, true},
                            {"blog q rows in_proj 3W x W", 3, 1024, 3072, true}, {"blog q rows d -> W (question_proj)", 3, 5120, 1024, true},
                            {"blog options W x W, fp32", 9, 1024, 1024, false}, {"64 x 512 options W x W", 640, 1024, 1024, true},
                            {"64 x 512 options ff1 4W x W", 640, 1024, 4096, true}};
    for (const Shape& sh : shapes) {
      const auto x = randv(size_t(sh.m * sh.k), 1.0f), w = randv(size_t(sh.n * sh.k), 0.03f);
      std::vector<bf16> wb(w.size());
      std::vector<float> wr(w.size());
      for (size_t i = 0; i < w.size(); ++i) wb[i] = __float2bfloat16(w[i]), wr[i] = sh.bf16w ? __bfloat162float(wb[i]) : w[i];
      DeviceBuffer dx = upload(x, "x"), dw = sh.bf16w ? upload(wb, "w") : upload(wr, "w"), dy(size_t(sh.m * sh.n) * 4),
                   dy2(size_t(sh.m * sh.n) * 4);
      const double bytes = double(sh.n * sh.k) * (sh.bf16w ? 2 : 4);
      auto product = [&] {
        if (sh.bf16w) head_gemm(dx.as<float>(), sh.k, sh.m, sh.k, dw.as<bf16>(), sh.n, dy.as<float>(), sh.n, false, st);
        else head_gemm(dx.as<float>(), sh.k, sh.m, sh.k, dw.as<float>(), sh.n, dy.as<float>(), sh.n, false, st);
      };
      auto old = [&] {
        if (sh.bf16w) old_head_gemm(dx.as<float>(), sh.m, sh.k, dw.as<bf16>(), sh.n, dy2.as<float>(), st);
        else old_head_gemm(dx.as<float>(), sh.m, sh.k, dw.as<float>(), sh.n, dy2.as<float>(), st);
      };
      auto empty = [&] {
        empty_k<<<dim3(unsigned((sh.n + 7) / 8), unsigned((sh.m + 7) / 8)), 64, 0, st>>>();
        check_launch("empty");
      };
      product();
      check(cudaDeviceSynchronize(), "product");
      const auto got = [&] {
        std::vector<float> v(size_t(sh.m * sh.n));
        check(cudaMemcpy(v.data(), dy.get(), v.size() * 4, cudaMemcpyDeviceToHost), "y");
        return v;
      }();
      double worst = 0;
      for (int64_t r = 0; r < sh.m; r += std::max<int64_t>(1, sh.m / 8))
        for (int64_t c = 0; c < sh.n; c += 7) {
          double a = 0, s = 0;
          for (int64_t i = 0; i < sh.k; ++i) {
            const double p = double(x[size_t(r * sh.k + i)]) * wr[size_t(c * sh.k + i)];
            a += p;
            s += std::fabs(p);
          }
          worst = std::max(worst, std::fabs(got[size_t(r * sh.n + c)] - a) / std::max(s, 1e-30));
        }
      char note[96];
      std::snprintf(note, sizeof note, "worst |y - y_double| / sum |x w| %.2g", worst);
      const std::string name = std::string(sh.name) + " (" + std::to_string(sh.m) + ")";
      if (std::getenv("CLEFRT_LAB_ONCE")) {
        old();
        empty();
        check(cudaDeviceSynchronize(), "once");
        continue;
      }
      line(name, "product", bench::median_ms(st, product), bench::per_launch_ms(st, product), bytes, note);
      line(name, "8 warps split k", bench::median_ms(st, old), bench::per_launch_ms(st, old), bytes, "");
      line(name, "empty", bench::median_ms(st, empty), bench::per_launch_ms(st, empty), 0, "");
    }
    // the token-row GEMMs
    for (auto mkn : {std::tuple<int64_t, int64_t, int64_t>{318, 5120, 1024}, {318, 1024, 2048}, {8192, 5120, 1024}, {8192, 1024, 2048}, {32768, 5120, 1024}, {32768, 1024, 2048}}) {
      const int64_t m = std::get<0>(mkn), k = std::get<1>(mkn), n = std::get<2>(mkn);
      const auto x = randv(size_t(m * k), 1.0f), w = randv(size_t(n * k), 0.03f);
      DeviceBuffer dx = upload(x, "x"), dw = upload(w, "w"), dy(size_t(m * n) * 4);
      auto run = [&] { f32_gemm_3xtf32(dx.as<float>(), k, m, k, dw.as<float>(), k, n, dy.as<float>(), n, false, st); };
      if (std::getenv("CLEFRT_LAB_ONCE")) {
        run();
        check(cudaDeviceSynchronize(), "once");
        continue;
      }
      std::vector<float> first;  // the product's output: every tile must give its bits
      for (int bn : {0, 32, 64, 3232}) {  // the product's choice, then each tile
        f32_gemm_3xtf32_set_tile(bn);
        run();
        std::vector<float> out(size_t(m * n));
        check(cudaMemcpy(out.data(), dy.get(), out.size() * 4, cudaMemcpyDeviceToHost), "token-row y");
        if (first.empty()) first = out;
        const bool same = std::memcmp(out.data(), first.data(), out.size() * 4) == 0;
        const double one = bench::median_ms(st, run), per = bench::per_launch_ms(st, run);
        const double tf = 2.0 * double(m) * double(n) * double(k) / (per * 1e-3) / 1e12;
        const std::string tile = bn == 0 ? "product" : bn == 3232 ? "32 x 32" : "64 x " + std::to_string(bn);
        std::printf("f32_gemm_3xtf32 m %lld k %lld n %lld %-10s one %8.2f us  back to back %8.2f us  %6.1f TFLOP/s (fp32 products, 3 TF32 MMAs each)  %s\n",
                    (long long)m, (long long)k, (long long)n, tile.c_str(), one * 1e3, per * 1e3, tf,
                    same ? "same bits" : "DIFFERENT BITS from the product");
        json::Value r = json::Value::object();
        r.add("shape", json::Value::string("f32_gemm_3xtf32 " + std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n)));
        r.add("form", json::Value::string(tile));
        r.add("one_launch_us", json::Value::number(one * 1e3));
        r.add("back_to_back_us", json::Value::number(per * 1e3));
        r.add("tflops", json::Value::number(tf));
        recs.arr.push_back(r);
      }
      f32_gemm_3xtf32_set_tile(0);
      // the wgmma form (w as TF32 planes), the product's choice then each tile; bits against the
      // mma.sync product's (the same operations: equal unless the two instructions sum their
      // 8-wide k steps differently) and against its own choice (must be equal)
      if (!f32_gemm_3xtf32_wgmma_available()) continue;
      DeviceBuffer dhi(size_t(n * k) * 4), dlo(size_t(n * k) * 4);
      f32_split_tf32_planes(dw.as<float>(), n * k, dhi.as<float>(), dlo.as<float>(), st);
      auto runw = [&] { f32_gemm_3xtf32_wgmma(dx.as<float>(), k, m, k, dhi.as<float>(), dlo.as<float>(), k, n, dy.as<float>(), n, false, st); };
      std::vector<float> wfirst;
      for (int form : {0, 321, 641, 642, -1}) {  // -1: the product's tile, one step at a time (not pipelined)
        f32_gemm_3xtf32_wgmma_set_form(form < 0 ? 0 : form);
        f32_gemm_3xtf32_wgmma_set_pipelined(form >= 0);
        runw();
        std::vector<float> out(size_t(m * n));
        check(cudaMemcpy(out.data(), dy.get(), out.size() * 4, cudaMemcpyDeviceToHost), "token-row y (wgmma)");
        if (wfirst.empty()) wfirst = out;
        const bool same = std::memcmp(out.data(), wfirst.data(), out.size() * 4) == 0;
        size_t differ = 0;
        for (size_t i = 0; i < out.size(); ++i) differ += std::memcmp(&out[i], &first[i], 4) != 0;
        const double one = bench::median_ms(st, runw), per = bench::per_launch_ms(st, runw);
        const double tf = 2.0 * double(m) * double(n) * double(k) / (per * 1e-3) / 1e12;
        const std::string tile = form == 0 ? "product" : form == 321 ? "64 x 32" : form == 641 ? "64 x 64" : form == 642 ? "128 x 64" : "unpipelined";
        std::printf("f32_gemm_3xtf32_wgmma m %lld k %lld n %lld %-11s one %8.2f us  back to back %8.2f us  %6.1f TFLOP/s  %s; %zu of %zu values differ from mma.sync's\n",
                    (long long)m, (long long)k, (long long)n, tile.c_str(), one * 1e3, per * 1e3, tf,
                    same ? "same bits as its product" : "DIFFERENT BITS from its product", differ, out.size());
        json::Value r = json::Value::object();
        r.add("shape", json::Value::string("f32_gemm_3xtf32 " + std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n)));
        r.add("form", json::Value::string("wgmma " + tile));
        r.add("one_launch_us", json::Value::number(one * 1e3));
        r.add("back_to_back_us", json::Value::number(per * 1e3));
        r.add("tflops", json::Value::number(tf));
        r.add("values_differing_from_mma_sync", json::Value::number(double(differ)));
        recs.arr.push_back(r);
      }
      f32_gemm_3xtf32_wgmma_set_form(0);
      f32_gemm_3xtf32_wgmma_set_pipelined(true);
    }
    if (!o.json_out.empty())
      bench::write_record(o.json_out, hw, o.commit, "clefrt_bench_head_gemm", recs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_head_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}

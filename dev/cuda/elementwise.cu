// The backbone's memory-bound steps at the 27B shapes, each fused form beside the kernels it
// replaces (issue 20: the elementwise work): at 318 rows (the blog request) and 8,192.
//   gdn conv+prep  conv_silu_rows + gdn_prep (q / k norms, gates): three kernels, mixed written
//                  then read and written again; gdn_conv_prep: one kernel at Clef's shape; and
//                  under FP8 the in_proj's scale pass + gdn_conv_prep against gdn_conv_prep
//                  applying the scales as it reads; the one kernel with its registers capped
//                  for 3 CTAs an SM (the product's) against uncapped (CLEFRT_LAB_CONV_PREP_MIN_BLOCKS=0)
//   gated norm     gated_norm as the product runs it (float4 form at Dv = 128) and its general
//                  form, reached here with z's rows one float off 16-byte alignment; for the FP8
//                  out_proj (z unscaled, its FP8 scales applied as read), gated_norm +
//                  fp8_quantize_rows against gated_norm_fp8's forms (a token's heads over a
//                  cluster; one CTA a token, 2 / 3 / 4 / 6 / 8 heads a warp)
//   swiglu fp8     swiglu_fp8_scaled + fp8_quantize_rows (act written in bf16, read back) and
//                  swiglu_fp8_quant's forms (the down_proj's FP8 input straight from gate|up): a
//                  row in one CTA's shared memory (the product's below compute capability
//                  9.0), a row in one CTA's registers
//                  (uncapped and capped for two CTAs an SM), and a row over a cluster of CTAs,
//                  per cluster size and items a thread (compute capability 9.0 on; the one
//                  CLEFRT_LAB_SWIGLU_CLUSTER / _IPT select marked); the product's form capped
//                  for 4 CTAs an SM, without its scales (their cost), with the fast
//                  intrinsics' SiLU (what the exact one costs), and streamed (persistent
//                  clusters, the next row prefetched: this file's own form, out of the product
//                  since it lost in session 52); bf16's swiglu for scale
//   rms norm       the (1 + w) RMSNorm before each Linear: bf16 out, FP8 codes out, each plain
//                  and taking a pending FP8 residual add (the FP8 model's norms but the first),
//                  the fused add against scale_rows_cols_acc + the norm (its bits)
//   output gate    attention_output_gate after cuDNN's attention (24 heads of 256, the gate from
//                  the qkv rows): 8 values a thread, and the pair-a-thread kernel it falls back to,
//                  reached here with the gate one element off 16-byte alignment; for the FP8
//                  o_proj, the gate + fp8_quantize_rows against attention_output_gate_fp8
// A line: ms (CUDA-event median of 20), the rate of the step's least traffic (each input read
// once, each output written once) and its fraction of the measured copy rate, and the check
// against the unfused form (bits, or the largest difference where the sum order changed).
// Usage: clefrt_bench_elementwise [--commit ID] [--json FILE] [--m 318|8192: that size alone]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/ops/async_copy.cuh"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/ops/swiglu_fp8.cuh"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"

namespace clefrt::cuda {
namespace {

constexpr int64_t kHk = 16, kHv = 48, kDk = 128, kDv = 128, kConv = 2 * kHk * kDk + kHv * kDv, kInProj = kConv + kHv * kDv + 2 * kHv;
constexpr int64_t kFfn = 17408;

// The FP8 SwiGLU's streamed form, the lab's only: the product's cluster form of 2 CTAs of 4 items
// (swiglu_fp8.cuh) made persistent. It lost on an H100 (session 52 at 2e391fc: 35.2 us against
// the product's 26.4 at 318 rows, 0.510 against 0.387 ms at 8,192), so it left the product (where
// it was SwigluFp8Form::stream, CLEFRT_LAB_SWIGLU_STREAM=1, up to 2e391fc) for this file:
// cluster q takes rows q, q + C, q + 2 C, ... (C clusters in the grid, all resident where they
// fit), each CTA its half of the row's 16-byte items as swiglu_fp8_quant_cluster_row, and while
// it computes a row the next row's gate|up are already in flight: each thread's cp.async copies of
// its own items into the other of two shared-memory stages (a thread reads back only what it
// copied, so no barrier guards the stages). The cluster form waits a load's round trip for every
// row, its CTAs in rounds; here a cluster streams its rows. The same values, amax, scale and
// codes (the same per-element function and exchange); `scale` may be sc.rs as there: both CTAs
// read rs[t] before the row's cluster barrier, rank 0 writes scale[t] after it. The CTAs' maxima
// alternate between two slots: slot (k % 2) is written again two rows later, after a cluster
// barrier that every read of it comes before.
constexpr int kSwigluStreamIpt = 4;
// Its CTAs: at most 288 threads (ffn <= 18,432: Clef's 12,288 and 17,408), registers capped for
// MinBlocks CTAs an SM: 3 (the model's switch's when it had one: the blog's 318 rows resident at
// once; 72 registers, 64 bytes spilled) or 2 (the other line: 96, none spilled). Uncapped, ptxas
// takes 168 (more than a 288-thread CTA may hold at 3).
constexpr int kSwigluStreamThreads = 288;
template <int MinBlocks>
__global__ void __launch_bounds__(kSwigluStreamThreads, MinBlocks) swiglu_fp8_quant_stream_k(const bf16* gu, int64_t L, int64_t ffn, GuScales sc, bool vec, uint8_t* q, int64_t kp8, float* scale,
                                          int per) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_wait();
  namespace cg = cooperative_groups;
  constexpr int IPT = kSwigluStreamIpt;
  extern __shared__ uint4 stage[];  // [2 stages][gate, up][IPT blockDim.x items]
  __shared__ float sh[32];
  __shared__ float cta_max[2];
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank());
  const int64_t clusters = gridDim.x / 2;
  const int slots = IPT * int(blockDim.x), f8 = int(ffn / 8), i0 = rank * per, i1 = min(i0 + per, f8);
  auto prefetch = [&](int64_t t, int st) {
    const uint4* g = reinterpret_cast<const uint4*>(gu + t * 2 * ffn);
    const uint4* u = g + f8;
    uint4* sg = stage + 2 * st * slots;
#pragma unroll
    for (int k = 0; k < IPT; ++k) {
      const int j = int(threadIdx.x) + k * int(blockDim.x), i = i0 + j;
      if (i < i1) cp_async16(sg + j, g + i, true), cp_async16(sg + slots + j, u + i, true);
    }
    cp_async_commit();
  };
  int64_t t = blockIdx.x / 2;
  if (t < L) prefetch(t, 0);
#pragma unroll 1
  for (int k = 0; t < L; t += clusters, ++k) {
    const int st = k & 1;
    if (t + clusters < L) prefetch(t + clusters, st ^ 1);
    else cp_async_commit();  // an empty group: the wait below always leaves the newest one
    cp_async_wait<1>();      // this thread's copies of row t are in
    const float r = sc.rs ? sc.rs[t] : 1.0f;
    const uint4* sg = stage + 2 * st * slots;
    uint4 ov[IPT], uv[IPT];
#pragma unroll
    for (int kk = 0; kk < IPT; ++kk) {
      const int j = int(threadIdx.x) + kk * int(blockDim.x);
      if (i0 + j < i1) ov[kk] = sg[j], uv[kk] = sg[slots + j];
    }
    // The column scales are the same every row: left visible, the compiler hoists all IPT items'
    // (64 floats) out of the row loop and runs out of registers. Opaque pointers each row keep
    // their loads in it (L1 hits after the first row).
    GuScales scr = sc;
    asm volatile("" : "+l"(scr.cs_lo), "+l"(scr.cs_hi));
    float m = 0;
#pragma unroll
    for (int kk = 0; kk < IPT; ++kk) {
      const int i = i0 + int(threadIdx.x) + kk * int(blockDim.x);
      if (i < i1) {
        ov[kk] = swiglu8_scaled(ov[kk], uv[kk], r, scr, 8 * i, int(ffn), vec);
        m = absmax8_bf16(ov[kk], m);
      }
    }
    m = block_max(m, sh);
    if (threadIdx.x == 0) cta_max[st] = m;
    cl.sync();  // both CTAs' maxima of row t published (and rs[t] read)
    m = fmaxf(*cl.map_shared_rank(&cta_max[st], 0), *cl.map_shared_rank(&cta_max[st], 1));
    const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f, inv = fp8_row_recip(m, s);
    if (rank == 0 && threadIdx.x == 0) scale[t] = s;
    uint2* out = reinterpret_cast<uint2*>(q + t * kp8 * 8);
#pragma unroll
    for (int kk = 0; kk < IPT; ++kk) {
      const int i = i0 + int(threadIdx.x) + kk * int(blockDim.x);
      if (i < i1) out[i] = e4m3_encode8_bf16(ov[kk], s, inv);
    }
    for (int64_t i = f8 + int64_t(rank) * blockDim.x + threadIdx.x; i < kp8; i += 2 * int64_t(blockDim.x)) out[i] = make_uint2(0u, 0u);
  }
  cp_async_wait<0>();
  cl.sync();  // neither CTA leaves while the other may still read its maxima
#else
  __trap();  // never launched below compute capability 9.0 (swiglu8 runs it from 9.0 only)
#endif
}
// Its threads a CTA (swiglu_cluster_threads' of a cluster of 2, 4 items) and shared memory.
inline int64_t swiglu_stream_threads(int64_t ffn) { return swiglu_cluster_threads(ffn, 2, kSwigluStreamIpt); }
inline size_t swiglu_stream_smem(int64_t ffn) { return size_t(2 * 2 * kSwigluStreamIpt) * size_t(swiglu_stream_threads(ffn)) * 16; }
inline int swiglu_stream_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}
// The most dynamic shared memory the streamed kernel may take on the current device (its opt-in
// limit less the kernel's static shared memory), the kernel's attribute raised to it once a
// device; 0 where the binary has no code of it for the device.
template <int MinBlocks = 3>
inline size_t swiglu_stream_max_smem() {
  static std::mutex mu;
  static std::map<int, size_t> most;
  const int dev = swiglu_stream_device();
  std::lock_guard<std::mutex> lock(mu);
  auto it = most.find(dev);
  if (it != most.end()) return it->second;
  size_t m = 0;
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, swiglu_fp8_quant_stream_k<MinBlocks>) == cudaSuccess && a.binaryVersion >= 90) {
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "swiglu stream: shared memory limit");
    m = size_t(optin) > a.sharedSizeBytes ? size_t(optin) - a.sharedSizeBytes : 0;
    check(cudaFuncSetAttribute(swiglu_fp8_quant_stream_k<MinBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(m)),
          "swiglu stream: shared memory");
  }
  cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  return most.emplace(dev, m).first->second;
}
// clusters: the grid's (0: as many as are resident at once, from the occupancy API; fewer if L
// is smaller, and evened out so that every cluster takes about as many rows)
template <int MinBlocks = 3>
inline void launch_swiglu_fp8_quant_stream(const bf16* gu, int64_t L, int64_t ffn, const GuScales& sc, uint8_t* q, int64_t kp, float* scale,
                                           int clusters, cudaStream_t s) {
  if (swiglu_stream_threads(ffn) > kSwigluStreamThreads || swiglu_stream_smem(ffn) > swiglu_stream_max_smem<MinBlocks>())
    throw Error(Status::Internal, "internal_error", "swiglu stream: ffn " + std::to_string(ffn) + " over its 288 threads or the device's shared memory");
  const int64_t per = (ffn / 8 + 1) / 2, threads = swiglu_stream_threads(ffn);
  const size_t smem = swiglu_stream_smem(ffn);
  const cudaLaunchAttribute cluster = cluster_dim_x(2u);
  int64_t c = clusters;
  if (c <= 0) {
    // the resident clusters per device and block size (asked of the driver once)
    static std::mutex mu;
    static std::map<std::pair<int, int64_t>, int> resident;
    const std::pair<int, int64_t> key{swiglu_stream_device(), threads};
    std::lock_guard<std::mutex> lock(mu);
    auto it = resident.find(key);
    if (it == resident.end()) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(2);
      cfg.blockDim = dim3(unsigned(threads));
      cfg.dynamicSmemBytes = smem;
      cudaLaunchAttribute a = cluster;
      cfg.attrs = &a;
      cfg.numAttrs = 1;
      int most = 0;
      check(cudaOccupancyMaxActiveClusters(&most, swiglu_fp8_quant_stream_k<MinBlocks>, &cfg), "swiglu stream: resident clusters");
      it = resident.emplace(key, std::max(most, 1)).first;
    }
    const int64_t rounds = (L + it->second - 1) / it->second;
    c = (L + rounds - 1) / rounds;
  }
  c = std::max<int64_t>(1, std::min(c, L));
  launch_after_ex("swiglu_fp8_quant stream", swiglu_fp8_quant_stream_k<MinBlocks>, unsigned(2 * c), unsigned(threads), smem, s, &cluster, 1, gu, L, ffn, sc,
                  gu_scales_vec(sc, ffn), q, kp / 8, scale, int(per));
}

template <class T>
std::vector<T> down_all(const DeviceBuffer& b) {
  std::vector<T> v(b.bytes() / sizeof(T));
  check(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), "down");
  return v;
}
DeviceBuffer random_f32(size_t n, uint32_t seed, float std, float mean = 0.0f) {
  std::mt19937 r(seed);
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return upload(v, "random");
}

struct Line {
  std::string step, form;
  int64_t rows;
  double ms, bytes;
  std::string check;
};

std::vector<Line> printed;  // every line, for faster_than_product

void print(const Line& l, double copy_gbps, json::Value& out) {
  printed.push_back(l);
  const double gbps = l.bytes / (l.ms * 1e-3) / 1e9;
  std::printf("%-16s %-44s %6lld rows %8.4f ms %7.0f GB/s %5.1f%% of copy  %s\n", l.step.c_str(), l.form.c_str(), (long long)l.rows, l.ms,
              gbps, 100.0 * gbps / copy_gbps, l.check.c_str());
  json::Value v = json::Value::object();
  v.add("step", json::Value::string(l.step));
  v.add("form", json::Value::string(l.form));
  v.add("rows", json::Value::integer(l.rows));
  v.add("ms", json::Value::number(l.ms));
  v.add("least_traffic_gbps", json::Value::number(gbps));
  v.add("fraction_of_copy", json::Value::number(gbps / copy_gbps));
  v.add("check", json::Value::string(l.check));
  out.arr.push_back(std::move(v));
}

// Per step and size: a form with the product's bits at least 10% faster than the form the product
// runs (its line says "(the product" or "(the model's now)"). Session 43 found the FP8 gated
// norm's product form 30% behind another for six sessions, in lines nobody compared.
json::Value faster_than_product() {
  json::Value found = json::Value::array();
  for (const Line& p : printed) {
    if (p.form.find("(the product") == std::string::npos && p.form.find("(the model's now)") == std::string::npos) continue;
    const Line* best = nullptr;
    for (const Line& l : printed)
      if (l.step == p.step && l.rows == p.rows && l.check == "same bits" && l.ms < 0.9 * p.ms && (!best || l.ms < best->ms)) best = &l;
    if (!best) continue;
    std::printf("faster than the product: %s at %lld rows: %s %.4f ms against %s %.4f ms\n", p.step.c_str(), (long long)p.rows,
                best->form.c_str(), best->ms, p.form.c_str(), p.ms);
    json::Value v = json::Value::object();
    v.add("step", json::Value::string(p.step));
    v.add("rows", json::Value::integer(p.rows));
    v.add("product", json::Value::string(p.form));
    v.add("product_ms", json::Value::number(p.ms));
    v.add("faster", json::Value::string(best->form));
    v.add("faster_ms", json::Value::number(best->ms));
    found.arr.push_back(std::move(v));
  }
  if (found.arr.empty()) std::printf("faster than the product: none (no same-bits form 10%% under the product's)\n");
  return found;
}

std::string max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  char s[64];
  std::snprintf(s, sizeof s, "max |diff| %.3g", m);
  return s;
}

void conv_prep(int64_t L, cudaStream_t st, double copy, json::Value& out) {
  std::vector<int32_t> starts(size_t(L), 0);  // one sequence
  DeviceBuffer x = random_f32(size_t(L * kInProj), 1, 1.0f), w = random_f32(size_t(kConv * 4), 2, 0.5f), ds = upload(starts, "starts"),
               negA = random_f32(size_t(kHv), 3, 0.1f, -1.0f), dt = random_f32(size_t(kHv), 4, 1.0f);
  DeviceBuffer m1(size_t(L * kConv) * 4), m2(size_t(L * kConv) * 4), g1(size_t(L * kHv) * 4), g2(size_t(L * kHv) * 4), b1(size_t(L * kHv) * 4),
      b2(size_t(L * kHv) * 4);
  const float* bcol = x.as<float>() + kConv + kHv * kDv;
  const double bytes = double(L) * (2 * kConv + 4 * kHv) * 4;
  const double t1 = bench::median_ms(st, [&] {
    conv_silu_rows(x.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, kConv, w.as<float>(), 4, m1.as<float>(), st);
    gdn_prep(m1.as<float>(), kConv, L, kHk, kDk, bcol, bcol + kHv, kInProj, kHv, negA.as<float>(), dt.as<float>(), g1.as<float>(), b1.as<float>(), st);
  });
  const double t2 = bench::median_ms(st, [&] {
    gdn_conv_prep(x.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, w.as<float>(), 4, kConv, kHk, kDk, bcol, bcol + kHv, kInProj, kHv,
                  negA.as<float>(), dt.as<float>(), m2.as<float>(), g2.as<float>(), b2.as<float>(), st, {}, {}, 0);
  });
  const bool gates_same = down_all<float>(g1) == down_all<float>(g2) && down_all<float>(b1) == down_all<float>(b2);
  print({"gdn conv+prep", "conv_silu_rows + gdn_prep (3 kernels)", L, t1, bytes, "reference"}, copy, out);
  print({"gdn conv+prep", "gdn_conv_prep (1 kernel, uncapped)", L, t2, bytes,
         max_diff(down_all<float>(m2), down_all<float>(m1)) + (gates_same ? ", gates same bits" : ", GATES DIFFER")},
        copy, out);
  // FP8: the in_proj's scale pass over its q|k|v|z columns, then the conv, against the conv
  // applying the scales as it reads (the z columns' scales then go to the gated norm's reads)
  DeviceBuffer rs = random_f32(size_t(L), 11, 1e-3f, 1e-2f), cs = random_f32(size_t(kConv + kHv * kDv), 12, 1e-4f, 1e-3f),
               xs(x.bytes()), m3(size_t(L * kConv) * 4);
  const double t3 = bench::median_ms(st, [&] {
    check(cudaMemcpyAsync(xs.get(), x.get(), x.bytes(), cudaMemcpyDeviceToDevice, st), "x copy");  // the pass works in place
    scale_rows_cols_f32(xs.as<float>(), L, kConv + kHv * kDv, kInProj, rs.as<float>(), cs.as<float>(), st);
    gdn_conv_prep(xs.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, w.as<float>(), 4, kConv, kHk, kDk, bcol, bcol + kHv, kInProj, kHv,
                  negA.as<float>(), dt.as<float>(), m2.as<float>(), g2.as<float>(), b2.as<float>(), st);
  });
  const double tc = bench::median_ms(st, [&] { check(cudaMemcpyAsync(xs.get(), x.get(), x.bytes(), cudaMemcpyDeviceToDevice, st), "x copy"); });
  const double t4 = bench::median_ms(st, [&] {
    gdn_conv_prep(x.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, w.as<float>(), 4, kConv, kHk, kDk, bcol, bcol + kHv, kInProj, kHv,
                  negA.as<float>(), dt.as<float>(), m3.as<float>(), g1.as<float>(), b1.as<float>(), st, {}, RowColScales{rs.as<float>(), cs.as<float>()}, 0);
  });
  const bool same = down_all<float>(m2) == down_all<float>(m3);
  print({"gdn conv+prep fp8", "scale pass + gdn_conv_prep (less the copy)", L, t3 - tc, bytes, "reference"}, copy, out);
  print({"gdn conv+prep fp8", "gdn_conv_prep scaling as it reads, uncapped", L, t4, bytes, same ? "same bits" : "BITS DIFFER"}, copy, out);
  // the one kernel with its registers capped for 3 CTAs an SM (uncapped: 2; the product's), bf16
  // and FP8 reads
  DeviceBuffer m4(size_t(L * kConv) * 4), m5(size_t(L * kConv) * 4);
  const double tb = bench::median_ms(st, [&] {
    gdn_conv_prep(x.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, w.as<float>(), 4, kConv, kHk, kDk, bcol, bcol + kHv, kInProj, kHv,
                  negA.as<float>(), dt.as<float>(), m4.as<float>(), g2.as<float>(), b2.as<float>(), st, {}, {}, 3);
  });
  const double tf = bench::median_ms(st, [&] {
    gdn_conv_prep(x.as<float>(), kInProj, 0, ds.as<int32_t>(), 0, L, w.as<float>(), 4, kConv, kHk, kDk, bcol, bcol + kHv, kInProj, kHv,
                  negA.as<float>(), dt.as<float>(), m5.as<float>(), g1.as<float>(), b1.as<float>(), st, {}, RowColScales{rs.as<float>(), cs.as<float>()}, 3);
  });
  print({"gdn conv+prep", "gdn_conv_prep capped for 3 (the product)", L, tb, bytes, max_diff(down_all<float>(m4), down_all<float>(m1))}, copy, out);
  print({"gdn conv+prep fp8", "gdn_conv_prep capped for 3 (the product)", L, tf, bytes, down_all<float>(m5) == down_all<float>(m3) ? "same bits" : "BITS DIFFER"},
        copy, out);
}

void gated(int64_t L, cudaStream_t st, double copy, json::Value& out) {
  const int64_t vd = kHv * kDv;
  DeviceBuffer o = random_f32(size_t(L * vd), 5, 1.0f), z = random_f32(size_t(L * kInProj) + 1, 6, 1.0f), w = random_f32(size_t(kDv), 7, 0.1f, 1.0f);
  DeviceBuffer a1(size_t(L * vd) * 2), a2(size_t(L * vd) * 2);
  const double bytes = double(L) * vd * (4 + 4 + 2);
  const double t1 = bench::median_ms(st, [&] { gated_norm(o.as<float>(), L, kHv, kDv, w.as<float>(), 1e-6f, z.as<float>() + kConv, kInProj, a1.as<bf16>(), st); });
  // the general form: z's rows one float further on (not 16-byte aligned), same values per row
  DeviceBuffer z2(z.bytes());
  check(cudaMemcpy(z2.as<float>() + 1, z.get(), z.bytes() - 4, cudaMemcpyDeviceToDevice), "z shifted");
  const double t2 = bench::median_ms(st, [&] { gated_norm(o.as<float>(), L, kHv, kDv, w.as<float>(), 1e-6f, z2.as<float>() + 1 + kConv, kInProj, a2.as<bf16>(), st); });
  const auto v1 = down_all<bf16>(a1), v2 = down_all<bf16>(a2);
  std::vector<float> f1(v1.size()), f2(v2.size());
  for (size_t i = 0; i < v1.size(); ++i) f1[i] = __bfloat162float(v1[i]), f2[i] = __bfloat162float(v2[i]);
  print({"gated norm", "general form (z rows unaligned)", L, t2, bytes, "reference"}, copy, out);
  print({"gated norm", "float4 form (the product at Dv 128)", L, t1, bytes, max_diff(f1, f2)}, copy, out);
  // FP8 out_proj's input, z an unscaled FP8 in_proj output as in the model (its row and column
  // scales applied as read): the float4 form + fp8_quantize_rows against gated_norm_fp8's forms
  // (hpw 0: a token's heads over a thread block cluster; else one CTA, hpw heads a warp)
  const int64_t vd8 = vd;
  DeviceBuffer zrs = random_f32(size_t(L), 11, 1e-3f, 1e-2f), zcs = random_f32(size_t(kInProj), 12, 1e-2f, 1e-1f);
  const RowColScales zs{zrs.as<float>(), zcs.as<float>() + kConv};
  DeviceBuffer q1(size_t(L * vd8)), q2(size_t(L * vd8)), s1(size_t(L) * 4), s2(size_t(L) * 4);
  const double bytes8 = double(L) * vd8 * (4 + 4 + 1);
  const double t3 = bench::median_ms(st, [&] {
    gated_norm(o.as<float>(), L, kHv, kDv, w.as<float>(), 1e-6f, z.as<float>() + kConv, kInProj, a1.as<bf16>(), st, zs);
    fp8_quantize_rows(a1.as<bf16>(), L, vd8, vd8, q1.as<uint8_t>(), vd8, s1.as<float>(), st);
  });
  print({"gated norm fp8", "float4 form + fp8_quantize_rows (unfused)", L, t3, bytes8, "reference"}, copy, out);
  const auto ref_q = down_all<uint8_t>(q1);
  const auto ref_s = down_all<float>(s1);
  for (int hpw : {0, 2, 3, 4, 6, 8}) {
    if (!gated_norm_fp8_fits(kHv, kDv, vd8, hpw)) continue;
    check(cudaMemset(q2.get(), 0xff, q2.bytes()), "q2");
    const double t4 = bench::median_ms(st, [&] {
      gated_norm_fp8(o.as<float>(), L, kHv, kDv, w.as<float>(), 1e-6f, z.as<float>() + kConv, kInProj, zs, q2.as<uint8_t>(), vd8, s2.as<float>(), st, hpw);
    });
    const bool same = down_all<uint8_t>(q2) == ref_q && down_all<float>(s2) == ref_s;
    const std::string name = hpw == 0 ? "gated_norm_fp8, a row over a cluster" : "gated_norm_fp8, one CTA, " + std::to_string(hpw) + " heads a warp" + (hpw == 4 ? " (the product at Clef's heads)" : "");
    print({"gated norm fp8", name.c_str(), L, t4, bytes8, same ? "same bits" : "BITS DIFFER"}, copy, out);
  }
}

void swiglu8(int64_t L, cudaStream_t st, double copy, json::Value& out) {
  std::vector<bf16> gu(size_t(L * 2 * kFfn));
  std::mt19937 r(8);
  std::normal_distribution<float> d(0.0f, 20.0f);
  for (auto& v : gu) v = __float2bfloat16(d(r));
  DeviceBuffer dgu = upload(gu, "gu"), rs = random_f32(size_t(L), 9, 1e-3f, 1e-2f), cs = random_f32(size_t(2 * kFfn), 10, 1e-4f, 1e-3f);
  DeviceBuffer act(size_t(L * kFfn) * 2), q1(size_t(L * kFfn)), q2(size_t(L * kFfn)), s1(size_t(L) * 4), s2(size_t(L) * 4);
  const double bytes_fp8 = double(L) * kFfn * (4 + 1), bytes_bf16 = double(L) * kFfn * (4 + 2);
  const double tb = bench::median_ms(st, [&] { swiglu(dgu.as<bf16>(), L, kFfn, act.as<bf16>(), st); });
  const double t1 = bench::median_ms(st, [&] {
    swiglu_fp8_scaled(dgu.as<bf16>(), L, kFfn, rs.as<float>(), cs.as<float>(), nullptr, 2 * kFfn, act.as<bf16>(), st);
    fp8_quantize_rows(act.as<bf16>(), L, kFfn, kFfn, q1.as<uint8_t>(), kFfn, s1.as<float>(), st);
  });
  const GuScales sc{rs.as<float>(), cs.as<float>(), nullptr, 2 * kFfn};
  const double t2 = bench::median_ms(st, [&] { launch_swiglu_fp8_quant_rows(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), st); });
  const bool same = down_all<uint8_t>(q1) == down_all<uint8_t>(q2) && down_all<float>(s1) == down_all<float>(s2);
  // the register variant: uncapped (78 registers, one CTA an SM), then capped at 56 (two, spills)
  auto regs = [&](auto run) {
    check(cudaMemset(q2.get(), 0, q2.bytes()), "clear");
    check(cudaMemset(s2.get(), 0xab, s2.bytes()), "poison the scales");  // a form must write them
    const double t = bench::median_ms(st, run);
    return std::make_pair(t, down_all<uint8_t>(q1) == down_all<uint8_t>(q2) && down_all<float>(s1) == down_all<float>(s2));
  };
  const auto [t3, same3] = regs([&] { launch_swiglu_fp8_quant_regs<1>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), st); });
  const auto [t4, same4] = regs([&] { launch_swiglu_fp8_quant_regs<2>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), st); });
  print({"swiglu", "bf16 swiglu (the bf16 model's)", L, tb, bytes_bf16, "-"}, copy, out);
  print({"swiglu fp8", "swiglu_fp8_scaled + fp8_quantize_rows", L, t1, bytes_fp8, "reference"}, copy, out);
  print({"swiglu fp8", "a row in one CTA's shared memory", L, t2, bytes_fp8, same ? "same bits" : "BITS DIFFER"}, copy, out);
  print({"swiglu fp8", "registers, one CTA an SM", L, t3, bytes_fp8, same3 ? "same bits" : "BITS DIFFER"}, copy, out);
  const bool regs_now = swiglu_fp8_form(L).min_blocks == 2;
  print({"swiglu fp8", std::string("registers, 2 CTAs an SM (spills)") + (regs_now ? " (the model's now)" : ""), L, t4, bytes_fp8,
         same4 ? "same bits" : "BITS DIFFER"},
        copy, out);
  // the cluster form (compute capability 9.0 on): a row over `cl` CTAs, `ipt` items a thread
  if (device_info().major >= 9) {
    const SwigluFp8Form product = swiglu_fp8_form(L);
    for (const std::pair<int, int> form : {std::pair{8, 1}, std::pair{4, 1}, std::pair{4, 2}, std::pair{2, 2}, std::pair{2, 4}, std::pair{1, 4}}) {
      const int cl = form.first, ipt = form.second;
      const auto [tc, samec] = regs([&] {
        if (ipt == 1) launch_swiglu_fp8_quant_cluster<1>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), cl, st);
        else if (ipt == 2) launch_swiglu_fp8_quant_cluster<2>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), cl, st);
        else launch_swiglu_fp8_quant_cluster<4>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), cl, st);
        check_launch("swiglu_fp8_quant_cluster");
      });
      const std::string name = "cluster of " + std::to_string(cl) + ", " + std::to_string(ipt) + " items a thread" +
                               (product.min_blocks == 0 && product.cluster == cl && product.ipt == ipt ? " (the model's now)" : "");
      print({"swiglu fp8", name, L, tc, bytes_fp8, samec ? "same bits" : "BITS DIFFER"}, copy, out);
    }
    // the product's form (2 CTAs of 4 items) with its registers capped for a fourth CTA an SM; then
    // without the scales at all, which is what they cost (not the product's bits)
    const auto [tl, samel] = regs([&] { launch_swiglu_fp8_quant_cluster_lab<4>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), st); });
    print({"swiglu fp8", "2 x 4, capped for 4 CTAs an SM", L, tl, bytes_fp8, samel ? "same bits" : "BITS DIFFER"}, copy, out);
    const double tu = bench::median_ms(st, [&] { launch_swiglu_fp8_quant_cluster<4>(dgu.as<bf16>(), L, kFfn, GuScales{}, q2.as<uint8_t>(), kFfn, s2.as<float>(), 2, st); });
    print({"swiglu fp8", "2 x 4 unscaled (what the scales cost)", L, tu, bytes_fp8, "not the product's bits"}, copy, out);
    // silu from __expf / __fdividef: whether the step is bound by its instructions (the exact
    // expf and division are ~20 of its ~50 a value); the codes that differ from the product's
    const double tf = bench::median_ms(st, [&] { launch_swiglu_fp8_quant_cluster<4, true>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), 2, st); });
    const std::vector<uint8_t> qf = down_all<uint8_t>(q2), qr = down_all<uint8_t>(q1);
    size_t differ = 0;
    for (size_t i = 0; i < qf.size(); ++i) differ += qf[i] != qr[i];
    print({"swiglu fp8", "2 x 4, fast silu (what the exact one costs)", L, tf, bytes_fp8,
           "not the product's bits: " + std::to_string(differ) + " of " + std::to_string(qf.size()) + " codes differ"},
          copy, out);
    // the product's form made persistent (launch_swiglu_fp8_quant_stream above, the lab's only):
    // each cluster its rows in turn, the next row's gate|up copied into shared memory while this
    // one's are computed (registers capped for 3 CTAs an SM; and for 2, no spills)
    const auto [ts, sames] = regs([&] { launch_swiglu_fp8_quant_stream<3>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), 0, st); });
    print({"swiglu fp8", "2 x 4 streamed, 3 CTAs an SM", L, ts, bytes_fp8, sames ? "same bits" : "BITS DIFFER"}, copy, out);
    const auto [ts2, sames2] = regs([&] { launch_swiglu_fp8_quant_stream<2>(dgu.as<bf16>(), L, kFfn, sc, q2.as<uint8_t>(), kFfn, s2.as<float>(), 0, st); });
    print({"swiglu fp8", "2 x 4 streamed, 2 CTAs an SM", L, ts2, bytes_fp8, sames2 ? "same bits" : "BITS DIFFER"}, copy, out);
  }
}

// The (1 + w) RMSNorms before each Linear (hidden 5,120): bf16's and the FP8 one that quantizes
// for its GEMM, each plain and taking a pending FP8 residual add (x += t rs cs, the last down /
// out / o_proj's unscaled output: the FP8 model's every norm but the first); the add's unfused
// pair (scale_rows_cols_acc, then the norm) as the reference the fused forms' bits are held to.
// The fused forms update x in place: timed on a drifting x (increments ~1e-5 a run), checked on
// fresh copies.
void norms(int64_t L, cudaStream_t st, double copy, json::Value& out) {
  constexpr int64_t d = 5120;
  constexpr float eps = 1e-6f;
  DeviceBuffer x0 = random_f32(size_t(L * d), 21, 1.0f), w = random_f32(size_t(d), 22, 0.1f), t = random_f32(size_t(L * d), 23, 1.0f),
               rs = random_f32(size_t(L), 24, 1e-3f, 1e-2f), cs = random_f32(size_t(d), 25, 1e-4f, 1e-3f);
  DeviceBuffer xa(x0.bytes()), xb(x0.bytes()), y16(size_t(L * d) * 2), q1(size_t(L * d)), q2(size_t(L * d)), s1(size_t(L) * 4), s2(size_t(L) * 4);
  const ResidualFp8 add{t.as<float>(), d, rs.as<float>(), cs.as<float>()};
  auto fresh = [&](DeviceBuffer& x) { check(cudaMemcpyAsync(x.get(), x0.get(), x0.bytes(), cudaMemcpyDeviceToDevice, st), "x copy"); };
  const double row4 = double(L) * d * 4;  // an fp32 [L, d] read or written once
  fresh(xa);
  const double tb = bench::median_ms(st, [&] { rms_norm_1p(xa.as<float>(), L, d, w.as<float>(), eps, y16.as<bf16>(), nullptr, st); });
  const double t8 = bench::median_ms(st, [&] { rms_norm_1p_fp8(xa.as<float>(), L, d, w.as<float>(), eps, nullptr, q1.as<uint8_t>(), d, s1.as<float>(), st); });
  const double tba = bench::median_ms(st, [&] { rms_norm_1p_add(xa.as<float>(), L, d, add, w.as<float>(), eps, y16.as<bf16>(), st); });
  const double tu = bench::median_ms(st, [&] {
    scale_rows_cols_acc(t.as<float>(), L, d, d, rs.as<float>(), cs.as<float>(), xa.as<float>(), d, st);
    rms_norm_1p_fp8(xa.as<float>(), L, d, w.as<float>(), eps, nullptr, q1.as<uint8_t>(), d, s1.as<float>(), st);
  });
  const double t8a =
      bench::median_ms(st, [&] { rms_norm_1p_fp8_add(xa.as<float>(), L, d, add, w.as<float>(), eps, nullptr, q2.as<uint8_t>(), d, s2.as<float>(), st); });
  // the bits: the fused FP8 add against the unfused pair, each from x0
  fresh(xa);
  fresh(xb);
  scale_rows_cols_acc(t.as<float>(), L, d, d, rs.as<float>(), cs.as<float>(), xa.as<float>(), d, st);
  rms_norm_1p_fp8(xa.as<float>(), L, d, w.as<float>(), eps, nullptr, q1.as<uint8_t>(), d, s1.as<float>(), st);
  rms_norm_1p_fp8_add(xb.as<float>(), L, d, add, w.as<float>(), eps, nullptr, q2.as<uint8_t>(), d, s2.as<float>(), st);
  check(cudaStreamSynchronize(st), "norms");
  const bool same = down_all<uint8_t>(q1) == down_all<uint8_t>(q2) && down_all<float>(s1) == down_all<float>(s2) &&
                    down_all<float>(xa) == down_all<float>(xb);
  print({"rms norm", "bf16 out (the bf16 model's)", L, tb, row4 + row4 / 2, "-"}, copy, out);
  print({"rms norm", "bf16 out, pending FP8 add taken", L, tba, 3 * row4 + row4 / 2, "-"}, copy, out);
  print({"rms norm fp8", "FP8 codes out", L, t8, row4 + row4 / 4, "-"}, copy, out);
  print({"rms norm fp8 add", "scale_rows_cols_acc + rms_norm_1p_fp8", L, tu, 3 * row4 + row4 / 4, "reference"}, copy, out);
  print({"rms norm fp8 add", "rms_norm_1p_fp8_add (the product)", L, t8a, 3 * row4 + row4 / 4, same ? "same bits" : "BITS DIFFER"}, copy, out);
}

void output_gate(int64_t L, cudaStream_t st, double copy, json::Value& out) {
  constexpr int64_t Hq = 24, D = 256, ld = 2 * Hq * D + 2 * 4 * D;  // the 27B attention's qkv rows (q | gate per head, k, v)
  std::vector<bf16> x(size_t(L * Hq * D)), g(size_t(L * ld + 1));
  std::mt19937 r(11);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& v : x) v = __float2bfloat16(d(r));
  for (auto& v : g) v = __float2bfloat16(d(r));
  std::vector<bf16> g_off(g.size() + 1);
  for (size_t i = 0; i < g.size(); ++i) g_off[i + 1] = g[i];
  DeviceBuffer x0 = upload(x, "out"), o1(x0.bytes()), o2(x0.bytes()), dg = upload(g, "gate"), dg_off = upload(g_off, "gate, an element off");
  // each timed run gates a fresh copy of the output (the copy's time is measured and subtracted)
  auto fresh = [&](DeviceBuffer& o) { check(cudaMemcpyAsync(o.get(), x0.get(), x0.bytes(), cudaMemcpyDeviceToDevice, st), "out copy"); };
  const double tc = bench::median_ms(st, [&] { fresh(o1); });
  const double t8 = bench::median_ms(st, [&] {
    fresh(o1);
    attention_output_gate(o1.as<bf16>(), L, Hq, D, dg.as<bf16>() + D, ld, 2 * D, st);
  }) - tc;
  const double t2 = bench::median_ms(st, [&] {
    fresh(o2);
    attention_output_gate(o2.as<bf16>(), L, Hq, D, dg_off.as<bf16>() + 1 + D, ld, 2 * D, st);
  }) - tc;
  const bool same = down_all<uint16_t>(o1) == down_all<uint16_t>(o2);
  const double bytes = double(L) * Hq * D * 2 * 3;  // out read and written, the gate read
  print({"output gate", "pair a thread (unaligned gate)", L, t2, bytes, "reference"}, copy, out);
  print({"output gate", "8 a thread (the product where aligned)", L, t8, bytes, same ? "same bits" : "BITS DIFFER"}, copy, out);
  // the FP8 o_proj's input: the gate + fp8_quantize_rows against attention_output_gate_fp8
  const int64_t n = Hq * D;
  DeviceBuffer q1(size_t(L * n)), q2(size_t(L * n)), s1(size_t(L) * 4), s2(size_t(L) * 4);
  const double t3 = bench::median_ms(st, [&] {
    fresh(o1);
    attention_output_gate(o1.as<bf16>(), L, Hq, D, dg.as<bf16>() + D, ld, 2 * D, st);
    fp8_quantize_rows(o1.as<bf16>(), L, n, n, q1.as<uint8_t>(), n, s1.as<float>(), st);
  }) - tc;
  const double t4 = bench::median_ms(st, [&] {
    attention_output_gate_fp8(x0.as<bf16>(), L, Hq, D, dg.as<bf16>() + D, ld, 2 * D, q2.as<uint8_t>(), n, s2.as<float>(), st);
  });
  const bool same8 = down_all<uint8_t>(q1) == down_all<uint8_t>(q2) && down_all<float>(s1) == down_all<float>(s2);
  print({"output gate fp8", "8 a thread + fp8_quantize_rows (unfused)", L, t3, double(L) * n * (2 * 2 + 1), "reference"}, copy, out);
  print({"output gate fp8", "attention_output_gate_fp8 (the product)", L, t4, double(L) * n * (2 * 2 + 1), same8 ? "same bits" : "BITS DIFFER"}, copy, out);
}

}  // namespace
}  // namespace clefrt::cuda

int main(int argc, char** argv) {
  using namespace clefrt;
  using namespace clefrt::cuda;
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  const HardwareLimits hw = bench::measure_and_print_hardware();
  cudaStream_t st;
  check(cudaStreamCreate(&st), "stream");
  json::Value lines = json::Value::array();
  for (int64_t L : {int64_t(318), int64_t(8192)}) {
    if (opt.only_m > 0 && L != opt.only_m) continue;  // --m: one of the two sizes (an Nsight Compute run)
    conv_prep(L, st, hw.copy_gbps, lines);
    gated(L, st, hw.copy_gbps, lines);
    swiglu8(L, st, hw.copy_gbps, lines);
    output_gate(L, st, hw.copy_gbps, lines);
    norms(L, st, hw.copy_gbps, lines);
  }
  // after the lines, what the lab says the product should run instead (an object of its own)
  json::Value tail = json::Value::object();
  tail.add("faster_than_product", faster_than_product());
  lines.arr.push_back(std::move(tail));
  if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_elementwise", std::move(lines));
  cudaStreamDestroy(st);
  return 0;
}

// cuDNN's fused attention (the product's graphs: src/cuda/runtime/cudnn_attention.h) at the
// vision tower's and the backbone's shapes beside clefrt's kernels (flash_attention_full,
// flash_attention). Dense points (one layout per sequence, the tower's padded heads), then the
// product's ragged path (packed sequences of any lengths, per-sequence lengths as a padding mask,
// bottom-right causal for continuations), printing per point:
//   ours       clefrt's kernel (no output gate), ms and TF/s
//   cudnn      the plan's execution, ms, TF/s, the largest |difference| from ours (both bf16;
//              ours is within the GPU tests' bounds of the CPU's fp32), outputs not finite or not
//              written (the buffer starts as NaN), the engine configuration taken and the time to
//              build the plan (paid once per bound: the product keeps its plans)
//   bits       outputs differing in any bit between: a sequence alone and in a batch, plans of
//              different bounds, a batch with empty sequences after it, a continuation's queries
//              and the same queries of the whole sequence (0: the product's batch invariance,
//              prefix cache and steps keep their bits on this path)
// Usage: clefrt_bench_cudnn_attn [--commit ID] [--json FILE]
// Run with cuDNN 9's libraries on LD_LIBRARY_PATH (the GPU machine: PyTorch's nvidia-cudnn-cu13).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/cudnn_attention.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"

using namespace clefrt;
using namespace clefrt::cuda;

namespace {

using Attention = CudnnGraph;
using Shape = CudnnShape;
// the product's dense layouts: q [rows, hq, dq], k / v [rows, hkv, dq], o [rows, hq, d]
Shape dense(int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d, int64_t dq, bool causal) {
  return {b, s, s, hq, hkv, d, hq * dq, dq, hkv * dq, dq, hkv * dq, dq, hq * d, causal};
}

std::vector<uint16_t> down_bf16(const bf16* p, size_t n) {
  std::vector<uint16_t> h(n);
  check(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), "download");
  return h;
}
using bench::bf16_float;


// ---- the product's packed batches: ragged offsets, per-sequence lengths, bottom-right causal ----
int64_t bucket(int64_t n) { return cudnn_bound(n); }

struct Packed {  // sequences packed one after another (rows), keys / values in the same rows
  std::vector<int32_t> len;   // queries of each sequence
  std::vector<int32_t> kv;    // keys of each (>= len: a continuation sees kv - len cached rows first)
  std::vector<int32_t> qrow;  // its first query row
  std::vector<int32_t> krow;  // its first key row
};

// The offsets / lengths for b (>= the sequences: the rest empty) on the GPU, the layout's strides
// applied; and our kernel's tiles for the same batch.
struct RaggedArgs {
  DeviceBuffer buf;
  CudnnRagged r{};
  DeviceBuffer tiles;
  AttnTiles at{};
};
RaggedArgs ragged_args(const Packed& p, int64_t b, const Shape& g) {
  const size_t n = p.len.size();
  std::vector<RaggedSeq> seqs;
  for (size_t i = 0; i < n; ++i) seqs.push_back({p.qrow[i], p.len[i], p.krow[i], p.kv[i]});
  std::vector<int32_t> h;
  append_ragged(h, seqs, b, g.ldq, g.ldk, g.ldv, g.ldo);
  RaggedArgs a;
  a.buf = DeviceBuffer(h.size() * 4, "ragged offsets");
  check(cudaMemcpy(a.buf.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), "ragged offsets");
  a.r = ragged_at(a.buf.as<int32_t>(), b);
  // our kernel's tiles: 64 queries each; query row r is key row r + delta
  std::vector<int32_t> tq, ts, te, td;
  for (size_t i = 0; i < n; ++i) {
    const int32_t delta = p.krow[i] + (p.kv[i] - p.len[i]) - p.qrow[i];
    for (int32_t t = 0; t < p.len[i]; t += 64) {
      tq.push_back(p.qrow[i] + t);
      ts.push_back(p.krow[i]);
      te.push_back(p.krow[i] + p.kv[i]);
      td.push_back(delta);
    }
  }
  std::vector<int32_t> all = tq;
  for (auto* v : {&ts, &te, &td}) all.insert(all.end(), v->begin(), v->end());
  a.tiles = DeviceBuffer(all.size() * 4, "tiles");
  check(cudaMemcpy(a.tiles.get(), all.data(), all.size() * 4, cudaMemcpyHostToDevice), "tiles");
  const int64_t nt = int64_t(tq.size());
  const int32_t* t = a.tiles.as<int32_t>();
  a.at = {t, t + nt, t + 2 * nt, nt, t + 3 * nt};
  return a;
}

void ragged_points(void* handle, const HardwareLimits& hw, cudaStream_t st, json::Value& records) {
  // the 27B backbone: q [rows, 24, 256], k [rows, 4, 256]; v in the qkv GEMM's rows (ldv 14,336:
  // a batch without cached prefixes) or in its own rows (1,024: with them)
  const int64_t hq = 24, hkv = 4, d = 256, ld_fused = hq * 2 * d + 2 * hkv * d, rows = 32768 + 64;
  auto shape = [&](int64_t b, int64_t sq, int64_t skv, int64_t ldv) {
    Shape g{b, sq, skv, hq, hkv, d, hq * d, d, hkv * d, d, ldv, d, hq * d, true, true};
    return g;
  };
  DeviceBuffer q(size_t(rows * hq * d) * 2, "q"), k(size_t(rows * hkv * d) * 2, "k"), v(size_t(rows * ld_fused) * 2, "v"),
      ours(size_t(rows * hq * d) * 2, "ours"), a(size_t(rows * hq * d) * 2, "a"), bb(size_t(rows * hq * d) * 2, "b"),
      ref(size_t(rows * hq * d) * 2, "the static plan's mixed batch");
  fill_normal_bf16(q.as<bf16>(), rows * hq * d, 31, 0.0f, 1.0f, st);
  fill_normal_bf16(k.as<bf16>(), rows * hkv * d, 32, 0.0f, 1.0f, st);
  fill_normal_bf16(v.as<bf16>(), rows * ld_fused, 33, 0.0f, 1.0f, st);
  auto nan_fill = [&](DeviceBuffer& x) { check(cudaMemsetAsync(x.get(), 0xFF, x.bytes(), st), "NaN fill"); };
  auto rows_of = [&](const DeviceBuffer& x, int64_t r0, int64_t n) {
    std::vector<uint16_t> h(size_t(n * hq * d));
    check(cudaStreamSynchronize(st), "sync");
    check(cudaMemcpy(h.data(), x.as<bf16>() + r0 * hq * d, h.size() * 2, cudaMemcpyDeviceToHost), "download");
    return h;
  };
  auto differ = [](const std::vector<uint16_t>& x, const std::vector<uint16_t>& y) {
    size_t n = 0;
    for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
    return n;
  };
  auto worst = [](const std::vector<uint16_t>& x, const std::vector<uint16_t>& y, size_t* bad) {
    double w = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double t = double(bf16_float(y[i]));
      if (!std::isfinite(t)) ++*bad;
      else w = std::max(w, std::fabs(double(bf16_float(x[i])) - t));
    }
    return w;
  };
  auto packed = [](const std::vector<int32_t>& lens) {
    Packed p;
    int32_t r = 0;
    for (int32_t n : lens) {
      p.len.push_back(n);
      p.kv.push_back(n);
      p.qrow.push_back(r);
      p.krow.push_back(r);
      r += n;
    }
    return p;
  };
  auto flop_of = [&](const Packed& p) {
    double f = 0;
    for (size_t i = 0; i < p.len.size(); ++i)  // causal: each query sees its own prefix
      f += 4.0 * d * hq * double(p.len[i]) * (double(p.kv[i]) - double(p.len[i]) / 2.0);
    return f;
  };
  auto say = [&](json::Value& r, const char* key, double x) { r.add(key, json::Value::number(x)); };
  // one packed batch through both kernels: time, difference, the outputs kept in `out`
  auto point = [&](const char* name, const Packed& p, const Shape& g, DeviceBuffer& out, bool time_it) {
    json::Value r = json::Value::object();
    r.add("shape", json::Value::string(name));
    std::printf("\n%s (plan bounds b %lld, s_q %lld, s_kv %lld, ldv %lld%s)\n", name, (long long)g.b, (long long)g.sq, (long long)g.skv,
                (long long)g.ldv, "");
    try {
      RaggedArgs args = ragged_args(p, g.b, g);
      Attention fa(handle, g);
      int64_t nq = 0;
      for (int32_t n : p.len) nq += n;
      const int64_t r0 = p.qrow[0];
      auto run_ours = [&] {
        flash_attention(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), g.ldv, nullptr, 0, 0, hq, hkv, d, args.at, ours.as<bf16>(), st);
      };
      nan_fill(out);
      fa.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), out.as<bf16>(), st, &args.r);
      run_ours();
      size_t bad = 0;
      const double w = worst(rows_of(ours, r0, nq), rows_of(out, r0, nq), &bad);
      std::printf("  plan built in %.1f ms (engine config %d), max |cudnn - ours| %.3g, %zu outputs not finite or not written\n", fa.build_ms(),
                  fa.config(), w, bad);
      say(r, "plan_build_ms", fa.build_ms());
      say(r, "max_abs_diff_vs_ours", w);
      r.add("cudnn_non_finite_outputs", json::Value::integer(int64_t(bad)));
      if (time_it) {
        const double t_ours = bench::median_ms(st, run_ours);
        const double t_cudnn = bench::median_ms(st, [&] { fa.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), out.as<bf16>(), st, &args.r); });
        const double f = flop_of(p);
        std::printf("  ours %.3f ms %.0f TF/s; cudnn %.3f ms %.0f TF/s (%.2fx ours, %.0f%% of the measured bf16 GEMM peak)\n", t_ours,
                    f / t_ours / 1e9, t_cudnn, f / t_cudnn / 1e9, t_ours / t_cudnn, 100.0 * f / t_cudnn / 1e9 / hw.peak_bf16_tflops);
        say(r, "ours_ms", t_ours);
        say(r, "cudnn_ms", t_cudnn);
        say(r, "useful_tflop", f / 1e12);
      }
    } catch (const std::exception& e) {
      std::printf("  cudnn: %s\n", e.what());
      r.add("cudnn_error", json::Value::string(e.what()));
    }
    records.arr.push_back(std::move(r));
  };
  auto compare = [&](const char* what, const DeviceBuffer& x, int64_t xr, const DeviceBuffer& y, int64_t yr, int64_t n) {
    const size_t c = differ(rows_of(x, xr, n), rows_of(y, yr, n));
    std::printf("  %s: %zu of %lld outputs differ\n", what, c, (long long)(n * hq * d));
    json::Value r = json::Value::object();
    r.add("bits", json::Value::string(what));
    r.add("differing", json::Value::integer(int64_t(c)));
    records.arr.push_back(std::move(r));
  };

  // 1. one 8,192-token sequence, v in the qkv rows
  point("ragged 1 x 8,192", packed({8192}), shape(1, 8192, 8192, ld_fused), a, true);
  // 2. a mixed batch of 8 (8,192 tokens) in the 4,096 bound; each sequence alone in its own bound
  // and in a larger one; the batch with 8 empty sequences after it
  const std::vector<int32_t> mix = {3000, 318, 1500, 64, 2200, 1000, 77, 33};
  const Packed pm = packed(mix);
  point("ragged 8 mixed (3,000 .. 33)", pm, shape(8, 4096, 4096, ld_fused), a, true);
  check(cudaMemcpyAsync(ref.get(), a.get(), a.bytes(), cudaMemcpyDeviceToDevice, st), "keep the mixed batch");
  for (size_t i : {size_t(0), size_t(1), size_t(7)}) {
    Packed one;
    one.len = {mix[i]};
    one.kv = {mix[i]};
    one.qrow = {pm.qrow[i]};
    one.krow = {pm.krow[i]};
    const int64_t bd = bucket(mix[i]);
    point("  the sequence alone, its own bound", one, shape(1, bd, bd, ld_fused), bb, false);
    compare("alone vs in the batch", bb, pm.qrow[i], a, pm.qrow[i], mix[i]);
    point("  the sequence alone, bound 8,192", one, shape(1, 8192, 8192, ld_fused), bb, false);
    compare("bound 8,192 vs in the batch", bb, pm.qrow[i], a, pm.qrow[i], mix[i]);
  }
  point("  the batch with 8 empty sequences after it", pm, shape(16, 4096, 4096, ld_fused), bb, false);
  compare("b 16 vs b 8", bb, 0, a, 0, 8192);
  // 3. continuations: the 3,000-token sequence's last queries over its keys (cached rows first),
  // against the same queries in the whole sequence (v in its own rows: the product's layout with
  // cached prefixes)
  const Packed whole = packed({3000});
  point("ragged 1 x 3,000, v in its own rows", whole, shape(1, 4096, 4096, hkv * d), a, false);
  for (int32_t cached : {2000, 1937, 2999}) {
    Packed c;
    c.len = {3000 - cached};
    c.kv = {3000};
    c.qrow = {cached};
    c.krow = {0};
    point("  continuation", c, shape(1, bucket(3000 - cached), 4096, hkv * d), bb, false);
    compare(cached == 2000 ? "2,000 cached: the last 1,000 queries vs the whole sequence's"
                           : cached == 1937 ? "1,937 cached: the last 1,063 vs the whole's" : "2,999 cached: the last query vs the whole's",
            bb, cached, a, cached, 3000 - cached);
  }
  // 4. 64 x 512 and 8 x 1,024 packed
  point("ragged 64 x 512", packed(std::vector<int32_t>(64, 512)), shape(64, 512, 512, ld_fused), a, true);
  point("ragged 8 x 1,024", packed(std::vector<int32_t>(8, 1024)), shape(8, 1024, 1024, ld_fused), a, true);
}

// The vision tower's frames through a ragged, non-causal graph (the padding mask only): q / k / v
// [rows, 16, 80] (72 dims of each head used, the rest zero: clefrt's kernel's padded layout; the
// product's cuDNN path packs the heads since session 22, tower_single_points), images of
// different patch counts packed; o packed [rows, 16, 72], or written over q's rows (head stride
// 80), as the product's flash_attention_full does to save the tower's scratch
void tower_points(void* handle, const HardwareLimits& hw, cudaStream_t st, json::Value& records) {
  const int64_t heads = 16, d = 72, dp = flash_attention_full_padded(72), ld = heads * dp;
  const std::vector<int32_t> lens = {3072, 1024, 768, 4096, 256};
  int64_t rows = 0;
  for (int32_t n : lens) rows += n;
  DeviceBuffer q(size_t(rows * ld) * 2, "q"), k(size_t(rows * ld) * 2, "k"), v(size_t(rows * ld) * 2, "v"), ours(size_t(rows * heads * d) * 2, "ours"),
      theirs(size_t(rows * heads * d) * 2, "cudnn"), alone(size_t(rows * heads * d) * 2, "alone"), inplace(size_t(rows * ld) * 2, "in place");
  fill_normal_bf16(q.as<bf16>(), rows * ld, 41, 0.0f, 1.0f, st);
  fill_normal_bf16(k.as<bf16>(), rows * ld, 42, 0.0f, 1.0f, st);
  fill_normal_bf16(v.as<bf16>(), rows * ld, 43, 0.0f, 1.0f, st);
  for (DeviceBuffer* b : {&q, &k, &v})
    check(cudaMemset2DAsync(b->as<bf16>() + d, size_t(dp) * 2, 0, size_t(dp - d) * 2, size_t(rows * heads), st), "zero padding");
  std::vector<RaggedSeq> seqs;
  std::vector<int32_t> tq, ts, te;
  int64_t r0 = 0, longest = 0;
  for (int32_t n : lens) {
    seqs.push_back({r0, n, r0, n});
    for (int64_t t = 0; t < n; t += flash_attention_full_tile()) {
      tq.push_back(int32_t(r0 + t));
      ts.push_back(int32_t(r0));
      te.push_back(int32_t(r0 + n));
    }
    r0 += n;
    longest = std::max<int64_t>(longest, n);
  }
  std::vector<int32_t> tiles = tq;
  tiles.insert(tiles.end(), ts.begin(), ts.end());
  tiles.insert(tiles.end(), te.begin(), te.end());
  DeviceBuffer dt = DeviceBuffer(tiles.size() * 4, "tiles");
  check(cudaMemcpy(dt.get(), tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice), "tiles");
  const int64_t nt = int64_t(tq.size());
  const AttnTiles at{dt.as<int32_t>(), dt.as<int32_t>() + nt, dt.as<int32_t>() + 2 * nt, nt};
  const int64_t b = cudnn_bound(int64_t(seqs.size()), 1), s = cudnn_bound(longest);
  auto arrays = [&](const std::vector<RaggedSeq>& ss, int64_t bb, int64_t ldo) {
    std::vector<int32_t> h;
    append_ragged(h, ss, bb, ld, ld, ld, ldo);
    DeviceBuffer buf(h.size() * 4, "ragged");
    check(cudaMemcpy(buf.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), "ragged");
    return buf;
  };
  json::Value r = json::Value::object();
  r.add("shape", json::Value::string("tower ragged 5 images (3,072 .. 256 patches)"));
  std::printf("\ntower, ragged non-causal: 5 images (3,072, 1,024, 768, 4,096, 256 patches), bounds b %lld s %lld\n", (long long)b, (long long)s);
  try {
    Shape g{b, s, s, heads, heads, d, ld, dp, ld, dp, ld, dp, heads * d, false, true};
    Attention fa(handle, g);
    DeviceBuffer ra = arrays(seqs, b, heads * d);
    const CudnnRagged rr = ragged_at(ra.as<int32_t>(), b);
    auto run_ours = [&] { flash_attention_full(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), heads, d, at, ours.as<bf16>(), st); };
    auto run_cudnn = [&] { fa.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), theirs.as<bf16>(), st, &rr); };
    check(cudaMemsetAsync(theirs.get(), 0xFF, theirs.bytes(), st), "NaN fill");
    run_cudnn();
    run_ours();
    const auto a = down_bf16(ours.as<bf16>(), size_t(rows * heads * d)), c = down_bf16(theirs.as<bf16>(), size_t(rows * heads * d));
    double worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double t = double(bf16_float(c[i]));
      if (!std::isfinite(t)) ++bad;
      else worst = std::max(worst, std::fabs(double(bf16_float(a[i])) - t));
    }
    double flop = 0;
    for (int32_t n : lens) flop += 4.0 * double(n) * double(n) * double(d) * double(heads);
    const double t_ours = bench::median_ms(st, run_ours), t_cudnn = bench::median_ms(st, run_cudnn);
    std::printf("  ours %.3f ms %.0f TF/s; cudnn %.3f ms %.0f TF/s (%.2fx ours, %.0f%% of the measured bf16 GEMM peak); plan %.1f ms; "
                "max |cudnn - ours| %.3g, %zu not finite or not written\n",
                t_ours, flop / t_ours / 1e9, t_cudnn, flop / t_cudnn / 1e9, t_ours / t_cudnn, 100.0 * flop / t_cudnn / 1e9 / hw.peak_bf16_tflops,
                fa.build_ms(), worst, bad);
    r.add("ours_ms", json::Value::number(t_ours));
    r.add("cudnn_ms", json::Value::number(t_cudnn));
    r.add("max_abs_diff_vs_ours", json::Value::number(worst));
    r.add("cudnn_non_finite_outputs", json::Value::integer(int64_t(bad)));
    // the 4,096-patch image alone (b 1)
    {
      const Shape g1{1, s, s, heads, heads, d, ld, dp, ld, dp, ld, dp, heads * d, false, true};
      Attention one(handle, g1);
      DeviceBuffer a1 = arrays({seqs[3]}, 1, heads * d);
      const CudnnRagged r1 = ragged_at(a1.as<int32_t>(), 1);
      one.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), alone.as<bf16>(), st, &r1);
      const auto x = down_bf16(alone.as<bf16>(), size_t(rows * heads * d));
      size_t differ = 0;
      for (size_t i = size_t(seqs[3].qrow * heads * d); i < size_t((seqs[3].qrow + seqs[3].qlen) * heads * d); ++i) differ += x[i] != c[i];
      std::printf("  the 4,096-patch image alone vs in the batch: %zu outputs differ\n", differ);
      r.add("alone_vs_batch_differing", json::Value::integer(int64_t(differ)));
    }
    // over q's own rows (head stride 80): the same bits as out of place?
    {
      Shape gi = g;
      gi.ldo = ld;
      gi.hso = dp;
      Attention ip(handle, gi);
      check(cudaMemcpyAsync(inplace.get(), q.get(), q.bytes(), cudaMemcpyDeviceToDevice, st), "copy q");
      DeviceBuffer ai = arrays(seqs, b, ld);
      const CudnnRagged ri = ragged_at(ai.as<int32_t>(), b);
      ip.run(inplace.as<bf16>(), k.as<bf16>(), v.as<bf16>(), inplace.as<bf16>(), st, &ri);
      const auto x = down_bf16(inplace.as<bf16>(), size_t(rows * ld));
      size_t differ = 0;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < d; ++i) differ += x[size_t(t * ld + h * dp + i)] != c[size_t((t * heads + h) * d + i)];
      std::printf("  written over q's rows vs out of place: %zu outputs differ\n", differ);
      r.add("in_place_vs_out_of_place_differing", json::Value::integer(int64_t(differ)));
    }
  } catch (const std::exception& e) {
    std::printf("  cudnn: %s\n", e.what());
    r.add("cudnn_error", json::Value::string(e.what()));
  }
  records.arr.push_back(std::move(r));
}

// One image's frame the ways the product could plan it, output over q's rows: the ragged graph
// (bound: the next power of two; the product's for frames under
// CudnnFrameAttention::kDenseFrame), a dense graph of the exact length (no mask; a plan per
// length: the product's for larger frames), each on heads padded to 80 dims and on packed heads
// (72 apart, no padding: the product's layout since session 22). ms each, and whether the bits equal the ragged graph's. (A padded
// graph, the lengths and the padding mask without ragged offsets, measured 0.182 ms at 3,072
// patches against the ragged 0.149: bench/results/2026-12-04-h200-lab-cudnn-05d4ad4.txt.)
void tower_single_points(void* handle, const HardwareLimits& hw, cudaStream_t st, json::Value& records) {
  const int64_t heads = 16, d = 72, dp = flash_attention_full_padded(72), ld = heads * dp, cap = 16384;
  DeviceBuffer q(size_t(cap * ld) * 2, "q"), k(size_t(cap * ld) * 2, "k"), v(size_t(cap * ld) * 2, "v"), o(size_t(cap * ld) * 2, "o"),
      qp(size_t(cap * heads * d) * 2, "packed q"), kp(size_t(cap * heads * d) * 2, "packed k"), vp(size_t(cap * heads * d) * 2, "packed v"),
      op(size_t(cap * heads * d) * 2, "packed o");
  fill_normal_bf16(q.as<bf16>(), cap * ld, 51, 0.0f, 1.0f, st);
  fill_normal_bf16(k.as<bf16>(), cap * ld, 52, 0.0f, 1.0f, st);
  fill_normal_bf16(v.as<bf16>(), cap * ld, 53, 0.0f, 1.0f, st);
  for (DeviceBuffer* x : {&q, &k, &v})
    check(cudaMemset2DAsync(x->as<bf16>() + d, size_t(dp) * 2, 0, size_t(dp - d) * 2, size_t(cap * heads), st), "zero padding");
  for (auto [from, to] : {std::pair{&q, &qp}, {&k, &kp}, {&v, &vp}})  // the same values, heads 72 apart
    check(cudaMemcpy2DAsync(to->get(), size_t(d) * 2, from->get(), size_t(dp) * 2, size_t(d) * 2, size_t(cap * heads), cudaMemcpyDeviceToDevice, st),
          "pack");
  for (int64_t S : {int64_t(3072), int64_t(16384)}) {
    const int64_t bound = cudnn_bound(S);
    std::vector<int32_t> h;
    append_ragged(h, {{0, S, 0, S}}, 1, ld, ld, ld, ld);
    DeviceBuffer arr(h.size() * 4, "ragged");
    check(cudaMemcpy(arr.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), "ragged");
    const CudnnRagged r = ragged_at(arr.as<int32_t>(), 1);
    std::vector<int32_t> hp;  // the same frame with heads packed (rows heads * d apart)
    append_ragged(hp, {{0, S, 0, S}}, 1, heads * d, heads * d, heads * d, heads * d);
    DeviceBuffer arr_p(hp.size() * 4, "ragged packed");
    check(cudaMemcpy(arr_p.get(), hp.data(), hp.size() * 4, cudaMemcpyHostToDevice), "ragged packed");
    const CudnnRagged rp = ragged_at(arr_p.as<int32_t>(), 1);
    const double flop = 4.0 * double(S) * double(S) * double(d) * double(heads);
    json::Value rec = json::Value::object();
    rec.add("shape", json::Value::string("tower one frame of " + std::to_string(S) + " patches, plan variants"));
    std::printf("\ntower, one frame of %lld patches (bound %lld), output over q:\n", (long long)S, (long long)bound);
    std::vector<uint16_t> want;
    auto variant = [&](const char* name, Shape g, bool packed_heads) {
      try {
        Attention a(handle, g);
        bf16* out = packed_heads ? op.as<bf16>() : o.as<bf16>();
        auto run = [&] {
          if (packed_heads) a.run(qp.as<bf16>(), kp.as<bf16>(), vp.as<bf16>(), out, st, &rp);
          else a.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), out, st, &r);
        };
        check(cudaMemsetAsync(out, 0xFF, packed_heads ? op.bytes() : o.bytes(), st), "NaN fill");
        run();
        std::vector<uint16_t> got;
        const auto all = down_bf16(out, size_t(S * (packed_heads ? heads * d : ld)));
        for (int64_t t = 0; t < S; ++t)
          for (int64_t hh = 0; hh < heads; ++hh)
            for (int64_t i = 0; i < d; ++i) got.push_back(all[size_t(packed_heads ? (t * heads + hh) * d + i : t * ld + hh * dp + i)]);
        size_t differ = 0, bad = 0;
        if (want.empty()) want = got;
        for (size_t i = 0; i < got.size(); ++i) {
          differ += got[i] != want[i];
          bad += !std::isfinite(bf16_float(got[i]));
        }
        const double ms = bench::median_ms(st, run);
        // the host's side of a launch (the tower enqueues one a layer between its GEMMs): 50
        // enqueued back to back, timed on the host before the stream is waited on
        check(cudaStreamSynchronize(st), "sync");
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 50; ++i) run();
        const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50;
        check(cudaStreamSynchronize(st), "sync");
        std::printf("  %-34s %.3f ms %.0f TF/s (%.0f%% of the bf16 GEMM peak), host %.1f us a launch, plan %.1f ms, %zu outputs differ from the ragged graph's, %zu not finite\n",
                    name, ms, flop / ms / 1e9, 100.0 * flop / ms / 1e9 / hw.peak_bf16_tflops, host_us, a.build_ms(), differ, bad);
        json::Value x = json::Value::object();
        x.add("ms", json::Value::number(ms));
        x.add("host_us_a_launch", json::Value::number(host_us));
        x.add("differ_from_ragged", json::Value::integer(int64_t(differ)));
        x.add("not_finite", json::Value::integer(int64_t(bad)));
        rec.add(name, std::move(x));
      } catch (const std::exception& e) {
        std::printf("  %-34s %s\n", name, e.what());
        rec.add(name, json::Value::string(e.what()));
      }
    };
    Shape ragged{1, bound, bound, heads, heads, d, ld, dp, ld, dp, ld, dp, ld, false, true, dp};
    Shape exact{1, S, S, heads, heads, d, ld, dp, ld, dp, ld, dp, ld, false, false, dp};
    const int64_t lp = heads * d;
    Shape packed{1, S, S, heads, heads, d, lp, d, lp, d, lp, d, lp, false, false, 0};
    Shape ragged_packed{1, bound, bound, heads, heads, d, lp, d, lp, d, lp, d, lp, false, true, 0};
    variant("ragged, bound", ragged, false);
    variant("dense, exact length", exact, false);
    variant("dense, exact length, packed heads", packed, true);
    variant("ragged, bound, packed heads", ragged_packed, true);
    // the product's way: the packed ragged graph written over its own q, against out of place
    try {
      Attention a(handle, ragged_packed);
      const size_t n = size_t(S * heads * d);
      a.run(qp.as<bf16>(), kp.as<bf16>(), vp.as<bf16>(), o.as<bf16>(), st, &rp);  // o: room for S rows packed
      check(cudaMemcpyAsync(op.get(), qp.get(), n * 2, cudaMemcpyDeviceToDevice, st), "q copy");
      a.run(op.as<bf16>(), kp.as<bf16>(), vp.as<bf16>(), op.as<bf16>(), st, &rp);
      const auto apart = down_bf16(o.as<bf16>(), n), over_q = down_bf16(op.as<bf16>(), n);
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) differ += apart[i] != over_q[i];
      std::printf("  %-34s %zu outputs differ from out of place\n", "packed heads, ragged, over q", differ);
      rec.add("packed_ragged_over_q_vs_out_of_place_differing", json::Value::integer(int64_t(differ)));
    } catch (const std::exception& e) {
      std::printf("  %-34s %s\n", "packed heads, ragged, over q", e.what());
    }
    records.arr.push_back(std::move(rec));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    std::string why;
    if (!cudnn_available(&why)) throw std::runtime_error(why);
    std::printf("cuDNN %zu\n", cudnn_loaded_version());
    cudaStream_t st;
    check(cudaStreamCreate(&st), "stream");
    CudnnHandle cudnn;
    void* handle = cudnn.get();
    // the 27B tower: 16 heads of 72 (padded to 80 in the product's layout), frames of one
    // 1024x768 image, one 2048x2048, four 512x512; the 27B backbone: 24 query heads, 4 key /
    // value heads of 256, causal, the blog request, 8,192 tokens, 8 x 1,024
    const int64_t dp = flash_attention_full_padded(72);
    struct Point {
      const char* name;
      Shape g;
    };
    const std::vector<Point> points = {
        {"tower 1 x 3,072 (1024x768)", dense(1, 3072, 16, 16, 72, dp, false)},
        {"tower 1 x 16,384 (2048x2048)", dense(1, 16384, 16, 16, 72, dp, false)},
        {"tower 4 x 1,024 (512x512)", dense(4, 1024, 16, 16, 72, dp, false)},
        {"backbone 1 x 318 (blog)", dense(1, 318, 24, 4, 256, 256, true)},
        {"backbone 1 x 8,192", dense(1, 8192, 24, 4, 256, 256, true)},
        {"backbone 8 x 1,024", dense(8, 1024, 24, 4, 256, 256, true)},
    };
    json::Value records = json::Value::array();
    for (const Point& pt : points) {
      const Shape& g = pt.g;
      const int64_t dq = g.hsq;
      const int64_t L = g.b * g.sq, nq = L * g.hq * dq, nkv = L * g.hkv * dq, no = L * g.hq * g.d, first = g.sq * g.hq * g.d;
      DeviceBuffer q(size_t(nq) * 2, "q"), k(size_t(nkv) * 2, "k"), v(size_t(nkv) * 2, "v"), ours(size_t(no) * 2, "ours"),
          theirs(size_t(no) * 2, "cudnn"), alone(size_t(first) * 2, "alone");
      // random O(1) values, the padding dims zero as the product's rotary kernel writes them
      fill_normal_bf16(q.as<bf16>(), nq, 21, 0.0f, 1.0f, st);
      fill_normal_bf16(k.as<bf16>(), nkv, 22, 0.0f, 1.0f, st);
      fill_normal_bf16(v.as<bf16>(), nkv, 23, 0.0f, 1.0f, st);
      if (dq > g.d) {
        check(cudaMemset2DAsync(q.as<bf16>() + g.d, size_t(dq) * 2, 0, size_t(dq - g.d) * 2, size_t(L * g.hq), st), "zero padding");
        for (DeviceBuffer* b : {&k, &v})
          check(cudaMemset2DAsync(b->as<bf16>() + g.d, size_t(dq) * 2, 0, size_t(dq - g.d) * 2, size_t(L * g.hkv), st), "zero padding");
      }
      const int64_t tile = g.causal ? 64 : flash_attention_full_tile();
      std::vector<int32_t> tq, ts, te;
      for (int64_t f = 0; f < g.b; ++f)
        for (int64_t t = 0; t < g.sq; t += tile) {
          tq.push_back(int32_t(f * g.sq + t));
          ts.push_back(int32_t(f * g.sq));
          te.push_back(int32_t((f + 1) * g.sq));
        }
      std::vector<int32_t> tiles = tq;
      tiles.insert(tiles.end(), ts.begin(), ts.end());
      tiles.insert(tiles.end(), te.begin(), te.end());
      DeviceBuffer dt(tiles.size() * 4, "tiles");
      check(cudaMemcpy(dt.get(), tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice), "tiles");
      const int64_t nt = int64_t(tq.size());
      const AttnTiles at{dt.as<int32_t>(), dt.as<int32_t>() + nt, dt.as<int32_t>() + 2 * nt, nt};
      const double flop = 4.0 * double(g.b) * double(g.sq) * double(g.sq) * double(g.d) * double(g.hq) * (g.causal ? 0.5 : 1.0);
      auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
      auto run_ours = [&] {
        if (g.causal)
          flash_attention(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), g.hkv * dq, nullptr, 0, 0, g.hq, g.hkv, g.d, at, ours.as<bf16>(), st);
        else
          flash_attention_full(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), g.hq, g.d, at, ours.as<bf16>(), st);
      };
      const double t_ours = bench::median_ms(st, run_ours);
      std::printf("\n%s: ours %.3f ms %.0f TF/s\n", pt.name, t_ours, tf(t_ours));
      json::Value r = json::Value::object();
      r.add("shape", json::Value::string(pt.name));
      r.add("useful_tflop", json::Value::number(flop / 1e12));
      r.add("ours_ms", json::Value::number(t_ours));
      check(cudaMemset(theirs.get(), 0xFF, theirs.bytes()), "fill with NaN");  // what cuDNN does not write shows
      try {
        Attention fa(handle, g);
        const double t_cudnn = bench::median_ms(st, [&] { fa.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), theirs.as<bf16>(), st); });
        run_ours();
        check(cudaStreamSynchronize(st), "sync");
        const auto a = down_bf16(ours.as<bf16>(), size_t(no)), b = down_bf16(theirs.as<bf16>(), size_t(no));
        double worst = 0;
        size_t non_finite = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          const double d = std::fabs(double(bf16_float(a[i])) - double(bf16_float(b[i])));
          if (!std::isfinite(double(bf16_float(b[i])))) ++non_finite;
          else if (!(d <= worst)) worst = d;
        }
        std::string inv = non_finite ? ", " + std::to_string(non_finite) + " cuDNN outputs not finite (or not written)" : "";
        r.add("cudnn_non_finite_outputs", json::Value::integer(int64_t(non_finite)));
        if (g.b > 1) {  // the first sequence alone against the same sequence in the batch
          try {
            Shape one_g = g;
            one_g.b = 1;
            Attention one(handle, one_g);
            one.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), alone.as<bf16>(), st);
            check(cudaStreamSynchronize(st), "sync");
            const auto c = down_bf16(alone.as<bf16>(), size_t(first));
            size_t differ = 0;
            for (size_t i = 0; i < c.size(); ++i) differ += c[i] != b[i];
            inv += ", first sequence alone vs in the batch: " + std::to_string(differ) + " of " + std::to_string(c.size()) + " outputs differ";
            r.add("alone_vs_batch_differing", json::Value::integer(int64_t(differ)));
          } catch (const std::exception& e) {
            inv += std::string(", the sequence alone: ") + e.what();
          }
        }
        std::printf("  cudnn %.3f ms %.0f TF/s (%.2fx ours; %.0f%% of the measured bf16 GEMM peak), engine config %d of the heuristic's, "
                    "workspace %lld B, plan built in %.1f ms; max |cudnn - ours| %.3g%s\n",
                    t_cudnn, tf(t_cudnn), t_ours / t_cudnn, 100.0 * tf(t_cudnn) / hw.peak_bf16_tflops, fa.config(),
                    (long long)fa.workspace_bytes(), fa.build_ms(), worst, inv.c_str());
        r.add("cudnn_ms", json::Value::number(t_cudnn));
        r.add("cudnn_plan_build_ms", json::Value::number(fa.build_ms()));
        r.add("cudnn_engine_config", json::Value::integer(fa.config()));
        r.add("max_abs_diff_vs_ours", json::Value::number(worst));
      } catch (const std::exception& e) {
        std::printf("  cudnn: %s\n", e.what());
        r.add("cudnn_error", json::Value::string(e.what()));
      }
      records.arr.push_back(std::move(r));
    }
    ragged_points(handle, hw, st, records);
    tower_points(handle, hw, st, records);
    tower_single_points(handle, hw, st, records);
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_cudnn_attn", std::move(records));
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_cudnn_attn: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Shared by the GPU benchmark programs of dev/cuda: their command line, CUDA-event timing, the
// JSON record they write, and the GEMM labs' candidate timing.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "clefrt/clefrt.h"
#include "common/json.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/event_timer.h"
#include "cuda/runtime/gemm.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/hardware.h"
#include "quant/formats.h"

namespace clefrt::bench {

// The command line both programs take: [--commit ID] [--json FILE] [--m M] (one m only), and,
// where the program has it, [--shape NAME] (one weight shape only: w4a16_gemm.cpp gate_up | down; fp8_gemm_wgmma.cu a part of a shape name).
struct Options {
  std::string commit = "unknown", json_out, only_shape;
  std::string anchors;  // --anchors FILE: kernel_anchors.py's JSON from the same device call
  int64_t only_m = 0;
  bool sustained = false;  // --sustained: at the power cap (sustained()): gemm_search.cpp's best configurations, fp8_gemm_wgmma.cu's forms
};
// False (with the usage on stderr) on anything else.
inline bool parse_options(int argc, char** argv, bool with_shape, Options& o) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--commit") && i + 1 < argc) o.commit = argv[++i];
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) o.json_out = argv[++i];
    else if (with_shape && !std::strcmp(argv[i], "--shape") && i + 1 < argc) o.only_shape = argv[++i];
    else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) o.only_m = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--anchors") && i + 1 < argc) o.anchors = argv[++i];
    else if (!std::strcmp(argv[i], "--sustained")) o.sustained = true;
    else {
      std::fprintf(stderr, "usage: %s [--commit ID] [--json FILE]%s [--m M] [--anchors FILE] [--sustained]\n", argv[0],
                   with_shape ? " [--shape NAME]" : "");
      return false;
    }
  }
  return true;
}

// The card's measured limits, printed as the run's first line.
inline cuda::HardwareLimits measure_and_print_hardware() {
  const cuda::HardwareLimits hw = cuda::measure_hardware();
  std::printf("%s: bf16 GEMM peak %.0f TFLOP/s, copy %.0f GB/s\n", hw.gpu.c_str(), hw.peak_bf16_tflops, hw.copy_gbps);
  return hw;
}

// The anchors (../shared/anchors' kernel_anchors.py, run in the same device call: fla's GDN and
// PyTorch's SDPA per layer at Clef-27B shapes), to print beside a lab's product. An empty path:
// none (a null value). A file that does not read or parse, or whose GPU is not this one, is an
// error naming it: a figure from another card beside ours would mislead.
inline json::Value load_anchors(const std::string& path, const std::string& gpu) {
  if (path.empty()) return json::Value::null();
  std::ifstream f(path);
  if (!f) throw std::runtime_error("--anchors " + path + ": cannot read it");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  json::Value v;
  try {
    v = json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error("--anchors " + path + ": not JSON (" + e.what() + ")");
  }
  const json::Value* g = v.is_object() ? v.find("gpu") : nullptr;
  if (!g || !g->is_string()) throw std::runtime_error("--anchors " + path + ": no \"gpu\" string (kernel_anchors.py's output has one)");
  if (g->s != gpu) throw std::runtime_error("--anchors " + path + ": measured on " + g->s + ", this run is on " + gpu);
  return v;
}
// One anchor figure in ms a layer (group "gdn_per_layer_ms" or "attn_per_layer_ms", key as the
// script names it: "tok_8192", "64x512", "tok_8192/CUDNN_ATTENTION", ...); negative when absent
// or when the script recorded an error there.
inline double anchor_ms(const json::Value& anchors, const char* group, const std::string& key) {
  const json::Value* g = anchors.is_object() ? anchors.find(group) : nullptr;
  const json::Value* v = g && g->is_object() ? g->find(key) : nullptr;
  if (!v) return -1;
  if (v->kind == json::Value::Kind::Double) return v->d;
  if (v->kind == json::Value::Kind::Int) return double(v->i);
  return -1;
}

// The median of 20 runs of f (CUDA events on stream s) after 3 warm-ups, in milliseconds.
template <class F>
double median_ms(cudaStream_t s, F f) {
  cuda::EventTimer timer("event");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    timer.start(s);
    f();
    t.push_back(timer.stop_ms(s));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The W4A16 labs' NVFP4 per-tensor global scale for weights w: 448 x 6 / amax(w) (e4m3's and
// e2m1's largest values over the largest |w|), the amax taken on the GPU.
inline float nvfp4_tensor_gs(const cuda::bf16* w, int64_t count, cudaStream_t s) {
  cuda::DeviceBuffer amax(4, "amax");
  cuda::check(cudaMemsetAsync(amax.get(), 0, 4, s), "amax");
  cuda::amax_bf16(w, count, amax.as<float>(), s);
  float a = 0;
  cuda::check(cudaMemcpyAsync(&a, amax.get(), 4, cudaMemcpyDeviceToHost, s), "amax");
  cuda::check(cudaStreamSynchronize(s), "amax");
  return 448.0f * 6.0f / a;
}

// A launch's time with the launch overhead hidden: median_ms of 20 launches back to back, / 20
// (small kernels, where one launch's events time mostly the launch).
template <class F>
double per_launch_ms(cudaStream_t s, F f) {
  return median_ms(s, [&] {
           for (int i = 0; i < 20; ++i) f();
         }) /
         20.0;
}

// f run back to back for `seconds` after `warm` seconds of the same: ms and joules a call, the SM
// clock (mean of the readings taken between chunks). One chunk of launches stays queued while the
// host waits on the one before it and reads the driver, so the GPU never idles between chunks.
struct Sustained {
  double ms = 0, joules = 0, sm_mhz = 0;
};
template <class F>
Sustained sustained(cudaStream_t s, F f, double warm, double seconds) {
  using clock = std::chrono::steady_clock;
  constexpr int kChunk = 20;
  cudaEvent_t done[2];
  for (cudaEvent_t& e : done) cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "sustained");
  int64_t calls = 0;
  double mhz = 0, wall = 0;
  int readings = 0;
  GpuPower p0;
  for (int phase = 0; phase < 2; ++phase) {  // 0: warm, 1: measured
    const double sec = phase == 0 ? warm : seconds;
    int64_t chunks = 0;
    cuda::check(cudaStreamSynchronize(s), "sustained");
    if (phase == 1) p0 = gpu_power();
    const auto t0 = clock::now();
    while (std::chrono::duration<double>(clock::now() - t0).count() < sec) {
      for (int i = 0; i < kChunk; ++i) f();
      cuda::check(cudaEventRecord(done[chunks % 2], s), "sustained");
      if (chunks > 0) cuda::check(cudaEventSynchronize(done[(chunks - 1) % 2]), "sustained");  // the one before: this one stays queued
      ++chunks;
      if (phase == 1) {
        calls += kChunk;
        const GpuPower g = gpu_power();
        if (g.available) mhz += g.sm_clock_mhz, ++readings;
      }
    }
    cuda::check(cudaStreamSynchronize(s), "sustained");
    if (phase == 1) wall = std::chrono::duration<double>(clock::now() - t0).count();
  }
  const GpuPower p1 = gpu_power();
  for (cudaEvent_t& e : done) cudaEventDestroy(e);
  Sustained r;
  r.ms = wall * 1e3 / double(calls);
  r.joules = p0.available && p1.available ? (p1.energy_j - p0.energy_j) / double(calls) : 0;
  r.sm_mhz = readings ? mhz / readings : 0;
  return r;
}

// Every algorithm cuBLASLt's heuristic offers for y = x w^T at this m (FP8 or bf16 operands),
// each timed and its output (es bytes an element) compared bit for bit with `ref`, the engine's
// output of the same call; printed a line each and returned as records (config, invariant, ms,
// outputs_differing_from_engine). y is overwritten.
inline json::Value time_candidates(cuda::Gemm& g, bool fp8, const void* x, int64_t m, int64_t k, const void* w, int64_t n, void* y,
                                   cuda::OutType yt, const std::vector<uint8_t>& ref, cudaStream_t s) {
  const double flop = 2.0 * double(m) * double(n) * double(k);
  const size_t es = yt == cuda::OutType::F32 ? 4 : 2;
  json::Value out = json::Value::array();
  std::vector<uint8_t> got(ref.size());
  for (const cuda::Gemm::Candidate& c : g.candidates(fp8, m, n, k, yt, "bench")) {
    double t = -1;
    try {
      t = median_ms(s, [&] { g.run_candidate(c, fp8, x, m, k, w, n, y, yt, "bench"); });
    } catch (const std::exception& e) {
      std::printf("    %-70s failed: %s\n", c.config.c_str(), e.what());
      continue;
    }
    cuda::check(cudaMemcpyAsync(got.data(), y, got.size(), cudaMemcpyDeviceToHost, s), "bench");
    cuda::check(cudaStreamSynchronize(s), "bench");
    size_t differ = 0;
    for (size_t i = 0; i + es <= got.size(); i += es) differ += std::memcmp(&got[i], &ref[i], es) != 0;
    std::printf("    %-70s %3s %8.3f ms %6.0f TF/s  %zu of %zu outputs differ from the engine's\n", c.config.c_str(), c.invariant ? "inv" : "", t,
                flop / (t * 1e-3) / 1e12, differ, got.size() / es);
    json::Value cv = json::Value::object();
    cv.add("config", json::Value::string(c.config));
    cv.add("invariant", json::Value::boolean(c.invariant));
    cv.add("ms", json::Value::number(t));
    cv.add("outputs_differing_from_engine", json::Value::integer(int64_t(differ)));
    out.arr.push_back(std::move(cv));
  }
  return out;
}

// One weight shape's record: its name, n, k and the per-m points.
inline json::Value shape_record(const std::string& name, int64_t n, int64_t k, json::Value points) {
  json::Value v = json::Value::object();
  v.add("name", json::Value::string(name));
  v.add("n", json::Value::integer(n));
  v.add("k", json::Value::integer(k));
  v.add("points", std::move(points));
  return v;
}

// The run's record into `path`: UTC date, GPU, commit, the command when given, the measured
// limits and the shapes.
inline void write_record(const std::string& path, const cuda::HardwareLimits& hw, const std::string& commit, const std::string& command,
                         json::Value shapes) {
  json::Value out = json::Value::object();
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  out.add("date", json::Value::string(date));
  out.add("gpu", json::Value::string(hw.gpu));
  out.add("commit", json::Value::string(commit));
  if (!command.empty()) out.add("command", json::Value::string(command));
  out.add("peak_bf16_tflops", json::Value::number(hw.peak_bf16_tflops));
  out.add("copy_gbps", json::Value::number(hw.copy_gbps));
  out.add("shapes", std::move(shapes));
  std::ofstream(path) << json::write(out) << "\n";
}

// Outputs (of es bytes) that differ in any bit between a and b.
inline size_t differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t es) {
  if (a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0) return 0;  // the common case, at memcmp's speed
  size_t d = 0;
  for (size_t i = 0; i + es <= std::min(a.size(), b.size()); i += es) d += std::memcmp(&a[i], &b[i], es) != 0;
  return d;
}

// A GEMM lab's main: its command line, the hardware line, a stream with the engine's
// batch-invariant Gemm and a free one, body's records written as `name`'s JSON; an error ends the
// run with exit 1 and the message; with_shape: the lab reads --shape.
template <class Body>
int gemm_lab_main(int argc, char** argv, const char* name, Body body, bool with_shape = false) {
  Options opt;
  if (!parse_options(argc, argv, with_shape, opt)) return 2;
  try {
    const cuda::HardwareLimits hw = measure_and_print_hardware();
    cudaStream_t s;
    cuda::check(cudaStreamCreate(&s), "stream");
    {
      cuda::Gemm inv(s, true), any(s, false);
      json::Value records = body(opt, hw, s, inv, any);
      if (!opt.json_out.empty()) write_record(opt.json_out, hw, opt.commit, name, std::move(records));
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
  return 0;
}

// A bf16 value (its bits, as downloaded) as a float: exact.
inline float bf16_float(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A device buffer's first `count` values on the host (the stream synchronized).
template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t count, cudaStream_t s) {
  std::vector<T> h(count);
  cuda::check(cudaMemcpyAsync(h.data(), b.get(), count * sizeof(T), cudaMemcpyDeviceToHost, s), "download");
  cuda::check(cudaStreamSynchronize(s), "download");
  return h;
}
// Host values into a new device buffer (download's inverse; synchronous).
template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& h, const char* what) {
  cuda::DeviceBuffer b(h.size() * sizeof(T), what);
  cuda::check(cudaMemcpy(b.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return b;
}

// The FP8 labs' accuracy: the exact (fp64) sums of the e4m3 products of x8's first `rows` rows
// [., k] with `cols` rows of w8 [n, k] spread over n (every stride-th), and an fp32 GEMM output's
// error at those places as fractions of the exact outputs' RMS (RMS, worst) and its bias (the
// least-squares slope of output on exact, minus 1: a shrink toward zero shows as negative).
struct ExactE4m3Sums {
  int64_t rows = 0, cols = 0, stride = 0;
  std::vector<double> sums;  // [rows, cols]
};
inline ExactE4m3Sums exact_e4m3_sums(const cuda::DeviceBuffer& x8, const cuda::DeviceBuffer& w8, int64_t n, int64_t k, int64_t rows, int64_t cols,
                                     cudaStream_t s) {
  ExactE4m3Sums e{rows, cols, n / cols, std::vector<double>(size_t(rows * cols))};
  const std::vector<uint8_t> hx = download<uint8_t>(x8, size_t(rows * k), s), hw = download<uint8_t>(w8, size_t(n * k), s);
  double value[256];
  for (int b = 0; b < 256; ++b) value[b] = double(quant::e4m3_value(uint8_t(b)));  // 0x7f / 0xff (NaN) never occur in codes
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t* xr = hx.data() + r * k;
      const uint8_t* wr = hw.data() + c * e.stride * k;
      double a = 0;
      for (int64_t i = 0; i < k; ++i) a += value[xr[i]] * value[wr[i]];
      e.sums[size_t(r * cols + c)] = a;
    }
  return e;
}
struct Accuracy {
  double rms_rel = 0, worst_rel = 0, bias = 0;
};
// y: the GEMM's fp32 output [>= e.rows, n] on the device
inline Accuracy accuracy_of(const ExactE4m3Sums& e, const cuda::DeviceBuffer& y, int64_t n, cudaStream_t s) {
  const std::vector<float> all = download<float>(y, size_t(e.rows * n), s);
  double se = 0, sx = 0, sxy = 0, worst = 0;
  for (int64_t r = 0; r < e.rows; ++r)
    for (int64_t c = 0; c < e.cols; ++c) {
      const double x = e.sums[size_t(r * e.cols + c)], v = all[size_t(r * n + c * e.stride)], d = v - x;
      se += d * d, sx += x * x, sxy += v * x, worst = std::max(worst, std::fabs(d));
    }
  const double cnt = double(e.rows * e.cols), rms = std::sqrt(sx / cnt);
  return {std::sqrt(se / cnt) / rms, worst / rms, sxy / sx - 1.0};
}
inline json::Value accuracy_json(const Accuracy& a) {
  json::Value v = json::Value::object();
  v.add("rms_rel", json::Value::number(a.rms_rel));
  v.add("worst_rel", json::Value::number(a.worst_rel));
  v.add("bias", json::Value::number(a.bias));
  return v;
}

}  // namespace clefrt::bench

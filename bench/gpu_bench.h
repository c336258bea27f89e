// Shared by the GPU GEMM benchmark programs (clefrt_bench_w4a16, clefrt_bench_fp8): CUDA-event
// timing and the JSON record they write.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/check.h"
#include "cuda/hardware.h"

namespace clefrt::bench {

// The median of 20 runs of f (CUDA events on stream s) after 3 warm-ups, in milliseconds.
template <class F>
double median_ms(cudaStream_t s, F f) {
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "event");
  cuda::check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    cuda::check(cudaEventRecord(a, s), "event");
    f();
    cuda::check(cudaEventRecord(b, s), "event");
    cuda::check(cudaEventSynchronize(b), "event");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, a, b), "event");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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

}  // namespace clefrt::bench

// Timing for the GPU benchmark programs: the median of 20 runs of f (CUDA events on stream s)
// after 3 warm-ups, in milliseconds.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/check.h"

namespace clefrt::bench {

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

}  // namespace clefrt::bench

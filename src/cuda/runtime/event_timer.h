// GPU time between two events on a stream: the hardware measurement, Gemm's tuning of cuBLASLt's
// candidates, the W4A16 short-input GEMM's tuner and the labs' bench::median_ms time their
// launches with it. The events are destroyed with the timer (also when a timed launch throws).
#pragma once
#include <cuda_runtime.h>

#include "cuda/runtime/check.h"

namespace clefrt::cuda {

class EventTimer {
 public:
  explicit EventTimer(const char* op) : op_(op) {
    check(cudaEventCreate(&a_), op_);
    const cudaError_t e = cudaEventCreate(&b_);
    if (e != cudaSuccess) {  // (no destructor runs for a constructor that throws)
      cudaEventDestroy(a_);
      throw_cuda(e, op_);
    }
  }
  ~EventTimer() {
    if (a_) cudaEventDestroy(a_);
    if (b_) cudaEventDestroy(b_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s) { check(cudaEventRecord(a_, s), op_); }
  // the milliseconds since start(s), once the stream's work so far has run
  double stop_ms(cudaStream_t s) {
    check(cudaEventRecord(b_, s), op_);
    check(cudaEventSynchronize(b_), op_);
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a_, b_), op_);
    return ms;
  }

 private:
  const char* op_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

}  // namespace clefrt::cuda

// The engine thread: one thread owns the engine (and the device). HTTP threads encode and
// submit; each step the engine takes waiting requests in arrival order and packs as many as
// fit the token budget into one forward (a request over the budget runs alone). The queue is
// bounded: a full queue is refused at once (429), never buffered.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace clefrt::server {

struct SchedulerOptions {
  size_t max_batch_tokens = 16384;
  size_t max_batch_requests = 64;
  size_t max_queue = 256;
};

struct Job {
  Encoded enc;
  std::chrono::steady_clock::time_point enqueued;
  std::atomic<bool> cancelled{false};  // timed out or the client left: skipped if still queued
  std::promise<std::vector<std::vector<double>>> result;
  double queue_ms = 0, compute_ms = 0;  // set by the engine thread before the result
};

class Scheduler {
 public:
  Scheduler(const Engine& engine, SchedulerOptions o, Metrics& m);
  ~Scheduler();
  // Queues a request; throws Error 429 when the queue is full, 503 when stopping.
  std::shared_ptr<Job> submit(Encoded enc);
  // Stops taking new work, finishes what is queued, joins the thread.
  void stop();
  // Tests: hold the engine thread (queued work waits) / let it go.
  void pause(bool on);
  size_t queued() const;

 private:
  void loop();
  const Engine& engine_;
  SchedulerOptions o_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> q_;
  bool stopping_ = false, paused_ = false;
  std::thread thread_;
};

}  // namespace clefrt::server

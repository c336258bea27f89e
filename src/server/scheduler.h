// The engine thread: one thread owns the engine (and the device). Requests are encoded on
// worker threads and submitted here; each step the engine takes waiting requests in arrival
// order and packs as many as fit the token budget into one forward (a request over the budget
// runs alone). The queue is bounded: a full queue is refused at once (429), never buffered.
//
// Every job ends exactly once, through its `done` callback: answered, failed, timed out (its
// deadline passed, whether it was queued or running; a deadline thread watches them), or
// cancelled (the client left). Work that ended before the engine reached it is skipped.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "server/metrics.h"

namespace clefrt::server {

struct SchedulerOptions {
  size_t max_batch_tokens = 16384;
  size_t max_batch_requests = 64;
  size_t max_queue = 256;
};

using Clock = std::chrono::steady_clock;

struct Job;

// How a job ended. Answered: probs holds one vector per question; Failed: error holds what the
// engine threw; TimedOut / Cancelled: neither. queue_ms: from submit() to the forward that ran
// it (to the end, if none did); compute_ms: that forward's time.
struct Outcome {
  enum class Kind { Answered, Failed, TimedOut, Cancelled } kind = Kind::Answered;
  std::vector<std::vector<double>> probs;
  std::exception_ptr error;
  double queue_ms = 0, compute_ms = 0;
};

struct Job {
  Encoded enc;
  Clock::time_point enqueued, deadline;
  // Runs once, on the engine thread (answered / failed), the deadline thread (timed out) or the
  // caller of cancel(). It must not block: it hands the result to the connection.
  std::function<void(Job&, Outcome)> done;

  bool ended() const { return ended_.load(); }

 private:
  friend class Scheduler;
  std::atomic<bool> ended_{false};
  bool end(Outcome o);  // false when the job had already ended
};

class Scheduler {
 public:
  Scheduler(const EngineCore& engine, SchedulerOptions o, Metrics& m);
  ~Scheduler();
  // Queues a request that must end by `deadline`; throws Error 429 when the queue is full, 503
  // when stopping. `done` is called later, never from inside submit().
  std::shared_ptr<Job> submit(Encoded enc, Clock::time_point deadline, std::function<void(Job&, Outcome)> done);
  // Ends a job as Cancelled (the client left); a queued job is then skipped. No-op once ended.
  void cancel(Job& job);
  // Whether submit() would refuse for a full queue now: checked before a request is encoded, so
  // an overloaded server spends nothing on work it will refuse.
  bool full() const;
  // Stops taking new work, finishes what is queued, joins the threads.
  void stop();
  // Tests: hold the engine thread (queued work waits) / let it go.
  void pause(bool on);
  size_t queued() const;

 private:
  void loop();
  void watch_deadlines();
  void run_batch(std::vector<std::shared_ptr<Job>>& batch);
  void drop_ended_locked();
  const EngineCore& engine_;
  SchedulerOptions o_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_, deadline_cv_;
  std::deque<std::shared_ptr<Job>> q_;
  std::vector<std::shared_ptr<Job>> running_;  // the batch in the engine now (its deadlines still count)
  bool stopping_ = false, paused_ = false;
  std::thread thread_, deadline_thread_;
};

}  // namespace clefrt::server

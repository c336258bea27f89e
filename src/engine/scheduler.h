// The engine thread: one thread owns the engine core (and the device). Prepared requests are
// submitted here from any thread; each step the engine takes waiting requests in arrival order
// and packs as many as fit the token budget into one forward (a request over the budget runs
// alone; on the CPU a long request runs in steps between the others' batches). The queue is bounded: a full queue is refused at once (429), never buffered.
//
// Every job ends exactly once, through its `done` callback: answered, failed, timed out (its
// deadline passed, whether it was queued or running; a deadline thread watches them), or
// cancelled. Work that ended before the engine reached it is skipped.
#pragma once
#include <clefrt/clefrt.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine_core.h"

namespace clefrt {

using Clock = std::chrono::steady_clock;

struct SchedulerOptions {
  size_t max_batch_tokens = 16384;
  size_t max_batch_requests = 64;
  size_t max_queue = 256;
  // On an engine that runs requests in steps (EngineCore::runs_in_steps), a request of more
  // tokens (on the GPU: of more than 4x as many, EngineCore::steps_above) runs in steps of this
  // many, one long request at a time, with the batches of shorter
  // requests that arrive meanwhile between its steps: a long request does not stall short ones
  // (they wait one step at most). The answer is the same bits either way. 0: the engine's
  // default (EngineCore::default_step_tokens).
  size_t step_tokens = 0;
  // GPU: a step runs this many layers at a time, the batches of shorter requests between them
  // (EngineCore::step); 0: the engine's default (EngineCore::default_step_layers).
  size_t step_layers = 0;
  // After a forward of several requests, how long the engine may wait for as many to be queued
  // again before it starts the next one (EngineOptions::batch_wait_ms). 0: it never waits.
  std::chrono::microseconds batch_wait{0};
};

class Job : public Ticket {
 public:
  Prepared prepared;
  Clock::time_point enqueued, deadline;
  // Runs once (see above). It must not block: it hands the result on. Dropped when the job
  // ends, so what it holds (often the request's state, which holds this job) does not outlive it.
  std::function<void(const Prepared&, Outcome)> done;

  void cancel() override;
  bool ended() const override { return ended_.load(); }

 private:
  friend class Scheduler;
  std::atomic<bool> ended_{false};
  bool end(Outcome o);  // false when the job had already ended
};

class Scheduler {
 public:
  Scheduler(const EngineCore& core, SchedulerOptions o);
  ~Scheduler();
  // Queues a request that must end by `deadline`; throws Error 429 when the queue is full, 503
  // when stopping. `done` is called later, never from inside submit().
  std::shared_ptr<Job> submit(Prepared p, Clock::time_point deadline, std::function<void(const Prepared&, Outcome)> done);
  // Several at once, all or none (429 when they do not all fit): the engine thread sees them
  // together, so they are packed as one forward when they fit its budget.
  struct Submission {
    Prepared prepared;
    Clock::time_point deadline;
    std::function<void(const Prepared&, Outcome)> done;
  };
  std::vector<std::shared_ptr<Job>> submit_all(std::vector<Submission> subs);
  // Whether submit() would refuse for a full queue now: checked before a request is encoded, so
  // an overloaded server spends nothing on work it will refuse.
  bool full() const;
  void set_observer(SchedulerObserver o);
  // Stops taking new work, finishes what is queued, joins the threads.
  void stop();
  // Tests: hold the engine thread (queued work waits) / let it go.
  void pause(bool on);
  size_t queued() const;

 private:
  void loop();
  void watch_deadlines();
  void run_batch(std::vector<std::shared_ptr<Job>>& batch);
  void step_long();
  static void end_answered(Job& j, Clock::time_point start, std::vector<std::vector<double>> p, size_t cached, size_t batch);
  static void end_failed(Job& j, Clock::time_point start);  // inside a catch block
  void drop_ended_locked();
  void report_depth_locked();
  const EngineCore& core_;
  SchedulerOptions o_;
  size_t steps_above_ = 0;  // requests of more tokens run in steps (EngineCore::steps_above)
  size_t max_options_ = 0;  // option spans one forward holds (EngineCore::max_batch_options)
  SchedulerObserver observer_;
  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_, deadline_cv_;
  std::deque<std::shared_ptr<Job>> q_;
  std::vector<std::shared_ptr<Job>> running_;  // the batch in the engine now and the long request (their deadlines still count)
  // the long request running in steps (engine thread only)
  std::shared_ptr<Job> long_job_;
  std::unique_ptr<StepRun> long_run_;
  Clock::time_point long_start_;
  bool stopping_ = false, paused_ = false;
  // the last forward's requests and its end (engine thread only): how many to wait for, until when
  size_t refill_ = 0;
  Clock::time_point refill_until_;
  std::thread thread_, deadline_thread_;
};

}  // namespace clefrt

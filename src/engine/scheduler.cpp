#include "engine/scheduler.h"

#include <algorithm>

#include "common/error.h"
#include "engine/prepared.h"

namespace clefrt {

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
}  // namespace

bool Job::end(Outcome o) {
  if (ended_.exchange(true)) return false;
  // the callback goes with the call: what it holds (the request's state, which may hold this
  // job) must not outlive the job's end
  auto fn = std::move(done);
  done = nullptr;
  if (fn) fn(prepared, std::move(o));
  return true;
}

void Job::cancel() {
  Outcome o;
  o.kind = Outcome::Kind::Cancelled;
  o.queue_ms = ms_between(enqueued, Clock::now());
  end(std::move(o));
}

Scheduler::Scheduler(const EngineCore& core, SchedulerOptions o) : core_(core), o_(o) {
  if (o_.step_tokens == 0) o_.step_tokens = size_t(core_.default_step_tokens());
  steps_above_ = size_t(core_.steps_above(int64_t(o_.step_tokens)));
  if (o_.step_layers == 0) o_.step_layers = size_t(core_.default_step_layers());
  max_options_ = size_t(core_.max_batch_options());
  thread_ = std::thread([this] { loop(); });
  deadline_thread_ = std::thread([this] { watch_deadlines(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::report_depth_locked() {
  if (observer_.queue_depth) observer_.queue_depth(q_.size());
}

void Scheduler::drop_ended_locked() {
  q_.erase(std::remove_if(q_.begin(), q_.end(), [](const std::shared_ptr<Job>& j) { return j->ended(); }), q_.end());
  report_depth_locked();
}

void Scheduler::set_observer(SchedulerObserver o) {
  std::lock_guard<std::mutex> l(mu_);
  observer_ = std::move(o);
}

bool Scheduler::full() const {
  std::lock_guard<std::mutex> l(mu_);
  if (q_.size() < o_.max_queue) return false;
  // work that timed out or whose client left holds no slot
  return size_t(std::count_if(q_.begin(), q_.end(), [](const std::shared_ptr<Job>& j) { return !j->ended(); })) >= o_.max_queue;
}

std::shared_ptr<Job> Scheduler::submit(Prepared p, Clock::time_point deadline, std::function<void(const Prepared&, Outcome)> done) {
  std::vector<Submission> one;
  one.push_back({std::move(p), deadline, std::move(done)});
  return submit_all(std::move(one))[0];
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_all(std::vector<Submission> subs) {
  std::vector<std::shared_ptr<Job>> jobs;
  const auto now = Clock::now();
  for (auto& s : subs) {
    auto job = std::make_shared<Job>();
    job->prepared = std::move(s.prepared);
    job->enqueued = now;
    job->deadline = s.deadline;
    job->done = std::move(s.done);
    jobs.push_back(std::move(job));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) throw Error(Status::Unavailable, "unavailable", "the server is shutting down");
    if (q_.size() + jobs.size() > o_.max_queue) drop_ended_locked();
    if (q_.size() + jobs.size() > o_.max_queue)
      throw Error(Status::TooManyRequests, "rate_limited",
                  "the request queue is full (" + std::to_string(o_.max_queue) + " waiting); retry shortly");
    for (auto& j : jobs) q_.push_back(j);
    report_depth_locked();
  }
  cv_.notify_one();
  deadline_cv_.notify_one();
  return jobs;
}

void Scheduler::pause(bool on) {
  {
    std::lock_guard<std::mutex> l(mu_);
    paused_ = on;
  }
  cv_.notify_all();
}

size_t Scheduler::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return q_.size();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  deadline_cv_.notify_all();
  std::lock_guard<std::mutex> j(join_mu_);  // stop() may come from a signal watcher and main at once
  if (thread_.joinable()) thread_.join();
  if (deadline_thread_.joinable()) deadline_thread_.join();
}

// Ends every queued or running job whose deadline has passed, then sleeps until the next one
// (or until a submit brings an earlier one). Runs until the engine thread has drained.
void Scheduler::watch_deadlines() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Job>> expired;
    auto next = Clock::time_point::max();
    auto scan = [&](const std::shared_ptr<Job>& j) {
      if (j->ended()) return;
      if (j->deadline <= now) expired.push_back(j);
      else next = std::min(next, j->deadline);
    };
    for (const auto& j : q_) scan(j);
    for (const auto& j : running_) scan(j);
    if (!expired.empty()) {
      l.unlock();
      for (auto& j : expired) {
        Outcome o;
        o.kind = Outcome::Kind::TimedOut;
        o.queue_ms = ms_between(j->enqueued, now);
        j->end(std::move(o));
      }
      l.lock();
      continue;
    }
    if (stopping_ && q_.empty() && running_.empty()) return;  // (the long job is in running_ between steps)
    if (next == Clock::time_point::max()) deadline_cv_.wait(l);
    else deadline_cv_.wait_until(l, next);
  }
}

void Scheduler::end_answered(Job& j, Clock::time_point start, std::vector<std::vector<double>> p, size_t cached, size_t batch) {
  Outcome o;
  o.probs = std::move(p);
  o.cached_tokens = cached;
  o.batch_requests = batch;
  o.queue_ms = ms_between(j.enqueued, start);
  o.compute_ms = ms_between(start, Clock::now());
  j.end(std::move(o));
}
void Scheduler::end_failed(Job& j, Clock::time_point start) {  // inside a catch block
  Outcome o;
  o.kind = Outcome::Kind::Failed;
  o.error = std::current_exception();
  o.queue_ms = ms_between(j.enqueued, start);
  o.compute_ms = ms_between(start, Clock::now());
  j.end(std::move(o));
}

void Scheduler::loop() {
  const bool stepping = core_.runs_in_steps();
  for (;;) {
    std::vector<std::shared_ptr<Job>> batch;
    std::shared_ptr<Job> new_long;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return (!paused_ && (!q_.empty() || long_job_)) || (stopping_ && q_.empty() && !long_job_); });
      if (q_.empty() && !long_job_) {  // stopping and drained
        deadline_cv_.notify_all();
        return;
      }
      // The clients of a forward's requests often come back together (a pool of workers, each
      // sending its next request when its answer arrives), a fraction of a millisecond apart: a
      // forward started on the first of them would leave the rest for the one after it, and
      // the batches would alternate between a few requests and the rest. So after a forward of
      // several requests the engine waits, up to batch_wait from its end, for as many to be
      // queued again (or for the token budget to fill). A lone client never waits: one request
      // queued is as many as its last forward had.
      if (refill_ > 1 && !long_job_) {
        const size_t want = std::min(refill_, o_.max_batch_requests);
        const auto enough = [&] {
          if (stopping_ || paused_ || q_.size() >= want) return true;
          size_t tokens = 0;
          for (const auto& j : q_) tokens += j->prepared.encoded().input_ids.size();
          return tokens >= o_.max_batch_tokens;
        };
        cv_.wait_until(l, refill_until_, enough);
        refill_ = 0;
        if (paused_ || q_.empty()) continue;  // back to the wait above (stopping with an empty queue ends there)
      }
      size_t tokens = 0, options = 0;
      for (auto it = q_.begin(); it != q_.end() && batch.size() < o_.max_batch_requests;) {
        const std::shared_ptr<Job>& j = *it;
        if (j->ended()) {
          it = q_.erase(it);
          continue;
        }
        const size_t n = j->prepared.encoded().input_ids.size();
        if (stepping && n > steps_above_) {  // a long request runs in steps, one at a time
          if (!long_job_ && !new_long) {
            new_long = j;
            it = q_.erase(it);
          } else {
            ++it;  // waits for the one running; the short ones behind it go ahead
          }
          continue;
        }
        size_t opts = 0;
        for (const auto& q : j->prepared.encoded().questions) opts += q.option_spans.size();
        if (!batch.empty() && (tokens + n > o_.max_batch_tokens || options + opts > max_options_)) break;
        tokens += n;
        options += opts;
        batch.push_back(j);
        it = q_.erase(it);
      }
      report_depth_locked();
      running_ = batch;
      if (long_job_) running_.push_back(long_job_);
      if (new_long) running_.push_back(new_long);
    }
    if (!batch.empty()) {
      run_batch(batch);
      if (o_.batch_wait.count() > 0) {
        refill_ = batch.size();
        refill_until_ = Clock::now() + o_.batch_wait;
      }
    }
    if (new_long) {
      long_job_ = new_long;
      long_start_ = Clock::now();
      if (observer_.batch) observer_.batch(1, new_long->prepared.encoded().input_ids.size());
    }
    if (long_job_) step_long();
    std::lock_guard<std::mutex> l(mu_);
    running_.clear();
    if (long_job_) running_.push_back(long_job_);  // its deadline still counts between steps
  }
}

// One step of the long request (scheduler.h): about step_tokens of its tokens, then back to
// the queue. It ends when its last step gives the probabilities, when it fails, or when it was
// cancelled / timed out between steps (its work is dropped).
void Scheduler::step_long() {
  auto drop = [&] {
    long_run_.reset();
    long_job_.reset();
  };
  Job& j = *long_job_;
  if (j.ended()) return drop();
  try {
    if (!long_run_) long_run_ = core_.start(sequence_of(j.prepared));
    if (core_.step(*long_run_, int64_t(o_.step_tokens), int64_t(o_.step_layers))) {
      size_t cached = 0;
      auto p = core_.finish(*long_run_, &cached);
      end_answered(j, long_start_, std::move(p), cached, 1);
      drop();
    }
  } catch (...) {
    end_failed(j, long_start_);
    drop();
  }
}

void Scheduler::run_batch(std::vector<std::shared_ptr<Job>>& batch) {
  const auto t0 = Clock::now();
  model::Batch seqs;
  size_t tokens = 0;
  for (auto& j : batch) {
    seqs.push_back(sequence_of(j->prepared));
    tokens += j->prepared.encoded().input_ids.size();
  }
  if (observer_.batch) observer_.batch(batch.size(), tokens);
  try {
    std::vector<size_t> cached;
    auto probs = core_.probs(seqs, model::GdnForm::Chunked, &cached);
    for (size_t i = 0; i < batch.size(); ++i) end_answered(*batch[i], t0, std::move(probs[i]), cached[i], batch.size());
  } catch (...) {
    // One request's failure must not fail its batch-mates: run them one by one.
    if (batch.size() == 1) {
      end_failed(*batch[0], t0);
      return;
    }
    for (auto& j : batch) {
      if (j->ended()) continue;
      const auto t1 = Clock::now();
      try {
        std::vector<size_t> cached;
        auto p = core_.probs(model::Batch{sequence_of(j->prepared)}, model::GdnForm::Chunked, &cached);
        end_answered(*j, t1, std::move(p[0]), cached[0], 1);
      } catch (...) {
        end_failed(*j, t1);
      }
    }
  }
}

}  // namespace clefrt

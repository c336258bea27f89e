#include "server/scheduler.h"

#include <algorithm>

#include "common/error.h"

namespace clefrt::server {

using Clock = std::chrono::steady_clock;

Scheduler::Scheduler(const Engine& engine, SchedulerOptions o, Metrics& m) : engine_(engine), o_(o), metrics_(m) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Job> Scheduler::submit(Encoded enc) {
  auto job = std::make_shared<Job>();
  job->enc = std::move(enc);
  job->enqueued = Clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) throw Error(Status::Unavailable, "unavailable", "the server is shutting down");
    if (q_.size() >= o_.max_queue) {  // work that timed out or whose client left holds no slot
      q_.erase(std::remove_if(q_.begin(), q_.end(), [](const std::shared_ptr<Job>& j) { return j->cancelled.load(); }), q_.end());
      metrics_.set_queue_depth(q_.size());
    }
    if (q_.size() >= o_.max_queue)
      throw Error(Status::TooManyRequests, "rate_limited",
                  "the request queue is full (" + std::to_string(o_.max_queue) + " waiting); retry shortly");
    q_.push_back(job);
    metrics_.set_queue_depth(q_.size());
  }
  cv_.notify_one();
  return job;
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
  std::lock_guard<std::mutex> j(join_mu_);  // stop() may come from a signal watcher and main at once
  if (thread_.joinable()) thread_.join();
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> batch;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return (!q_.empty() && !paused_) || (stopping_ && q_.empty()); });
      if (q_.empty()) return;  // stopping and drained
      size_t tokens = 0;
      while (!q_.empty() && batch.size() < o_.max_batch_requests) {
        auto& j = q_.front();
        if (j->cancelled) {
          q_.pop_front();
          continue;
        }
        const size_t n = j->enc.input_ids.size();
        if (!batch.empty() && tokens + n > o_.max_batch_tokens) break;
        tokens += n;
        batch.push_back(j);
        q_.pop_front();
      }
      metrics_.set_queue_depth(q_.size());
    }
    if (batch.empty()) continue;
    const auto t0 = Clock::now();
    std::vector<const Encoded*> encs;
    size_t tokens = 0;
    for (auto& j : batch) {
      encs.push_back(&j->enc);
      tokens += j->enc.input_ids.size();
      j->queue_ms = std::chrono::duration<double, std::milli>(t0 - j->enqueued).count();
    }
    metrics_.batch(batch.size(), tokens);
    try {
      auto probs = engine_.probs(encs);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i]->compute_ms = ms;
        batch[i]->result.set_value(std::move(probs[i]));
      }
    } catch (...) {
      // One request's failure must not fail its batch-mates: run them one by one.
      if (batch.size() == 1) {
        batch[0]->result.set_exception(std::current_exception());
        continue;
      }
      for (auto& j : batch) {
        const auto t1 = Clock::now();
        try {
          auto p = engine_.probs({&j->enc});
          j->compute_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
          j->result.set_value(std::move(p[0]));
        } catch (...) {
          j->result.set_exception(std::current_exception());
        }
      }
    }
  }
}

}  // namespace clefrt::server

#include "server/work_pool.h"

#include <algorithm>

namespace clefrt::server {

WorkPool::WorkPool(size_t threads, size_t max_waiting) : max_waiting_(max_waiting) {
  for (size_t i = 0; i < std::max<size_t>(1, threads); ++i)
    threads_.emplace_back([this] {
      for (;;) {
        std::function<void()> fn;
        {
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait(l, [&] { return stopping_ || !q_.empty(); });
          if (q_.empty()) return;
          fn = std::move(q_.front());
          q_.pop_front();
        }
        fn();
      }
    });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool WorkPool::try_post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ || q_.size() >= max_waiting_) return false;
    q_.push_back(std::move(fn));
  }
  cv_.notify_one();
  return true;
}

bool WorkPool::stopping() const {
  std::lock_guard<std::mutex> l(mu_);
  return stopping_;
}

size_t WorkPool::waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return q_.size();
}

}  // namespace clefrt::server

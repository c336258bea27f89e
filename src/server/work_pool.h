// A fixed set of threads running queued work, with a bounded queue: what `clefrt serve` does
// between the transport and the engine (parse, validate, encode), off the event loop.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace clefrt::server {

class WorkPool {
 public:
  WorkPool(size_t threads, size_t max_waiting);
  ~WorkPool();  // runs what is queued, then joins
  // Queues fn; false (and fn dropped) when max_waiting tasks already wait.
  bool try_post(std::function<void()> fn);
  size_t waiting() const;
  bool stopping() const;

 private:
  size_t max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace clefrt::server

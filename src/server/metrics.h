// Prometheus text metrics for `clefrt serve`: requests by endpoint and status, errors by type,
// latency, queue depth, open connections, batch size and batch tokens, prompt tokens, device
// memory.
#pragma once
#include <clefrt/clefrt.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace clefrt::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;
  // Its series only (no HELP / TYPE lines), each with these labels before `le` ("a=\"x\",").
  void render_series(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

class Metrics {
 public:
  Metrics();
  // Every response, refusals of the transport included; error_type empty on success.
  void request(const std::string& endpoint, int status, const std::string& error_type, double seconds);
  void batch(size_t requests, size_t tokens);
  void prompt_tokens(size_t n) { prompt_tokens_ += n; }
  void set_queue_depth(size_t n) { queue_depth_ = n; }
  void set_device_memory(uint64_t bytes) { device_bytes_ = bytes; }
  std::string render(size_t open_connections, const PrefixCacheStats& cache) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> errors_;  // by error type
  // latency by (endpoint, outcome): "answered" (2xx) or "refused" (everything else), so a
  // decision's time is not averaged with /health polls or instant refusals
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Histogram>> latency_;
  Histogram batch_size_, batch_tokens_;
  std::atomic<uint64_t> prompt_tokens_{0}, device_bytes_{0};
  std::atomic<size_t> queue_depth_{0};
};

}  // namespace clefrt::server

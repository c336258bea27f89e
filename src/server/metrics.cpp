#include "server/metrics.h"

#include <cstdio>
#include <cstdlib>

namespace clefrt::server {

namespace {
// the shortest text that reads back as v (0.005, not 0.0050000000000000001): bucket labels are
// matched as strings by the queries written against them
std::string num(double v) {
  char b[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}
}  // namespace

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> l(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  render_series(out, name, "");
}

void Histogram::render_series(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{" + labels + "le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{" + labels + "le=\"+Inf\"} " + std::to_string(cum) + "\n";
  const std::string plain = labels.empty() ? "" : "{" + labels.substr(0, labels.size() - 1) + "}";
  out += name + "_sum" + plain + " " + num(sum_) + "\n" + name + "_count" + plain + " " + std::to_string(n_) + "\n";
}

Metrics::Metrics()
    : batch_size_({1, 2, 4, 8, 16, 32, 64, 128}),
      batch_tokens_({256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}) {}

void Metrics::request(const std::string& endpoint, int status, const std::string& error_type, double seconds) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++requests_[{endpoint, status}];
    if (!error_type.empty()) ++errors_[error_type];
    auto& h = latency_[{endpoint, status >= 200 && status < 300 ? "answered" : "refused"}];
    if (!h) h = std::make_unique<Histogram>(std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
    h->observe(seconds);
  }
}

void Metrics::batch(size_t requests, size_t tokens) {
  batch_size_.observe(double(requests));
  batch_tokens_.observe(double(tokens));
}

std::string Metrics::render(size_t open_connections, const PrefixCacheStats& cache) const {
  std::string out =
      "# HELP clefrt_requests_total HTTP requests by endpoint (\"other\": any unknown path) and status, refusals of the HTTP "
      "layer included.\n# TYPE clefrt_requests_total counter\n";
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, n] : requests_)
      out += "clefrt_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
    out += "# HELP clefrt_errors_total Responses other than 200 by error type.\n# TYPE clefrt_errors_total counter\n";
    for (auto& [k, n] : errors_) out += "clefrt_errors_total{type=\"" + k + "\"} " + std::to_string(n) + "\n";
  }
  out += "# HELP clefrt_open_connections HTTP connections open now.\n# TYPE clefrt_open_connections gauge\n";
  out += "clefrt_open_connections " + std::to_string(open_connections) + "\n";
  out += "# HELP clefrt_request_duration_seconds Time from request received to response ready, by endpoint and outcome "
         "(answered: 2xx; refused: any other status).\n# TYPE clefrt_request_duration_seconds histogram\n";
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, h] : latency_)
      h->render_series(out, "clefrt_request_duration_seconds", "endpoint=\"" + k.first + "\",outcome=\"" + k.second + "\",");
  }
  batch_size_.render(out, "clefrt_batch_requests", "Requests per engine forward.");
  batch_tokens_.render(out, "clefrt_batch_tokens", "Prompt tokens per engine forward.");
  out += "# HELP clefrt_prompt_tokens_total Prompt tokens of answered requests.\n# TYPE clefrt_prompt_tokens_total counter\n";
  out += "clefrt_prompt_tokens_total " + std::to_string(prompt_tokens_.load()) + "\n";
  out += "# HELP clefrt_queue_depth Requests waiting for the engine.\n# TYPE clefrt_queue_depth gauge\n";
  out += "clefrt_queue_depth " + std::to_string(queue_depth_.load()) + "\n";
  out += "# HELP clefrt_device_memory_bytes GPU memory held by the engine (0 on the CPU).\n# TYPE clefrt_device_memory_bytes gauge\n";
  out += "clefrt_device_memory_bytes " + std::to_string(device_bytes_.load()) + "\n";
  auto metric = [&](const char* name, const char* type, const char* help, uint64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + std::to_string(v) + "\n";
  };
  metric("clefrt_prefix_cache_hit_tokens_total", "counter", "Prompt tokens read from the prefix cache instead of computed.", cache.hit_tokens);
  metric("clefrt_prefix_cache_hits_total", "counter", "Requests that continued a cached prefix.", cache.hits);
  metric("clefrt_prefix_cache_misses_total", "counter", "Requests long enough to reuse a prefix that found none cached.", cache.misses);
  metric("clefrt_prefix_cache_evictions_total", "counter", "Cached prefixes evicted for the byte budget.", cache.evictions);
  metric("clefrt_prefix_cache_bytes", "gauge", "Memory held by cached prefixes (0 with the cache off).", cache.bytes);
  metric("clefrt_prefix_cache_entries", "gauge", "Cached prefixes.", cache.entries);
  metric("clefrt_prefix_cache_budget_bytes", "gauge", "The prefix cache's byte budget (0: off).", cache.budget_bytes);
  metric("clefrt_prefix_cache_host_bytes", "gauge", "Pinned host memory held by the prefix cache's host tier (GPU engines; 0 without it).",
         cache.host_bytes);
  metric("clefrt_prefix_cache_host_entries", "gauge", "Prefixes in the host tier.", cache.host_entries);
  metric("clefrt_prefix_cache_host_budget_bytes", "gauge", "The host tier's byte budget (0: off).", cache.host_budget_bytes);
  metric("clefrt_prefix_cache_host_hits_total", "counter", "Hits copied back from the host tier (counted in the hits too).", cache.host_hits);
  metric("clefrt_prefix_cache_host_hit_tokens_total", "counter", "Prompt tokens of those hits.", cache.host_hit_tokens);
  metric("clefrt_prefix_cache_to_host_total", "counter", "Prefixes the GPU budget evicted that went to the host tier.", cache.to_host);
  metric("clefrt_prefix_cache_host_evictions_total", "counter", "Prefixes dropped from the host tier for its budget.", cache.host_evictions);
  return out;
}

}  // namespace clefrt::server

// clefrt_load: a small HTTP load generator for `clefrt serve` (cpp-httplib client).
//   clefrt_load --port 8080 --body examples/blog.json --clients 1,8,64 --seconds 10 [--json FILE]
// Each client sends the body to POST /v1/systemone back to back for the duration; reports
// requests/s and latency p50/p95/p99 per concurrency, and counts non-200 answers.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {
double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}
}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", body_file = "examples/blog.json", clients_s = "1,8,64", json_out, path = "/v1/systemone", key;
  int port = 8080;
  double seconds = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "clefrt_load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--host") host = next();
    else if (a == "--port") port = std::atoi(next().c_str());
    else if (a == "--body") body_file = next();
    else if (a == "--clients") clients_s = next();
    else if (a == "--seconds") seconds = std::atof(next().c_str());
    else if (a == "--json") json_out = next();
    else if (a == "--path") path = next();
    else if (a == "--api-key") key = next();
    else {
      std::fprintf(stderr,
                   "usage: clefrt_load [--host H] [--port P] [--body FILE] [--path /v1/systemone] [--clients 1,8,64] [--seconds S]\n"
                   "                   [--api-key K] [--json FILE]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  std::ifstream f(body_file, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "clefrt_load: cannot read %s\n", body_file.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string body = ss.str();
  std::vector<int> levels;
  for (std::stringstream cs(clients_s); std::getline(cs, clients_s, ',');) levels.push_back(std::atoi(clients_s.c_str()));
  std::string js = "[";
  std::printf("%8s %10s %10s %10s %10s %8s\n", "clients", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors");
  for (int n : levels) {
    std::vector<double> lat;
    std::mutex mu;
    std::atomic<int> errors{0};
    const auto t0 = std::chrono::steady_clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    std::vector<std::thread> ts;
    for (int c = 0; c < n; ++c)
      ts.emplace_back([&] {
        httplib::Client cl(host, port);
        cl.set_read_timeout(120, 0);
        httplib::Headers h;
        if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
        std::vector<double> mine;
        while (std::chrono::steady_clock::now() < end) {
          const auto s = std::chrono::steady_clock::now();
          auto r = cl.Post(path, h, body, "application/json");
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
          if (!r || r->status != 200) {
            if (errors++ < 3)
              std::fprintf(stderr, "clefrt_load: %s\n",
                           r ? ("HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200)).c_str()
                             : ("no response: " + httplib::to_string(r.error())).c_str());
          } else {
            mine.push_back(ms);
          }
        }
        std::lock_guard<std::mutex> l(mu);
        lat.insert(lat.end(), mine.begin(), mine.end());
      });
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rps = double(lat.size()) / wall;
    const double p50 = pct(lat, 0.5), p95 = pct(lat, 0.95), p99 = pct(lat, 0.99);
    std::printf("%8d %10.2f %10.2f %10.2f %10.2f %8d\n", n, rps, p50, p95, p99, errors.load());
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s{\"clients\":%d,\"requests_per_s\":%.3f,\"p50_ms\":%.3f,\"p95_ms\":%.3f,\"p99_ms\":%.3f,\"errors\":%d}",
                  js.size() > 1 ? "," : "", n, rps, p50, p95, p99, errors.load());
    js += buf;
  }
  js += "]";
  if (!json_out.empty()) std::ofstream(json_out) << js << "\n";
  return 0;
}

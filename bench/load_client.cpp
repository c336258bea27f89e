// clefrt_load: a small HTTP load generator for `clefrt serve` (cpp-httplib client).
//   clefrt_load --port 8080 --body examples/blog.json --clients 1,8,64 --seconds 10 [--json FILE]
// Each client sends the body to POST /v1/systemone back to back for the duration; reports
// requests/s and latency p50/p95/p99 per concurrency, and counts non-200 answers.
// The shared-state workload (--shared-states N --question-sets M [--state-words W]) sends N
// generated states x M question sets instead, in a fixed shuffled order (the prefix cache's
// case: each state asked several question sets), and also reports the share of input tokens
// the server read from its prefix cache (usage.cached_tokens).
// By default each request opens its own connection (cpp-httplib's client default, and that of a
// script calling a bare urlopen / requests.post); --keep-alive reuses one connection per client,
// as a requests.Session / httpx.Client does, so the figure leaves out TCP setup and teardown.
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
  int port = 8080, shared_states = 0, question_sets = 1, state_words = 2000;
  double seconds = 10;
  bool keep_alive = false;
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
    else if (a == "--shared-states") shared_states = std::atoi(next().c_str());
    else if (a == "--question-sets") question_sets = std::atoi(next().c_str());
    else if (a == "--state-words") state_words = std::atoi(next().c_str());
    else if (a == "--keep-alive") keep_alive = true;
    else {
      std::fprintf(stderr,
                   "usage: clefrt_load [--host H] [--port P] [--body FILE] [--path /v1/systemone] [--clients 1,8,64] [--seconds S]\n"
                   "                   [--keep-alive] [--api-key K] [--json FILE] [--shared-states N --question-sets M [--state-words W]]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  std::vector<std::string> bodies;
  if (shared_states > 0) {
    if (question_sets < 1 || state_words < 1) {
      std::fprintf(stderr, "clefrt_load: --question-sets and --state-words must be at least 1\n");
      return 2;
    }
    static const char* words[] = {"order", "shipped", "late", "customer", "asked", "refund", "invoice", "twice", "login", "fails", "since", "Monday"};
    std::vector<std::string> states;
    for (int i = 0; i < shared_states; ++i) {
      std::string st = "ticket " + std::to_string(i) + ":";
      for (int w = 0; w < state_words; ++w) st += std::string(" ") + words[(size_t(i) * 7 + size_t(w) * 13 + size_t(w / 5)) % 12];
      states.push_back(st);
    }
    for (int i = 0; i < shared_states; ++i)
      for (int q = 0; q < question_sets; ++q)
        bodies.push_back("{\"state\":\"" + states[size_t(i)] + "\",\"questions\":{\"q" + std::to_string(q) +
                         "\":{\"type\":\"noul\",\"instructions\":\"Question set " + std::to_string(q) +
                         ": is it urgent?\"},\"team\":{\"type\":\"choice\",\"criteria\":{\"billing\":null,\"tech\":null,\"sales\":null}}}}");
    // a fixed shuffle, so a state's question sets arrive spread over the run
    for (size_t k = bodies.size(); k > 1; --k) std::swap(bodies[k - 1], bodies[(k * 2654435761u) % k]);
  } else {
    std::ifstream f(body_file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "clefrt_load: cannot read %s\n", body_file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    bodies.push_back(ss.str());
  }
  auto usage_field = [](const std::string& resp, const char* name) -> long {
    const size_t at = resp.find(std::string("\"") + name + "\":");
    return at == std::string::npos ? 0 : std::atol(resp.c_str() + at + std::strlen(name) + 3);
  };
  std::vector<int> levels;
  for (std::stringstream cs(clients_s); std::getline(cs, clients_s, ',');) levels.push_back(std::atoi(clients_s.c_str()));
  std::string js = "[";
  std::printf("%8s %10s %10s %10s %10s %8s %8s\n", "clients", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors", "cached");
  for (int n : levels) {
    std::vector<double> lat;
    std::mutex mu;
    std::atomic<int> errors{0};
    std::atomic<long> input_tokens{0}, cached_tokens{0};
    std::atomic<size_t> next_body{0};
    const auto t0 = std::chrono::steady_clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    std::vector<std::thread> ts;
    for (int c = 0; c < n; ++c)
      ts.emplace_back([&] {
        httplib::Client cl(host, port);
        cl.set_read_timeout(120, 0);
        cl.set_keep_alive(keep_alive);
        // cpp-httplib writes the headers and the body in two sends: under Nagle the body would wait
        // for the server's (delayed) ACK of the headers, ~40 ms on a kept connection
        cl.set_tcp_nodelay(true);
        httplib::Headers h;
        if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
        std::vector<double> mine;
        while (std::chrono::steady_clock::now() < end) {
          const auto s = std::chrono::steady_clock::now();
          const std::string& body = bodies[next_body++ % bodies.size()];
          auto r = cl.Post(path, h, body, "application/json");
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
          if (!r || r->status != 200) {
            if (errors++ < 3)
              std::fprintf(stderr, "clefrt_load: %s\n",
                           r ? ("HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200)).c_str()
                             : ("no response: " + httplib::to_string(r.error())).c_str());
          } else {
            mine.push_back(ms);
            input_tokens += usage_field(r->body, "input_tokens");
            cached_tokens += usage_field(r->body, "cached_tokens");
          }
        }
        std::lock_guard<std::mutex> l(mu);
        lat.insert(lat.end(), mine.begin(), mine.end());
      });
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rps = double(lat.size()) / wall;
    const double p50 = pct(lat, 0.5), p95 = pct(lat, 0.95), p99 = pct(lat, 0.99);
    const double cached_share = input_tokens > 0 ? double(cached_tokens) / double(input_tokens) : 0;
    std::printf("%8d %10.2f %10.2f %10.2f %10.2f %8d %7.1f%%\n", n, rps, p50, p95, p99, errors.load(), 100 * cached_share);
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s{\"clients\":%d,\"requests_per_s\":%.3f,\"p50_ms\":%.3f,\"p95_ms\":%.3f,\"p99_ms\":%.3f,\"errors\":%d,"
                  "\"input_tokens\":%ld,\"cached_tokens\":%ld,\"cached_share\":%.4f,\"keep_alive\":%s}",
                  js.size() > 1 ? "," : "", n, rps, p50, p95, p99, errors.load(), input_tokens.load(), cached_tokens.load(), cached_share,
                  keep_alive ? "true" : "false");
    js += buf;
  }
  js += "]";
  if (!json_out.empty()) std::ofstream(json_out) << js << "\n";
  return 0;
}

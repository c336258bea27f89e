// Helpers of the server tests: an in-process `clefrt serve` on the CPU engine with a synthesized
// tiny model, and raw-socket clients for what an HTTP library would not send.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/json.h"
#include "server/server.h"
#include "test_util.h"

namespace clefrt::server::test_server {

inline const std::string& tiny_dir() {
  static const std::string dir = test::synth_folder("serve-tiny", 11);
  return dir;
}

inline std::unique_ptr<Engine> load_tiny(const std::string& dir, bool check_weights = true, size_t max_queue = 256) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.threads = 2;
  eo.check_weights = check_weights;
  eo.max_queue = max_queue;
  return Engine::load(dir, eo);
}

struct Running {
  std::unique_ptr<HttpServer> srv;
  std::thread th;
  int port = 0;
  explicit Running(ServerOptions o, std::function<std::unique_ptr<Engine>()> load = [] { return load_tiny(tiny_dir()); }) {
    signal(SIGPIPE, SIG_IGN);  // a client writing a body the server has refused gets EPIPE, not a signal
    o.port = 0;
    o.log_requests = false;
    srv = std::make_unique<HttpServer>(o, std::move(load));
    port = srv->bind();
    th = std::thread([this] { srv->run(); });
    srv->wait_ready();
  }
  ~Running() {
    srv->stop();
    th.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
};

inline const std::string kBlog = R"({"model":"clef","state":"Our checkout is down and orders are blocked.","questions":{
  "outage":{"type":"noul","instructions":"Is a service down?"},
  "team":{"type":"choice","instructions":"Which team should handle it?","criteria":{"billing":"payments","tech":"outages","sales":null}},
  "severity":{"type":"score","instructions":"How severe is it?","criteria":["No impact","Minor","Major","Critical"]}}})";

// A blocking loopback connection for hand-made bytes.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() { close(); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  bool ok() const { return ok_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // false when the server has closed (EPIPE / reset): it may answer before reading everything
  bool send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // Everything received until the peer closes or `seconds` pass.
  std::string read_all(double seconds) {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[65536];
    while (std::chrono::steady_clock::now() < end) {
      timeval tv{0, 50000};
      setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        break;
      }
      out.append(buf, size_t(n));
    }
    return out;
  }
  // Reads until `count` complete Content-Length-framed responses are in, or `seconds` pass.
  std::vector<std::pair<int, std::string>> read_responses(size_t count, double seconds) {
    std::vector<std::pair<int, std::string>> got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[65536];
    while (got.size() < count && std::chrono::steady_clock::now() < end) {
      for (;;) {
        const size_t h = pending_.find("\r\n\r\n");
        if (h == std::string::npos) break;
        const std::string head = pending_.substr(0, h);
        size_t len = 0;
        for (const char* name : {"Content-Length: ", "content-length: "})
          if (size_t p = head.find(name); p != std::string::npos) len = std::stoul(head.substr(p + std::strlen(name)));
        if (pending_.size() < h + 4 + len) break;
        got.emplace_back(status_of(head), pending_.substr(h + 4, len));
        pending_.erase(0, h + 4 + len);
        if (got.size() == count) return got;
      }
      timeval tv{0, 50000};
      setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n > 0) pending_.append(buf, size_t(n));
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    }
    return got;
  }
  static int status_of(const std::string& response) {
    if (response.compare(0, 5, "HTTP/") != 0 || response.size() < 12) return 0;
    return std::atoi(response.c_str() + 9);
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string pending_;
};

inline std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "\r\n" + body;
}

// A copy of `dir` whose first backbone tensor named like `part` holds only NaN (bf16 0x7fc0).
inline std::string poisoned_copy(const std::string& dir, const std::string& tag, const std::string& part) {
  namespace fs = std::filesystem;
  const std::string out = testing::TempDir() + "clefrt-" + tag + "-" + std::to_string(getpid());
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(dir)) fs::copy_file(e.path(), out + "/" + e.path().filename().string(), fs::copy_options::overwrite_existing);
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-", 0) != 0) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t hlen = 0;
    f.read(reinterpret_cast<char*>(&hlen), 8);
    std::string header(hlen, '\0');
    f.read(header.data(), std::streamsize(hlen));
    const json::Value h = json::parse(header);
    for (const auto& [tensor, info] : h.obj) {
      if (tensor.find(part) == std::string::npos || !info.find("dtype") || info.find("dtype")->s != "BF16") continue;
      const auto& offs = info.find("data_offsets")->arr;
      f.seekp(std::streamoff(8 + hlen + uint64_t(offs[0].i)));
      for (int64_t k = offs[0].i; k < offs[1].i; k += 2) f.write("\xc0\x7f", 2);
      return out;
    }
  }
  ADD_FAILURE() << "no BF16 tensor named like " << part << " in " << dir;
  return out;
}

}  // namespace clefrt::server::test_server

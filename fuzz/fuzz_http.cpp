// libFuzzer target: any byte string sent on one connection to the HTTP transport (http.h), then
// the client's write side closed. The transport must answer each complete request or refuse it
// with a well-formed response, never crash, leak or hang; its handler echoes the body's length.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "server/http.h"

namespace http = clefrt::server::http;

static int server_port() {
  static int port = [] {
    signal(SIGPIPE, SIG_IGN);
    http::Options o;
    o.port = 0;
    o.max_body_bytes = 1 << 16;  // small limits so that inputs can reach them
    o.max_header_bytes = 4096;
    o.header_timeout_s = 2;
    o.body_timeout_s = 2;
    o.idle_timeout_s = 2;
    auto* t = new http::Transport(
        o,
        [](http::Request req, std::shared_ptr<http::Exchange> ex) {
          http::Response r;
          r.body = std::to_string(req.body.size());
          ex->respond(std::move(r));
        },
        [](const http::Request&, const http::Refusal& why) {
          http::Response r;
          r.status = why.status;
          r.body = why.type;
          return r;
        });
    const int p = t->bind();
    std::thread([t] { t->run(); }).detach();
    return p;
  }();
  return port;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int port = server_port();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Thousands of loopback connections a second exhaust the ephemeral ports while earlier ones sit
  // in TIME_WAIT: the connection ends with a reset (below), and a refused connect is retried.
  int tries = 0;
  while (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (++tries > 200) {
      std::fprintf(stderr, "fuzz_http: connect failed for 2 s: %s\n", std::strerror(errno));
      abort();
    }
    close(fd);
    usleep(10000);
    fd = socket(AF_INET, SOCK_STREAM, 0);
  }
  size_t off = 0;
  while (off < size) {
    const ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // refused and closed early
    off += size_t(n);
  }
  shutdown(fd, SHUT_WR);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // the transport hung on this input
        std::fprintf(stderr, "fuzz_http: no close within 5 s; %zu bytes sent of %zu, %zu received: %.300s\n", off, size, out.size(),
                     out.c_str());
        abort();
      }
      break;                                               // reset: allowed after a refusal
    }
    out.append(buf, size_t(n));
  }
  linger lg{1, 0};  // a reset, not a TIME_WAIT per input
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
  // every response the transport wrote is a status line of HTTP/1.x with a 3-digit code
  size_t pos = 0;
  while (pos < out.size()) {
    if (out.compare(pos, 7, "HTTP/1.") != 0 || out.size() < pos + 12) {
      std::fprintf(stderr, "fuzz_http: malformed response at byte %zu of %zu: %.300s\n", pos, out.size(), out.c_str());
      abort();
    }
    const size_t head = out.find("\r\n\r\n", pos);
    if (head == std::string::npos) abort();
    const size_t cl = out.find("Content-Length: ", pos);
    if (cl == std::string::npos || cl > head) abort();
    const size_t next = head + 4 + std::strtoul(out.c_str() + cl + 16, nullptr, 10);
    // a HEAD answer has the GET answer's Content-Length and no body
    pos = next < out.size() && out.compare(next, 7, "HTTP/1.") != 0 && out.compare(head + 4, 7, "HTTP/1.") == 0 ? head + 4 : next;
  }
  return 0;
}

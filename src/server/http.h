// The HTTP/1.1 transport of `clefrt serve`, apart from what the server says: connections,
// framing, limits and deadlines. server.cpp sees only these types; http_transport.cpp holds the
// one implementation (Boost.Asio + Boost.Beast's parser, event-driven: an idle or slow client
// costs a socket and a few hundred bytes, never a thread).
//
// What it guarantees (each refusal goes through the Refuse callback, which writes the body, the
// log line and the count):
// - a request's headers must arrive whole within header_timeout_s of its first byte and fit in
//   max_header_bytes (431 past it; 408 past the deadline), its body within body_timeout_s of
//   the headers (408);
// - the body limit holds after every decoding: a declared Content-Length over it is refused as
//   soon as the headers end (413, nothing read), a chunked body as it crosses it, a gzip or
//   deflate body as its inflated size crosses it; other Content-Encodings are 415;
// - requests pipelined on one connection are answered one at a time, in order;
// - a connection with no request pending is closed after idle_timeout_s; a client that hangs
//   up (or shuts down its sending side) while its request is in flight makes the exchange's
//   on_abort callback run; one that does so while its answer is being written gets the answer;
// - bodies being read hold a share of one server-wide budget (503 past it); past
//   max_connections a new connection is answered 503 and closed;
// - stop(): no new connections; connections without a request in progress close at once,
//   requests in progress get drain_s to finish, then everything is closed.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace clefrt::server::http {

struct Header {
  std::string name, value;
};

struct Request {
  std::string method;           // as sent ("GET", "POST", ...)
  std::string target;           // as sent: the path and any query
  std::string path;             // target up to '?'
  std::vector<Header> headers;  // in arrival order, names as sent
  std::string body;             // with Transfer-Encoding and Content-Encoding undone
  std::string remote;           // the peer, "address:port"
  // The first header of that name (case-insensitive), or null.
  const std::string* header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<Header> headers;  // more headers (Retry-After, Allow, ...)
};

// One request in flight. The handler answers it exactly once, from any thread; later calls,
// and calls after the client has gone, are ignored.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void respond(Response r) = 0;
  // fn runs once, on a transport thread, if the connection ends before respond() (the client
  // hung up, or stop() ran out of drain time). Set it before the work that may take long.
  virtual void on_abort(std::function<void()> fn) = 0;
};

using Handler = std::function<void(Request req, std::shared_ptr<Exchange> ex)>;

// A request refused by the transport itself. req holds what was read of it (method and target
// may be empty). Returns the response to send; the connection is closed after it.
struct Refusal {
  int status;
  std::string type, message;
};
using Refuse = std::function<Response(const Request& req, const Refusal& why)>;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;                          // 0: any free port
  int io_threads = 2;                       // threads running the connections' event loop
  size_t max_connections = 16384;           // open at once; past it a new one gets 503 and is closed
  size_t max_header_bytes = 64 << 10;       // request line + headers
  size_t max_body_bytes = 13 << 20;         // the body after decoding (and before)
  size_t max_bodies_bytes = size_t(1) << 30;  // all bodies being read or decoded at once (a body of
                                            // unknown length counts in full, a compressed one twice);
                                            // past it a new body gets 503
  double header_timeout_s = 10;             // from a request's first byte to the end of its headers
  double body_timeout_s = 60;               // from the end of the headers to the end of the body
  double idle_timeout_s = 60;               // a connection with no request pending
  double write_timeout_s = 30;              // to write one response
  double drain_s = 10;                      // stop(): time for requests in progress
};

class Transport {
 public:
  Transport(Options o, Handler handler, Refuse refuse);
  ~Transport();
  int bind();   // binds host:port and listens; returns the port; throws on failure
  void run();   // serves until stop() and the drain are over; blocks
  void stop();  // from any thread
  size_t open_connections() const;

  struct Impl;  // http_transport.cpp

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace clefrt::server::http

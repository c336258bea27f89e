// The HTTP/1.1 transport (http.h) over Boost.Asio, with Boost.Beast's message parser: every
// connection is a small state machine on its own strand, so a slow or idle client holds a
// socket and a few hundred bytes, never a thread.
//
//   Idle -> Header -> Body -> (Decoding) -> InFlight -> Writing -> Idle ... -> Closing
//
// One deadline timer per connection covers the phase it is in (idle, header, body, write);
// while a request is in flight the socket is watched for the client hanging up, and bytes of
// pipelined requests read meanwhile stay in the buffer for the next round.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "common/json.h"
#include "common/log_event.h"
#include "server/content_coding.h"
#include "server/http.h"

namespace clefrt::server::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.name, name)) return &h.value;
  return nullptr;
}

class Connection;

struct Transport::Impl : std::enable_shared_from_this<Transport::Impl> {
  Options o;
  Handler handler;
  Refuse refuse;
  asio::io_context ioc;
  // the acceptor and the server-wide timers live on one strand: accept, stop and the last
  // connection's close may come from different I/O threads
  asio::strand<asio::io_context::executor_type> control{asio::make_strand(ioc)};
  tcp::acceptor acceptor{control};
  asio::steady_timer accept_retry{control}, drain_timer{control};
  asio::thread_pool decode_pool{1};  // inflating a body is CPU work: off the event loop
  std::atomic<size_t> open{0};        // connections served (the limit's count)
  std::atomic<size_t> rejecting{0};   // connections over the limit being answered 503
  std::atomic<size_t> body_bytes{0};  // bodies being read or decoded: Connection::reserve
  std::atomic<bool> stopping{false};
  std::mutex reg_mu;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> registry;
  uint64_t next_id = 0;
  std::chrono::steady_clock::time_point last_accept_error_log{};

  void accept();
  void begin_drain();
  void for_each_connection(void (Connection::*fn)());
  void connection_closed(bool over_limit);
};

class ExchangeImpl;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // over_limit: accepted past max_connections, only to be answered 503 and closed
  Connection(std::shared_ptr<Transport::Impl> srv, tcp::socket sock, bool over_limit)
      : srv_(std::move(srv)), sock_(std::move(sock)), timer_(sock_.get_executor()), over_limit_(over_limit) {
    error_code ec;
    const auto ep = sock_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);  // a response is one write; never wait for an ACK to send it
    // Beast bounds the header and the chunk sizes, not a chunk's extensions or the trailers:
    // the buffer's own cap bounds those (and the read-ahead of pipelined bytes)
    buf_.max_size(srv_->o.max_header_bytes + (64 << 10));
  }
  ~Connection() {
    release();
    {
      std::lock_guard<std::mutex> l(srv_->reg_mu);
      srv_->registry.erase(id_);
    }
    srv_->connection_closed(over_limit_);
  }

  void start(uint64_t id) {
    id_ = id;
    if (over_limit_)
      return refuse(503, "too_many_connections", "the server holds its limit of " + std::to_string(srv_->o.max_connections) + " connections");
    wait_idle();
  }
  // stop(): a connection without a request in progress closes now; one with a request answers it
  // and then closes.
  void drain() {
    draining_ = true;
    if (phase_ == Phase::Idle || phase_ == Phase::Header) close();
  }
  void force_close() { close(); }
  auto executor() { return sock_.get_executor(); }
  void send(Response r);
  void abort_exchange();

 private:
  enum class Phase { Idle, Header, Body, Decoding, InFlight, Writing, Closing };

  void arm(double s) {
    const uint64_t g = ++gen_;
    timed_out_ = false;
    timer_.expires_after(seconds(s));
    timer_.async_wait([self = shared_from_this(), g](error_code ec) {
      if (ec || g != self->gen_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->sock_.cancel(ignored);
    });
  }
  void disarm() {
    ++gen_;
    timer_.cancel();
  }

  void reserve(size_t bytes) {
    release();
    reserved_ = bytes;
    srv_->body_bytes += bytes;
  }
  void release() {
    srv_->body_bytes -= reserved_;
    reserved_ = 0;
  }

  void wait_idle();
  void read_header();
  void on_header(error_code ec);
  void read_body();
  void on_body(error_code ec);
  void dispatch(Request req);
  void watch();
  void after_response();
  void refuse(int status, std::string type, std::string message);
  void write(std::shared_ptr<bhttp::response<bhttp::string_body>> res, bool keep);
  void linger();
  void close();

  std::shared_ptr<Transport::Impl> srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::Idle;
  uint64_t id_ = 0, gen_ = 0;
  bool timed_out_ = false, draining_ = false, watching_ = false, next_after_watch_ = false, keep_alive_ = true, head_method_ = false;
  unsigned version_ = 11;
  size_t reserved_ = 0;    // of the server's body budget
  bool peer_eof_ = false;  // the client shut down its side while its response was being written
  std::string remote_;
  Request head_;  // what is known of the current request (for refusals and the handler)
  std::shared_ptr<ExchangeImpl> ex_;
  bool over_limit_ = false;
};

class ExchangeImpl : public Exchange {
 public:
  explicit ExchangeImpl(std::weak_ptr<Connection> c) : conn_(std::move(c)) {}
  void respond(Response r) override {
    if (ended_.exchange(true)) return;
    auto c = conn_.lock();
    if (!c) return;
    asio::post(c->executor(), [c, r = std::move(r)]() mutable { c->send(std::move(r)); });
  }
  void on_abort(std::function<void()> fn) override {
    std::unique_lock<std::mutex> l(mu_);
    if (aborted_) {
      l.unlock();
      fn();
      return;
    }
    abort_fn_ = std::move(fn);
  }
  // The connection ended first: the answer has nowhere to go.
  void abort() {
    if (ended_.exchange(true)) return;
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> l(mu_);
      aborted_ = true;
      fn = std::move(abort_fn_);
    }
    if (fn) fn();
  }

 private:
  std::weak_ptr<Connection> conn_;
  std::atomic<bool> ended_{false};
  std::mutex mu_;
  bool aborted_ = false;
  std::function<void()> abort_fn_;
};

void Connection::wait_idle() {
  phase_ = Phase::Idle;
  head_method_ = false;
  head_ = Request{};
  head_.remote = remote_;
  if (draining_) return close();
  if (buf_.size() > 0) return read_header();  // a pipelined request is already here
  buf_.shrink_to_fit();                        // an idle connection keeps no buffer
  arm(srv_->o.idle_timeout_s);
  sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->phase_ == Phase::Closing) return;
    self->disarm();
    if (ec || self->timed_out_) return self->close();  // idle too long: closed without a word
    self->read_header();
  });
}

void Connection::read_header() {
  phase_ = Phase::Header;
  parser_.emplace();
  parser_->header_limit(std::uint32_t(std::min<size_t>(srv_->o.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(std::uint64_t(srv_->o.max_body_bytes));
  arm(srv_->o.header_timeout_s);
  bhttp::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(error_code ec) {
  if (phase_ == Phase::Closing) return;
  disarm();
  if (timed_out_) return refuse(408, "request_timeout", "the request headers did not arrive within " + secs(srv_->o.header_timeout_s) + " s");
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == asio::error::eof ||
      ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
    return close();  // the client left
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
    return refuse(431, "headers_too_large", "the request line and headers are larger than the " + std::to_string(srv_->o.max_header_bytes >> 10) +
                                               " KiB limit");
  // method and target are known from here on, even when the rest was refused
  auto& msg = parser_->get();
  head_.method = std::string(msg.method_string());
  head_.target = std::string(msg.target());
  head_.path = head_.target.substr(0, head_.target.find('?'));
  if (head_.path.compare(0, 7, "http://") == 0 || head_.path.compare(0, 8, "https://") == 0) {  // absolute-form
    const size_t slash = head_.path.find('/', head_.path.find("//") + 2);
    head_.path = slash == std::string::npos ? "/" : head_.path.substr(slash);
  }
  head_method_ = msg.method() == bhttp::verb::head;
  if (ec == bhttp::error::body_limit)
    return refuse(413, "request_too_large", "the declared body (Content-Length) is larger than the " + mib(srv_->o.max_body_bytes) + " limit");
  if (ec == bhttp::error::bad_version) return refuse(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
  if (ec) return refuse(400, "invalid_request", "malformed HTTP request: " + ec.message());
  version_ = msg.version();
  if (version_ != 10 && version_ != 11) return refuse(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
  for (const auto& f : msg) head_.headers.push_back({std::string(f.name_string()), std::string(f.value())});
  keep_alive_ = msg.keep_alive();
  if (const std::string* te = head_.header("Transfer-Encoding"); te && !iequals(*te, "chunked"))
    return refuse(501, "not_implemented", "Transfer-Encoding '" + *te + "' is not supported (chunked only)");
  const std::string* ce = head_.header("Content-Encoding");
  if (std::string why; ce && !codings_supported(*ce, &why)) return refuse(415, "unsupported_media_type", why);
  // Bodies being read and decoded count against one budget for the whole server: 16,384
  // connections times 13 MiB would be hundreds of GiB. A body of unknown length counts in full.
  const uint64_t declared = parser_->content_length() ? *parser_->content_length() : uint64_t(srv_->o.max_body_bytes);
  reserve(size_t(std::min<uint64_t>(declared, srv_->o.max_body_bytes)) + (ce ? srv_->o.max_body_bytes : 0));
  if (reserved_ > 0 && srv_->body_bytes.load() > srv_->o.max_bodies_bytes)
    return refuse(503, "server_busy", "the server is receiving too many request bodies at once; retry shortly");
  if (parser_->is_done()) return dispatch(std::move(head_));
  const std::string* expect = head_.header("Expect");
  if (expect && version_ == 11 && iequals(*expect, "100-continue")) {  // HTTP/1.0 clients do not wait for it
    // curl waits for this before sending a large body
    auto line = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    arm(srv_->o.write_timeout_s);
    asio::async_write(sock_, asio::buffer(*line), [self = shared_from_this(), line](error_code ec, size_t) {
      if (self->phase_ == Phase::Closing) return;
      self->disarm();
      if (ec) return self->close();
      self->read_body();
    });
    return;
  }
  read_body();
}

void Connection::read_body() {
  phase_ = Phase::Body;
  // A client that sends the headers and the body in two writes without TCP_NODELAY (cpp-httplib's
  // default) holds the body back until the headers are ACKed, and Linux delays that ACK by up to
  // 40 ms once a kept connection has left its quick-ACK start: ACK now, the rest is wanted.
  int one = 1;
  (void)::setsockopt(sock_.native_handle(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
  arm(srv_->o.body_timeout_s);
  bhttp::async_read(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
}

void Connection::on_body(error_code ec) {
  if (phase_ == Phase::Closing) return;
  disarm();
  if (timed_out_) return refuse(408, "request_timeout", "the request body did not arrive within " + secs(srv_->o.body_timeout_s) + " s");
  if (ec == bhttp::error::body_limit)
    return refuse(413, "request_too_large", "the body is larger than the " + mib(srv_->o.max_body_bytes) + " limit");
  if (ec == bhttp::error::buffer_overflow)
    return refuse(413, "request_too_large", "a chunk extension or the trailers are longer than " +
                                                std::to_string(buf_.max_size() >> 10) + " KiB");
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == asio::error::eof ||
      ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
    return close();
  if (ec) return refuse(400, "invalid_request", "malformed HTTP request body: " + ec.message());
  head_.body = std::move(parser_->get().body());
  parser_.reset();
  const std::string* ce = head_.header("Content-Encoding");
  if (!ce) return dispatch(std::move(head_));
  phase_ = Phase::Decoding;
  asio::post(srv_->decode_pool, [self = shared_from_this(), req = std::move(head_), enc = *ce]() mutable {
    Decoded d = decode_content(std::move(req.body), enc, self->srv_->o.max_body_bytes);
    asio::post(self->executor(), [self, req = std::move(req), d = std::move(d)]() mutable {
      if (self->phase_ == Phase::Closing) return;
      self->head_ = std::move(req);
      if (d.result == Decoded::Result::TooLarge) return self->refuse(413, "request_too_large", d.message);
      if (d.result == Decoded::Result::Unsupported) return self->refuse(415, "unsupported_media_type", d.message);
      if (d.result == Decoded::Result::Corrupt) return self->refuse(400, "invalid_request", d.message);
      self->head_.body = std::move(d.body);
      self->dispatch(std::move(self->head_));
    });
  });
}

void Connection::dispatch(Request req) {
  phase_ = Phase::InFlight;
  parser_.reset();
  release();  // the body now belongs to the handler, whose own queue bounds what it holds
  ex_ = std::make_shared<ExchangeImpl>(weak_from_this());
  watch();
  auto ex = ex_;
  try {
    srv_->handler(std::move(req), ex);
  } catch (const std::exception& e) {
    Response r;
    r.status = 500;
    r.body = std::string("{\"error\":{\"type\":\"internal_error\",\"message\":\"handler failed\"}}");
    ex->respond(std::move(r));
  }
}

// While a request is in flight: a readable socket means either the next pipelined request
// (kept in the buffer, up to the header limit) or the client hanging up (its exchange aborts).
void Connection::watch() {
  if (buf_.size() >= srv_->o.max_header_bytes) return;  // enough read ahead; the rest waits in the kernel
  watching_ = true;
  sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    self->watching_ = false;
    if (self->next_after_watch_) {
      self->next_after_watch_ = false;
      return self->after_response();
    }
    if (self->phase_ == Phase::Closing) return;
    if (ec) return;  // cancelled
    char probe;
    const ssize_t n = ::recv(self->sock_.native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 && self->phase_ == Phase::Writing) {  // the answer is on its way: let it finish, then close
      self->peer_eof_ = true;
      return;
    }
    // EOF while the request is being computed counts as the client leaving (its work is
    // cancelled, logged 499): a client that shuts down its sending side and still waits for the
    // answer cannot be told from one that has gone, and most that do this have gone
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      self->abort_exchange();
      return self->close();
    }
    if (n > 0) {
      error_code rec;
      const size_t room = self->srv_->o.max_header_bytes - self->buf_.size();
      const size_t got = self->sock_.read_some(self->buf_.prepare(std::min<size_t>(room, 16 << 10)), rec);
      if (rec) {
        self->abort_exchange();
        return self->close();
      }
      self->buf_.commit(got);
    }
    if (self->phase_ == Phase::InFlight || self->phase_ == Phase::Writing) self->watch();
  });
}

void Connection::abort_exchange() {
  if (ex_) {
    auto ex = std::move(ex_);
    ex->abort();
  }
}

void Connection::send(Response r) {
  if (phase_ != Phase::InFlight) return;
  ex_.reset();
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(bhttp::status(unsigned(r.status)), version_);
  if (!r.content_type.empty()) res->set(bhttp::field::content_type, r.content_type);
  for (const auto& h : r.headers) res->set(h.name, h.value);
  res->body() = std::move(r.body);
  const bool keep = keep_alive_ && !draining_ && !srv_->stopping.load();
  write(std::move(res), keep);
}

void Connection::write(std::shared_ptr<bhttp::response<bhttp::string_body>> res, bool keep) {
  res->keep_alive(keep);
  res->prepare_payload();
  if (head_method_) res->body().clear();  // HEAD: the headers of the GET answer, Content-Length included
  phase_ = Phase::Writing;
  arm(srv_->o.write_timeout_s);
  bhttp::async_write(sock_, *res, [self = shared_from_this(), res, keep](error_code ec, size_t) {
    if (self->phase_ == Phase::Closing) return;
    self->disarm();
    if (ec || self->timed_out_) return self->close();
    if (!keep || self->peer_eof_) return self->linger();
    if (self->watching_) {  // the watch holds the socket's read side: let it end first
      self->next_after_watch_ = true;
      error_code ignored;
      self->sock_.cancel(ignored);
      return;
    }
    self->after_response();
  });
}

void Connection::after_response() {
  if (phase_ == Phase::Closing) return;
  wait_idle();
}

void Connection::refuse(int status, std::string type, std::string message) {
  release();  // the body will not be read: its share of the budget is free now, not after the linger
  Response r = srv_->refuse(head_, Refusal{status, std::move(type), std::move(message)});
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(bhttp::status(unsigned(r.status)), version_ == 10 ? 10 : 11);
  if (!r.content_type.empty()) res->set(bhttp::field::content_type, r.content_type);
  for (const auto& h : r.headers) res->set(h.name, h.value);
  res->body() = std::move(r.body);
  parser_.reset();
  write(std::move(res), false);
}

// After a response that closes the connection: stop sending, then read and discard what the
// client still sends for a moment, so that closing does not reset the connection under the
// response before the client has read it.
void Connection::linger() {
  error_code ec;
  sock_.shutdown(tcp::socket::shutdown_send, ec);
  phase_ = Phase::Closing;
  auto sink = std::make_shared<std::array<char, 16384>>();
  auto total = std::make_shared<size_t>(0);
  const uint64_t g = ++gen_;
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([self = shared_from_this(), g](error_code e) {
    if (!e && g == self->gen_) {
      error_code ignored;
      self->sock_.close(ignored);
    }
  });
  auto step = std::make_shared<std::function<void(error_code, size_t)>>();
  *step = [self = shared_from_this(), sink, total, step](error_code e, size_t n) {
    *total += n;
    if (e || *total > (1u << 20) || !self->sock_.is_open()) {
      self->timer_.cancel();
      error_code ignored;
      self->sock_.close(ignored);
      *step = nullptr;  // breaks the cycle
      return;
    }
    self->sock_.async_read_some(asio::buffer(*sink), *step);
  };
  sock_.async_read_some(asio::buffer(*sink), *step);
}

void Connection::close() {
  if (phase_ == Phase::Closing && !sock_.is_open()) return;
  phase_ = Phase::Closing;
  abort_exchange();
  release();
  ++gen_;
  timer_.cancel();
  error_code ec;
  sock_.shutdown(tcp::socket::shutdown_both, ec);
  sock_.close(ec);
}

void Transport::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](error_code ec, tcp::socket sock) {
    if (self->stopping || ec == asio::error::operation_aborted) return;
    if (ec) {
      // out of descriptors or memory: wait a moment rather than spin (connections wait in the backlog)
      const auto now = std::chrono::steady_clock::now();
      if (now - self->last_accept_error_log > std::chrono::seconds(1)) {
        log_event("\"event\":\"accept_failed\",\"message\":" + json::write(json::Value::string(ec.message())));
        self->last_accept_error_log = now;
      }
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](error_code e) {
        if (!e && !self->stopping) self->accept();
      });
      return;
    }
    const bool over = self->open.load() >= self->o.max_connections;
    if (over && self->rejecting.load() >= self->o.max_connections / 8 + 64) {
      error_code e2;  // past what even refusing politely may cost: closed unanswered
      sock.close(e2);
    } else {
      ++(over ? self->rejecting : self->open);
      auto c = std::make_shared<Connection>(self, std::move(sock), over);
      uint64_t id;
      {
        std::lock_guard<std::mutex> l(self->reg_mu);
        id = ++self->next_id;
        self->registry.emplace(id, c);
      }
      asio::post(c->executor(), [c, id] { c->start(id); });
    }
    self->accept();
  });
}

void Transport::Impl::for_each_connection(void (Connection::*fn)()) {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> l(reg_mu);
    for (auto& [id, w] : registry)
      if (auto c = w.lock()) all.push_back(std::move(c));
  }
  for (auto& c : all) asio::post(c->executor(), [c, fn] { ((*c).*fn)(); });
}

void Transport::Impl::begin_drain() {
  if (stopping.exchange(true)) return;
  error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  for_each_connection(&Connection::drain);
  if (open.load() == 0) return;
  drain_timer.expires_after(seconds(o.drain_s));
  drain_timer.async_wait([self = shared_from_this()](error_code e) {
    if (!e) self->for_each_connection(&Connection::force_close);
  });
}

void Transport::Impl::connection_closed(bool over_limit) {
  if (over_limit) {
    --rejecting;
    return;
  }
  if (--open == 0 && stopping.load()) asio::post(control, [self = shared_from_this()] { self->drain_timer.cancel(); });
}

Transport::Transport(Options o, Handler handler, Refuse refuse) : impl_(std::make_shared<Impl>()) {
  impl_->o = std::move(o);
  impl_->handler = std::move(handler);
  impl_->refuse = std::move(refuse);
}

Transport::~Transport() {
  impl_->decode_pool.join();
  impl_->ioc.stop();  // run() has returned (or never ran): drop what is still queued
}

int Transport::bind() {
  auto& a = impl_->acceptor;
  error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto results = resolver.resolve(impl_->o.host, std::to_string(impl_->o.port), tcp::resolver::passive, ec);
  if (ec || results.empty())
    throw std::runtime_error("cannot resolve " + impl_->o.host + ": " + (ec ? ec.message() : std::string("no address")));
  const tcp::endpoint ep = results.begin()->endpoint();
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + impl_->o.host + ":" + std::to_string(impl_->o.port) + ": " + ec.message());
  return int(a.local_endpoint().port());
}

void Transport::run() {
  asio::post(impl_->control, [w = std::weak_ptr<Impl>(impl_)] {
    if (auto impl = w.lock()) impl->accept();
  });
  std::vector<std::thread> extra;
  for (int i = 1; i < std::max(1, impl_->o.io_threads); ++i) extra.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : extra) t.join();
}

// The posted work holds the transport weakly: after run() has returned nothing runs it, and a
// strong hold would keep the io_context (which owns it) alive for ever.
void Transport::stop() {
  asio::post(impl_->control, [w = std::weak_ptr<Impl>(impl_)] {
    if (auto impl = w.lock()) impl->begin_drain();
  });
}

size_t Transport::open_connections() const { return impl_->open.load(); }

}  // namespace clefrt::server::http

// The HTTP layer of `clefrt serve` under hostile and unusual clients (raw sockets): body limits
// after decoding, deadlines, header limits, pipelining, Expect: 100-continue, HEAD, methods,
// refusals counted, a bounded drain; and the Content-Encoding decoder on its own.
#include <gtest/gtest.h>

#include <cctype>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "server/content_coding.h"
#include "test_server_util.h"

namespace clefrt::server {
namespace {

using namespace test_server;
using Clock = std::chrono::steady_clock;

std::string zlib_compress(const std::string& in, int window_bits) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, window_bits, 9, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, uLong(in.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
std::string gzip(const std::string& in) { return zlib_compress(in, 16 + MAX_WBITS); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ContentCoding, DecodesGzipDeflateAndListsWithinTheLimit) {
  const std::string text = "{\"state\":\"" + std::string(100000, 'a') + "\"}";
  auto ok = [&](const Decoded& d) {
    EXPECT_EQ(d.result, Decoded::Result::Ok) << d.message;
    EXPECT_EQ(d.body, text);
  };
  ok(decode_content(text, "", 1 << 20));
  ok(decode_content(text, "identity", 1 << 20));
  ok(decode_content(gzip(text), "gzip", 1 << 20));
  ok(decode_content(gzip(text), " X-GZip ", 1 << 20));
  ok(decode_content(zlib_compress(text, MAX_WBITS), "deflate", 1 << 20));   // RFC 9110's deflate: zlib
  ok(decode_content(zlib_compress(text, -MAX_WBITS), "deflate", 1 << 20));  // raw deflate, as some clients send
  ok(decode_content(gzip(zlib_compress(text, MAX_WBITS)), "deflate, gzip", 1 << 20));  // undone last first
  // two gzip members, as `cat a.gz b.gz` makes
  const std::string half = text.substr(0, 5000), rest = text.substr(5000);
  ok(decode_content(gzip(half) + gzip(rest), "gzip", 1 << 20));
}

TEST(ContentCoding, RefusesBombsCorruptAndUnknownCodings) {
  const std::string bomb = gzip(std::string(64 << 20, 'a'));
  ASSERT_LT(bomb.size(), 100000u);
  Decoded d = decode_content(bomb, "gzip", 13 << 20);
  EXPECT_EQ(d.result, Decoded::Result::TooLarge);
  EXPECT_TRUE(d.body.empty());
  EXPECT_NE(d.message.find("13 MiB"), std::string::npos) << d.message;
  // an intermediate stage over the limit counts too
  EXPECT_EQ(decode_content(gzip(gzip(std::string(2 << 20, 'a'))), "gzip, gzip", 1 << 20).result, Decoded::Result::TooLarge);
  EXPECT_EQ(decode_content(std::string(2 << 20, 'a'), "", 1 << 20).result, Decoded::Result::TooLarge);
  const std::string g = gzip("{\"a\":1}");
  EXPECT_EQ(decode_content(g.substr(0, g.size() - 6), "gzip", 1 << 20).result, Decoded::Result::Corrupt);  // truncated
  EXPECT_EQ(decode_content("\x1f\x8bnot gzip", "gzip", 1 << 20).result, Decoded::Result::Corrupt);
  EXPECT_EQ(decode_content("", "gzip", 1 << 20).result, Decoded::Result::Corrupt);
  EXPECT_EQ(decode_content(g + "trailing", "deflate", 1 << 20).result, Decoded::Result::Corrupt);
  // more than kMaxCodings layers: each is a full pass, a long list is a CPU bomb
  std::string why;
  EXPECT_TRUE(codings_supported("gzip, deflate", &why));
  EXPECT_FALSE(codings_supported("gzip, gzip, gzip", &why));
  EXPECT_NE(why.find("3 codings"), std::string::npos) << why;
  EXPECT_FALSE(codings_supported("br, gzip", &why));  // by name, whatever comes first
  EXPECT_NE(why.find("'br'"), std::string::npos) << why;
  EXPECT_EQ(decode_content(gzip(gzip(gzip("{}"))), "gzip,gzip,gzip", 1 << 20).result, Decoded::Result::Unsupported);
  Decoded br = decode_content(g, "br", 1 << 20);
  EXPECT_EQ(br.result, Decoded::Result::Unsupported);
  EXPECT_NE(br.message.find("'br'"), std::string::npos);
}

TEST(Http, BodyLimitHoldsAfterChunkedAndGzipDecoding) {
  ServerOptions so;
  so.max_body_bytes = 1 << 20;  // 1 MiB keeps the test quick; the mechanism is the 13 MiB one's
  Running r{so};
  // a gzip body within the limit is answered; one inflating past it is refused unread
  {
    Raw c(r.port);
    ASSERT_TRUE(c.send(post("/v1/systemone", gzip(kBlog), "Content-Encoding: gzip\r\n")));
    auto got = c.read_responses(1, 30);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].first, 200) << got[0].second;
  }
  {
    const std::string bomb = gzip("{\"state\":\"" + std::string(8 << 20, 'a') + "\",\"questions\":{\"q\":{\"type\":\"noul\"}}}");
    Raw c(r.port);
    c.send(post("/v1/systemone", bomb, "Content-Encoding: gzip\r\n"));
    const std::string out = c.read_all(10);
    EXPECT_EQ(Raw::status_of(out), 413) << out.substr(0, 300);
    EXPECT_NE(out.find("inflates"), std::string::npos);
    EXPECT_NE(out.find("Connection: close"), std::string::npos);
  }
  // chunked: refused as the chunks cross the limit
  {
    Raw c(r.port);
    c.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "40000\r\n" + std::string(0x40000, ' ') + "\r\n";  // 256 KiB each
    int sent = 0;
    while (sent < 16 && c.send(chunk)) ++sent;
    c.send("0\r\n\r\n");
    const std::string out = c.read_all(10);
    EXPECT_EQ(Raw::status_of(out), 413) << out.substr(0, 300);
  }
  // a chunked body within the limit is read whole
  {
    Raw c(r.port);
    std::string req = "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (size_t off = 0; off < kBlog.size(); off += 50) {
      const std::string part = kBlog.substr(off, 50);
      char len[16];
      std::snprintf(len, sizeof len, "%zx\r\n", part.size());
      req += len + part + "\r\n";
    }
    req += "0\r\n\r\n";
    ASSERT_TRUE(c.send(req));
    auto got = c.read_responses(1, 30);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].first, 200) << got[0].second;
  }
  // a declared length over the limit: refused as soon as the headers end, nothing waited for
  {
    Raw c(r.port);
    const auto t0 = Clock::now();
    c.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000000\r\n\r\n");
    const std::string out = c.read_all(10);
    EXPECT_EQ(Raw::status_of(out), 413);
    EXPECT_LT(seconds_since(t0), 2.0);
  }
  // other codings and multipart are refused with the protocol's JSON error
  for (const auto& [headers, status] : std::vector<std::pair<std::string, int>>{
           {"Content-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", 415}, {"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 501}}) {
    Raw c(r.port);
    c.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\n" + headers);
    const std::string out = c.read_all(5);
    EXPECT_EQ(Raw::status_of(out), status) << headers << out.substr(0, 300);
    EXPECT_NE(out.find("{\"error\":{"), std::string::npos) << out;
  }
  auto mp = r.client().Post("/v1/systemone", "--b\r\n\r\n{}\r\n--b--\r\n", "multipart/form-data; boundary=b");
  ASSERT_TRUE(mp);
  EXPECT_EQ(mp->status, 415);
  // what `curl -d` sends: the form content type over a JSON body
  auto form = r.client().Post("/v1/systemone", kBlog, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200);
}

// What Beast's parser does not bound by itself, and what many connections could add up to.
TEST(Http, ChunkExtensionsTrailersConnectionsAndBodyBudgetAreBounded) {
  ServerOptions so;
  so.max_body_bytes = 1 << 20;
  so.http.max_bodies_bytes = 1 << 20;  // one body of unknown length fills it
  so.http.max_connections = 8;
  Running r{so};
  for (const std::string& flood : {std::string("5;ext=") + std::string(4 << 20, 'b'),                      // a chunk extension
                                   std::string("1\r\na\r\n0\r\nX-T: ") + std::string(4 << 20, 'c')}) {  // a trailer
    Raw c(r.port);
    c.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    const auto t0 = Clock::now();
    c.send(flood);  // the server refuses and closes long before the end
    const std::string out = c.read_all(5);
    EXPECT_EQ(Raw::status_of(out), 413) << out.substr(0, 200);
    EXPECT_LT(seconds_since(t0), 5.0);
  }
  {  // a chunked body in progress holds the whole budget: the next body is 503, then it frees
    Raw first(r.port);
    first.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Raw second(r.port);
    second.send(post("/v1/systemone", kBlog));
    const std::string out = second.read_all(5);
    EXPECT_EQ(Raw::status_of(out), 503) << out.substr(0, 300);
    EXPECT_NE(out.find("Retry-After"), std::string::npos);
    first.close();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(r.client().Post("/v1/systemone", kBlog, "application/json")->status, 200);
  {  // past max_connections: a 503 the client can read, not a reset
    // first let the connections above finish their lingering close (up to 2 s): asked on one
    // kept-alive connection, which then stays as the first of the eight
    std::vector<std::unique_ptr<Raw>> held;
    held.push_back(std::make_unique<Raw>(r.port));
    bool alone = false;
    for (int i = 0; i < 100 && !alone; ++i) {
      held[0]->send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
      auto got = held[0]->read_responses(1, 5);
      const size_t at = got.empty() ? std::string::npos : got[0].second.find("\"open_connections\":1");
      alone = at != std::string::npos && !std::isdigit(static_cast<unsigned char>(got[0].second[at + 20]));
      if (!alone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(alone) << "the earlier connections did not close";
    for (int i = 1; i < 8; ++i) held.push_back(std::make_unique<Raw>(r.port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Raw extra(r.port);
    extra.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    const std::string out = extra.read_all(3);
    EXPECT_EQ(Raw::status_of(out), 503) << out.substr(0, 300);
    EXPECT_NE(out.find("too_many_connections"), std::string::npos);
  }
}

TEST(Http, PipelinedRequestsAreAnsweredInOrder) {
  Running r{ServerOptions{}};
  std::vector<std::string> bodies, alone;
  std::string all;
  for (int i = 0; i < 4; ++i) {
    bodies.push_back("{\"state\":\"ticket " + std::to_string(i) + "\",\"questions\":{\"q\":{\"type\":\"noul\"}}}");
    alone.push_back(r.client().Post("/v1/systemone", bodies.back(), "application/json")->body);
    all += post("/v1/systemone", bodies.back());
  }
  all += "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
  Raw c(r.port);
  ASSERT_TRUE(c.send(all));  // one write
  auto got = c.read_responses(5, 30);
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[size_t(i)].first, 200);
    EXPECT_EQ(got[size_t(i)].second, alone[size_t(i)]) << "response " << i << " out of order or changed";
  }
  EXPECT_NE(got[4].second.find("\"status\":\"ok\""), std::string::npos);
}

TEST(Http, SlowAndIdleClientsDoNotLockOthersOut) {
  ServerOptions so;
  so.http.header_timeout_s = 0.5;
  so.http.io_threads = 1;
  Running r{so};
  // more idle connections than the old server had threads, and clients dripping headers
  std::vector<std::unique_ptr<Raw>> idle, slow;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<Raw>(r.port));
  for (int i = 0; i < 20; ++i) {
    slow.push_back(std::make_unique<Raw>(r.port));
    slow.back()->send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\n");
  }
  auto c = r.client();
  for (int i = 0; i < 5; ++i) {
    auto res = c.Post("/v1/systemone", kBlog, "application/json");
    ASSERT_TRUE(res) << "a normal client was locked out";
    EXPECT_EQ(res->status, 200);
  }
  // the header deadline counts from the first byte: dripping does not extend it
  const auto t0 = Clock::now();
  for (int k = 0; k < 3; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (auto& s : slow) s->send("X-Drip: 1\r\n");
  }
  int timed_out = 0;
  for (auto& s : slow) timed_out += Raw::status_of(s->read_all(2)) == 408;
  EXPECT_EQ(timed_out, 20);
  EXPECT_LT(seconds_since(t0), 3.0);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_NE(met->body.find("clefrt_errors_total{type=\"request_timeout\"} 20"), std::string::npos) << met->body;
  EXPECT_NE(met->body.find("clefrt_open_connections "), std::string::npos);
}

TEST(Http, HeaderLimitsMethodsHeadAndContinue) {
  Running r{ServerOptions{}};
  {
    Raw c(r.port);
    std::string many = "GET /health HTTP/1.1\r\nHost: t\r\n";
    for (int i = 0; i < 20000; ++i) many += "X-" + std::to_string(i) + ": y\r\n";
    c.send(many + "\r\n");
    EXPECT_EQ(Raw::status_of(c.read_all(5)), 431);
  }
  {
    Raw c(r.port);
    c.send("GARBAGE\r\n\r\n");
    const std::string out = c.read_all(5);
    EXPECT_EQ(Raw::status_of(out), 400);
    EXPECT_NE(out.find("{\"error\":{"), std::string::npos);
  }
  {
    Raw c(r.port);
    c.send("GET /health HTTP/2.0\r\nHost: t\r\n\r\n");
    EXPECT_EQ(Raw::status_of(c.read_all(5)), 505);
  }
  auto c = r.client();
  auto get = c.Get("/v1/systemone");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  EXPECT_EQ(c.Post("/health", "", "text/plain")->status, 405);
  EXPECT_EQ(c.Get("/nope")->status, 404);
  {  // HEAD: the GET answer's headers, no body, and the connection goes on
    Raw h(r.port);
    h.send("HEAD /health HTTP/1.1\r\nHost: t\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    const std::string out = h.read_all(1.5);
    const size_t first_end = out.find("\r\n\r\n");
    ASSERT_NE(first_end, std::string::npos);
    EXPECT_EQ(Raw::status_of(out), 200);
    EXPECT_EQ(out.compare(first_end + 4, 9, "HTTP/1.1 "), 0) << "HEAD sent a body: " << out;
  }
  {  // Expect: 100-continue, as curl sends it before a large body
    Raw e(r.port);
    e.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " + std::to_string(kBlog.size()) + "\r\n\r\n");
    const std::string cont = e.read_all(0.5);
    EXPECT_EQ(cont, "HTTP/1.1 100 Continue\r\n\r\n");
    e.send(kBlog);
    auto got = e.read_responses(1, 30);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].first, 200);
  }
  auto met = c.Get("/metrics");
  for (const char* k : {"status=\"431\"} 1", "clefrt_requests_total{endpoint=\"other\",status=\"400\"} 1",
                        "clefrt_requests_total{endpoint=\"/v1/systemone\",status=\"405\"} 1", "clefrt_requests_total{endpoint=\"other\",status=\"404\"} 1",
                        "clefrt_errors_total{type=\"headers_too_large\"} 1"})
    EXPECT_NE(met->body.find(k), std::string::npos) << k << "\n" << met->body;
}

TEST(Http, StopClosesIdleConnectionsAtOnceAndBoundsTheDrain) {
  ServerOptions so;
  so.http.drain_s = 1.0;
  auto r = std::make_unique<Running>(so);
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 50; ++i) idle.push_back(std::make_unique<Raw>(r->port));
  Raw slow(r->port);
  slow.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\n");
  // a request whose body never finishes holds the drain only until drain_s
  Raw stuck(r->port);
  stuck.send("POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  r.reset();  // stop() + join run()
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_EQ(idle[0]->read_all(0.5), "") << "an idle connection should be closed without a response";
}

// A client that writes the headers and then the body, Nagle on (cpp-httplib's default): on a kept
// connection the body waits for the headers' ACK, which Linux delays by up to 40 ms once the
// connection has left its quick-ACK start. The server ACKs at once when it needs the body.
TEST(Http, HeadersThenBodyOnAKeptConnectionDoNotWaitForADelayedAck) {
  Running r{ServerOptions{}};
  Raw c(r.port);
  ASSERT_TRUE(c.ok());
  const std::string req = post("/v1/systemone", kBlog);
  const size_t split = req.find("\r\n\r\n") + 4;
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    const auto t0 = Clock::now();
    ASSERT_TRUE(c.send(req.substr(0, split)));
    ASSERT_TRUE(c.send(req.substr(split)));
    auto got = c.read_responses(1, 10);
    ASSERT_EQ(got.size(), 1u) << "request " << i;
    ASSERT_EQ(got[0].first, 200) << got[0].second;
    ms.push_back(seconds_since(t0) * 1e3);
  }
  std::sort(ms.begin() + 2, ms.end());  // the first requests ride the connection's quick-ACK start
  EXPECT_LT(ms[2 + (ms.size() - 2) / 2], 25.0) << "the median request on a kept connection took " << ms[2 + (ms.size() - 2) / 2]
                                               << " ms: the body waited for a delayed ACK of the headers";
}

TEST(Http, AuthorizationSchemeIsCaseInsensitive) {
  ServerOptions so;
  so.api_key = "s3cret";
  Running r{so};
  auto c = r.client();
  for (const char* h : {"Bearer s3cret", "bearer s3cret", "BEARER  s3cret"}) {
    auto res = c.Post("/v1/systemone", httplib::Headers{{"Authorization", h}}, kBlog, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << h;
  }
  for (const char* h : {"Bearer s3cre", "Basic s3cret", "Bearers3cret", "s3cret"})
    EXPECT_EQ(c.Post("/v1/systemone", httplib::Headers{{"Authorization", h}}, kBlog, "application/json")->status, 401) << h;
}

}  // namespace
}  // namespace clefrt::server

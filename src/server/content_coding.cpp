#include "server/content_coding.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <vector>

namespace clefrt::server {

namespace {

std::string lower_trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// gzip: one or more members (RFC 1952 allows several, as gunzip reads them); deflate: the zlib
// format RFC 9110 names, or the raw deflate some clients send under that name.
Decoded inflate(const std::string& in, bool gzip, size_t max_bytes, const std::string& name) {
  Decoded d;
  auto fail = [&](Decoded::Result r, std::string msg) {
    Decoded e;
    e.result = r;
    e.message = std::move(msg);
    return e;
  };
  bool raw = false;
  if (!gzip && !in.empty()) {
    // a zlib stream starts with CMF/FLG whose 16-bit value is a multiple of 31
    const unsigned cmf = static_cast<unsigned char>(in[0]), flg = in.size() > 1 ? static_cast<unsigned char>(in[1]) : 0;
    raw = (cmf & 0x0f) != 8 || ((cmf << 8) | flg) % 31 != 0;
  }
  z_stream z{};
  if (inflateInit2(&z, gzip ? 16 + MAX_WBITS : raw ? -MAX_WBITS : MAX_WBITS) != Z_OK)
    return fail(Decoded::Result::Corrupt, "cannot start the " + name + " decoder");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  std::vector<char> chunk(256 << 10);
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(chunk.data());
    z.avail_out = uInt(chunk.size());
    const int rc = ::inflate(&z, Z_NO_FLUSH);
    const size_t got = chunk.size() - z.avail_out;
    if (d.body.size() + got > max_bytes) {
      inflateEnd(&z);
      return fail(Decoded::Result::TooLarge, "the body inflates (" + name + ") to more than the " + std::to_string(max_bytes >> 20) +
                                                 " MiB limit");
    }
    d.body.append(chunk.data(), got);
    if (rc == Z_STREAM_END) {
      if (gzip && z.avail_in > 0) {  // another member follows
        if (inflateReset(&z) != Z_OK) break;
        continue;
      }
      if (z.avail_in > 0) {
        inflateEnd(&z);
        return fail(Decoded::Result::Corrupt, "bytes after the end of the " + name + " stream");
      }
      inflateEnd(&z);
      return d;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // input ended before the stream did
    if (rc != Z_BUF_ERROR) {
      const std::string why = z.msg ? z.msg : "invalid data";
      inflateEnd(&z);
      return fail(Decoded::Result::Corrupt, "the body is not valid " + name + " (" + why + ")");
    }
  }
  inflateEnd(&z);
  return fail(Decoded::Result::Corrupt, "the " + name + " body ends before its stream does");
}

// The codings of a Content-Encoding value in order, identity and empty items left out.
std::vector<std::string> codings_of(std::string_view encoding) {
  std::vector<std::string> codings;
  size_t start = 0;
  while (start <= encoding.size()) {
    size_t comma = encoding.find(',', start);
    if (comma == std::string_view::npos) comma = encoding.size();
    std::string c = lower_trimmed(encoding.substr(start, comma - start));
    if (!c.empty() && c != "identity") codings.push_back(std::move(c));
    start = comma + 1;
  }
  return codings;
}

bool is_gzip(const std::string& c) { return c == "gzip" || c == "x-gzip"; }

}  // namespace

bool codings_supported(std::string_view encoding, std::string* message) {
  const std::vector<std::string> codings = codings_of(encoding);
  for (const std::string& c : codings)
    if (!is_gzip(c) && c != "deflate") {
      if (message) *message = "Content-Encoding '" + c.substr(0, 40) + "' is not supported (gzip, deflate or identity)";
      return false;
    }
  if (codings.size() > kMaxCodings) {
    if (message)
      *message = "Content-Encoding lists " + std::to_string(codings.size()) + " codings; at most " + std::to_string(kMaxCodings) + " are undone";
    return false;
  }
  return true;
}

Decoded decode_content(std::string body, std::string_view encoding, size_t max_bytes) {
  Decoded d;
  if (!codings_supported(encoding, &d.message)) {
    d.result = Decoded::Result::Unsupported;
    return d;
  }
  const std::vector<std::string> codings = codings_of(encoding);
  d.body = std::move(body);
  if (d.body.size() > max_bytes) {
    d.result = Decoded::Result::TooLarge;
    d.message = "the body is larger than the " + std::to_string(max_bytes >> 20) + " MiB limit";
    d.body.clear();
    return d;
  }
  for (auto it = codings.rbegin(); it != codings.rend(); ++it) {
    d = inflate(d.body, is_gzip(*it), max_bytes, *it);
    if (d.result != Decoded::Result::Ok) return d;
  }
  return d;
}

}  // namespace clefrt::server

// Content-Encoding of request bodies (RFC 9110 8.4): identity, gzip (x-gzip) and deflate, a
// list of them undone last first. The decoded size is bounded while inflating, so a small
// compressed body cannot grow past the body limit in memory.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace clefrt::server {

struct Decoded {
  enum class Result { Ok, TooLarge, Unsupported, Corrupt } result = Result::Ok;
  std::string body;     // Ok: the decoded body
  std::string message;  // otherwise: what was wrong, for the error body
};

// At most this many codings other than identity: each is a full pass over up to the body limit,
// and a 64 KiB header could otherwise list thousands ("gzip, gzip, ...") of nearly free layers.
constexpr size_t kMaxCodings = 2;

// Whether `encoding` names only codings decode_content undoes, and few enough of them; when not,
// `message` says why (for a 415). Looks at the names only, so it runs before the body is read.
bool codings_supported(std::string_view encoding, std::string* message);

// Undoes `encoding` (the header's value; empty = identity) on `body`; the result and every
// intermediate stage must stay within max_bytes.
Decoded decode_content(std::string body, std::string_view encoding, size_t max_bytes);

}  // namespace clefrt::server

#include "common/utf8.h"

#include <simdjson.h>
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/error.h"

namespace clefrt::utf8 {

bool valid(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

bool is_ascii(std::string_view s) {
  // 8 bytes at a time; the tokenizer calls this on every piece of text.
  size_t k = 0;
  uint64_t acc = 0;
  for (; k + 8 <= s.size(); k += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + k, 8);
    acc |= w;
  }
  for (; k < s.size(); ++k) acc |= static_cast<unsigned char>(s[k]);
  return (acc & 0x8080808080808080ull) == 0;
}

std::string nfc(std::string_view s) {
  if (is_ascii(s)) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                        static_cast<utf8proc_ssize_t>(s.size()), &out,
                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw bad_request("", std::string("text cannot be normalised: ") + utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

uint32_t next(std::string_view s, size_t& pos) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  uint32_t c = b(pos);
  if (c < 0x80) { pos += 1; return c; }
  if (c < 0xE0) { uint32_t r = ((c & 0x1F) << 6) | (b(pos + 1) & 0x3F); pos += 2; return r; }
  if (c < 0xF0) {
    uint32_t r = ((c & 0x0F) << 12) | ((b(pos + 1) & 0x3F) << 6) | (b(pos + 2) & 0x3F);
    pos += 3;
    return r;
  }
  uint32_t r = ((c & 0x07) << 18) | ((b(pos + 1) & 0x3F) << 12) | ((b(pos + 2) & 0x3F) << 6) | (b(pos + 3) & 0x3F);
  pos += 4;
  return r;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) out.push_back(char(cp));
  else if (cp < 0x800) { out.push_back(char(0xC0 | (cp >> 6))); out.push_back(char(0x80 | (cp & 0x3F))); }
  else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace clefrt::utf8

// UTF-8 helpers: validation and Unicode NFC (utf8proc), with an ASCII fast path.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace clefrt::utf8 {

bool valid(std::string_view s);
bool is_ascii(std::string_view s);
// Canonical composition (NFC). ASCII text is returned unchanged without a call into utf8proc.
std::string nfc(std::string_view s);
// Decodes the code point at s[pos] (s must be valid UTF-8); advances pos.
uint32_t next(std::string_view s, size_t& pos);
void append(std::string& out, uint32_t cp);

}  // namespace clefrt::utf8

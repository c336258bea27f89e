#include "schema/images.h"

#include <array>
#include <cstring>

namespace clefrt {

std::string base64_encode(std::string_view bytes) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t k = 0;
  for (; k + 3 <= bytes.size(); k += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[k])) << 16 | uint32_t(uint8_t(bytes[k + 1])) << 8 | uint8_t(bytes[k + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(a[(v >> s) & 63]);
  }
  if (bytes.size() - k == 1) {
    uint32_t v = uint32_t(uint8_t(bytes[k])) << 16;
    out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (bytes.size() - k == 2) {
    uint32_t v = uint32_t(uint8_t(bytes[k])) << 16 | uint32_t(uint8_t(bytes[k + 1])) << 8;
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view s, size_t max_decoded) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int k = 0; k < 64; ++k) t[static_cast<unsigned char>(a[k])] = int8_t(k);
    return t;
  }();
  size_t n = s.size();
  while (n > 0 && s[n - 1] == '=') --n;
  if (s.size() - n > 2 || n % 4 == 1) return std::nullopt;
  if (s.size() % 4 != 0 && s.size() != n) return std::nullopt;  // padding only on a full quad
  size_t out_len = n / 4 * 3 + (n % 4 == 0 ? 0 : n % 4 - 1);
  if (out_len > max_decoded) return std::nullopt;
  std::string out;
  out.reserve(out_len);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t k = 0; k < n; ++k) {
    int8_t v = table[static_cast<unsigned char>(s[k])];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;  // non-canonical tail bits
  return out;
}

std::optional<ImageFormat> sniff_image(std::string_view b) {
  if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::Png;
  if (b.size() >= 3 && std::memcmp(b.data(), "\xFF\xD8\xFF", 3) == 0) return ImageFormat::Jpeg;
  if (b.size() >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 && std::memcmp(b.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::Webp;
  return std::nullopt;
}

const char* image_mime(ImageFormat f) {
  switch (f) {
    case ImageFormat::Png: return "image/png";
    case ImageFormat::Jpeg: return "image/jpeg";
    case ImageFormat::Webp: return "image/webp";
  }
  return "?";
}

namespace {
uint32_t be16(const unsigned char* p) { return uint32_t(p[0]) << 8 | p[1]; }
uint32_t be32(const unsigned char* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }
uint32_t le16(const unsigned char* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8; }
uint32_t le24(const unsigned char* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16; }
}  // namespace

bool image_size(ImageFormat fmt, std::string_view bytes, uint32_t& w, uint32_t& h) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  switch (fmt) {
    case ImageFormat::Png:
      if (n < 24 || be32(p + 8) != 13 || std::memcmp(p + 12, "IHDR", 4) != 0) return false;
      w = be32(p + 16);
      h = be32(p + 20);
      return w > 0 && h > 0 && w <= 0x7fffffff && h <= 0x7fffffff;
    case ImageFormat::Jpeg: {
      size_t k = 2;  // after SOI
      while (k + 4 <= n) {
        if (p[k] != 0xFF) return false;
        while (k < n && p[k] == 0xFF) ++k;  // fill bytes
        if (k >= n) return false;
        unsigned m = p[k++];
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
        if (m == 0xD9 || m == 0xDA) return false;  // end / scan before any frame header
        if (k + 2 > n) return false;
        uint32_t len = be16(p + k);
        if (len < 2 || k + len > n) return false;
        bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
          if (len < 7) return false;
          h = be16(p + k + 3);
          w = be16(p + k + 5);
          return w > 0 && h > 0;
        }
        k += len;
      }
      return false;
    }
    case ImageFormat::Webp: {
      if (n < 30) return false;
      if (std::memcmp(p + 12, "VP8 ", 4) == 0) {
        if (p[23] != 0x9d || p[24] != 0x01 || p[25] != 0x2a) return false;
        w = le16(p + 26) & 0x3fff;
        h = le16(p + 28) & 0x3fff;
      } else if (std::memcmp(p + 12, "VP8L", 4) == 0) {
        if (p[20] != 0x2f) return false;
        uint32_t bits = uint32_t(p[21]) | uint32_t(p[22]) << 8 | uint32_t(p[23]) << 16 | uint32_t(p[24]) << 24;
        w = (bits & 0x3fff) + 1;
        h = ((bits >> 14) & 0x3fff) + 1;
      } else if (std::memcmp(p + 12, "VP8X", 4) == 0) {
        w = le24(p + 24) + 1;
        h = le24(p + 27) + 1;
      } else {
        return false;
      }
      return w > 0 && h > 0;
    }
  }
  return false;
}

}  // namespace clefrt

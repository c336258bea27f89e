#include "common/digest.h"

#include <openssl/evp.h>

namespace clefrt {

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned i = 0; i < n; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

}  // namespace clefrt

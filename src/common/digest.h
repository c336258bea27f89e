// sha256 as lowercase hex (OpenSSL's libcrypto): the eval kit's payload record and the tests'
// fixture hashes.
#pragma once
#include <string>
#include <string_view>

namespace clefrt {

std::string sha256_hex(std::string_view bytes);

}  // namespace clefrt

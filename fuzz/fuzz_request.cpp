// libFuzzer target: any byte string as a request body. Must only ever produce a result or a
// clefrt::Error (400/413/422); anything else (crash, other exception, sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "schema/encode.h"
#include "schema/request.h"
#include "tokenizer/tokenizer.h"

static const clefrt::Tokenizer& tok() {
  static clefrt::Tokenizer t = clefrt::Tokenizer::load(std::string(CLEFRT_SOURCE_DIR) + "/.deps/qwen3/tokenizer.json");
  return t;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static clefrt::Encoder plain(tok(), {});
  static clefrt::Encoder parse(tok(), [] {
    clefrt::EncodeOptions o;
    o.user_text = clefrt::AddedTokens::Parse;
    o.max_length = 512;
    return o;
  }());
  std::string body(reinterpret_cast<const char*>(data), size);
  try {
    clefrt::Request r = clefrt::parse_request(body);
    (void)(size % 2 ? plain : parse).encode(r);
  } catch (const clefrt::Error& e) {
    int s = e.http_status();
    if (s != 400 && s != 413 && s != 422) __builtin_trap();
  }
  return 0;
}

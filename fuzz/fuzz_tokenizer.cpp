// libFuzzer target: arbitrary text through the real tokenizer in both modes. Invalid UTF-8 must
// be refused with a 400; valid text must tokenize, and decode back to its NFC form in plain mode.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"

static const clefrt::Tokenizer& tok() {
  static clefrt::Tokenizer t = clefrt::Tokenizer::load(std::string(CLEFRT_SOURCE_DIR) + "/.deps/qwen3/tokenizer.json");
  return t;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  bool valid = clefrt::utf8::valid(text);
  try {
    auto ids = tok().encode(text, clefrt::AddedTokens::Plain);
    if (!valid) __builtin_trap();
    std::string back;
    for (int32_t id : ids) back += tok().token_bytes(id);
    if (back != clefrt::utf8::nfc(text)) __builtin_trap();  // byte-level BPE loses nothing
    (void)tok().encode(text, clefrt::AddedTokens::Parse);
  } catch (const clefrt::Error& e) {
    if (valid || e.http_status() != 400) __builtin_trap();
  }
  return 0;
}

// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the Qwen2/3/3.5 family):
// added tokens matched first (leftmost-longest, as HF's AddedVocabulary does), NFC normaliser,
// the Split regex from the file (PCRE2, UTF + Unicode properties, JIT), ByteLevel mapping,
// then merges by rank. Thread-safe: one Tokenizer serves every thread.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace clefrt {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;  // matched on normalised text rather than raw text
  bool lstrip = false;      // absorbs whitespace on its left
  bool rstrip = false;      // absorbs whitespace on its right
};

// How added-token text inside a string is treated.
enum class AddedTokens {
  Parse,  // match every added token, special or not (HF `tokenizers` default; the reference)
  Plain,  // match none: the text goes through normaliser, pre-tokenizer and BPE only
};

class Tokenizer {
 public:
  // Throws clefrt::Error (load_error) naming the file and the part that is wrong or unsupported.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json(std::string_view text, const std::string& source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends the ids of `text` (valid UTF-8; no BOS/EOS is ever added).
  void encode(std::string_view text, AddedTokens mode, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text, AddedTokens mode) const;

  // The id of an added token or vocabulary entry with exactly this content.
  std::optional<int32_t> token_id(std::string_view content) const;
  // Same, but a missing token is a load error naming the tokenizer file.
  int32_t require_token(std::string_view content) const;
  // Token text as bytes (ByteLevel mapping undone); empty for unknown ids.
  std::string token_bytes(int32_t id) const;

  size_t vocab_size() const;  // largest id + 1, added tokens included
  const std::vector<AddedToken>& added_tokens() const;
  const std::string& source() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace clefrt

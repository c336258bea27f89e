// Pieces of the tokenizer shared between its source files (not part of the public API).
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace clefrt::tok {

// GPT-2's byte <-> printable code point table used by ByteLevel.
struct ByteLevelTable {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelTable();
  std::string map(std::string_view bytes) const;    // bytes -> mapped UTF-8 string
  bool unmap(std::string_view mapped, std::string& bytes) const;
};
const ByteLevelTable& byte_level();

// The Split pre-tokenizer: pieces are the regex matches and the gaps between them
// (behaviour "Isolated"), or only the matches ("Removed").
class Splitter {
 public:
  Splitter() = default;
  Splitter(const std::string& pattern, bool remove_gaps, const std::string& source);
  Splitter(Splitter&&) noexcept;
  Splitter& operator=(Splitter&&) noexcept;
  ~Splitter();
  // Appends the [start, end) byte ranges of the pieces of `text`, in order.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const;
  bool active() const { return code_ != nullptr; }

 private:
  pcre2_code* code_ = nullptr;
  bool remove_gaps_ = false;
};

// Onig (what HF `tokenizers` uses) and PCRE2 disagree on what `\s` is (PCRE2 adds U+180E);
// rewrite `\s` / `\S` into explicit classes of Unicode White_Space so both agree.
std::string translate_whitespace_classes(const std::string& pattern, const std::string& source);

// Byte-pair merging with ranks, over byte-level symbol ids.
struct Bpe {
  std::vector<int32_t> byte_ids;                                       // 256 entries
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a<<32|b) -> (rank, merged id)
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t>* vocab = nullptr;          // mapped text -> id

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // Cache of whole pieces: most words repeat. Bounded; cleared when full.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheMax = 1 << 17;
  static constexpr size_t kCacheMaxPiece = 64;  // longer pieces are not cached
};

inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace clefrt::tok

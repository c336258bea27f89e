// The Split pre-tokenizer (PCRE2 JIT) and the ByteLevel byte <-> code point table.
#include <cstring>

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/internal.h"

namespace clefrt::tok {

ByteLevelTable::ByteLevelTable() {
  // Printable Latin-1 bytes map to themselves; the rest to 256, 257, ... in byte order.
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byte_to_cp[b] = printable ? uint32_t(b) : 256 + n++;
    cp_to_byte[byte_to_cp[b]] = uint8_t(b);
  }
}

std::string ByteLevelTable::map(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) utf8::append(out, byte_to_cp[c]);
  return out;
}

bool ByteLevelTable::unmap(std::string_view mapped, std::string& bytes) const {
  if (!utf8::valid(mapped)) return false;
  size_t pos = 0;
  while (pos < mapped.size()) {
    auto it = cp_to_byte.find(utf8::next(mapped, pos));
    if (it == cp_to_byte.end()) return false;
    bytes.push_back(char(it->second));
  }
  return true;
}

const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

// Unicode White_Space (what Oniguruma's \s matches in UTF-8 mode), as class contents.
static const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string translate_whitespace_classes(const std::string& p, const std::string& source) {
  std::string out;
  bool in_class = false;
  for (size_t k = 0; k < p.size(); ++k) {
    char c = p[k];
    if (c == '\\' && k + 1 < p.size()) {
      char e = p[k + 1];
      ++k;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class)
          throw load_error(source, "pre_tokenizer regex uses \\S inside a character class, which clefrt cannot translate");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // a ']' right after '[' or '[^' is a literal
      if (k + 1 < p.size() && p[k + 1] == '^') { out.push_back('^'); ++k; }
      if (k + 1 < p.size() && p[k + 1] == ']') { out.push_back(']'); ++k; }
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Splitter::Splitter(const std::string& pattern, bool remove_gaps, const std::string& source)
    : remove_gaps_(remove_gaps) {
  std::string pat = translate_whitespace_classes(pattern, source);
  int err = 0;
  PCRE2_SIZE erroff = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP, &err,
                        &erroff, nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw load_error(source, "pre_tokenizer regex does not compile at offset " + std::to_string(erroff) + ": " +
                                 reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation; the interpreter gives the same matches if JIT is unavailable.
  (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Splitter::Splitter(Splitter&& o) noexcept : code_(o.code_), remove_gaps_(o.remove_gaps_) { o.code_ = nullptr; }
Splitter& Splitter::operator=(Splitter&& o) noexcept {
  std::swap(code_, o.code_);
  remove_gaps_ = o.remove_gaps_;
  return *this;
}
Splitter::~Splitter() {
  if (code_) pcre2_code_free(code_);
}

namespace {
// Match data and a JIT stack per thread: the regex's `\s+(?!\S)` on a long run of spaces
// needs more than PCRE2's default 32 KiB JIT stack.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  MatchState() {
    md = pcre2_match_data_create(32, nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};
}  // namespace

void Splitter::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const {
  thread_local MatchState st;
  size_t pos = 0, gap = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos <= text.size()) {
    // Input was validated as UTF-8 once, on entry to the tokenizer.
    int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(Status::Internal, "tokenizer_error",
                  std::string("pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    size_t s = ov[0], e = ov[1];
    if (e == s) {
      // An empty match produces no piece (HF skips them); step over one character.
      if (s >= text.size()) break;
      pos = s + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > gap && !remove_gaps_) pieces.emplace_back(gap, s);
    pieces.emplace_back(s, e);
    gap = pos = e;
  }
  if (gap < text.size() && !remove_gaps_) pieces.emplace_back(gap, text.size());
}

}  // namespace clefrt::tok

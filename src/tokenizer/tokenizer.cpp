// Loading tokenizer.json and the encode pipeline:
//   added tokens (raw) -> NFC -> added tokens (normalised) -> Split regex -> ByteLevel -> BPE.
#include "tokenizer/tokenizer.h"

#include <simdjson.h>

#include <algorithm>

#include "common/error.h"
#include "common/file.h"
#include "common/utf8.h"
#include "tokenizer/internal.h"

namespace clefrt {

using simdjson::dom::element;

struct Tokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;  // ByteLevel-mapped text -> id
  std::vector<std::string> id_to_bytes;           // raw bytes of every id (for token_bytes)
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  // Added tokens bucketed by first byte, longest first, split by raw/normalised matching.
  std::vector<const AddedToken*> raw_bucket[256], norm_bucket[256];
  bool has_raw = false, has_norm = false;
  bool nfc = false;
  bool add_prefix_space = false;
  tok::Splitter splitter;
  tok::Bpe bpe;

  void split_added(std::string_view text, bool normalized_pass, std::vector<std::pair<std::string_view, int32_t>>& parts) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

[[noreturn]] void fail(const std::string& src, const std::string& msg) { throw load_error(src, msg); }

std::string_view get_str(element e, const std::string& src, const char* what) {
  std::string_view s;
  if (e.get_string().get(s)) fail(src, std::string(what) + " must be a string");
  return s;
}

bool get_bool_or(element obj, const char* key, bool dflt) {
  bool b;
  if (obj[key].get_bool().get(b)) return dflt;
  return b;
}

// GPT-2's pre-tokenizer regex, used by ByteLevel when its own `use_regex` is true.
const char* kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) { return from_json(read_file(path), path); }

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& src) {
  auto im = std::make_unique<Impl>();
  im->source = src;
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  element root;
  if (auto err = parser.parse(padded).get(root)) fail(src, std::string("not valid JSON: ") + simdjson::error_message(err));

  // --- model: BPE only
  element model;
  if (root["model"].get(model)) fail(src, "missing \"model\"");
  std::string_view mtype;
  if (model["type"].get_string().get(mtype) || mtype != "BPE")
    fail(src, "model.type must be \"BPE\" (clefrt reads byte-level BPE tokenizers only)");
  {
    std::string_view s;
    if (!model["continuing_subword_prefix"].get_string().get(s) && !s.empty())
      fail(src, "model.continuing_subword_prefix is not supported");
    if (!model["end_of_word_suffix"].get_string().get(s) && !s.empty())
      fail(src, "model.end_of_word_suffix is not supported");
    double dropout;
    if (!model["dropout"].get_double().get(dropout) && dropout > 0) fail(src, "model.dropout is not supported");
    if (get_bool_or(model, "byte_fallback", false)) fail(src, "model.byte_fallback is not supported (byte-level BPE needs none)");
    im->bpe.ignore_merges = get_bool_or(model, "ignore_merges", false);
  }
  simdjson::dom::object vocab;
  if (model["vocab"].get_object().get(vocab)) fail(src, "model.vocab must be an object");
  int32_t max_id = -1;
  im->vocab.reserve(vocab.size());
  for (auto kv : vocab) {
    int64_t id;
    if (kv.value.get_int64().get(id) || id < 0 || id > INT32_MAX)
      fail(src, "model.vocab[\"" + std::string(kv.key) + "\"] must be a non-negative integer id");
    im->vocab.emplace(std::string(kv.key), int32_t(id));
    max_id = std::max(max_id, int32_t(id));
  }
  im->bpe.vocab = &im->vocab;

  const auto& bl = tok::byte_level();
  im->bpe.byte_ids.resize(256);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, bl.byte_to_cp[b]);
    auto it = im->vocab.find(ch);
    if (it == im->vocab.end())
      fail(src, "vocab lacks the byte-level symbol for byte " + std::to_string(b) + " (not a byte-level BPE tokenizer)");
    im->bpe.byte_ids[size_t(b)] = it->second;
  }

  simdjson::dom::array merges;
  if (model["merges"].get_array().get(merges)) fail(src, "model.merges must be an array");
  im->bpe.merges.reserve(merges.size());
  int32_t rank = 0;
  for (auto m : merges) {
    std::string_view a, b;
    std::string_view line;
    if (!m.get_string().get(line)) {  // "a b"
      size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        fail(src, "merge " + std::to_string(rank) + " (\"" + std::string(line) + "\") is not two symbols separated by one space");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else {  // ["a", "b"]
      simdjson::dom::array pr;
      if (m.get_array().get(pr) || pr.size() != 2 || pr.at(0).get_string().get(a) || pr.at(1).get_string().get(b))
        fail(src, "merge " + std::to_string(rank) + " must be \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = im->vocab.find(std::string(a));
    auto ib = im->vocab.find(std::string(b));
    auto im_ = im->vocab.find(std::string(a) + std::string(b));
    if (ia == im->vocab.end() || ib == im->vocab.end() || im_ == im->vocab.end())
      fail(src, "merge " + std::to_string(rank) + " (" + std::string(a) + " " + std::string(b) + ") refers to a token missing from the vocab");
    // The first occurrence of a pair holds its rank (HF keeps the lowest rank).
    im->bpe.merges.emplace(tok::pair_key(ia->second, ib->second), std::make_pair(rank, im_->second));
    ++rank;
  }

  // --- added tokens
  simdjson::dom::array added;
  if (!root["added_tokens"].get_array().get(added)) {
    for (auto a : added) {
      AddedToken t;
      int64_t id;
      if (a["id"].get_int64().get(id) || id < 0 || id > INT32_MAX) fail(src, "added_tokens entry without a valid id");
      t.id = int32_t(id);
      t.content = std::string(get_str(a["content"], src, "added_tokens[].content"));
      if (t.content.empty()) fail(src, "added token " + std::to_string(id) + " has empty content");
      t.special = get_bool_or(a, "special", false);
      t.normalized = get_bool_or(a, "normalized", !t.special);
      t.lstrip = get_bool_or(a, "lstrip", false);
      t.rstrip = get_bool_or(a, "rstrip", false);
      if (get_bool_or(a, "single_word", false))
        fail(src, "added token \"" + t.content + "\" uses single_word, which clefrt does not support");
      max_id = std::max(max_id, t.id);
      im->added.push_back(std::move(t));
    }
  }
  for (const auto& t : im->added) {
    im->added_by_content[t.content] = t.id;
    auto& bucket = (t.normalized ? im->norm_bucket : im->raw_bucket)[static_cast<unsigned char>(t.content[0])];
    bucket.push_back(&t);
    (t.normalized ? im->has_norm : im->has_raw) = true;
  }
  for (int b = 0; b < 256; ++b)
    for (auto* bucket : {&im->raw_bucket[b], &im->norm_bucket[b]})
      std::stable_sort(bucket->begin(), bucket->end(),
                       [](const AddedToken* x, const AddedToken* y) { return x->content.size() > y->content.size(); });

  // --- normalizer: NFC (or none)
  element norm;
  if (!root["normalizer"].get(norm) && !norm.is_null()) {
    std::string_view nt = get_str(norm["type"], src, "normalizer.type");
    if (nt == "NFC") im->nfc = true;
    else if (nt == "Sequence") {
      simdjson::dom::array seq;
      if (norm["normalizers"].get_array().get(seq)) fail(src, "normalizer.normalizers must be an array");
      for (auto n : seq) {
        std::string_view t = get_str(n["type"], src, "normalizer.normalizers[].type");
        if (t != "NFC") fail(src, "normalizer " + std::string(t) + " is not supported (only NFC)");
        im->nfc = true;
      }
    } else {
      fail(src, "normalizer " + std::string(nt) + " is not supported (only NFC)");
    }
  }

  // --- pre_tokenizer: Split(regex) then ByteLevel, or ByteLevel alone
  element pre;
  if (root["pre_tokenizer"].get(pre) || pre.is_null()) fail(src, "missing pre_tokenizer (byte-level BPE needs ByteLevel)");
  std::vector<element> steps;
  std::string_view ptype = get_str(pre["type"], src, "pre_tokenizer.type");
  if (ptype == "Sequence") {
    simdjson::dom::array seq;
    if (pre["pretokenizers"].get_array().get(seq)) fail(src, "pre_tokenizer.pretokenizers must be an array");
    for (auto s : seq) steps.push_back(s);
  } else {
    steps.push_back(pre);
  }
  bool saw_byte_level = false;
  for (auto s : steps) {
    std::string_view t = get_str(s["type"], src, "pre_tokenizer type");
    if (t == "Split") {
      if (saw_byte_level || im->splitter.active()) fail(src, "only one Split, placed before ByteLevel, is supported");
      std::string_view pat;
      if (s["pattern"]["Regex"].get_string().get(pat))
        fail(src, "Split.pattern must be {\"Regex\": ...} (string patterns are not supported)");
      std::string_view behavior = get_str(s["behavior"], src, "Split.behavior");
      if (behavior != "Isolated" && behavior != "Removed")
        fail(src, "Split.behavior " + std::string(behavior) + " is not supported (Isolated or Removed)");
      if (get_bool_or(s, "invert", false)) fail(src, "Split.invert is not supported");
      im->splitter = tok::Splitter(std::string(pat), behavior == "Removed", src);
    } else if (t == "ByteLevel") {
      saw_byte_level = true;
      im->add_prefix_space = get_bool_or(s, "add_prefix_space", false);
      if (get_bool_or(s, "use_regex", true)) {
        if (im->splitter.active()) fail(src, "ByteLevel.use_regex together with a Split is not supported");
        im->splitter = tok::Splitter(kGpt2Regex, false, src);
      }
    } else {
      fail(src, "pre_tokenizer " + std::string(t) + " is not supported (Split and ByteLevel only)");
    }
  }
  if (!saw_byte_level) fail(src, "pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");

  im->id_to_bytes.resize(size_t(max_id) + 1);
  for (const auto& [mapped, id] : im->vocab) {
    std::string bytes;
    if (bl.unmap(mapped, bytes)) im->id_to_bytes[size_t(id)] = std::move(bytes);
  }
  for (const auto& t : im->added) im->id_to_bytes[size_t(t.id)] = t.content;
  return Tokenizer(std::move(im));
}

// Splits `text` on added tokens (leftmost-longest), appending (segment, -1) for plain text and
// ("", id) for each token. lstrip/rstrip tokens swallow the whitespace beside them.
void Tokenizer::Impl::split_added(std::string_view text, bool normalized_pass,
                                  std::vector<std::pair<std::string_view, int32_t>>& parts) const {
  const auto* buckets = normalized_pass ? norm_bucket : raw_bucket;
  size_t seg = 0, pos = 0;
  auto is_space = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (pos < text.size()) {
    const auto& bucket = buckets[static_cast<unsigned char>(text[pos])];
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : bucket)
      if (text.compare(pos, t->content.size(), t->content) == 0) { hit = t; break; }
    if (!hit) { ++pos; continue; }
    size_t s = pos, e = pos + hit->content.size();
    if (hit->lstrip) while (s > seg && is_space(static_cast<unsigned char>(text[s - 1]))) --s;
    if (hit->rstrip) while (e < text.size() && is_space(static_cast<unsigned char>(text[e]))) ++e;
    if (s > seg) parts.emplace_back(text.substr(seg, s - seg), -1);
    parts.emplace_back(std::string_view(), hit->id);
    seg = pos = e;
  }
  if (seg < text.size()) parts.emplace_back(text.substr(seg), -1);
}

// Normalised text -> Split -> BPE.
void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space && text[0] != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  splitter.split(text, pieces);
  for (auto [s, e] : pieces) bpe.encode_piece(text.substr(s, e - s), out);
}

void Tokenizer::encode(std::string_view text, AddedTokens mode, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  if (!utf8::valid(text)) throw bad_request("", "text is not valid UTF-8");
  auto normalize = [&](std::string_view s) { return im.nfc ? utf8::nfc(s) : std::string(s); };
  if (mode == AddedTokens::Plain || (!im.has_raw && !im.has_norm)) {
    im.encode_text(normalize(text), out);
    return;
  }
  std::vector<std::pair<std::string_view, int32_t>> raw_parts;
  if (im.has_raw) im.split_added(text, false, raw_parts);
  else raw_parts.emplace_back(text, -1);
  for (auto [seg, id] : raw_parts) {
    if (id >= 0) { out.push_back(id); continue; }
    std::string normed = normalize(seg);
    if (!im.has_norm) { im.encode_text(normed, out); continue; }
    std::vector<std::pair<std::string_view, int32_t>> parts;
    im.split_added(normed, true, parts);
    for (auto [s2, id2] : parts) {
      if (id2 >= 0) out.push_back(id2);
      else im.encode_text(s2, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, AddedTokens mode) const {
  std::vector<int32_t> ids;
  encode(text, mode, ids);
  return ids;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view content) const {
  auto a = impl_->added_by_content.find(std::string(content));
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->vocab.find(tok::byte_level().map(content));
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

int32_t Tokenizer::require_token(std::string_view content) const {
  auto id = token_id(content);
  if (!id) throw load_error(impl_->source, "tokenizer has no token \"" + std::string(content) + "\"");
  return *id;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_to_bytes.size()) return {};
  return impl_->id_to_bytes[size_t(id)];
}

size_t Tokenizer::vocab_size() const { return impl_->id_to_bytes.size(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace clefrt

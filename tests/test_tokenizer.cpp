#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/error.h"
#include "common/json.h"
#include "common/utf8.h"
#include "test_util.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {
namespace {
using test::qwen3;

// A tiny byte-level BPE tokenizer: ids 0..255 are the bytes, then merged tokens.
struct TinySpec {
  std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"}, {"ab", "c"}, {"Ġ", "a"}, {"c", "c"}};
  bool merges_as_pairs = false;
  std::string added = R"([{"id":300,"content":"<s>","special":true,"normalized":false},
                          {"id":301,"content":"<tool>","special":false,"normalized":false},
                          {"id":302,"content":"<sp>","special":true,"normalized":false,"lstrip":true,"rstrip":true},
                          {"id":303,"content":"é!","special":false,"normalized":true}])";
  std::string normalizer = R"({"type":"NFC"})";
  std::string pre = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|[^\\s]+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]})";
  std::string extra_model;

  std::string json() const {
    const auto& bl = tok::byte_level();
    json::Value vocab = json::Value::object();
    std::vector<std::string> names;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8::append(s, bl.byte_to_cp[b]);
      vocab.add(s, json::Value::integer(b));
    }
    int next = 256;
    json::Value m = json::Value::array();
    for (const auto& [a, b] : merges) {
      if (!vocab.find(a + b)) vocab.add(a + b, json::Value::integer(next++));
      if (merges_as_pairs) {
        json::Value p = json::Value::array();
        p.arr.push_back(json::Value::string(a));
        p.arr.push_back(json::Value::string(b));
        m.arr.push_back(p);
      } else {
        m.arr.push_back(json::Value::string(a + " " + b));
      }
    }
    return R"({"version":"1.0","added_tokens":)" + added + R"(,"normalizer":)" + normalizer + R"(,"pre_tokenizer":)" + pre +
           R"(,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":"","end_of_word_suffix":"",)" +
           R"("fuse_unk":false,"byte_fallback":false,"ignore_merges":false)" + extra_model + R"(,"vocab":)" + json::write(vocab) +
           R"(,"merges":)" + json::write(m) + "}}";
  }
};

std::vector<int32_t> enc(const Tokenizer& t, const std::string& s, AddedTokens m = AddedTokens::Parse) { return t.encode(s, m); }
using Ids = std::vector<int32_t>;

TEST(Tokenizer, MergesByRank) {
  Tokenizer t = Tokenizer::from_json(TinySpec().json());
  // ab(256) then abc(257); "cc" merges (259); " a" -> Ġa (258)
  EXPECT_EQ(enc(t, "abc"), (Ids{257}));
  EXPECT_EQ(enc(t, "abcc"), (Ids{257, 'c'}));  // ab+c (rank 1) before c+c (rank 3)
  EXPECT_EQ(enc(t, "cc"), (Ids{259}));
  EXPECT_EQ(enc(t, "x ab"), (Ids{'x', ' ', 256}));  // the Split regex isolates spaces
  EXPECT_EQ(enc(t, "ccc"), (Ids{259, 'c'}));       // leftmost first among equal ranks
}

TEST(Tokenizer, MergePairsAndStringsAreTheSame) {
  TinySpec a, b;
  b.merges_as_pairs = true;
  Tokenizer ta = Tokenizer::from_json(a.json()), tb = Tokenizer::from_json(b.json());
  for (std::string s : {"abc", "cabcab c", "aaabbbccc", "é", "\xf0\x9f\x98\x80"}) EXPECT_EQ(enc(ta, s), enc(tb, s)) << s;
}

TEST(Tokenizer, AddedTokensParseAndPlain) {
  Tokenizer t = Tokenizer::from_json(TinySpec().json());
  EXPECT_EQ(enc(t, "x<s>y"), (Ids{'x', 300, 'y'}));
  EXPECT_EQ(enc(t, "x<tool>y"), (Ids{'x', 301, 'y'}));
  Ids plain = enc(t, "x<s>y", AddedTokens::Plain);
  EXPECT_EQ(plain, (Ids{'x', '<', 's', '>', 'y'}));
  // lstrip / rstrip swallow the whitespace around the token
  EXPECT_EQ(enc(t, "a  <sp>  b"), (Ids{'a', 302, 'b'}));
  // a normalised added token matches the NFC form of decomposed input
  EXPECT_EQ(enc(t, "e\xcc\x81!"), (Ids{303}));
  // leftmost-longest
  EXPECT_EQ(enc(t, "<s><s>"), (Ids{300, 300}));
}

TEST(Tokenizer, NfcBeforeBpe) {
  Tokenizer t = Tokenizer::from_json(TinySpec().json());
  EXPECT_EQ(enc(t, "e\xcc\x81"), enc(t, "\xc3\xa9"));
}

TEST(Tokenizer, LongPiecesAreLinearEnough) {
  Tokenizer t = Tokenizer::from_json(TinySpec().json());
  std::string s(200000, 'c');
  auto ids = enc(t, s);
  EXPECT_EQ(ids.size(), 100000u);
  std::string spaces(1 << 20, ' ');
  EXPECT_EQ(qwen3().encode(spaces, AddedTokens::Plain).empty(), false);
}

TEST(Tokenizer, InvalidUtf8IsRefused) {
  Tokenizer t = Tokenizer::from_json(TinySpec().json());
  EXPECT_THROW(enc(t, "a\xff"), Error);
}

std::string load_error_of(const std::string& json) {
  try {
    Tokenizer::from_json(json, "tok.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, LoadErrorsNameTheProblem) {
  EXPECT_NE(load_error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error_of("{}").find("missing \"model\""), std::string::npos);
  TinySpec s;
  s.normalizer = R"({"type":"NFKC"})";
  EXPECT_NE(load_error_of(s.json()).find("normalizer NFKC is not supported"), std::string::npos);
  s = TinySpec();
  s.added = R"([{"id":300,"content":"<s>","single_word":true}])";
  EXPECT_NE(load_error_of(s.json()).find("single_word"), std::string::npos);
  s = TinySpec();
  s.pre = R"({"type":"Whitespace"})";
  EXPECT_NE(load_error_of(s.json()).find("Whitespace is not supported"), std::string::npos);
  s = TinySpec();
  s.pre = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]})";
  EXPECT_NE(load_error_of(s.json()).find("does not compile"), std::string::npos);
  s = TinySpec();
  s.extra_model = R"(,"byte_fallback2":1)";
  EXPECT_EQ(load_error_of(s.json()), "");
  std::string bad_merge = TinySpec().json();
  bad_merge.replace(bad_merge.find("\"ab c\""), 6, "\"ab zq\"");
  EXPECT_NE(load_error_of(bad_merge).find("missing from the vocab"), std::string::npos);
  EXPECT_NE(load_error_of(bad_merge).find("tok.json"), std::string::npos);
  try {
    Tokenizer::load("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

TEST(Tokenizer, Qwen3KnownIds) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.encode("Hello world", AddedTokens::Parse), (Ids{9707, 1879}));
  EXPECT_EQ(t.encode("<|im_start|>user", AddedTokens::Parse), (Ids{151644, 872}));
  Ids plain = t.encode("<|im_start|>user", AddedTokens::Plain);
  for (int32_t id : plain) EXPECT_LT(id, 151643) << "plain text produced an added token";
  EXPECT_EQ(t.require_token("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_bytes(9707), "Hello");
  EXPECT_EQ(t.vocab_size(), 151669u);
}

TEST(Tokenizer, ThreadsShareOneTokenizer) {
  const Tokenizer& t = qwen3();
  std::vector<std::string> texts = {"The quick brown fox", "Zwölf Boxkämpfer jagen Viktor", "日本語のテキスト", "x = f(y) + 3;"};
  std::vector<Ids> want;  // [i * 7 + suffix]
  for (auto& s : texts)
    for (int r = 0; r < 7; ++r) want.push_back(t.encode(s + std::to_string(r), AddedTokens::Parse));
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&] {
      for (int r = 0; r < 500; ++r)
        for (size_t i = 0; i < texts.size(); ++i)
          if (t.encode(texts[i] + std::to_string(r % 7), AddedTokens::Parse) != want[i * 7 + size_t(r % 7)]) ++bad;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Tokenizer, WhitespaceClassTranslation) {
  EXPECT_EQ(tok::translate_whitespace_classes("a\\sb", "t").find("\\s"), std::string::npos);
  EXPECT_NE(tok::translate_whitespace_classes("[^\\s\\p{L}]", "t").find("[^\\t"), std::string::npos);
  EXPECT_NE(tok::translate_whitespace_classes("\\s+(?!\\S)", "t").find("(?![^"), std::string::npos);
  EXPECT_THROW(tok::translate_whitespace_classes("[\\S]", "t"), Error);
}

}  // namespace
}  // namespace clefrt

// Parity with Hugging Face `tokenizers` and with a Python encoder written from the spec.
// Expected outputs were made on the GPU machine by tools/reference/device_parity.sh
// (tokenizers 0.23.2, transformers 5.17.0) from the inputs made by make_corpus.py.
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/json.h"
#include "schema/encode.h"
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

using test::qwen3;
using test::read_file;
using test::source_path;

std::vector<int32_t> ids_of(const json::Value& arr) {
  std::vector<int32_t> out;
  for (const auto& v : arr.arr) out.push_back(int32_t(v.i));
  return out;
}

std::string show_ids(const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t k = from; k < ids.size() && k < from + 12; ++k) s += std::to_string(ids[k]) + " ";
  return s;
}

size_t first_diff(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

TEST(TokenizerParity, Qwen3MatchesHuggingFaceOnTheCorpus) {
  auto inputs = json::parse(read_file(source_path("tests/fixtures/tokenizer_inputs.json")));
  auto expected = json::parse(read_file(source_path("tests/fixtures/tokenizer_expected.json")));
  const auto& strings = inputs.find("strings")->arr;
  ASSERT_GE(strings.size(), 2000u);
  for (const char* mode_name : {"parse", "plain"}) {
    const auto& exp = expected.find(mode_name)->arr;
    ASSERT_EQ(exp.size(), strings.size());
    AddedTokens mode = std::string(mode_name) == "parse" ? AddedTokens::Parse : AddedTokens::Plain;
    size_t mismatches = 0;
    for (size_t k = 0; k < strings.size(); ++k) {
      auto got = qwen3().encode(strings[k].s, mode);
      auto want = ids_of(exp[k]);
      if (got != want) {
        if (++mismatches <= 5) {
          size_t d = first_diff(got, want);
          std::string text;
          json::write_string(text, strings[k].s.substr(0, 120));
          ADD_FAILURE() << mode_name << " string " << k << " " << text << "\n  first difference at token " << d
                        << "\n  got:  " << show_ids(got, d) << "\n  want: " << show_ids(want, d);
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << mode_name << ": " << mismatches << " of " << strings.size() << " strings differ";
  }
}

TEST(EncodeParity, RequestsMatchTheSpecEncoder) {
  std::string inputs = read_file(source_path("tests/fixtures/encode_inputs.jsonl"));
  std::string expected = read_file(source_path("tests/fixtures/encode_expected.jsonl"));
  std::istringstream in(inputs), ex(expected);
  std::string line_in, line_ex;
  size_t n = 0, encoded = 0, refused = 0, mismatches = 0;
  while (std::getline(in, line_in)) {
    ASSERT_TRUE(std::getline(ex, line_ex)) << "expected file is shorter than the inputs";
    ++n;
    auto rec = json::parse(line_in);
    auto want = json::parse(line_ex);
    EncodeOptions eo;
    eo.max_length = size_t(rec.find("max_length")->i);
    eo.user_text = rec.find("parse_special")->b ? AddedTokens::Parse : AddedTokens::Plain;
    Encoder enc(qwen3(), eo);
    Request req = parse_request(*rec.find("request"));
    if (want.find("error")) {
      try {
        enc.encode(req);
        ADD_FAILURE() << "record " << n << ": expected a 413, got an encoding";
        ++mismatches;
      } catch (const Error& e) {
        EXPECT_EQ(e.http_status(), 413) << "record " << n;
        EXPECT_NE(std::string(e.what()).find("maximum context length"), std::string::npos) << e.what();
        ++refused;
      }
      continue;
    }
    Encoded got = enc.encode(req);
    ++encoded;
    auto want_ids = ids_of(*want.find("input_ids"));
    bool ok = got.input_ids == want_ids;
    if (!ok && mismatches < 5) {
      size_t d = first_diff(got.input_ids, want_ids);
      ADD_FAILURE() << "record " << n << ": ids differ at " << d << "\n  got:  " << show_ids(got.input_ids, d)
                    << "\n  want: " << show_ids(want_ids, d);
    }
    const auto& wq = want.find("questions")->arr;
    ok = ok && wq.size() == got.questions.size();
    for (size_t q = 0; ok && q < wq.size(); ++q) {
      const auto& g = got.questions[q];
      const auto& w = wq[q];
      ok = ok && g.id == w.find("id")->s && std::string(type_name(g.type)) == w.find("type")->s;
      const auto& qs = w.find("question_span")->arr;
      ok = ok && g.question_span.begin == qs[0].i && g.question_span.end == qs[1].i;
      const auto& os = w.find("option_spans")->arr;
      const auto& oi = w.find("option_ids")->arr;
      ok = ok && os.size() == g.option_spans.size() && oi.size() == g.option_ids.size();
      for (size_t j = 0; ok && j < os.size(); ++j)
        ok = g.option_spans[j].begin == os[j].arr[0].i && g.option_spans[j].end == os[j].arr[1].i &&
             g.option_ids[j] == oi[j].s;
      if (!ok && mismatches < 5) ADD_FAILURE() << "record " << n << ": question " << g.id << " spans or option ids differ";
    }
    const auto& wi = want.find("images")->arr;
    ok = ok && wi.size() == got.images.size();
    for (size_t k = 0; ok && k < wi.size(); ++k) {
      const auto& grid = wi[k].find("grid_thw")->arr;
      ok = got.images[k].grid_t == grid[0].i && got.images[k].grid_h == grid[1].i && got.images[k].grid_w == grid[2].i;
      if (!ok && mismatches < 5) ADD_FAILURE() << "record " << n << ": image " << k << " grid differs";
    }
    ok = ok && int64_t(got.input_ids.size()) == want.find("usage")->find("input_tokens")->i;
    if (!ok) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u) << mismatches << " of " << n << " requests differ";
  EXPECT_GE(encoded, 200u);
  EXPECT_GE(refused, 10u);
  std::cout << "[ parity  ] " << encoded << " encoded and " << refused << " refused requests identical\n";
}

}  // namespace
}  // namespace clefrt

// `clefrt eval`'s builders and scorer (eval/suite.h) against the Decision Index kit's rules
// (docs/notes/decision-index-kit.md): the payloads' sha256, macro-F1, raw and skill.
#include <gtest/gtest.h>


#include <filesystem>
#include <fstream>

#include "common/digest.h"
#include "common/error.h"
#include "eval/pyliteral.h"
#include "eval/suite.h"
#include "test_util.h"

namespace clefrt::eval {
namespace {

std::string data_dir() { return test::source_path("../shared/data"); }

// Every payload of a benchmark, as the kit's run ids list them: the sha256 of the lines
// "catalog:track:id<TAB>payload sha256\n" (the vectors come from an independent Python
// rebuild of the kit's builders, docs/notes/decision-index-kit.md 1-2).
TEST(Eval, PayloadHashesOfTheWholeBenchmarks) {
  if (!std::filesystem::exists(data_dir() + "/banking77_test.csv")) GTEST_SKIP() << data_dir() << " is not here";
  const Benchmark b = build("banking77", data_dir());
  ASSERT_EQ(b.rows.size(), 3080u);
  EXPECT_EQ(b.rows[0].id, "BANKING77:test:0");
  EXPECT_EQ(payload_sha256(b.rows[0]), "b221f506ac539f8d7d170944060a45e9eb3bea968bf4e2e63841a49b2d05d565");
  std::string lines;
  for (const Row& r : b.rows) lines += "4:BANKING77:" + r.id + "\t" + payload_sha256(r) + "\n";
  EXPECT_EQ(sha256_hex(lines), "1d71a88921549884b22accc6e3fd7f4d867ac3c603a6ffec79996fea8337d132");
  const Benchmark c = build("clinc150", data_dir());
  ASSERT_EQ(c.rows.size(), 5500u);
  EXPECT_EQ(c.rows[0].gold.find("q1")->s, "option_132");
  EXPECT_EQ(c.rows.back().gold.find("q1")->s, "option_80");  // oos_test rows
  EXPECT_EQ(payload_sha256(c.rows[0]), "b0e12cc2470e9ab378b39a96843db003ca48350926383467a2036e51728c1a4f");
  lines.clear();
  for (const Row& r : c.rows) lines += "5:CLINC150+OOS:" + r.id + "\t" + payload_sha256(r) + "\n";
  EXPECT_EQ(sha256_hex(lines), "907fab29f255b755b31b6a820bcff85805d0dcfdfd3518a56f8178a51d2b452f");
  const Benchmark f = build("finentity", data_dir());
  ASSERT_EQ(f.rows.size(), 979u);
  size_t questions = 0;
  for (const Row& r : f.rows) questions += r.gold.obj.size();
  EXPECT_EQ(questions, 2129u);  // 2,131 annotations, one span with two tags dropped
  EXPECT_EQ(f.rows[0].id, "FinEntity:entity-given:0000");
  EXPECT_EQ(f.rows[0].gold.find("entity_0000_0_17")->s, "Positive");
  EXPECT_EQ(payload_sha256(f.rows[0]), "5970e9cd074221f074233f3050b53eac4be6c7baaa60c4507d693c7a1dfd21a0");
  lines.clear();
  for (const Row& r : f.rows) lines += "39:FinEntity-entity-given:" + r.id + "\t" + payload_sha256(r) + "\n";
  EXPECT_EQ(sha256_hex(lines), "be2d1ec6c4af47d4d7657024c7f6d31fafd1007c57560bf717e817348f67b262");
}

// CRUXEval: candidates are Python literals, deduplicated by Python ==, shuffled by CPython's
// string-seeded Mersenne Twister, shown as repr(); the mean of 1 / options is the kit's chance.
TEST(Eval, CruxevalRowsAndPayloads) {
  if (!std::filesystem::exists(data_dir() + "/crux.jsonl")) GTEST_SKIP() << data_dir() << " is not here";
  const Benchmark c = build("cruxeval", data_dir());
  ASSERT_EQ(c.rows.size(), 570u);
  EXPECT_EQ(c.chance, 0.36971874129768867);  // the kit's chance-baselines.json value, to the last bit
  EXPECT_EQ(c.rows[0].id, "CRUXEval-output-choice:test:sample_0");
  EXPECT_EQ(c.rows[0].gold.find("answer")->s, "option_3");
  EXPECT_EQ(payload_sha256(c.rows[0]), "6df1a65d8bd829086dd9509e3e2b62f4acbe5028895b85059cbe9bb90ecc0854");
  std::string lines;
  for (const Row& r : c.rows) lines += "43:CRUXEval-output-choice:" + r.id + "\t" + payload_sha256(r) + "\n";
  EXPECT_EQ(sha256_hex(lines), "9891d4b47c57ac0e4c298d9caf9d456bbad50220ca19676fc63ad9014f916f1c");
}

TEST(Eval, PythonLiteralsReprAndEquality) {
  auto rt = [](const std::string& t) {
    auto v = literal_eval(t);
    return v ? repr(*v) : std::string("<fails>");
  };
  EXPECT_EQ(rt("\"it's\""), "\"it's\"");
  EXPECT_EQ(rt("'say \"hi\"'"), "'say \"hi\"'");
  EXPECT_EQ(rt("'both \\' \"'"), "'both \\' \"'");
  EXPECT_EQ(rt("(1,)"), "(1,)");
  EXPECT_EQ(rt("( 1 )"), "1");
  EXPECT_EQ(rt("[1, 2.50, -3e+20, True, None]"), "[1, 2.5, -3e+20, True, None]");
  EXPECT_EQ(rt("{'b': 1, 'a': [ ], }"), "{'b': 1, 'a': []}");
  EXPECT_EQ(rt("b'\\x00a\\n'"), "b'\\x00a\\n'");
  EXPECT_EQ(rt("'\\u00e9\\x85\\t'"), "'\u00e9\\x85\\t'");
  EXPECT_EQ(rt("'a' \"b\""), "'ab'");
  EXPECT_EQ(rt("set()"), "set()");
  EXPECT_EQ(rt("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(rt("{[1]: 2}"), "<fails>");  // unhashable key: TypeError
  EXPECT_EQ(rt("f(1)"), "<fails>");
  EXPECT_EQ(rt("1 +"), "<fails>");
  auto eq = [](const std::string& a, const std::string& b) { return py_equal(*literal_eval(a), *literal_eval(b)); };
  EXPECT_TRUE(eq("1", "1.0"));
  EXPECT_TRUE(eq("True", "1"));
  EXPECT_TRUE(eq("{1: 'a', 2: 'b'}", "{2: 'b', 1: 'a'}"));
  EXPECT_FALSE(eq("[1, 2]", "(1, 2)"));
  EXPECT_FALSE(eq("'1'", "1"));
  EXPECT_FALSE(eq("b'a'", "'a'"));
  // CPython's random.Random(s).shuffle is a permutation, the same every time
  const auto p = python_shuffle("20260917:CRUX:sample_0", 5), q = python_shuffle("20260917:CRUX:sample_0", 5);
  EXPECT_EQ(p, q);
  std::vector<size_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(Eval, CsvFieldsWithQuotesCommasAndNewlines) {
  const std::string d = testing::TempDir() + "clefrt-eval-csv-" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  std::string cats = "[";
  for (int i = 0; i < 77; ++i) cats += std::string(i ? "," : "") + "\"cat_" + std::to_string(i) + "\"";
  std::ofstream(d + "/banking77_categories.json") << cats << "]";
  std::ofstream(d + "/banking77_test.csv") << "text,category\nplain,cat_3\n\"a, \"\"quoted\"\"\nline\",cat_76\r\n";
  const Benchmark b = build("banking77", d);
  ASSERT_EQ(b.rows.size(), 2u);
  EXPECT_EQ(b.rows[1].request.find("questions")->find("q1")->find("instructions")->s,
            "Classify the banking intent of this user request:\na, \"quoted\"\nline");
  EXPECT_EQ(b.rows[1].gold.find("q1")->s, "option_76");
  std::ofstream(d + "/banking77_test.csv") << "text,category\nplain,no_such\n";
  EXPECT_THROW(build("banking77", d), Error);
  EXPECT_THROW(build("cruxeval", d), Error);  // its files are not there: named
  EXPECT_THROW(build("finentity", d), Error);  // its file is not there: named
}

TEST(Eval, MacroF1CountsLabelsSeenInGoldOrPredictions) {
  // a: tp 1, fn 1 -> 2/3; b: tp 1, fp 1, fn 1 -> 1/2; c: fp 1 (only predicted) -> 0
  const double f = macro_f1({{"a", "a"}, {"a", "b"}, {"b", "b"}, {"b", "c"}});
  EXPECT_NEAR(f, (2.0 / 3 + 0.5 + 0) / 3, 1e-15);
  EXPECT_EQ(macro_f1({}), 0.0);
}

// FinEntity pools every entity question of the answered documents into one macro-F1.
TEST(Eval, ManyQuestionsPoolIntoOneScore) {
  Benchmark b{"finentity", "FinEntity", "macro_f1", 0.3201, {}};
  Row r;
  r.id = "d0";
  r.request = json::parse(R"({"state":{},"questions":{"e1":{"type":"choice","criteria":{"Negative":"Negative","Positive":"Positive"}},)"
                          R"("e2":{"type":"choice","criteria":{"Negative":"Negative","Positive":"Positive"}}}})");
  r.gold = json::parse(R"({"e1":"Positive","e2":"Negative"})");
  b.rows = {r};
  const Score s = score(b, {{true, json::parse(R"({"e1":{"choice":"Positive"},"e2":{"choice":"Positive"}})")}});
  // Positive: tp 1, fp 1 -> 2/3; Negative: fn 1 -> 0
  EXPECT_NEAR(s.native, 1.0 / 3, 1e-15);
  EXPECT_EQ(s.answered, 1u);
}

// CRUXEval's track rule: correct over all rows (unsupported and failed rows count 0), each figure
// rounded to 4 places.
TEST(Eval, AccuracyCountsUnansweredRowsAsWrong) {
  Benchmark b{"cruxeval", "CRUXEval", "accuracy", 0.5, {}};
  for (int i = 0; i < 3; ++i) {
    Row r;
    r.id = std::to_string(i);
    r.request = json::parse(R"({"state":{},"questions":{"answer":{"type":"choice","criteria":{"option_0":"1","option_1":"2"}}}})");
    r.gold = json::parse(R"({"answer":"option_1"})");
    b.rows.push_back(r);
  }
  auto ans = [](const char* c) { return json::parse(std::string(R"({"answer":{"choice":")") + c + "\"}}"); };
  const Score s = score(b, {{true, ans("option_1")}, {true, ans("option_0")}, {false, {}}});  // right, wrong, unsupported
  EXPECT_DOUBLE_EQ(s.native, 0.5);                      // over the answered
  EXPECT_DOUBLE_EQ(s.raw, 0.3333);                      // over all rows, rounded
  EXPECT_DOUBLE_EQ(s.coverage, 0.6667);
  EXPECT_DOUBLE_EQ(s.skill, 0.0);                       // below chance: clipped
}

TEST(Eval, RawIsRoundedNativeTimesCoverageAndSkillIsChanceCorrected) {
  Benchmark b{"banking77", "BANKING77", "macro_f1", 0.0127, {}};
  for (int i = 0; i < 4; ++i) {
    Row r;
    r.id = "x:" + std::to_string(i);
    r.request = json::parse(R"({"state":{},"questions":{"q1":{"type":"choice","criteria":{"option_0":"a","option_1":"b"}}}})");
    r.gold = json::parse(i % 2 ? R"({"q1":"option_1"})" : R"({"q1":"option_0"})");
    b.rows.push_back(r);
  }
  auto ans = [](const char* c) { return json::parse(std::string(R"({"q1":{"type":"choice","choice":")") + c + "\"}}"); };
  // rows 0-2 answered (row 2 wrong), row 3 unanswered
  const Score s = score(b, {{true, ans("option_0")}, {true, ans("option_1")}, {true, ans("option_1")}, {false, {}}});
  EXPECT_EQ(s.answered, 3u);
  EXPECT_DOUBLE_EQ(s.coverage, 0.75);
  // pairs (a,a) (b,b) (a,b): a tp1 fn1 -> 2/3; b tp1 fp1 -> 2/3
  EXPECT_NEAR(s.native, 2.0 / 3, 1e-15);
  EXPECT_DOUBLE_EQ(s.raw, 0.6667 * 0.75);
  EXPECT_DOUBLE_EQ(s.skill, (0.6667 * 0.75 - 0.0127) / (1 - 0.0127));
}

}  // namespace
}  // namespace clefrt::eval

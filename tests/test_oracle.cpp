// The CPU engine against the reference: small random Clef folders built by transformers'
// Qwen3_5ForConditionalGeneration with a joint head written from the spec in PyTorch, run in
// fp32 and in fp64 on the GPU machine (tools/reference/make_oracle.py). Target: every
// probability within 1e-4 of the reference, and the same token ids.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/json.h"
#include "engine/engine_core.h"
#include "test_util.h"

namespace clefrt {
namespace {

// CTest's Oracle.UnderAvx2Kernels runs these tests with OPENBLAS_CORETYPE=Haswell: a CPU without
// AVX2 cannot run those kernels.
bool forced_kernels_unavailable() {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  return core && std::string(core) == "Haswell" && !__builtin_cpu_supports("avx2");
}

struct Agreement {
  size_t n = 0;
  double worst = 0, worst_f64 = 0, ref_worst_f64 = 0;     // ours vs fp32 ref, ours vs fp64 ref, fp32 ref vs fp64 ref
  double sq_f64 = 0, ref_sq_f64 = 0;                      // sums of squares of the last two, per request
  size_t over = 0, over_f64 = 0, ref_over_f64 = 0;        // requests at or over 1e-4 (printed, not asserted)
  double rms_f64() const { return std::sqrt(sq_f64 / double(n)); }
  double ref_rms_f64() const { return std::sqrt(ref_sq_f64 / double(n)); }
};

// Each fixture line holds the fp32 reference's probabilities ("probs") and the same forward run in
// fp64 ("probs_f64": make_oracle.py with ORACLE_DTYPE=float64, RoPE angles in fp32 as the spec
// defines them), the exact value the fp32 computations approximate.
Agreement check_folder(const std::string& name) {
  auto engine = EngineCore::load(test::source_path("tests/fixtures/oracle/" + name));
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/" + name + ".expected.jsonl")));
  std::string line;
  size_t id_mismatch = 0;
  Agreement a;
  while (std::getline(in, line)) {
    auto rec = json::parse(line);
    Request req = parse_request(*rec.find("request"));
    Encoded enc = engine->encoder().encode(req);
    std::vector<int32_t> want_ids;
    for (const auto& v : rec.find("input_ids")->arr) want_ids.push_back(int32_t(v.i));
    if (enc.input_ids != want_ids) {
      ++id_mismatch;
      continue;
    }
    auto probs = engine->probs({&enc})[0];
    const json::Value* f64 = rec.find("probs_f64");
    EXPECT_TRUE(f64) << name << ": fixture line without probs_f64";
    if (!f64) break;
    const test::Probs ref = test::probs_of(*rec.find("probs")), exact = test::probs_of(*f64);
    const double d32 = test::worst_diff(probs, ref), d64 = test::worst_diff(probs, exact), r64 = test::worst_diff(ref, exact);
    if (std::getenv("CLEFRT_ORACLE_VERBOSE"))
      std::cout << "  request " << a.n << ": " << enc.input_ids.size() << " tokens, vs fp32 ref " << d32 << ", vs fp64 " << d64
                << ", fp32 ref vs fp64 " << r64 << "\n";
    a.worst = std::max(a.worst, d32);
    a.worst_f64 = std::max(a.worst_f64, d64);
    a.ref_worst_f64 = std::max(a.ref_worst_f64, r64);
    a.sq_f64 += d64 * d64;
    a.ref_sq_f64 += r64 * r64;
    a.over += d32 >= 1e-4;
    a.over_f64 += d64 >= 1e-4;
    a.ref_over_f64 += r64 >= 1e-4;
    ++a.n;
  }
  EXPECT_EQ(id_mismatch, 0u);
  EXPECT_GE(a.n, 100u);
  std::cout << "[ oracle  ] " << name << ": " << a.n << " requests; worst |p - p_ref32| = " << a.worst << " (" << a.over
            << " at or over 1e-4), worst |p - p_ref64| = " << a.worst_f64 << " (" << a.over_f64
            << ", rms " << a.rms_f64() << "); the fp32 reference itself vs fp64: worst " << a.ref_worst_f64 << " ("
            << a.ref_over_f64 << ", rms " << a.ref_rms_f64() << ")\n";
  return a;
}

// Target 1e-4 (issue 3). tiny-b meets it against both references on every request. tiny-a
// (8 layers, Hv > Hk) is at the edge of what fp32 arithmetic resolves: the fp32 reference itself
// is up to 1.84e-4 off the fp64 value of the same forward, and which requests of ours cross 1e-4
// depends on the BLAS kernels' summation order (OpenBLAS' AVX2 and AVX-512 kernels cross on
// different requests). So the bounds are stated against the exact value and scaled by how well
// fp32 resolves this model: no request further from the fp64 value than 2.5e-4, and over all
// requests the engine no further from it (root mean square) than 1.5x the fp32 reference is.
// A lost bit of accuracy anywhere in the forward (a bf16 rounding, a wrong epsilon) moves these by
// orders of magnitude; a different CPU's kernels move them by tens of percent.
TEST(Oracle, TinyA_HvGreaterThanHk_TwoAttentionLayers) {
  if (forced_kernels_unavailable()) GTEST_SKIP() << "OPENBLAS_CORETYPE=Haswell needs AVX2";
  Agreement a = check_folder("tiny-a");
  EXPECT_LT(a.worst, 2.5e-4);
  EXPECT_LT(a.worst_f64, 2.5e-4);
  EXPECT_LE(a.rms_f64(), 1.5 * a.ref_rms_f64()) << "further from the fp64 value than the fp32 reference: the engine lost accuracy";
}

// Our chunked prefill against the recurrent definition, whole answers, every tiny-a request
// (the GDN op itself is checked to 1e-5 in test_cpu_ops). The two forms are two fp32 summation
// orders of one forward on a model at the edge of what fp32 resolves, so like the folder tests
// above the bound is how well fp32 resolves it, not one CPU's figure: measured worst 3.5e-5 /
// 3.8e-5 with OpenBLAS' AVX-512 / AVX2 kernels, 9.4e-5 with the generic (Prescott) kernels it
// falls back to on CPUs 0.3.21 does not know. No request apart by 2.5e-4, and the root mean
// square of the differences within the fp32 reference's own distance from the fp64 value. A
// wrong chunk boundary or decay moves answers by orders of magnitude more.
// Every third request and the three longest (9,791 to 12,086 tokens, ~190 GDN chunks): two
// forwards per request of all 120 made this the suite's longest test, and a slow CI machine ran
// it past CTest's 900 s limit. Progress goes to stdout so a timeout shows how far it got.
TEST(Oracle, TinyA_ChunkedAgreesWithRecurrent) {
  auto engine = EngineCore::load(test::source_path("tests/fixtures/oracle/tiny-a"));
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-a.expected.jsonl")));
  std::string line;
  double worst = 0, sq = 0, ref_sq = 0;
  size_t n = 0, at = 0;
  while (std::getline(in, line)) {
    const json::Value rec = json::parse(line);
    if (at++ % 3 && rec.find("input_ids")->arr.size() < 9000) continue;
    Encoded enc = engine->encoder().encode(parse_request(*rec.find("request")));
    const double d = test::worst_diff(engine->probs({&enc}, model::GdnForm::Chunked)[0], engine->probs({&enc}, model::GdnForm::Recurrent)[0]);
    const double r = test::worst_diff(test::probs_of(*rec.find("probs")), test::probs_of(*rec.find("probs_f64")));
    worst = std::max(worst, d);
    sq += d * d;
    ref_sq += r * r;
    if (++n % 10 == 0) std::cout << "[ oracle  ] " << n << " requests, " << enc.input_ids.size() << " tokens last, worst so far " << worst << std::endl;
  }
  const double rms = std::sqrt(sq / double(n)), ref_rms = std::sqrt(ref_sq / double(n));
  std::cout << "[ oracle  ] tiny-a: chunked vs recurrent GDN over " << n << " requests, worst |dp| = " << worst << ", rms " << rms
            << " (the fp32 reference vs fp64: rms " << ref_rms << ")\n";
  EXPECT_GE(n, 40u);
  EXPECT_LT(worst, 2.5e-4);
  EXPECT_LE(rms, ref_rms);
}
TEST(Oracle, TinyB_WiderHead_TwoRoutingAndDecoderLayers) {
  if (forced_kernels_unavailable()) GTEST_SKIP() << "OPENBLAS_CORETYPE=Haswell needs AVX2";
  Agreement a = check_folder("tiny-b");
  EXPECT_LT(a.worst, 1e-4);
  EXPECT_LT(a.worst_f64, 1e-4);
  EXPECT_LE(a.rms_f64(), 1.5 * a.ref_rms_f64());
}

}  // namespace
}  // namespace clefrt

// The prefix cache on the GPU (engine_core.cpp gpu_forward; cuda/model/forward.h SeqPrefix): a
// request that continues a cached state answers what it answers without the cache, bit for
// bit, across state lengths, question sets, batch mixes, images, GDN passes and evictions. The
// Forward seam is checked directly too, at boundaries on and off a GDN pass's edge, and a state
// from another text changes the answer (the comparisons can fail).
#include <gtest/gtest.h>

#include <clefrt/clefrt.h>

#include <chrono>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/model/device_model.h"
#include "cuda/model/forward.h"
#include "image/png_write.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/weights.h"
#include "prefix_util.h"
#include "schema/images.h"
#include "test_cuda_util.h"

namespace clefrt {
namespace {

using test::Answer;
using test::body;
using test::device_model_of;
using test::run;
using test::run_batch;
using test::state_text;

// The well-conditioned small model of CudaEngine.WellConditionedAgainstCpuFp32 (it has a
// vision tower: CudaVision uses it for images).
const std::string& small_dir() {
  static const std::string d = test::synth_folder("calm-small", 5, "small", 0.5f);
  return d;
}

// A prefix state buffer of n tokens for the device model.
cuda::DevPrefixState prefix_state(const cuda::DevModel& dm, int64_t n) {
  cuda::DevPrefixState s;
  s.capacity = n;
  s.buf = cuda::DeviceBuffer(cuda::PrefixLayout::of(dm, n).bytes, "test prefix state");
  return s;
}

std::unique_ptr<Engine> open_gpu(double cache_gib, bool lean = false) {
  EngineOptions o;
  o.device = Device::Cuda;
  o.prefix_cache_gib = cache_gib;
  o.max_length = 16384;
  o.offload_embeddings = lean;  // the lean plan: GDN layers in passes of 16 chunks
  return Engine::load(small_dir(), o);
}

size_t reusable(size_t state_end) { return test::reusable(state_end, 64); }  // the GPU's granularity

TEST(CudaPrefix, WarmEqualsColdBitForBitAcrossStateLengths) {
  NEED_GPU();
  auto cold = open_gpu(0), warm = open_gpu(1);
  // states from a few tokens (no boundary) to ~10,000, ending anywhere in a chunk
  const size_t hits = test::check_warm_equals_cold(*cold, *warm, {2, 40, 150, 420, 1000, 2300, 7600}, 64);
  const PrefixCacheStats st = warm->prefix_cache();
  EXPECT_TRUE(st.enabled);
  EXPECT_EQ(st.granularity, 64);
  EXPECT_EQ(st.hits, hits);
  EXPECT_GE(hits, 12u);
  EXPECT_GT(st.hit_tokens, 9000u * 2);
  EXPECT_FALSE(cold->prefix_cache().enabled);
  std::cout << "[ cuda    ] prefix cache: " << st.entries << " entries, " << (st.bytes >> 20) << " MiB, " << st.hits << " hits, "
            << st.hit_tokens << " tokens read\n";
}

TEST(CudaPrefix, BatchMixesGiveEachRequestItsColdAnswer) {
  NEED_GPU();
  auto cold = open_gpu(0), warm = open_gpu(1);
  const std::string a = state_text(600, 1), b = state_text(900, 2), c = state_text(30, 3), d = state_text(1300, 4);
  // one forward: a twice (new to the cache: both compute it, one state is kept), b, a short one,
  // a state extending a's text (a prefix of its own), b again
  const std::vector<std::string> bodies = {body(a, 0), body(b, 1), body(a, 2), body(c, 0), body(a + " and more words after it", 1), body(b, 2)};
  const auto w = run_batch(*warm, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(w[i].probs, run(*cold, bodies[i]).probs) << "request " << i;
    EXPECT_EQ(w[i].cached, 0u) << "request " << i << ": nothing was cached before this batch";
  }
  // hits and a new state in one forward
  const std::vector<std::string> mixed = {body(a, 1), body(d, 0), body(a + " and more words after it", 2), body(d, 1)};
  const auto m = run_batch(*warm, mixed);
  for (size_t i = 0; i < mixed.size(); ++i) EXPECT_EQ(m[i].probs, run(*cold, mixed[i]).probs) << "mixed request " << i;
  EXPECT_EQ(m[0].cached, reusable(m[0].state_end));
  EXPECT_EQ(m[1].cached, 0u);
  EXPECT_EQ(m[2].cached, reusable(m[2].state_end));
  // and again, all from the cache now
  const auto again = run_batch(*warm, bodies);
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(again[i].probs, w[i].probs) << "request " << i;
    EXPECT_EQ(again[i].cached, reusable(again[i].state_end)) << "request " << i;
  }
  EXPECT_EQ(run(*warm, body(d, 2)).cached, reusable(m[1].state_end));
}

// Images are in the key by their bytes (test::check_images_keyed_by_bytes; on the GPU a hit also
// skips the tower for the images inside the cached prefix); and with two images and states of a
// few words the boundary lands before, between or inside them.
TEST(CudaPrefix, ImagesAreKeyedByTheirBytes) {
  NEED_GPU();
  auto warm = open_gpu(1), cold = open_gpu(0);
  test::check_images_keyed_by_bytes(*warm, *cold, 64);
  std::vector<uint8_t> noise(256 * 256 * 3);
  std::mt19937 rng(9);
  for (auto& v : noise) v = uint8_t(rng());
  const std::string x = synthetic_png(256, 256), y = encode_png_rgb(noise.data(), 256, 256);
  for (size_t words : {1, 4, 12, 30, 60}) {
    const std::string t = state_text(words, uint32_t(70 + words));
    for (int qset = 0; qset < 2; ++qset)
      EXPECT_EQ(run(*warm, test::with_images(t, qset, {&x, &y})).probs, run(*cold, test::with_images(t, qset, {&x, &y})).probs)
          << words << " words, two images";
  }
}

// FP8 at the Clef models' GDN head width (small-gdn128): there the in_proj's scales are applied
// by its readers (the conv, the gated norm, the conv rows a state leaves: gdn_conv_prep's fused
// form) instead of a pass over its output. Warm equals cold bit for bit, in one pass and in the
// lean plan's passes of 16 chunks (its in_proj rows recomputed before each pass), and the lean
// plan gives the plain plan's answers.
TEST(CudaPrefix, Fp8AtClefGdnHeadsWarmEqualsCold) {
  NEED_GPU();
  const std::string dir = test::synth_folder("calm-small-gdn128", 5, "small-gdn128", 0.5f);
  auto open = [&](double cache_gib, bool lean) {
    EngineOptions o;
    o.device = Device::Cuda;
    o.quant = QuantMode::FP8;
    o.prefix_cache_gib = cache_gib;
    o.max_length = 16384;
    o.offload_embeddings = lean;
    return Engine::load(dir, o);
  };
  std::vector<Answer> plain;
  for (bool lean : {false, true}) {
    auto cold = open(0, lean), warm = open(1, lean);
    const size_t hits = test::check_warm_equals_cold(*cold, *warm, {40, 420, 2300}, 64);
    EXPECT_GE(hits, 4u) << (lean ? "lean plan" : "plain plan");
    for (size_t i = 0; i < 2; ++i) {
      const Answer a = run(*cold, body(state_text(2300, uint32_t(7 + i)), int(i)));
      if (!lean) plain.push_back(a);
      else EXPECT_EQ(a.probs, plain[i].probs) << "lean plan vs plain plan, request " << i;
    }
  }
}

// The lean plan (GDN layers in passes of 16 chunks: boundaries land on a pass's edge and inside
// passes) under a budget of one entry: every answer is the plain plan's without a cache.
TEST(CudaPrefix, LeanPlanAndEvictionKeepAnswersExact) {
  NEED_GPU();
  const std::string a = state_text(1500, 4), b = state_text(1500, 5);
  const size_t one = test::one_entry_bytes([](double gib) { return open_gpu(gib); }, a);
  ASSERT_GT(one, 0u);
  auto cold = open_gpu(0);
  auto warm = open_gpu(double(one) * 1.5 / double(size_t(1) << 30), true);  // room for one of a, b
  test::check_eviction_keeps_answers(*cold, *warm, a, b);
}

// The host tier (--prefix-cache-host-gib) under a GPU budget of one entry: what the budget
// evicts waits in pinned host memory and comes back by a copy on its next hit; every answer is
// the cold engine's, the hits after an eviction are host hits.
TEST(CudaPrefix, HostTierBringsEvictedPrefixesBackExactly) {
  NEED_GPU();
  const std::string a = state_text(1500, 6), b = state_text(1500, 7);
  const size_t one = test::one_entry_bytes([](double gib) { return open_gpu(gib); }, a);
  ASSERT_GT(one, 0u);
  auto cold = open_gpu(0);
  EngineOptions o;
  o.device = Device::Cuda;
  o.prefix_cache_gib = double(one) * 1.5 / double(size_t(1) << 30);  // room for one of a, b
  o.prefix_cache_host_gib = double(one) * 4 / double(size_t(1) << 30);
  o.max_length = 16384;
  auto warm = Engine::load(small_dir(), o);
  // a, b (a to the host tier), a again (back from it; b to it), b again (back from it)
  const std::vector<std::pair<const std::string*, bool>> order = {{&a, false}, {&b, false}, {&a, true}, {&b, true}};
  for (size_t i = 0; i < order.size(); ++i) {
    const Answer w = run(*warm, body(*order[i].first, int(i % 3)));
    EXPECT_EQ(w.probs, run(*cold, body(*order[i].first, int(i % 3))).probs) << "step " << i;
    EXPECT_EQ(w.cached > 0, order[i].second) << "step " << i;
  }
  const PrefixCacheStats st = warm->prefix_cache();
  EXPECT_EQ(st.host_hits, 2u);
  EXPECT_GE(st.to_host, 2u);
  EXPECT_EQ(st.entries, 1u);
  EXPECT_LE(st.host_bytes, st.host_budget_bytes);
  std::cout << "[ cuda    ] host tier: " << st.host_hits << " hits copied back, " << st.to_host << " entries copied out, "
            << st.host_bytes << " bytes held\n";
}

// The seam itself: one request's state left at several boundaries (a pass's first chunk, inside
// a pass, the first chunk) does not change its answer, and continuing each gives the same bits
// as the whole, alone or in a batch with others that leave or continue states; a state from
// another text, continued as if it were this one's, does change it.
TEST(CudaPrefix, ForwardContinuesAndLeavesStatesExactly) {
  NEED_GPU();
  const std::string dir = small_dir();
  auto core = EngineCore::load(dir, CoreOptions{});
  const Encoded e = core->encoder().encode(parse_request(body(state_text(1800, 21), 0)));
  const Encoded f = core->encoder().encode(parse_request(body(state_text(1800, 22), 1)));
  ASSERT_GT(e.state_span.end, 2200);
  ASSERT_GT(f.state_span.end, 2200);
  const cuda::DevModel dm = device_model_of(dir);
  auto state = [&](int64_t n) { return prefix_state(dm, n); };
  for (const int64_t pass : {int64_t(16), int64_t(0)}) {
    cuda::ForwardOptions fo;
    fo.gdn_pass_chunks = pass;
    cuda::Forward fwd(dm, fo);
    const model::Batch be = model::batch_of({&e}), bf = model::batch_of({&f}), both = model::batch_of({&e, &f});
    const auto cold_e = fwd.run(be), cold_f = fwd.run(bf);
    const std::string what = pass ? "passes of 16 chunks" : "one pass";
    std::vector<cuda::DevPrefixState> se, sf;
    for (int64_t n : {64, 1024, 1088, 2048}) {
      se.push_back(state(n));
      sf.push_back(state(n));
      EXPECT_EQ(fwd.run(be, {{nullptr, &se.back(), n}}), cold_e) << what << ": leaving a state at " << n;
      EXPECT_EQ(se.back().length, n);
      EXPECT_EQ(fwd.run(both, {{nullptr, nullptr, 0}, {nullptr, &sf.back(), n}}), fwd.run(both)) << what << ": f leaves a state at " << n;
    }
    for (size_t i = 0; i < se.size(); ++i) {
      const int64_t n = se[i].length;
      EXPECT_EQ(fwd.run(be, {{&se[i], nullptr, 0}}), cold_e) << what << ": continuing after " << n;
      // with f continuing its own state and leaving a longer one
      cuda::DevPrefixState longer = state(2176);
      const auto two = fwd.run(both, {{&se[i], nullptr, 0}, {&sf[i], &longer, 2176}});
      EXPECT_EQ(two[0], cold_e[0]) << what << ": e after " << n << " in a batch";
      EXPECT_EQ(two[1], cold_f[0]) << what << ": f after " << n << " in a batch, leaving 2176";
      EXPECT_EQ(fwd.run(bf, {{&longer, nullptr, 0}}), cold_f) << what << ": f after the 2176 state left by a continuing batch";
    }
    EXPECT_NE(fwd.run(be, {{&sf[2], nullptr, 0}}), cold_e) << what << ": f's state under e's suffix";
    // a long request's steps: one state grown in place (the first part of e, no questions, then
    // more), its last step ending at a part's end; then the rest with the head
    cuda::DevPrefixState grown = state(2048);
    int64_t done = 0;
    for (int64_t upto : {64, 1088, 1152, 2048}) {
      model::Batch part = be;
      part[0].length = upto;
      part[0].questions.clear();
      EXPECT_TRUE(fwd.run(part, {{done ? &grown : nullptr, &grown, upto}})[0].empty());
      EXPECT_EQ(grown.length, upto);
      done = upto;
    }
    EXPECT_EQ(fwd.run(be, {{&grown, nullptr, 0}}), cold_e) << what << ": after steps grown in place to 2048";
  }
}

// CUDA graphs over batches that continue cached prefixes (ForwardOptions::graph_after): the
// graphed Forward gives the eager one's bits at every replay, each replay continuing other state
// buffers (a replay points the graph's copies at them: with the states swapped between the
// sequences the answers change as the eager ones do); a batch leaving a state is not graphed.
TEST(CudaPrefix, GraphReplayContinuesOtherStatesExactly) {
  NEED_GPU();
  const std::string dir = small_dir();
  auto core = EngineCore::load(dir, CoreOptions{});
  const Encoded e = core->encoder().encode(parse_request(body(state_text(1800, 31), 0)));
  const Encoded f = core->encoder().encode(parse_request(body(state_text(1800, 32), 1)));
  ASSERT_GT(e.state_span.end, 1100);
  ASSERT_GT(f.state_span.end, 1100);
  const cuda::DevModel dm = device_model_of(dir);
  const int64_t n = 1024;
  auto state = [&] { return prefix_state(dm, n); };
  cuda::ForwardOptions fo;
  cuda::Forward eager(dm, fo);
  fo.graph_after = 2;
  cuda::Forward graphed(dm, fo);
  const model::Batch be = model::batch_of({&e}), bf = model::batch_of({&f}), both = model::batch_of({&e, &f});
  std::vector<cuda::DevPrefixState> se, sf;  // three buffers each of e's and f's state at n tokens
  se.reserve(3);
  sf.reserve(3);
  for (int k = 0; k < 3; ++k) {
    se.push_back(state());
    sf.push_back(state());
    eager.run(be, {{nullptr, &se.back(), n}});
    eager.run(bf, {{nullptr, &sf.back(), n}});
  }
  const auto want = eager.run(both, {{&se[0], nullptr, 0}, {&sf[0], nullptr, 0}});
  EXPECT_EQ(want, eager.run(both)) << "continuing the states gives the cold answers";
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(graphed.run(both, {{&se[k], nullptr, 0}, {&sf[k], nullptr, 0}}), want) << "run " << k << " (eager, captured, replayed)";
  EXPECT_EQ(graphed.graph_replays(), 2u);
  const auto swapped_want = eager.run(both, {{&sf[1], nullptr, 0}, {&se[2], nullptr, 0}});
  ASSERT_NE(swapped_want, want) << "the swapped states change nothing: the test cannot tell";
  EXPECT_EQ(graphed.run(both, {{&sf[1], nullptr, 0}, {&se[2], nullptr, 0}}), swapped_want) << "replayed with the states swapped";
  EXPECT_EQ(graphed.graph_replays(), 3u);
  EXPECT_EQ(graphed.run(both, {{&se[2], nullptr, 0}, {&sf[1], nullptr, 0}}), want) << "replayed again";
  EXPECT_EQ(graphed.graph_replays(), 4u);
  // leaving a state: eager every time, the same bits
  const auto cold_e = eager.run(be);
  for (int k = 0; k < 3; ++k) {
    cuda::DevPrefixState left = state();
    EXPECT_EQ(graphed.run(be, {{nullptr, &left, n}}), cold_e) << "leaving a state, run " << k;
    EXPECT_EQ(graphed.run(be, {{&left, nullptr, 0}}), cold_e) << "continuing the state left in run " << k;
  }
  EXPECT_EQ(graphed.graph_replays(), 6u) << "the continuing batch's second and third sightings run its graph, the leaving ones none";
}

// A long request in steps on the GPU (EngineCore::start / step / finish, what the scheduler runs)
// gives the bits of one forward, for step sizes from one chunk up, with and without the cache;
// with the cache its state goes there at the boundary and the next question set continues it.
TEST(CudaPrefix, StepsGiveTheBitsOfOneForward) {
  NEED_GPU();
  CoreOptions plain;
  plain.device = Device::Cuda;
  CoreOptions cached = plain;
  cached.prefix_cache_bytes = size_t(1) << 30;
  auto one = EngineCore::load(small_dir(), plain), warm = EngineCore::load(small_dir(), cached);
  const std::string s = state_text(3000, 31);
  for (int qset = 0; qset < 2; ++qset) {
    const Encoded e = one->encoder().encode(parse_request(body(s, qset)));
    const model::Sequence seq = model::sequence_of(e);
    const auto whole = one->probs(model::Batch{seq})[0];
    for (int64_t step : {64, 1000, 2048, 100000}) {
      for (EngineCore* core : {one.get(), warm.get()}) {
        auto r = core->start(seq);
        int64_t steps = 0;
        while (!core->step(*r, step)) ++steps;
        size_t from_cache = 0;
        EXPECT_EQ(core->finish(*r, &from_cache), whole) << "steps of " << step << (core == one.get() ? "" : ", with the cache") << ", question set " << qset;
        if (core == one.get()) {
          EXPECT_EQ(from_cache, 0u);
          if (step == 64) EXPECT_GT(steps, 30);
        }
      }
    }
    // the first run left its state at the boundary: every later one continues it (3 + 4)
    if (qset == 1) EXPECT_EQ(warm->prefix_cache_stats().hits, 7u);
  }
}

// Steps a group of layers a call (the residual stream held between groups; the NVFP4 staging
// schedule started at a group's first layer): the bits of one forward, in bf16 and in staged
// NVFP4 with the lean plan, with and without the cache.
TEST(CudaPrefix, StepsInLayerGroupsGiveTheBitsOfOneForward) {
  NEED_GPU();
  const std::string s = state_text(3000, 37);
  for (const bool nvfp4 : {false, true}) {
    CoreOptions plain;
    plain.device = Device::Cuda;
    if (nvfp4) {
      plain.quant = QuantMode::NVFP4_W4A16;
      plain.offload_embeddings = true;  // the lean plan, NVFP4 staged (LinearRunner's schedule)
    }
    CoreOptions cached = plain;
    cached.prefix_cache_bytes = size_t(1) << 30;
    auto one = EngineCore::load(small_dir(), plain), warm = EngineCore::load(small_dir(), cached);
    const Encoded e = one->encoder().encode(parse_request(body(s, 1)));
    const model::Sequence seq = model::sequence_of(e);
    const auto whole = one->probs(model::Batch{seq})[0];
    for (int64_t step : {64, 1000})
      for (int64_t layers : {1, 3})
        for (EngineCore* core : {one.get(), warm.get()}) {
          auto r = core->start(seq);
          int64_t calls = 0;
          while (!core->step(*r, step, layers)) ++calls;
          const int64_t groups = (8 + layers - 1) / layers;  // the small model's 8 layers
          if (core == one.get()) {  // whole steps, each `groups` calls
            EXPECT_EQ((calls + 1) % groups, 0) << "steps of " << step << ", " << layers << " layers a call";
            EXPECT_GE(calls + 1, 2 * groups) << "steps of " << step << ", " << layers << " layers a call";
          }
          EXPECT_EQ(core->finish(*r), whole) << (nvfp4 ? "nvfp4 staged, " : "bf16, ") << "steps of " << step << ", " << layers
                                             << " layers a call" << (core == one.get() ? "" : ", with the cache");
        }
  }
}

// Steps around images (each taken whole by the step it starts in, also at one chunk a step):
// the bits of one forward.
TEST(CudaPrefix, StepsAroundImagesGiveTheBitsOfOneForward) {
  NEED_GPU();
  CoreOptions o;
  o.device = Device::Cuda;
  auto core = EngineCore::load(small_dir(), o);
  std::vector<uint8_t> noise(256 * 256 * 3);
  std::mt19937 rng(3);
  for (auto& v : noise) v = uint8_t(rng());
  json::Value b = json::parse(body(state_text(900, 61), 2));
  json::Value arr = json::Value::array();
  for (const std::string& png : {synthetic_png(256, 256), encode_png_rgb(noise.data(), 256, 256), synthetic_png(320, 192)})
    arr.arr.push_back(json::Value::string("data:image/png;base64," + base64_encode(png)));
  b.add("images", arr);
  const Request req = parse_request(json::write(b));
  const Encoded e = core->encoder().encode(req);
  const auto media = core->image_media(req, e);
  ASSERT_TRUE(media);
  const model::Sequence seq = model::sequence_of(e, &media->media);
  const auto whole = core->probs(model::Batch{seq})[0];
  for (int64_t step : {64, 128, 1000}) {
    auto r = core->start(seq);
    while (!core->step(*r, step)) {
    }
    EXPECT_EQ(core->finish(*r), whole) << "steps of " << step << " around 3 images";
  }
}

// Through the scheduler: a long request submitted first, short ones behind it; the short ones end
// before it (they run between its steps), and its answer is one forward's.
TEST(CudaPrefix, ALongRequestDoesNotStallShortOnes) {
  NEED_GPU();
  EngineOptions o;
  o.device = Device::Cuda;
  o.max_length = 16384;
  o.step_tokens = 1024;  // the short requests (~200 tokens) are not long ones
  auto e = Engine::load(small_dir(), o);
  using C = std::chrono::steady_clock;
  const Prepared big = e->prepare(body(state_text(9000, 41), 0));
  ASSERT_GT(big.input_tokens(), 8000u);
  std::promise<std::pair<Outcome, C::time_point>> big_done;
  std::vector<std::promise<C::time_point>> short_done(4);
  e->pause(true);
  e->submit(big, C::time_point::max(), [&](const Prepared&, Outcome out) { big_done.set_value({std::move(out), C::now()}); });
  for (int i = 0; i < 4; ++i)
    e->submit(e->prepare(body(state_text(20, uint32_t(50 + i)), i)), C::time_point::max(),
              [&, i](const Prepared&, Outcome out) {
                EXPECT_EQ(out.kind, Outcome::Kind::Answered);
                short_done[size_t(i)].set_value(C::now());
              });
  e->pause(false);
  auto [out, big_end] = big_done.get_future().get();
  ASSERT_EQ(out.kind, Outcome::Kind::Answered);
  for (auto& d : short_done) EXPECT_LT(d.get_future().get(), big_end) << "a short request ended after the long one";
  CoreOptions plain;
  plain.device = Device::Cuda;
  auto core = EngineCore::load(small_dir(), plain);
  EXPECT_EQ(core->probs(model::Batch{model::sequence_of(big.encoded())})[0], out.probs);
}

}  // namespace
}  // namespace clefrt

// The CPU vision tower (model/vision.h) on a synthesized tiny folder: its pieces against what
// spec/model.md 2 says they are; the tower's output shape and finiteness. (Against the
// reference: fixtures from the GPU machine, issue 19.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/vision.h"
#include "model/weights.h"
#include "test_util.h"

namespace clefrt::model {
namespace {

struct Tower {
  ModelConfig cfg;
  io::TensorStore store;
  VisionWeights w;
};
const Tower& tower() {
  static const Tower t = [] {
    Tower x;
    const std::string dir = test::synth_folder("vision", 21);
    x.cfg = load_config(dir);
    x.store = io::TensorStore::open_folder(dir);
    x.w = load_vision_weights(x.store, x.cfg.vision);
    return x;
  }();
  return t;
}

TEST(Vision, SynthFoldersHoldTheTower) {
  const Tower& t = tower();
  ASSERT_TRUE(t.cfg.vision.present);
  EXPECT_EQ(t.cfg.vision.depth, 2);
  EXPECT_EQ(t.w.blocks.size(), 2u);
  EXPECT_EQ(t.w.patch_w.numel(), 32 * 1536);
  EXPECT_EQ(t.w.merger_fc2_w.dim(0), t.cfg.text.hidden);
}

TEST(Vision, LinspaceCountsTheSecondHalfFromTheEnd) {
  const auto v = torch_linspace(0.0f, 47.0f, 5);
  EXPECT_EQ(v, (std::vector<float>{0.0f, 11.75f, 23.5f, 35.25f, 47.0f}));
  const auto u = torch_linspace(0.0f, 7.0f, 7);  // step 7/6 is not exact: the last point is the end itself
  EXPECT_EQ(u.back(), 7.0f);
  EXPECT_EQ(u.front(), 0.0f);
  EXPECT_EQ(u[5], 7.0f - 7.0f / 6.0f);
  EXPECT_EQ(torch_linspace(3.0f, 9.0f, 1), std::vector<float>{3.0f});
}

TEST(Vision, PatchesAreInMergeBlockOrder) {
  const auto rc = vision_patch_rows_cols(tower().cfg.vision, 1, 4, 6);
  ASSERT_EQ(rc.size(), 24u);
  const std::vector<std::pair<int64_t, int64_t>> first = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}};
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(rc[i], first[i]) << i;
  EXPECT_EQ(rc[12], (std::pair<int64_t, int64_t>{2, 0}));  // the second row of blocks
  EXPECT_EQ(rc.back(), (std::pair<int64_t, int64_t>{3, 5}));
}

TEST(Vision, PositionTableAtItsOwnSizeIsTheTable) {
  const Tower& t = tower();
  const int64_t side = 8, H = t.cfg.vision.hidden;  // the tiny preset's 64 positions
  const auto pos = vision_position_embeddings(t.w, t.cfg.vision, 1, side, side);
  const auto rc = vision_patch_rows_cols(t.cfg.vision, 1, side, side);
  for (size_t s = 0; s < rc.size(); ++s)
    for (int64_t x = 0; x < H; ++x)
      ASSERT_EQ(pos[s * size_t(H) + size_t(x)], t.w.pos_embed.data()[(rc[s].first * side + rc[s].second) * H + x]) << s;
  // between the table's points: a weighted mean of the neighbours
  const auto mid = vision_position_embeddings(t.w, t.cfg.vision, 1, 2, 2);  // corners only (linspace 0, 7)
  EXPECT_EQ(mid[size_t(3 * H)], t.w.pos_embed.data()[(7 * side + 7) * H]);
}

ImagePatches random_image(int64_t gh, int64_t gw, uint32_t seed) {
  ImagePatches im;
  im.grid_h = gh;
  im.grid_w = gw;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  im.pixels.resize(size_t(gh * gw * 1536));
  for (auto& p : im.pixels) p = d(rng);
  return im;
}

TEST(Vision, TowerGivesOneTokenPerMergedBlock) {
  const Tower& t = tower();
  for (auto [gh, gw] : {std::pair<int64_t, int64_t>{2, 2}, {4, 6}, {10, 2}}) {
    const auto out = vision_forward(t.w, t.cfg.vision, random_image(gh, gw, uint32_t(gh * 100 + gw)));
    ASSERT_EQ(int64_t(out.size()), gh * gw / 4 * t.cfg.text.hidden);
    for (float f : out) ASSERT_TRUE(std::isfinite(f));
  }
  // every patch matters: changing one pixel of the last patch moves the first token (attention is bidirectional)
  ImagePatches a = random_image(4, 4, 7), b = a;
  b.pixels.back() += 0.5f;
  const auto oa = vision_forward(t.w, t.cfg.vision, a), ob = vision_forward(t.w, t.cfg.vision, b);
  EXPECT_NE(oa[0], ob[0]);
}

TEST(Vision, AGridTheTowerCannotTakeIs422) {
  const Tower& t = tower();
  ImagePatches odd = random_image(3, 4, 1);
  try {
    vision_forward(t.w, t.cfg.vision, odd);
    FAIL() << "ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 422);
  }
}

TEST(Vision, MropePositionsFollowTheSpec) {
  // 3 text tokens, a 2 x 3 merged image (6 pad tokens), 2 text tokens
  const SequenceMedia m = mrope_positions(11, {MediaSpan{3, 2, 3}});
  EXPECT_EQ(m.pos_t, (std::vector<int64_t>{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7}));
  EXPECT_EQ(m.pos_h, (std::vector<int64_t>{0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7}));
  EXPECT_EQ(m.pos_w, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7}));
  const SequenceMedia text = mrope_positions(4, {});
  EXPECT_EQ(text.pos_h, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Vision, BackboneReadsImageRowsAndPositions) {
  const std::string dir = test::synth_folder("vision", 21);
  const ModelConfig cfg = load_config(dir);
  io::TensorStore store = io::TensorStore::open_folder(dir);
  const TextWeights tw = load_text_weights(store, cfg.text);
  const int64_t L = 700, H = cfg.text.hidden;
  std::vector<int32_t> ids(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) ids[size_t(t)] = int32_t((t * 7919) % 20000);
  auto run = [&](const SequenceMedia* media, int64_t cut) {  // cut > 0: from the state after `cut` tokens
    std::vector<float> out(size_t(L * H));
    BackboneState st = BackboneState::start(cfg.text);
    const ChunkSink sink = [&](int64_t first, int64_t n, const float* h) { std::copy_n(h, n * H, out.data() + first * H); };
    if (cut > 0) {
      backbone_run(tw, cfg.text, ids.data(), cut, st, GdnForm::Chunked, sink, media);
      BackboneState copy = st;
      backbone_run(tw, cfg.text, ids.data(), L, copy, GdnForm::Chunked, sink, media);
    } else {
      backbone_run(tw, cfg.text, ids.data(), L, st, GdnForm::Chunked, sink, media);
    }
    return out;
  };
  // text: positions from mrope_positions give the bits of no media at all
  const SequenceMedia text = mrope_positions(L, {});
  EXPECT_EQ(run(&text, 0), run(nullptr, 0));
  // an image of 4 x 5 merged tokens across the chunk boundary at 256
  std::vector<float> rows(static_cast<size_t>(20 * H));
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (auto& r : rows) r = d(rng);
  const SequenceMedia m = mrope_positions(L, {MediaSpan{250, 4, 5, rows.data()}});
  const auto with = run(&m, 0);
  EXPECT_EQ(run(&m, 256), with);  // continued from a state inside the image: the same bits
  const auto plain = run(nullptr, 0);
  EXPECT_EQ(std::vector<float>(with.begin(), with.begin() + 250 * H), std::vector<float>(plain.begin(), plain.begin() + 250 * H));
  EXPECT_NE(with[size_t(250 * H)], plain[size_t(250 * H)]);  // the image rows replace the pad embeddings
  // positions alone move what follows the image (the text after it counts on from 250 + 5)
  SequenceMedia pos_only = mrope_positions(L, {MediaSpan{250, 4, 5}});
  const auto shifted = run(&pos_only, 0);
  EXPECT_NE(shifted[size_t((L - 1) * H)], plain[size_t((L - 1) * H)]);
}

}  // namespace
}  // namespace clefrt::model

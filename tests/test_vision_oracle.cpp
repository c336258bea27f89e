// Images end to end on the CPU against the reference (tests/fixtures/oracle/tiny-v, made on the
// GPU machine by tools/reference/make_vision_oracle.py: transformers 5.17's processor, its
// Qwen3_5 vision tower and backbone in fp32, the spec head): per request the ids and the 3-row
// positions must be identical, the pixel values byte-identical, the probabilities within 1e-4.
// The pieces are driven directly: the engine does not route images to the tower yet.
#include <gtest/gtest.h>

#include <sstream>

#include "common/digest.h"
#include "common/json.h"
#include "image/preprocess.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/head.h"
#include "model/vision.h"
#include "model/weights.h"
#include "schema/encode.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace clefrt {
namespace {

TEST(VisionOracle, TinyV_ImagesAgainstTheReference) {
  using namespace model;
  const std::string dir = test::source_path("tests/fixtures/oracle/tiny-v");
  const ModelConfig cfg = load_config(dir);
  io::TensorStore store = io::TensorStore::open_folder(dir), head_store;
  head_store.add_file(dir + "/joint_head.safetensors");
  const TextWeights tw = load_text_weights(store, cfg.text);
  const VisionWeights vw = load_vision_weights(store, cfg.vision);
  const HeadWeights hw = load_head_weights(head_store, cfg.head);
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  EncodeOptions eo;
  eo.vision = VisionGeometry::from_model_dir(dir);
  const Encoder enc(tok, eo);
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-v.expected.jsonl")));
  size_t n = 0, with_images = 0;
  double worst = 0;
  const int64_t H = cfg.text.hidden;
  for (std::string line; std::getline(in, line);) {
    SCOPED_TRACE("request " + std::to_string(n));
    const json::Value rec = json::parse(line);
    const Request req = parse_request(*rec.find("request"));
    const Encoded e = enc.encode(req);
    std::vector<int32_t> want_ids;
    for (const auto& v : rec.find("input_ids")->arr) want_ids.push_back(int32_t(v.i));
    ASSERT_EQ(e.input_ids, want_ids);
    // each image: the processor's pixels, then the tower
    std::vector<std::vector<float>> rows(req.images.size());
    std::vector<MediaSpan> spans;
    std::string pv_bytes;
    for (size_t i = 0; i < req.images.size(); ++i) {
      const ImagePatches p = preprocess_image(req.images[i], eo.vision, 16'777'216, "images[" + std::to_string(i) + "]");
      ASSERT_EQ(p.grid_h, rec.find("grid_thw")->arr[i].arr[1].i);
      ASSERT_EQ(p.grid_w, rec.find("grid_thw")->arr[i].arr[2].i);
      pv_bytes.append(reinterpret_cast<const char*>(p.pixels.data()), p.pixels.size() * sizeof(float));
      rows[i] = vision_forward(vw, cfg.vision, p);
      const EncodedImage& ei = e.images[i];
      ASSERT_EQ(int64_t(rows[i].size()), int64_t(ei.pad_span.end - ei.pad_span.begin) * H);
      spans.push_back({int64_t(ei.pad_span.begin), p.grid_h / 2, p.grid_w / 2, rows[i].data()});
    }
    const SequenceMedia media = mrope_positions(int64_t(e.input_ids.size()), spans);
    if (!req.images.empty()) {
      ++with_images;
      EXPECT_EQ(sha256_hex(pv_bytes), rec.find("pixel_values_sha256")->s) << "pixel values";
      const auto& pos = rec.find("position_ids")->arr;
      const std::vector<int64_t>* mine[3] = {&media.pos_t, &media.pos_h, &media.pos_w};
      for (int r = 0; r < 3; ++r) {
        std::vector<int64_t> want;
        for (const auto& v : pos[size_t(r)].arr) want.push_back(v.i);
        ASSERT_EQ(*mine[r], want) << "position row " << r;
      }
    }
    // the backbone with the image rows, then the head
    Sequence s = sequence_of(e, req.images.empty() ? nullptr : &media);
    std::vector<float> hidden(size_t(s.length * H));
    BackboneState st = BackboneState::start(cfg.text);
    const ChunkSink sink = [&](int64_t first, int64_t k, const float* h) { std::copy_n(h, k * H, hidden.data() + first * H); };
    backbone_run(tw, cfg.text, e.input_ids.data(), s.length, st, GdnForm::Chunked, sink, req.images.empty() ? nullptr : &media);
    const auto probs = joint_head(hw, cfg.head, tw.lm_head, hidden.data(), s);
    const double d = test::worst_diff(probs, test::probs_of(*rec.find("probs")));
    worst = std::max(worst, d);
    EXPECT_LT(d, 1e-4) << e.input_ids.size() << " tokens, " << req.images.size() << " images";
    ++n;
  }
  EXPECT_EQ(n, 24u);
  EXPECT_GE(with_images, 18u);
  std::cout << "[ oracle  ] tiny-v: " << n << " requests (" << with_images << " with 1-4 images), worst |p - p_ref32| = " << worst << "\n";
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

// The same requests through the public Engine (prepare -> the scheduler -> the CPU forward), as
// the server, `decide` and Python run them: the same probabilities, and a batch of all 24 gives
// each one's bits alone.
TEST(VisionOracle, TinyV_ThroughTheEngine) {
  EngineOptions o;
  o.device = Device::Cpu;
  auto engine = Engine::load(test::source_path("tests/fixtures/oracle/tiny-v"), o);
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-v.expected.jsonl")));
  std::vector<Prepared> prepared;
  std::vector<test::Probs> want;
  for (std::string line; std::getline(in, line);) {
    const json::Value rec = json::parse(line);
    prepared.push_back(engine->prepare(json::write(*rec.find("request"))));
    want.push_back(test::probs_of(*rec.find("probs")));
  }
  std::vector<const Prepared*> all;
  for (const auto& p : prepared) all.push_back(&p);
  const auto together = engine->probs(all);
  double worst = 0;
  for (size_t k = 0; k < prepared.size(); ++k) {
    worst = std::max(worst, test::worst_diff(together[k], want[k]));
    if (k % 6 == 0) EXPECT_EQ(engine->probs({&prepared[k]})[0], together[k]) << "request " << k << " alone vs in the batch";
  }
  EXPECT_LT(worst, 1e-4);
  std::cout << "[ oracle  ] tiny-v through the engine: worst |p - p_ref32| = " << worst << "\n";
}

TEST(VisionOracle, ImageThatDoesNotDecodeIs422NamingIt) {
  EngineOptions o;
  o.device = Device::Cpu;
  auto engine = Engine::load(test::source_path("tests/fixtures/oracle/tiny-v"), o);
  // a valid PNG header (the size check passes) over pixel data that is not there
  const std::string png = test::read_file(test::source_path("tests/fixtures/images/corpus/rgb-200x150.png"));
  json::Value body = json::parse(R"({"state":"x","questions":{"q":{"type":"noul","instructions":"ok?"}}})");
  json::Value images = json::Value::array();
  images.arr.push_back(json::Value::string("data:image/png;base64," + test::base64(png)));
  images.arr.push_back(json::Value::string("data:image/png;base64," + test::base64(png.substr(0, 400))));
  body.add("images", std::move(images));
  try {
    engine->prepare(json::write(body));
    ADD_FAILURE() << "a truncated image was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 422);
    EXPECT_NE(std::string(e.what()).find("images[1]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace clefrt

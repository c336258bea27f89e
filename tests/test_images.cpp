// The image processor against the reference's own output (tests/fixtures/images, made on the GPU
// machine by tools/reference/image_probe.py with transformers 5.17 / torchvision 0.26): per file
// the decoded RGB bytes, the resized bytes and the normalised patches must hash the same, and
// what the reference refuses is refused here with a clear error.
#include <gtest/gtest.h>

#include <sstream>

#include "common/digest.h"
#include "common/error.h"
#include "image/preprocess.h"
#include "schema/images.h"
#include "test_util.h"

using namespace clefrt;

namespace {

std::string str(const json::Value& rec, const char* key) {
  const json::Value* v = rec.find(key);
  return v && v->is_string() ? v->s : "";
}

std::vector<json::Value> fixtures() {
  std::vector<json::Value> out;
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/images/expected.jsonl")));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

}  // namespace

TEST(Images, DecodeResizeAndPatchesEqualTheReference) {
  const VisionGeometry g;  // Qwen3.5's preprocessor_config.json
  size_t checked = 0, refused = 0;
  for (const json::Value& rec : fixtures()) {
    const std::string file = str(rec, "file");
    SCOPED_TRACE(file);
    const std::string bytes = test::read_file(test::source_path("tests/fixtures/images/corpus/" + file));
    ASSERT_EQ(sha256_hex(bytes), str(rec, "bytes_sha256"));
    const auto fmt = sniff_image(bytes);
    const std::string error = str(rec, "error");
    if (!fmt) {  // BMP and GIF: not formats of the protocol (the reference refuses BMP, takes GIF)
      EXPECT_TRUE(file.ends_with(".bmp") || file.ends_with(".gif"));
      ++refused;
      continue;
    }
    if (!error.empty()) {  // the reference fails on it (16-bit PNG): a clear 422 here
      try {
        decode_image(*fmt, bytes, 16'777'216, "images[0]");
        ADD_FAILURE() << "decoded what the reference refuses: " << error;
      } catch (const Error& e) {
        EXPECT_EQ(e.http_status(), 422);
        EXPECT_NE(std::string(e.what()).find("images[0]"), std::string::npos) << e.what();
      }
      ++refused;
      continue;
    }
    RgbImage d;
    try {
      d = decode_image(*fmt, bytes, 16'777'216 * 2, "images[0]");
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const json::Value& dec = *rec.find("decoded");
    ASSERT_EQ(d.width, uint32_t(dec.arr[0].i));
    ASSERT_EQ(d.height, uint32_t(dec.arr[1].i));
    EXPECT_EQ(sha256_hex(test::bytes_of(d.pixels)), str(rec, "decoded_sha256")) << "decoded pixels";
    uint32_t w = 0, h = 0;
    g.resize(d.width, d.height, w, h);
    const json::Value& rs = *rec.find("resized");
    ASSERT_EQ(w, uint32_t(rs.arr[0].i));
    ASSERT_EQ(h, uint32_t(rs.arr[1].i));
    const RgbImage r = (w == d.width && h == d.height) ? d : resize_bicubic_aa(d, w, h);
    EXPECT_EQ(sha256_hex(test::bytes_of(r.pixels)), str(rec, "resized_sha256")) << "resized pixels";
    const model::ImagePatches p = image_patches(r, g);
    const json::Value& thw = *rec.find("grid_thw");
    EXPECT_EQ(p.grid_h, thw.arr[1].i);
    EXPECT_EQ(p.grid_w, thw.arr[2].i);
    EXPECT_EQ(sha256_hex(test::bytes_of(p.pixels)), str(rec, "pixel_values_sha256")) << "pixel_values";
    ++checked;
  }
  EXPECT_GE(checked, 30u);
  EXPECT_EQ(refused, 3u);  // 16-bit PNG, BMP, GIF
}

TEST(Images, BrokenAndOversizedImagesAreClear422s) {
  const std::string png = test::read_file(test::source_path("tests/fixtures/images/corpus/rgb-200x150.png"));
  for (size_t cut : {size_t(30), png.size() / 2}) {
    try {
      decode_image(ImageFormat::Png, png.substr(0, cut), 16'777'216, "images[2]");
      ADD_FAILURE() << "a truncated PNG decoded";
    } catch (const Error& e) {
      EXPECT_EQ(e.http_status(), 422);
      EXPECT_NE(std::string(e.what()).find("images[2]"), std::string::npos) << e.what();
    }
  }
  const std::string jpg = test::read_file(test::source_path("tests/fixtures/images/corpus/jpeg-444-300x200.jpg"));
  EXPECT_THROW(decode_image(ImageFormat::Jpeg, jpg.substr(0, 200), 16'777'216, "images[0]"), Error);
  EXPECT_THROW(decode_image(ImageFormat::Jpeg, jpg, 300 * 200 - 1, "images[0]"), Error);  // over the pixel limit
  const std::string webp = test::read_file(test::source_path("tests/fixtures/images/corpus/webp-lossy-320x240.webp"));
  EXPECT_THROW(decode_image(ImageFormat::Webp, webp.substr(0, webp.size() / 2), 16'777'216, "images[0]"), Error);
  // the wrong container for the declared format is refused, never guessed
  EXPECT_THROW(decode_image(ImageFormat::Jpeg, png, 16'777'216, "images[0]"), Error);
}

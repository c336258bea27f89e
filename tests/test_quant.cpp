// NVFP4 / FP8 formats (spec/quant.md) and quantized checkpoints on the CPU engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/json.h"
#include "engine/engine_core.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/formats.h"
#include "quant/recipe.h"
#include <clefrt/clefrt.h>
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

namespace fs = std::filesystem;
using namespace quant;

TEST(Quant, E4m3DecodesEveryCodeAndEncodesBack) {
  EXPECT_EQ(e4m3_value(0x00), 0.0f);
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_value(0x38), 1.0f);
  EXPECT_EQ(e4m3_value(0x40), 2.0f);
  EXPECT_EQ(e4m3_value(0x7e), 448.0f);
  EXPECT_EQ(e4m3_value(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_value(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_value(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = e4m3_value(uint8_t(c));
    if (c == 0x80) continue;  // -0 encodes back as the sign of zero kept
    EXPECT_EQ(e4m3_encode(v), uint8_t(c)) << c;
  }
  EXPECT_EQ(e4m3_encode(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);  // halfway between 1 and 1.125: to the even code
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to the even code (1.25)
}

// The closed-form encoder against the definition: the nearest of the 127 finite codes, ties to
// the even code, on random magnitudes across the whole range and on every midpoint.
TEST(Quant, E4m3EncodeIsTheNearestCode) {
  auto nearest = [](float a) {
    uint8_t best = 0;
    float bd = INFINITY;
    for (uint8_t c = 0; c <= 0x7e; ++c) {
      const float d = std::fabs(a - e4m3_value(c));
      if (d < bd || (d == bd && (c & 1) == 0)) {
        bd = d;
        best = c;
      }
    }
    return best;
  };
  std::mt19937 r(4);
  std::uniform_real_distribution<float> ex(-12.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    const float a = std::exp2(ex(r));
    if (a >= 448.0f) continue;
    ASSERT_EQ(e4m3_encode(a), nearest(a)) << a;
    ASSERT_EQ(e4m3_encode(-a), uint8_t(0x80 | nearest(a))) << -a;
  }
  for (uint8_t c = 0; c < 0x7e; ++c) {
    const float mid = 0.5f * (e4m3_value(c) + e4m3_value(uint8_t(c + 1)));
    ASSERT_EQ(e4m3_encode(mid), nearest(mid)) << "midpoint above code " << int(c);
  }
}

// The GPU's FP8 row quantization (cuda/ops/formats.cuh, fp8_div_by_recip) divides by the row's
// scale s = m / 448 through s's correctly rounded reciprocal and one FMA correction. Its quotient
// may differ from x / s (subnormal x or quotients), its code may not: every row amax m >= 2^-100
// that is a bf16 value, every bf16 x with |x| <= m.
TEST(Quant, Fp8RowReciprocalGivesTheDivisionsCodes) {
  auto bf16_value = [](uint32_t bits) {
    const uint32_t u = bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> pos;  // zero and every positive finite bf16, ascending (x = -0 below too)
  for (uint32_t b = 0; b < 0x7f80; ++b) pos.push_back(bf16_value(b));
  long bad[2] = {0, 0}, pairs[2] = {0, 0}, differing[2] = {0, 0};
  auto part = [&](int w) {
    for (size_t mi = w; mi < pos.size(); mi += 2) {
      const float m = pos[mi];
      if (m < 0x1p-100f) continue;
      const float s = m / 448.0f, inv = 1.0f / s;
      for (size_t xi = 0; xi <= mi; ++xi)
        for (const float x : {pos[xi], -pos[xi]}) {
          // formats.cuh's fp8_div_by_recip, operation for operation
          const float q0 = x * inv, q = std::copysign(std::fma(std::fma(-q0, s, x), inv, q0), x), ref = x / s;
          ++pairs[w];
          if (q == ref && std::signbit(q) == std::signbit(ref)) continue;  // -0 == +0, but their codes differ
          ++differing[w];
          if (e4m3_encode(q) != e4m3_encode(ref)) ++bad[w];
        }
    }
  };
  std::thread t0(part, 0), t1(part, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(bad[0] + bad[1], 0);
  EXPECT_GT(pairs[0] + pairs[1], 1000000000L);
  EXPECT_GT(differing[0] + differing[1], 0) << "the check would not see a quotient that differs";
  // ...and below 2^-100 the shortcut is wrong: the GPU divides there (fp8_row_recip gives 0)
  const float m = 0x1.f4p-108f, x = 0x1.f4p-124f, s = m / 448.0f, inv = 1.0f / s;
  const float q0 = x * inv;
  EXPECT_NE(e4m3_encode(std::fma(std::fma(-q0, s, x), inv, q0)), e4m3_encode(x / s));
}

TEST(Quant, E2m1GridAndTiesToEven) {
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_value(uint8_t(c)), (c & 8 ? -1 : 1) * grid[c & 7]);
  EXPECT_EQ(e2m1_encode(0.25f), 0);   // 0 | 0.5 -> even 0
  EXPECT_EQ(e2m1_encode(0.75f), 2);   // 0.5 | 1 -> even code 2
  EXPECT_EQ(e2m1_encode(2.5f), 4);    // 2 | 3 -> code 4
  EXPECT_EQ(e2m1_encode(5.0f), 6);    // 4 | 6 -> code 6
  EXPECT_EQ(e2m1_encode(100.0f), 7);  // clamped to 6
  EXPECT_EQ(e2m1_encode(-1.2f), 8 | 2);
}

TEST(Quant, Nvfp4DequantizeKnownValues) {
  // one row of 16: codes 0.5 and -1.0 in the first byte (even column in the low nibble)
  std::vector<uint8_t> packed(8, 0), scales = {0x40};  // scale 2.0
  packed[0] = uint8_t(0x1 | (0xA << 4));
  packed[7] = uint8_t(0x7 << 4);  // column 15: 6.0
  auto w = nvfp4_dequantize(packed.data(), scales.data(), 4.0f, 1, 16);  // s32 = 2 / 4
  EXPECT_EQ(w[0], 0.25f);
  EXPECT_EQ(w[1], -0.5f);
  EXPECT_EQ(w[2], 0.0f);
  EXPECT_EQ(w[15], 3.0f);
}

TEST(Quant, Nvfp4QuantizeRoundTrip) {
  std::mt19937 r(3);
  std::normal_distribution<float> d(0.0f, 0.05f);
  const int64_t out = 24, in = 64;
  std::vector<float> w(size_t(out * in));
  for (auto& x : w) x = d(r);
  w[5] = 0.9f;  // an outlier sets the global scale
  Nvfp4Weight q = nvfp4_quantize(w.data(), out, in);
  EXPECT_FLOAT_EQ(q.global_scale, 448.0f * 6.0f / 0.9f);
  auto back = nvfp4_dequantize(q.packed.data(), q.scales.data(), q.global_scale, out, in);
  for (int64_t rr = 0; rr < out; ++rr)
    for (int64_t b = 0; b < in / 16; ++b) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(w[size_t(rr * in + b * 16 + i)]));
      for (int i = 0; i < 16; ++i) {
        const size_t k = size_t(rr * in + b * 16 + i);
        // e2m1's widest gap (4 -> 6) is a third of the block max; half of it, plus e4m3 scale rounding
        EXPECT_LE(std::fabs(back[k] - w[k]), amax * 0.2f + 1e-6f) << rr << "," << b * 16 + i;
      }
    }
  // quantizing the dequantized weights again gives the same codes (the grid is stable)
  Nvfp4Weight q2 = nvfp4_quantize(back.data(), out, in, q.global_scale);
  EXPECT_EQ(q2.packed, q.packed);
}

TEST(Quant, ActivationFakeQuantization) {
  std::vector<float> x = {0.1f, -0.2f, 0.3f, 0.05f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.2f};
  std::vector<float> y = x;
  const float gs = 448.0f * 6.0f / 1.2f;
  nvfp4_fake_quantize_activations(y.data(), 1, 16, gs);
  EXPECT_EQ(y[15], bf16_round(6.0f * 448.0f / gs));  // the block max: scale 448, code 6
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(y[i] - x[i]), 0.2f * 1.2f) << i;
  std::vector<float> z = x;
  fp8_fake_quantize_activations(z.data(), 1, 16);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(z[i] - x[i]), std::fabs(x[i]) * 0.0625f + 1e-7f) << i;
}

// A tiny synthesized folder rewritten as an NVFP4 checkpoint: every Linear of the decoder whose
// inputs are a multiple of 16 (not in_proj_a/b, as the recipe keeps them), W4A16 or W4A4.
std::string nvfp4_folder(bool w4a4) {
  const std::string src = test::synth_folder("q-src", 5);
  const std::string dst = testing::TempDir() + "clefrt-q-" + (w4a4 ? "w4a4-" : "w4a16-") + std::to_string(getpid());
  fs::create_directories(dst);
  for (auto& e : fs::directory_iterator(src))
    if (e.path().extension() != ".safetensors" || e.path().filename() == "joint_head.safetensors")
      fs::copy_file(e.path(), fs::path(dst) / e.path().filename(), fs::copy_options::overwrite_existing);
  json::Value cfg = json::parse(test::read_file(src + "/config.json"));
  json::Value qc = json::parse(R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized","quantization_status":"compressed",
    "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16}}},
    "ignore":["lm_head"]})");
  cfg.add("quantization_config", qc);
  std::ofstream(dst + "/config.json") << json::write(cfg);
  json::Value weight_map = json::Value::object();
  for (auto& e : fs::directory_iterator(src)) {
    if (e.path().extension() != ".safetensors" || e.path().filename() == "joint_head.safetensors") continue;
    io::TensorStore st;
    st.add_file(e.path().string());
    std::vector<io::OutTensor> out;
    for (const io::TensorInfo* t : st.all()) {
      const bool linear = t->shape.size() == 2 && t->name.find("layers.") != std::string::npos && t->shape[1] % 16 == 0 &&
                          t->name.find("in_proj_a") == std::string::npos && t->name.find("in_proj_b") == std::string::npos;
      if (!linear) {
        out.push_back({t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
        continue;
      }
      auto w = model::to_f32(*t);
      Nvfp4Weight q = nvfp4_quantize(w.data(), t->shape[0], t->shape[1]);
      const std::string base = t->name.substr(0, t->name.size() - 7);
      out.push_back({base + ".weight_packed", io::DType::U8, {t->shape[0], t->shape[1] / 2}, q.packed});
      out.push_back({base + ".weight_scale", io::DType::F8_E4M3, {t->shape[0], t->shape[1] / 16}, q.scales});
      out.push_back({base + ".weight_global_scale", io::DType::F32, {1}, io::f32_bytes({q.global_scale})});
      if (w4a4) out.push_back({base + ".input_global_scale", io::DType::F32, {1}, io::f32_bytes({448.0f * 6.0f / 8.0f})});
    }
    io::write_safetensors((fs::path(dst) / e.path().filename()).string(), out);
    for (const auto& t : out) weight_map.add(t.name, json::Value::string(e.path().filename().string()));
  }
  json::Value index = json::Value::object();
  index.add("metadata", json::Value::object());
  index.add("weight_map", weight_map);
  std::ofstream(dst + "/model.safetensors.index.json") << json::write(index);
  return dst;
}

TEST(Quant, Nvfp4CheckpointRunsOnTheCpuEngine) {
  const std::string req = R"({"state":"the checkout is down","questions":{"a":{"type":"noul"},"b":{"type":"choice","criteria":{"x":null,"y":null,"z":null}}}})";
  for (bool w4a4 : {false, true}) {
    const std::string dir = nvfp4_folder(w4a4);
    auto e = EngineCore::load(dir);
    Encoded enc = e->encoder().encode(parse_request(req));
    auto p = e->probs({&enc})[0];
    ASSERT_EQ(p.size(), 2u);
    for (const auto& q : p) {
      double sum = 0;
      for (double v : q) {
        EXPECT_TRUE(v >= 0 && v <= 1);
        sum += v;
      }
      EXPECT_NEAR(sum, 1.0, 1e-9);
    }
    // the loaded weights are the spec's dequantization of what the file holds
    io::TensorStore st = io::TensorStore::open_folder(dir);
    const auto cfg = model::load_config(dir);
    auto tw = model::load_text_weights(st, cfg.text);
    const auto& g = tw.layers[0].gate_proj;
    EXPECT_EQ(g.quant, model::Tensor::Quant::Nvfp4);
    EXPECT_EQ(g.input_global_scale > 0, w4a4);
    const std::string base = "model.language_model.layers.0.mlp.gate_proj";
    float gs;
    std::memcpy(&gs, st.find(base + ".weight_global_scale")->data, 4);
    auto want = nvfp4_dequantize(st.find(base + ".weight_packed")->data, st.find(base + ".weight_scale")->data, gs, g.dim(0), g.dim(1));
    EXPECT_EQ(g.v, want);
    // the GPU engine refuses it plainly
    CoreOptions gpu;
    gpu.device = Device::Cuda;
    try {
      EngineCore::load(dir, gpu);
      FAIL() << "expected a refusal";
    } catch (const Error& err) {
      EXPECT_TRUE(std::string(err.what()).find("CPU engine only") != std::string::npos ||
                  std::string(err.what()).find("--device cuda") != std::string::npos)
          << err.what();
    }
  }
}

TEST(Quant, BrokenNvfp4TensorsNameFileAndTensor) {
  const std::string dir = nvfp4_folder(false);
  // rewrite one scale with the wrong shape
  io::TensorStore st = io::TensorStore::open_folder(dir);
  const std::string name = "model.language_model.layers.0.mlp.up_proj.weight_scale";
  const io::TensorInfo* t = st.find(name);
  ASSERT_NE(t, nullptr);
  const std::string file = *t->file;
  std::vector<io::OutTensor> out;
  {
    io::TensorStore one;
    one.add_file(file);
    for (const io::TensorInfo* x : one.all()) {
      std::vector<int64_t> shape = x->shape;
      std::vector<uint8_t> bytes(x->data, x->data + x->nbytes);
      if (x->name == name) {
        shape[1] -= 1;
        bytes.resize(size_t(shape[0] * shape[1]));
      }
      out.push_back({x->name, x->dtype, shape, bytes});
    }
  }
  io::write_safetensors(file, out);
  try {
    EngineCore::load(dir);
    FAIL() << "expected a load error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("up_proj.weight_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

TEST(Quant, QuantizeCommandWritesLoadableFolders) {
  const std::string src = test::synth_folder("qq-src", 9);
  const std::string calib = testing::TempDir() + "clefrt-qq-calib-" + std::to_string(getpid()) + ".jsonl";
  std::ofstream(calib) << R"({"state":"checkout is down","questions":{"a":{"type":"noul"}}})" << "\n"
                       << R"({"state":"a second record, a bit longer than the first","questions":{"s":{"type":"score","criteria":["lo","hi"]}}})"
                       << "\n";
  io::TensorStore orig = io::TensorStore::open_folder(src);
  const auto cfg = model::load_config(src);
  const auto tw0 = model::load_text_weights(orig, cfg.text);
  for (const std::string scheme : {"nvfp4-w4a16", "nvfp4", "fp8"}) {
    QuantizeOptions qo;
    qo.model_dir = src;
    qo.out_dir = testing::TempDir() + "clefrt-qq-" + scheme + "-" + std::to_string(getpid());
    qo.scheme = scheme;
    qo.calib_file = calib;
    qo.progress = false;
    quantize(qo);
    json::Value c = json::parse(test::read_file(qo.out_dir + "/config.json"));
    const json::Value* qc = c.find("quantization_config");
    ASSERT_NE(qc, nullptr);
    EXPECT_EQ(qc->find("format")->s, scheme == "fp8" ? "float-quantized" : "nvfp4-pack-quantized");
    io::TensorStore st = io::TensorStore::open_folder(qo.out_dir);
    if (scheme != "fp8") {
      // one global scale for q/k/v (layer 3 is full attention in the tiny preset)
      const std::string a = "model.language_model.layers.3.self_attn.";
      float gq, gk, gv;
      std::memcpy(&gq, st.find(a + "q_proj.weight_global_scale")->data, 4);
      std::memcpy(&gk, st.find(a + "k_proj.weight_global_scale")->data, 4);
      std::memcpy(&gv, st.find(a + "v_proj.weight_global_scale")->data, 4);
      EXPECT_EQ(gq, gk);
      EXPECT_EQ(gq, gv);
      EXPECT_EQ(st.find(a + "q_proj.input_global_scale") != nullptr, scheme == "nvfp4");
      EXPECT_NE(st.find("model.language_model.layers.0.linear_attn.in_proj_a.weight"), nullptr);  // kept bf16
    }
    // the vision tower is copied as it was, byte for byte (the recipe quantizes the backbone's
    // Linears only, as the community NVFP4 build does)
    {
      const auto v0 = model::load_vision_weights(orig, cfg.vision, model::LoadMode::Lazy);
      const auto v1 = model::load_vision_weights(st, cfg.vision, model::LoadMode::Lazy);
      const auto t0 = model::vision_tensors(v0), t1 = model::vision_tensors(v1);
      ASSERT_EQ(t0.size(), t1.size());
      ASSERT_GT(t0.size(), 9u);
      for (size_t i = 0; i < t0.size(); ++i) {
        ASSERT_TRUE(t0[i]->src && t1[i]->src) << t0[i]->name;
        EXPECT_EQ(t1[i]->quant, model::Tensor::Quant::None) << scheme << " " << t1[i]->name;
        EXPECT_EQ(t1[i]->src->dtype, t0[i]->src->dtype) << scheme << " " << t1[i]->name;
        ASSERT_EQ(t1[i]->src->nbytes, t0[i]->src->nbytes) << t1[i]->name;
        EXPECT_EQ(std::memcmp(t1[i]->src->data, t0[i]->src->data, t0[i]->src->nbytes), 0) << scheme << " " << t1[i]->name;
      }
    }
    // the weights come back close to the originals
    const auto tw = model::load_text_weights(st, cfg.text);
    const auto& a = tw0.layers[0].down_proj.v;
    const auto& b = tw.layers[0].down_proj.v;
    ASSERT_EQ(a.size(), b.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += a[i] * a[i];
    }
    EXPECT_LT(std::sqrt(num / den), scheme == "fp8" ? 0.05 : 0.2) << scheme;
    auto e = EngineCore::load(qo.out_dir);
    Encoded enc = e->encoder().encode(parse_request(R"({"state":"x","questions":{"a":{"type":"noul"}}})"));
    auto p = e->probs({&enc})[0];
    EXPECT_NEAR(p[0][0] + p[0][1], 1.0, 1e-9);
  }
  // refusals: W4A4 without calibration, an existing output folder
  QuantizeOptions bad;
  bad.model_dir = src;
  bad.out_dir = testing::TempDir() + "clefrt-qq-bad-" + std::to_string(getpid());
  bad.scheme = "nvfp4";
  EXPECT_THROW(quantize(bad), Error);
  bad.scheme = "fp8";
  bad.out_dir = src;
  EXPECT_THROW(quantize(bad), Error);
  // calibration records: one over the context is skipped (it is valid, just too long), an
  // invalid one stops the run and the error names the file and line
  {
    std::string huge(90000, 'x');
    for (size_t i = 0; i < huge.size(); i += 6) huge[i] = ' ';
    const std::string bad_calib = testing::TempDir() + "clefrt-qq-badcalib-" + std::to_string(getpid()) + ".jsonl";
    std::ofstream(bad_calib) << R"({"state":"fine","questions":{"a":{"type":"noul","instructions":")" << huge << R"("}}})"
                             << "\n\n"
                             << R"({"state":"broken","questions":{"a":{"type":"nope"}}})" << "\n";
    QuantizeOptions q;
    q.model_dir = src;
    q.out_dir = testing::TempDir() + "clefrt-qq-badcalib-out-" + std::to_string(getpid());
    q.scheme = "nvfp4";
    q.calib_file = bad_calib;
    q.progress = false;
    try {
      quantize(q);
      ADD_FAILURE() << "expected the bad calibration record to be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad_calib + ":3"), std::string::npos) << e.what();
    }
    // only the record over the context: skipped, and then nothing is left to calibrate on
    std::ofstream(bad_calib) << R"({"state":"fine","questions":{"a":{"type":"noul","instructions":")" << huge << R"("}}})" << "\n";
    q.out_dir += "-2";
    try {
      quantize(q);
      ADD_FAILURE() << "expected 'no calibration records'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no calibration records that fit the context"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

// Our loader's dequantized weights against tools/reference/dequant_ref.py, an independent reader
// written from spec/quant.md (torch + safetensors, run on the GPU machine on the same folders:
// tiny-b quantized by `clefrt quantize`, which is deterministic). Bit for bit.
TEST(Quant, LoaderMatchesIndependentPythonReader) {
  const std::string src = test::source_path("tests/fixtures/oracle/tiny-b");
  const auto cfg = model::load_config(src);
  for (const std::string scheme : {"nvfp4-w4a16", "fp8"}) {
    QuantizeOptions qo;
    qo.model_dir = src;
    qo.out_dir = testing::TempDir() + "clefrt-qref-" + scheme + "-" + std::to_string(getpid());
    qo.scheme = scheme;
    qo.progress = false;
    quantize(qo);
    io::TensorStore st = io::TensorStore::open_folder(qo.out_dir);
    model::QuantActivations qa;
    qa.fp8_dynamic = scheme == "fp8";
    const auto tw = model::load_text_weights(st, cfg.text, model::LoadMode::Full, qa);
    io::TensorStore ref;
    ref.add_file(test::source_path("tests/fixtures/quant/tiny-b-" + scheme + ".dequant.safetensors"));
    size_t compared = 0;
    for (const auto& l : tw.layers)
      for (const model::Tensor* t : {&l.gate_proj, &l.up_proj, &l.down_proj, &l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.out_proj,
                                     &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) {
        if (t->quant == model::Tensor::Quant::None) continue;
        const io::TensorInfo* r = ref.find(t->name);
        ASSERT_NE(r, nullptr) << scheme << ": the reference has no " << t->name;
        const std::vector<float> want = model::to_f32(*r);
        ASSERT_EQ(want.size(), t->v.size()) << t->name;
        size_t differ = 0;
        for (size_t i = 0; i < want.size(); ++i) differ += want[i] != t->v[i];
        EXPECT_EQ(differ, 0u) << scheme << " " << t->name << ": values that differ from the reference reader";
        ++compared;
      }
    EXPECT_EQ(compared, ref.all().size()) << scheme << ": every quantized Linear of the reference is compared";
  }
}

}  // namespace
}  // namespace clefrt

namespace clefrt {
namespace {

// The one recipe the quantizer, the GPU loader and the memory plan share.
TEST(QuantRecipe, KeepListQuantizedLinearsAndScaleGroups) {
  for (const char* kept : {"in_proj_a", "in_proj_b", "model.language_model.layers.3.linear_attn.in_proj_a.weight",
                           "model.language_model.layers.3.linear_attn.conv1d.weight", "model.language_model.layers.3.input_layernorm.weight"})
    EXPECT_TRUE(quant::recipe_keeps_bf16(kept)) << kept;
  for (const char* run : {"in_proj_qkv", "in_proj_z", "out_proj", "gate_proj", "q_proj"}) EXPECT_FALSE(quant::recipe_keeps_bf16(run)) << run;
  const std::string l = "model.language_model.layers.0.";
  EXPECT_TRUE(quant::recipe_quantizes(l + "mlp.down_proj.weight", {64, 128}, true));
  EXPECT_FALSE(quant::recipe_quantizes(l + "mlp.down_proj.weight", {64, 120}, true));  // NVFP4 blocks of 16
  EXPECT_TRUE(quant::recipe_quantizes(l + "mlp.down_proj.weight", {64, 120}, false));  // FP8 has none
  EXPECT_FALSE(quant::recipe_quantizes(l + "linear_attn.in_proj_b.weight", {48, 128}, false));
  EXPECT_FALSE(quant::recipe_quantizes(l + "mlp.down_proj.bias", {64}, false));
  EXPECT_FALSE(quant::recipe_quantizes("model.language_model.embed_tokens.weight", {1000, 128}, false));
  EXPECT_EQ(quant::recipe_scale_group(l + "self_attn.k_proj.weight"), l + "self_attn.qkv");
  EXPECT_EQ(quant::recipe_scale_group(l + "mlp.up_proj.weight"), l + "mlp.gate_up");
  EXPECT_EQ(quant::recipe_scale_group(l + "linear_attn.in_proj_z.weight"), l + "linear_attn.in_proj_qkvz");
  EXPECT_EQ(quant::recipe_scale_group(l + "mlp.down_proj.weight"), l + "mlp.down_proj");
}

}  // namespace
}  // namespace clefrt

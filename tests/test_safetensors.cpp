#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "io/finite_check.h"
#include "io/safetensors.h"

namespace clefrt::io {
namespace {

namespace fs = std::filesystem;

struct Entry {
  std::string name, dtype, shape;  // shape as JSON, e.g. "[2,3]"
  size_t begin, end;
};

// Writes a safetensors file from a header built by hand (so tests can lie in it).
std::string write_file(const std::string& name, const std::string& header, size_t data_bytes, long declared_len = -1) {
  std::string path = testing::TempDir() + name;
  std::ofstream f(path, std::ios::binary);
  uint64_t n = declared_len >= 0 ? uint64_t(declared_len) : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  for (size_t k = 0; k < data_bytes; ++k) f.put(char(k * 7));
  return path;
}

std::string header_of(const std::vector<Entry>& es, const std::string& meta = "") {
  std::string h = "{";
  if (!meta.empty()) h += "\"__metadata__\":" + meta + ",";
  for (size_t k = 0; k < es.size(); ++k) {
    const auto& e = es[k];
    h += (k ? "," : "") + std::string("\"") + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":" + e.shape +
         ",\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  return h + "}";
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, ReadsAValidFile) {
  auto p = write_file("ok.safetensors", header_of({{"a", "BF16", "[2,3]", 0, 12}, {"b", "F32", "[]", 12, 16}}, R"({"format":"pt"})"), 16);
  auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo* a = f->find("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->dtype, DType::BF16);
  EXPECT_EQ(a->numel(), 6);
  EXPECT_EQ(a->shape_str(), "[2, 3]");
  EXPECT_EQ(f->find("b")->numel(), 1);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(a->data[1], 7);
}

TEST(Safetensors, RejectsBrokenFiles) {
  EXPECT_NE(error_of(testing::TempDir() + "nope.st").find("cannot open"), std::string::npos);
  {
    std::string p = testing::TempDir() + "tiny.st";
    std::ofstream(p) << "abc";
    EXPECT_NE(error_of(p).find("too short"), std::string::npos);
  }
  std::string h = header_of({{"a", "BF16", "[2,3]", 0, 12}});
  EXPECT_NE(error_of(write_file("trunc.st", h, 6)).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(write_file("liar.st", h, 12, 1 << 30)).find("header length"), std::string::npos);
  EXPECT_NE(error_of(write_file("json.st", "{\"a\":", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(write_file("dt.st", header_of({{"a", "Q4_K", "[2]", 0, 2}}), 2)).find("unknown dtype \"Q4_K\""), std::string::npos);
  EXPECT_NE(error_of(write_file("cnt.st", header_of({{"a", "F32", "[2,3]", 0, 12}}), 12)).find("needs 24"), std::string::npos);
  EXPECT_NE(error_of(write_file("ovl.st", header_of({{"a", "F32", "[2]", 0, 8}, {"b", "F32", "[2]", 4, 12}}), 12)).find("overlap"),
            std::string::npos);
  EXPECT_NE(error_of(write_file("neg.st", header_of({{"a", "F32", "[-2]", 0, 8}}), 8)).find("non-negative"), std::string::npos);
  EXPECT_NE(error_of(write_file("rev.st", header_of({{"a", "F32", "[0]", 8, 0}}), 8)).find("after end"), std::string::npos);
  // the error names the file and the tensor
  std::string e = error_of(write_file("named.st", header_of({{"model.x.weight", "F32", "[4]", 0, 8}}), 8));
  EXPECT_NE(e.find("named.st"), std::string::npos);
  EXPECT_NE(e.find("model.x.weight"), std::string::npos);
}

TEST(Safetensors, ShardedFolder) {
  std::string dir = testing::TempDir() + "sharded";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto make = [&](const std::string& name, const std::string& header, size_t n) {
    std::string p = write_file(name, header, n);
    fs::rename(p, dir + "/" + name);
  };
  make("model-00001-of-00002.safetensors", header_of({{"x", "BF16", "[4,2]", 0, 16}}), 16);
  make("model-00002-of-00002.safetensors", header_of({{"y", "F32", "[3]", 0, 12}}), 12);
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata":{"total_size":28},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})";
  TensorStore s = TensorStore::open_folder(dir);
  EXPECT_EQ(s.all().size(), 2u);
  EXPECT_EQ(s.total_bytes(), 28u);
  EXPECT_EQ(s.require("x", {4, 2}, {DType::BF16}).numel(), 8);
  auto msg = [&](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([&] { s.require("x", {2, 4}); }).find("has shape [4, 2], expected [2, 4]"), std::string::npos);
  EXPECT_NE(msg([&] { s.require("y", {3}, {DType::BF16, DType::F16}); }).find("dtype F32, expected BF16 or F16"), std::string::npos);
  EXPECT_NE(msg([&] { s.require("z", {1}); }).find("missing"), std::string::npos);
  // an index that places a tensor in a shard which lacks it
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00001-of-00002.safetensors"}})";
  EXPECT_NE(msg([&] { TensorStore::open_folder(dir); }).find("lacks tensor y"), std::string::npos);
  // a missing shard
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map":{"x":"model-00003-of-00003.safetensors"}})";
  EXPECT_NE(msg([&] { TensorStore::open_folder(dir); }).find("is missing"), std::string::npos);
  // a shard name that escapes the folder
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map":{"x":"../x.safetensors"}})";
  EXPECT_NE(msg([&] { TensorStore::open_folder(dir); }).find("outside the folder"), std::string::npos);
  EXPECT_NE(msg([&] { TensorStore::open_folder(testing::TempDir() + "nothing-here"); }).find("no model.safetensors"), std::string::npos);
}

// Every float dtype: NaN and infinity found by their bits, counted, the first located; finite
// extremes (the largest value, denormals, -0) left alone; integer tensors never flagged.
TEST(FiniteCheck, FindsNanAndInfinityInEveryFloatDtype) {
  struct Case {
    DType d;
    std::vector<uint64_t> finite, bad;  // codes of that width
  };
  const std::vector<Case> cases = {
      {DType::BF16, {0x0000, 0x8000, 0x7f7f, 0xff7f, 0x0001, 0x3f80}, {0x7f80, 0xff80, 0x7fc0, 0x7f81}},
      {DType::F16, {0x0000, 0x7bff, 0xfbff, 0x0001, 0x3c00}, {0x7c00, 0xfc00, 0x7e00}},
      {DType::F32, {0x00000000, 0x7f7fffff, 0x00000001, 0x3f800000}, {0x7f800000, 0xff800000, 0x7fc00000}},
      {DType::F64, {0, 0x7fefffffffffffffull, 1}, {0x7ff0000000000000ull, 0x7ff8000000000000ull}},
      {DType::F8_E4M3, {0x00, 0x7e, 0xfe, 0x01, 0x80}, {0x7f, 0xff}},  // e4m3fn: no infinity, S.1111.111 is NaN
      {DType::F8_E5M2, {0x00, 0x7b, 0xfb}, {0x7c, 0xfc, 0x7e}},
  };
  for (const auto& c : cases) {
    const size_t w = dtype_size(c.d);
    for (size_t n : {size_t(5), size_t(70000)}) {  // one block and several
      std::vector<uint8_t> buf(n * w);
      for (size_t i = 0; i < n; ++i) std::memcpy(buf.data() + i * w, &c.finite[i % c.finite.size()], w);
      TensorInfo t;
      t.name = "t";
      t.dtype = c.d;
      t.shape = {int64_t(n)};
      t.data = buf.data();
      t.nbytes = buf.size();
      EXPECT_EQ(find_non_finite(t).count, 0) << dtype_name(c.d);
      const size_t at = n - 3;
      for (uint64_t b : c.bad) {
        std::memcpy(buf.data() + at * w, &b, w);
        const NonFinite r = find_non_finite(t);
        EXPECT_EQ(r.count, 1) << dtype_name(c.d) << " code " << b;
        EXPECT_EQ(r.first, int64_t(at));
      }
      std::memcpy(buf.data() + 1 * w, &c.bad[0], w);
      EXPECT_EQ(find_non_finite(t).first, 1);
      EXPECT_EQ(find_non_finite(t).count, 2);
    }
  }
  std::vector<uint8_t> ints(64, 0xff);
  TensorInfo t;
  t.dtype = DType::U8;  // NVFP4's packed codes: no such values
  t.shape = {64};
  t.data = ints.data();
  EXPECT_EQ(find_non_finite(t).count, 0);
}

TEST(FiniteCheck, StoreCheckNamesFileAndTensor) {
  // two bf16 tensors, the second with an infinity at index 2
  const std::string header = header_of({{"a.weight", "BF16", "[4]", 0, 8}, {"b.weight", "BF16", "[2,2]", 8, 16}});
  std::string path = testing::TempDir() + "finite.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    const uint16_t vals[8] = {0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x7f80, 0x3f80};
    f.write(reinterpret_cast<const char*>(vals), sizeof vals);
  }
  TensorStore s;
  s.add_file(path);
  try {
    check_finite(s);
    FAIL() << "an infinity passed the check";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), path);
    EXPECT_NE(e.message().find("b.weight"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("1 non-finite value"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("index 2: infinity"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace clefrt::io

#include "io/safetensors_write.h"

#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/json.h"

namespace clefrt::io {

uint16_t f32_to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffff) > 0x7f800000) return uint16_t((b >> 16) | 0x40);  // quiet NaN
  b += 0x7fff + ((b >> 16) & 1);
  return uint16_t(b >> 16);
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = f32_to_bf16(v[i]);
    out[2 * i] = uint8_t(h & 0xff);
    out[2 * i + 1] = uint8_t(h >> 8);
  }
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<OutTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  json::Value h = json::Value::object();
  json::Value meta = json::Value::object();
  for (const auto& [k, v] : metadata) meta.add(k, json::Value::string(v));
  h.add("__metadata__", meta);
  uint64_t off = 0;
  for (const auto& t : tensors) {
    json::Value e = json::Value::object();
    e.add("dtype", json::Value::string(dtype_name(t.dtype)));
    json::Value shape = json::Value::array();
    for (int64_t d : t.shape) shape.arr.push_back(json::Value::integer(d));
    e.add("shape", shape);
    json::Value offs = json::Value::array();
    offs.arr.push_back(json::Value::integer(int64_t(off)));
    off += t.bytes.size();
    offs.arr.push_back(json::Value::integer(int64_t(off)));
    e.add("data_offsets", offs);
    h.add(t.name, e);
  }
  std::string header = json::write(h);
  while (header.size() % 8) header.push_back(' ');  // keep tensor data 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  if (!f) throw load_error(path, "cannot create");
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), std::streamsize(header.size()));
  for (const auto& t : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  if (!f) throw load_error(path, "write failed (disk full?)");
}

}  // namespace clefrt::io

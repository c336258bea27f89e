#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/file.h"
#include "common/json.h"

namespace clefrt::io {

namespace fs = std::filesystem;

namespace {
struct DTypeName {
  DType d;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},   {DType::F32, "F32", 4},         {DType::F64, "F64", 8},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}, {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},     {DType::U16, "U16", 2},   {DType::I16, "I16", 2},         {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::U64, "U64", 8},   {DType::I64, "I64", 8},
};
// A header larger than this is not a weight file we should trust (the 27B shards have ~100 KB).
constexpr uint64_t kMaxHeader = 100ull << 20;
}  // namespace

size_t dtype_size(DType d) {
  for (const auto& x : kDTypes)
    if (x.d == d) return x.size;
  return 0;
}
const char* dtype_name(DType d) {
  for (const auto& x : kDTypes)
    if (x.d == d) return x.name;
  return "?";
}
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& x : kDTypes)
    if (name == x.name) return x.d;
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}
int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
std::string TensorInfo::shape_str() const { return io::shape_str(shape); }

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw load_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw load_error(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  f->size_ = size_t(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw load_error(path, "file is " + std::to_string(f->size_) + " bytes: too short for a safetensors header");
  }
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw load_error(path, std::string("cannot mmap: ") + std::strerror(errno));
  f->map_ = m;
  const auto* base = static_cast<const uint8_t*>(m);
  uint64_t hlen = 0;
  std::memcpy(&hlen, base, 8);  // little-endian u64 (x86-64 and aarch64 are little-endian)
  if (hlen > kMaxHeader || hlen > f->size_ - 8)
    throw load_error(path, "header length " + std::to_string(hlen) + " does not fit in the file of " +
                               std::to_string(f->size_) + " bytes (truncated or not a safetensors file)");
  std::string_view header(reinterpret_cast<const char*>(base + 8), size_t(hlen));
  json::Value h;
  try {
    json::ParseOptions po;
    po.max_depth = 8;
    h = json::parse(header, po);
  } catch (const Error& e) {
    throw load_error(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) throw load_error(path, "header is not a JSON object");
  const uint8_t* data = base + 8 + hlen;
  const size_t data_size = f->size_ - 8 - size_t(hlen);
  for (const auto& [name, v] : h.obj) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw load_error(path, "__metadata__ must be an object of strings");
      for (const auto& [k, mv] : v.obj) {
        if (!mv.is_string()) throw load_error(path, "__metadata__." + k + " must be a string");
        f->metadata_[k] = mv.s;
      }
      continue;
    }
    const std::string& tensor = name;  // clang 14 cannot capture a structured binding (C++20 allows it; clang from 16)
    auto err = [&](const std::string& msg) { return load_error(path, "tensor " + tensor + ": " + msg); };
    if (!v.is_object()) throw err("entry is not an object");
    const json::Value* dt = v.find("dtype");
    const json::Value* sh = v.find("shape");
    const json::Value* off = v.find("data_offsets");
    if (!dt || !dt->is_string()) throw err("missing dtype");
    auto dtype = parse_dtype(dt->s);
    if (!dtype) throw err("unknown dtype \"" + dt->s + "\"");
    if (!sh || !sh->is_array()) throw err("missing shape");
    if (!off || !off->is_array() || off->arr.size() != 2) throw err("data_offsets must be [begin, end]");
    TensorInfo t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : sh->arr) {
      if (d.kind != json::Value::Kind::Int || d.i < 0) throw err("shape entries must be non-negative integers");
      t.shape.push_back(d.i);
      if (d.i != 0 && numel > (uint64_t(1) << 62) / uint64_t(d.i)) throw err("shape " + t.shape_str() + " is too large");
      numel *= uint64_t(d.i);
    }
    for (const auto& o : off->arr)
      if (o.kind != json::Value::Kind::Int || o.i < 0) throw err("data_offsets must be non-negative integers");
    uint64_t b = uint64_t(off->arr[0].i), e = uint64_t(off->arr[1].i);
    if (b > e) throw err("data_offsets begin " + std::to_string(b) + " is after end " + std::to_string(e));
    if (e > data_size)
      throw err("data ends at byte " + std::to_string(e) + " but the file holds " + std::to_string(data_size) +
                " data bytes (truncated file?)");
    uint64_t want = numel * dtype_size(*dtype);
    if (e - b != want)
      throw err(std::to_string(e - b) + " bytes for shape " + t.shape_str() + " of " + dt->s + ", which needs " +
                std::to_string(want));
    t.data = data + b;
    t.nbytes = size_t(e - b);
    f->tensors_.push_back(std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo*> order;
  for (const auto& t : f->tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t k = 1; k < order.size(); ++k)
    if (order[k - 1]->nbytes && order[k]->data < order[k - 1]->data + order[k - 1]->nbytes)
      throw load_error(path, "tensors " + order[k - 1]->name + " and " + order[k]->name + " overlap");
  for (size_t k = 0; k < f->tensors_.size(); ++k) {
    f->tensors_[k].file = &f->path_;
    f->index_.emplace(f->tensors_[k].name, k);
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

TensorStore TensorStore::open_folder(const std::string& dir) {
  TensorStore s;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    std::string text = read_file(index.string());
    json::Value v;
    try {
      v = json::parse(text);
    } catch (const Error& e) {
      throw load_error(index.string(), std::string("not valid JSON: ") + e.what());
    }
    const json::Value* wm = v.find("weight_map");
    if (!wm || !wm->is_object()) throw load_error(index.string(), "missing \"weight_map\" object");
    std::vector<std::string> shards;
    for (const auto& [name, file] : wm->obj) {
      if (!file.is_string()) throw load_error(index.string(), "weight_map[\"" + name + "\"] must be a file name");
      if (file.s.find('/') != std::string::npos || file.s == "..")
        throw load_error(index.string(), "weight_map[\"" + name + "\"] names a file outside the folder: " + file.s);
      if (std::find(shards.begin(), shards.end(), file.s) == shards.end()) shards.push_back(file.s);
    }
    for (const auto& sh : shards) {
      fs::path p = fs::path(dir) / sh;
      if (!fs::exists(p)) throw load_error(p.string(), "shard listed in model.safetensors.index.json is missing");
      s.add_file(p.string());
    }
    for (const auto& [name, file] : wm->obj) {
      const TensorInfo* t = s.find(name);
      if (!t || fs::path(*t->file).filename() != file.s)
        throw load_error((fs::path(dir) / file.s).string(), "lacks tensor " + name + " that the index places there");
    }
  } else if (fs::exists(single)) {
    s.add_file(single.string());
  } else {
    throw load_error(dir, "no model.safetensors.index.json or model.safetensors in the folder");
  }
  return s;
}

void TensorStore::add_file(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  for (const auto& t : f->tensors()) {
    auto [it, fresh] = by_name_.emplace(t.name, &t);
    if (!fresh) throw load_error(path, "tensor " + t.name + " is also in " + *it->second->file);
  }
  files_.push_back(std::move(f));
}

const TensorInfo* TensorStore::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& TensorStore::require(std::string_view name, const std::vector<int64_t>& shape,
                                       const std::vector<DType>& dtypes) const {
  const TensorInfo* t = find(name);
  if (!t) throw load_error(std::string(name), "tensor is missing from the weights");
  if (t->shape != shape)
    throw load_error(*t->file, "tensor " + t->name + " has shape " + t->shape_str() + ", expected " + shape_str(shape));
  if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
    std::string list;
    for (DType d : dtypes) list += std::string(list.empty() ? "" : " or ") + dtype_name(d);
    throw load_error(*t->file, "tensor " + t->name + " has dtype " + dtype_name(t->dtype) + ", expected " + list);
  }
  return *t;
}

std::vector<const TensorInfo*> TensorStore::all() const {
  std::vector<const TensorInfo*> v;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) v.push_back(&t);
  return v;
}

size_t TensorStore::total_bytes() const {
  size_t n = 0;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) n += t.nbytes;
  return n;
}

}  // namespace clefrt::io

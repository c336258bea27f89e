// Safetensors files (mmap), single or sharded through `model.safetensors.index.json`, with full
// validation: header length and JSON, dtype names, shapes, offsets inside the file, byte counts
// that match shape x dtype, and no overlapping tensors. Every error names the file and tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace clefrt::io {

enum class DType : uint8_t { BF16, F16, F32, F64, F8_E4M3, F8_E5M2, BOOL, U8, I8, U16, I16, U32, I32, U64, I64 };
size_t dtype_size(DType d);
const char* dtype_name(DType d);  // the safetensors spelling: "BF16", "F8_E4M3", ...
std::optional<DType> parse_dtype(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the file it lives in
  int64_t numel() const;
  std::string shape_str() const;  // "[5120, 17408]"
};

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a folder: `model.safetensors.index.json` + shards, or a single
// `model.safetensors`, plus any extra files added by name (e.g. joint_head.safetensors).
class TensorStore {
 public:
  // Opens the backbone weights of a release folder. Throws load_error naming the missing or
  // broken file, or a tensor listed in the index that its shard lacks.
  static TensorStore open_folder(const std::string& dir);
  // Adds every tensor of one file (names must not clash with those already present).
  void add_file(const std::string& path);

  const TensorInfo* find(std::string_view name) const;
  // The tensor, checked for dtype (one of `dtypes`, empty = any) and exact shape.
  const TensorInfo& require(std::string_view name, const std::vector<int64_t>& shape,
                            const std::vector<DType>& dtypes = {}) const;
  std::vector<const TensorInfo*> all() const;
  size_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const TensorInfo*> by_name_;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace clefrt::io

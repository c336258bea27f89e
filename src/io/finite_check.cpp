#include "io/finite_check.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace clefrt::io {

namespace {

// The exponent field all ones is NaN or infinity; the mantissa tells which.
template <typename U>
NonFinite scan(const uint8_t* data, int64_t n, U exp_mask, U man_mask) {
  NonFinite r;
  constexpr int64_t kBlock = (1 << 14) / int64_t(sizeof(U)) * 2;  // 32 KiB a block: fits L1 with room
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // the common case (nothing found) is one branch-free pass per block; a hit is then counted exactly
  std::vector<uint8_t> hit(size_t(blocks), 0);
#pragma omp parallel for schedule(static) if (n > (1 << 20))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t beg = b * kBlock, end = std::min(n, beg + kBlock);
    U block[kBlock];  // aligned lanes for the vectorized test (the file's data need not be aligned)
    std::memcpy(block, data + size_t(beg) * sizeof(U), size_t(end - beg) * sizeof(U));
    unsigned count = 0;
#pragma omp simd reduction(+ : count)
    for (int64_t i = 0; i < end - beg; ++i) count += unsigned((block[i] & exp_mask) == exp_mask);
    hit[size_t(b)] = count != 0;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (!hit[size_t(b)]) continue;
    const int64_t beg = b * kBlock, end = std::min(n, beg + kBlock);
    for (int64_t i = beg; i < end; ++i) {
      U v;
      std::memcpy(&v, data + size_t(i) * sizeof(U), sizeof(U));
      if ((v & exp_mask) != exp_mask) continue;
      if (r.first < 0) {
        r.first = i;
        r.first_is_nan = (v & man_mask) != 0;
      }
      ++r.count;
    }
  }
  return r;
}

// e4m3 (the OCP "fn" variant safetensors' F8_E4M3 names) has no infinity; S.1111.111 is NaN.
NonFinite scan_e4m3(const uint8_t* data, int64_t n) {
  NonFinite r;
  for (int64_t i = 0; i < n; ++i) {
    if ((data[i] & 0x7f) != 0x7f) continue;
    if (r.first < 0) {
      r.first = i;
      r.first_is_nan = true;
    }
    ++r.count;
  }
  return r;
}

}  // namespace

NonFinite find_non_finite(const TensorInfo& t) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::BF16: return scan<uint16_t>(t.data, n, 0x7f80, 0x007f);
    case DType::F16: return scan<uint16_t>(t.data, n, 0x7c00, 0x03ff);
    case DType::F32: return scan<uint32_t>(t.data, n, 0x7f800000u, 0x007fffffu);
    case DType::F64: return scan<uint64_t>(t.data, n, 0x7ff0000000000000ull, 0x000fffffffffffffull);
    case DType::F8_E4M3: return scan_e4m3(t.data, n);
    case DType::F8_E5M2: return scan<uint8_t>(t.data, n, 0x7c, 0x03);
    default: return {};
  }
}

void check_finite(const TensorStore& store, const std::function<void(size_t bytes)>& on_tensor) {
  for (const TensorInfo* t : store.all()) {
    const NonFinite r = find_non_finite(*t);
    if (on_tensor) on_tensor(t->nbytes);
    if (r.count == 0) continue;
    throw load_error(t->file ? *t->file : t->name,
                     "tensor " + t->name + " (" + dtype_name(t->dtype) + " " + t->shape_str() + ") holds " + std::to_string(r.count) +
                         " non-finite value" + (r.count == 1 ? "" : "s") + " (the first at flat index " + std::to_string(r.first) + ": " +
                         (r.first_is_nan ? "NaN" : "infinity") + "); the folder is corrupt or was written from a diverged model");
  }
}

}  // namespace clefrt::io

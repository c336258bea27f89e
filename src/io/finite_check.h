// Non-finite weights (NaN, infinity) found at load, before they can turn into answers: each
// floating-point tensor's values are tested by their bits (BF16, F16, F32, F64, F8_E4M3's NaN
// codes, F8_E5M2). Integer and packed tensors (NVFP4's U8 codes) cannot hold such values.
#pragma once
#include <cstdint>
#include <functional>

#include "io/safetensors.h"

namespace clefrt::io {

struct NonFinite {
  int64_t count = 0;   // values that are NaN or infinite
  int64_t first = -1;  // flat index of the first one
  bool first_is_nan = false;
};

NonFinite find_non_finite(const TensorInfo& t);

// Every tensor of the store; throws load_error naming the file and the first bad tensor (and
// how many values of it are bad).
// on_tensor: called after each tensor with its bytes (progress).
void check_finite(const TensorStore& store, const std::function<void(size_t bytes)>& on_tensor = {});

}  // namespace clefrt::io

// What CRUXEval's kit builder does with Python values (docs/notes/decision-index-kit.md 3):
// ast.literal_eval of a literal, repr() of the value, and Python's == between values (numbers
// across bool / int / float, dicts and sets without order). Only what literals can hold: None,
// bool, int, float, str, bytes, tuple, list, dict, set.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace clefrt::eval {

struct PyValue {
  enum class Kind { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Set } kind = Kind::None;
  bool b = false;
  int64_t i = 0;                // Int within int64
  std::string big;              // Int beyond int64: its decimal digits with sign ("" when i holds it)
  double f = 0;
  std::string s;                // Str (UTF-8) or Bytes
  std::vector<PyValue> items;   // Tuple / List / Set; Dict: key, value, key, value, ...
};

// ast.literal_eval(text), or nothing where Python raises (ValueError, SyntaxError, TypeError:
// unhashable keys / set items, MemoryError) or where a literal is beyond what this reads
// (complex numbers, \N{...} escapes): the builder skips such candidates either way.
std::optional<PyValue> literal_eval(const std::string& text);
std::string repr(const PyValue& v);
bool py_equal(const PyValue& a, const PyValue& b);

// CPython's random.Random(seed_string).shuffle over n items: the permutation, applied as
// out[k] = in[perm[k]].
std::vector<size_t> python_shuffle(const std::string& seed, size_t n);

}  // namespace clefrt::eval

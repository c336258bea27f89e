// JSON values that keep object key order, a fast parser (simdjson), and two writers:
//  - write(): the value as given (key order kept), for our own responses;
//  - dumps(): byte for byte Python's json.dumps(v, ensure_ascii=False, separators=(",",":"),
//    sort_keys=True);
//  - render(): the prompt's render(v) (spec/model.md 3): a string as is, anything else dumps(v).
// Numbers keep Python's int/float distinction: `1` is an int, `1.0` and `1e5` are floats.
// Integers must fit in int64 or uint64; larger ones are rejected (422), not rounded.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clefrt::json {

struct Value;
using Member = std::pair<std::string, Value>;

struct Value {
  enum class Kind : uint8_t { Null, Bool, Int, UInt, Double, String, Array, Object };
  Kind kind = Kind::Null;
  bool b = false;
  int64_t i = 0;   // Kind::Int
  uint64_t u = 0;  // Kind::UInt: only for values above INT64_MAX
  double d = 0;    // Kind::Double
  std::string s;
  std::vector<Value> arr;
  std::vector<Member> obj;  // in document order; duplicate keys merged like Python's dict

  Value() = default;
  static Value null() { return {}; }
  static Value boolean(bool v) { Value x; x.kind = Kind::Bool; x.b = v; return x; }
  static Value integer(int64_t v) { Value x; x.kind = Kind::Int; x.i = v; return x; }
  static Value number(double v) { Value x; x.kind = Kind::Double; x.d = v; return x; }
  static Value string(std::string v) { Value x; x.kind = Kind::String; x.s = std::move(v); return x; }
  static Value array() { Value x; x.kind = Kind::Array; return x; }
  static Value object() { Value x; x.kind = Kind::Object; return x; }

  bool is_null() const { return kind == Kind::Null; }
  bool is_string() const { return kind == Kind::String; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }

  const Value* find(std::string_view key) const;  // nullptr when absent
  Value& add(std::string key, Value v);           // appends (no duplicate check)
  bool operator==(const Value& o) const;
};

// Code point order of two UTF-8 strings (= byte order): how Python sorts str keys.
bool codepoint_less(std::string_view a, std::string_view b);

// Name of a kind for error messages ("an object", "a string", ...).
const char* kind_name(Value::Kind k);

struct ParseOptions {
  size_t max_depth = 128;  // nesting beyond this is a 400, never a stack overflow
};

// Parses a whole document. Throws clefrt::Error: 400 for malformed JSON or invalid UTF-8,
// 422 for numbers that do not fit (integers beyond 64 bits, floats beyond double range).
Value parse(std::string_view text, const ParseOptions& opts = {});

// Appends `s` as a JSON string literal with Python's ensure_ascii=False escaping:
// \" \\ \n \r \t \b \f, other control characters as \u00xx, everything else raw.
void write_string(std::string& out, std::string_view s);

// Python float repr (shortest round-trip digits): 0.1, 1.0, 1e-05, 1e+16, -0.0.
std::string float_repr(double x);

// Python round(x, ndigits) for the small ndigits we need (correctly rounded, half to even
// on the exact binary value, as CPython's dtoa-based round does).
double py_round(double x, int ndigits);

void write(std::string& out, const Value& v);  // key order kept
std::string write(const Value& v);
void dumps(std::string& out, const Value& v);  // sort_keys=True, Python spelling
std::string dumps(const Value& v);
void render(std::string& out, const Value& v);  // strings raw, the rest dumps()
std::string render(const Value& v);

}  // namespace clefrt::json

#include "common/json.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "common/error.h"

namespace clefrt::json {

const Value* Value::find(std::string_view key) const {
  for (const auto& m : obj)
    if (m.first == key) return &m.second;
  return nullptr;
}

Value& Value::add(std::string key, Value v) {
  obj.emplace_back(std::move(key), std::move(v));
  return obj.back().second;
}

bool Value::operator==(const Value& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::Null: return true;
    case Kind::Bool: return b == o.b;
    case Kind::Int: return i == o.i;
    case Kind::UInt: return u == o.u;
    case Kind::Double: return d == o.d && std::signbit(d) == std::signbit(o.d);
    case Kind::String: return s == o.s;
    case Kind::Array: return arr == o.arr;
    case Kind::Object: return obj == o.obj;
  }
  return false;
}

bool codepoint_less(std::string_view x, std::string_view y) {
  int c = std::memcmp(x.data(), y.data(), std::min(x.size(), y.size()));
  return c != 0 ? c < 0 : x.size() < y.size();
}

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Int:
    case Value::Kind::UInt:
    case Value::Kind::Double: return "a number";
    case Value::Kind::String: return "a string";
    case Value::Kind::Array: return "an array";
    case Value::Kind::Object: return "an object";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

// simdjson reports both "01" and "1e400" / 2^70 as NUMBER_ERROR. To say which (400 vs 422) and
// where, find the first numeric token outside strings that either is malformed or overflows.
// The error names the value's JSON path ("state.n", "questions.a.levels[2]") as the request
// checks do, from the containers open at the token (keys as written, escapes and all).
[[noreturn]] void explain_number_error(std::string_view t) {
  struct Frame {
    bool object;
    std::string_view key;
    size_t index = 0;
    bool want_key = true;
  };
  std::vector<Frame> open;
  auto path_here = [&] {
    std::string path;
    for (const Frame& f : open) {
      if (f.object) path += (path.empty() ? "" : ".") + std::string(f.key);
      else path += "[" + std::to_string(f.index) + "]";
    }
    return path;
  };
  bool in_str = false;
  size_t str_at = 0;
  for (size_t p = 0; p < t.size(); ++p) {
    char c = t[p];
    if (in_str) {
      if (c == '\\') ++p;
      else if (c == '"') {
        in_str = false;
        if (!open.empty() && open.back().object && open.back().want_key) {
          open.back().key = t.substr(str_at + 1, p - str_at - 1);
          open.back().want_key = false;
        }
      }
      continue;
    }
    if (c == '"') { in_str = true; str_at = p; continue; }
    if (c == '{' || c == '[') { open.push_back(Frame{c == '{', {}, 0, true}); continue; }
    if ((c == '}' || c == ']') && !open.empty()) { open.pop_back(); continue; }
    if (c == ',' && !open.empty()) {
      if (open.back().object) open.back().want_key = true;
      else ++open.back().index;
      continue;
    }
    if (c != '-' && !(c >= '0' && c <= '9')) continue;
    size_t e = p;
    while (e < t.size() && std::strchr("+-.eE0123456789", t[e]) && t[e] != '\0') ++e;
    std::string_view tok = t.substr(p, e - p);
    // JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    size_t q = 0;
    bool ok = true, is_int = true;
    if (q < tok.size() && tok[q] == '-') ++q;
    if (q < tok.size() && tok[q] == '0') ++q;
    else if (q < tok.size() && tok[q] >= '1' && tok[q] <= '9') { while (q < tok.size() && isdigit((unsigned char)tok[q])) ++q; }
    else ok = false;
    if (ok && q < tok.size() && tok[q] == '.') {
      is_int = false; ++q; size_t d0 = q;
      while (q < tok.size() && isdigit((unsigned char)tok[q])) ++q;
      ok = q > d0;
    }
    if (ok && q < tok.size() && (tok[q] == 'e' || tok[q] == 'E')) {
      is_int = false; ++q;
      if (q < tok.size() && (tok[q] == '+' || tok[q] == '-')) ++q;
      size_t d0 = q;
      while (q < tok.size() && isdigit((unsigned char)tok[q])) ++q;
      ok = q > d0;
    }
    ok = ok && q == tok.size();
    std::string where = path_here();
    if (where.empty()) where = "offset " + std::to_string(p);  // a bare number as the document
    std::string shown(tok.substr(0, 40));
    if (!ok) throw bad_request(where, "malformed JSON number '" + shown + "'");
    if (is_int) {
      errno = 0;
      std::string s(tok);
      if (s[0] == '-') { (void)std::strtoll(s.c_str(), nullptr, 10); }
      else { (void)std::strtoull(s.c_str(), nullptr, 10); }
      if (errno == ERANGE)
        throw unprocessable(where, "integer " + shown + " does not fit in 64 bits (clefrt rejects integers outside int64/uint64 rather than rounding them)");
    } else {
      double d = std::strtod(std::string(tok).c_str(), nullptr);
      if (std::isinf(d)) throw unprocessable(where, "number " + shown + " is outside the range of a double");
    }
    p = e - 1;  // the loop steps past the number; its next character (a comma, a bracket) is read
  }
  throw bad_request("", "malformed JSON: invalid number");
}

Value convert(simdjson::dom::element el) {
  using T = simdjson::dom::element_type;
  Value v;
  switch (el.type()) {
    case T::NULL_VALUE: return v;
    case T::BOOL: return Value::boolean(bool(el.get_bool()));
    case T::INT64: return Value::integer(int64_t(el.get_int64()));
    case T::UINT64: {
      uint64_t u = el.get_uint64();
      if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
      v.kind = Value::Kind::UInt;
      v.u = u;
      return v;
    }
    case T::DOUBLE: return Value::number(double(el.get_double()));
    case T::STRING: return Value::string(std::string(std::string_view(el.get_string())));
    case T::ARRAY: {
      v = Value::array();
      simdjson::dom::array a = el.get_array();
      v.arr.reserve(a.size());
      for (auto x : a) v.arr.push_back(convert(x));
      return v;
    }
    case T::OBJECT: {
      v = Value::object();
      simdjson::dom::object o = el.get_object();
      // Python's json.loads builds a dict: a repeated key keeps its first position and its
      // last value. We do the same so prompts equal the reference's.
      std::unordered_map<std::string_view, size_t> index;
      for (auto field : o) {
        std::string_view k = field.key;
        auto [it, fresh] = index.emplace(k, v.obj.size());
        if (fresh) v.obj.emplace_back(std::string(k), convert(field.value));
        else v.obj[it->second].second = convert(field.value);
      }
      return v;
    }
  }
  return v;
}

}  // namespace

Value parse(std::string_view text, const ParseOptions& opts) {
  thread_local simdjson::dom::parser parser;
  thread_local size_t depth_set = 0;
  if (depth_set != opts.max_depth) {
    // allocate() keeps capacity growth automatic; only the depth is fixed here.
    if (parser.allocate(std::max<size_t>(text.size(), 64), opts.max_depth) != simdjson::SUCCESS)
      throw Error(Status::Internal, "internal_error", "cannot allocate the JSON parser");
    depth_set = opts.max_depth;
  }
  simdjson::padded_string padded(text);
  simdjson::dom::element root;
  auto err = parser.parse(padded).get(root);
  if (err == simdjson::NUMBER_ERROR) explain_number_error(text);
  if (err == simdjson::DEPTH_ERROR)
    throw bad_request("", "JSON nesting deeper than " + std::to_string(opts.max_depth) + " levels");
  if (err == simdjson::UTF8_ERROR) throw bad_request("", "body is not valid UTF-8");
  if (err == simdjson::EMPTY) throw bad_request("", "empty body: expected a JSON document");
  if (err) throw bad_request("", std::string("malformed JSON: ") + simdjson::error_message(err));
  return convert(root);
}

// ---------------------------------------------------------------------------------------------
// Writing

void write_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out.push_back('"');
  size_t run = 0;  // start of the pending run of bytes that need no escape
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, k - run);
    run = k + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        out += "\\u00";
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 15]);
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "NaN";  // json.dumps spelling (never produced from parsed input)
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  // Shortest digits that round-trip, in scientific form: [-]d[.ddd]e[+-]XX
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, size_t(res.ptr - buf));
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') { out.push_back('-'); p = 1; }
  size_t epos = sci.find('e');
  std::string digits;
  for (size_t k = p; k < epos; ++k)
    if (sci[k] != '.') digits.push_back(sci[k]);
  int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  int nd = int(digits.size());
  // CPython float_repr_style 'short', mode 'r': exponent form when decpt <= -4 or decpt > 16
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (decpt >= nd) {
      out += digits;
      out.append(size_t(decpt - nd), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(decpt));
      out.push_back('.');
      out += digits.substr(size_t(decpt));
    }
  } else {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    int e = decpt - 1;
    out.push_back('e');
    out.push_back(e < 0 ? '-' : '+');
    int ae = e < 0 ? -e : e;
    if (ae < 10) out.push_back('0');
    out += std::to_string(ae);
  }
  return out;
}

double py_round(double x, int ndigits) {
  if (!std::isfinite(x)) return x;
  char buf[512];
  // glibc's printf rounds the exact binary value, ties to even: the same as CPython's round.
  std::snprintf(buf, sizeof buf, "%.*f", ndigits, x);
  return std::strtod(buf, nullptr);
}

namespace {

bool key_less(const Member* a, const Member* b) { return codepoint_less(a->first, b->first); }

void write_value(std::string& out, const Value& v, bool sort_keys) {
  switch (v.kind) {
    case Value::Kind::Null: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::UInt: out += std::to_string(v.u); return;
    case Value::Kind::Double: out += float_repr(v.d); return;
    case Value::Kind::String: write_string(out, v.s); return;
    case Value::Kind::Array:
      out.push_back('[');
      for (size_t k = 0; k < v.arr.size(); ++k) {
        if (k) out.push_back(',');
        write_value(out, v.arr[k], sort_keys);
      }
      out.push_back(']');
      return;
    case Value::Kind::Object: {
      std::vector<const Member*> order;
      order.reserve(v.obj.size());
      for (const auto& m : v.obj) order.push_back(&m);
      if (sort_keys) std::sort(order.begin(), order.end(), key_less);
      out.push_back('{');
      for (size_t k = 0; k < order.size(); ++k) {
        if (k) out.push_back(',');
        write_string(out, order[k]->first);
        out.push_back(':');
        write_value(out, order[k]->second, sort_keys);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

void write(std::string& out, const Value& v) { write_value(out, v, false); }
std::string write(const Value& v) { std::string s; write(s, v); return s; }
void dumps(std::string& out, const Value& v) { write_value(out, v, true); }
std::string dumps(const Value& v) { std::string s; dumps(s, v); return s; }
void render(std::string& out, const Value& v) {
  if (v.kind == Value::Kind::String) { out += v.s; return; }  // spec: a string renders as is
  write_value(out, v, true);
}
std::string render(const Value& v) { std::string s; render(s, v); return s; }

}  // namespace clefrt::json

#include "eval/pyliteral.h"

#include <openssl/evp.h>
#include <utf8proc.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/json.h"

namespace clefrt::eval {

namespace {

struct Fail {};  // Python would raise: the candidate is skipped

bool hashable(const PyValue& v) {
  using K = PyValue::Kind;
  if (v.kind == K::List || v.kind == K::Dict || v.kind == K::Set) return false;
  if (v.kind == K::Tuple)
    for (const auto& x : v.items)
      if (!hashable(x)) return false;
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > 0x10FFFF) throw Fail{};
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(utf8proc_int32_t(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
}

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}
  PyValue parse() {
    // literal_eval strips leading spaces and tabs; the rest must be one expression
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t')) ++p_;
    PyValue v = expr();
    skip_ws(true);
    if (p_ != t_.size()) throw Fail{};
    return v;
  }

 private:
  const std::string& t_;
  size_t p_ = 0;
  int depth_ = 0;  // inside brackets newlines are whitespace

  void skip_ws(bool newlines) {
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c == ' ' || c == '\t' || c == '\f') ++p_;
      else if ((c == '\n' || c == '\r') && (newlines || depth_ > 0)) ++p_;
      else if (c == '\\' && p_ + 1 < t_.size() && t_[p_ + 1] == '\n') p_ += 2;
      else if (c == '#') {
        while (p_ < t_.size() && t_[p_] != '\n') ++p_;
      } else break;
    }
  }
  bool eat(char c) {
    skip_ws(false);
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    skip_ws(false);
    const size_t n = std::strlen(w);
    if (t_.compare(p_, n, w) != 0) return false;
    if (p_ + n < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_ + n])) || t_[p_ + n] == '_')) return false;
    p_ += n;
    return true;
  }

  PyValue expr() {
    skip_ws(false);
    if (p_ >= t_.size()) throw Fail{};
    // unary +/- on numbers only (and binary +/- would be complex: not read)
    if (t_[p_] == '-' || t_[p_] == '+') {
      const bool neg = t_[p_] == '-';
      ++p_;
      PyValue v = expr_atom_number_only();
      if (neg) negate(v);
      return v;
    }
    return atom();
  }
  PyValue expr_atom_number_only() {
    skip_ws(false);
    if (p_ < t_.size() && (t_[p_] == '-' || t_[p_] == '+')) {
      const bool neg = t_[p_] == '-';
      ++p_;
      PyValue v = expr_atom_number_only();
      if (neg) negate(v);
      return v;
    }
    PyValue v = atom();
    if (v.kind != PyValue::Kind::Int && v.kind != PyValue::Kind::Float) throw Fail{};  // -True etc. are not literals
    return v;
  }
  static void negate(PyValue& v) {
    if (v.kind == PyValue::Kind::Float) v.f = -v.f;
    else if (v.kind == PyValue::Kind::Int) {
      if (!v.big.empty()) v.big = v.big[0] == '-' ? v.big.substr(1) : "-" + v.big;
      else if (v.i == INT64_MIN) throw Fail{};
      else v.i = -v.i;
    } else throw Fail{};
  }

  PyValue atom() {
    skip_ws(false);
    if (p_ >= t_.size()) throw Fail{};
    const char c = t_[p_];
    if (c == '(' || c == '[' || c == '{') return container();
    if (word("None")) return PyValue{};
    if (word("True")) return boolean(true);
    if (word("False")) return boolean(false);
    if (word("set")) {  // set() (literal_eval takes the empty set call)
      if (!eat('(') || !eat(')')) throw Fail{};
      PyValue v;
      v.kind = PyValue::Kind::Set;
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && p_ + 1 < t_.size() && std::isdigit(static_cast<unsigned char>(t_[p_ + 1]))))
      return number();
    return strings();
  }
  static PyValue boolean(bool b) {
    PyValue v;
    v.kind = PyValue::Kind::Bool;
    v.b = b;
    return v;
  }

  PyValue container() {
    const char open = t_[p_++], close = open == '(' ? ')' : open == '[' ? ']' : '}';
    ++depth_;
    std::vector<PyValue> items;
    bool dict = false, any_comma = false;
    skip_ws(true);
    if (!eat(close)) {
      for (;;) {
        items.push_back(expr());
        if (open == '{' && items.size() == 1 && eat(':')) dict = true;
        if (dict) {
          if (items.size() % 2 == 1) {
            if (items.size() > 1 && !eat(':')) throw Fail{};
            items.push_back(expr());
          }
        }
        skip_ws(true);
        if (eat(',')) {
          any_comma = true;
          skip_ws(true);
          if (eat(close)) break;
          continue;
        }
        if (eat(close)) break;
        throw Fail{};
      }
    }
    --depth_;
    PyValue v;
    if (open == '(') {
      if (items.size() == 1 && !any_comma) return items[0];  // parentheses, not a tuple
      v.kind = PyValue::Kind::Tuple;
    } else if (open == '[') v.kind = PyValue::Kind::List;
    else if (dict || items.empty()) v.kind = PyValue::Kind::Dict;
    else v.kind = PyValue::Kind::Set;
    if (v.kind == PyValue::Kind::Dict) {
      // keys hashable; a repeated key keeps its first position and the last value
      std::vector<PyValue> out;
      for (size_t k = 0; k + 1 < items.size(); k += 2) {
        if (!hashable(items[k])) throw Fail{};
        bool found = false;
        for (size_t m = 0; m < out.size(); m += 2)
          if (py_equal(out[m], items[k])) {
            out[m + 1] = items[k + 1];
            found = true;
            break;
          }
        if (!found) {
          out.push_back(items[k]);
          out.push_back(items[k + 1]);
        }
      }
      v.items = std::move(out);
    } else if (v.kind == PyValue::Kind::Set) {
      for (const auto& x : items) {
        if (!hashable(x)) throw Fail{};
        bool found = false;
        for (const auto& y : v.items) found = found || py_equal(x, y);
        if (!found) v.items.push_back(x);
      }
      if (v.items.size() > 1) throw Fail{};  // iteration order is hash order: not reproduced here
    } else {
      v.items = std::move(items);
    }
    return v;
  }

  PyValue number() {
    const size_t start = p_;
    std::string digits;
    auto take_digits = [&](auto ok) {
      std::string d;
      while (p_ < t_.size() && (ok(t_[p_]) || t_[p_] == '_')) {
        if (t_[p_] != '_') d += t_[p_];
        ++p_;
      }
      return d;
    };
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    if (t_[p_] == '0' && p_ + 1 < t_.size() && std::strchr("xXoObB", t_[p_ + 1])) {
      const char base = char(std::tolower(t_[p_ + 1]));
      p_ += 2;
      const std::string d = take_digits([&](char ch) {
        return base == 'x' ? std::isxdigit(static_cast<unsigned char>(ch)) != 0 : base == 'o' ? (ch >= '0' && ch <= '7') : (ch == '0' || ch == '1');
      });
      if (d.empty() || d.size() > 15) throw Fail{};
      PyValue v;
      v.kind = PyValue::Kind::Int;
      v.i = int64_t(std::stoull(d, nullptr, base == 'x' ? 16 : base == 'o' ? 8 : 2));
      return v;
    }
    digits = take_digits(dec);
    bool is_float = false;
    std::string text = digits;
    if (p_ < t_.size() && t_[p_] == '.') {
      is_float = true;
      ++p_;
      text += "." + take_digits(dec);
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      is_float = true;
      ++p_;
      text += "e";
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) text += t_[p_++];
      const std::string ex = take_digits(dec);
      if (ex.empty()) throw Fail{};
      text += ex;
    }
    if (p_ < t_.size() && (t_[p_] == 'j' || t_[p_] == 'J')) throw Fail{};  // complex: not read
    if (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_')) throw Fail{};
    (void)start;
    PyValue v;
    if (is_float) {
      v.kind = PyValue::Kind::Float;
      v.f = std::strtod(text.c_str(), nullptr);
      return v;
    }
    if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos) throw Fail{};  // 012 is a SyntaxError
    v.kind = PyValue::Kind::Int;
    const size_t nz = std::min(digits.find_first_not_of('0'), digits.size() - 1);
    digits = digits.substr(nz);
    if (digits.size() < 19) v.i = std::stoll(digits);
    else v.big = digits;
    return v;
  }

  // one or more adjacent string literals (implicitly concatenated; str and bytes do not mix)
  PyValue strings() {
    PyValue v;
    bool first = true;
    for (;;) {
      skip_ws(false);
      size_t q = p_;
      bool raw = false, bytes = false;
      while (q < t_.size() && std::strchr("rRbBuU", t_[q]) && q - p_ < 2) {
        const char ch = char(std::tolower(t_[q]));
        if (ch == 'r') raw = true;
        if (ch == 'b') bytes = true;
        ++q;
      }
      if (q >= t_.size() || (t_[q] != '\'' && t_[q] != '"')) {
        if (first) throw Fail{};
        break;
      }
      if (q - p_ == 2 && !raw) throw Fail{};  // "ub" etc.
      p_ = q;
      std::string piece = string_body(raw, bytes);
      if (first) {
        v.kind = bytes ? PyValue::Kind::Bytes : PyValue::Kind::Str;
      } else if ((v.kind == PyValue::Kind::Bytes) != bytes) throw Fail{};
      v.s += piece;
      first = false;
    }
    return v;
  }

  std::string string_body(bool raw, bool bytes) {
    const char qc = t_[p_];
    const bool triple = t_.compare(p_, 3, std::string(3, qc)) == 0;
    p_ += triple ? 3 : 1;
    std::string out;
    for (;;) {
      if (p_ >= t_.size()) throw Fail{};
      const char c = t_[p_];
      if (triple ? t_.compare(p_, 3, std::string(3, qc)) == 0 : c == qc) {
        p_ += triple ? 3 : 1;
        return out;
      }
      if (!triple && (c == '\n' || c == '\r')) throw Fail{};
      if (bytes && static_cast<unsigned char>(c) >= 0x80) throw Fail{};  // bytes literals hold ASCII only
      if (c != '\\' || raw) {
        if (c == '\\' && raw && p_ + 1 < t_.size()) {  // raw: the backslash stays, and keeps the next char from ending the string
          out += c;
          out += t_[p_ + 1];
          p_ += 2;
          continue;
        }
        out += c;
        ++p_;
        continue;
      }
      ++p_;
      if (p_ >= t_.size()) throw Fail{};
      const char e = t_[p_++];
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': {
          if (p_ + 2 > t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[p_])) || !std::isxdigit(static_cast<unsigned char>(t_[p_ + 1]))) throw Fail{};
          const uint32_t cp = uint32_t(std::stoul(t_.substr(p_, 2), nullptr, 16));
          p_ += 2;
          if (bytes) out += char(cp);
          else append_utf8(out, cp);
          break;
        }
        case 'u':
        case 'U': {
          if (bytes) {
            out += '\\';
            out += e;
            break;
          }
          const size_t n = e == 'u' ? 4 : 8;
          if (p_ + n > t_.size()) throw Fail{};
          for (size_t k = 0; k < n; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(t_[p_ + k]))) throw Fail{};
          append_utf8(out, uint32_t(std::stoul(t_.substr(p_, n), nullptr, 16)));
          p_ += n;
          break;
        }
        case 'N': throw Fail{};
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '7'; ++k) cp = cp * 8 + uint32_t(t_[p_++] - '0');
            if (bytes) out += char(cp & 0xFF);
            else append_utf8(out, cp);
          } else {  // an unknown escape keeps its backslash
            out += '\\';
            out += e;
          }
      }
    }
  }
};

// str.isprintable() for one code point: not in Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs (space excepted)
bool printable(uint32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string repr_str(const std::string& s, bool bytes) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out = bytes ? "b" : "";
  out += q;
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (!bytes && c >= 0x80) {
      utf8proc_int32_t u;
      const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), utf8proc_ssize_t(s.size() - i), &u);
      if (n <= 0) throw Fail{};
      cp = uint32_t(u);
      len = size_t(n);
    }
    if (cp == uint32_t(q) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\t') out += "\\t";
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (bytes ? (cp < 0x20 || cp >= 0x7F) : (cp < 0x20 || cp == 0x7F)) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (bytes || cp < 0x80 || printable(cp)) out.append(s, i, len);
    else {
      if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
    i += len;
  }
  out += q;
  return out;
}

bool numeric(const PyValue& v) { return v.kind == PyValue::Kind::Bool || v.kind == PyValue::Kind::Int || v.kind == PyValue::Kind::Float; }

}  // namespace

std::optional<PyValue> literal_eval(const std::string& text) {
  try {
    return Parser(text).parse();
  } catch (const Fail&) {
    return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string repr(const PyValue& v) {
  using K = PyValue::Kind;
  auto join = [](const std::vector<PyValue>& xs, size_t from, size_t step) {
    std::string s;
    for (size_t k = from; k < xs.size(); k += step) s += (k > from ? ", " : "") + repr(xs[k]);
    return s;
  };
  switch (v.kind) {
    case K::None: return "None";
    case K::Bool: return v.b ? "True" : "False";
    case K::Int: return v.big.empty() ? std::to_string(v.i) : v.big;
    case K::Float:
      if (std::isnan(v.f)) return "nan";
      if (std::isinf(v.f)) return v.f > 0 ? "inf" : "-inf";
      return json::float_repr(v.f);
    case K::Str: return repr_str(v.s, false);
    case K::Bytes: return repr_str(v.s, true);
    case K::List: return "[" + join(v.items, 0, 1) + "]";
    case K::Tuple: return v.items.size() == 1 ? "(" + repr(v.items[0]) + ",)" : "(" + join(v.items, 0, 1) + ")";
    case K::Set: return v.items.empty() ? "set()" : "{" + join(v.items, 0, 1) + "}";
    case K::Dict: {
      std::string s = "{";
      for (size_t k = 0; k + 1 < v.items.size(); k += 2) s += (k ? ", " : "") + repr(v.items[k]) + ": " + repr(v.items[k + 1]);
      return s + "}";
    }
  }
  return "";
}

bool py_equal(const PyValue& a, const PyValue& b) {
  using K = PyValue::Kind;
  if (numeric(a) && numeric(b)) {
    auto as_double = [](const PyValue& x) { return x.kind == K::Bool ? double(x.b) : x.kind == K::Int ? (x.big.empty() ? double(x.i) : std::stod(x.big)) : x.f; };
    if (a.kind != K::Float && b.kind != K::Float) {  // integers exactly
      const bool abig = a.kind == K::Int && !a.big.empty(), bbig = b.kind == K::Int && !b.big.empty();
      if (abig || bbig) return abig && bbig && a.big == b.big;
      const int64_t x = a.kind == K::Bool ? int64_t(a.b) : a.i, y = b.kind == K::Bool ? int64_t(b.b) : b.i;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::None: return true;
    case K::Str:
    case K::Bytes: return a.s == b.s;
    case K::List:
    case K::Tuple:
      if (a.items.size() != b.items.size()) return false;
      for (size_t k = 0; k < a.items.size(); ++k)
        if (!py_equal(a.items[k], b.items[k])) return false;
      return true;
    case K::Set:
      if (a.items.size() != b.items.size()) return false;
      for (const auto& x : a.items) {
        bool found = false;
        for (const auto& y : b.items) found = found || py_equal(x, y);
        if (!found) return false;
      }
      return true;
    case K::Dict:
      if (a.items.size() != b.items.size()) return false;
      for (size_t k = 0; k + 1 < a.items.size(); k += 2) {
        bool found = false;
        for (size_t m = 0; m + 1 < b.items.size() && !found; m += 2)
          if (py_equal(a.items[k], b.items[m])) found = py_equal(a.items[k + 1], b.items[m + 1]);
        if (!found) return false;
      }
      return true;
    default: return false;
  }
}

namespace {

// MT19937 as CPython's random module runs it.
struct Mt {
  uint32_t mt[624];
  int mti = 625;
  void init_genrand(uint32_t s) {
    mt[0] = s;
    for (mti = 1; mti < 624; ++mti) mt[mti] = 1812433253u * (mt[mti - 1] ^ (mt[mti - 1] >> 30)) + uint32_t(mti);
  }
  void init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218u);
    size_t i = 1, j = 0;
    for (size_t k = std::max<size_t>(624, key.size()); k; --k) {
      mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
      ++i, ++j;
      if (i >= 624) mt[0] = mt[623], i = 1;
      if (j >= key.size()) j = 0;
    }
    for (size_t k = 623; k; --k) {
      mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
      ++i;
      if (i >= 624) mt[0] = mt[623], i = 1;
    }
    mt[0] = 0x80000000u;
    mti = 624;
  }
  uint32_t next() {
    static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
    if (mti >= 624) {
      int kk = 0;
      for (; kk < 624 - 397; ++kk) {
        const uint32_t y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
        mt[kk] = mt[kk + 397] ^ (y >> 1) ^ mag01[y & 1u];
      }
      for (; kk < 623; ++kk) {
        const uint32_t y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
        mt[kk] = mt[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
      }
      const uint32_t y = (mt[623] & 0x80000000u) | (mt[0] & 0x7fffffffu);
      mt[623] = mt[396] ^ (y >> 1) ^ mag01[y & 1u];
      mti = 0;
    }
    uint32_t y = mt[mti++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
  }
  uint32_t getrandbits(int k) { return next() >> (32 - k); }  // k <= 32
  size_t randbelow(size_t n) {
    int k = 0;
    while ((size_t(1) << k) <= n) ++k;  // n.bit_length()
    size_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }
};

}  // namespace

std::vector<size_t> python_shuffle(const std::string& seed, size_t n) {
  // random.seed(str), version 2: the int from the bytes s + sha512(s), big-endian, fed as 32-bit
  // words, least significant first
  std::string bytes = seed;
  unsigned char md[64];
  unsigned int len = 0;
  EVP_Digest(seed.data(), seed.size(), md, &len, EVP_sha512(), nullptr);
  bytes.append(reinterpret_cast<const char*>(md), len);
  std::vector<uint32_t> key;
  for (size_t end = bytes.size(); end > 0;) {
    const size_t begin = end >= 4 ? end - 4 : 0;
    uint32_t w = 0;
    for (size_t k = begin; k < end; ++k) w = (w << 8) | static_cast<unsigned char>(bytes[k]);
    key.push_back(w);
    end = begin;
  }
  while (key.size() > 1 && key.back() == 0) key.pop_back();
  Mt mt;
  mt.init_by_array(key);
  std::vector<size_t> perm(n);
  for (size_t k = 0; k < n; ++k) perm[k] = k;
  for (size_t i = n; i-- > 1;) std::swap(perm[i], perm[mt.randbelow(i + 1)]);
  return perm;
}

}  // namespace clefrt::eval

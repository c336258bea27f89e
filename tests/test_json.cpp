#include <gtest/gtest.h>

#include <sstream>

#include "common/error.h"
#include "common/json.h"
#include "test_util.h"

namespace clefrt {
namespace {

std::string dumps_of(const std::string& text) { return json::dumps(json::parse(text)); }

int status_of(const std::string& text) {
  try {
    json::parse(text);
  } catch (const Error& e) {
    return e.http_status();
  }
  return 0;
}

TEST(Json, FloatReprMatchesPython) {
  EXPECT_EQ(json::float_repr(0.1), "0.1");
  EXPECT_EQ(json::float_repr(1.0), "1.0");
  EXPECT_EQ(json::float_repr(1e-05), "1e-05");
  EXPECT_EQ(json::float_repr(0.0001), "0.0001");
  EXPECT_EQ(json::float_repr(1e16), "1e+16");
  EXPECT_EQ(json::float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(json::float_repr(-0.0), "-0.0");
  EXPECT_EQ(json::float_repr(0.0), "0.0");
  EXPECT_EQ(json::float_repr(123456789.0), "123456789.0");
  EXPECT_EQ(json::float_repr(0.30000000000000004), "0.30000000000000004");
  EXPECT_EQ(json::float_repr(5e-324), "5e-324");
  EXPECT_EQ(json::float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(json::float_repr(-1.25e-7), "-1.25e-07");
  EXPECT_EQ(json::float_repr(1e22), "1e+22");
  EXPECT_EQ(json::float_repr(9007199254740993.0), "9007199254740992.0");
}

TEST(Json, RenderKeepsPythonSpelling) {
  EXPECT_EQ(dumps_of(R"({"b":1,"a":[1.0,2,"x"],"é":null,"A":true})"), R"({"A":true,"a":[1.0,2,"x"],"b":1,"é":null})");
  EXPECT_EQ(dumps_of("1e5"), "100000.0");
  EXPECT_EQ(dumps_of("-0"), "0");
  EXPECT_EQ(dumps_of("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(dumps_of("-9223372036854775808"), "-9223372036854775808");
  EXPECT_EQ(dumps_of(R"("\u0001\u001f\u007f\b\f\n\r\t\"\\/")"), "\"\\u0001\\u001f\x7f\\b\\f\\n\\r\\t\\\"\\\\/\"");
  EXPECT_EQ(dumps_of(R"("\ud83d\ude00")"), "\"😀\"");
  // a string renders raw into the prompt; inside a structure it is escaped
  EXPECT_EQ(json::render(json::Value::string("a\"b\n")), "a\"b\n");
  // code point order: U+FFFF sorts before U+1F600 (UTF-16 order would differ)
  EXPECT_EQ(dumps_of(R"({"😀":1,"\uffff":2})"), "{\"\xef\xbf\xbf\":2,\"😀\":1}");
}

TEST(Json, DuplicateKeysBehaveLikePythonDict) {
  auto v = json::parse(R"({"a":1,"b":2,"a":3})");
  ASSERT_EQ(v.obj.size(), 2u);
  EXPECT_EQ(v.obj[0].first, "a");
  EXPECT_EQ(v.obj[0].second.i, 3);
  EXPECT_EQ(json::write(v), R"({"a":3,"b":2})");
}

TEST(Json, KeepsKeyOrder) {
  auto v = json::parse(R"({"z":1,"a":2,"m":3})");
  EXPECT_EQ(json::write(v), R"({"z":1,"a":2,"m":3})");
}

TEST(Json, ErrorsAreClassified) {
  EXPECT_EQ(status_of("{"), 400);
  EXPECT_EQ(status_of(""), 400);
  EXPECT_EQ(status_of("[1,]"), 400);
  EXPECT_EQ(status_of("01"), 400);
  EXPECT_EQ(status_of("\"\xff\""), 400);          // invalid UTF-8
  EXPECT_EQ(status_of("123456789012345678901234"), 422);  // integer beyond 64 bits
  EXPECT_EQ(status_of("-9223372036854775809"), 422);
  EXPECT_EQ(status_of("[1e400]"), 422);
  EXPECT_EQ(status_of(std::string(200, '[') + std::string(200, ']')), 400);  // nesting limit
  EXPECT_EQ(status_of("[\"a\", 2] x"), 400);
  try {
    json::parse(R"({"a": "x\"]", "b": 99999999999999999999})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("99999999999999999999"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("64 bits"), std::string::npos);
  }
}

// A number simdjson refuses is named by its JSON path, as the request checks name fields.
TEST(Json, NumberErrorsNameTheirPath) {
  auto where = [](const std::string& text) {
    try {
      json::parse(text);
    } catch (const Error& e) {
      return e.where();
    }
    return std::string("parsed");
  };
  EXPECT_EQ(where(R"({"state":{"n":123456789012345678901234567890},"questions":{}})"), "state.n");
  EXPECT_EQ(where(R"({"a": "x\"]", "b": [0, {"c": [1, 2, 1e400]}]})"), "b[1].c[2]");
  EXPECT_EQ(where(R"({"q":{"x":[1,{"y":2}],"z":01}})"), "q.z");
  EXPECT_EQ(where(R"([[], {}, 99999999999999999999])"), "[2]");
  EXPECT_EQ(where("123456789012345678901234"), "offset 0");  // a bare number: no path
}

TEST(Json, PyRoundIsHalfEvenOnTheBinaryValue) {
  EXPECT_EQ(json::py_round(0.03125, 4), 0.0312);  // exact tie -> even
  // Values Python's round(x, 4) gives (checked with CPython 3.11): the binary value decides.
  EXPECT_EQ(json::py_round(0.03135, 4), 0.0314);  // 0.031350000000000002864... > tie
  EXPECT_EQ(json::py_round(0.99995, 4), 1.0);     // 0.999950000000000005506... > tie
  EXPECT_EQ(json::py_round(0.00015, 4), 0.0001);  // below the tie in binary
  EXPECT_EQ(json::py_round(0.00025, 4), 0.0003);
  EXPECT_EQ(json::py_round(1.00005, 4), 1.0001);
  EXPECT_EQ(json::py_round(0.12345678, 4), 0.1235);
  EXPECT_EQ(json::float_repr(json::py_round(0.5, 4)), "0.5");
  EXPECT_EQ(json::float_repr(json::py_round(1.0 / 3, 4)), "0.3333");
  EXPECT_EQ(json::float_repr(json::py_round(2.95735, 4)), "2.9573");
}

// Python's json.dumps on 554 tricky and random documents (tools/reference/render_ref.py).
TEST(Json, RenderParityWithPython) {
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/render_cases.jsonl")));
  std::string line;
  size_t n = 0, bad = 0;
  while (std::getline(in, line)) {
    auto rec = json::parse(line);
    const std::string& text = rec.find("json")->s;
    const std::string& want = rec.find("dumps")->s;
    std::string got = dumps_of(text);
    ++n;
    if (got != want && ++bad <= 5) ADD_FAILURE() << "input " << text << "\n  got:  " << got << "\n  want: " << want;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GE(n, 500u);
}

TEST(Json, ErrorBodyShape) {
  Error e = unprocessable("questions.a.type", "unknown question type");
  EXPECT_EQ(e.http_status(), 422);
  EXPECT_EQ(e.to_json(),
            R"({"error":{"type":"validation_error","message":"questions.a.type: unknown question type","details":{"path":"questions.a.type"}}})");
}

}  // namespace
}  // namespace clefrt

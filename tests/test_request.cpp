// One test per validation rule: the status and the JSON path of the offending field.
#include <gtest/gtest.h>

#include "common/error.h"
#include "schema/images.h"
#include "schema/request.h"
#include "test_util.h"

namespace clefrt {
namespace {

std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }
std::string png_header(uint32_t w, uint32_t h) {
  return std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(w) + be32(h) + std::string("\x08\x02\x00\x00\x00", 5) + be32(0);
}
std::string jpeg_header(uint16_t w, uint16_t h) {
  std::string s("\xFF\xD8\xFF\xE0\x00\x04\x00\x00", 8);  // SOI + APP0 (length 4)
  s += std::string("\xFF\xC0\x00\x0B\x08", 5) + char(h >> 8) + char(h) + char(w >> 8) + char(w) + std::string("\x01\x01\x11\x00", 4);
  return s;
}
std::string webp_vp8x(uint32_t w, uint32_t h) {
  std::string s = "RIFF" + std::string(4, '\0') + "WEBPVP8X" + std::string("\x0a\0\0\0", 4) + std::string(4, '\0');
  w -= 1;
  h -= 1;
  s += {char(w), char(w >> 8), char(w >> 16), char(h), char(h >> 8), char(h >> 16)};
  return s;
}

const char* kQ = R"("questions":{"q":{"type":"noul","instructions":"Is it?"}})";

struct Case {
  const char* name;
  std::string body;
  int status;
  std::string path;
};

std::string with_q(const std::string& q) { return R"({"state":"s","questions":{"q":)" + q + "}}"; }

std::vector<Case> cases() {
  std::string many_q = R"({"state":"s","questions":{)";
  for (int k = 0; k < 65; ++k) many_q += (k ? "," : "") + std::string("\"q") + std::to_string(k) + R"(":{"type":"noul"})";
  many_q += "}}";
  std::string many_labels = "{";
  for (int k = 0; k < 256; ++k) many_labels += (k ? "," : "") + std::string("\"l") + std::to_string(k) + "\":null";
  many_labels += "}";
  std::string png = "data:image/png;base64," + test::base64(png_header(64, 64));
  return {
      {"malformed json", "{\"state\":", 400, ""},
      {"not an object", "[1,2]", 400, ""},
      {"unknown top-level field", std::string(R"({"state":"s","temperature":1,)") + kQ + "}", 422, "temperature"},
      {"missing state", std::string("{") + kQ + "}", 400, "state"},
      {"state is a number", std::string(R"({"state":3,)") + kQ + "}", 400, "state"},
      {"state is null", std::string(R"({"state":null,)") + kQ + "}", 400, "state"},
      {"model not a string", std::string(R"({"model":1,"state":"s",)") + kQ + "}", 400, "model"},
      {"missing questions", R"({"state":"s"})", 400, "questions"},
      {"questions is an array", R"({"state":"s","questions":[]})", 400, "questions"},
      {"no questions", R"({"state":"s","questions":{}})", 422, "questions"},
      {"65 questions", many_q, 422, "questions"},
      {"bad id", R"({"state":"s","questions":{"a b":{"type":"noul"}}})", 422, "questions[\"a b\"]"},
      {"id too long", R"({"state":"s","questions":{")" + std::string(101, 'x') + R"(":{"type":"noul"}}})", 422, "questions.xxx"},
      {"question not an object", with_q("3"), 400, "questions.q"},
      {"unknown question field", with_q(R"({"type":"noul","weight":2})"), 422, "questions.q.weight"},
      {"missing type", with_q(R"({"instructions":"x"})"), 400, "questions.q.type"},
      {"type not a string", with_q(R"({"type":1})"), 400, "questions.q.type"},
      {"unknown type", with_q(R"({"type":"multi"})"), 422, "questions.q.type"},
      {"noul criteria not an object", with_q(R"({"type":"noul","criteria":["a"]})"), 400, "questions.q.criteria"},
      {"noul criteria unknown key", with_q(R"({"type":"noul","criteria":{"maybe":"x"}})"), 422, "questions.q.criteria.maybe"},
      {"choice without criteria", with_q(R"({"type":"choice"})"), 400, "questions.q.criteria"},
      {"choice criteria array", with_q(R"({"type":"choice","criteria":["a","b"]})"), 400, "questions.q.criteria"},
      {"choice with 1 label", with_q(R"({"type":"choice","criteria":{"a":null}})"), 422, "questions.q.criteria"},
      {"choice with 256 labels", with_q(R"({"type":"choice","criteria":)" + many_labels + "}"), 422, "questions.q.criteria"},
      {"score without criteria", with_q(R"({"type":"score"})"), 400, "questions.q.criteria"},
      {"score criteria object", with_q(R"({"type":"score","criteria":{"a":1}})"), 400, "questions.q.criteria"},
      {"score with 1 level", with_q(R"({"type":"score","criteria":["a"]})"), 422, "questions.q.criteria"},
      {"score with 11 levels", with_q(R"({"type":"score","criteria":[1,2,3,4,5,6,7,8,9,10,11]})"), 422, "questions.q.criteria"},
      {"images not an array", std::string(R"({"state":"s","images":"x",)") + kQ + "}", 400, "images"},
      {"5 images", std::string(R"({"state":"s","images":[")") + png + "\",\"" + png + "\",\"" + png + "\",\"" + png + "\",\"" + png + "\"]," + kQ + "}", 422, "images"},
      {"remote image url", std::string(R"({"state":"s","images":["https://example.com/a.png"],)") + kQ + "}", 422, "images[0]"},
      {"image not data url", std::string(R"({"state":"s","images":["abc"],)") + kQ + "}", 422, "images[0]"},
      {"image bad mime", std::string(R"({"state":"s","images":["data:image/gif;base64,R0lG"],)") + kQ + "}", 422, "images[0]"},
      {"image not base64 encoded url", std::string(R"({"state":"s","images":["data:image/png,abc"],)") + kQ + "}", 422, "images[0]"},
      {"image bad base64", std::string(R"({"state":"s","images":["data:image/png;base64,@@@@"],)") + kQ + "}", 422, "images[0]"},
      {"image bytes not an image", std::string(R"({"state":"s","images":["data:image/png;base64,)") + test::base64("hello world!") + "\"]," + kQ + "}", 422, "images[0]"},
      {"image type mismatch", std::string(R"({"state":"s","images":["data:image/jpeg;base64,)") + test::base64(png_header(8, 8)) + "\"]," + kQ + "}", 422, "images[0]"},
      {"image truncated header", std::string(R"({"state":"s","images":["data:image/png;base64,)") + test::base64(png_header(8, 8).substr(0, 16)) + "\"]," + kQ + "}", 422, "images[0]"},
      {"image over 16 megapixels", std::string(R"({"state":"s","images":["data:image/png;base64,)") + test::base64(png_header(5000, 4000)) + "\"]," + kQ + "}", 422, "images[0]"},
      {"image object missing base64", std::string(R"({"state":"s","images":[{"content_type":"image/png"}],)") + kQ + "}", 400, "images[0].base64"},
      {"image object unknown field", std::string(R"({"state":"s","images":[{"content_type":"image/png","base64":"","url":"x"}],)") + kQ + "}", 422, "images[0].url"},
      {"image a number", std::string(R"({"state":"s","images":[3],)") + kQ + "}", 400, "images[0]"},
      {"integer beyond 64 bits", R"({"state":{"n":123456789012345678901234567890},)" + std::string(kQ) + "}", 422, ""},
      {"nesting too deep", R"({"state":)" + std::string(300, '[') + std::string(300, ']') + "," + kQ + "}", 400, ""},
  };
}

TEST(Request, EachRuleHasItsStatusAndPath) {
  for (const Case& c : cases()) {
    try {
      parse_request(c.body);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.http_status(), c.status) << c.name << ": " << e.what();
      if (!c.path.empty()) EXPECT_EQ(e.where().substr(0, c.path.size()), c.path) << c.name << ": " << e.what();
    }
  }
}

TEST(Request, BodyLimitIs413) {
  std::string body = R"({"state":")" + std::string(14u << 20, 'a') + "\"," + kQ + "}";
  try {
    parse_request(body);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 413);
  }
}

TEST(Request, RequireInstructionsIsOptIn) {
  std::string body = with_q(R"({"type":"noul","instructions":""})");
  Request r = parse_request(body);
  EXPECT_EQ(r.questions[0].instructions.s, "q");  // the reference falls back to the id
  RequestLimits strict;
  strict.require_instructions = true;
  try {
    parse_request(body, strict);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.http_status(), 422);
    EXPECT_EQ(e.where(), "questions.q.instructions");
  }
}

TEST(Request, OptionsInEncodedOrder) {
  Request r = parse_request(R"({"state":{"a":1},"questions":{
    "n":{"type":"noul","criteria":{"false":null}},
    "c":{"type":"choice","criteria":{"tech":"outages","billing":"payments","Zeta":null,"é":1}},
    "s":{"type":"score","criteria":["low",null,{"x":1}]}}})");
  ASSERT_EQ(r.questions.size(), 3u);
  const auto& n = r.questions[0];
  EXPECT_EQ(n.options[0].label, "true");
  EXPECT_EQ(n.options[0].description.s, kNoulTrueDescription);
  EXPECT_FALSE(n.options[1].has_description);
  const auto& c = r.questions[1];
  std::vector<std::string> labels;
  for (auto& o : c.options) labels.push_back(o.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"Zeta", "billing", "tech", "é"}));  // code point order
  EXPECT_EQ(c.caller_order, (std::vector<size_t>{2, 1, 0, 3}));                    // tech, billing, Zeta, é
  const auto& s = r.questions[2];
  EXPECT_EQ(s.options[2].label, "2");
  EXPECT_FALSE(s.options[1].has_description);
  EXPECT_EQ(s.levels.size(), 3u);
}

TEST(Request, ImagesAcceptedInEveryForm) {
  std::string body = std::string(R"({"state":"s","images":["data:image/png;base64,)") + test::base64(png_header(640, 480)) +
                     R"(",{"content_type":"image/jpeg","base64":")" + test::base64(jpeg_header(300, 200)) +
                     R"("},"data:image/webp;base64,)" + test::base64(webp_vp8x(1000, 10)) + "\"]," + kQ + "}";
  Request r = parse_request(body);
  ASSERT_EQ(r.images.size(), 3u);
  EXPECT_EQ(r.images[0].width, 640u);
  EXPECT_EQ(r.images[0].height, 480u);
  EXPECT_EQ(r.images[1].width, 300u);
  EXPECT_EQ(r.images[1].height, 200u);
  EXPECT_EQ(r.images[2].width, 1000u);
  EXPECT_EQ(r.images[2].height, 10u);
}

TEST(Base64, StrictDecoding) {
  EXPECT_EQ(*base64_decode("aGVsbG8=", 100), "hello");
  EXPECT_EQ(*base64_decode("aGVsbG8", 100), "hello");
  EXPECT_EQ(*base64_decode("", 100), "");
  EXPECT_FALSE(base64_decode("aGVsbG8==", 100));  // wrong padding
  EXPECT_FALSE(base64_decode("aGV sbG8", 100));
  EXPECT_FALSE(base64_decode("a", 100));
  EXPECT_FALSE(base64_decode("aGVsbG8=", 4));  // over the limit
  for (int n = 0; n < 40; ++n) {
    std::string s;
    for (int k = 0; k < n; ++k) s.push_back(char(k * 37 + n));
    EXPECT_EQ(*base64_decode(test::base64(s), 100), s);
  }
}

}  // namespace
}  // namespace clefrt

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/json.h"
#include "schema/answers.h"

namespace clefrt {
namespace {

const char* kBlog = R"({"model":"clef","state":"s","questions":{
  "outage":{"type":"noul","instructions":"Is a service down?"},
  "team":{"type":"choice","criteria":{"billing":"payments","tech":"outages","sales":null}},
  "severity":{"type":"score","criteria":["No impact","Minor","Major","Critical"]}}})";

TEST(Answers, BlogExampleShape) {
  Request r = parse_request(kBlog);
  // encoded order: team = billing, sales, tech
  std::vector<std::vector<double>> p = {{0.99061, 0.00939}, {0.17624, 0.015, 0.80876}, {0.0042, 0.0043, 0.0215, 0.97}};
  std::string got = response_json("clef", r, p, Usage{346, 0, 0}, {});
  EXPECT_EQ(got,
            R"({"model":"clef","answers":{"outage":{"type":"noul","noul":0.9906},)"
            R"("team":{"type":"choice","choice":"tech","probabilities":{"billing":0.1762,"tech":0.8088,"sales":0.015},"confidence":0.8088},)"
            R"("severity":{"type":"score","score":2.9573,"legend":{"0":"No impact","1":"Minor","2":"Major","3":"Critical"},)"
            R"("probabilities":{"0":0.0042,"1":0.0043,"2":0.0215,"3":0.97},"confidence":0.97}},"usage":{"input_tokens":346,"output_tokens":0,"cached_tokens":0}})");
}

TEST(Answers, TiesGoToTheFirstLabelInCallerOrder) {
  Request r = parse_request(R"({"state":"s","questions":{"c":{"type":"choice","criteria":{"zeta":null,"alpha":null}}}})");
  // encoded order is alpha, zeta; the caller listed zeta first
  auto a = build_answers(r, {{0.5, 0.5}}, {});
  EXPECT_EQ(a.find("c")->find("choice")->s, "zeta");
}

TEST(Answers, ConfidenceFormulas) {
  std::vector<double> p = {0.7, 0.2, 0.1};
  EXPECT_DOUBLE_EQ(confidence_of(p, Confidence::Reference), 0.7);
  EXPECT_NEAR(confidence_of(p, Confidence::Purity), (0.49 + 0.04 + 0.01 - 1.0 / 3) / (1 - 1.0 / 3), 1e-12);
  EXPECT_NEAR(confidence_of(p, Confidence::Jev), (0.7 - 1.0 / 3) / (1 - 1.0 / 3), 1e-12);
  EXPECT_EQ(parse_confidence("purity"), Confidence::Purity);
  EXPECT_THROW(parse_confidence("max"), std::invalid_argument);
}

TEST(Answers, PreciseKeepsEveryDigit) {
  Request r = parse_request(R"({"state":"s","questions":{"n":{"type":"noul"}}})");
  AnswerOptions o;
  o.precise = true;
  auto a = build_answers(r, {{0.123456789, 0.876543211}}, o);
  EXPECT_EQ(json::write(a), R"({"n":{"type":"noul","noul":0.123456789}})");
}

TEST(Answers, MismatchedEngineOutputIsAnInternalError) {
  Request r = parse_request(R"({"state":"s","questions":{"n":{"type":"noul"}}})");
  EXPECT_THROW(build_answers(r, {{0.5, 0.3, 0.2}}, {}), Error);
  EXPECT_THROW(build_answers(r, {}, {}), Error);
}

}  // namespace
}  // namespace clefrt

// System One answers from per-option probabilities (spec/protocol.md "Response").
#pragma once
#include <string>
#include <vector>

#include "common/json.h"
#include "schema/request.h"

namespace clefrt {

enum class Confidence {
  Reference,  // max p (the reference code; default)
  Purity,     // (sum p^2 - 1/n) / (1 - 1/n) (hosted Clef)
  Jev,        // (max p - 1/n) / (1 - 1/n)
};
Confidence parse_confidence(const std::string& name);  // throws for unknown names

struct AnswerOptions {
  Confidence confidence = Confidence::Reference;
  bool precise = false;  // numbers unrounded (default: Python round(x, 4))
};

// probs[q] holds question q's probabilities in encoded option order (noul: true, false;
// choice: labels sorted by code point; score: levels 0..n-1).
json::Value build_answers(const Request& req, const std::vector<std::vector<double>>& probs, const AnswerOptions& opts);

// The whole response: {"model", "answers", "usage": {"input_tokens", "output_tokens": 0}}.
std::string response_json(const std::string& model, const Request& req, const std::vector<std::vector<double>>& probs,
                           size_t input_tokens, const AnswerOptions& opts);

double confidence_of(const std::vector<double>& p, Confidence c);

}  // namespace clefrt

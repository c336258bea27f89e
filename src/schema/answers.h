// System One answers from per-option probabilities (spec/protocol.md "Response").
#pragma once
#include <clefrt/clefrt.h>

#include <string>
#include <vector>

#include "common/json.h"
#include "schema/request.h"

namespace clefrt {

// Confidence, parse_confidence and AnswerOptions are the public header's.

// probs[q] holds question q's probabilities in encoded option order (noul: true, false;
// choice: labels sorted by code point; score: levels 0..n-1).
json::Value build_answers(const Request& req, const std::vector<std::vector<double>>& probs, const AnswerOptions& opts);

// What `usage` reports.
struct Usage {
  size_t input_tokens = 0;
  size_t cached_tokens = 0;         // leading tokens read from the prefix cache (0 on a miss or with it off)
  size_t state_tokens_dropped = 0;  // cut from the state to fit the context
};
// {"input_tokens", "output_tokens": 0, "cached_tokens"}, and "state_tokens_dropped" when the
// state was cut (absent otherwise: the reference server has no such field; no silent truncation).
json::Value usage_json(const Usage& u);

// The whole response: {"model", "answers", "usage"}.
std::string response_json(const std::string& model, const Request& req, const std::vector<std::vector<double>>& probs, const Usage& usage,
                          const AnswerOptions& opts);

double confidence_of(const std::vector<double>& p, Confidence c);

}  // namespace clefrt

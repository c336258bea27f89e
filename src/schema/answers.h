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

// The whole response: {"model", "answers", "usage": {"input_tokens", "output_tokens": 0}}, and
// usage.state_tokens_dropped when the state was cut to fit the context (absent otherwise, so an
// uncut answer is the reference server's byte for byte: no silent truncation).
std::string response_json(const std::string& model, const Request& req, const std::vector<std::vector<double>>& probs,
                           size_t input_tokens, const AnswerOptions& opts, size_t state_tokens_dropped = 0);

double confidence_of(const std::vector<double>& p, Confidence c);

}  // namespace clefrt

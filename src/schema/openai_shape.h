// The OpenAI-style decisions shape some clients send to POST /v1/decisions (spec/protocol.md,
// "Other request shapes"): converted to a System One body on the way in, and answers converted
// back on the way out. predicate -> noul; choices [{value, description}] -> criteria object;
// levels [{label, description}] -> criteria list.
#pragma once
#include <vector>

#include "common/json.h"
#include "schema/answers.h"
#include "schema/request.h"

namespace clefrt {

// {model, input, questions: [...]} -> System One body. Throws Error 400/422 with JSON paths.
json::Value openai_to_system_one(const json::Value& body);

// {model, answers: [...], usage} in the OpenAI shape, questions in the caller's order.
std::string openai_response(const std::string& model, const json::Value& body, const Request& req,
                            const std::vector<std::vector<double>>& probs, const Usage& usage, const AnswerOptions& opts);

}  // namespace clefrt

#include "schema/answers.h"

#include <algorithm>
#include <stdexcept>

#include "common/error.h"

namespace clefrt {

using json::Value;

Confidence parse_confidence(const std::string& name) {
  if (name == "reference") return Confidence::Reference;
  if (name == "purity") return Confidence::Purity;
  if (name == "jev") return Confidence::Jev;
  throw std::invalid_argument("unknown confidence formula '" + name + "' (reference, purity or jev)");
}

double confidence_of(const std::vector<double>& p, Confidence c) {
  const double n = double(p.size());
  const double maxp = *std::max_element(p.begin(), p.end());
  switch (c) {
    case Confidence::Reference: return maxp;
    case Confidence::Purity: {
      double s = 0;
      for (double x : p) s += x * x;
      return (s - 1 / n) / (1 - 1 / n);
    }
    case Confidence::Jev: return (maxp - 1 / n) / (1 - 1 / n);
  }
  return maxp;
}

Value build_answers(const Request& req, const std::vector<std::vector<double>>& probs, const AnswerOptions& opts) {
  if (probs.size() != req.questions.size())
    throw Error(Status::Internal, "internal_error",
                "engine returned " + std::to_string(probs.size()) + " questions for a request of " + std::to_string(req.questions.size()));
  auto num = [&](double x) { return Value::number(opts.precise ? x : json::py_round(x, 4)); };
  Value answers = Value::object();
  for (size_t qi = 0; qi < req.questions.size(); ++qi) {
    const Question& q = req.questions[qi];
    const std::vector<double>& p = probs[qi];
    if (p.size() != q.options.size())
      throw Error(Status::Internal, "internal_error",
                  "engine returned " + std::to_string(p.size()) + " probabilities for question " + q.id + " of " +
                      std::to_string(q.options.size()) + " options");
    Value a = Value::object();
    a.add("type", Value::string(type_name(q.type)));
    switch (q.type) {
      case QuestionType::Noul:
        a.add("noul", num(p[0]));
        break;
      case QuestionType::Choice: {
        // Caller's order; on a tie the first label in that order wins.
        size_t best = 0;
        Value pr = Value::object();
        for (size_t k = 0; k < q.caller_order.size(); ++k) {
          size_t enc = q.caller_order[k];
          if (p[enc] > p[q.caller_order[best]]) best = k;
          pr.add(q.options[enc].label, num(p[enc]));
        }
        a.add("choice", Value::string(q.options[q.caller_order[best]].label));
        a.add("probabilities", std::move(pr));
        a.add("confidence", num(confidence_of(p, opts.confidence)));
        break;
      }
      case QuestionType::Score: {
        double score = 0;
        for (size_t k = 0; k < p.size(); ++k) score += double(k) * p[k];
        a.add("score", num(score));
        Value legend = Value::object(), pr = Value::object();
        for (size_t k = 0; k < p.size(); ++k) {
          legend.add(std::to_string(k), q.levels[k]);
          pr.add(std::to_string(k), num(p[k]));
        }
        a.add("legend", std::move(legend));
        a.add("probabilities", std::move(pr));
        a.add("confidence", num(confidence_of(p, opts.confidence)));
        break;
      }
    }
    answers.add(q.id, std::move(a));
  }
  return answers;
}

Value usage_json(const Usage& u) {
  Value usage = Value::object();
  usage.add("input_tokens", Value::integer(int64_t(u.input_tokens)));
  usage.add("output_tokens", Value::integer(0));
  usage.add("cached_tokens", Value::integer(int64_t(u.cached_tokens)));
  if (u.state_tokens_dropped > 0) usage.add("state_tokens_dropped", Value::integer(int64_t(u.state_tokens_dropped)));
  return usage;
}

std::string response_json(const std::string& model, const Request& req, const std::vector<std::vector<double>>& probs, const Usage& usage,
                          const AnswerOptions& opts) {
  Value r = Value::object();
  r.add("model", Value::string(model));
  r.add("answers", build_answers(req, probs, opts));
  r.add("usage", usage_json(usage));
  return json::write(r);
}

}  // namespace clefrt

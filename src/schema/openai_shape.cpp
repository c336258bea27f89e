#include "schema/openai_shape.h"

#include "common/error.h"

namespace clefrt {

using json::Value;

namespace {
const Value& need(const Value& o, const char* key, const std::string& path) {
  const Value* v = o.find(key);
  if (!v) throw bad_request(path + "." + key, "missing field '" + std::string(key) + "'");
  return *v;
}
double rnd(double x, const AnswerOptions& o) { return o.precise ? x : json::py_round(x, 4); }
}  // namespace

Value openai_to_system_one(const Value& body) {
  if (!body.is_object()) throw bad_request("", "the body must be a JSON object");
  // unknown fields are refused as on /v1/systemone: a field the engine drops silently (images
  // above all) would answer as if it had not been sent
  reject_unknown_fields(body, "", {"model", "input", "questions", "images"});
  Value out = Value::object();
  if (const Value* m = body.find("model")) out.add("model", *m);
  out.add("state", body.find("input") ? *body.find("input") : Value::string(""));
  const Value& qs = need(body, "questions", "");
  Value q = Value::object();
  for (size_t i = 0; i < qs.arr.size(); ++i) {
    const std::string path = "questions[" + std::to_string(i) + "]";
    const Value& src = qs.arr[i];
    if (!src.is_object()) throw bad_request(path, "each question must be an object");
    reject_unknown_fields(src, path, {"type", "name", "instructions", "choices", "levels"});
    const Value& name = need(src, "name", path);
    const Value& type = need(src, "type", path);
    if (!name.is_string()) throw bad_request(path + ".name", "must be a string");
    if (!type.is_string()) throw bad_request(path + ".type", "must be a string");
    Value d = Value::object();
    if (type.s == "predicate" || type.s == "noul") {
      d.add("type", Value::string("noul"));
    } else if (type.s == "choice") {
      d.add("type", Value::string("choice"));
      const Value& ch = need(src, "choices", path);
      if (!ch.is_array()) throw bad_request(path + ".choices", "must be an array");
      Value crit = Value::object();
      for (size_t k = 0; k < ch.arr.size(); ++k) {
        const Value& c = ch.arr[k];
        const std::string cp = path + ".choices[" + std::to_string(k) + "]";
        if (c.is_string()) {
          crit.add(c.s, Value::null());
          continue;
        }
        if (!c.is_object()) throw bad_request(cp, "a choice is a string or {value, description}");
        reject_unknown_fields(c, cp, {"value", "description"});
        const Value& v = need(c, "value", cp);
        if (!v.is_string()) throw bad_request(cp + ".value", "must be a string");
        const Value* desc = c.find("description");
        crit.add(v.s, desc ? *desc : Value::null());
      }
      d.add("criteria", crit);
    } else if (type.s == "score") {
      d.add("type", Value::string("score"));
      const Value& lv = need(src, "levels", path);
      if (!lv.is_array()) throw bad_request(path + ".levels", "must be an array");
      Value crit = Value::array();
      for (size_t k = 0; k < lv.arr.size(); ++k) {
        const Value& l = lv.arr[k];
        if (l.is_string()) {
          crit.arr.push_back(l);
          continue;
        }
        const std::string lp = path + ".levels[" + std::to_string(k) + "]";
        if (!l.is_object()) throw bad_request(lp, "a level is a string or {label, description}");
        reject_unknown_fields(l, lp, {"label", "description"});
        const Value* label = l.find("label");
        const Value* desc = l.find("description");
        std::string text = label && label->is_string() ? label->s : "";
        if (desc && desc->is_string() && !desc->s.empty()) text += text.empty() ? desc->s : ": " + desc->s;
        crit.arr.push_back(Value::string(text));
      }
      d.add("criteria", crit);
    } else {
      throw unprocessable(path + ".type", "unknown question type '" + type.s + "' (predicate, choice, score)");
    }
    if (const Value* ins = src.find("instructions")) d.add("instructions", *ins);
    q.add(name.s, d);
  }
  out.add("questions", q);
  if (const Value* im = body.find("images")) out.add("images", *im);
  return out;
}

std::string openai_response(const std::string& model, const Value& body, const Request& req, const std::vector<std::vector<double>>& probs,
                            const Usage& usage, const AnswerOptions& opts) {
  Value answers = Value::array();
  const Value& qs = *body.find("questions");
  for (size_t i = 0; i < req.questions.size(); ++i) {
    const Question& q = req.questions[i];
    const std::vector<double>& p = probs[i];
    const std::string type = qs.arr[i].find("type")->s;
    Value a = Value::object();
    a.add("type", Value::string(type));
    a.add("name", Value::string(q.id));
    if (q.type == QuestionType::Noul) {
      a.add("probability", Value::number(rnd(p[0], opts)));  // encoded order: true, false
    } else {
      const double conf = confidence_of(p, opts.confidence);
      Value ps = Value::array();
      if (q.type == QuestionType::Choice) {
        size_t best = q.caller_order.empty() ? 0 : q.caller_order[0];
        for (size_t k : q.caller_order)
          if (p[k] > p[best]) best = k;
        for (size_t k : q.caller_order) {
          Value e = Value::object();
          e.add("value", Value::string(q.options[k].label));
          e.add("probability", Value::number(rnd(p[k], opts)));
          ps.arr.push_back(e);
        }
        a.add("choice", Value::string(q.options[best].label));
      } else {
        double score = 0;
        for (size_t k = 0; k < p.size(); ++k) score += double(k) * p[k];
        a.add("score", Value::number(rnd(score, opts)));
        for (size_t k = 0; k < p.size(); ++k) {
          Value e = Value::object();
          e.add("value", Value::integer(int64_t(k)));
          e.add("label", k < q.levels.size() ? q.levels[k] : Value::null());
          e.add("probability", Value::number(rnd(p[k], opts)));
          ps.arr.push_back(e);
        }
      }
      a.add("confidence", Value::number(rnd(conf, opts)));
      a.add("probabilities", ps);
    }
    answers.arr.push_back(a);
  }
  Value out = Value::object();
  out.add("model", Value::string(model));
  out.add("answers", answers);
  out.add("usage", usage_json(usage));
  return json::write(out);
}

}  // namespace clefrt

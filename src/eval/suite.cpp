#include "eval/suite.h"


#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/digest.h"
#include "common/error.h"
#include "common/file.h"
#include "eval/pyliteral.h"

namespace clefrt::eval {

using json::Value;

namespace {

Error data_error(const std::string& file, const std::string& what) {
  return Error(Status::BadRequest, "eval_data", file + ": " + what);
}

// RFC 4180 CSV (quoted fields may hold commas, quotes doubled, newlines), as Python's csv module
// reads the kit's files. Returns the records after the header; `header` gets the field names.
std::vector<std::vector<std::string>> read_csv(const std::string& path, std::vector<std::string>& header) {
  const std::string text = read_file(path);
  std::vector<std::vector<std::string>> recs;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
      continue;
    }
    if (c == '"') quoted = any = true;
    else if (c == ',') rec.push_back(std::move(field)), field.clear(), any = true;
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        rec.push_back(std::move(field));
        recs.push_back(std::move(rec));
      }
      field.clear();
      rec.clear();
      any = false;
    } else field += c, any = true;
  }
  if (quoted) throw data_error(path, "a quoted field is not closed");
  if (any || !field.empty()) {
    rec.push_back(std::move(field));
    recs.push_back(std::move(rec));
  }
  if (recs.empty()) throw data_error(path, "empty");
  header = recs.front();
  recs.erase(recs.begin());
  return recs;
}

Value choice_question(const std::string& instructions, const std::vector<std::string>& descriptions) {
  Value criteria = Value::object();
  for (size_t j = 0; j < descriptions.size(); ++j) criteria.add("option_" + std::to_string(j), Value::string(descriptions[j]));
  Value q = Value::object();
  q.add("type", Value::string("choice"));
  q.add("instructions", Value::string(instructions));
  q.add("criteria", std::move(criteria));
  Value qs = Value::object();
  qs.add("q1", std::move(q));
  return qs;
}

Row choice_row(const std::string& id, const std::string& instructions, const std::vector<std::string>& descriptions, size_t gold) {
  Row r;
  r.id = id;
  r.request = Value::object();
  r.request.add("state", Value::object());
  r.request.add("questions", choice_question(instructions, descriptions));
  r.gold = Value::object();
  r.gold.add("q1", Value::string("option_" + std::to_string(gold)));
  return r;
}

Benchmark banking77(const std::string& dir) {
  Benchmark b{"banking77", "BANKING77", "macro_f1", 0.0127, {}};
  const std::string cats_path = dir + "/banking77_categories.json", csv_path = dir + "/banking77_test.csv";
  const Value cats = json::parse(read_file(cats_path));
  if (!cats.is_array() || cats.arr.size() != 77) throw data_error(cats_path, "expected a list of the 77 categories");
  std::vector<std::string> labels;  // in file order, as the kit keeps them
  std::map<std::string, size_t> index;
  for (const Value& c : cats.arr) {
    if (!c.is_string()) throw data_error(cats_path, "a category that is not a string");
    index[c.s] = labels.size();
    labels.push_back(c.s);
  }
  std::vector<std::string> header;
  const auto recs = read_csv(csv_path, header);
  if (header != std::vector<std::string>{"text", "category"}) throw data_error(csv_path, "expected the columns text,category");
  for (size_t i = 0; i < recs.size(); ++i) {
    if (recs[i].size() != 2) throw data_error(csv_path, "record " + std::to_string(i + 1) + " has " + std::to_string(recs[i].size()) + " fields");
    auto it = index.find(recs[i][1]);
    if (it == index.end()) throw data_error(csv_path, "record " + std::to_string(i + 1) + ": category " + recs[i][1] + " is not in " + cats_path);
    b.rows.push_back(choice_row("BANKING77:test:" + std::to_string(i), "Classify the banking intent of this user request:\n" + recs[i][0],
                                labels, it->second));
  }
  return b;
}

Benchmark clinc150(const std::string& dir) {
  Benchmark b{"clinc150", "CLINC150+OOS", "macro_f1", 0.006, {}};
  const std::string path = dir + "/clinc_data_full.json";
  const Value d = json::parse(read_file(path));
  auto split = [&](const char* name) -> const Value& {
    const Value* s = d.find(name);
    if (!s || !s->is_array()) throw data_error(path, std::string("no list '") + name + "'");
    return *s;
  };
  std::set<std::string> intents = {"oos"};
  for (const Value& r : split("train").arr) {
    if (!r.is_array() || r.arr.size() != 2 || !r.arr[1].is_string()) throw data_error(path, "a train row that is not [text, intent]");
    intents.insert(r.arr[1].s);
  }
  const std::vector<std::string> labels(intents.begin(), intents.end());  // code point order, as Python sorts
  std::map<std::string, size_t> index;
  std::vector<std::string> desc;
  for (const auto& l : labels) {
    index[l] = desc.size();
    std::string d2 = l;
    std::replace(d2.begin(), d2.end(), '_', ' ');
    desc.push_back(l == "oos" ? "out of scope: none of the listed intents" : d2);
  }
  for (const char* name : {"test", "oos_test"}) {
    const Value& rows = split(name);
    for (size_t i = 0; i < rows.arr.size(); ++i) {
      const Value& r = rows.arr[i];
      if (!r.is_array() || r.arr.size() != 2 || !r.arr[0].is_string() || !r.arr[1].is_string())
        throw data_error(path, std::string(name) + " row " + std::to_string(i) + " is not [text, intent]");
      auto it = index.find(r.arr[1].s);
      if (it == index.end()) throw data_error(path, std::string(name) + " row " + std::to_string(i) + ": intent " + r.arr[1].s + " is not a train intent");
      b.rows.push_back(choice_row("CLINC150+OOS:" + std::string(name) + ":" + std::to_string(i),
                                  "Classify the intent of this user request, or choose out of scope if none applies:\n" + r.arr[0].s, desc,
                                  it->second));
    }
  }
  return b;
}

Benchmark finentity(const std::string& dir) {
  Benchmark b{"finentity", "FinEntity", "macro_f1", 0.3201, {}};
  const std::string path = dir + "/FinEntity.json";
  const Value docs = json::parse(read_file(path));
  if (!docs.is_array()) throw data_error(path, "expected a list of documents");
  for (size_t i = 0; i < docs.arr.size(); ++i) {
    const Value& d = docs.arr[i];
    const Value* content = d.find("content");
    const Value* anns = d.find("annotations");
    const std::string where = "document " + std::to_string(i);
    if (!content || !content->is_string() || !anns || !anns->is_array()) throw data_error(path, where + " has no content / annotations");
    auto field = [&](const Value& a, const char* k) -> const Value& {
      const Value* v = a.find(k);
      if (!v) throw data_error(path, where + ": an annotation without " + k);
      return *v;
    };
    // a span (start, end, value) annotated with different tags is dropped altogether
    std::map<std::string, std::set<std::string>> tags;
    auto span_key = [&](const Value& a) { return json::write(field(a, "start")) + ":" + json::write(field(a, "end")) + ":" + field(a, "value").s; };
    for (const Value& a : anns->arr) tags[span_key(a)].insert(field(a, "tag").s);
    Value qs = Value::object(), gold = Value::object();
    for (size_t j = 0; j < anns->arr.size(); ++j) {
      const Value& a = anns->arr[j];
      if (tags[span_key(a)].size() > 1) continue;
      const std::string start = json::write(field(a, "start")), end = json::write(field(a, "end"));
      char key[96];
      std::snprintf(key, sizeof key, "entity_%04zu_%s_%s", j, start.c_str(), end.c_str());
      Value crit = Value::object();
      for (const char* t : {"Negative", "Neutral", "Positive"}) crit.add(t, Value::string(t));
      Value q = Value::object();
      q.add("type", Value::string("choice"));
      q.add("instructions", Value::string("Classify the sentiment toward the supplied financial entity span. The entity span is given explicitly as " +
                                          start + ":" + end + " (" + field(a, "value").s +
                                          "); do not extract or alter it. Choose exactly one of Negative, Neutral, or Positive."));
      q.add("criteria", std::move(crit));
      qs.add(key, std::move(q));
      gold.add(key, Value::string(field(a, "tag").s));
    }
    Row r;
    char id[48];
    std::snprintf(id, sizeof id, "FinEntity:entity-given:%04zu", i);
    r.id = id;
    r.request = Value::object();
    Value state = Value::object();
    state.add("document", *content);
    state.add("task", Value::string("FinEntity entity-given sentiment"));
    r.request.add("state", std::move(state));
    r.request.add("questions", std::move(qs));
    r.gold = std::move(gold);
    b.rows.push_back(std::move(r));
  }
  return b;
}

Benchmark cruxeval(const std::string& dir) {
  Benchmark b{"cruxeval", "CRUXEval", "accuracy", 0, {}};
  const std::string items_path = dir + "/crux.jsonl", gen_path = dir + "/crux_gen.json", ev_path = dir + "/crux_eval.json";
  std::map<std::string, Value> items;  // by id: a string sort, as the kit orders them
  {
    const std::string text = read_file(items_path);
    size_t pos = 0, line = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      ++line;
      if (end > pos) {
        Value v = json::parse(std::string_view(text).substr(pos, end - pos));
        const Value* id = v.find("id");
        if (!id || !id->is_string()) throw data_error(items_path, "line " + std::to_string(line) + " has no id");
        items[id->s] = std::move(v);
      }
      pos = end + 1;
    }
  }
  const Value gens = json::parse(read_file(gen_path));
  const Value ev = json::parse(read_file(ev_path));
  const Value* scored = ev.find("raw_scored_generations");
  if (!gens.is_object() || !scored || !scored->is_object()) throw data_error(gen_path, "expected {id: [generations]} and raw_scored_generations");
  int64_t inv_k = 0;  // the sum of 2520 / options (2520: every count 2..10 divides it), exact
  for (const auto& [sid, item] : items) {
    auto str_field = [&](const char* k) -> const std::string& {
      const Value* v = item.find(k);
      if (!v || !v->is_string()) throw data_error(items_path, sid + " has no " + k);
      return v->s;
    };
    const auto gold = literal_eval(str_field("output"));
    if (!gold) throw data_error(items_path, sid + ": its output is not a Python literal this reads");
    std::vector<PyValue> values = {*gold};
    const Value* g = gens.find(sid);
    const Value* f = scored->find(sid);
    if (g && f && g->is_array() && f->is_array())
      for (size_t k = 0; k < g->arr.size() && k < f->arr.size(); ++k) {
        if (f->arr[k].kind == json::Value::Kind::Bool && f->arr[k].b) continue;  // a correct generation is not a distractor
        if (!g->arr[k].is_string()) continue;
        const auto v = literal_eval(g->arr[k].s);
        if (!v) continue;
        bool dup = false;
        for (const auto& x : values) dup = dup || py_equal(x, *v);
        if (!dup) values.push_back(*v);
      }
    if (values.size() < 2) continue;
    if (values.size() > 10) values.resize(10);
    const std::vector<size_t> perm = python_shuffle("20260917:CRUX:" + sid, values.size());
    Value crit = Value::object();
    size_t gold_at = 0;
    for (size_t k = 0; k < perm.size(); ++k) {
      crit.add("option_" + std::to_string(k), Value::string(repr(values[perm[k]])));
      if (perm[k] == 0) gold_at = k;
    }
    Value q = Value::object();
    q.add("type", Value::string("choice"));
    q.add("instructions", Value::string("Choose the correct output of f called with the supplied input arguments. Candidates are Python literal values."));
    q.add("criteria", std::move(crit));
    Value qs = Value::object();
    qs.add("answer", std::move(q));
    Value state = Value::object();
    state.add("code", Value::string(str_field("code")));
    state.add("input", Value::string(str_field("input")));
    state.add("task", Value::string("CRUXEval output selection"));
    Row r;
    r.id = "CRUXEval-output-choice:test:" + sid;
    r.request = Value::object();
    r.request.add("state", std::move(state));
    r.request.add("questions", std::move(qs));
    r.gold = Value::object();
    r.gold.add("answer", Value::string("option_" + std::to_string(gold_at)));
    b.rows.push_back(std::move(r));
    inv_k += 2520 / int64_t(values.size());
  }
  // the mean of 1 / options, correctly rounded (an exact ratio of small integers), as the kit states it
  b.chance = b.rows.empty() ? 0 : double(inv_k) / double(2520 * int64_t(b.rows.size()));
  return b;
}

}  // namespace

std::vector<std::string> known_benchmarks() { return {"banking77", "clinc150", "finentity", "cruxeval"}; }

Benchmark build(const std::string& name, const std::string& data_dir) {
  if (name == "banking77") return banking77(data_dir);
  if (name == "clinc150") return clinc150(data_dir);
  if (name == "finentity") return finentity(data_dir);
  if (name == "cruxeval") return cruxeval(data_dir);
  throw Error(Status::BadRequest, "usage", "--suite: unknown benchmark '" + name + "' (banking77, clinc150, finentity, cruxeval)");
}

std::string payload_sha256(const Row& r) {
  Value p = Value::object();
  p.add("model", Value::string("jev-1.13.0"));
  p.add("state", *r.request.find("state"));
  p.add("questions", *r.request.find("questions"));
  return sha256_hex(json::write(p));
}

double macro_f1(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::map<std::string, std::array<double, 3>> c;  // tp, fp, fn
  for (const auto& [g, p] : pairs) {
    if (g == p) c[g][0] += 1;
    else {
      c[p][1] += 1;
      c[g][2] += 1;
    }
  }
  if (c.empty()) return 0;
  double sum = 0;
  for (const auto& [l, v] : c) {
    const double den = 2 * v[0] + v[1] + v[2];
    sum += den > 0 ? 2 * v[0] / den : 0;
  }
  return sum / double(c.size());
}

Score score(const Benchmark& b, const std::vector<Outcome>& outcomes) {
  Score s;
  s.rows = outcomes.size();
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t correct = 0;
  size_t judged = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (!outcomes[i].answered) continue;
    ++s.answered;
    const Row& r = b.rows[i];
    const Value& questions = *r.request.find("questions");
    for (const auto& [qid, g] : r.gold.obj) {  // every question of the request (FinEntity: every entity)
      const Value& criteria = *questions.find(qid)->find("criteria");
      const Value* a = outcomes[i].answers.find(qid);
      const Value* choice = a ? a->find("choice") : nullptr;
      const std::string pred = choice && choice->is_string() ? choice->s : "";
      // labels as the kit compares them: the options' descriptions, JSON-quoted
      auto semantic = [&](const std::string& key) {
        const Value* d = criteria.find(key);
        return d ? json::dumps(*d) : "\"" + key + "\"";
      };
      pairs.emplace_back(semantic(g.s), semantic(pred));
      correct += pred == g.s;
      ++judged;
    }
  }
  if (s.answered) s.native = b.metric == "macro_f1" ? macro_f1(pairs) : double(correct) / double(std::max<size_t>(judged, 1));
  s.coverage = s.rows ? double(s.answered) / double(s.rows) : 0;
  if (b.metric == "accuracy") {  // the kit's track rule: correct over all rows, each figure rounded
    s.raw = json::py_round(s.rows ? double(correct) / double(s.rows) : 0, 4);
    s.skill = json::py_round(std::clamp((s.raw - b.chance) / (1 - b.chance), 0.0, 1.0), 4);
    s.coverage = json::py_round(s.coverage, 4);
    return s;
  }
  s.raw = s.answered ? json::py_round(s.native, 4) * s.coverage : 0;
  s.skill = std::clamp((s.raw - b.chance) / (1 - b.chance), 0.0, 1.0);
  return s;
}

}  // namespace clefrt::eval

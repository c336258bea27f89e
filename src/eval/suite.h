// `clefrt eval` (issue 21): the Decision Index kit's benchmarks rebuilt from their public source
// files as the kit's exact System One requests, and scored with its rules
// (docs/notes/decision-index-kit.md says where each rule comes from): BANKING77, CLINC150 + OOS,
// FinEntity and CRUXEval.
#pragma once
#include <string>
#include <vector>

#include "common/json.h"

namespace clefrt::eval {

struct Row {
  std::string id;        // the kit's: "BANKING77:test:0"
  json::Value request;   // {"state": ..., "questions": ...}, keys in the kit's order
  json::Value gold;      // {"q1": "option_11"}
};

struct Benchmark {
  std::string name;      // banking77 | clinc150 | finentity | cruxeval
  std::string title;     // as the kit's board names it: "BANKING77", "CLINC150+OOS"
  std::string metric;    // "macro_f1" | "accuracy"
  double chance = 0;     // the kit's chance baseline for its skill score
  std::vector<Row> rows; // in the kit's order
};

// The names `--suite` takes.
std::vector<std::string> known_benchmarks();
// Reads the benchmark's source files from `data_dir` (the layout of ../shared/data: SOURCES.md)
// and builds its rows. Throws Error naming the file (and line) that is missing or malformed.
Benchmark build(const std::string& name, const std::string& data_dir);

// The kit's record of a request: sha256 (hex) of compact JSON, non-ASCII raw, keys in order, of
// {"model": "jev-1.13.0", "state", "questions"}.
std::string payload_sha256(const Row& r);

// One row's outcome for the scorer: the answer's `choice` per question, or unanswered.
struct Outcome {
  bool answered = false;
  json::Value answers;  // the System One answers object
};

struct Score {
  double native = 0;     // macro-F1 or accuracy over the answered rows (0 when none)
  double coverage = 0;   // answered / rows
  double raw = 0;        // macro-F1: round(native, 4) * coverage (the kit's display value); accuracy
                         // (CRUXEval, the kit's track rule): round(correct / rows, 4)
  double skill = 0;      // clip((raw - chance) / (1 - chance), 0, 1) (accuracy: rounded to 4, as coverage)
  size_t rows = 0, answered = 0;
};
// outcomes[i] belongs to b.rows[i] (the first outcomes.size() rows: --limit).
Score score(const Benchmark& b, const std::vector<Outcome>& outcomes);
// Macro-F1 over the labels seen in gold or predictions (per label 2tp / (2tp + fp + fn), 0 when
// that is 0/0; the plain mean).
double macro_f1(const std::vector<std::pair<std::string, std::string>>& gold_pred);

}  // namespace clefrt::eval

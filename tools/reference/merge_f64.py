#!/usr/bin/env python3
"""Adds the fp64 forward's probabilities to oracle fixtures as "probs_f64".

  merge_f64.py FIXTURE_DIR F64_DIR NAME [NAME ...]

FIXTURE_DIR/NAME.expected.jsonl (the fp32 reference, "probs") and F64_DIR/NAME.expected.jsonl
(make_oracle.py run again with ORACLE_DTYPE=float64 and ORACLE_REQUESTS=the fp32 file) must hold
the same requests and token ids in the same order; each fp32 line gets the fp64 "probs" as
"probs_f64", other fields untouched. The model folders of both runs must be byte-identical
(checked here: a different folder would make the two columns incomparable).
"""
import filecmp, json, os, sys


def main():
    fixtures, f64, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    for name in names:
        for f in ("model.safetensors", "joint_head.safetensors", "config.json", "tokenizer.json"):
            a, b = os.path.join(fixtures, name, f), os.path.join(f64, name, f)
            if not filecmp.cmp(a, b, shallow=False):
                sys.exit(f"{name}/{f} differs between {fixtures} and {f64}: the fp64 run built another model")
        path = os.path.join(fixtures, name + ".expected.jsonl")
        with open(path, encoding="utf-8") as f:
            base = [json.loads(line) for line in f]
        with open(os.path.join(f64, name + ".expected.jsonl"), encoding="utf-8") as f:
            other = [json.loads(line) for line in f]
        if len(base) != len(other):
            sys.exit(f"{name}: {len(base)} fp32 lines, {len(other)} fp64 lines")
        for i, (x, y) in enumerate(zip(base, other)):
            if x["request"] != y["request"] or x["input_ids"] != y["input_ids"]:
                sys.exit(f"{name}: line {i + 1} holds another request or other token ids in the fp64 run")
            x["probs_f64"] = y["probs"]
        with open(path, "w", encoding="utf-8") as f:
            for x in base:
                f.write(json.dumps(x, ensure_ascii=False) + "\n")
        print(f"{name}: {len(base)} lines, probs_f64 added")


if __name__ == "__main__":
    main()

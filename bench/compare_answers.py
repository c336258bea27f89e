#!/usr/bin/env python3
"""Compares the "answers" of two `clefrt bench --json` records (the same synthetic model and
requests run in two modes, with a lab switch, or by two builds): per request the largest
|p_a - p_b| over its questions' options; prints the worst, the mean and the median over the
batch. Usage: bench/compare_answers.py A.json B.json"""
import json
import statistics
import sys


def answers(path):
    with open(path) as f:
        rec = json.load(f)
    a = rec.get("answers", {}).get("probs")
    if not a:
        sys.exit(f"{path}: no answers (a bench record from before they were written, or --images-only)")
    return rec, a


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    (ra, a), (rb, b) = answers(sys.argv[1]), answers(sys.argv[2])
    if len(a) != len(b):
        sys.exit(f"the records hold {len(a)} and {len(b)} requests")
    worst = []
    for i, (qa, qb) in enumerate(zip(a, b)):
        if [len(q) for q in qa] != [len(q) for q in qb]:
            sys.exit(f"request {i}: the questions' option counts differ")
        worst.append(max(abs(x - y) for oa, ob in zip(qa, qb) for x, y in zip(oa, ob)))
    for r, p in ((ra, sys.argv[1]), (rb, sys.argv[2])):
        print(f"{p}: {r.get('command', '?')} (commit {r.get('commit', '?')})")
    print(f"{len(worst)} requests: worst |dp| {max(worst):.3g}, mean {statistics.mean(worst):.3g}, median {statistics.median(worst):.3g}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares `clefrt decide --precise --jsonl` outputs question by question against a baseline:
mean and max |p - p_base| over every option probability, and top-1 agreement (the most probable
option; noul: p > 0.5). Lines that are errors in either file are skipped (and counted).

  bench/quality_report.py BASE.jsonl NAME=OTHER.jsonl [NAME=OTHER.jsonl ...]
"""
import json, sys


def probs(answer):
    if answer["type"] == "noul":
        p = answer["noul"]
        return [p, 1.0 - p]
    return list(answer["probabilities"].values())


def load(path):
    out = []
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        out.append(None if "error" in r else {k: probs(a) for k, a in r["answers"].items()})
    return out


def main():
    base = load(sys.argv[1])
    print(f"| mode | requests | questions | mean abs dp | max abs dp | top-1 agreement |")
    print(f"|---|---|---|---|---|---|")
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        other = load(path)
        assert len(other) == len(base), f"{path}: {len(other)} lines, baseline {len(base)}"
        n_req = n_q = agree = 0
        diffs = []
        for a, b in zip(base, other):
            if a is None or b is None:
                continue
            n_req += 1
            for q, pa in a.items():
                pb = b[q]
                n_q += 1
                diffs += [abs(x - y) for x, y in zip(pa, pb)]
                agree += max(range(len(pa)), key=pa.__getitem__) == max(range(len(pb)), key=pb.__getitem__)
        print(f"| {name} | {n_req} | {n_q} | {sum(diffs) / len(diffs):.2e} | {max(diffs):.3g} | {100.0 * agree / n_q:.2f}% |")


if __name__ == "__main__":
    main()

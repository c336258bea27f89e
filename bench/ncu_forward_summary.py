#!/usr/bin/env python3
"""Per-kernel GPU time of one forward from Nsight Compute's CSV, written by
  ncu --clock-control none --profile-from-start off \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      --csv --print-units base --log-file FILE.csv \
      clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 2048 --no-vision --reps 1 --profiler-range
(--profiler-range: only the blog point's first timed forward is profiled, forward 0 here; the
loading and the warm-ups, where the GEMMs' tuning times its candidates, run unprofiled. Files
from before session 50 profiled from the start, the tuning included, and their forward 1 ran the
GEMM algorithms that tuning under ncu picked, not necessarily the product's.) The forwards are
found by their first and last kernels (embed_gather_k ... question_softmax_k).
Prints, per kernel name over that forward, the total, the launches, the mean, and the grids seen:
kernel time only (ncu runs each kernel alone), no gaps between launches.

Usage: ncu_forward_summary.py FILE.csv [FORWARD_INDEX (default 0)] [--grep SUBSTRING]"""
import collections
import csv
import re
import sys


def kernels(path):
    rows = [line for line in open(path) if line.startswith('"')]
    by_id = collections.OrderedDict()
    for r in csv.DictReader(rows):
        k = by_id.setdefault(int(r["ID"]), {"name": r["Kernel Name"], "grid": r["Grid Size"], "block": r["Block Size"]})
        k[r["Metric Name"]] = r["Metric Value"].replace(",", "")
    return list(by_id.values())


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    grep = argv[argv.index("--grep") + 1] if "--grep" in argv else None
    if grep:
        args.remove(grep)
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    ks = kernels(args[0])
    which = int(args[1]) if len(args) > 1 else 0
    starts = [i for i, k in enumerate(ks) if "embed_gather_k" in k["name"]]
    ends = [i for i, k in enumerate(ks) if "question_softmax_k" in k["name"]]
    if which >= len(ends):
        print(f"{args[0]}: {len(ends)} whole forwards in {len(ks)} kernels", file=sys.stderr)
        return 1
    b = max(s for s in starts if s <= ends[which])
    e = ends[which]
    agg = collections.OrderedDict()
    total = 0.0
    for k in ks[b : e + 1]:
        name = re.sub(r"\(.*", "", k["name"]).replace("clefrt::<unnamed>::", "").replace("clefrt::cuda::", "")
        us = float(k["gpu__time_duration.sum"]) / 1e3
        a = agg.setdefault(name, [0, 0.0, set()])
        a[0] += 1
        a[1] += us
        a[2].add(f'{k["grid"]}x{k["block"]}')
        total += us
    print(f"forward {which}: kernels {b}..{e} ({e - b + 1}), {total:.1f} us of kernel time")
    for name, (n, us, grids) in sorted(agg.items(), key=lambda x: -x[1][1]):
        if grep and grep not in name:
            continue
        print(f"{us:10.1f} us {n:5d}x {us / n:8.2f}  {name[:72]:72s} {' '.join(sorted(grids)[:2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

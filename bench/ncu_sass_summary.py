#!/usr/bin/env python3
"""Summarises Nsight Compute's source page of one kernel (the CSV `ncu -i REPORT --page source --csv
--print-source sass` writes; the device suite's ncu-gdn-source verb makes them): the stall reasons
over all samples, the instructions with the most samples, and, given instruction-index bounds, the
samples and instructions executed per region of the program (a region: a phase of the kernel,
found by reading the SASS between landmarks such as BAR.SYNC or HGMMA).

Usage: ncu_sass_summary.py FILE.csv [B1,B2,...] [--top N]"""
import collections
import csv
import sys


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    top = 45
    if "--top" in argv:
        top = int(argv[argv.index("--top") + 1])
        args = [a for a in args if a != str(top)]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    rows = list(csv.reader(open(args[0])))
    if len(rows) < 3:
        print(f"{args[0]}: no instructions (is it the CSV of --page source?)", file=sys.stderr)
        return 1
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    samples_col = "Warp Stall Sampling (All Samples)"
    if samples_col not in ix:
        print(f"{args[0]}: no '{samples_col}' column (collect with --section SourceCounters)", file=sys.stderr)
        return 1
    samples = lambda r: int(r[ix[samples_col]] or 0)
    executed = lambda r: int(r[ix["Instructions Executed"]] or 0)
    total = sum(samples(r) for r in data) or 1
    print(f"{len(data)} instructions, {total} stall samples")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    per_reason = {h: sum(int(r[ix[h]] or 0) for r in data) for h in reasons}
    for h, v in sorted(per_reason.items(), key=lambda x: -x[1])[:10]:
        print(f"  {h:24s} {v:7d} {v / total:6.1%}")
    print(f"\nthe {top} instructions with the most samples (index, samples, share, SASS, top two reasons):")
    ranked = sorted(((samples(r), k) for k, r in enumerate(data)), reverse=True)[:top]
    for s, k in ranked:
        r = data[k]
        why = sorted(((int(r[ix[h]] or 0), h) for h in reasons), reverse=True)[:2]
        print(f"{k:5d} {s:6d} {s / total:5.1%} {r[ix['Source']].strip()[:70]:70s} {why}")
    if len(args) > 1:
        bounds = [int(x) for x in args[1].split(",")] + [len(data)]
        print("\nper region [from, to): samples, share, warp-instructions executed, the commonest opcodes")
        prev = 0
        for b in bounds:
            part = data[prev:b]
            ops = collections.Counter(
                (r[ix["Source"]].split()[1] if r[ix["Source"]].strip().startswith("@") else r[ix["Source"]].split()[0]) for r in part if r[ix["Source"]].split())
            s = sum(samples(r) for r in part)
            print(f"[{prev:5d},{b:5d}) {s:7d} {s / total:5.1%} {sum(executed(r) for r in part):11d} {ops.most_common(5)}")
            prev = b
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

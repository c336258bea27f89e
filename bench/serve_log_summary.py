#!/usr/bin/env python3
"""Where a served request's time goes, from `clefrt serve`'s request log (one JSON line a request:
queue_ms, compute_ms, total_ms) while `clefrt_load` runs its phases (1, 8, 64 clients, SECONDS
each, one after the other).

Usage: bench/serve_log_summary.py SERVE_LOG [--seconds 10] [--phases 1,8,64]

Per phase (requests grouped by their log time from the first request on, SECONDS a phase): the
count and the p50 / p95 of queue_ms, compute_ms, total_ms and total - compute (the server's own
time around the engine: parsing, tokenizing, encoding, the answer's JSON). The load tool's p50
less this total p50 is what HTTP and the client take. Where the log gives each request's "batch"
(the requests in the forward that answered it), the phase's forwards (the sum of 1 / batch) and
their mean size (requests / forwards); where it gives prep_wait_ms and prep_ms (waiting for a prep
worker; parsing, tokenizing, encoding on it), their p50s: the rest of total - compute is the
engine thread's hand-off and the answer. "-" in logs without them.
"""
import argparse
import datetime
import json
import sys


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--phases", default="1,8,64")
    a = ap.parse_args()
    phases = [p for p in a.phases.split(",") if p]
    rows = []
    with open(a.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "compute_ms" not in r or r.get("status") != 200:
                continue
            t = datetime.datetime.strptime(r["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
            rows.append((t, r))
    if not rows:
        print("no request lines with compute_ms in", a.log)
        return 1
    t0 = rows[0][0]
    print(f"{'clients':>7} {'n':>6}  {'queue p50':>9} {'compute p50':>11} {'total p50':>9} {'total-compute p50':>17} {'p95':>6}"
          f" {'forwards':>8} {'mean batch':>10} {'prep wait p50':>13} {'prep p50':>8}")
    for i, p in enumerate(phases):
        sel = [r for t, r in rows if i * a.seconds <= t - t0 < (i + 1) * a.seconds]
        q = [r["queue_ms"] for r in sel]
        c = [r["compute_ms"] for r in sel]
        tot = [r["total_ms"] for r in sel]
        own = [r["total_ms"] - r["compute_ms"] for r in sel]
        batch = f"{'-':>8} {'-':>10}"
        if sel and all(r.get("batch", 0) > 0 for r in sel):
            forwards = sum(1.0 / r["batch"] for r in sel)
            batch = f"{forwards:8.1f} {len(sel) / forwards:10.2f}"
        prep = f"{'-':>13} {'-':>8}"
        if sel and all("prep_ms" in r and "prep_wait_ms" in r for r in sel):
            prep = f"{pct([r['prep_wait_ms'] for r in sel], .5):13.2f} {pct([r['prep_ms'] for r in sel], .5):8.2f}"
        print(f"{p:>7} {len(sel):>6}  {pct(q, .5):9.2f} {pct(c, .5):11.2f} {pct(tot, .5):9.2f} {pct(own, .5):17.2f} {pct(own, .95):6.2f} {batch} {prep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

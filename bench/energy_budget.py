#!/usr/bin/env python3
"""What issue 20's speed targets ask of the energy a forward takes, from `clefrt bench` records.

At the card's power cap (every long point of the 27B runs capped), a forward's time is its
energy over the capped power. So a target time T asks a forward measured at t (its p50, or the
batch's time) for at most T / t of today's joules, at today's mean power: the cut printed is the
share that would have to go. (The joules come from the energy window, whose forwards include the
gaps between them: J / mean W can exceed the p50, so the budget scales today's joules by T / t
rather than taking T x mean W, which would ask a cut of a target already met.)
The profile's split (GEMM ops against the rest, as shares of the ops' total, which the profile's
per-op syncs inflate) says how much of the time the cuBLASLt GEMMs take, and what the rest may
keep if the GEMMs stay as they are.

    bench/energy_budget.py QUICK.json [QUICK.json ...]
"""
import json
import sys

# issue 20's end-to-end targets (27B shapes, H200): latency points in ms (at most), the batch of
# 64 x 512 in tokens/s (at least)
TARGETS = {
    "bf16": {"blog_346": 32.0, "tok_8192": 600.0, "in_flight_64": 12500.0},
    "fp8": {"blog_346": 18.0, "tok_8192": 400.0, "in_flight_64": 21000.0},
}
PROFILE_OF = {"blog_346": "blog_346", "tok_8192": "tok_8192", "in_flight_64": "batch_64x512"}


def forward_ms(rec, point):
    if point == "in_flight_64":
        t = next(t for t in rec["throughput"] if t["in_flight"] == 64)
        return t["ms"], t["tokens_per_s"]
    return rec["latency_ms"][point]["p50"], None


def main(paths):
    for path in paths:
        rec = json.load(open(path))
        quant = rec["quant"]
        if quant not in TARGETS:
            print(f"{path}: no targets for quant {quant}")
            continue
        print(f"{rec['gpu']}, {quant}, commit {rec['commit']} ({path})")
        print(f"  {'point':<13} {'now':>10} {'target':>10} {'J/fwd':>8} {'mean W':>7} {'capped':>7} {'J budget':>9} {'cut':>6}"
              f" {'GEMM share':>11} {'rest may keep':>14}")
        for point, target in TARGETS[quant].items():
            ms, tps = forward_ms(rec, point)
            e = rec["energy"][point]
            if tps is None:
                now, goal, target_ms = f"{ms:.2f} ms", f"{target:.0f} ms", target
            else:
                now, goal = f"{tps:,.0f} t/s", f"{target:,.0f} t/s"
                target_ms = ms * tps / target  # the same tokens at the target rate
            budget = e["joules_per_forward"] * target_ms / ms
            cut = 1.0 - target_ms / ms
            prof = rec.get("profile_ms", {}).get(PROFILE_OF[point], {})
            total = sum(prof.values())
            gemm = sum(v for k, v in prof.items() if "gemm" in k or "GEMM" in k or "Linears" in k)
            line = (f"  {point:<13} {now:>10} {goal:>10} {e['joules_per_forward']:>8.1f} {e['mean_watts']:>7.0f}"
                    f" {e['power_capped_share']:>6.0%} {budget:>9.1f} {max(cut, 0):>6.1%}")
            if total:  # a record without --profile has no split: the energy columns only
                share = gemm / total
                # the rest's time if the GEMMs keep their share of today's forward
                rest = target_ms - share * ms
                line += f" {share:>11.1%} {rest:>8.1f} of {ms * (1 - share):.1f} ms"
            print(line)
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

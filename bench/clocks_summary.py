#!/usr/bin/env python3
"""Per verb of a device run: the SM clock, power and throttle reasons nvidia-smi sampled
(run_device_suite.sh's `clocks` verb writes clocks.csv and verbs.log). Tells whether a kernel
ran slower in the model than in a lab or an anchor because the card clocked down.

    bench/clocks_summary.py DIR   (DIR holds clocks.csv and verbs.log)
"""
import csv
import datetime
import statistics
import sys

# nvidia-smi's clocks_event_reasons bits (nvml's clocksEventReasons)
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal",
           0x80: "power brake"}


def reason_names(mask):
    names = [n for bit, n in REASONS.items() if mask & bit]
    return "+".join(names) if names else "none"


def main(d):
    samples = []
    with open(f"{d}/clocks.csv") as f:
        rows = list(csv.reader(f))
    for r in rows[1:]:
        try:
            # nvidia-smi stamps local time; verbs.log holds epoch seconds (a naive datetime's
            # timestamp() reads it as local time)
            t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(r[1]), float(r[3]), int(r[5].strip(), 16)))
        except (ValueError, IndexError):
            continue  # a header repeated or a field nvidia-smi could not read ([N/A])
    verbs = []
    with open(f"{d}/verbs.log") as f:
        for line in f:
            t, v = line.split(None, 1)
            verbs.append((float(t), v.strip()))
    verbs.append((float("inf"), "end"))
    print(f"{'verb':42s} {'samples':>7s} {'SM MHz':>7s} {'busy':>5s} {'busy MHz':>8s} {'busy W':>6s}  most frequent reason")
    for (t0, v), (t1, _) in zip(verbs, verbs[1:]):
        s = [x for x in samples if t0 <= x[0] < t1]
        if len(s) < 3:
            continue
        busy = [x for x in s if x[2] > 300]  # drawing over 300 W: the GPU working hard
        counts = {}
        for x in s:
            counts[x[3]] = counts.get(x[3], 0) + 1
        top = max(counts, key=counts.get)
        print(f"{v[:42]:42s} {len(s):7d} {statistics.median(x[1] for x in s):7.0f} {len(busy):5d} "
              f"{statistics.median(x[1] for x in busy) if busy else 0:8.0f} {statistics.median(x[2] for x in busy) if busy else 0:6.0f}  "
              f"{reason_names(top)} ({100 * counts[top] // len(s)}%)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

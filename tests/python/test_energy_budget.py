"""bench/energy_budget.py on a bench record written here: a target time asks for at most
target / today's time of today's joules a forward (the cut is the rest), the batch of 64's target rate
becomes a time for the same tokens, the GEMM share comes from the profile, a mode without
targets is named and skipped, a record without a profile keeps its energy columns.

Run by CTest (Python.pytest) with CLEFRT_SOURCE_DIR set.
"""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("CLEFRT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE, "bench", "energy_budget.py")


def record(quant="fp8"):
    energy = lambda j, w: {"joules_per_forward": j, "mean_watts": w, "power_capped_share": 1.0}
    return {
        "gpu": "test card", "commit": "abc", "quant": quant,
        "latency_ms": {"blog_346": {"p50": 20.0}, "tok_8192": {"p50": 500.0}},
        "throughput": [{"in_flight": 1, "ms": 30.0, "tokens_per_s": 17000.0},
                       {"in_flight": 64, "ms": 1600.0, "tokens_per_s": 20480.0}],
        "energy": {"blog_346": energy(14.0, 700.0), "tok_8192": energy(350.0, 700.0), "in_flight_64": energy(1120.0, 700.0)},
        "profile_ms": {"blog_346": {"gemm mlp gate_up": 10.0, "swiglu": 5.0},
                       "tok_8192": {"gemm mlp down": 300.0, "rms_norm": 100.0},
                       "batch_64x512": {"head row Linears": 1.0, "gdn chunk scan": 3.0}},
    }


def run(tmp_path, rec):
    p = tmp_path / "quick.json"
    p.write_text(json.dumps(rec))
    return subprocess.run([sys.executable, SCRIPT, str(p)], capture_output=True, text=True)


def line(out, point):
    return next(l.split() for l in out.splitlines() if l.split()[:1] == [point])


def test_cut_and_split(tmp_path):
    r = run(tmp_path, record())
    assert r.returncode == 0, r.stderr
    blog = line(r.stdout, "blog_346")
    # 18 ms x 700 W = 12.6 J of 14: 10% to cut; GEMMs 10 of 15 ms of ops: 66.7%; the rest may
    # keep 18 - 0.667 x 20 = 4.7 ms of 6.7
    assert blog[8] == "12.6" and blog[9] == "10.0%" and blog[10] == "66.7%"
    assert blog[11:] == ["4.7", "of", "6.7", "ms"]
    long = line(r.stdout, "tok_8192")
    assert long[8] == "280.0" and long[9] == "20.0%" and long[10] == "75.0%"
    # 64 x 512: the same tokens at 21,000 t/s take 1600 x 20480 / 21000 = 1560.4 ms -> 1092.3 J
    batch = line(r.stdout, "in_flight_64")
    assert batch[8] == "1092.3" and batch[9] == "2.5%" and batch[10] == "25.0%"


def test_met_target_cuts_nothing(tmp_path):
    rec = record("bf16")  # bf16's blog target is 32 ms: 20 ms meets it
    r = run(tmp_path, rec)
    assert r.returncode == 0, r.stderr
    assert line(r.stdout, "blog_346")[9] == "0.0%"


def test_energy_window_longer_than_the_p50_cuts_nothing_of_a_met_target(tmp_path):
    # a real record's shape: blog p50 30.71 ms, the energy window's forwards 23.7 J at 737 W
    # (32.2 ms a forward with the gaps between them); bf16's 32 ms target is met: no cut, and the
    # budget is today's joules x 32 / 30.71
    rec = record("bf16")
    rec["latency_ms"]["blog_346"]["p50"] = 30.71
    rec["energy"]["blog_346"] = {"joules_per_forward": 23.7, "mean_watts": 737.0, "power_capped_share": 0.94}
    r = run(tmp_path, rec)
    assert r.returncode == 0, r.stderr
    blog = line(r.stdout, "blog_346")
    assert blog[8] == "24.7" and blog[9] == "0.0%"


def test_record_without_profile_keeps_its_energy_columns(tmp_path):
    rec = record()
    del rec["profile_ms"]
    r = run(tmp_path, rec)
    assert r.returncode == 0, r.stderr
    blog = line(r.stdout, "blog_346")
    assert blog[8:] == ["12.6", "10.0%"]


def test_mode_without_targets(tmp_path):
    r = run(tmp_path, record("nvfp4"))
    assert r.returncode == 0 and "no targets for quant nvfp4" in r.stdout

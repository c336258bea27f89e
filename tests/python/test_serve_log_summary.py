"""bench/serve_log_summary.py on request logs written here: requests fall into the load phase of
their log time (SECONDS a phase from the first request), only status-200 lines with compute_ms
count, the p50s are the middle values, and a log without request lines is an error (exit 1).

Run by CTest (Python.pytest) with CLEFRT_SOURCE_DIR set.
"""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("CLEFRT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE, "bench", "serve_log_summary.py")


def request_line(second, queue, compute, total, status=200, batch=None, prep=None):
    ts = f"2026-12-06T10:00:{second:06.3f}Z"
    r = {"ts": ts, "id": 1, "method": "POST", "path": "/v1/systemone", "status": status, "tokens": 318, "cached_tokens": 0}
    if batch is not None:
        r["batch"] = batch
    if prep is not None:
        r["prep_wait_ms"], r["prep_ms"] = prep
    return json.dumps({**r, "queue_ms": queue, "compute_ms": compute, "total_ms": total})


def run(tmp_path, lines, *args):
    log = tmp_path / "serve.log"
    log.write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, SCRIPT, str(log), *args], capture_output=True, text=True)


def rows(out):
    """clients -> (n, queue p50, compute p50, total p50, total - compute p50, its p95)"""
    table = {}
    for line in out.splitlines()[1:]:
        f = line.split()
        table[f[0]] = (int(f[1]), *map(float, f[2:7]), *f[7:])
    return table


def test_phases_and_medians(tmp_path):
    lines = [json.dumps({"ts": "2026-12-06T10:00:00.000Z", "event": "ready"})]  # not a request: skipped
    # phase 1 (seconds 0..9): compute 20, 21, 22; the server's own time 1, 2, 3
    lines += [request_line(1 + i, 0.1, 20 + i, 20 + i + 1 + i) for i in range(3)]
    lines.append(request_line(5, 0.0, 99.0, 99.5, status=500))  # an error answer: not counted
    # phase 2 (seconds 10..19): four requests, queue 5
    lines += [request_line(11 + i, 5.0, 30.0, 30.5) for i in range(4)]
    r = run(tmp_path, lines, "--seconds", "10", "--phases", "1,8")
    assert r.returncode == 0, r.stderr
    t = rows(r.stdout)
    assert t["1"][:5] == (3, 0.1, 21.0, 23.0, 2.0)
    assert t["8"][:5] == (4, 5.0, 30.0, 30.5, 0.5)
    assert t["1"][6:] == ("-", "-", "-", "-")  # lines without "batch" / prep times: none


def test_forwards_and_their_mean_size(tmp_path):
    # one forward of 4 and two of 1: 6 requests in 3 forwards
    lines = [request_line(1, 0.1, 20.0, 20.5, batch=4) for _ in range(4)] + [request_line(2 + i, 0.1, 5.0, 5.5, batch=1) for i in range(2)]
    r = run(tmp_path, lines, "--seconds", "10", "--phases", "8")
    assert r.returncode == 0, r.stderr
    assert rows(r.stdout)["8"][6:8] == ("3.0", "2.00")


def test_prep_wait_and_prep_medians(tmp_path):
    lines = [request_line(1 + i, 0.1, 20.0, 20.5, batch=1, prep=(0.01 * (i + 1), 0.1 * (i + 1))) for i in range(3)]
    r = run(tmp_path, lines, "--seconds", "10", "--phases", "1")
    assert r.returncode == 0, r.stderr
    assert rows(r.stdout)["1"][8:] == ("0.02", "0.20")


def test_no_request_lines_is_an_error(tmp_path):
    r = run(tmp_path, [json.dumps({"ts": "2026-12-06T10:00:00.000Z", "event": "ready"}), "not json"])
    assert r.returncode == 1
    assert "no request lines" in r.stdout

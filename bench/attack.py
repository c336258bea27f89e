#!/usr/bin/env python3
"""Soak and attack run against `clefrt serve` on loopback (issue 16's fourteen cases and a soak).

Starts its own servers from the given binary and model folder, attacks them on 127.0.0.1 only,
every case bounded in connections and seconds, and prints one table row per case: what was
done, what the server did, and whether that is the behaviour wanted. Python standard library
only. Not a test (it takes minutes and measures latency): run it by hand, record the table under
bench/results/.

    python3 bench/attack.py --clefrt build/clefrt --model build/models/tiny [--only 1,4] [--json out.json]

Exit status: 0 when every case that ran behaved, 1 otherwise.
"""
import argparse
import gzip
import http.client
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

BLOG = json.dumps({
    "model": "clef",
    "state": "Our checkout is down and orders are blocked.",
    "questions": {
        "outage": {"type": "noul", "instructions": "Is a service down?"},
        "team": {"type": "choice", "instructions": "Which team should handle it?",
                 "criteria": {"billing": "payments", "tech": "outages", "sales": None}},
        "severity": {"type": "score", "instructions": "How severe is it?",
                     "criteria": ["No impact", "Minor", "Major", "Critical"]},
    },
}).encode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Server:
    """One `clefrt serve` process on a free loopback port; its stderr goes to a file."""

    def __init__(self, args, extra=(), model=None, wait=True):
        self.port = free_port()
        self.log_path = tempfile.mktemp(prefix="clefrt-attack-", suffix=".log")
        self.log = open(self.log_path, "w")
        cmd = [args.clefrt, "serve", "--model", model or args.model, "--host", "127.0.0.1", "--port", str(self.port),
               "--threads", "1"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.ready = False
        if wait:
            self.ready = self.wait_ready(60)

    def wait_ready(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            if self.proc.poll() is not None:
                return False
            try:
                st, _, _ = request(self.port, "GET", "/health", timeout=2)
                if st == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, wait=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.stop()


def request(port, method, path, body=b"", headers=None, timeout=10, conn=None):
    """One request with http.client; returns (status, headers dict, body bytes)."""
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        if own:
            c.close()


def raw_exchange(port, data, timeout=10, read_until_close=True):
    """Sends bytes on a fresh connection; returns what came back within the timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:  # the server answered and closed before taking it all: read what it said
            pass
        out = b""
        end = time.time() + timeout
        while time.time() < end:
            try:
                s.settimeout(max(0.05, end - time.time()))
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if not read_until_close and b"\r\n\r\n" in out:
                break
        return out
    finally:
        s.close()


def status_of(raw):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def strict_json(text):
    """Parses JSON as a strict reader would: NaN / Infinity literals are an error."""
    def bad(c):
        raise ValueError(f"non-JSON literal {c}")
    return json.loads(text, parse_constant=bad)


def json_error(body):
    try:
        return json.loads(body)["error"]["message"]
    except Exception:
        return None


def blog_p50(port, n=40, timeout=5):
    """Median latency of n blog requests on one kept-alive connection (failures counted)."""
    lat, fails = [], 0
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    for _ in range(n):
        t = time.perf_counter()
        try:
            st, _, _ = request(port, "POST", "/v1/systemone", BLOG, {"Content-Type": "application/json"}, conn=c)
            if st != 200:
                fails += 1
            else:
                lat.append((time.perf_counter() - t) * 1e3)
        except (OSError, http.client.HTTPException):
            fails += 1
            if fails >= 5:  # the server is not answering: enough said
                break
            c.close()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.close()
    lat.sort()
    return (lat[len(lat) // 2] if lat else float("inf")), fails


ROWS = []


def row(item, case, result, ok):
    ROWS.append({"item": item, "case": case, "result": result, "ok": bool(ok)})
    print(f"  [{item:>2}] {'ok  ' if ok else 'FAIL'} {case}: {result}", flush=True)


# ---------------------------------------------------------------------------------------------
# the cases


def case_body_limits(args):
    with Server(args) as s:
        if not s.ready:
            return row(1, "server start", "did not start", False)
        # gzip bomb: a valid request whose state is 50 MiB of one letter, in about 51 KB
        bomb = gzip.compress(b'{"state":"' + b"a" * (50 << 20) + b'","questions":{"q":{"type":"noul"}}}', 9)
        r0 = rss_mib(s.proc.pid)
        t = time.perf_counter()
        try:
            st, _, body = request(s.port, "POST", "/v1/systemone", bomb, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
        except (OSError, http.client.HTTPException) as e:
            st, body = None, str(e).encode()
        r1 = rss_mib(s.proc.pid)
        row(1, f"gzip body of {len(bomb) // 1000} KB inflating to 50 MiB", f"status {st} in {(time.perf_counter() - t) * 1e3:.0f} ms, "
            f"RSS {r0:.0f} -> {r1:.0f} MiB ({json_error(body)})", st == 413 and r1 - r0 < 100)
        # chunked body of 64 MiB, sent until the server answers or closes
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
        chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
        sent, t = 0, time.perf_counter()
        r0 = rss_mib(s.proc.pid)
        try:
            for _ in range(64):
                sock.sendall(chunk)
                sent += 1
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        sock.settimeout(10)
        try:
            resp = sock.recv(65536)
        except OSError:
            resp = b""
        sock.close()
        r1 = rss_mib(s.proc.pid)
        st = status_of(resp)
        row(1, "chunked body of 64 MiB", f"status {st} after {sent} MiB sent, RSS {r0:.0f} -> {r1:.0f} MiB", st == 413 and r1 - r0 < 100)
        # deflate works too, within the limit
        st, _, _ = request(s.port, "POST", "/v1/systemone", zlib.compress(BLOG), {"Content-Encoding": "deflate"})
        st2, _, _ = request(s.port, "POST", "/v1/systemone", gzip.compress(BLOG), {"Content-Encoding": "gzip"})
        row(1, "gzip / deflate bodies within the limit", f"status {st2} / {st}", st == 200 and st2 == 200)


def open_idle(port, n):
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    return socks


class Slowloris(threading.Thread):
    """n connections that each send a request line and then one header line every `every` s,
    reconnecting when the server closes them; counts how many the server dropped."""

    def __init__(self, port, n, every):
        super().__init__(daemon=True)
        self.port, self.n, self.every = port, n, every
        self.stop_flag = threading.Event()
        self.dropped = 0
        self.refused = 0

    def connect(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            s.setblocking(False)
            s.send(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n")
            return s
        except OSError:
            self.refused += 1
            return None

    def run(self):
        sel = selectors.DefaultSelector()
        socks = [self.connect() for _ in range(self.n)]
        for s in socks:
            if s:
                sel.register(s, selectors.EVENT_READ)
        next_drip = time.time() + self.every
        while not self.stop_flag.is_set():
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data or b"408" in data:
                    sel.unregister(s)
                    s.close()
                    self.dropped += 1
                    ns = self.connect()
                    if ns:
                        sel.register(ns, selectors.EVENT_READ)
            if time.time() >= next_drip:
                for key in list(sel.get_map().values()):
                    try:
                        key.fileobj.send(b"X-Drip: 1\r\n")
                    except OSError:
                        pass
                next_drip = time.time() + self.every
        for key in list(sel.get_map().values()):
            key.fileobj.close()


def case_connections(args):
    n_idle, n_slow = args.idle, args.slow
    with Server(args) as s:
        if not s.ready:
            return row(2, "server start", "did not start", False)
        base, _ = blog_p50(s.port)
        idle = open_idle(s.port, n_idle)
        slow = Slowloris(s.port, n_slow, 1.0)
        slow.start()
        time.sleep(2)
        p50, fails = blog_p50(s.port, n=40)
        time.sleep(max(0, 12 - 2))  # past the default 10 s header deadline
        dropped = slow.dropped
        slow.stop_flag.set()
        slow.join()
        for x in idle:
            x.close()
        row(2, f"{len(idle)} idle + {n_slow} slowloris connections (a header line each per second)",
            f"normal client p50 {p50:.1f} ms vs {base:.1f} idle ({p50 / base:.2f}x), {fails} failed; "
            f"{dropped} slow connections dropped by the header deadline in 12 s",
            fails == 0 and p50 <= 2 * base and len(idle) >= n_idle * 0.99 and dropped >= n_slow * 0.9)
        # headers: many, and one huge block
        many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(100000)) + b"\r\n"
        st = status_of(raw_exchange(s.port, many, timeout=10))
        big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (5 << 20) + b"\r\n\r\n"
        st2 = status_of(raw_exchange(s.port, big, timeout=10))
        row(2, "100,000 headers / one 5 MiB header", f"status {st} / {st2}", st == 431 and st2 == 431)


def case_sigterm(args):
    with Server(args) as s:
        if not s.ready:
            return row(3, "server start", "did not start", False)
        idle = open_idle(s.port, 1)
        slow = Slowloris(s.port, 5, 1.0)
        slow.start()
        time.sleep(1.5)
        t = time.perf_counter()
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(75)
            took = time.perf_counter() - t
            code = s.proc.returncode
        except subprocess.TimeoutExpired:
            took, code = float("inf"), None
        slow.stop_flag.set()
        slow.join()
        for x in idle:
            x.close()
        row(3, "SIGTERM with 1 idle + 5 header-dripping clients", f"exited {code} after {took:.2f} s", code == 0 and took < 3)


def read_responses(sock, n, timeout):
    """Reads n HTTP responses (Content-Length framed) from sock; returns their bodies."""
    sock.settimeout(timeout)
    buf, out, end = b"", [], time.time() + timeout
    while len(out) < n and time.time() < end:
        while b"\r\n\r\n" in buf:
            head, rest = buf.split(b"\r\n\r\n", 1)
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            ln = int(m.group(1)) if m else 0
            if len(rest) < ln:
                break
            out.append((status_of(head), rest[:ln]))
            buf = rest[ln:]
            if len(out) == n:
                return out
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    return out


def case_pipelining(args):
    with Server(args) as s:
        if not s.ready:
            return row(4, "server start", "did not start", False)
        reqs = b""
        bodies = []
        for i in range(3):
            b = json.dumps({"state": f"ticket {i}", "questions": {"q": {"type": "noul"}}}).encode()
            bodies.append(b)
            reqs += b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b)
        alone = [request(s.port, "POST", "/v1/systemone", b)[2] for b in bodies]
        sock = socket.create_connection(("127.0.0.1", s.port))
        t = time.perf_counter()
        sock.sendall(reqs)
        got = read_responses(sock, 3, 10)
        took = time.perf_counter() - t
        sock.close()
        in_order = [b for _, b in got] == alone
        row(4, "3 requests in one write", f"{len(got)} answered in {took * 1e3:.0f} ms, in order: {in_order}", len(got) == 3 and in_order)


def nan_folder(args):
    """A copy of the model folder with NaN in one backbone tensor (bf16 0x7fc0)."""
    d = tempfile.mkdtemp(prefix="clefrt-nan-")
    for f in os.listdir(args.model):
        shutil.copy(os.path.join(args.model, f), d)
    path = sorted(f for f in os.listdir(d) if f.startswith("model-") and f.endswith(".safetensors"))[0]
    with open(os.path.join(d, path), "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name = next(k for k, v in sorted(header.items()) if k != "__metadata__" and v["dtype"] == "BF16" and "mlp.down_proj" in k)
        beg, end = header[name]["data_offsets"]
        f.seek(8 + n + beg)
        f.write(b"\xc0\x7f" * ((end - beg) // 2))
    return d, name


def case_nan(args):
    d, tensor = nan_folder(args)
    try:
        t = time.perf_counter()
        with Server(args, model=d, wait=False) as s:
            try:
                s.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
            code = s.proc.returncode
            log = s.log_text()
        named = tensor in log
        row(5, "serve a folder with NaN weights", f"exit {code} after {time.perf_counter() - t:.1f} s, names the tensor: {named}",
            code not in (None, 0) and named)
        with Server(args, extra=["--no-check-weights"], model=d) as s:
            if not s.ready:
                row(5, "same folder, --no-check-weights", "did not start", False)
            else:
                st, _, body = request(s.port, "POST", "/v1/systemone", BLOG, timeout=30)
                msg = json_error(body) or body[:120].decode(errors="replace")
                try:
                    strict_json(body)
                    valid = True
                except ValueError:
                    valid = False
                row(5, "same folder, --no-check-weights, one request", f"status {st}, valid JSON {valid}: {msg}",
                    st == 500 and valid and "layer" in (msg or ""))
        req = tempfile.mktemp(suffix=".json")
        with open(req, "wb") as f:
            f.write(BLOG)
        p = subprocess.run([args.clefrt, "decide", "--model", d, "--no-check-weights", req], capture_output=True, timeout=120)
        err = p.stderr.decode(errors="replace").strip()
        try:
            answers = [strict_json(line) for line in p.stdout.decode().splitlines() if line.strip()]
            valid = all("error" in a for a in answers)
        except ValueError:
            valid = False
        row(5, "decide on it (--no-check-weights)", f"exit {p.returncode}, stdout an error JSON: {valid}; stderr: {err[:160]}",
            p.returncode != 0 and valid and "layer" in err)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def case_keepalive(args):
    with Server(args) as s:
        if not s.ready:
            return row(6, "server start", "did not start", False)
        kept, _ = blog_p50(s.port, n=30)
        fresh = []
        for _ in range(30):
            t = time.perf_counter()
            request(s.port, "POST", "/v1/systemone", BLOG)
            fresh.append((time.perf_counter() - t) * 1e3)
        fresh.sort()
        f50 = fresh[len(fresh) // 2]
        row(6, "30 requests kept alive vs 30 on new connections", f"p50 {kept:.1f} ms vs {f50:.1f} ms", kept <= f50 + 5)


def case_declared_length(args):
    with Server(args) as s:
        if not s.ready:
            return row(7, "server start", "did not start", False)
        t = time.perf_counter()
        out = raw_exchange(s.port, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n", timeout=35)
        took = time.perf_counter() - t
        row(7, "Content-Length: 10^12, no body", f"status {status_of(out)} after {took:.2f} s", status_of(out) == 413 and took < 1)


def case_content_types(args):
    with Server(args) as s:
        if not s.ready:
            return row(8, "server start", "did not start", False)
        big = json.loads(BLOG)
        big["state"] = "x " * 6000  # a 12 KB body
        body = json.dumps(big).encode()
        st, _, b = request(s.port, "POST", "/v1/systemone", body, {"Content-Type": "application/x-www-form-urlencoded"})
        row(8, f"curl -d: {len(body) // 1024} KiB JSON as application/x-www-form-urlencoded", f"status {st}", st == 200)
        mp = b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n" + BLOG + b"\r\n--b--\r\n"
        st, _, b = request(s.port, "POST", "/v1/systemone", mp, {"Content-Type": "multipart/form-data; boundary=b"})
        row(8, "multipart/form-data body", f"status {st}: {json_error(b)}", st == 415 and json_error(b))
        st, _, b = request(s.port, "POST", "/v1/systemone", BLOG, {"Content-Encoding": "br"})
        row(8, "Content-Encoding: br", f"status {st}: {json_error(b)}", st == 415 and json_error(b))
        st, _, b = request(s.port, "POST", "/v1/systemone", b"\x1f\x8bnot gzip at all", {"Content-Encoding": "gzip"})
        row(8, "corrupt gzip body", f"status {st}: {json_error(b)}", st == 400 and json_error(b))


def case_refusals_counted(args):
    with Server(args) as s:
        if not s.ready:
            return row(9, "server start", "did not start", False)
        raw_exchange(s.port, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", timeout=5)
        raw_exchange(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (200 << 10) + b"\r\n\r\n", timeout=5)
        raw_exchange(s.port, b"GARBAGE\r\n\r\n", timeout=5)
        request(s.port, "GET", "/nope")
        request(s.port, "GET", "/" + "a" * 20000)
        time.sleep(0.3)
        _, _, metrics = request(s.port, "GET", "/metrics")
        m = metrics.decode()
        want = {413: 'status="413"', 431: 'status="431"', 400: 'status="400"', 404: 'status="404"'}
        counted = {k: v in m for k, v in want.items()}
        log = s.log_text()
        logged = {k: f'"status":{k}' in log for k in want}
        row(9, "413 / 431 / 400 / 404 (and a 20 KB path) from the HTTP layer", f"counted {counted}, logged {logged}",
            all(counted.values()) and all(logged.values()))


def case_api_key(args):
    with Server(args, extra=["--api-key", ""], wait=False) as s:
        try:
            s.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        code = s.proc.returncode
        log = s.log_text()
    row(10, "--api-key \"\"", f"exit {code}: {log.strip().splitlines()[-1][:120] if log.strip() else ''}", code not in (None, 0))
    with Server(args, extra=["--api-key", "s3cret"]) as s:
        st, _, _ = request(s.port, "POST", "/v1/systemone", BLOG, {"Authorization": "bearer s3cret"})
        st2, _, _ = request(s.port, "POST", "/v1/systemone", BLOG, {"Authorization": "Bearer wrong"})
        row(10, "Authorization: bearer (lowercase) / wrong key", f"status {st} / {st2}", st == 200 and st2 == 401)


def case_unknown_fields(args):
    with Server(args) as s:
        if not s.ready:
            return row(11, "server start", "did not start", False)
        oai = {"model": "clef", "input": "checkout is down", "questions": [{"type": "predicate", "name": "outage"}]}
        png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        cases = [
            ("/v1/decisions", dict(oai, images=[png]), "OpenAI shape + images"),
            ("/v1/decisions", dict(oai, temperature=0), "OpenAI shape + unknown field"),
            ("/v1/decisions", dict(oai, questions=[{"type": "predicate", "name": "outage", "weight": 2}]), "OpenAI question + unknown field"),
            ("/v1/decisions", dict(oai, input=[{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": png}}]),
             "OpenAI input with an image_url part"),
            ("/v1/systemone", {"state": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": png}}],
                               "questions": {"q": {"type": "noul"}}}, "System One state with an image_url part"),
        ]
        for path, body, name in cases:
            st, _, b = request(s.port, "POST", path, json.dumps(body).encode())
            row(11, name, f"status {st}: {json_error(b)}", st == 422)


def case_nesting(args):
    readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")).read()
    m = re.search(r"JSON nesting\*\* is limited to (\d+) levels", readme)
    limit = int(m.group(1)) if m else None
    with Server(args) as s:
        if not s.ready:
            return row(12, "server start", "did not start", False)

        def depth_status(n):
            state = "[" * (n - 1) + "]" * (n - 1)  # the body object is level 1
            body = '{"state":%s,"questions":{"q":{"type":"noul"}}}' % (state if n > 1 else '"x"')
            return request(s.port, "POST", "/v1/systemone", body.encode())[0]

        at, over = depth_status(limit), depth_status(limit + 1)
        row(12, f"JSON nesting at the README's {limit} levels / one more", f"status {at} / {over}", at == 200 and over == 400)


def case_fuzz_build(args):
    if not args.fuzz_build:
        return row(13, "README's fuzz build", "not run (--fuzz-build runs it, several minutes)", True)
    d = tempfile.mkdtemp(prefix="clefrt-fuzz-")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cfg = subprocess.run(["cmake", "-S", src, "-B", d, "-G", "Ninja", "-DCMAKE_CXX_COMPILER=clang++", "-DCLEFRT_FUZZ=ON",
                          "-DCLEFRT_TESTS=OFF", "-DCLEFRT_BENCH=OFF", "-DCLEFRT_CUDA=OFF"], capture_output=True)
    b = subprocess.run(["ninja", "-C", d, "fuzz_request", "fuzz_tokenizer"], capture_output=True) if cfg.returncode == 0 else cfg
    ok = b.returncode == 0
    row(13, "README's fuzz build (clang)", "built fuzz_request + fuzz_tokenizer" if ok else b.stdout.decode()[-300:], ok)
    shutil.rmtree(d, ignore_errors=True)


def case_load_failure_and_big_state(args):
    d = tempfile.mkdtemp(prefix="clefrt-broken-")
    for f in os.listdir(args.model):
        shutil.copy(os.path.join(args.model, f), d)
    os.remove(os.path.join(d, "joint_head.safetensors"))
    t = time.perf_counter()
    with Server(args, model=d, wait=False) as s:
        try:
            s.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        code = s.proc.returncode
    shutil.rmtree(d, ignore_errors=True)
    row(14, "serve a folder without its joint head", f"exit {code} after {time.perf_counter() - t:.1f} s", code not in (None, 0))
    with Server(args) as s:
        if not s.ready:
            return row(14, "server start", "did not start", False)
        base, _ = blog_p50(s.port, n=20)
        big = json.loads(BLOG)
        big["state"] = "word " * (13 * 1024 * 1024 // 5 - 100)
        body = json.dumps(big).encode()
        res = {}

        def send_big():
            t0 = time.perf_counter()
            try:
                res["st"] = request(s.port, "POST", "/v1/systemone", body, timeout=120)[0]
            except OSError as e:
                res["st"] = str(e)
            res["ms"] = (time.perf_counter() - t0) * 1e3

        th = threading.Thread(target=send_big)
        th.start()
        time.sleep(0.3)
        p50, fails = blog_p50(s.port, n=20)
        th.join()
        row(14, f"a {len(body) >> 20} MiB state tokenized while a normal client runs",
            f"normal p50 {p50:.1f} ms vs {base:.1f} idle, {fails} failed; the big one: status {res.get('st')} in {res.get('ms', 0):.0f} ms",
            fails == 0 and p50 <= 2 * base + 5)


def case_soak(args):
    """Mixed traffic for --soak-seconds: normal clients, garbage, half-sent requests, clients that
    leave mid-request. Nothing may fail for the normal clients, memory must settle and every
    connection must be gone at the end."""
    import random
    with Server(args) as s:
        if not s.ready:
            return row(15, "server start", "did not start", False)
        stop = threading.Event()
        stats = {"ok": 0, "fail": 0, "hostile": 0}
        why = {}
        lock = threading.Lock()

        def normal():
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    st, _, _ = request(s.port, "POST", "/v1/systemone", BLOG, conn=c)
                    with lock:
                        stats["ok" if st == 200 else "fail"] += 1
                        if st != 200:
                            why[f"status {st}"] = why.get(f"status {st}", 0) + 1
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        stats["fail"] += 1
                        k = f"{type(e).__name__} after {time.perf_counter() - t0:.1f} s"
                        why[k] = why.get(k, 0) + 1
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            c.close()

        def hostile(seed):
            rnd = random.Random(seed)
            while not stop.is_set():
                kind = rnd.randrange(4)
                try:
                    sock = socket.create_connection(("127.0.0.1", s.port), timeout=2)
                    if kind == 0:
                        sock.sendall(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 400))))
                    elif kind == 1:  # half a request, then gone
                        sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nContent-Length: 500\r\n\r\n{\"state\":")
                    elif kind == 2:  # a whole request, gone before the answer
                        sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(BLOG), BLOG))
                    else:  # a gzip body and an early close
                        g = gzip.compress(BLOG)
                        sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(g), g[: len(g) // 2]))
                    sock.close()
                    with lock:
                        stats["hostile"] += 1
                except OSError:
                    pass

        threads = [threading.Thread(target=normal) for _ in range(4)] + [threading.Thread(target=hostile, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(min(5, args.soak_seconds / 4))
        r0 = rss_mib(s.proc.pid)
        time.sleep(args.soak_seconds)
        r1 = rss_mib(s.proc.pid)
        stop.set()
        for t in threads:
            t.join()
        time.sleep(1.5)
        _, _, h = request(s.port, "GET", "/health")
        left = json.loads(h).get("open_connections", -1)
        row(15, f"soak: {args.soak_seconds:.0f} s of 4 normal clients + 2 hostile ones",
            f"{stats['ok']} answered, {stats['fail']} failed, {stats['hostile']} hostile connections; RSS {r0:.0f} -> {r1:.0f} MiB; "
            f"open connections after: {left - 1 if left > 0 else left} (besides the one asking)" + (f"; failures: {why}" if why else ""),
            stats["fail"] == 0 and r1 - r0 < 50 and left == 1)


CASES = {1: case_body_limits, 2: case_connections, 3: case_sigterm, 4: case_pipelining, 5: case_nan, 6: case_keepalive,
         7: case_declared_length, 8: case_content_types, 9: case_refusals_counted, 10: case_api_key, 11: case_unknown_fields,
         12: case_nesting, 13: case_fuzz_build, 14: case_load_failure_and_big_state, 15: case_soak}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clefrt", default="build/clefrt")
    ap.add_argument("--model", default="build/models/tiny")
    ap.add_argument("--only", default="", help="comma-separated case numbers (1-15)")
    ap.add_argument("--soak-seconds", type=float, default=60, help="case 15's length")
    ap.add_argument("--idle", type=int, default=10000, help="idle connections in case 2")
    ap.add_argument("--slow", type=int, default=1000, help="slowloris connections in case 2")
    ap.add_argument("--fuzz-build", action="store_true", help="case 13: configure and build the fuzz targets with clang")
    ap.add_argument("--json", default="", help="write the rows here")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.idle + args.slow + 100:
        sys.exit(f"attack.py: the descriptor limit ({hard}) is below the {args.idle} + {args.slow} connections of case 2")
    only = {int(x) for x in args.only.split(",") if x} or set(CASES)
    print(f"attack.py: {args.clefrt} serve --model {args.model}; cases {sorted(only)}", flush=True)
    for k in sorted(only):
        try:
            CASES[k](args)
        except Exception as e:  # a case that crashes is a failed case, the rest still run
            row(k, CASES[k].__name__, f"the case itself failed: {type(e).__name__}: {e}", False)
    print("\n| item | case | result | behaves |\n|---|---|---|---|")
    for r in ROWS:
        print(f"| {r['item']} | {r['case']} | {r['result'].replace('|', '/')} | {'yes' if r['ok'] else '**no**'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ROWS, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in ROWS) else 1)


if __name__ == "__main__":
    main()

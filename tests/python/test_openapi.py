"""docs/openapi.yaml against the real server: `clefrt serve` on a synthesized tiny model (CPU)
gets every documented edge case, and each answer must have a status the document lists for
its path and method and a body its schema accepts (python3-jsonschema; OpenAPI 3.0's
`nullable` and `$ref` translated to JSON Schema here). The schemas are strict (required
fields, no unknown ones), so a field the server adds or drops fails the test.

Run by CTest (Python.pytest) with CLEFRT_BINARY and CLEFRT_SOURCE_DIR set.
"""
import base64
import copy
import gzip
import http.client
import json
import os
import struct
import subprocess
import time
import zlib

import jsonschema
import pytest
import yaml

SOURCE = os.environ.get("CLEFRT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("CLEFRT_BINARY", os.path.join(SOURCE, "build", "clefrt"))
TOKENIZER = os.path.join(SOURCE, ".deps", "qwen3", "tokenizer.json")
KEY = "k3y-openapi"
AUTH = {"Authorization": "Bearer " + KEY}
with open(os.path.join(SOURCE, "docs", "openapi.yaml")) as f:
    DOC = yaml.safe_load(f)

BLOG = {"model": "clef", "state": "Our checkout is down and orders are blocked.", "questions": {
    "outage": {"type": "noul", "instructions": "Is a service down?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?", "criteria": {"billing": "payments", "tech": "outages", "sales": None}},
    "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["No impact", "Minor", "Major", "Critical"]}}}
OPENAI = {"model": "clef", "input": "Checkout is down", "questions": [
    {"type": "predicate", "name": "outage", "instructions": "Is a service down?"},
    {"type": "choice", "name": "team", "choices": [{"value": "billing", "description": "payments"}, {"value": "tech"}]},
    {"type": "score", "name": "sev", "levels": [{"label": "low"}, {"label": "high", "description": "urgent"}]}]}


def png_1x1():
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")


def resolve(node):
    """OpenAPI 3.0 schema -> JSON Schema: $ref inlined (the document has no cycles), nullable
    turned into a null alternative."""
    if isinstance(node, list):
        return [resolve(x) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = DOC
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return resolve(target)
    out = {k: resolve(v) for k, v in node.items() if k not in ("nullable", "example", "description")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("openapi") / "tiny"
    subprocess.run([BINARY, "synth", "--out", str(d), "--config", "tiny", "--tokenizer", TOKENIZER], check=True, capture_output=True)
    p = subprocess.Popen([BINARY, "serve", "--model", str(d), "--port", "0", "--threads", "2", "--max-length", "400", "--api-key", KEY,
                          "--cors-origin", "https://app.example", "--quiet"], stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        if '"event":"listening"' in line:
            port = json.loads(line)["port"]
            break
    assert port, "the server did not start"
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    yield port
    p.terminate()
    p.wait(timeout=30)


class Declared:
    """A body whose Content-Length is sent and whose bytes are not: the server answers at the end
    of the headers (a client pushing 14 MiB would meet a closed socket)."""
    def __init__(self, size):
        self.size = size


def call(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    if isinstance(body, Declared):
        c.putrequest(method, path)
        for k, v in (headers or {}).items():
            c.putheader(k, v)
        c.putheader("Content-Length", str(body.size))
        c.endheaders()
    else:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {})
    r = c.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def conforms(path, method, status, headers, body):
    """The status is one the document lists for (path, method); a JSON body validates against
    its schema. Unknown paths answer 404 with the Error schema (the info section says so)."""
    if path not in DOC["paths"]:
        assert status == 404, status
        jsonschema.validate(json.loads(body), resolve(DOC["components"]["schemas"]["Error"]))
        return
    op = DOC["paths"][path].get(method.lower())
    if op is None:  # a method the path does not serve: 405, with the error body
        assert status == 405, status
        jsonschema.validate(json.loads(body), resolve(DOC["components"]["schemas"]["Error"]))
        return
    resp = op["responses"].get(str(status))
    assert resp is not None, f"{method} {path} answered {status}, which the document does not list ({sorted(op['responses'])})"
    resp = resolve(resp)
    content = resp.get("content", {})
    if not content:
        assert body == b"", f"{status}: the document gives no body, the server sent {body[:200]!r}"
        return
    ctype = headers.get("Content-Type", "").split(";")[0]
    assert ctype in content, f"Content-Type {ctype!r} not documented ({list(content)})"
    if ctype == "application/json":
        jsonschema.validate(json.loads(body), content[ctype]["schema"])


CASES = [
    # name, method, path, body, headers, expected status
    ("blog", "POST", "/v1/systemone", BLOG, AUTH, 200),
    ("blog on decisions", "POST", "/v1/decisions", BLOG, AUTH, 200),
    ("openai shape", "POST", "/v1/decisions", OPENAI, AUTH, 200),
    ("gzip body", "POST", "/v1/systemone", gzip.compress(json.dumps(BLOG).encode()), {**AUTH, "Content-Encoding": "gzip"}, 200),
    ("state cut to fit", "POST", "/v1/systemone", {"state": "word " * 2000, "questions": {"q": {"type": "noul"}}}, AUTH, 200),
    ("malformed json", "POST", "/v1/systemone", b"{\"state\": ", AUTH, 400),
    ("not an object", "POST", "/v1/systemone", [1, 2], AUTH, 400),
    ("unknown field", "POST", "/v1/systemone", {**BLOG, "temperature": 0}, AUTH, 422),
    ("unknown question type", "POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "maybe"}}}, AUTH, 422),
    ("one choice", "POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "choice", "criteria": {"a": None}}}}, AUTH, 422),
    ("256 options", "POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}}}, AUTH, 422),
    ("11 levels", "POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}}, AUTH, 422),
    ("65 questions", "POST", "/v1/systemone", {"state": "x", "questions": {f"q{i}": {"type": "noul"} for i in range(65)}}, AUTH, 422),
    ("schema over the context", "POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "noul", "instructions": "why " * 600}}}, AUTH, 413),
    ("image that does not decode", "POST", "/v1/systemone", {**BLOG, "images": ["data:image/png;base64,AAAA"]}, AUTH, 422),
    ("valid image (the CPU engine runs the tower)", "POST", "/v1/systemone",
     {**BLOG, "images": ["data:image/png;base64," + base64.b64encode(png_1x1()).decode()]}, AUTH, 200),
    ("remote image url", "POST", "/v1/decisions", {**OPENAI, "images": ["https://example.com/a.png"]}, AUTH, 422),
    ("image part inside the state", "POST", "/v1/systemone",
     {"state": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "questions": {"q": {"type": "noul"}}}, AUTH, 422),
    ("no api key", "POST", "/v1/systemone", BLOG, {}, 401),
    ("wrong api key", "GET", "/v1/models", None, {"Authorization": "Bearer nope"}, 401),
    ("multipart", "POST", "/v1/systemone", b"--x\r\n\r\n--x--", {**AUTH, "Content-Type": "multipart/form-data; boundary=x"}, 415),
    ("brotli body", "POST", "/v1/systemone", b"\x00", {**AUTH, "Content-Encoding": "br"}, 415),
    ("body over 13 MiB", "POST", "/v1/systemone", Declared(14 << 20), AUTH, 413),
    ("GET a decision endpoint", "GET", "/v1/systemone", None, AUTH, 405),
    ("unknown path", "GET", "/v2/nothing", None, AUTH, 404),
    ("models", "GET", "/v1/models", None, AUTH, 200),
    ("health", "GET", "/health", None, {}, 200),
    ("metrics", "GET", "/metrics", None, {}, 200),
    ("POST health", "POST", "/health", b"{}", {}, 405),
    ("preflight from the allowed origin", "OPTIONS", "/v1/systemone", None,
     {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}, 204),
    ("preflight from another origin", "OPTIONS", "/v1/decisions", None, {"Origin": "https://evil.example"}, 405),
]


@pytest.mark.parametrize("name,method,path,body,headers,expected", CASES, ids=[c[0] for c in CASES])
def test_the_server_answers_as_documented(server, name, method, path, body, headers, expected):
    status, got_headers, got = call(server, method, path, body if isinstance(body, Declared) else copy.deepcopy(body), headers)
    assert status == expected, f"{name}: {status} {got[:300]!r}"
    conforms(path, method, status, got_headers, got)
    if status == 405:
        assert "Allow" in got_headers
    if name == "state cut to fit":
        assert json.loads(got)["usage"]["state_tokens_dropped"] > 0
    if name == "blog":
        assert "state_tokens_dropped" not in json.loads(got)["usage"]
    # the Decision Index kit counts a refusal carrying one of its capacity markers as
    # "unsupported by this engine" (decision_index/engines/http.py), anything else as a failure
    markers = {"one choice": "a choice needs at least two options", "256 options": "options per choice",
               "11 levels": "a score takes 2 to 10 levels", "schema over the context": "maximum context length"}
    if name in markers:
        assert markers[name] in json.loads(got)["error"]["message"], got
    if name == "schema over the context":
        assert "maximum context length" in json.loads(got)["error"]["message"]
    if name.startswith("preflight from the allowed"):
        assert got_headers.get("Access-Control-Allow-Origin") == "https://app.example"


def test_the_schemas_are_strict():
    """A field the server does not send fails validation (the test above can fail)."""
    schema = resolve(DOC["components"]["schemas"]["SystemOneResponse"])
    good = {"model": "clef", "answers": {"q": {"type": "noul", "noul": 0.5}}, "usage": {"input_tokens": 10, "output_tokens": 0, "cached_tokens": 0}}
    jsonschema.validate(good, schema)
    for bad in ({**good, "extra": 1}, {**good, "usage": {"input_tokens": 10}},
                {**good, "answers": {"q": {"type": "noul", "noul": 0.5, "probabilities": {}}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)

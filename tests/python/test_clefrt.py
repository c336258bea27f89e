"""The clefrt Python module on a synthesized tiny model (CPU): its answers against
`clefrt decide --precise`, batching, every error class, threads, the GIL.

Run by CTest (Python.pytest) with PYTHONPATH=build/python, CLEFRT_BINARY and CLEFRT_SOURCE_DIR set.
"""
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

import clefrt
from clefrt import Clef

SOURCE = os.environ.get("CLEFRT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("CLEFRT_BINARY", os.path.join(SOURCE, "build", "clefrt"))
TOKENIZER = os.path.join(SOURCE, ".deps", "qwen3", "tokenizer.json")

BLOG = {
    "model": "clef",
    "state": "Our checkout is down and orders are blocked.",
    "questions": {
        "outage": {"type": "noul", "instructions": "Is a service down?"},
        "team": {"type": "choice", "instructions": "Which team should handle it?",
                 "criteria": {"billing": "payments", "tech": "outages", "sales": None}},
        "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["No impact", "Minor", "Major", "Critical"]},
    },
}


def request(i, words=0):
    return {"state": f"ticket {i} " + "lorem ipsum " * words,
            "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": "bee", "c": None}},
                          "s": {"type": "score", "criteria": ["lo", "mid", "hi"]}}}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([BINARY, "synth", "--out", str(d), "--config", "tiny", "--tokenizer", TOKENIZER, "--seed", "5"],
                   check=True, capture_output=True)
    return str(d)


@pytest.fixture(scope="session")
def model(tiny):
    m = Clef(tiny, threads=2)
    yield m
    m.close()


def decide_precise(tiny, record):
    p = subprocess.run([BINARY, "decide", "--model", tiny, "--threads", "2", "--precise", "-"], input=json.dumps(record).encode(),
                       capture_output=True, check=True)
    return json.loads(p.stdout)


def test_readme_example_and_probs_equal_decide_precise_bit_for_bit(model, tiny):
    out = model.probs([model.encode(BLOG)])[0]
    assert list(out) == ["outage", "team", "severity"]
    assert list(out["outage"]) == ["true", "false"]
    assert list(out["team"]) == ["billing", "sales", "tech"]  # encoded order: sorted labels
    full = decide_precise(tiny, BLOG)
    ref = full["answers"]
    assert out["outage"]["true"] == ref["outage"]["noul"]  # exact float equality, not approx
    for label, p in ref["team"]["probabilities"].items():
        assert out["team"][label] == p
    for level, p in ref["severity"]["probabilities"].items():
        assert out["severity"][level] == p
    assert model.decide(BLOG, precise=True) == full
    assert model.decide(json.dumps(BLOG), precise=True) == full  # JSON text works too
    rounded = model.decide(BLOG)
    assert rounded["answers"]["outage"]["noul"] == round(ref["outage"]["noul"], 4)
    assert rounded["usage"]["input_tokens"] == full["usage"]["input_tokens"]


def test_encode_gives_ids_spans_and_option_ids(model, tiny):
    e = model.encode(BLOG)
    cli = json.loads(subprocess.run([BINARY, "encode", "--model", tiny, "-"], input=json.dumps(BLOG).encode(),
                                    capture_output=True, check=True).stdout)
    assert e.input_ids == cli["input_ids"]
    assert json.loads(e.encoded_json()) == cli
    assert [q["id"] for q in e.questions] == ["outage", "team", "severity"]
    assert e.questions[2]["option_ids"] == ["0", "1", "2", "3"]
    assert e.input_tokens == len(e.input_ids)
    assert all(s["end"] > s["begin"] for q in e.questions for s in q["option_spans"])


def test_a_list_equals_one_at_a_time(model):
    reqs = [request(i, words=i * 7) for i in range(12)]
    together = model.probs([model.encode(r) for r in reqs])
    alone = [model.probs([model.encode(r)])[0] for r in reqs]
    assert together == alone
    assert model.decide(reqs, precise=True) == [model.decide(r, precise=True) for r in reqs]


def test_errors_have_their_class_status_and_path(model, tiny, tmp_path):
    with pytest.raises(clefrt.RequestError) as e:
        model.encode({"state": "x", "questions": {"q": {"type": "choice", "criteria": {"only": None}}}})
    assert e.value.status == 422 and e.value.path == "questions.q.criteria" and isinstance(e.value, ValueError)
    with pytest.raises(clefrt.RequestError) as e:
        model.encode('{"state": "x", "questions": ')  # malformed JSON text
    assert e.value.status == 400
    with pytest.raises(clefrt.RequestError) as e:
        model.encode({"state": "x"})
    assert e.value.status == 400 and e.value.path == "questions"
    many = {"state": "x", "questions": {f"q{i}": {"type": "noul", "instructions": "word " * 3000} for i in range(64)}}
    with pytest.raises(clefrt.RequestError) as e:
        model.encode(many)
    assert e.value.status == 413 and "maximum context length" in str(e.value)
    with pytest.raises(TypeError):
        model.encode(["not", "a", "request"])
    with pytest.raises(TypeError):
        model.probs(model.encode(BLOG))  # one Prepared, not a list
    with pytest.raises(TypeError) as e:
        model.probs([model.encode(BLOG), BLOG])  # a request not encoded
    assert "encoded[1] is a dict" in str(e.value)
    with pytest.raises(ValueError):
        Clef(tiny, "nvfp5")
    with pytest.raises(ValueError):
        model.encode({"state": "x", "questions": {"q": {"type": "noul"}}, "extra": float("nan")})
    # load failures name the file
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    os.remove(broken / "joint_head.safetensors")
    with pytest.raises(clefrt.LoadError) as e:
        Clef(str(broken))
    assert e.value.path.endswith("joint_head.safetensors") and isinstance(e.value, OSError)
    with pytest.raises(clefrt.LoadError):
        Clef(str(tmp_path / "no-such-folder"))
    ok, _ = clefrt.cuda_available()
    if not ok:
        with pytest.raises(clefrt.EngineError) as e:
            Clef(tiny, device="cuda")
        assert e.value.status == 503


def test_options_are_checked_by_name_and_a_list_names_its_failing_record(model, tiny):
    # wrong types and ranges name the option (not pybind11's "Unable to cast")
    for kw, words in [({"max_length": -1}, "max_length must be 0 or more"), ({"max_length": "100"}, "max_length must be an int"),
                      ({"threads": 1.5}, "threads must be an int"), ({"max_length": 2**70}, "max_length must be at most"),
                      ({"vision": "yes"}, "vision must be True or False"), ({"prefix_cache_gib": "4"}, "prefix_cache_gib must be a number"),
                      ({"batch_wait_ms": "2"}, "batch_wait_ms must be a number of milliseconds"),
                      ({"batch_wait_ms": -1}, "batch_wait_ms must be from 0"), ({"warmup": "yes"}, "warmup must be True or False")]:
        with pytest.raises(ValueError) as e:
            Clef(tiny, device="cpu", **kw)
        assert words in str(e.value), (kw, str(e.value))
    # what bool() / int() took before still goes: 0 / 1 for flags, an int's GiB
    Clef(tiny, device="cpu", threads=2, vision=1, check_weights=0, prefix_cache_gib=1).close()
    # the CPU has nothing to warm: taken, and the engine answers as without it
    warm = Clef(tiny, device="cpu", threads=2, warmup=True)
    assert warm.decide(BLOG, precise=True) == model.decide(BLOG, precise=True)
    warm.close()
    bad = dict(BLOG, questions={"b": {"type": "choice", "criteria": {}}})
    with pytest.raises(clefrt.RequestError) as e:
        model.decide([BLOG, BLOG, bad])
    assert e.value.index == 2 and str(e.value).startswith("records[2]: ") and e.value.path == "questions.b.criteria"
    closed = Clef(tiny, device="cpu", threads=2)
    closed.close()
    with pytest.raises(clefrt.EngineError) as e:
        closed.decide(BLOG)
    assert "closed" in str(e.value)


def test_threads_share_one_model(model):
    reqs = [request(i, words=i) for i in range(16)]
    want = [model.decide(r, precise=True) for r in reqs]
    got = [None] * len(reqs)
    errors = []

    def work(k):
        try:
            for j in range(k, len(reqs), 4):
                got[j] = model.decide(reqs[j], precise=True)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got == want


def test_the_gil_is_released_during_a_forward(model):
    reqs = [model.encode(request(i, words=1500)) for i in range(8)]
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    before = ticks[0]
    t0 = time.perf_counter()
    model.probs(reqs)
    took = time.perf_counter() - t0
    during = ticks[0] - before
    stop.set()
    t.join()
    assert took > 0.05, "the forward was too quick to tell"
    # with the GIL held the counting thread would not run at all during the call
    assert during > 10000, f"{during} ticks in {took:.2f} s"


def test_the_prefix_cache_reports_cached_tokens_and_keeps_the_answer(tiny):
    state = "ticket: " + " ".join(f"word{i} failed login again" for i in range(200))  # ~1,000 tokens
    first = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it urgent?"}}}
    second = {"state": state, "questions": {"team": {"type": "choice", "criteria": {"billing": None, "tech": None}}}}
    with Clef(tiny, threads=2, prefix_cache_gib=0) as cold, Clef(tiny, threads=2, prefix_cache_gib=0.5) as warm:
        assert not cold.prefix_cache["enabled"]
        a, b = warm.decide([first, second])  # one batch: the second continues the first's prefix
        assert a["usage"]["cached_tokens"] == 0
        assert b["usage"]["cached_tokens"] > 0 and b["usage"]["cached_tokens"] % warm.prefix_cache["granularity"] == 0
        assert warm.decide(second, precise=True) == {**cold.decide(second, precise=True),
                                                     "usage": {**cold.decide(second)["usage"], "cached_tokens": b["usage"]["cached_tokens"]}}
        stats = warm.prefix_cache
        assert stats["hits"] == 2 and stats["hit_tokens"] == 2 * b["usage"]["cached_tokens"] and stats["entries"] == 1
    with pytest.raises(ValueError, match="prefix_cache_gib"):
        Clef(tiny, prefix_cache_gib=-2)


def test_an_image_reaches_the_answer_as_decide_gives_it(model, tiny):
    """A request with an image (the corpus's 333 x 500 JPEG, as a data: URL) through the module:
    the same bits as `clefrt decide --precise`, its image tokens counted, and another answer than
    the same request without the image (the tower's rows reach the model, nothing is dropped)."""
    import base64
    with open(os.path.join(SOURCE, "tests", "fixtures", "images", "corpus", "jpeg-420-333x500.jpg"), "rb") as f:
        url = "data:image/jpeg;base64," + base64.b64encode(f.read()).decode()
    with_image = {**BLOG, "images": [url]}
    got = model.decide(with_image, precise=True)
    assert got == decide_precise(tiny, with_image)
    without = model.decide(BLOG, precise=True)
    assert got["usage"]["input_tokens"] > without["usage"]["input_tokens"] + 100  # 333 x 500 -> 160 image tokens
    assert got["answers"] != without["answers"]
    with pytest.raises(clefrt.RequestError, match=r"images\[0\]"):
        model.decide({**BLOG, "images": ["data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xe0 not a jpeg").decode()]})


def test_text_only_leaves_the_tower_out_and_refuses_images(model, tiny):
    """vision=False: text answers as with the tower; an image is a 422 that says why."""
    import base64
    with open(os.path.join(SOURCE, "tests", "fixtures", "images", "corpus", "rgb-16x16.png"), "rb") as f:
        url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
    with Clef(tiny, threads=2, vision=False) as text_only:
        assert text_only.decide(BLOG, precise=True) == model.decide(BLOG, precise=True)
        with pytest.raises(clefrt.RequestError, match="text only"):
            text_only.decide({**BLOG, "images": [url]})

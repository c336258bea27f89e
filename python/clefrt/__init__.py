"""clefrt: joint-schema decision models (Cloudflare's Clef and Clef-flash) from Python.

A request holds a ``state`` (text, JSON, images) and typed ``questions`` (``noul``, ``choice``,
``score``); the model gives a probability for every allowed option in one forward pass::

    from clefrt import Clef
    model = Clef("/models/clef")                      # or Clef(path, "nvfp4") on a GPU
    out = model.probs([model.encode({"state": "Checkout is down",
                                     "questions": {"outage": {"type": "noul"}}})])[0]
    # {'outage': {'true': 0.98, 'false': 0.02}}

The calls are those of the community NVFP4 Clef runtime (``Clef(path, mode)``, ``encode``,
``probs``), so code written for it runs by changing the import; ``decide`` adds the System One
response. The engine is native C++/CUDA: calls release the GIL while it works, and requests from
several Python threads share its forwards.
"""

import json as _json

from . import _clefrt
from ._clefrt import EngineError, LoadError, Prepared, RequestError

__all__ = ["Clef", "Prepared", "RequestError", "LoadError", "EngineError", "version", "cuda_available"]

_MODES = ("auto", "bf16", "fp8", "nvfp4", "nvfp4-w4a16")


def version():
    """The library's version string (``clefrt X.Y.Z ...``)."""
    return _clefrt.version()


def cuda_available():
    """``(True, "")`` when this build has the CUDA backend and a usable GPU, else ``(False, why)``."""
    return _clefrt.cuda_available()


def _plain(value):
    """JSON for values json cannot write by itself: numpy scalars and arrays (without importing numpy)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable (a request holds JSON values)")


def _body(record):
    if isinstance(record, (str, bytes, bytearray)):
        return record.decode() if isinstance(record, (bytes, bytearray)) else record
    if not isinstance(record, dict):
        raise TypeError(f"a request is a dict (or its JSON text), not {type(record).__name__}")
    return _json.dumps(record, ensure_ascii=False, allow_nan=False, default=_plain)


class Clef:
    """A loaded Clef model folder.

    Clef(path, mode="auto", *, device="auto", max_length=16384, offload_embeddings=False,
         confidence="reference", parse_special=False, require_instructions=False, threads=0,
         check_weights=True, batch_invariant=True, max_batch_tokens=16384,
         max_batch_requests=64, batch_wait_ms=0, w4a16_fused=False, native_fp4=True, portable_kernels=False,
         progress=False, prefix_cache_gib=-1, prefix_cache_host_gib=0, step_tokens=0, step_layers=0, vision=True,
         attention="auto", cuda_graphs=2, warmup=False)

    path: a Clef / Clef-flash release folder (config.json, tokenizer.json, sharded safetensors in
        bf16 / f16 / f32, NVFP4 or FP8 compressed-tensors, joint_head.*).
    mode: what the GPU runs the Linears in: "auto" (what the folder holds), "bf16", "fp8",
        "nvfp4" (W4A4; needs a W4A4 folder) or "nvfp4-w4a16" (the community runtime's names).
        The CPU engine runs what the folder holds and takes only "auto".
    device: "auto" (CUDA when this build has it and a GPU is present), "cuda" or "cpu".
    max_length: the context length in tokens; a longer state is cut to fit, a schema that alone
        does not fit raises RequestError (413, "maximum context length").
    offload_embeddings: CUDA lean-memory mode (embeddings in pinned host memory, blocked MLP and
        GDN passes): the same answers, less GPU memory.
    confidence: the ``confidence`` of decide()'s answers: "reference" (max p), "purity" (hosted
        Clef) or "jev".
    parse_special: special-token text inside user content becomes the special token, as the
        reference does (default: user text is always plain text).
    require_instructions: a missing or empty instruction raises RequestError (422) instead of the
        question id standing in.
    threads: CPU engine threads (0: all cores).
    check_weights: test every weight for NaN / infinity at load (LoadError names the tensor).
    batch_invariant: a request's answer does not depend on what it is batched with.
    max_batch_tokens, max_batch_requests: how much one forward packs.
    batch_wait_ms: after a forward of several requests, how long the engine may wait for as many
        to be queued again before the next one (threads that each send their next request when
        an answer comes back arrive together; without it their forwards alternate between a few
        requests and the rest). A lone request never waits. 0 (the default): never wait.
    w4a16_fused: CUDA, NVFP4: the fused W4A16 GEMM (no staging memory; slower on Hopper).
    native_fp4: CUDA, W4A4 on Blackwell: FP4 tensor cores (untested here); False keeps the
        emulated path (its oracle). Hopper and older always emulate.
    portable_kernels: CUDA: only the kernels every supported GPU runs (mma.sync W4A16 GEMM
        instead of wgmma / TMA), to compare them with the fast ones.
    attention: CUDA: the attention kernel (backbone and vision tower): "auto" (cuDNN's fused attention where
        libcudnn.so.9, 9.5 or newer, loads, else clefrt's), "cudnn" (refused without it) or
        "clefrt". Both keep answers batch-invariant and the prefix cache exact.
    cuda_graphs: CUDA: a batch shape (its requests' token counts, questions and options) seen this
        many times (at least 2) is captured into a CUDA graph and replayed from then on, its
        kernels back to back (the same answers). Batches with images or that use the prefix
        cache run as always. 0: off.
    warmup: CUDA: before the constructor returns, forwards of made-up requests (batches of 2,
        4, 8, ... up to a full forward of 320-token ones; one of 2,048 and one of 8,192 tokens)
        choose each size's GEMM algorithms and attention plans, which a size's first forward
        does otherwise (seconds; for a long-lived engine that takes batches of varying sizes).
        The CPU has nothing to warm and skips it. ``clefrt serve`` warms up by default.
    progress: loading reports its stages on stderr (a line per stage).
    prefix_cache_gib: the prefix cache's budget: a request whose ids start with a cached system
        prompt + state computes only the rest, with the same answer bit for bit (decide()'s
        usage.cached_tokens says how many tokens came from it). 0: off; -1: the default (4 GiB
        of host memory on the CPU, of GPU memory on the GPU; at most half of what the weights
        leave).
    prefix_cache_host_gib: CUDA: a second tier of the prefix cache in this many GiB of pinned
        host memory: prefixes the GPU budget evicts wait there and come back by a copy on their
        next hit (the same answers). 0 (the default): off.
    step_tokens: a longer request (on the GPU: over 4x as long) runs in steps of about this many
        tokens, with the requests of other calls or threads answered between them; the same
        answers. 0: the default (1,024 on the CPU, 2,048 on the GPU).
    step_layers: CUDA: a step runs this many backbone layers at a time, other requests answered
        between them (they wait a few layers, not a whole step); the same answers. 0: the
        default (4).
    vision: load the folder's vision tower; False: text only (its weights stay on disk, ~0.9 GiB
        of GPU memory for Clef's), and a request with images raises RequestError (422).

    Raises LoadError (the file / tensor named) or EngineError (e.g. no GPU for device="cuda").
    """

    def __init__(self, path, mode="auto", *, device="auto", max_length=16384, offload_embeddings=False, confidence="reference",
                 parse_special=False, require_instructions=False, threads=0, check_weights=True, batch_invariant=True,
                 max_batch_tokens=16384, max_batch_requests=64, batch_wait_ms=0, w4a16_fused=False, native_fp4=True,
                 portable_kernels=False, progress=False, prefix_cache_gib=-1, prefix_cache_host_gib=0, step_tokens=0, step_layers=0, vision=True,
                 attention="auto", cuda_graphs=2, warmup=False):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        if confidence not in ("reference", "purity", "jev"):
            raise ValueError(f"confidence must be reference, purity or jev, not {confidence!r}")
        self._confidence = confidence
        self._closed = False
        # values go as given: the engine checks each one's type and range and names the option
        self._engine = _clefrt.Engine(str(path), {
            "mode": mode, "device": device, "max_length": max_length, "offload_embeddings": offload_embeddings,
            "parse_special": parse_special, "require_instructions": require_instructions, "threads": threads,
            "check_weights": check_weights, "batch_invariant": batch_invariant,
            "max_batch_tokens": max_batch_tokens, "max_batch_requests": max_batch_requests, "batch_wait_ms": batch_wait_ms, "w4a16_fused": w4a16_fused,
            "native_fp4": native_fp4, "portable_kernels": portable_kernels, "progress": progress,
            "prefix_cache_gib": prefix_cache_gib, "prefix_cache_host_gib": prefix_cache_host_gib,
            "step_tokens": step_tokens, "step_layers": step_layers,
            "vision": vision, "attention": str(attention), "cuda_graphs": cuda_graphs, "warmup": warmup,
        })

    def encode(self, record):
        """A request (a dict, or its JSON text) -> a Prepared: ``input_ids``, ``questions`` (id,
        type, question_span, option_spans, option_ids in encoded order), ``state_span``,
        ``state_tokens_dropped``, ``input_tokens``. Raises RequestError (status, path, message) for
        a request the protocol refuses."""
        return self._engine.prepare(_body(record), False)

    def probs(self, encoded):
        """A list of Prepared -> a list of ``{question_id: {option_id: probability}}`` dicts, options
        in encoded order (noul: ``{"true": p, "false": 1 - p}``), unrounded floats. The list runs as
        packed forwards; the GIL is released meanwhile."""
        if isinstance(encoded, Prepared):
            raise TypeError("probs() takes a list of encoded requests: probs([model.encode(record)])")
        self._check_open()
        encoded = list(encoded)
        for i, e in enumerate(encoded):
            if not isinstance(e, Prepared):
                raise TypeError(f"probs() takes encoded requests: encoded[{i}] is a {type(e).__name__}; "
                                "pass model.encode(record) (or use decide(record) for a request as it is)")
        out = self._engine.probs(encoded)
        result = []
        for prepared, probs in zip(encoded, out):
            result.append({q["id"]: dict(zip(q["option_ids"], p)) for q, p in zip(prepared.questions, probs)})
        return result

    def decide(self, records, *, precise=False):
        """A request (dict or JSON text) -> its System One response as a dict (as ``POST
        /v1/systemone`` answers it); a list of requests -> a list of responses, run together.
        ``precise``: numbers unrounded."""
        self._check_open()
        if isinstance(records, list):
            prepared = []
            for i, r in enumerate(records):
                try:
                    prepared.append(self.encode(r))
                except RequestError as e:  # say which record of the list it was
                    e.index = i
                    e.args = (f"records[{i}]: {e.args[0]}",) + e.args[1:]
                    raise
            probs, cached = self._engine.probs_and_cached(prepared)
            return [_json.loads(p.answer(q, self._confidence, bool(precise), "clef", c)) for p, q, c in zip(prepared, probs, cached)]
        return _json.loads(self._engine.decide(_body(records), self._confidence, bool(precise)))

    @property
    def device(self):
        """"cpu" or "cuda"."""
        return self._engine.device

    @property
    def format(self):
        """What the Linears run in: "f32" (CPU), "bf16", "fp8", "nvfp4", "nvfp4-w4a16" or "mixed"."""
        return self._engine.format

    @property
    def prefix_cache(self):
        """The prefix cache's counters: enabled, budget_bytes, granularity (tokens), bytes, entries,
        hits, misses, hit_tokens, inserted, evictions, too_large; the host tier's host_budget_bytes,
        host_bytes, host_entries, host_hits, host_hit_tokens, to_host, host_evictions."""
        return self._engine.prefix_cache

    @property
    def gpu_memory_bytes(self):
        """GPU memory held by the engine (0 on the CPU)."""
        return self._engine.gpu_bytes

    def close(self):
        """Finish what is queued and stop the engine thread (also done when the object goes)."""
        self._closed = True
        self._engine.stop()

    def _check_open(self):
        if self._closed:
            raise EngineError("this Clef is closed (close() or the end of its with block); open a new one")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Clef(device={self.device!r}, format={self.format!r})"

#!/usr/bin/env python3
"""The baseline for `clefrt bench`: the reference Python path at the same synthetic shapes and
the same requests, on the same GPU (issue 4).

  bench_reference.py --preset clef-27b --tokenizer TOKENIZER_JSON --request examples/blog.json --out FILE.json

transformers' Qwen3_5ForConditionalGeneration in bf16 with random weights created on the GPU
(default init), its default attention implementation and whatever GDN kernel it finds (the
flash-linear-attention package if installed, else its torch fallback), plus the joint head of
spec/model.md 4 (make_oracle.JointHead) in bf16, one request at a time as the reference code
runs it; the batch points run the backbone on [n, 512] (equal lengths, so no padding) and the
head per request. Latency is wall time with CUDA synchronised, like clefrt bench's.
"""
import argparse, json, math, os, random, sys, time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from encode_ref import encode_request, load_tokenizers  # noqa: E402
from make_oracle import JointHead, qwen35_config  # noqa: E402

PRESETS = {  # must match src/model/synth.cpp
    "small": dict(hidden=256, layers=8, ffn=768, q_heads=8, kv_heads=2, head_dim=64, k_heads=4, v_heads=8, k_dim=32, v_dim=32,
                  mrope=[3, 3, 2], width=128, heads=4, head_ffn=256, routing=2, head_layers=2),
    "clef-flash": dict(hidden=4096, layers=32, ffn=12288, q_heads=16, kv_heads=4, head_dim=256, k_heads=16, v_heads=32, k_dim=128,
                       v_dim=128, mrope=[11, 11, 10], width=1024, heads=16, head_ffn=4096, routing=2, head_layers=4),
    "clef-27b": dict(hidden=5120, layers=64, ffn=17408, q_heads=24, kv_heads=4, head_dim=256, k_heads=16, v_heads=48, k_dim=128,
                     v_dim=128, mrope=[11, 11, 10], width=1024, heads=16, head_ffn=4096, routing=2, head_layers=4),
}


def padded(enc, n, seed):
    extra = n - len(enc["input_ids"])
    if extra <= 0:
        return enc
    rng = random.Random(seed)
    out = json.loads(json.dumps(enc))
    out["input_ids"] = [rng.randint(1000, 100000) for _ in range(extra)] + enc["input_ids"]
    for q in out["questions"]:
        q["question_span"] = [q["question_span"][0] + extra, q["question_span"][1] + extra]
        q["option_spans"] = [[a + extra, b + extra] for a, b in q["option_spans"]]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="clef-27b")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--request", default="examples/blog.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16384)
    a = ap.parse_args()
    from transformers import Qwen3_5ForConditionalGeneration
    import transformers
    cfg = PRESETS[a.preset]
    config = qwen35_config(cfg, 248320)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3_5ForConditionalGeneration(config).eval()
        head = JointHead(cfg["hidden"], cfg["width"], cfg["routing"], cfg["head_layers"], cfg["heads"], cfg["head_ffn"]).eval()
    torch.set_default_dtype(torch.float32)
    print(f"reference: built {a.preset} in {time.time() - t0:.1f} s, attention {model.config._attn_implementation}", flush=True)
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    gdn = "flash-linear-attention" if getattr(mq, "is_fast_path_available", False) else "torch fallback (torch_chunk_gated_delta_rule)"
    print(f"reference: GDN kernel: {gdn}", flush=True)
    lm = model.model.language_model
    E = model.lm_head.weight
    full, plain = load_tokenizers(a.tokenizer)
    blog = encode_request(full, plain, json.load(open(a.request)))

    def run(encs):
        ids = torch.tensor([e["input_ids"] for e in encs], device="cuda")
        H = lm(input_ids=ids).last_hidden_state
        return [head(H[i], E, ids[i], e) for i, e in enumerate(encs)]

    def timed(encs, reps):
        ts = []
        for r in range(reps + 1):
            torch.cuda.synchronize()
            t = time.perf_counter()
            run(encs)
            torch.cuda.synchronize()
            if r:  # the first is a warm-up
                ts.append((time.perf_counter() - t) * 1e3)
        ts.sort()
        q = lambda p: ts[min(len(ts) - 1, int(round(p * (len(ts) - 1))))]
        return q(0.5), q(0.95)

    out = {"impl": f"transformers {transformers.__version__} Qwen3_5ForConditionalGeneration bf16 + spec head (PyTorch {torch.__version__})",
           "attention": model.config._attn_implementation, "gdn": gdn, "gpu": torch.cuda.get_device_name(0), "latency_ms": {},
           "throughput": []}
    with torch.no_grad():
        for name, n, reps in (("blog_346", 0, a.reps), ("tok_1024", 1024, a.reps), ("tok_8192", 8192, 2), ("tok_16384", 16384, 1)):
            if n > a.max_tokens:
                continue
            e = padded(blog, n, 7) if n else blog
            try:
                p50, p95 = timed([e], reps)
            except torch.OutOfMemoryError as err:
                out["latency_ms"][name] = {"error": f"out of memory: {err}"[:200]}
                torch.cuda.empty_cache()
                continue
            out["latency_ms"][name] = {"tokens": len(e["input_ids"]), "p50": p50, "p95": p95}
            print(f"reference: {name}: {len(e['input_ids'])} tokens p50 {p50:.1f} ms p95 {p95:.1f} ms", flush=True)
        for n in (1, 4, 16, 64):
            encs = [padded(blog, 512, 100 + i) for i in range(n)]
            try:
                p50, _ = timed(encs, 2 if n < 64 else 1)
            except torch.OutOfMemoryError as err:
                out["throughput"].append({"in_flight": n, "error": f"out of memory: {err}"[:200]})
                torch.cuda.empty_cache()
                continue
            out["throughput"].append({"in_flight": n, "ms": p50, "tokens_per_s": n * 512 / (p50 * 1e-3), "requests_per_s": n / (p50 * 1e-3)})
            print(f"reference: {n} x 512: {p50:.1f} ms, {n * 512 / (p50 * 1e-3):.0f} tokens/s", flush=True)
    out["gpu_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

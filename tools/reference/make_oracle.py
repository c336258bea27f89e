#!/usr/bin/env python3
"""The CPU engine's oracle (run on the GPU machine: torch + transformers 5.17 with qwen3_5).

  make_oracle.py QWEN3_TOKENIZER_JSON OUT_DIR

For each configuration it writes OUT_DIR/NAME/ (a small random Clef folder: config.json and
model.safetensors saved by transformers' Qwen3_5ForConditionalGeneration, joint_head.safetensors,
joint_head_config.json, a tokenizer cut from the real Qwen3 one) and OUT_DIR/NAME.expected.jsonl
with, per request, the request, its input_ids (spec encoder) and the fp32 probabilities of the
reference forward: transformers' backbone + the joint head written here from spec/model.md 4.
Weights are rounded to bf16 before the forward, so the saved bf16 folder is exactly what was run.

ORACLE_REQUESTS=FILE.expected.jsonl runs the requests of an earlier run again (the committed
fixtures' requests). ORACLE_DTYPE=float64 runs the same forward in fp64 (see float64_casts) to measure how far the fp32
reference itself is from the exact value: where the fp32 reference and the engine disagree, this
says which of the two carries the error.
"""
import contextlib, inspect, json, math, os, random, sys

import torch
import torch.nn as nn
import torch.nn.functional as Fn

sys.path.insert(0, os.path.dirname(__file__))
from encode_ref import encode_request, load_tokenizers  # noqa: E402
import make_corpus  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
DEV = os.environ.get("ORACLE_DEVICE", "cpu")
torch.set_num_threads(os.cpu_count() or 1)

CONFIGS = {
    # Hv > Hk and two full-attention layers (layers 3 and 7)
    "tiny-a": dict(hidden=64, layers=8, ffn=128, q_heads=4, kv_heads=2, head_dim=32, k_heads=2, v_heads=4, k_dim=16, v_dim=16,
                   mrope=[2, 1, 1], width=32, heads=4, head_ffn=64, routing=1, head_layers=1),
    # Hv == Hk, wider head, two routing and two decoder layers
    "tiny-b": dict(hidden=96, layers=4, ffn=160, q_heads=2, kv_heads=1, head_dim=48, k_heads=3, v_heads=3, k_dim=16, v_dim=24,
                   mrope=[2, 2, 2], width=48, heads=4, head_ffn=96, routing=2, head_layers=2),
}


DTYPE = {"float32": torch.float32, "float64": torch.float64}[os.environ.get("ORACLE_DTYPE", "float32")]


@contextlib.contextmanager
def float64_casts():
    """transformers' modules cast to float32 inside (RMSNorm, the gated norm, the GDN rule,
    eager attention's softmax). While active, a float32 cast of a float64 tensor keeps float64,
    so the whole forward runs in fp64. (RoPE angles stay fp32 as spec/model.md 1.2 defines them:
    inv_freq is a float32 buffer, set below, and position ids are cast from int.)"""
    orig_to, orig_float, orig_softmax = torch.Tensor.to, torch.Tensor.float, Fn.softmax

    def to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return orig_to(self, *args, **kwargs)

    def to_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else orig_float(self, *args, **kwargs)

    def softmax(x, *args, **kwargs):
        if x.dtype == torch.float64 and kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return orig_softmax(x, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float, Fn.softmax = to, to_float, softmax
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, Fn.softmax = orig_to, orig_float, orig_softmax


def trim_tokenizer(src, dst, n_merges=3000):
    """The first n merges of the real tokenizer, ids renumbered densely; same normaliser,
    pre-tokenizer and added tokens (renumbered after the vocabulary)."""
    with open(src, encoding="utf-8") as f:
        t = json.load(f)
    vocab = t["model"]["vocab"]
    keep = {tok for tok, i in vocab.items() if i < 256}
    merges = []
    for m in t["model"]["merges"][:n_merges]:
        a, b = (m.split(" ") if isinstance(m, str) else m)
        if a in keep and b in keep and (a + b) in vocab:
            merges.append([a, b])
            keep.add(a + b)
    ordered = sorted(keep, key=lambda tok: vocab[tok])
    t["model"]["vocab"] = {tok: i for i, tok in enumerate(ordered)}
    t["model"]["merges"] = merges
    nxt = len(ordered)
    for a in t["added_tokens"]:
        a["id"] = nxt
        nxt += 1
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False)
    return nxt  # vocab size including added tokens


class Evidence(nn.Module):
    def __init__(self, W, heads, ffn):
        super().__init__()
        self.query_norm, self.memory_norm, self.feedforward_norm = nn.LayerNorm(W), nn.LayerNorm(W), nn.LayerNorm(W)
        self.attention = nn.MultiheadAttention(W, heads, batch_first=True)
        self.feedforward = nn.Sequential(nn.Linear(W, ffn), nn.GELU(), nn.Dropout(0.0), nn.Linear(ffn, W))

    def forward(self, R, M):
        m = self.memory_norm(M)
        R = R + self.attention(self.query_norm(R), m, m, need_weights=False)[0]
        return R + self.feedforward(self.feedforward_norm(R))


class JointHead(nn.Module):
    """spec/model.md section 4, written independently of the C++ engine."""

    def __init__(self, d, W, routing, layers, heads, ffn):
        super().__init__()
        self.W = W
        self.hidden_norm = nn.LayerNorm(d)
        for n in ("memory", "question", "option_question", "global", "option_context", "option_lexical"):
            setattr(self, n + "_projection", nn.Linear(d, W, bias=False))
        self.type_embedding = nn.Embedding(3, W)
        self.evidence_layers = nn.ModuleList([Evidence(W, heads, ffn) for _ in range(routing)])
        self.option_summary_norm = nn.LayerNorm(W)
        self.layers = nn.ModuleList([nn.TransformerDecoderLayer(W, heads, ffn, dropout=0.0, activation="gelu",
                                                                batch_first=True, norm_first=True) for _ in range(layers)])
        self.field_norm, self.option_norm = nn.LayerNorm(W), nn.LayerNorm(W)
        self.residual_scorer = nn.Sequential(nn.Linear(4 * W, W), nn.GELU(), nn.Dropout(0.0), nn.Linear(W, 1))
        self.prior_logit_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.joint_logit_scale = nn.Parameter(torch.tensor(math.log(20.0)))
        self.residual_gate = nn.Parameter(torch.tensor(0.5))

    def forward(self, H, E, ids, enc):
        Hn = self.hidden_norm(H)
        M = self.memory_projection(Hn)
        g = Hn[-1]
        qs, cs, ls, qof, types = [], [], [], [], []
        for i, q in enumerate(enc["questions"]):
            a, b = q["question_span"]
            qs.append(Hn[a:b].mean(0))
            types.append({"noul": 0, "choice": 1, "score": 2}[q["type"]])
            for a, b in q["option_spans"]:
                cs.append(Hn[a:b].mean(0))
                ls.append(E[ids[a:b]].mean(0))
                qof.append(i)
        q = torch.stack(qs)
        c, l = torch.stack(cs), torch.stack(ls)
        qof_t = torch.tensor(qof, device=H.device)
        R = self.option_context_projection(c) + self.option_lexical_projection(l) + self.option_question_projection(q[qof_t])
        for ev in self.evidence_layers:
            R = ev(R[None], M[None])[0]
        B = self.question_projection(q)
        summary = []
        for i in range(len(qs)):
            Ri = R[qof_t == i]
            w = torch.softmax(Ri @ B[i] / math.sqrt(self.W), 0)
            summary.append((w[:, None] * Ri).sum(0))
        F = B + self.option_summary_norm(torch.stack(summary)) + self.global_projection(g) + \
            self.type_embedding(torch.tensor(types, device=H.device))
        for layer in self.layers:
            F = layer(F[None], M[None])[0]
        F = self.field_norm(F)
        O = self.option_norm(R)
        Fi = F[qof_t]
        prior = torch.exp(torch.clamp(self.prior_logit_scale, max=math.log(100))) * \
            (Fn.normalize(l, dim=-1) * Fn.normalize(q[qof_t] + g, dim=-1)).sum(-1)
        cosj = (Fi * O).sum(-1) / torch.clamp(Fi.norm(dim=-1) * O.norm(dim=-1), min=1e-8)
        joint = torch.exp(torch.clamp(self.joint_logit_scale, max=math.log(100))) * cosj + \
            self.residual_scorer(torch.cat([Fi, O, Fi * O, (Fi - O).abs()], -1))[:, 0]
        logits = prior + torch.sigmoid(self.residual_gate) * joint
        return [torch.softmax(logits[qof_t == i].double(), 0).tolist() for i in range(len(qs))]


def perturb(model, gen, head=False):
    """Random, not zero: (1+w) RMSNorm offsets near 0, plain norm / LayerNorm weights near 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.7)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "norm" in name and p.dim() == 1:
                one = head or "linear_attn.norm" in name or "visual" in name
                base = 1.0 if (one and name.endswith("weight")) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif p.dim() == 1:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).float())  # what the bf16 folder holds


def qwen35_config(cfg, vocab):
    """A Qwen3_5Config for one of our shape dicts (CONFIGS here, PRESETS in bench_reference.py),
    with a token vision tower (the text path never reads it)."""
    from transformers import Qwen3_5Config
    text = dict(hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"], intermediate_size=cfg["ffn"], vocab_size=vocab,
                num_attention_heads=cfg["q_heads"], num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
                linear_num_key_heads=cfg["k_heads"], linear_num_value_heads=cfg["v_heads"], linear_key_head_dim=cfg["k_dim"],
                linear_value_head_dim=cfg["v_dim"], linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=cfg["mrope"],
                                     mrope_interleaved=True))
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=cfg["hidden"], patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def set_text_inv_freq(model, cfg, name):
    """spec/model.md 1.2: inv_freq[i] = theta^(-2i/R) in fp32 on the text rotary (the vision
    tower's is left alone). Seen with transformers 5.17: the buffer can come out rounded to bf16
    after a bf16 save/load."""
    R = int(cfg["head_dim"] * 0.25)
    want = 1.0 / (1e7 ** (torch.arange(0, R, 2, dtype=torch.int64).float() / R))
    for mname, mod in model.named_modules():
        if hasattr(mod, "inv_freq") and "visual" not in mname:
            have = mod.inv_freq.detach().float().cpu()
            print(f"{name}: {mname}.inv_freq dtype {mod.inv_freq.dtype}, max rel diff to fp32 formula "
                  f"{((have - want).abs() / want).max().item():.3g}")
            mod.inv_freq = want.to(mod.inv_freq.device)
            if hasattr(mod, "original_inv_freq"):
                mod.original_inv_freq = want.to(mod.inv_freq.device)


def make_head(cfg, gen, d):
    """A random joint head for shape dict `cfg`, rounded to bf16, saved into folder `d`
    (joint_head.safetensors + joint_head_config.json); returned in fp32 on the CPU."""
    from safetensors.torch import save_file
    head = JointHead(cfg["hidden"], cfg["width"], cfg["routing"], cfg["head_layers"], cfg["heads"], cfg["head_ffn"]).eval()
    perturb(head, gen, head=True)
    with torch.no_grad():
        head.prior_logit_scale.fill_(math.log(10.0))
        head.joint_logit_scale.fill_(math.log(20.0))
        head.residual_gate.fill_(0.5)
        for p in (head.prior_logit_scale, head.joint_logit_scale, head.residual_gate):
            p.copy_(p.to(torch.bfloat16).float())
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}, os.path.join(d, "joint_head.safetensors"))
    with open(os.path.join(d, "joint_head_config.json"), "w") as f:
        json.dump({"hidden_size": cfg["hidden"], "width": cfg["width"], "routing_layers": cfg["routing"],
                   "layers": cfg["head_layers"], "heads": cfg["heads"], "feedforward": cfg["head_ffn"]}, f)
    return head


def build(name, cfg, tok_src, out, requests):
    from transformers import Qwen3_5ForConditionalGeneration
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    vocab = trim_tokenizer(tok_src, os.path.join(d, "tokenizer.json"))
    vocab = (vocab + 63) // 64 * 64
    config = qwen35_config(cfg, vocab)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    gen = torch.Generator().manual_seed(sum(name.encode()))
    perturb(model, gen)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    # The reference is the saved folder loaded as a user would, in fp32. (Casting the model in
    # memory would also round its rotary inv_freq buffer to bf16, which the real model never has.)
    # On the CPU with eager attention: with CUDA sdpa in fp32 (TF32 off) even short requests were
    # ~1e-4 away from the CPU engine, eager on the GPU ~1e-5; the CPU keeps the reference
    # independent of which GPU kernels get picked.
    model = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=DTYPE, attn_implementation="eager").eval().to(DEV)
    print(f"{name}: attention implementation {model.config._attn_implementation}")
    # The GDN of spec 1.1 is defined by its recurrence; the chunked form equals it up to rounding,
    # but transformers' torch fallback differences the in-chunk cumulative decay in fp32, which
    # loses ~1e-4 on strongly decaying tokens. Prefill through its recurrent rule instead.
    if os.environ.get("ORACLE_GDN", "recurrent") == "recurrent":
        from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
        if not hasattr(mq, "_clefrt_chunk"):
            mq._clefrt_chunk = mq.torch_chunk_gated_delta_rule
            recurrent = mq.torch_recurrent_gated_delta_rule
            params = set(inspect.signature(recurrent).parameters)

            def prefill_recurrent(*args, **kwargs):  # the layer calls the module-level name
                return recurrent(*args, **{k: v for k, v in kwargs.items() if k in params})

            mq.torch_chunk_gated_delta_rule = prefill_recurrent
        print(f"{name}: GDN prefill through torch_recurrent_gated_delta_rule")
    set_text_inv_freq(model, cfg, name)
    head = make_head(cfg, gen, d).to(DEV).to(DTYPE)
    full, plain = load_tokenizers(os.path.join(d, "tokenizer.json"))
    E = model.lm_head.weight
    lm = model.model.language_model
    n = 0
    casts = float64_casts() if DTYPE == torch.float64 else contextlib.nullcontext()
    # every module's floating outputs must come out in DTYPE (catches a cast float64_casts misses)
    wrong = set()

    def check_dtype(mod, args, output, mname):
        for t in (output if isinstance(output, (tuple, list)) else [output]):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != DTYPE:
                wrong.add(f"{mname}:{t.dtype}")
    for mname, mod in lm.named_modules():
        mod.register_forward_hook(lambda mod, a, o, mname=mname: check_dtype(mod, a, o, mname))
    with open(os.path.join(out, name + ".expected.jsonl"), "w", encoding="utf-8") as f, torch.no_grad(), casts:
        for req in requests:
            enc = encode_request(full, plain, req)
            ids = torch.tensor(enc["input_ids"], device=DEV)
            H = lm(input_ids=ids[None]).last_hidden_state[0]
            assert H.dtype == DTYPE, H.dtype
            probs = head(H, E, ids, enc)
            f.write(json.dumps({"request": req, "input_ids": enc["input_ids"], "probs": probs}, ensure_ascii=False) + "\n")
            n += 1
    print(f"{name}: module outputs not in {DTYPE}: {sorted(wrong) or 'none'}")
    print(f"{name}: {n} requests in {DTYPE}, vocab {vocab}, keys e.g. {list(model.state_dict())[:3]}")


def main():
    tok_src, out = sys.argv[1:3]
    reuse = os.environ.get("ORACLE_REQUESTS")  # an expected.jsonl whose requests to run again
    if reuse:
        with open(reuse, encoding="utf-8") as f:
            reqs = [json.loads(line)["request"] for line in f]
        for name, cfg in CONFIGS.items():
            build(name, cfg, tok_src, out, reqs)
        return
    make_corpus.R.seed(99)
    reqs = []
    for i in range(120):
        r = make_corpus.rand_request(i)
        r.pop("images", None)
        if isinstance(r["state"], str) and len(r["state"]) > 2000:
            r["state"] = r["state"][:2000]
        r["questions"] = dict(list(r["questions"].items())[:6])
        reqs.append(r)
    for name, cfg in CONFIGS.items():
        build(name, cfg, tok_src, out, reqs)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How transformers' Qwen3.5 rotary embedding rounds its angles (run on the GPU machine):
compares its cos/sin at positions 0..8191 with candidate formulas.  rope_probe.py ORACLE_DIR/tiny-a"""
import sys

import torch
from transformers import Qwen3_5ForConditionalGeneration

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
m = Qwen3_5ForConditionalGeneration.from_pretrained(sys.argv[1], dtype=torch.float32).eval().cuda()
rot = m.model.language_model.rotary_emb
L = 8192
pos = torch.arange(L, device="cuda")[None].expand(3, 1, L) if True else None
x = torch.zeros(1, L, 8, device="cuda")
with torch.no_grad():
    for name, p in (("3-row", pos), ("1-row", torch.arange(L, device="cuda")[None])):
        try:
            cos, sin = rot(x, p)
        except Exception as e:  # noqa
            print(name, "failed:", e)
            continue
        cos = cos[0].double().cpu()
        inv = rot.inv_freq.double().cpu()
        R2 = inv.numel()
        print(name, "cos shape", tuple(cos.shape), "inv_freq", rot.inv_freq.dtype, inv.tolist())
        posd = torch.arange(L).double()
        cands = {
            "double": torch.cos(posd[:, None] * inv[None]),
            "fp32 product": torch.cos((posd.float()[:, None] * rot.inv_freq.float().cpu()[None]).double()),
            "gpu matmul": torch.cos((rot.inv_freq.float()[:, None] @ torch.arange(L, device="cuda").float()[None]).T.double().cpu()),
        }
        for k, v in cands.items():
            full = torch.cat([v, v], -1)
            print(f"  {name} vs {k}: max |diff| {float((cos[:, :2 * R2] - full[:, :cos.shape[-1]]).abs().max()):.3g}")
        print("  sample cos[4000]", cos[4000].tolist())
        print("  rotary attrs", {k: v for k, v in vars(rot).items() if not k.startswith("_") and not torch.is_tensor(v)})

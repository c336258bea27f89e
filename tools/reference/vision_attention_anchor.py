#!/usr/bin/env python3
"""PyTorch's SDPA backends at the vision tower's attention shapes (bidirectional, 16 heads of 72,
bf16), beside dev/cuda/vision_attention.cu: the instrument its figures are read against.
Usage: vision_attention_anchor.py OUT.json (on the GPU machine; needs torch with CUDA)."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, HD = 16, 72
SHAPES = {"1x3072 (1024x768)": [3072], "1x16384 (2048x2048)": [16384], "4x1024 (512x512)": [1024] * 4}


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": {}}
for name, frames in SHAPES.items():
    f, n = frames[0], len(frames)  # frames of one size: a batch of n
    q, k, v = (torch.randn(n, HEADS, f, HD, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * f * f * HD * HEADS * n
    row = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v))
            row[backend.name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
            print(f"{name:22s} {backend.name:22s} {ms:9.3f} ms {flops / (ms * 1e-3) / 1e12:7.1f} TFLOP/s", flush=True)
        except Exception as e:  # a backend that does not take the shape
            row[backend.name] = {"error": str(e)[:200]}
            print(f"{name:22s} {backend.name:22s} unavailable: {str(e)[:120]}", flush=True)
    out["results"][name] = row
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=1)

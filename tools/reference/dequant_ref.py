#!/usr/bin/env python3
"""An independent reader of compressed-tensors folders, written from spec/quant.md alone (torch +
safetensors, run on the GPU machine): dequantizes every quantized Linear and writes the values.

  dequant_ref.py FOLDER OUT.safetensors

NVFP4 (weight_packed / weight_scale / weight_global_scale): codes two per byte, even column in the
low nibble, bit 3 the sign, bits 0-2 index [0, .5, 1, 1.5, 2, 3, 4, 6]; s32 = bf16(scale) / gs in
fp32; W = bf16(code * s32), stored as bf16 under the module's `.weight` name.
FP8 (F8_E4M3 weight + F32 weight_scale [1] or [out, 1]): W = float(e4m3) * scale in fp32, stored as
F32. clefrt's loader must give the same values bit for bit (tests/test_quant.cpp reads OUT).
"""
import json, os, sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)


def tensors(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(os.path.join(folder, f), "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def nvfp4(packed, scale, gs):
    rows, half = packed.shape
    p = packed.to(torch.int32)
    codes = torch.stack([p & 15, p >> 4], dim=-1).reshape(rows, half * 2)  # even column = low nibble
    mag = GRID[codes & 7]
    val = torch.where((codes & 8) != 0, -mag, mag)
    s32 = scale.to(torch.bfloat16).to(torch.float32) / gs.to(torch.float32)  # [rows, cols/16]
    s32 = s32.repeat_interleave(16, dim=1)
    return (val * s32).to(torch.bfloat16)


def main():
    folder, out_path = sys.argv[1], sys.argv[2]
    t = tensors(folder)
    out = {}
    for name, v in t.items():
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            out[base + ".weight"] = nvfp4(v, t[base + ".weight_scale"], t[base + ".weight_global_scale"].reshape(()))
        elif name.endswith(".weight") and v.dtype == torch.float8_e4m3fn:
            base = name[: -len(".weight")]
            s = t[base + ".weight_scale"].to(torch.float32)
            out[name] = v.to(torch.float32) * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))
    out = {k: v.contiguous() for k, v in sorted(out.items())}
    save_file(out, out_path)
    print(f"{folder}: {len(out)} quantized Linears dequantized -> {out_path}")


if __name__ == "__main__":
    main()

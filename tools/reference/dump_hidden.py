#!/usr/bin/env python3
"""Final-norm hidden states of one oracle request from the reference (CPU, fp32, eager, GDN
through the recurrent rule), as raw little-endian float32 [L, hidden], for bisecting a gap.

  dump_hidden.py ORACLE_DIR/NAME EXPECTED_JSONL INDEX OUT_FILE
"""
import json, os, sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from transformers import Qwen3_5ForConditionalGeneration  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq  # noqa: E402
import inspect  # noqa: E402

folder, expected, index, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rec = [json.loads(l) for l in open(expected, encoding="utf-8")][index]
recurrent = mq.torch_recurrent_gated_delta_rule
params = set(inspect.signature(recurrent).parameters)
mq.torch_chunk_gated_delta_rule = lambda *a, **k: recurrent(*a, **{x: y for x, y in k.items() if x in params})
torch.set_num_threads(os.cpu_count() or 1)
m = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
ids = torch.tensor(rec["input_ids"])[None]
with torch.no_grad():
    out_h = m.model.language_model(input_ids=ids, output_hidden_states=True)
H = out_h.last_hidden_state[0].float().contiguous()
H.numpy().tofile(out)
# the residual stream after each layer too (before the final norm), for a first bisection
for i, h in enumerate(out_h.hidden_states):
    h[0].float().contiguous().numpy().tofile(out + f".layer{i}")
print("dumped", tuple(H.shape), "and", len(out_h.hidden_states), "per-layer states")

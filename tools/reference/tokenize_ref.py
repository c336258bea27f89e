#!/usr/bin/env python3
"""Expected token ids from Hugging Face `tokenizers` (the reference), for the parity test.

  tokenize_ref.py TOKENIZER_JSON INPUTS_JSON OUT_JSON

`parse`: Tokenizer.encode(s, add_special_tokens=False) (added tokens matched, as the reference).
`plain`: the same tokenizer with its added tokens removed (no text ever becomes an added token),
which is what clefrt's default plain-text mode must equal.
"""
import json, sys

import tokenizers
from tokenizers import Tokenizer

tok_path, inputs, out = sys.argv[1:4]
full = Tokenizer.from_file(tok_path)
with open(tok_path, encoding="utf-8") as f:
    spec = json.load(f)
spec["added_tokens"] = []
plain = Tokenizer.from_str(json.dumps(spec))
with open(inputs, encoding="utf-8") as f:
    strings = json.load(f)["strings"]
res = {
    "tokenizers_version": tokenizers.__version__,
    "parse": [full.encode(s, add_special_tokens=False).ids for s in strings],
    "plain": [plain.encode(s, add_special_tokens=False).ids for s in strings],
}
with open(out, "w", encoding="utf-8") as f:
    json.dump(res, f, separators=(",", ":"))
print(f"tokenize_ref: {len(strings)} strings, tokenizers {tokenizers.__version__}")

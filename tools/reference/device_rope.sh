#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 tools/reference/rope_probe.py tests/fixtures/oracle/tiny-a 2>&1 | grep -v -e Warning -e falling
python3 - <<'PY'
import transformers, inspect
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
src = inspect.getsource(mq)
i = src.find("class Qwen3_5TextRotaryEmbedding")
print(src[i:i+3500])
j = src.find("def apply_rotary_pos_emb")
print(src[j:j+1500])
PY

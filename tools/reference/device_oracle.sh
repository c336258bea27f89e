#!/usr/bin/env bash
# Run on the GPU machine: builds the CPU engine's oracle folders + expected probabilities in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
python3 tools/reference/make_oracle.py .deps/qwen3/tokenizer.json "$OUT/oracle" 2>&1 | grep -v -e Warning -e "Writing model" -e falling
cd "$OUT" && tar czf oracle.tgz oracle && ls -la oracle oracle/* | head -40

#!/usr/bin/env bash
# The main job on a fresh machine: install, build, synthesize a tiny random-weight Clef model
# (the real weights cannot be fetched here), then encode and answer the example request of
# spec/protocol.md. Random weights give meaningless answers; see the README for real weights.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
model=build/models/tiny
if [ ! -f "$model/joint_head.safetensors" ]; then
  echo "+ clefrt synth --out $model --config tiny --tokenizer .deps/qwen3/tokenizer.json" >&2
  build/clefrt synth --out "$model" --config tiny --tokenizer .deps/qwen3/tokenizer.json
fi
echo "+ clefrt encode --model $model examples/blog.json" >&2
build/clefrt encode --model "$model" examples/blog.json
echo "+ clefrt decide --model $model examples/blog.json" >&2
build/clefrt decide --model "$model" examples/blog.json

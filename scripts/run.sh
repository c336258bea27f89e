#!/usr/bin/env bash
# The main job on a fresh machine: install, build, and encode the example request of
# spec/protocol.md with the real Qwen3 tokenizer (no model weights are needed to encode).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
echo "clefrt encode --tokenizer .deps/qwen3/tokenizer.json examples/blog.json" >&2
build/clefrt encode --tokenizer .deps/qwen3/tokenizer.json examples/blog.json

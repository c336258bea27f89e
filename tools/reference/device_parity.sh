#!/usr/bin/env bash
# Run on the GPU machine (it has Hugging Face tokenizers + transformers): makes the expected
# outputs of the tokenizer and encoding parity tests into $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
tok=.deps/qwen3/tokenizer.json
python3 tools/reference/tokenize_ref.py "$tok" tests/fixtures/tokenizer_inputs.json "$OUT/tokenizer_expected.json"
python3 tools/reference/encode_ref.py "$tok" tests/fixtures/encode_inputs.jsonl "$OUT/encode_expected.jsonl"
python3 -c "import tokenizers, transformers, sys; print('python', sys.version.split()[0], 'tokenizers', tokenizers.__version__, 'transformers', transformers.__version__)"

#!/usr/bin/env bash
# Run on the GPU machine: builds the CPU engine's oracle folders + expected probabilities in $OUT:
# the fp32 reference forward, then the same forward in fp64 on the same requests (merged into
# each line as "probs_f64" by merge_f64.py). Copy $OUT/oracle/* over tests/fixtures/oracle/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
quiet() { grep -v -e Warning -e "Writing model" -e falling; }
python3 tools/reference/make_oracle.py .deps/qwen3/tokenizer.json "$OUT/oracle" 2>&1 | quiet
ORACLE_DTYPE=float64 ORACLE_REQUESTS="$OUT/oracle/tiny-a.expected.jsonl" \
  python3 tools/reference/make_oracle.py .deps/qwen3/tokenizer.json "$OUT/oracle64" 2>&1 | quiet
python3 tools/reference/merge_f64.py "$OUT/oracle" "$OUT/oracle64" tiny-a tiny-b
rm -rf "$OUT/oracle64"
cd "$OUT" && tar czf oracle.tgz oracle && ls -la oracle oracle/* | head -40

#!/usr/bin/env bash
# Quality of each quantized format against bf16 on the CPU engine (issue 6), on a well-conditioned
# random model: `small` with --linear-gain 0.5 (bf16 rounding moves its answers by ~1e-3; at unit
# gain these random models amplify any change by orders of magnitude). The CPU engine runs each
# quantized folder exactly as spec/quant.md defines it (the GPU paths are tested against it).
# Requests: tests/fixtures/encode_inputs.jsonl, the oracle corpus, and a second corpus of the
# same generator (tools/reference/make_corpus.py, CORPUS_SEED=7): 760; those over the context or
# with images are refused by every mode. About 30 minutes on 2 cores.
# Usage: bench/run_quality_cpu.sh [WORKDIR]; prints bench/quality_report.py's table.
set -euo pipefail
cd "$(dirname "$0")/.."
w=${1:-/tmp/clefrt-quality}
mkdir -p "$w"
CORPUS_SEED=7 python3 tools/reference/make_corpus.py "$w/corpus7" > /dev/null
python3 -c "
import json
with open('$w/requests.jsonl', 'w') as out:
    for f in ('tests/fixtures/encode_inputs.jsonl', 'tests/fixtures/oracle/tiny-a.expected.jsonl', '$w/corpus7/encode_inputs.jsonl'):
        for line in open(f, encoding='utf-8'):
            out.write(json.dumps(json.loads(line)['request'], ensure_ascii=False) + '\n')
"
# calibration: the last 64 requests without images and of moderate size (the set the recorded
# results used; `clefrt quantize` itself skips records over the context)
python3 -c "
import json
rs = [l for l in open('$w/requests.jsonl', encoding='utf-8') if 'images' not in json.loads(l) and len(l) < 20000]
open('$w/calib.jsonl', 'w', encoding='utf-8').writelines(rs[-64:])
"
build/clefrt synth --out "$w/small" --config small --tokenizer .deps/qwen3/tokenizer.json --linear-gain 0.5 2> /dev/null
bench/quality_formats.sh "$w/small" "$w/requests.jsonl" "$w/calib.jsonl" "$w/small"

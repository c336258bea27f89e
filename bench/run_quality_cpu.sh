#!/usr/bin/env bash
# Quality of each quantized format against bf16 on the CPU engine (issue 6), on a well-conditioned
# random model: `small` with --linear-gain 0.5 (bf16 rounding moves its answers by ~1e-3; at unit
# gain these random models amplify any change by orders of magnitude). The CPU engine runs each
# quantized folder exactly as spec/quant.md defines it (the GPU paths are tested against it).
# Requests: tests/fixtures/encode_inputs.jsonl, the oracle corpus, and a second corpus of the
# same generator (tools/reference/make_corpus.py, CORPUS_SEED=7): 760; those over the context or
# with images are refused by every mode. About 30 minutes on 2 cores.
# Usage: bench/run_quality_cpu.sh [WORKDIR]; then bench/quality_report.py (printed).
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
# calibration: the last 64 requests without images and of moderate size (one that cannot be
# encoded stops `clefrt quantize`, which names its line)
python3 -c "
import json
rs = [l for l in open('$w/requests.jsonl', encoding='utf-8') if 'images' not in json.loads(l) and len(l) < 20000]
open('$w/calib.jsonl', 'w', encoding='utf-8').writelines(rs[-64:])
"
build/clefrt synth --out "$w/small" --config small --tokenizer .deps/qwen3/tokenizer.json --linear-gain 0.5 2> /dev/null
build/clefrt quantize --model "$w/small" --out "$w/small-fp8" --scheme fp8 2> /dev/null
build/clefrt quantize --model "$w/small" --out "$w/small-w4a16" --scheme nvfp4-w4a16 2> /dev/null
build/clefrt quantize --model "$w/small" --out "$w/small-nvfp4" --scheme nvfp4 --calib "$w/calib.jsonl" --calib-records 64 2> /dev/null
# exit status 1: some requests were refused (images, over the context), as in every mode
build/clefrt decide --model "$w/small" --device cpu --precise "$w/requests.jsonl" > "$w/q-bf16.jsonl" 2> /dev/null || [ $? -eq 1 ]
for m in fp8 w4a16 nvfp4; do
  build/clefrt decide --model "$w/small-$m" --device cpu --precise "$w/requests.jsonl" > "$w/q-$m.jsonl" 2> /dev/null || [ $? -eq 1 ]
done
python3 bench/quality_report.py "$w/q-bf16.jsonl" fp8="$w/q-fp8.jsonl" nvfp4-w4a16="$w/q-w4a16.jsonl" "nvfp4 (W4A4)=$w/q-nvfp4.jsonl"

#!/usr/bin/env bash
# Quality of each quantized format against bf16 on the reference fixtures (issue 6): the two
# oracle folders (tests/fixtures/oracle/tiny-{a,b}, saved by transformers) quantized by
# `clefrt quantize`, their 120 fixture requests each run by the CPU engine (spec/quant.md
# numerics; the GPU paths are tested against it) and compared with the CPU engine on the bf16
# folder (itself within ~2e-4 of transformers' fp32 answers). W4A4 is calibrated on 64 other
# requests (tests/fixtures/encode_inputs.jsonl without images, of moderate size). These random
# folders amplify any change about 200x per layer (issue 4's note): the figures show how far each
# format moves a chaotic model, not the loss on real Clef weights.
# Usage: bench/run_quality_fixtures.sh [WORKDIR] (a minute on 2 cores); prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
w=${1:-/tmp/clefrt-quality-fixtures}
mkdir -p "$w"
python3 -c "
import json
rs = [l for l in open('tests/fixtures/encode_inputs.jsonl', encoding='utf-8')]
rs = [json.dumps(json.loads(l)['request'], ensure_ascii=False) + '\n' for l in rs]
rs = [l for l in rs if 'images' not in json.loads(l) and len(l) < 6000]
open('$w/calib.jsonl', 'w', encoding='utf-8').writelines(rs[:64])
"
for f in tiny-a tiny-b; do
  src=tests/fixtures/oracle/$f
  python3 -c "
import json
with open('$w/$f.requests.jsonl', 'w', encoding='utf-8') as out:
    for line in open('$src.expected.jsonl', encoding='utf-8'):
        out.write(json.dumps(json.loads(line)['request'], ensure_ascii=False) + '\n')
"
  echo "$f:"
  bench/quality_formats.sh "$src" "$w/$f.requests.jsonl" "$w/calib.jsonl" "$w/$f"
done

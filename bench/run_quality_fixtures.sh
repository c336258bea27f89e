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
  rm -rf "$w/$f-fp8" "$w/$f-w4a16" "$w/$f-nvfp4"
  build/clefrt quantize --model "$src" --out "$w/$f-fp8" --scheme fp8 2> /dev/null
  build/clefrt quantize --model "$src" --out "$w/$f-w4a16" --scheme nvfp4-w4a16 2> /dev/null
  build/clefrt quantize --model "$src" --out "$w/$f-nvfp4" --scheme nvfp4 --calib "$w/calib.jsonl" --calib-records 64 2> /dev/null
  # exit status 1: some requests were refused (as in every mode)
  build/clefrt decide --model "$src" --device cpu --precise "$w/$f.requests.jsonl" > "$w/$f-q-bf16.jsonl" 2> /dev/null || [ $? -eq 1 ]
  for m in fp8 w4a16 nvfp4; do
    build/clefrt decide --model "$w/$f-$m" --device cpu --precise "$w/$f.requests.jsonl" > "$w/$f-q-$m.jsonl" 2> /dev/null || [ $? -eq 1 ]
  done
  echo "$f:"
  python3 bench/quality_report.py "$w/$f-q-bf16.jsonl" fp8="$w/$f-q-fp8.jsonl" nvfp4-w4a16="$w/$f-q-w4a16.jsonl" "nvfp4 (W4A4)=$w/$f-q-nvfp4.jsonl"
done

#!/usr/bin/env bash
# One model's formats against its bf16 answers, on the CPU engine (spec/quant.md numerics): the
# bf16 folder MODEL quantized by `clefrt quantize` into PREFIX-{fp8,w4a16,nvfp4} (W4A4 calibrated
# on CALIB), REQUESTS decided by all four (PREFIX-q-{bf16,fp8,w4a16,nvfp4}.jsonl), then
# bench/quality_report.py's table. Shared by run_quality_cpu.sh and run_quality_fixtures.sh.
# Usage: bench/quality_formats.sh MODEL REQUESTS CALIB PREFIX (from the repository root)
set -euo pipefail
model=$1 requests=$2 calib=$3 p=$4
rm -rf "$p-fp8" "$p-w4a16" "$p-nvfp4"
build/clefrt quantize --model "$model" --out "$p-fp8" --scheme fp8 2> /dev/null
build/clefrt quantize --model "$model" --out "$p-w4a16" --scheme nvfp4-w4a16 2> /dev/null
build/clefrt quantize --model "$model" --out "$p-nvfp4" --scheme nvfp4 --calib "$calib" --calib-records 64 2> /dev/null
# exit status 1: some requests were refused (images, over the context), as in every mode
build/clefrt decide --model "$model" --device cpu --precise "$requests" > "$p-q-bf16.jsonl" 2> /dev/null || [ $? -eq 1 ]
for m in fp8 w4a16 nvfp4; do
  build/clefrt decide --model "$p-$m" --device cpu --precise "$requests" > "$p-q-$m.jsonl" 2> /dev/null || [ $? -eq 1 ]
done
python3 bench/quality_report.py "$p-q-bf16.jsonl" fp8="$p-q-fp8.jsonl" nvfp4-w4a16="$p-q-w4a16.jsonl" "nvfp4 (W4A4)=$p-q-nvfp4.jsonl"

#!/usr/bin/env bash
# Quality of each --quant mode against bf16 on the GPU (issue 6): the `small` synthetic model,
# the requests in .carry/q/requests.jsonl (tests/fixtures/encode_inputs.jsonl + the oracle
# requests), probabilities to $OUT/q-MODE.jsonl; bench/quality_report.py compares them.
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib CLEFRT_SOURCE_DIR=$PWD
tok=.deps/qwen3/tokenizer.json
.carry/clefrt synth --out /tmp/small --config small --tokenizer $tok > /dev/null
tail -64 .carry/q/requests.jsonl > /tmp/calib.jsonl
.carry/clefrt quantize --model /tmp/small --out /tmp/small-nvfp4 --scheme nvfp4 --calib /tmp/calib.jsonl --calib-records 64 2> /dev/null
for m in bf16 fp8 nvfp4-w4a16; do
  .carry/clefrt decide --model /tmp/small --device cuda --quant $m --precise --jsonl - < .carry/q/requests.jsonl > "$OUT/q-$m.jsonl" 2> "$OUT/q-$m.err"
  echo "quality $m: $(wc -l < "$OUT/q-$m.jsonl") lines, $(wc -l < "$OUT/q-$m.err") refused"
done
.carry/clefrt decide --model /tmp/small-nvfp4 --device cuda --precise --jsonl - < .carry/q/requests.jsonl > "$OUT/q-nvfp4.jsonl" 2> "$OUT/q-nvfp4.err"
echo "quality nvfp4 (W4A4 folder): $(wc -l < "$OUT/q-nvfp4.jsonl") lines"

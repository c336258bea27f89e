#!/usr/bin/env bash
# Run on the GPU machine (issue 19): the image processor probe (image_probe.py: the corpus and what
# transformers 5.17 does with each file) and the image oracle (make_vision_oracle.py: tiny-v).
# Everything lands in $OUT/images.tgz; copy corpus/ + expected.jsonl to tests/fixtures/images/
# and tiny-v* to tests/fixtures/oracle/.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
w=/tmp/images && rm -rf $w && mkdir -p $w
python3 tools/reference/image_probe.py $w/probe 2>&1 | grep -v -i warn | tee $w/probe.log | cut -c1-600
python3 tools/reference/make_vision_oracle.py .deps/qwen3/tokenizer.json $w/oracle 2>&1 | grep -v -i warn | tee $w/oracle.log | cut -c1-400
cd $w && tar czf "$OUT/images-corpus.tgz" probe/corpus && tar czf "$OUT/images-probe.tgz" --exclude=probe/corpus probe probe.log \
  && tar czf "$OUT/images-oracle.tgz" oracle oracle.log && ls -la "$OUT"

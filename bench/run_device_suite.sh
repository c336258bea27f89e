#!/usr/bin/env bash
# The GPU machine's part of a session, as run through the device tool from a .carry/ pack
# (scripts/pack_device.sh): GPU tests, then `clefrt bench` per quant mode and the memory
# points, results under $OUT. Usage: bench/run_device_suite.sh COMMIT [tests] [bench MODES...] [memory]
set -uo pipefail
commit=$1; shift
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib CLEFRT_SOURCE_DIR=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tok=.deps/qwen3/tokenizer.json
while [ $# -gt 0 ]; do
  case $1 in
    tests)
      .carry/clefrt_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[ cuda|OK \]|FAILED|PASSED|Failure|error" ;;
    bench)
      shift
      while [ $# -gt 0 ] && [ "$1" != memory ] && [ "$1" != tests ]; do
        m=$1
        .carry/clefrt bench --synthetic clef-27b --quant "$m" --tokenizer $tok --reps 5 --profile --commit "$commit" \
          --command "clefrt bench --synthetic clef-27b --quant $m --reps 5 --profile" --json "$OUT/bench-$m.json" \
          > "$OUT/bench-$m.txt" 2> "$OUT/bench-$m.err"
        echo "== bench $m rc=$?"; grep -v "^{" "$OUT/bench-$m.txt" | head -60; tail -3 "$OUT/bench-$m.err"
        shift
      done
      continue ;;
    memory)
      for m in bf16 fp8 nvfp4-w4a16 nvfp4; do
        for off in "" --offload-embeddings; do
          tag=$m${off:+-offload}
          .carry/clefrt bench --synthetic clef-27b --quant $m $off --memory-only --max-tokens 4096 --tokenizer $tok --commit "$commit" \
            --json "$OUT/mem-$tag.json" > /dev/null 2> "$OUT/mem-$tag.err"
          echo "== memory $tag rc=$? $(grep -o '"gpu_mem_gib":[0-9.]*\|"gpu_mem_engine_gib":[0-9.]*\|"gpu_mem_before_load_gib":[0-9.]*' "$OUT/mem-$tag.json" | tr '\n' ' ')"
        done
      done ;;
  esac
  shift
done

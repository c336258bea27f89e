#!/usr/bin/env bash
# The GPU machine's part of a session, as run through the device tool from a .carry/ pack
# (scripts/pack_device.sh): GPU tests, then `clefrt bench` per quant mode and the memory
# points, results under $OUT. Usage:
#   bench/run_device_suite.sh COMMIT [tests | tests=GTEST_FILTER] [env:NAME=VALUE | unset:NAME] [serve-flags:FLAGS] [bench MODES...] [quick MODES...] [reuse] [interleave] [memory] [nan] [serve MODES...] [tower ATTNS...] [lab] [lab-elementwise] [lab-head] [lab-narrow] [lab-w4a16-rs] [ncu-w4a16-rs] [ncu-w4a16-rs-source] [ncu-elementwise] [ncu-head] [ncu-blog] [ncu-blog-fp8] [lab-vision-attn] [lab-cudnn] [lab-gemm-search] [lab-fp8-wgmma] [lab-fp8-sustained] [lab-fp8-scales] [lab-gdn-prep] [lab-gdn-form] [ncu-fp8-gemm] [ncu-gdn] [ncu-gdn-source] [ncu-gdn-tform] [gdn-products] [gdn-scan-planes] [anchors] [clocks] [use-base | use-branch] [deadline=S] [tar]
# tests: the whole GPU suite; its CPU references dominate and it took 220 to 576 s on H100s
# (session 41: 576 s, a call's whole budget): plan it a call of its own or narrow it with tests=.
# serve: per mode also a 5 s one-client phase on one kept connection (serve-load-keepalive-*.json).
# tower: the bench's image points alone (bf16) per attention kernel (auto, cudnn, clefrt).
# quick: the bench per mode planned for 16,384 tokens without the tower (no 32k nor image
# points: about half the time). tar: everything under $OUT into one out.tgz (the device tool
# brings back a limited number of files).
# use-base / use-branch: the verbs between them run a baseline clefrt packed as .carry/clefrt-base
# (BASELINE=path/to/clefrt scripts/pack_device.sh), files under $OUT/base: main and a branch
# measured side by side in one call, e.g. `quick bf16 use-base quick bf16 use-branch anchors tar`.
# reuse: the prefix cache's cold / warm points (27B bf16, 1,024 / 8,000 / 32,768-token states);
# reuse-host: the same with a one-state GPU budget and a host tier, and the host tier's point.
# interleave: blog latency while a 65,436-token request runs, per step size (27B bf16).
# long: 27B NVFP4 + offload memory at 32k / 64k tokens; long-bf16: the bf16 bench with its 32k / 64k points.
# eval: clefrt eval --synthetic clef-27b over the four benchmarks (carry .evaldata/).
# lab-gdn-form: clefrt_bench_gdn's W / U and T forms from bf16 rows at every shape (CLEFRT_LAB_FORMS_ONLY).
# ncu-gdn: Nsight Compute (--clock-control none) on the Wgmma path's GDN kernels and the 3xTF32 prep.
# lab-fp8-sustained: the FP8 GEMM of our own and cuBLASLt's at the power cap (1 s each, alternated).
# ncu-fp8-gemm: Nsight Compute on one launch of the FP8 GEMM of our own's warp-specialized forms at
# gate|up, m 8,192 (details, source page CSV: bench/ncu_sass_summary.py), and their SASS.
# ncu-gdn-source: the Wgmma prep (bf16x3 and one pass), the one-pass scan and the state-in-registers scan, stall samples per SASS instruction (CSV).
# ncu-gdn-tform: the T form's prep and register-state scan at 1 x 8,192 (the lab's), stall samples per SASS line (CSV) and details.
# ncu-head: Nsight Compute's throughput, occupancy, stall and memory sections on the head lab's row-Linear launches.
# ncu-elementwise: Nsight Compute's occupancy, issue and stall sections on the elementwise lab's FP8 SwiGLU (exact, fast SiLU, the lab's streamed form) and FP8 norm with the pending add at 318 rows.
# lab-w4a16-rs: clefrt_bench_w4a16_rs (the W4A16 GEMM with the weights in wgmma's register operand, three kernel forms, beside bf16 and the product's).
# ncu-w4a16-rs: Nsight Compute (speed of light, memory, warp states) on each register-A form's one launch at gate|up, m 318;
# ncu-w4a16-rs-source: stall samples per SASS instruction of the product's short-input kernel at gate|up's and down's tiles, m 318.
# lab-narrow: clefrt_bench_narrow_gemm (the FP8 GDN in_proj's bf16 a | b GEMM: the lab's split-k forms beside the engine's cuBLASLt). ncu-blog / ncu-blog-fp8: every kernel's GPU time over one forward of the blog request, the tuned one (bench --profiler-range; bench/ncu_forward_summary.py). lab-head: the head's Linears (clefrt_bench_head_gemm).
# lab: the dev/cuda kernel benches (clefrt_bench_gdn and, when packed, clefrt_bench_elementwise; the GEMM ones with lab-gemm; bf16 candidates and
# fixed row blocks with lab-bf16; cuDNN's attention at the tower's shapes with lab-cudnn; the tower's attention variants with
# lab-vision-attn; every cuBLASLt configuration at the blog's and the tower's GEMMs with lab-gemm-search;
# our FP8 wgmma GEMM beside cuBLASLt's with lab-fp8-wgmma).
# ops: --version, the architectures in the binary (cuobjdump), the ready line and /health of a
# served synthetic model, with the fast and the portable kernels.
# nan: a tiny folder with NaN weights through the CUDA engine (refused at load; with
# --no-check-weights a 500 naming the layer). serve: `clefrt serve --synthetic clef-27b` under
# clefrt_load (1, 8, 64 clients) per mode, then SIGTERM timed; the server's request log
# split per phase into queue / compute / total (bench/serve_log_summary.py). anchors: ../shared/anchors'
# kernel_anchors.py from a carried .anchors/ (fla tarball + script), per-layer fla GDN and SDPA.
# gdn-products: the Wgmma GDN path's two precisions (one bf16 pass, the default, and bf16x3): the
# GDN GPU tests, the GDN lab, and the bf16 bench with CLEFRT_GDN_PRODUCTS=bf16x3 (files *-gdnx3*);
# pass `quick bf16` too for the default's time.
# env:NAME=VALUE / unset:NAME: a lab switch set for the verbs after it (an A/B of one binary), named
# in the bench records' command; a mode benched again writes bench-MODE-runN.*.
# clocks: from here on, nvidia-smi samples the SM / memory clocks, power and throttle reasons every
# 100 ms into clocks.csv, and verbs.log stamps each verb's start (is a kernel slower in the model
# than in a lab or an anchor because the card clocks down under the GEMMs' power?); stopped before tar,
# which prints bench/clocks_summary.py's table (clocks-summary.txt).
# deadline=S: once S seconds have passed since the suite began, the verbs left are skipped, all but
# tar (a machine's call has a limit; the files of the verbs that ran still come back in one archive).
set -uo pipefail
commit=$1; shift
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib CLEFRT_SOURCE_DIR=$PWD
# cuDNN 9 (the backbone's attention with --attention auto / cudnn, and lab-cudnn): the GPU
# machine's is PyTorch's nvidia-cudnn-cu13
cudnn_lib=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')" 2>/dev/null)
[ -n "$cudnn_lib" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cudnn_lib
# the records name the commit the packed clefrt was built at (its --version), whatever COMMIT says:
# a COMMIT taken from the device's copy of the tree, or a binary swapped in for a baseline, once
# labelled every record with another commit
built_at() { [ -x .carry/clefrt ] && .carry/clefrt --version 2>/dev/null | sed -n 's/.*(commit \([0-9a-z+]*\).*/\1/p' | head -1; }
built=$(built_at)
if [ -n "$built" ] && [ "$built" != "$commit" ]; then
  echo "run_device_suite: COMMIT is $commit but .carry/clefrt was built at $built; the records say $built" >&2
  commit=$built
fi
branch_commit=$commit
OUT=${OUT:-/tmp/out}
OUT0=$OUT
mkdir -p "$OUT"
tok=.deps/qwen3/tokenizer.json
deadline=0
lab_env=""
serve_flags=""
# "" the first time $OUT/PREFIX.EXT would be written, then -run2, -run3, ...: a verb run again
# (an A/B of one binary) keeps its earlier files
run_tag() { local k=2 t=""; while [ -e "$OUT/$1$t.$2" ]; do t=-run$k; k=$((k + 1)); done; echo "$t"; }
while [ $# -gt 0 ]; do
  if [ "$deadline" -gt 0 ] && [ "$SECONDS" -ge "$deadline" ] && [ "$1" != tar ]; then
    echo "== deadline (${deadline} s) passed at ${SECONDS} s: skipping $1"
    shift
    continue
  fi
  [ -n "${clocks_pid:-}" ] && echo "$(date +%s.%N) $1" >> "$OUT0/verbs.log"
  case $1 in
    clocks)
      [ -n "${clocks_pid:-}" ] && { echo "== clocks: already sampling"; shift; continue; }
      reasons=clocks_event_reasons.active  # the older drivers' name: clocks_throttle_reasons.active
      nvidia-smi --help-query-gpu 2>/dev/null | grep -q "$reasons" || reasons=clocks_throttle_reasons.active
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons --format=csv,nounits -lms 100 \
        > "$OUT0/clocks.csv" 2> "$OUT0/clocks.err" &
      clocks_pid=$!; echo "$(date +%s.%N) clocks" >> "$OUT0/verbs.log"; echo "== clocks: sampling (pid $clocks_pid)"
      trap '[ -n "${clocks_pid:-}" ] && kill "$clocks_pid" 2>/dev/null' EXIT ;;  # a run without tar stops it too
    env:*=*)
      # a lab switch for the verbs after it (A/B runs of one binary: env:CLEFRT_LAB_SWIGLU_CLUSTER=8
      # quick fp8 unset:CLEFRT_LAB_SWIGLU_CLUSTER quick fp8); the bench records name it
      v=${1#env:}; export "${v?}"; lab_env="${lab_env:+$lab_env }$v"; echo "== env $v" ;;
    serve-flags:*)  # flags for the serve verbs after it (serve-flags:--no-warmup; serve-flags: alone clears them)
      serve_flags=${1#serve-flags:}; serve_flags=${serve_flags//,/ }; echo "== serve flags: ${serve_flags:-none}" ;;
    unset:*)
      v=${1#unset:}; unset "$v"; lab_env=$(tr ' ' '\n' <<< "$lab_env" | grep -v "^$v=" | tr '\n' ' ' | sed 's/ *$//'); echo "== unset $v" ;;
    deadline=*)
      deadline=${1#deadline=}
      [[ $deadline =~ ^[0-9]+$ ]] || { echo "deadline=S: S in whole seconds, not '$deadline'" >&2; exit 2; } ;;
    tests)
      .carry/clefrt_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[ cuda|OK \]|FAILED|PASSED|Failure|error" ;;
    tests=*)  # a gtest filter: tests=*Gdn*:*Fp8*; each such verb its own log (gpu_tests-filtered, -run2, ...)
      f=gpu_tests-filtered$(run_tag gpu_tests-filtered log)
      echo "== tests ${1#tests=}${lab_env:+ ($lab_env)} -> $f.log"
      .carry/clefrt_gpu_tests --gtest_filter="${1#tests=}" 2>&1 | tee "$OUT/$f.log" | grep -E "^\[ cuda|OK \]|FAILED|PASSED|Failure|error" ;;
    bench|quick)
      # the quant modes up to the next verb (auto, bf16, fp8, nvfp4, nvfp4-w4a16); quick: planned
      # for 16,384 tokens without the tower
      extra=""; [ "$1" = quick ] && extra="--max-tokens 16384 --no-vision"
      shift
      while [ $# -gt 0 ] && [[ $1 =~ ^(auto|bf16|fp8|nvfp4|nvfp4-w4a16)$ ]]; do
        m=$1 f=bench-$1$(run_tag "bench-$1" json)
        .carry/clefrt bench --synthetic clef-27b --quant "$m" $extra --tokenizer $tok --reps 5 --profile --commit "$commit" \
          --command "${lab_env:+$lab_env }clefrt bench --synthetic clef-27b --quant $m${extra:+ $extra} --reps 5 --profile" --json "$OUT/$f.json" \
          > "$OUT/$f.txt" 2> "$OUT/$f.err"
        echo "== bench $m${extra:+ $extra}${lab_env:+ ($lab_env)} rc=$? -> $f"; grep -v "^{" "$OUT/$f.txt" | head -60; tail -3 "$OUT/$f.err"
        shift
      done
      continue ;;
    tower)
      # the image points alone per attention kernel (clefrt bench --images-only --attention X), bf16:
      # the tower's GPU time on each, in one engine load a kernel
      shift
      while [ $# -gt 0 ] && [[ $1 =~ ^(auto|cudnn|clefrt)$ ]]; do
        .carry/clefrt bench --synthetic clef-27b --quant bf16 --images-only --attention "$1" --tokenizer $tok --reps 5 --commit "$commit" \
          --command "clefrt bench --synthetic clef-27b --quant bf16 --images-only --attention $1 --reps 5" --json "$OUT/tower-$1.json" \
          > "$OUT/tower-$1.txt" 2> "$OUT/tower-$1.err"
        echo "== tower $1 rc=$?"; cat "$OUT/tower-$1.txt"; tail -3 "$OUT/tower-$1.err"
        shift
      done
      continue ;;
    use-base)
      # the verbs after it run the baseline clefrt packed beside this one (BASELINE=... scripts/pack_device.sh),
      # on the same machine, their files under $OUT/base; use-branch swaps back
      if [ ! -x .carry/clefrt-base ]; then echo "use-base: no .carry/clefrt-base (pack with BASELINE=path/to/clefrt)" >&2; exit 2; fi
      [ -x .carry/clefrt-branch ] || mv .carry/clefrt .carry/clefrt-branch
      cp .carry/clefrt-base .carry/clefrt
      commit=$(built_at); commit=${commit:-base}; OUT=$OUT0/base; mkdir -p "$OUT"
      echo "== use-base: clefrt built at $commit" ;;
    use-branch)
      [ -x .carry/clefrt-branch ] && mv .carry/clefrt-branch .carry/clefrt
      commit=$branch_commit; OUT=$OUT0
      echo "== use-branch: clefrt built at $commit" ;;
    tar)
      if [ -n "${clocks_pid:-}" ]; then
        kill "$clocks_pid" 2>/dev/null; wait "$clocks_pid" 2>/dev/null; clocks_pid=""
        python3 bench/clocks_summary.py "$OUT0" | tee "$OUT0/clocks-summary.txt"
      fi
      (cd "$OUT0" && tar czf /tmp/out.tgz . && rm -rf ./* && mv /tmp/out.tgz .) ;;
    gdn-products)
      .carry/clefrt_gpu_tests --gtest_filter='CudaEngine.GdnProducts*:CudaEngine.WellConditionedAtClefGdnHeads*:CudaOps.Gdn*' 2>&1 | tee "$OUT/gpu_tests-gdn.log" \
        | grep -E "^\[ cuda|OK \]|FAILED|PASSED|Failure|error"
      if [ -x .carry/clefrt_bench_gdn ]; then
        anchors_arg=(); [ -s "$OUT0/kernel-anchors.json" ] && anchors_arg=(--anchors "$OUT0/kernel-anchors.json")
        .carry/clefrt_bench_gdn --commit "$commit" --json "$OUT/lab-gdn.json" "${anchors_arg[@]}" > "$OUT/lab-gdn.txt" 2>&1
        echo "== lab gdn rc=$?"; grep -E "^[0-9]|product|wgmma|prep alone|anchor|clefrt_bench_gdn:" "$OUT/lab-gdn.txt" | cut -c1-200
      else echo "== lab gdn: no .carry/clefrt_bench_gdn (pack it)"; fi
      CLEFRT_GDN_PRODUCTS=bf16x3 .carry/clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 16384 --no-vision --tokenizer $tok --reps 5 --profile \
        --commit "$commit" --command "CLEFRT_GDN_PRODUCTS=bf16x3 clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 16384 --no-vision --reps 5 --profile" \
        --json "$OUT/bench-bf16-gdnx3.json" > "$OUT/bench-bf16-gdnx3.txt" 2> "$OUT/bench-bf16-gdnx3.err"
      echo "== bench bf16, GDN products bf16x3 rc=$?"; grep -v "^{" "$OUT/bench-bf16-gdnx3.txt" | head -40; tail -3 "$OUT/bench-bf16-gdnx3.err" ;;
    gdn-scan-planes)  # the bf16 bench with the planes GDN scan (CLEFRT_GDN_SCAN=planes; files *-scanplanes*): pass `quick bf16` too for the default's (the state in registers)
      CLEFRT_GDN_SCAN=planes .carry/clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 16384 --no-vision --tokenizer $tok --reps 5 --profile \
        --commit "$commit" --command "CLEFRT_GDN_SCAN=planes clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 16384 --no-vision --reps 5 --profile" \
        --json "$OUT/bench-bf16-scanplanes.json" > "$OUT/bench-bf16-scanplanes.txt" 2> "$OUT/bench-bf16-scanplanes.err"
      echo "== bench bf16, GDN scan state in planes rc=$?"; grep -v "^{" "$OUT/bench-bf16-scanplanes.txt" | grep -E "^(blog|tok_|64 |batch|profile)|gdn chunk" | head -24; tail -3 "$OUT/bench-bf16-scanplanes.err" ;;
    lab-gdn-prep)
      # the GDN Wgmma preps alone at every lab shape, the one-pass prep from fp32 and from bf16 rows
      CLEFRT_LAB_PREP_ONLY=1 timeout 120 .carry/clefrt_bench_gdn --commit "$commit" > "$OUT/lab-gdn-prep.txt" 2>&1
      echo "== lab gdn prep rc=$?"; grep -E "chunks;|prep alone" "$OUT/lab-gdn-prep.txt" ;;
    lab-gdn-form)
      # the GDN lab's W / U and T forms from bf16 rows at every shape, beside the 3xTF32 reference
      # (and fla's figure when `anchors` ran before in this call)
      anchors_arg=(); [ -s "$OUT0/kernel-anchors.json" ] && anchors_arg=(--anchors "$OUT0/kernel-anchors.json")
      CLEFRT_LAB_FORMS_ONLY=1 timeout 180 .carry/clefrt_bench_gdn --commit "$commit" --json "$OUT/lab-gdn-form.json" "${anchors_arg[@]}" \
        > "$OUT/lab-gdn-form.txt" 2>&1
      echo "== lab gdn form rc=$?"; grep -E "chunks;|from bf16 rows|fla's time|3xtf32 " "$OUT/lab-gdn-form.txt" ;;
    lab-elementwise)
      timeout 180 .carry/clefrt_bench_elementwise --commit "$commit" --json "$OUT/lab-elementwise.json" 2>&1 | tee "$OUT/lab-elementwise.txt" ;;
    lab-w4a16-rs)
      # the W4A16 GEMM with the weights as wgmma's register operand (dev/cuda/w4a16_rs.cu) beside
      # cuBLASLt bf16 and the product's wgmma kernel, bits against the product's
      timeout 180 .carry/clefrt_bench_w4a16_rs --commit "$commit" --json "$OUT/lab-w4a16-rs.json" 2>&1 | tee "$OUT/lab-w4a16-rs.txt" ;;
    ncu-w4a16-rs)
      # Nsight Compute on the register-A lab at gate|up, m 318 (the blog), each form's one launch
      # (CLEFRT_LAB_ONCE) beside the product's W4A16 kernel and cuBLASLt's bf16 one: is form 2 bound
      # by x's traffic from L2, by the dequantization's issue slots, or by waiting on the wgmmas?
      # (not cuBLASLt's: the lab's hardware measurement launches it dozens of times before the forms)
      CLEFRT_LAB_ONCE=1 timeout 240 ncu --clock-control none --kernel-name-base demangled -k 'regex:w4a16_rs2?_k|nvfp4_gemm_wgmma_k' -c 24 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats .carry/clefrt_bench_w4a16_rs --shape gate_up --m 318 > "$OUT/ncu-w4a16-rs.txt" 2>&1
      echo "== ncu-w4a16-rs rc=$?"
      grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|No Eligible|Memory Throughput|L2 Hit|Compute \(SM\) Throughput|DRAM Throughput" \
        "$OUT/ncu-w4a16-rs.txt" | cut -c1-160 | head -150 ;;
    ncu-w4a16-rs-source)
      # the product's short-input kernel (nvfp4_gemm_rs_k<TN, WGS, NT, TW>) at m 318: gate|up's tile
      # (128 channels x 160 x 2 tokens) and down's (64 x 160 x 2), the channel tiles of down filling
      # 80 of the SMs (forms 1 and 2: bench/results/2026-12-07-session53.md, call 4): warp stall
      # samples per SASS instruction (CSV; bench/ncu_sass_summary.py) and the instruction mix. Is
      # the tensor pipe idle while the warps wait on the dequantization, the wgmmas or the barrier?
      # (ncu matches on names with casts, "nvfp4_gemm_rs_k<(int)160, (int)2, ...>")
      for kk in "prod-gu gate_up nvfp4_gemm_rs_k<[^,]*160, [^,]*2, [^,]*2, [^>]*1>" "prod-down down nvfp4_gemm_rs_k<[^,]*160, [^,]*1, [^,]*2, [^>]*1>"; do
        read -r tag shape re <<< "$kk"
        CLEFRT_LAB_ONCE=1 timeout 150 ncu --clock-control none --kernel-name-base demangled -k "regex:$re" -c 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
          --section InstructionStats --section SourceCounters -o "$OUT/ncu-w4a16-$tag" \
          .carry/clefrt_bench_w4a16_rs --shape "$shape" --m 318 > "$OUT/ncu-w4a16-$tag.log" 2>&1
        echo "== ncu w4a16 $tag rc=$?"
        ncu -i "$OUT/ncu-w4a16-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-w4a16-$tag-sass.csv" 2> /dev/null
        ncu -i "$OUT/ncu-w4a16-$tag.ncu-rep" --page details --print-details all > "$OUT/ncu-w4a16-$tag.txt" 2>&1
        rm -f "$OUT/ncu-w4a16-$tag.ncu-rep"
        python3 bench/ncu_sass_summary.py "$OUT/ncu-w4a16-$tag-sass.csv" --top 30 2>&1 | head -60
      done ;;
    lab-narrow)
      # the FP8 GDN in_proj's bf16 a | b GEMM (n 96): the engine's against split-k mma.sync forms
      timeout 120 .carry/clefrt_bench_narrow_gemm --commit "$commit" --json "$OUT/lab-narrow-gemm.json" 2>&1 | tee "$OUT/lab-narrow-gemm.txt" ;;
    lab-head)
      # the joint head's row Linears and token-row GEMMs (dev/cuda/head_gemm.cu)
      .carry/clefrt_bench_head_gemm --commit "$commit" --json "$OUT/lab-head-gemm.json" 2>&1 | tee "$OUT/lab-head-gemm.txt" ;;
    ncu-head)
      # Nsight Compute on the head lab's row-Linear launches, each shape once (CLEFRT_LAB_ONCE): the
      # product and the previous 8-warp form, throughput, occupancy, warp stalls and memory per
      # launch (why the k = 4,096 / 5,120 shapes run far below copy)
      CLEFRT_LAB_ONCE=1 ncu --clock-control none --kernel-name-base demangled -k 'regex:head_gemm_k' -c 40 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        .carry/clefrt_bench_head_gemm > "$OUT/ncu-head.txt" 2>&1
      echo "== ncu head rc=$?"
      grep -E "head_gemm_k|Duration|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size" "$OUT/ncu-head.txt" | head -40 ;;
    ncu-blog|ncu-blog-fp8)
      # every kernel's GPU time in one forward of the blog request (ncu, one metric pass), the
      # bench's first timed rep (--profiler-range, ncu --profile-from-start off): loading and the
      # warm-ups, where the GEMMs' tuning times its candidates, run unprofiled; under ncu that
      # timing is ncu's, and the picks were not the product's (session 50: FP8 gate|up 118.8 us in
      # one such run, 101.0 in another). ncu-blog-fp8: the FP8 model's.
      q=bf16; nb=ncu-blog
      [ "$1" = ncu-blog-fp8 ] && q=fp8 nb=ncu-blog-fp8
      ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
        --csv --print-units base --log-file "$OUT/$nb.csv" \
        .carry/clefrt bench --synthetic clef-27b --quant $q --max-tokens 2048 --no-vision --reps 1 --profiler-range --tokenizer $tok > /dev/null 2>&1
      python3 bench/ncu_forward_summary.py "$OUT/$nb.csv" 0 | tee "$OUT/$nb-summary.txt" | head -40
      xz -9 "$OUT/$nb.csv" ;;
    reuse)
      .carry/clefrt bench --synthetic clef-27b --quant bf16 --reuse --tokenizer $tok --reps 5 --commit "$commit" \
        --command "clefrt bench --synthetic clef-27b --quant bf16 --reuse --reps 5" --json "$OUT/reuse-bf16.json" \
        > "$OUT/reuse-bf16.txt" 2> "$OUT/reuse-bf16.err"
      echo "== reuse bf16 rc=$?"; grep -v "^{" "$OUT/reuse-bf16.txt"; tail -3 "$OUT/reuse-bf16.err" ;;
    reuse-host)
      # the host tier: a GPU budget for one 8,000-token state (~0.53 GiB at 27B), 16 GiB of host tier
      .carry/clefrt bench --synthetic clef-27b --quant bf16 --reuse --reuse-cache-gib 0.75 --reuse-host-gib 16 --max-tokens 16384 \
        --tokenizer $tok --reps 5 --commit "$commit" \
        --command "clefrt bench --synthetic clef-27b --quant bf16 --reuse --reuse-cache-gib 0.75 --reuse-host-gib 16 --max-tokens 16384 --reps 5" \
        --json "$OUT/reuse-host-bf16.json" > "$OUT/reuse-host-bf16.txt" 2> "$OUT/reuse-host-bf16.err"
      echo "== reuse host tier bf16 rc=$?"; grep -v "^{" "$OUT/reuse-host-bf16.txt"; tail -3 "$OUT/reuse-host-bf16.err" ;;
    interleave)
      .carry/clefrt bench --synthetic clef-27b --quant bf16 --interleave --max-tokens 65536 --tokenizer $tok --reps 10 --commit "$commit" \
        --command "clefrt bench --synthetic clef-27b --quant bf16 --interleave --max-tokens 65536 --reps 10" --json "$OUT/interleave-bf16.json" \
        > "$OUT/interleave-bf16.txt" 2> "$OUT/interleave-bf16.err"
      echo "== interleave bf16 rc=$?"; grep -v "^{" "$OUT/interleave-bf16.txt"; tail -3 "$OUT/interleave-bf16.err" ;;
    long)
      # issue 18's memory points: 27B NVFP4 + offloaded embeddings at 32k / 64k tokens (staged and
      # fused W4A16) on the card sizes of the targets (--gpu-limit-gib: 16 GiB at 32k, 24 at 64k),
      # with the vision tower and (32k) text only
      for run in "32768 16 " "65536 24 " "32768 16 --no-vision"; do
        read -r n lim nv <<< "$run"
        for f in "" --w4a16-fused; do
          name=memory-nvfp4-offload$f$nv-$n-limit$lim
          .carry/clefrt bench --synthetic clef-27b --quant nvfp4-w4a16 --offload-embeddings $f $nv --memory-only --max-tokens $n \
            --gpu-limit-gib $lim --tokenizer $tok --commit "$commit" \
            --command "clefrt bench --synthetic clef-27b --quant nvfp4-w4a16 --offload-embeddings $f $nv --memory-only --max-tokens $n --gpu-limit-gib $lim" \
            --json "$OUT/$name.json" > /dev/null 2> "$OUT/$name.err"
          echo "== memory nvfp4-w4a16 offload $f $nv $n limit $lim GiB rc=$? $(grep -o '"gpu_mem_gib":[0-9.]*' "$OUT/$name.json")"
          grep -v '^{' "$OUT/$name.err" | tail -3
        done
      done ;;
    long-bf16)
      .carry/clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 65536 --tokenizer $tok --reps 5 --commit "$commit" \
        --command "clefrt bench --synthetic clef-27b --quant bf16 --max-tokens 65536 --reps 5" --json "$OUT/bench-bf16-64k.json" \
        > "$OUT/bench-bf16-64k.txt" 2> "$OUT/bench-bf16-64k.err"
      echo "== bench bf16 64k rc=$?"; grep -v "^{" "$OUT/bench-bf16-64k.txt" | head -40; tail -3 "$OUT/bench-bf16-64k.err" ;;
    eval)
      # issue 21's throughput point: all four benchmarks through the 27B shapes (random weights:
      # the scores are noise), rows/s per benchmark in the report; needs .evaldata/ (a copy of
      # ../shared/data, carried)
      # EVAL_LIMIT=N: the first N rows of each (the whole suite is hours of 27B prefill)
      timeout ${EVAL_TIMEOUT:-400} .carry/clefrt eval --synthetic clef-27b --quant bf16 --tokenizer $tok --data .evaldata ${EVAL_LIMIT:+--limit $EVAL_LIMIT} --out "$OUT/eval-bf16" \
        > "$OUT/eval-bf16.txt" 2> "$OUT/eval-bf16.err"
      echo "== eval bf16 rc=$?"; cat "$OUT/eval-bf16.txt"; grep -o '"rows_per_s":[0-9.]*' "$OUT/eval-bf16/report.json" ;;
    nan)
      d=/tmp/nan-tiny
      .carry/clefrt synth --out $d --config tiny --tokenizer $tok > /dev/null 2>&1
      python3 -c "import sys, types; sys.path.insert(0, 'bench'); import attack, shutil; \
b, n = attack.nan_folder(types.SimpleNamespace(model='$d')); shutil.rmtree('$d-nan', ignore_errors=True); shutil.move(b, '$d-nan'); print('poisoned', n)"
      .carry/clefrt decide --model $d-nan --device cuda examples/blog.json > "$OUT/nan-checked.txt" 2>&1
      echo "== nan checked rc=$? $(tail -c 300 "$OUT/nan-checked.txt")"
      .carry/clefrt decide --model $d-nan --device cuda --no-check-weights examples/blog.json > "$OUT/nan-unchecked.txt" 2>&1
      echo "== nan unchecked rc=$? $(tail -c 400 "$OUT/nan-unchecked.txt")"
      .carry/clefrt decide --model $d --device cuda examples/blog.json > "$OUT/nan-clean.txt" 2>&1
      echo "== clean folder rc=$? $(head -c 200 "$OUT/nan-clean.txt")" ;;
    serve)
      shift
      while [ $# -gt 0 ] && [[ $1 =~ ^(auto|bf16|fp8|nvfp4|nvfp4-w4a16)$ ]]; do
        m=$1 port=18$((RANDOM % 900 + 100)) f=$1$(run_tag "serve-$1" log)
        echo "== serve $m${serve_flags:+ $serve_flags}${lab_env:+ ($lab_env)} -> serve-$f.*"
        # the request log on (no --quiet): queue / compute / total per request, summarized below
        t_start=$(date +%s%N)
        # shellcheck disable=SC2086  # serve_flags: words
        .carry/clefrt serve --synthetic clef-27b --quant "$m" --tokenizer $tok --port $port ${serve_flags:-} > "$OUT/serve-$f.log" 2>&1 &
        pid=$!
        python3 -c "import time, urllib.request as u
for i in range(480):
    try:
        u.urlopen('http://127.0.0.1:$port/health', timeout=2); break
    except Exception: time.sleep(0.5)"
        echo "== serve $m: ready after $(( ($(date +%s%N) - t_start) / 1000000 )) ms"
        .carry/clefrt_load --port $port --clients 1,8,64 --seconds 10 --json "$OUT/serve-load-$f.json" 2>&1 | tail -5
        # one client again on one kept connection: the same server without TCP setup per request
        .carry/clefrt_load --port $port --clients 1 --seconds 5 --keep-alive --json "$OUT/serve-load-keepalive-$f.json" 2>&1 | tail -1
        t0=$(date +%s%N); kill -TERM $pid; wait $pid; rc=$?
        echo "== serve $m: SIGTERM -> exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
        python3 bench/serve_log_summary.py "$OUT/serve-$f.log" --seconds 10 --phases 1,8,64 | tee "$OUT/serve-split-$f.txt"
        shift
      done
      continue ;;
    anchors)
      mkdir -p /tmp/fla && tar xJf .anchors/fla-0.5.2-bc3b101d.tar.xz -C /tmp/fla
      PYTHONUNBUFFERED=1 python3 .anchors/kernel_anchors.py /tmp/fla "$OUT/kernel-anchors.json" 2>&1 | tail -12 ;;
    ops)
      .carry/clefrt --version
      if command -v cuobjdump > /dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
        "$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)" --list-elf .carry/clefrt | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
      else echo "no cuobjdump on this machine"; fi
      for extra in "" --portable-kernels; do
        port=18$((RANDOM % 900 + 100))
        .carry/clefrt serve --synthetic small --quant nvfp4-w4a16 --w4a16-fused $extra --tokenizer $tok --port $port --quiet > "$OUT/ops-serve$extra.log" 2>&1 &
        pid=$!
        python3 -c "import time, urllib.request as u
for i in range(240):
    try:
        print(u.urlopen('http://127.0.0.1:$port/health', timeout=2).read().decode()); break
    except Exception: time.sleep(0.5)"
        curl -s -X POST localhost:$port/v1/systemone -d @examples/blog.json | head -c 300; echo
        kill -TERM $pid; wait $pid
        echo "== serve $extra exit $?"; grep -o '"event":"ready".*' "$OUT/ops-serve$extra.log" | head -c 700; echo
      done ;;
    lab)
      # with the anchors' figures beside the product's when `anchors` ran before in this call
      anchors_arg=(); [ -s "$OUT0/kernel-anchors.json" ] && anchors_arg=(--anchors "$OUT0/kernel-anchors.json")
      .carry/clefrt_bench_gdn --commit "$commit" --json "$OUT/lab-gdn.json" "${anchors_arg[@]}" 2>&1 | tee "$OUT/lab-gdn.txt"
      if [ -x .carry/clefrt_bench_elementwise ]; then
        .carry/clefrt_bench_elementwise --commit "$commit" --json "$OUT/lab-elementwise.json" 2>&1 | tee "$OUT/lab-elementwise.txt"
      fi ;;
    ncu-elementwise)
      # Nsight Compute on the elementwise lab's FP8 steps at 318 rows (the blog), each kernel's first
      # launch: the product's SwiGLU (a row over 2 CTAs, 4 items a thread), the same with the fast
      # intrinsics' SiLU, its streamed form (the lab's own kernel; its first launch is the one capped for 3 CTAs an SM), and the FP8 norm taking a pending residual add. Is the SwiGLU bound by its
      # instructions, its warps' dependency chains (few warps, long MUFU / division latencies) or
      # its loads? Occupancy, issue slots, warp stall reasons, memory throughput.
      # (ncu renders template arguments as "(int)4, (bool)0": the patterns allow a cast before each)
      for k in "swiglu-exact swiglu_fp8_quant_cluster_k<[^>]*4, [^>]*(0|false)>" "swiglu-fast swiglu_fp8_quant_cluster_k<[^>]*4, [^>]*(1|true)>" \
               "swiglu-stream swiglu_fp8_quant_stream_k" "norm-fp8-add rms_norm_1p_fp8_k<[^>]*(1|true)>"; do
        read -r tag re <<< "$k"
        echo "== ncu $tag ($re)" >> "$OUT/ncu-elementwise.txt"
        timeout 150 ncu --clock-control none --kernel-name-base demangled -k "regex:$re" -c 1 --section SpeedOfLight --section WarpStateStats \
          --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats \
          .carry/clefrt_bench_elementwise --m 318 >> "$OUT/ncu-elementwise.txt" 2>&1
        echo "== ncu $tag rc=$?"
      done
      grep -E "^== |Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|No Eligible|Executed Instructions |Memory Throughput|L1/TEX Hit|L2 Hit|Block Limit" \
        "$OUT/ncu-elementwise.txt" | head -60 ;;
    ncu-gdn)  # Nsight Compute on the first launch of the 3xTF32 prep and of each Wgmma kernel at 1 x 8,192
      for k in "gdn_chunk_prep_tc_k 1" "gdn_prep_wgmma_k 1" "gdn_scan_wgmma_k 1"; do
        read -r re n <<< "$k"
        CLEFRT_LAB_ONLY="wgmma bf16x3" ncu --clock-control none -k regex:"$re" -c "$n" --section SpeedOfLight --section WarpStateStats \
          --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats .carry/clefrt_bench_gdn \
          >> "$OUT/ncu-gdn.txt" 2>&1
        echo "== ncu $re rc=$?"
      done
      grep -E "gdn_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Registers Per|Achieved Occupancy" "$OUT/ncu-gdn.txt" | head -40 ;;
    ncu-gdn-source)  # the Wgmma prep's and scan's hot instructions: stall samples per SASS line (Nsight Compute's source page, CSV)
      # (tag, demangled-name regex): gdn_prep_wgmma_k<(bool)1> is bf16x3's; gdn_scan_rs_k the state-in-registers scan where built
      for kk in "prep-bf16x3 gdn_prep_wgmma_k<.bool.1>" "prep-bf16 gdn_prep_wgmma_k<.bool.0>" "scan-bf16 gdn_scan_wgmma_k<.bool.0>" "scan-rs gdn_scan_rs_k"; do
        read -r tag re <<< "$kk"
        CLEFRT_LAB_ONLY="wgmma bf16" ncu --clock-control none --kernel-name-base demangled -k "regex:$re" -c 1 \
          --section SpeedOfLight --section WarpStateStats --section SourceCounters -o "$OUT/ncu-$tag" .carry/clefrt_bench_gdn \
          > "$OUT/ncu-$tag.log" 2>&1
        echo "== ncu $tag rc=$?"
        ncu -i "$OUT/ncu-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$tag-sass.csv" 2> "$OUT/ncu-$tag-sass.err"
        echo "== ncu source page rc=$? ($(wc -l < "$OUT/ncu-$tag-sass.csv") lines)"
        ncu -i "$OUT/ncu-$tag.ncu-rep" --page details > "$OUT/ncu-$tag.txt" 2>&1
        rm -f "$OUT/ncu-$tag.ncu-rep"  # the CSV and the details page hold what is read; the report is megabytes
        grep -E "Duration|Throughput|Warp Cycles Per Issued|stalled" "$OUT/ncu-$tag.txt" | head -12
      done ;;
    ncu-gdn-tform)  # the T form's prep and scan (1 x 8,192, the lab's first T form launches): stall samples per SASS line (CSV) and the details page
      for kk in "tform-prep gdn_prep_wgmma_k<.*bool.1, .bool.1>" "tform-scan gdn_scan_rs_k<.int.1, .bool.1>"; do
        read -r tag re <<< "$kk"
        CLEFRT_LAB_FORMS_ONLY=1 ncu --clock-control none --kernel-name-base demangled -k "regex:$re" -c 1 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
          --section SourceCounters -o "$OUT/ncu-$tag" .carry/clefrt_bench_gdn > "$OUT/ncu-$tag.log" 2>&1
        echo "== ncu $tag rc=$?"
        ncu -i "$OUT/ncu-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$tag-sass.csv" 2> "$OUT/ncu-$tag-sass.err"
        ncu -i "$OUT/ncu-$tag.ncu-rep" --page details > "$OUT/ncu-$tag.txt" 2>&1
        rm -f "$OUT/ncu-$tag.ncu-rep"
        grep -E "Duration|Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" "$OUT/ncu-$tag.txt" | head -12
      done ;;
    lab-bf16)
      # the bf16 GEMMs' invariant algorithm against cuBLASLt's candidates and fixed row blocks
      .carry/clefrt_bench_bf16 --commit "$commit" --json "$OUT/lab-bf16.json" > "$OUT/lab-bf16.txt" 2>&1; echo "== lab bf16 rc=$?"
      grep -E "^[a-z]|engine inv|blocks of" "$OUT/lab-bf16.txt" | head -150 ;;
    lab-vision-attn)
      # the tower's attention variants (dev/cuda/vision_attention.cu: the mma.sync ones and the
      # wgmma one, with its layout probe) beside the product's kernel
      .carry/clefrt_bench_vision_attn --commit "$commit" --json "$OUT/lab-vision-attn.json" 2>&1 | tee "$OUT/lab-vision-attn.txt"
      echo "== lab vision-attn rc=$?" ;;
    lab-cudnn)
      # cuDNN's fused attention at the tower's shapes beside ours: the GPU machine's cuDNN is
      # PyTorch's (nvidia-cudnn-cu13)
      .carry/clefrt_bench_cudnn_attn --commit "$commit" --json "$OUT/lab-cudnn-attn.json" 2>&1 \
        | tee "$OUT/lab-cudnn-attn.txt"; echo "== lab cudnn rc=$? (cuDNN from ${cudnn_lib:-nowhere})" ;;
    lab-gemm-search)
      # every cuBLASLt configuration at the blog's and the tower's GEMMs beside the engine's (bits and ms)
      .carry/clefrt_bench_gemm_search --commit "$commit" --json "$OUT/lab-gemm-search.json" > "$OUT/lab-gemm-search.txt" 2>&1
      echo "== lab gemm-search rc=$?"; grep -E "^[a-z]|engine|same bits" "$OUT/lab-gemm-search.txt" | head -80 ;;
    lab-fp8-wgmma)
      # our FP8 wgmma GEMM (docs/notes/fp8-gemm-design.md, step 1) beside cuBLASLt's: ms, error, row bits
      # (a kernel never run before may hang: 150 s at most; the whole lab takes ~40 s on an H100)
      timeout 150 .carry/clefrt_bench_fp8_wgmma --commit "$commit" --json "$OUT/lab-fp8-wgmma.json" > "$OUT/lab-fp8-wgmma.txt" 2>&1
      echo "== lab fp8-wgmma rc=$?"; grep -E "^[a-z]|^m |ours|cuBLASLt" "$OUT/lab-fp8-wgmma.txt" | head -60 ;;
    lab-fp8-sustained)
      # the FP8 GEMM of our own (256 x 128, 128 x 192) and cuBLASLt's at the power cap, m 8,192, every
      # shape: 1 s each after 0.3 s warm, alternated twice (ms, J, SM clock, clocks a call)
      timeout 150 .carry/clefrt_bench_fp8_wgmma --sustained --m 8192 --commit "$commit" --json "$OUT/lab-fp8-sustained.json" \
        > "$OUT/lab-fp8-sustained.txt" 2>&1
      echo "== lab fp8-sustained rc=$?"; grep -E "^[a-z]|^m |^  " "$OUT/lab-fp8-sustained.txt" | head -40 ;;
    ncu-fp8-gemm)
      # our FP8 GEMM's warp-specialized forms and cuBLASLt's at gate|up, m 8,192 (the lab, --shape
      # gate_up --m 8192): Nsight Compute's pipes, memory, stalls and per-SASS stall samples, and the
      # SASS of our kernels (cuobjdump). One launch each (CLEFRT_LAB_PROFILE: kVariants 1 and 2,
      # the warp-specialized 256 x 128 and 128 x 128 forms)
      cuobjdump -sass -fun fp8_gemm_ws_k .carry/clefrt_bench_fp8_wgmma > "$OUT/sass-fp8-ws.txt" 2>&1 \
        || cuobjdump -sass .carry/clefrt_bench_fp8_wgmma > "$OUT/sass-fp8-ws.txt" 2>&1
      echo "== sass rc=$? ($(wc -l < "$OUT/sass-fp8-ws.txt") lines)"
      for kk in "ws256 1" "ws128 2" "cublaslt cublaslt"; do
        read -r tag which <<< "$kk"
        CLEFRT_LAB_PROFILE=$which ncu --clock-control none --profile-from-start off \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
          --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters -o "$OUT/ncu-fp8-$tag" \
          .carry/clefrt_bench_fp8_wgmma --shape gate_up --m 8192 > "$OUT/ncu-fp8-$tag.log" 2>&1
        echo "== ncu fp8 $tag rc=$?"
        ncu -i "$OUT/ncu-fp8-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-fp8-$tag-sass.csv" 2> /dev/null
        ncu -i "$OUT/ncu-fp8-$tag.ncu-rep" --page details > "$OUT/ncu-fp8-$tag.txt" 2>&1
        rm -f "$OUT/ncu-fp8-$tag.ncu-rep"
        grep -E "^  [a-z_0-9]|Duration|Throughput|Pipe|Warp Cycles Per Issued|Bank|Registers Per" "$OUT/ncu-fp8-$tag.txt" | head -24
      done ;;
    lab-fp8-scales)  # clefrt_bench_fp8 at m 318 and 8,192 only: the alpha-vector and outer-vector scale points among its lines
      for m in 318 8192; do
        .carry/clefrt_bench_fp8 --commit "$commit" --m $m --json "$OUT/lab-fp8-m$m.json" > "$OUT/lab-fp8-m$m.txt" 2>&1
        echo "== lab fp8 m $m rc=$?"; grep -E "alpha vector|outer vectors" "$OUT/lab-fp8-m$m.txt"
      done ;;
    lab-gemm)
      .carry/clefrt_bench_w4a16 --commit "$commit" --json "$OUT/lab-w4a16.json" > "$OUT/lab-w4a16.txt" 2>&1; echo "== lab w4a16 rc=$?"
      .carry/clefrt_bench_fp8 --commit "$commit" --json "$OUT/lab-fp8.json" > "$OUT/lab-fp8.txt" 2>&1; echo "== lab fp8 rc=$?" ;;
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

#!/usr/bin/env bash
# Packs what the GPU machine needs from a local build into .carry/ (git-ignored): stripped
# binaries and the shared libraries its image lacks (simdjson, utf8proc, cpp-httplib + brotli; PCRE2
# to be safe; it has OpenBLAS, OpenSSL and zlib). Run there with LD_LIBRARY_PATH=.carry/lib.
# The binaries and the Qwen3 tokenizer go in xz-compressed (the device tool's tree limit is 64 MiB
# with the tracked files, ~32 MiB of them; the binaries are ~13 MiB each stripped, ~3 xz'd): unpack
# them there first with
#   for f in .carry/clefrt*.xz; do xz -d "$f"; done; chmod +x .carry/clefrt*
#   mkdir -p .deps/qwen3 && xz -dc .carry/tokenizer.json.xz > .deps/qwen3/tokenizer.json && cp .carry/tokenizer_config.json .deps/qwen3/
# and carry [".carry", ".anchors"] (not .deps/qwen3). PACK_ONLY="clefrt clefrt_gpu_tests" packs
# those binaries alone.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/lib
for b in ${PACK_ONLY:-clefrt clefrt_gpu_tests clefrt_load clefrt_bench_w4a16 clefrt_bench_fp8 clefrt_bench_fp8_wgmma clefrt_bench_bf16 clefrt_bench_cudnn_attn clefrt_bench_gdn clefrt_bench_elementwise clefrt_bench_head_gemm clefrt_bench_vision_attn clefrt_bench_gemm_search clefrt_bench_narrow_gemm clefrt_bench_w4a16_rs}; do
  strip -o ".carry/$b" "build/$b"
  xz -6 -T2 ".carry/$b"
done
# BASELINE=path/to/clefrt: another build's clefrt (main's, say) packed as .carry/clefrt-base, for
# the suite's use-base / use-branch (the two measured on one machine, one call)
if [ -n "${BASELINE:-}" ]; then
  strip -o .carry/clefrt-base "$BASELINE"
  xz -6 -T2 .carry/clefrt-base
fi
for l in libsimdjson.so.14 libutf8proc.so.2 libwebp.so.7 libpng16.so.16 libjpeg.so.62 libpcre2-8.so.0 libcpp-httplib.so.0.11 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" .carry/lib/
done
xz -9 -T2 -c .deps/qwen3/tokenizer.json > .carry/tokenizer.json.xz
cp .deps/qwen3/tokenizer_config.json .carry/
du -sh .carry

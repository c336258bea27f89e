#!/usr/bin/env bash
# Packs what the GPU machine needs from a local build into .carry/ (git-ignored): stripped
# binaries and the shared libraries its image lacks (simdjson, utf8proc, cpp-httplib + brotli; PCRE2
# to be safe; it has OpenBLAS, OpenSSL and zlib). Run there with LD_LIBRARY_PATH=.carry/lib.
# The Qwen3 tokenizer goes in xz-compressed (the device tool's tree limit is 64 MiB; the JSON is
# 11 MiB): unpack it there first with
#   mkdir -p .deps/qwen3 && xz -dc .carry/tokenizer.json.xz > .deps/qwen3/tokenizer.json && cp .carry/tokenizer_config.json .deps/qwen3/
# and carry [".carry", ".anchors"] (not .deps/qwen3).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/lib
for b in clefrt clefrt_gpu_tests clefrt_load clefrt_bench_w4a16 clefrt_bench_fp8 clefrt_bench_bf16 clefrt_bench_cudnn_attn clefrt_bench_gdn; do strip -o ".carry/$b" "build/$b"; done
for l in libsimdjson.so.14 libutf8proc.so.2 libwebp.so.7 libpng16.so.16 libjpeg.so.62 libpcre2-8.so.0 libcpp-httplib.so.0.11 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" .carry/lib/
done
xz -9 -T2 -c .deps/qwen3/tokenizer.json > .carry/tokenizer.json.xz
cp .deps/qwen3/tokenizer_config.json .carry/
du -sh .carry

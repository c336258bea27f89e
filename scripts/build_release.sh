#!/usr/bin/env bash
# A release build for every NVIDIA GPU clefrt supports: one fat binary with code for Ampere
# (sm_80, sm_86), Ada (sm_89), Hopper (sm_90a: wgmma / TMA), Blackwell datacenter (sm_100a) and
# consumer / DGX Spark (sm_120a), plus compute_120 PTX for what comes after. Kernels are picked
# by the GPU's compute capability at load (wgmma only on 9.0, FP4 tensor cores only on 10.x /
# 12.x). Into build-release/ (Release), then a .deb beside it (CPack). Takes far longer than
# scripts/build.sh (every kernel is compiled once per architecture); CI builds sm_90a only.
# Usage: scripts/build_release.sh [extra cmake arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
archs="80-real;86-real;89-real;90a-real;100a-real;120a-real;120-virtual"
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DCLEFRT_TESTS=OFF "$@" >/dev/null
ninja -C build-release
build-release/clefrt --version
# The proof that every architecture is in the binary: its embedded ELF images (and the PTX).
if command -v cuobjdump >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/cuobjdump ]; then
  "$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)" --list-elf build-release/clefrt | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
  "$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)" --list-ptx build-release/clefrt | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
else
  echo "build_release: cuobjdump is not installed here: run 'cuobjdump --list-elf build-release/clefrt' where it is"
fi
(cd build-release && cpack -G DEB >/dev/null && ls -l ./*.deb)

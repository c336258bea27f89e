#!/usr/bin/env bash
# Configures and builds clefrt into build/ (Release with debug info). The CUDA backend is built
# when nvcc is found (on PATH or in /usr/local/cuda), for sm_90a unless CUDAARCHS says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C build

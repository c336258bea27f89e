#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (CTest + GoogleTest).
# GPU tests (label `gpu`) skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"

#!/usr/bin/env bash
# Packs the checked-out branch for the GPU machine with another commit's clefrt beside it as the
# baseline (bench/run_device_suite.sh's use-base / use-branch: both measured on one card in one
# call), and the anchors: builds BASE_REF and then the branch in build/ (ccache keeps switching
# cheap: the same paths), then scripts/pack_device.sh with BASELINE set. The tree must be clean.
# Usage: scripts/pack_compare.sh BASE_REF [PACK_ONLY binaries]
#   e.g. scripts/pack_compare.sh main "clefrt clefrt_gpu_tests clefrt_bench_gdn clefrt_bench_elementwise"
# Then carry [".carry", ".anchors"] and, in every device call, unpack first (pack_device.sh says how).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/pack_compare.sh BASE_REF [\"binaries to pack\"]" >&2
  exit 2
fi
base=$1
only=${2:-clefrt clefrt_gpu_tests clefrt_bench_gdn clefrt_bench_elementwise}
git rev-parse --verify -q "$base^{commit}" > /dev/null || { echo "pack_compare: '$base' is not a commit" >&2; exit 2; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "pack_compare: the tree has uncommitted changes (it checks out $base and back): commit or stash them" >&2
  exit 2
fi
commit_of() { "$1" --version | sed -n 's/.*(commit \([0-9a-z+]*\).*/\1/p'; }  # the commit a clefrt says it was built at
here=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
back() { git checkout -q "$here"; }
trap back EXIT
echo "pack_compare: building the baseline $base ($(git rev-parse --short "$base"))"
git checkout -q "$base"
scripts/build.sh > /tmp/pack_compare_base.log 2>&1 || { echo "pack_compare: the baseline's build failed: /tmp/pack_compare_base.log" >&2; exit 1; }
cp build/clefrt /tmp/clefrt-base
back
trap - EXIT
echo "pack_compare: building $here ($(git rev-parse --short HEAD))"
scripts/build.sh > /tmp/pack_compare_branch.log 2>&1 || { echo "pack_compare: the branch's build failed: /tmp/pack_compare_branch.log" >&2; exit 1; }
BASELINE=/tmp/clefrt-base PACK_ONLY="$only" scripts/pack_device.sh
mkdir -p .anchors && cp ../shared/anchors/* .anchors/
echo "pack_compare: .carry/clefrt is $(commit_of build/clefrt), .carry/clefrt-base is $(commit_of /tmp/clefrt-base)"

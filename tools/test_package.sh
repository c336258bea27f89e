#!/usr/bin/env bash
# The Debian package as a user gets it: CPack builds it from BUILD_DIR, dpkg installs it into a
# scratch root (no system changes needed), and the installed clefrt must report its
# version, write the tiny model and answer the blog request; the package must declare its
# dependencies and hold the library, header, pkg-config file, Python module, docs and systemd
# unit; the unit must pass systemd-analyze verify (when present) with nothing printed.
# Usage: tools/test_package.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$build" && cpack -G DEB -B "$work/pkg" > "$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/pkg/*.deb)
echo "package: $(basename "$deb") ($(du -h "$deb" | cut -f1))"
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
case $depends in *libsimdjson14*libutf8proc2*) ;; *) echo "FAIL: the package does not declare its libraries"; exit 1 ;; esac
# every library the binary and libclefrt.so load is declared: by the Debian package that holds
# it here, or (the CUDA runtime and cuBLASLt, installed from NVIDIA's files rather than dpkg on
# the build machines) by NVIDIA's package name
declared=$(echo "$depends" | tr ',|' '\n\n' | sed -e 's/(.*)//' -e 's/ //g')
cuda_stubs=""
mkdir -p "$work/unpacked" && dpkg-deb -x "$deb" "$work/unpacked"
loaded=("$work/unpacked/usr/bin/clefrt" "$work/unpacked/usr/lib/libclefrt.so")
for m in "$work"/unpacked/usr/lib/python3/dist-packages/clefrt/_clefrt*.so; do [ -e "$m" ] && loaded+=("$m"); done
for lib in $(readelf -d "${loaded[@]}" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u); do
  case $lib in libc.so.*|libm.so.*|libgcc_s.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*) continue ;; esac
  case $lib in
    libcudart.so.13) want=cuda-cudart-13-0 ;;
    libcublasLt.so.13|libcublas.so.13) want=libcublas-13-0 ;;
    libclefrt.so.*) continue ;;  # the package's own library (the Python module loads it)
    libpython3*) continue ;;     # the interpreter that loads the Python module (Suggests)
    *) want=$(dpkg -S "*/$lib" 2>/dev/null | cut -d: -f1 | tr ',' '\n' | sed 's/ //g' | sort -u) ;;
  esac
  [ -n "$want" ] || { echo "FAIL: $lib is loaded but no package here holds it"; exit 1; }
  # one of the packages holding it (a library can sit in several: OpenBLAS' variants) is declared
  found=""
  # (a here-string, not a pipe: grep -q quits at its match, and under pipefail the writer's
  # SIGPIPE would fail the test whenever the match comes before the last line is written)
  for w in $want; do grep -qx "$w" <<< "$declared" && found=$w; done
  [ -n "$found" ] || { echo "FAIL: $lib ($(echo $want)) is loaded but the package depends on none of them"; exit 1; }
  want=$found
  case $want in cuda-*|libcublas-*) dpkg -s "$want" > /dev/null 2>&1 || cuda_stubs="$cuda_stubs $want" ;; esac
done
echo "NEEDED libraries: each one's package is in Depends"

# dpkg installs it into a scratch root whose package database is a copy of this machine's, so
# the declared dependencies are checked against what Debian installed here (no --force-depends),
# and nothing outside the scratch root changes (--force-not-root: files only, no maintainer
# scripts to run)
mkdir -p "$work/root/var/lib/dpkg/info" "$work/root/var/lib/dpkg/updates"
cp /var/lib/dpkg/status "$work/root/var/lib/dpkg/status"
# the CUDA libraries present here from NVIDIA's files rather than dpkg: entries for their
# packages, so dpkg's dependency check stays on (the libraries themselves are here: the binary
# loads them below)
for p in $cuda_stubs; do
  printf 'Package: %s\nStatus: install ok installed\nPriority: optional\nArchitecture: amd64\nVersion: 13.0\nMaintainer: none\nDescription: present here outside dpkg\n\n' "$p" \
    >> "$work/root/var/lib/dpkg/status"
done
dpkg --root="$work/root" --force-not-root --log=/dev/null -i "$deb" > "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; echo "FAIL: dpkg -i"; exit 1; }
status=$(dpkg --root="$work/root" -s clefrt)
grep -q "^Status: install ok installed" <<< "$status" || { echo "FAIL: dpkg does not list clefrt as installed"; exit 1; }
echo "dpkg -i: installed (dependencies satisfied by this machine's packages)"
for f in usr/bin/clefrt usr/lib/libclefrt.so usr/include/clefrt/clefrt.h usr/lib/pkgconfig/clefrt.pc \
         usr/lib/systemd/system/clefrt.service usr/share/doc/clefrt/README.md usr/share/doc/clefrt/clefrt.default; do
  [ -e "$work/root/$f" ] || { echo "FAIL: the package lacks /$f"; exit 1; }
done
if ls "$build"/python/clefrt/_clefrt*.so > /dev/null 2>&1; then
  ls "$work"/root/usr/lib/python3/dist-packages/clefrt/_clefrt*.so > /dev/null || { echo "FAIL: the package lacks the Python module"; exit 1; }
fi
bin="$work/root/usr/bin/clefrt"
"$bin" --version
"$bin" synth --out "$work/tiny" --config tiny --tokenizer "$src/.deps/qwen3/tokenizer.json" > /dev/null 2>&1
out=$("$bin" decide --model "$work/tiny" --device cpu "$src/examples/blog.json")
case $out in *'"answers"'*) echo "decide: ${out:0:120}..." ;; *) echo "FAIL: decide printed: $out"; exit 1 ;; esac
if command -v systemd-analyze > /dev/null; then
  # verify checks that ExecStart exists: point it at the unpacked binary, the environment file at an empty one
  sed -e "s|/usr/bin/clefrt|$bin|" -e "s|EnvironmentFile=-/etc/default/clefrt|EnvironmentFile=$work/env|" \
    "$work/root/usr/lib/systemd/system/clefrt.service" > "$work/clefrt.service"
  : > "$work/env"
  msgs=$(systemd-analyze verify "$work/clefrt.service" 2>&1) || { echo "FAIL: systemd-analyze verify: $msgs"; exit 1; }
  [ -z "$msgs" ] || { echo "FAIL: systemd-analyze verify says: $msgs"; exit 1; }
  echo "systemd-analyze verify: clean"
else
  echo "systemd-analyze not installed: the unit was not verified"
fi
dpkg --root="$work/root" --force-not-root --log=/dev/null -r clefrt > "$work/dpkg-r.log" 2>&1 || { cat "$work/dpkg-r.log"; echo "FAIL: dpkg -r"; exit 1; }
[ ! -e "$work/root/usr/bin/clefrt" ] || { echo "FAIL: dpkg -r left /usr/bin/clefrt"; exit 1; }
echo "dpkg -r: removed"
echo "package: ok"

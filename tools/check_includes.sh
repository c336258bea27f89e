#!/usr/bin/env bash
# The layout rule docs/architecture.md states, checked: the faces (src/cli, src/server, python/)
# are written against the public header include/clefrt/clefrt.h and never include the engine's
# internals (src/cuda, src/model, src/engine), and the public header compiles on its own
# (C++17, no other header of the project). Usage: tools/check_includes.sh [CXX]
set -uo pipefail
cd "$(dirname "$0")/.."
cxx=${1:-c++}
status=0
bad=$(grep -nE '#include[[:space:]]+"(cuda|model|engine)/' src/cli/*.cpp src/cli/*.h src/server/*.cpp src/server/*.h python/*.cpp 2>/dev/null)
if [ -n "$bad" ]; then
  echo "check_includes: faces reaching into the engine's internals (use include/clefrt/clefrt.h):"
  echo "$bad"
  status=1
fi
out=$(echo "#include <clefrt/clefrt.h>" | "$cxx" -std=c++17 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -Iinclude -x c++ - 2>&1)
if [ $? -ne 0 ]; then
  echo "check_includes: include/clefrt/clefrt.h does not compile alone:"
  echo "$out"
  status=1
fi
if grep -nE '#include[[:space:]]+"' include/clefrt/clefrt.h; then
  echo "check_includes: the public header includes a project header"
  status=1
fi
[ $status -eq 0 ] && echo "check_includes: ok (faces use the public header only; it compiles alone)"
exit $status

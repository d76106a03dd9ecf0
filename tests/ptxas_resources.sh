#!/usr/bin/env bash
# The CUDA backend's kernels as ptxas compiles them for sm_90 (-Xptxas -v): every kernel keeps no
# stack frame and spills nothing. A per-thread array or a spill lives in local memory, which the
# driver reserves for every resident thread outside any allocator (docs/executor.md), so a kernel
# with a stack would break the device-level prediction on a GPU. Prints each kernel's registers and
# shared memory.
#   tests/ptxas_resources.sh NVCC SOURCE_DIR INCLUDE...
set -u
nvcc=$1 src=$2
shift 2
includes=()
for i in "$@"; do includes+=("-I$i"); done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0 kernels=0
for f in "$src"/executor/cuda/*.cu; do
  if ! "$nvcc" "${includes[@]}" -I"$src" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 \
      -std=c++20 -Xptxas -v -c "$f" -o "$out/k.o" >"$out/log" 2>&1; then
    cat "$out/log"
    echo "FAIL - $(basename "$f") does not compile"
    failures=$((failures + 1))
    continue
  fi
  # ptxas: "Compiling entry function 'NAME'", "Function properties for NAME", then "N bytes
  # stack frame, N bytes spill stores, N bytes spill loads" and "Used N registers, ...";
  # properties of the device functions it calls come in between under their own names.
  python3 - "$(basename "$f")" "$out/log" >"$out/res" <<'PY'
import re, sys
name, log = sys.argv[1], open(sys.argv[2]).read().splitlines()
entry, props, pending = None, None, None
for line in log:
    m = re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?$", line)
    if m and pending:
        print(pending + ", %s registers, %s B static shared" % (m.group(1), m.group(2) or "0"))
        pending = None
        continue
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        entry = m.group(1)
        continue
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        props = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and props == entry and entry:
        short = re.sub(r".*_cu_[0-9a-f]+[0-9]+", "", entry).split("E", 1)[0]
        frame = [int(x) for x in m.groups()]
        pending = "%s %s %s: %d B stack, %d B spill stores, %d B spill loads" % (
            ("ok" if frame == [0, 0, 0] else "FAIL"), name, short, *frame)
if pending:
    print(pending)
PY
  while read -r verdict rest; do
    kernels=$((kernels + 1))
    echo "$verdict - $rest"
    [ "$verdict" = ok ] || failures=$((failures + 1))
  done <"$out/res"
done
echo "# $kernels kernels, $failures failed"
[ "$kernels" -gt 0 ] && [ "$failures" -eq 0 ]

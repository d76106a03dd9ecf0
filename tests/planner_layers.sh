#!/usr/bin/env bash
# planner/check_layers.cmake, the build's check that planner/ includes only go down the data flow
# (inputs < graph < schedule < recompute < report): every layer of the tree passes, and a copy
# with one include going up fails, naming the file, the include and the two layers.
# Usage: bash tests/planner_layers.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
ok() { echo "ok - $1"; }
fail() { failures=$((failures + 1)); echo "FAIL - $1"; }
for layer in inputs graph schedule recompute report; do
  if cmake -DLAYER=$layer -DDIR="$src/planner" -DSTAMP="$tmp/$layer.stamp" \
       -P "$src/planner/check_layers.cmake" >"$tmp/out" 2>&1 && [ -f "$tmp/$layer.stamp" ]; then
    ok "planner/$layer/ includes only its own layer and those below"
  else
    fail "planner/$layer/: $(cat "$tmp/out")"
  fi
done
cp -r "$src/planner" "$tmp/planner"
printf '#include "planner/report/report.hpp"\n' >>"$tmp/planner/graph/ops.cpp"
if cmake -DLAYER=graph -DDIR="$tmp/planner" -DSTAMP="$tmp/bad.stamp" \
     -P "$src/planner/check_layers.cmake" >"$tmp/out" 2>&1; then
  fail "an include from graph up to report passed the check"
elif grep -q 'graph/ops.cpp: #include "planner/report/report.hpp" (graph is below report)' "$tmp/out" &&
     [ ! -f "$tmp/bad.stamp" ]; then
  ok "an include from graph up to report fails the check, named"
else
  fail "the check failed without naming the include: $(cat "$tmp/out")"
fi
printf '#include "planner/nowhere/x.hpp"\n' >"$tmp/planner/inputs/stray.hpp"
if cmake -DLAYER=inputs -DDIR="$tmp/planner" -DSTAMP="$tmp/bad2.stamp" \
     -P "$src/planner/check_layers.cmake" >"$tmp/out" 2>&1; then
  fail "an include of no layer passed the check"
else
  grep -q "not a planner layer" "$tmp/out" && ok "an include of no layer fails the check" ||
    fail "an include of no layer: $(cat "$tmp/out")"
fi
[ "$failures" -eq 0 ]

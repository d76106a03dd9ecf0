#!/usr/bin/env bash
# cmake --install: the installed binary finds the installed catalog without the source tree's
# (a model only the installed catalog has resolves; the build tree's binary does not know it), the
# installed tree still works after it is moved, and the main job runs from it.
# Usage: bash tests/cli_install.sh /path/to/nanoplan /path/to/build-dir
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$1"
BUILD=$2

cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" 2>&1; rc=$?
check "cmake --install exits 0" '[ $rc -eq 0 ] || { cat "$TMP/install.log"; false; }'
check "the binary, the catalogs and the scenarios are installed" \
  '[ -x "$TMP/prefix/bin/nanoplan" ] && [ -f "$TMP/prefix/share/nanoplan/models/llama-3.1-70b.toml" ] && [ -f "$TMP/prefix/share/nanoplan/models/gpus/gpus.toml" ] && [ -f "$TMP/prefix/share/nanoplan/scenarios/tiny-llama.toml" ]'

# A model only the installed catalog has.
sed 's/^name = "llama-2-7b"/name = "installed-only"/; s/^aliases = .*/aliases = []/' \
  "$TMP/prefix/share/nanoplan/models/llama-2-7b.toml" >"$TMP/prefix/share/nanoplan/models/installed-only.toml"
mv "$TMP/prefix" "$TMP/moved"
"$TMP/moved/bin/nanoplan" estimate --model installed-only --format json >"$TMP/inst.json" 2>"$TMP/inst.err"; rc=$?
check "the installed binary reads the installed catalog (after a move)" '[ $rc -eq 0 ] || { cat "$TMP/inst.err"; false; }'
"$NP" estimate --model installed-only >/dev/null 2>&1; rc=$?
check "the build tree's binary reads the source tree's catalog" '[ $rc -eq 2 ]'
"$TMP/moved/bin/nanoplan" estimate --model llama-70b --tp 8 --budget 80GB >"$TMP/main.txt" 2>&1; rc=$?
check "the main job runs from the installed tree" '[ $rc -eq 0 ] && grep -q "^budget 80,000,000,000 bytes" "$TMP/main.txt"'
check "the executor is installed beside the binary" '[ -x "$TMP/moved/bin/nanoplan-executor" ]'
write_tiny_model "$TMP/tiny.toml"
"$TMP/moved/bin/nanoplan" run --model "$TMP/tiny.toml" --seq-len 8 >"$TMP/run.txt" 2>&1; rc=$?
check "run from the installed tree hands over to the installed executor" \
  '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/run.txt"'
if grep -q "^NANOPLAN_HAVE_CUDA_MODULE:INTERNAL=ON" "$BUILD/CMakeCache.txt"; then
  check "the CUDA backend module is installed where the executor looks" \
    '[ -n "$(find "$TMP/moved" -path "*/nanoplan/libnanoplan_cuda.so")" ]'
  "$TMP/moved/bin/nanoplan" run --model "$TMP/tiny.toml" --seq-len 8 --backend cuda >"$TMP/cuda.txt" 2>&1; rc=$?
  check "the installed executor opens the installed module (no GPU here: it says so, exit 2)" \
    '[ $rc -eq 0 ] || { [ $rc -eq 2 ] && grep -q "no GPU" "$TMP/cuda.txt"; }'
fi
finish

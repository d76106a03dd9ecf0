#!/usr/bin/env bash
# Peak memory against measurements others published (tests/data/measured_memory.toml, through
# tools/accuracy.py): every measured rank of every expressible case within [-0.5 %, +2 %] of
# nanoplan's predicted max allocated, the mean |error| at most 1 %, and docs/accuracy.md showing
# the table the data recomputes. Then the megatron profile's Transformer Engine loss, run.
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh" "$@"

python3 "$SRC_DIR/tools/accuracy.py" --nanoplan "$NP" --check >"$TMP/table.md"
rc=$?
check "every expressible published case within the bound" '[ $rc -eq 0 ] && grep -q "mean |error|" "$TMP/table.md"'
python3 - "$TMP/table.md" "$SRC_DIR/docs/accuracy.md" <<'PY'
import sys
table, doc = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if table in doc else 1)
PY
rc=$?
check "docs/accuracy.md shows the table the data recomputes" '[ $rc -eq 0 ]'

write_tiny_model "$TMP/tiny.toml"
# Transformer Engine's cross-entropy: predicted = measured (run exits 1 otherwise), and the same
# losses as Megatron's unfused loss over three steps (the gradients agree too).
for setup in "--tp 1" "--tp 2 --sp on" "--tp 2 --pp 2 --pp-schedule 1f1b --microbatches 2"; do
  "$NP" run --model "$TMP/tiny.toml" --impl megatron --cross-entropy-fusion te --seq-len 16 \
    $setup >"$TMP/run.txt" 2>&1
  check "te loss event-exact: $setup" '[ $? -eq 0 ] && grep -q "predicted = measured" "$TMP/run.txt"'
done
for f in none te; do
  "$NP" run --model "$TMP/tiny.toml" --impl megatron --cross-entropy-fusion $f --seq-len 16 \
    --tp 2 --sp on --steps 3 2>&1 | grep "loss per step" >"$TMP/loss_$f.txt"
done
check "te loss = unfused loss over three steps" 'cmp -s "$TMP/loss_none.txt" "$TMP/loss_te.txt" && [ -s "$TMP/loss_te.txt" ]'
"$NP" estimate --model "$TMP/tiny.toml" --cross-entropy-fusion te >"$TMP/out.txt" 2>&1
rc=$?
check "--cross-entropy-fusion te without --impl megatron: exit 2, one line" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out.txt")" -eq 1 ] && grep -q "needs --impl megatron" "$TMP/out.txt"'
"$NP" estimate --model "$TMP/tiny.toml" --impl megatron --cross-entropy-fusion fused >"$TMP/out.txt" 2>&1
rc=$?
check "--cross-entropy-fusion fused: exit 2 naming the choices" \
  '[ $rc -eq 2 ] && grep -q "none" "$TMP/out.txt" && grep -q "te" "$TMP/out.txt"'
# Setup flags over --megatron-args: a different pp drops the arguments' even split.
"$NP" estimate --model llama-3.1-8b --dp 2 \
  --megatron-args "--pipeline-model-parallel-size 2 --micro-batch-size 1" --pp 4 --microbatches 4 \
  >"$TMP/out.txt" 2>&1
rc=$?
check "--pp over --megatron-args' split: exit 0, 4 stages" '[ $rc -eq 0 ] && grep -q "x pp 4" "$TMP/out.txt"'
finish

#!/usr/bin/env bash
# nanoplan compare: a run's own memory record (tests/data/records/, as Megatron-LM, nanotron and
# torchtitan print it) beside the estimate of the same setup, per rank: the table, the JSON (its
# predictions are the estimate's per stage, its errors 100 (predicted - measured) / measured), and
# bad input refused in one line with nothing on stdout (exit 2).
# Usage: bash tests/cli_compare.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

REC="$SRC_DIR/tests/data/records"
SETUP=(--model llama-3.1-8b --tp 2 --pp 2 --dp 2 --microbatches 2 --pp-schedule 1f1b --seq-len 2048)

"$NP" compare --log "$REC/megatron_report_memory.log" "${SETUP[@]}" >"$TMP/table" 2>"$TMP/err"; rc=$?
check "compare a Megatron log: exit 0, one row per rank that printed" \
  '[ $rc -eq 0 ] && [ $(grep -cE "^ +[0-9]+ +[01] +0 +0 +[01] " "$TMP/table") -eq 4 ]'
check "the table names the line each peak came from, and Megatron's own estimate" \
  'grep -q "megatron_report_memory.log:15 (after 2 iterations)" "$TMP/table" && grep -q "Megatron.s: its own estimate" "$TMP/table"'

"$NP" estimate "${SETUP[@]}" --format json >"$TMP/est.json" 2>/dev/null
"$NP" compare --log "$REC/megatron_report_memory.log" --log "$REC/nanotron_log_memory.log" \
  "${SETUP[@]}" --format json >"$TMP/cmp.json" 2>/dev/null; rc=$?
python3 - "$TMP/cmp.json" "$TMP/est.json" <<'PY' && ok "JSON: the estimate's peaks per stage, the errors, nulls where the record has none" || fail "JSON: the estimate's peaks per stage, the errors, nulls where the record has none"
import json, sys
c, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert c["format"] == "megatron-report-memory,nanotron-log-memory", c["format"]
ranks = c["ranks"]
assert [r["rank"] for r in ranks] == [0, 1, 4, 5, 0], [r["rank"] for r in ranks]
for r in ranks:
    stage = e["ranks"][r["pp_stage"]]
    assert r["predicted"]["peak_bytes"] == stage["allocated_peak_bytes"]
    assert r["predicted"]["reserved_bytes"] == stage["reserved_peak_bytes"]
    m = r["measured"]["max_allocated_bytes"]
    assert abs(r["error_percent"] - 100.0 * (r["predicted"]["peak_bytes"] - m) / m) < 1e-9
assert ranks[3]["pp_stage"] == 1 and ranks[3]["tp_rank"] == 1 and ranks[3]["dp_rank"] == 0
assert ranks[3]["measured"]["device_used_bytes"] == 28000 * 2**20
assert ranks[0]["measured"]["device_used_bytes"] is None
assert ranks[0]["framework_estimate_bytes"] is not None and ranks[3]["framework_estimate_bytes"] is None
assert ranks[4]["context"] == "After train_batch_iter" and ranks[4]["line"] == 9
PY

"$NP" compare --log "$REC/torchtitan_metrics.log" --model llama-3.1-8b --tp 2 --dp 2 --format json >"$TMP/tt.json" 2>/dev/null
python3 - "$TMP/tt.json" <<'PY' && ok "torchtitan: max reserved only, its error; allocated null" || fail "torchtitan: max reserved only, its error; allocated null"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["format"] == "torchtitan-metrics"
for r in c["ranks"]:
    assert r["measured"]["max_allocated_bytes"] is None and r["error_percent"] is None
    assert r["measured"]["max_reserved_bytes"] > 0 and r["reserved_error_percent"] is not None
PY

# docs/compare.md's worked example is what the command prints (run from the source tree).
(cd "$SRC_DIR" && "$NP" compare --log tests/data/records/megatron_report_memory.log "${SETUP[@]}") >"$TMP/example" 2>/dev/null
python3 - "$TMP/example" "$SRC_DIR/docs/compare.md" <<'PY' && ok "docs/compare.md shows the command's output" || fail "docs/compare.md shows the command's output (regenerate it)"
import sys
sys.exit(0 if open(sys.argv[1]).read() in open(sys.argv[2]).read() else 1)
PY

# Bad input: one line naming the file, exit 2, nothing on stdout.
printf 'iteration 1 | lm loss: 1.0\n' >"$TMP/plain.log"
"$NP" compare --log "$TMP/plain.log" "${SETUP[@]}" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "a log with no memory lines: exit 2, one line naming the file and the formats" \
  '[ $rc -eq 2 ] && [ ! -s "$TMP/out" ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "plain.log: no memory lines (valid: Megatron-LM" "$TMP/err"'
"$NP" compare --log "$REC/megatron_report_memory.log" --model llama-3.1-8b --tp 2 --pp 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "a rank beyond the setup's world: exit 2, one line, nothing on stdout" \
  '[ $rc -eq 2 ] && [ ! -s "$TMP/out" ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "rank 4 is beyond the setup" "$TMP/err"'
"$NP" compare --log "$TMP/missing.log" "${SETUP[@]}" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "a missing log: exit 2 naming it" '[ $rc -eq 2 ] && grep -q "cannot read log .*missing.log" "$TMP/err"'
"$NP" compare "${SETUP[@]}" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "no --log: exit 2 naming it" '[ $rc -eq 2 ] && grep -q -- "--log" "$TMP/err"'
finish

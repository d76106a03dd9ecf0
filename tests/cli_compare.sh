#!/usr/bin/env bash
# nanoplan compare: a run's own memory record (tests/data/records/: logs as Megatron-LM, nanotron
# and torchtitan print them, nanotron's benchmark CSV, a PyTorch memory snapshot) beside the
# estimate of the same setup, per rank: the table, the JSON (its predictions are the estimate's per
# stage, its errors 100 (predicted - measured) / measured), a snapshot's live blocks beside the
# predicted live set, run --record read back, and bad input refused in one line with nothing on
# stdout (exit 2).
# Usage: bash tests/cli_compare.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

REC="$SRC_DIR/tests/data/records"
SETUP=(--model llama-3.1-8b --tp 2 --pp 2 --dp 2 --microbatches 2 --pp-schedule 1f1b --seq-len 2048)

# refused NAME PATTERN ARGS...: nanoplan ARGS exits 2 with one line on stderr matching PATTERN
# (grep -E) and nothing on stdout.
refused() {
  local name="$1" pattern="$2"
  shift 2
  "$NP" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  check "$name" '[ '$rc' -eq 2 ] && [ ! -s "$TMP/out" ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -qE -- "'"$pattern"'" "$TMP/err"'
}

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

# A PyTorch memory snapshot (rank 0's, written by tests/data/records/make_records.py): the
# fixtures are that script's output, the measured peak and its live blocks are what the
# script's allocator counted (an account kept apart from the trace the reader walks back), and
# the live blocks sit beside the predicted live set by size.
python3 "$REC/make_records.py" "$TMP" >/dev/null 2>&1 &&
  cmp -s "$TMP/000000_step_1.pickle" "$REC/000000_step_1.pickle" &&
  cmp -s "$TMP/nanotron_benchmark.csv" "$REC/nanotron_benchmark.csv"; rc=$?
check "the snapshot and CSV fixtures are make_records.py's output" '[ $rc -eq 0 ]'
"$NP" compare --log "$REC/000000_step_1.pickle" "${SETUP[@]}" --format json >"$TMP/snap.json" 2>"$TMP/err"; rc=$?
python3 - "$TMP/snap.json" "$REC" "$TMP/est.json" <<'PY' && ok "snapshot JSON: the script's own peak, its live blocks by size, the prediction's live set" || fail "snapshot JSON: the script's own peak, its live blocks by size, the prediction's live set"
import collections, json, sys
c = json.load(open(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
import make_records
a = make_records.snapshot()
assert c["format"] == "pytorch-memory-snapshot", c["format"]
[r] = c["ranks"]
assert (r["rank"], r["pp_stage"], r["tp_rank"], r["dp_rank"]) == (0, 0, 0, 0)
assert r["measured"]["max_allocated_bytes"] == a.max_allocated, (r["measured"], a.max_allocated)
assert r["measured"]["max_reserved_bytes"] == a.max_reserved
live = {l["block_bytes"]: l for l in r["live_at_peak"]}
counts = collections.Counter(a.live_at_peak)
assert {b: l["measured"] for b, l in live.items() if l["measured"]} == dict(counts)
assert live[32 << 20]["measured"] == 1 and live[32 << 20]["predicted"] == 2
assert "cuBLAS workspaces" in live[32 << 20]["predicted_tensors"]
assert live[256 << 10]["measured"] == 34 and live[128 << 10]["predicted"] == 34
assert r["predicted_peak_at"] == json.load(open(sys.argv[3]))["ranks"][0]["peak_at"]
assert r["line"] is None  # a snapshot has no lines
PY
"$NP" compare --log "$REC/000000_step_1.pickle" "${SETUP[@]}" >"$TMP/snap" 2>/dev/null
check "snapshot table: the live blocks beside the predicted tensors, and what each side has alone" \
  'grep -q "blocks live at the measured allocated peak (trace entry" "$TMP/snap" && grep -qE "^ +32\.000 +1 +2  cuBLAS workspaces x2" "$TMP/snap" && grep -q "measured only .* GiB (the prediction misses); predicted only" "$TMP/snap"'

# nanotron's benchmark CSV: the row that ran the setup; none that did is bad input.
"$NP" compare --log "$REC/nanotron_benchmark.csv" "${SETUP[@]}" >"$TMP/csv" 2>"$TMP/err"; rc=$?
check "benchmark CSV: the setup's row (rank 0), with its run named" \
  '[ $rc -eq 0 ] && [ $(grep -cE "^ +0 +0 +0 +0 +0 +42\.870 " "$TMP/csv") -eq 1 ] && grep -q "nanotron_benchmark.csv:2 run llama8b, tp2 pp2 dp2 (job 14001)" "$TMP/csv"'
refused "a CSV with no row of the setup: exit 2, one line listing its rows' setups" \
  "no row ran the setup.s dp 1 pp 2 tp 4 cp 1 \(its rows: line 2: dp 2 pp 2 tp 2 cp 1" \
  compare --log "$REC/nanotron_benchmark.csv" --model llama-3.1-8b --tp 4 --pp 2

# run --record: the executor's own record (Megatron's report_memory form), read back by compare
# with the figures the run measured, both allocator models; bad --record refused before the run.
write_tiny_model "$TMP/tiny.toml"
TINY=(--model "$TMP/tiny.toml" --tp 2 --pp 2 --dp 2 --seq-len 8 --micro-batch 2 --microbatches 2 --pp-schedule 1f1b)
for alloc in caching exact; do
  "$NP" run "${TINY[@]}" --steps 2 --allocator "$alloc" --record "$TMP/rec_$alloc.log" --format json \
    >"$TMP/run_$alloc.json" 2>"$TMP/err"; rc=$?
  "$NP" compare --log "$TMP/rec_$alloc.log" "${TINY[@]}" --allocator "$alloc" --format json \
    >"$TMP/cmp_$alloc.json" 2>>"$TMP/err"; rc2=$?
  python3 - "$TMP/run_$alloc.json" "$TMP/cmp_$alloc.json" "$alloc" <<'PY' && [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && ok "run --record ($alloc): compare reads back every rank's measured figures" || fail "run --record ($alloc): compare reads back every rank's measured figures"
import json, sys
run, cmp, alloc = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
assert cmp["format"] == "megatron-report-memory"
by = {r["rank"]: r for r in cmp["ranks"]}
assert sorted(by) == list(range(8)), sorted(by)
for r in run["ranks"]:
    c = by[r["rank"]]
    assert (c["pp_stage"], c["dp_rank"], c["tp_rank"]) == (r["pp_stage"], r["dp_rank"], r["tp_rank"])
    allocated = r["measured_allocated_blocks_bytes"] if alloc == "caching" else r["measured_peak_bytes"]
    reserved = r["measured_reserved_bytes"] if alloc == "caching" else r["measured_peak_bytes"]
    assert c["measured"]["max_allocated_bytes"] == allocated, (c["measured"], allocated)
    assert c["measured"]["max_reserved_bytes"] == reserved, (c["measured"], reserved)
    assert c["context"] == "(after 2 iterations)"
PY
done
refused "run --record to a path that cannot be written: exit 2 before the run, nothing written" \
  "cannot write --record" run "${TINY[@]}" --record "$TMP/no/such/dir/rec.log"

# docs/compare.md's worked examples are what the command prints (run from the source tree).
for log in megatron_report_memory.log 000000_step_1.pickle; do
  (cd "$SRC_DIR" && "$NP" compare --log "tests/data/records/$log" "${SETUP[@]}") >"$TMP/example" 2>/dev/null
  python3 - "$TMP/example" "$SRC_DIR/docs/compare.md" <<'PY' && ok "docs/compare.md shows the command's output ($log)" || fail "docs/compare.md shows the command's output ($log; regenerate it)"
import sys
sys.exit(0 if open(sys.argv[1]).read() in open(sys.argv[2]).read() else 1)
PY
done

# Bad input: one line naming the file, exit 2, nothing on stdout.
printf 'iteration 1 | lm loss: 1.0\n' >"$TMP/plain.log"
refused "a log with no memory lines: exit 2, one line naming the file and the formats" \
  "plain.log: no memory lines \(valid: Megatron-LM" compare --log "$TMP/plain.log" "${SETUP[@]}"
refused "a rank beyond the setup's world: exit 2, one line, nothing on stdout" \
  "rank 4 is beyond the setup" \
  compare --log "$REC/megatron_report_memory.log" --model llama-3.1-8b --tp 2 --pp 2
head -c 4000 "$REC/000000_step_1.pickle" >"$TMP/cut.pickle"
refused "a truncated snapshot: exit 2, one line naming it, nothing on stdout" \
  "cut.pickle: not a readable pickle: .*truncated" compare --log "$TMP/cut.pickle" "${SETUP[@]}"
python3 -c 'import pickle, sys; sys.stdout.buffer.write(pickle.dumps(__import__("os").system, protocol=4))' >"$TMP/evil.pickle"
refused "a pickle that names a Python function: exit 2, one line, nothing run" \
  "evil.pickle: not a readable pickle" compare --log "$TMP/evil.pickle" "${SETUP[@]}"
"$NP" compare --log "$TMP/missing.log" "${SETUP[@]}" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "a missing log: exit 2 naming it" '[ $rc -eq 2 ] && grep -q "cannot read log .*missing.log" "$TMP/err"'
"$NP" compare "${SETUP[@]}" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "no --log: exit 2 naming it" '[ $rc -eq 2 ] && grep -q -- "--log" "$TMP/err"'
finish

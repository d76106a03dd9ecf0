#!/usr/bin/env bash
# nanoplan run: plan -> execute on the CPU reference -> predicted vs measured, through the CLI,
# and its bad inputs (exit 2), a tampered plan (caught by --check-plan, tensor named) and an
# enforced budget (exit 3 with the tensor, its size and the bytes in use).
# Usage: bash tests/cli_run.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

cat >"$TMP/tiny.toml" <<'TOML'
name = "tiny"
hidden_size = 24
intermediate_size = 20
num_layers = 2
num_heads = 4
num_kv_heads = 2
vocab_size = 30
max_position_embeddings = 32
TOML
SETUP=(--model "$TMP/tiny.toml" --tp 2 --pp 2 --seq-len 8 --micro-batch 2 --microbatches 2 --pp-schedule 1f1b)

"$NP" plan "${SETUP[@]}" --recompute full -o "$TMP/plan.json" 2>/dev/null
check "plan written" '[ -s "$TMP/plan.json" ]'

"$NP" run "$TMP/plan.json" --steps 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run plan.json exits 0" '[ $rc -eq 0 ]'
check "run says predicted = measured" 'grep -q "predicted = measured on every rank" "$TMP/out"'
check "run prints one row per rank" '[ $(grep -cE "^ +[0-3] +[01] +[01] " "$TMP/out") -eq 4 ]'

"$NP" run "$TMP/plan.json" --format json >"$TMP/run.json" 2>/dev/null; rc=$?
check "run --format json exits 0" '[ $rc -eq 0 ]'
python3 - "$TMP/run.json" <<'PY' && ok "run JSON keys and zero differences" || fail "run JSON keys and zero differences"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["steps"] == 1 and isinstance(j["loss"], float)
assert len(j["ranks"]) == 4
for r in j["ranks"]:
    for k in ("rank", "predicted_peak_bytes", "measured_peak_bytes"): assert k in r, k
    assert r["predicted_peak_bytes"] == r["measured_peak_bytes"] > 0
PY

"$NP" run "${SETUP[@]}" --recompute selective --attention eager >"$TMP/out2" 2>&1; rc=$?
check "run --model plans in-process" '[ $rc -eq 0 ] && grep -q "predicted = measured" "$TMP/out2"'

# Layers per stage: given counts reach the plan file and the executor; auto plans and runs.
sed 's/num_layers = 2/num_layers = 6/' "$TMP/tiny.toml" >"$TMP/tiny6.toml"
SPLIT=(--model "$TMP/tiny6.toml" --tp 2 --pp 3 --seq-len 8 --micro-batch 2 --microbatches 3 --pp-schedule 1f1b)
"$NP" plan "${SPLIT[@]}" --partition 3,2,1 -o "$TMP/split.json" 2>/dev/null
check "plan --partition 3,2,1 records the split" \
  'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j[\"setup\"][\"stage_layers\"] == [3, 2, 1]" "$TMP/split.json"'
"$NP" run "$TMP/split.json" >"$TMP/out7" 2>&1; rc=$?
check "run an uneven split: predicted = measured" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out7"'
"$NP" run "${SPLIT[@]}" --budget 1GiB --partition auto >"$TMP/out8" 2>&1; rc=$?
check "run --partition auto with a budget" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out8"'

# Optimizers and gradient-accumulation dtypes other than the default AdamW + fp32.
for opt in "--optimizer sgd" "--optimizer none" "--grad-accum-dtype bf16" \
  "--optimizer sgd --grad-accum-dtype bf16"; do
  # shellcheck disable=SC2086  # $opt is two or four words on purpose
  "$NP" run "${SETUP[@]}" $opt >"$TMP/out9" 2>&1; rc=$?
  check "run $opt: predicted = measured" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out9"'
done

"$NP" run --scenario "$SRC_DIR/scenarios/tiny-moe.toml" >"$TMP/out3" 2>&1; rc=$?
check "run --scenario passes its matrix" '[ $rc -eq 0 ] && grep -q "0 of [0-9]* setups failed" "$TMP/out3"'

"$NP" run "$TMP/plan.json" --check-plan >"$TMP/out4" 2>&1; rc=$?
check "--check-plan accepts a good plan" '[ $rc -eq 0 ] && grep -q "plan OK" "$TMP/out4"'

# Bad input: exit 2, one line.
bad() {
  local desc=$1 want=$2; shift 2
  "$NP" "$@" >"$TMP/bo" 2>"$TMP/be"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/be")" -eq 1 ] && grep -q -- "$want" "$TMP/be" && [ ! -s "$TMP/bo" ]; then ok "$desc"
  else fail "$desc: rc $rc, stderr: $(cat "$TMP/be")"; fi
}
python3 - "$TMP/plan.json" "$TMP/v2.json" <<'PY'
import json, sys; j = json.load(open(sys.argv[1])); j["format_version"] = 2; json.dump(j, open(sys.argv[2], "w"))
PY
bad "plan of another format version" "format version 2 is not supported" run "$TMP/v2.json"
bad "plan made for another model" "was made for model tiny" run "$TMP/plan.json" --model llama-3.1-8b
sed 's/hidden_size = 24/hidden_size = 32/' "$TMP/tiny.toml" >"$TMP/tiny32.toml"
bad "plan made for a different model of the same name" "was made for a different tiny: its" run "$TMP/plan.json" --model "$TMP/tiny32.toml"
bad "setup flags conflict with a plan" "conflicts with a plan file" run "$TMP/plan.json" --tp 4
bad "no source" "exactly one of" run
bad "unknown backend" "valid: cpu" run "$TMP/plan.json" --backend tpu
bad "missing plan file" "cannot read plan" run "$TMP/nope.json"
bad "dp > 1 on the CPU executor" "dp = 1" run "${SETUP[@]}" --dp 2
printf '{"format": "nanoplan-schedule",\n "format_version": 1,\n oops}\n' >"$TMP/broken.json"
bad "malformed plan JSON names the line" "broken.json:3" run "$TMP/broken.json"

# A tampered plan: drop a tensor the backward reads from a layer's kept set (recompute none).
"$NP" plan "${SETUP[@]}" -o "$TMP/none.json" 2>/dev/null
python3 - "$TMP/none.json" "$TMP/tampered.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
blk = j["stages"][0]["blocks"][1]
blk["kept_tensors"].remove("mlp.swiglu")
json.dump(j, open(sys.argv[2], "w"))
PY
bad "tampered plan caught by --check-plan, tensor named" "mlp.swiglu, which was neither kept nor recomputed" run "$TMP/tampered.json" --check-plan
bad "tampered plan refused before running" "neither kept nor recomputed" run "$TMP/tampered.json"

# A plan whose byte counts are wrong (the executor never reads them): the run still completes, the
# prediction no longer matches, and the output puts the two live sets side by side; exit 1.
python3 - "$TMP/plan.json" "$TMP/wrong.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for t in j["stages"][0]["tensors"]:
    if t["kind"] == "static" and t["category"] == "weights":
        t["bytes"] += 1000
        break
json.dump(j, open(sys.argv[2], "w"))
PY
"$NP" run "$TMP/wrong.json" >"$TMP/o6" 2>&1; rc=$?
check "a wrong prediction exits 1" '[ $rc -eq 1 ]'
check "a wrong prediction is reported" 'grep -q "PREDICTED != MEASURED" "$TMP/o6" && grep -q "live at the predicted peak" "$TMP/o6" && grep -qE "^ +[01] +0 +[01] .* +-1,000 " "$TMP/o6"'

# Enforced budget: one byte under the measured peak stops the run, exit 3.
peak=$(python3 -c "import json; print(max(r['measured_peak_bytes'] for r in json.load(open('$TMP/run.json'))['ranks']))")
"$NP" run "$TMP/plan.json" --enforce-budget $((peak - 1)) >"$TMP/o5" 2>"$TMP/e5"; rc=$?
check "over the enforced budget exits 3" '[ $rc -eq 3 ]'
check "the OOM line names tensor, size and bytes in use" 'grep -qE "out of memory: allocating .+ \([0-9,]+ bytes\) with [0-9,]+ bytes in use would exceed the budget of [0-9,]+ bytes" "$TMP/e5"'
"$NP" run "$TMP/plan.json" --enforce-budget "$peak" >/dev/null 2>&1; rc=$?
check "at exactly the peak the run completes" '[ $rc -eq 0 ]'

finish

#!/usr/bin/env bash
# nanoplan run: plan -> execute on the CPU reference -> predicted vs measured, through the CLI,
# its bad inputs (exit 2), edited plans (refused with the plan's path, exit 2; a moved free found
# by the event-exact comparison, exit 1) and an enforced budget (exit 3 with the tensor, its size
# and the bytes in use).
# Usage: bash tests/cli_run.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

write_tiny_model "$TMP/tiny.toml"
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

# The caching allocator (the default): each rank's reserved bytes, measured where its segments
# come from the backend's memory, equal the predicted events' replay over the steps run, with
# expandable segments too; exact reports none.
for steps in 1 3; do
  "$NP" run "$TMP/plan.json" --steps $steps --format json >"$TMP/res.json" 2>/dev/null; rc=$?
  python3 - "$TMP/res.json" <<'PY' && ok "caching allocator: reserved predicted = measured, $steps step(s)" || fail "caching allocator: reserved predicted = measured, $steps step(s)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["predicted_equals_measured"]
for r in j["ranks"]:
    assert r["predicted_reserved_bytes"] == r["measured_reserved_bytes"] > 0, r
    assert r["measured_reserved_bytes"] >= r["measured_allocated_blocks_bytes"] >= r["measured_peak_bytes"]
    assert r["predicted_allocated_blocks_bytes"] == r["measured_allocated_blocks_bytes"]
PY
done
"$NP" run "$TMP/plan.json" --allocator exact --format json >"$TMP/exact.json" 2>/dev/null
check "run --allocator exact: no reserved figures" \
  '! grep -q reserved_bytes "$TMP/exact.json" && grep -q "\"predicted_equals_measured\": true" "$TMP/exact.json"'
"$NP" run "$TMP/plan.json" --allocator caching >"$TMP/out3" 2>&1
check "run table: the reserved line" 'grep -q "reserved (caching allocator): predicted" "$TMP/out3"'
"$NP" run "$TMP/plan.json" --allocator expandable --steps 2 --format json >"$TMP/exp.json" 2>/dev/null
python3 - "$TMP/exp.json" "$TMP/res.json" <<'PY' && ok "expandable segments: reserved predicted = measured" || fail "expandable segments: reserved predicted = measured"
import json, sys
j, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert j["predicted_equals_measured"]
for r in j["ranks"]:
    assert r["predicted_reserved_bytes"] == r["measured_reserved_bytes"] > 0, r
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

# The interleaved schedule: 4 layers over pp 2 x 2 chunks; the plan records the chunk of every
# block; the run is event-exact, and under mpirun (tests/cli_mpi.sh) too.
sed 's/num_layers = 2/num_layers = 4/' "$TMP/tiny.toml" >"$TMP/tiny4.toml"
INTER=(--model "$TMP/tiny4.toml" --tp 2 --pp 2 --seq-len 8 --micro-batch 2 --microbatches 4 --pp-schedule interleaved --virtual-stages 2)
"$NP" plan "${INTER[@]}" --recompute selective -o "$TMP/inter.json" 2>/dev/null
check "plan interleaved records chunks" \
  'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j[\"setup\"][\"virtual_stages\"] == 2; b=j[\"stages\"][0][\"blocks\"]; assert [x[\"chunk\"] for x in b] == [0, 0, 1] and [x[\"layer\"] for x in b] == [-1, 0, 2], b" "$TMP/inter.json"'
"$NP" run "$TMP/inter.json" --steps 2 >"$TMP/out10" 2>&1; rc=$?
check "run an interleaved plan: predicted = measured" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out10"'
"$NP" run "$TMP/inter.json" --check-plan >"$TMP/out11" 2>&1; rc=$?
check "--check-plan accepts an interleaved plan" '[ $rc -eq 0 ] && grep -q "plan OK" "$TMP/out11"'
"$NP" estimate "${INTER[@]}" --format json >"$TMP/inter_est.json" 2>/dev/null
check "estimate JSON: chunk passes in flight (2 (pp - 1) + (v - 1) pp + 1 = 5 on stage 0)" \
  'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); s=j[\"ranks\"]; assert s[0][\"in_flight_chunk_passes\"] == 5 and s[1][\"in_flight_chunk_passes\"] == 3 and s[0][\"layer_ranges\"] == \"0,2\", s" "$TMP/inter_est.json"'

# Data parallelism: replicas as threads; each runs its share of the micro-batches (the same tokens
# as one replica running them all), gradients all-reduced (ZeRO-0) or reduce-scattered with the
# optimizer states sharded and the new weights all-gathered (ZeRO-1).
DP=(--model "$TMP/tiny.toml" --seq-len 8 --micro-batch 2 --pp-schedule 1f1b --steps 3)
"$NP" run "${DP[@]}" --pp 2 --microbatches 4 >"$TMP/dp1" 2>&1
for z in 0 1 2 3; do
  pp=2
  [ $z -ge 2 ] && pp=1  # ZeRO-2/3 without pipelining
  "$NP" run "${DP[@]}" --pp $pp --microbatches 2 --dp 2 --zero $z >"$TMP/dp2z$z" 2>&1; rc=$?
  check "run --dp 2 --zero $z: predicted = measured on $((2 * pp)) ranks" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/dp2z$z" && [ "$(grep -cE "^ +[0-3] +[01] +[01] +0 " "$TMP/dp2z$z")" -eq $((2 * pp)) ]'
  check "run --dp 2 --zero $z: the losses of one replica with twice the micro-batches" \
    'python3 - "$TMP/dp1" "$TMP/dp2z$z" <<PY
import re, sys
def losses(p): return [float(x) for x in re.search(r"loss per step: (.*)", open(p).read()).group(1).split()]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 3 and all(abs(x - y) <= 1e-3 * abs(x) for x, y in zip(a, b)), (a, b)
PY'
done

# Context parallelism: each sequence over 2 ranks, K/V exchanged in attention; the first step's
# loss is the one-rank loss (the same tokens and positions), later ones within bf16 rounding.
"$NP" run "${DP[@]}" --microbatches 2 --tp 2 >"$TMP/cp1" 2>&1
"$NP" run "${DP[@]}" --microbatches 2 --tp 2 --cp 2 >"$TMP/cp2" 2>&1; rc=$?
check "run --cp 2: predicted = measured on 4 ranks" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/cp2" && [ "$(grep -cE "^ +[0-3] +0 +0 +[01] +[01] " "$TMP/cp2")" -eq 4 ]'
check "run --cp 2: the losses of cp 1" \
  'python3 - "$TMP/cp1" "$TMP/cp2" <<PY
import re, sys
def losses(p): return [float(x) for x in re.search(r"loss per step: (.*)", open(p).read()).group(1).split()]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 3 and a[0] == b[0] and all(abs(x - y) <= 1e-3 * abs(x) for x, y in zip(a, b)), (a, b)
PY'

# Optimizers and gradient-accumulation dtypes other than the default AdamW + fp32.
for opt in "--optimizer sgd" "--optimizer none" "--grad-accum-dtype bf16" \
  "--optimizer sgd --grad-accum-dtype bf16"; do
  # shellcheck disable=SC2086  # $opt is two or four words on purpose
  "$NP" run "${SETUP[@]}" $opt >"$TMP/out9" 2>&1; rc=$?
  check "run $opt: predicted = measured" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out9"'
done

"$NP" run --scenario "$SRC_DIR/scenarios/tiny-moe.toml" >"$TMP/out3" 2>&1; rc=$?
check "run --scenario passes its matrix" '[ $rc -eq 0 ] && grep -q "0 of [0-9]* setups failed" "$TMP/out3"'
"$NP" run --scenario tiny-moe >"$TMP/out4" 2>&1; rc=$?
check "run --scenario by name, as a model is named" '[ $rc -eq 0 ] && [ "$(grep "setups failed" "$TMP/out3")" = "$(grep "setups failed" "$TMP/out4")" ]'
"$NP" run --scenario tiny-lama >"$TMP/out5" 2>&1; rc=$?
check "an unknown scenario name: exit 2 listing the scenarios" '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out5")" -eq 1 ] && grep -q "valid: tiny-deepseek, tiny-deepseek-lite, tiny-gpt, " "$TMP/out5"'

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
import json, sys; j = json.load(open(sys.argv[1])); j["format_version"] = 1; json.dump(j, open(sys.argv[2], "w"))
PY
bad "plan of another format version" "format version 1 is not supported (this nanoplan reads version 7" run "$TMP/v2.json"
bad "plan made for another model" "was made for model tiny" run "$TMP/plan.json" --model llama-3.1-8b
sed 's/hidden_size = 24/hidden_size = 32/' "$TMP/tiny.toml" >"$TMP/tiny32.toml"
bad "plan made for a different model of the same name" "names model tiny but is not for it: its head_dim is 6, the model's is 8" run "$TMP/plan.json" --model "$TMP/tiny32.toml"
bad "setup flags conflict with a plan" "conflicts with a plan file" run "$TMP/plan.json" --tp 4
bad "no source" "exactly one of" run
bad "unknown backend" "valid: cpu, cuda, auto" run "$TMP/plan.json" --backend tpu
bad "--backend cuda where it cannot run (no GPU here, or a multi-rank plan)" "^nanoplan: error: --backend cuda: " run "$TMP/plan.json" --backend cuda
"$NP" run "$TMP/plan.json" --backend auto >"$TMP/auto.out" 2>&1; rc=$?
check "--backend auto falls back to the CPU executor and says why" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/auto.out" && grep -q "^nanoplan: --backend auto: the CPU executor (" "$TMP/auto.out"'
bad "missing plan file" "cannot read plan" run "$TMP/nope.json"
{ cat "$TMP/tiny.toml"; echo "tie_word_embeddings = true"; } >"$TMP/tied.toml"
bad "ZeRO-2 with tied embeddings in the executor" "without tied embeddings" run --model "$TMP/tied.toml" --seq-len 8 --micro-batch 2 --dp 2 --zero 2
printf '{"format": "nanoplan-schedule",\n "format_version": 3,\n oops}\n' >"$TMP/broken.json"
bad "malformed plan JSON names the line" "broken.json:3" run "$TMP/broken.json"

# Plans that cannot lie: each edit below is refused when the plan is read (exit 2, one line naming
# the plan's path), before anything runs; --check-plan refuses it the same way.
"$NP" plan "${SETUP[@]}" -o "$TMP/none.json" 2>/dev/null
edit() {  # edit NAME PYTHON: $TMP/NAME.json is none.json with PYTHON applied to j (s0: stage 0)
  python3 - "$TMP/none.json" "$TMP/$1.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s0 = j["stages"][0]
def value(suffix):
    return next(t for t in s0["tensors"] if t["kind"] == "value" and t["name"].endswith(suffix))
exec(sys.argv[3])
json.dump(j, open(sys.argv[2], "w"))
PY
}
edit kept 's0["blocks"][1]["kept_tensors"].remove("mlp.swiglu")'
bad "a kept set without a tensor the backward reads: --check-plan" "stages\[0\].blocks\[1\].kept_tensors: mlp.swiglu is missing" run "$TMP/kept.json" --check-plan
bad "a kept set without a tensor the backward reads: run" "stages\[0\].blocks\[1\].kept_tensors: mlp.swiglu is missing" run "$TMP/kept.json"
edit offpeak 'value("L0/mb0/attn.rope")["bytes"] += 8'
bad "an off-peak activation 8 bytes too large" "stages\[0\].tensors\[[0-9]*\].bytes: 776 for L0/mb0/attn.rope, but under the plan's setup (.*) its shape \[16, 24\] bf16 gives 768" run "$TMP/offpeak.json"
edit weight 'next(t for t in s0["tensors"] if t["category"] == "weights")["bytes"] += 1000'
bad "a weight 1,000 bytes too large" "stages\[0\].tensors\[0\].bytes: 1,720 for embed.tokens.weight" run "$TMP/weight.json" --check-plan
edit negative 's0["tensors"][3]["bytes"] = -5'
bad "a negative byte count" "stages\[0\].tensors\[3\].bytes: expected an integer in \[0, 9223372036854775807\], got -5" run "$TMP/negative.json"
edit fraction 's0["tensors"][3]["bytes"] = 576.5'
bad "a fractional byte count" "stages\[0\].tensors\[3\].bytes: expected an integer, got 576.5" run "$TMP/fraction.json"
edit wrap 's0["tensors"][3]["bytes"] = 2**64 + 576'
bad "a byte count past 64 bits" "stages\[0\].tensors\[3\].bytes: expected an integer" run "$TMP/wrap.json"
edit dropfree 's0["program"].pop(next(k for k, x in enumerate(s0["program"]) if x["kind"] == "free"))'
bad "a free dropped" "is never freed" run "$TMP/dropfree.json"
edit tp 'j["setup"]["tp"] = 1; j["setup"]["sp"] = False'
bad "setup.tp edited" "plan: stages\[0\]" run "$TMP/tp.json"
edit tptext 'j["setup"]["tp"] = "two"'
bad "setup.tp as text" 'setup.tp: expected an integer, got "two"' run "$TMP/tptext.json"
edit mbsize 'j["setup"]["micro_batch"] = 1000000'
bad "setup.micro_batch 10^6 (refused, not allocated)" "bytes: 128 for embed/mb0/input_ids, but under the plan's setup (tp 2, sp on, micro_batch 1000000, seq_len 8) its shape \[8000000\] i64 gives 64,000,000" run "$TMP/mbsize.json"
edit layers 'j["model"]["num_layers"] = 3'
bad "model.num_layers edited" "model.parameters is 7,896, but the model's fields give" run "$TMP/layers.json"
edit ranks 's0["ranks"] = [0]'
bad "ranks per stage" "stages\[0\].ranks: setup.dp x setup.tp = 2 ranks per stage" run "$TMP/ranks.json"
edit mbindex 'next(x for x in s0["program"] if x.get("mb") == 1)["mb"] = 7'
bad "a micro-batch index out of range" "stages\[0\].program\[[0-9]*\].mb: 7, but setup.microbatches is 2 (valid: 0..1)" run "$TMP/mbindex.json"
edit catalog 'j["model"]["name"] = "llama-3.1-8b"'
bad "a plan for another model, without --model" "names model llama-3.1-8b but is not for it: its head_dim is 6, the catalog's is 128" run "$TMP/catalog.json"

# Frees are the executor's to place (by its own lifetimes): a free moved later runs, and the
# event-exact comparison reports the first divergence; exit 1.
edit latefree 'p = s0["program"]; i = next(k for k, x in enumerate(p) if x["kind"] == "free"); p.insert(i + 3, p.pop(i))'
"$NP" run "$TMP/latefree.json" >"$TMP/o6" 2>&1; rc=$?
check "a free moved later exits 1" '[ $rc -eq 1 ]'
check "a free moved later: first divergence named, peaks equal" 'grep -q "PREDICTED != MEASURED" "$TMP/o6" && grep -q "first divergence: step 1, event [0-9]*, instruction [0-9]* " "$TMP/o6" && grep -q "measured:  free embed/mb0/embed.tokens" "$TMP/o6" && grep -qE "^ +0 +0 +0 +0 +([0-9,]+) +\1 +0 " "$TMP/o6"'
# Every free moved to the end of the step: the plan's peak grows, the executor's (which frees by
# its own lifetimes) does not, and the two live sets are shown side by side.
edit latefrees 'p = s0["program"]; s0["program"] = [x for x in p if x["kind"] != "free"] + [x for x in p if x["kind"] == "free"]'
"$NP" run "$TMP/latefrees.json" >"$TMP/o7" 2>&1; rc=$?
check "frees at the end of the step exit 1" '[ $rc -eq 1 ]'
check "frees at the end: live sets side by side, measured below predicted" 'grep -q "live at the predicted peak" "$TMP/o7" && grep -qE "^ +0 +0 +0 +0 +[0-9,]+ +[0-9,]+ +-[1-9][0-9,]* " "$TMP/o7"'

# --check-plan is static: a 405B tp 8 pp 16 plan (128 ranks, more than the executor runs).
"$NP" plan --model llama-3.1-405b --tp 8 --pp 16 --budget 80GB -o "$TMP/405b.json" 2>/dev/null
"$NP" run "$TMP/405b.json" --check-plan >"$TMP/o8" 2>&1; rc=$?
check "--check-plan on a 405B tp 8 pp 16 plan" '[ $rc -eq 0 ] && grep -q "plan OK: 16 stage programs," "$TMP/o8"'

# Enforced budget: one byte under the measured peak stops the run, exit 3. Under --allocator
# exact the budget binds on the tensors' bytes; under caching (the default) on what the allocator
# reserves, as PyTorch runs out of memory.
peak=$(python3 -c "import json; print(max(r['measured_peak_bytes'] for r in json.load(open('$TMP/run.json'))['ranks']))")
reserved=$(python3 -c "import json; print(max(r['measured_reserved_bytes'] for r in json.load(open('$TMP/run.json'))['ranks']))")
"$NP" run "$TMP/plan.json" --allocator exact --enforce-budget $((peak - 1)) >"$TMP/o5" 2>"$TMP/e5"; rc=$?
check "over the enforced budget exits 3" '[ $rc -eq 3 ]'
check "the OOM line names tensor, size and bytes in use" 'grep -qE "out of memory: allocating .+ \([0-9,]+ bytes\) with [0-9,]+ bytes in use would exceed the budget of [0-9,]+ bytes" "$TMP/e5"'
"$NP" run "$TMP/plan.json" --allocator exact --enforce-budget "$peak" >/dev/null 2>&1; rc=$?
check "at exactly the peak the run completes" '[ $rc -eq 0 ]'
"$NP" run "$TMP/plan.json" --enforce-budget "$reserved" >/dev/null 2>&1; rc=$?
check "caching: at exactly the reserved peak the run completes" '[ $rc -eq 0 ] && [ "$reserved" -gt "$peak" ]'
"$NP" run "$TMP/plan.json" --enforce-budget $((peak - 1)) >/dev/null 2>"$TMP/e6"; rc=$?
check "caching: under the tensors' peak exits 3, naming the tensor" '[ $rc -eq 3 ] && grep -q "out of memory: allocating" "$TMP/e6"'

# torchao's float8 linears under FSDP2 (every dimension a multiple of 16): the plan carries each
# linear's steps as "step" instructions, reads back, and runs event-exact.
sed -e 's/hidden_size = 24/hidden_size = 32/' -e 's/intermediate_size = 20/intermediate_size = 48/' \
  -e 's/vocab_size = 30/vocab_size = 48/' "$TMP/tiny.toml" >"$TMP/tiny16.toml"
FP8=(--model "$TMP/tiny16.toml" --impl torchtitan --fsdp --dp 2 --seq-len 8 --micro-batch 2 --microbatches 2)
for recipe in tensorwise rowwise; do
  "$NP" plan "${FP8[@]}" --fp8 $recipe --recompute full -o "$TMP/fp8.json" 2>/dev/null; rc=$?
  check "plan --fp8 $recipe: the linears' steps in the plan" \
    '[ $rc -eq 0 ] && grep -Eq "\"kind\": ?\"step\"" "$TMP/fp8.json" && grep -Eq "\"fp8\": ?\"$recipe\"" "$TMP/fp8.json"'
  "$NP" run "$TMP/fp8.json" >"$TMP/fp8.out" 2>&1; rc=$?
  check "run --fp8 $recipe: predicted = measured" \
    '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/fp8.out"'
done

finish

#!/usr/bin/env bash
# The budget planner through the CLI: --recompute auto (the default with a budget), its report and
# JSON, and nanoplan sweep (ranking, JSON, no progress bar when piped, bad input).
# Usage: bash tests/cli_plan.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"
json() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }

S=(--model llama-3.1-8b --tp 2 --pp 2 --pp-schedule 1f1b --microbatches 4 --seq-len 8192)
"$NP" estimate "${S[@]}" --recompute none --format json >"$TMP/none.json"
"$NP" estimate "${S[@]}" --recompute full --format json >"$TMP/full.json"
pn=$(json "$TMP/none.json" 'j["peak_bytes"]'); pf=$(json "$TMP/full.json" 'j["peak_bytes"]')
check "full recompute peaks lower than none" '[ "$pf" -lt "$pn" ]'
mid=$(( (pn + pf) / 2 ))

"$NP" estimate "${S[@]}" --budget "$mid" >"$TMP/auto.txt" 2>&1; rc=$?
check "auto estimate exits 0" '[ $rc -eq 0 ]'
check "auto is the default with a budget" 'grep -q "recompute plan (--recompute auto" "$TMP/auto.txt" && grep -q "recompute auto" "$TMP/auto.txt"'
check "the plan fits and says so" 'grep -q "FITS" "$TMP/auto.txt" && ! grep -q "DOES NOT FIT" "$TMP/auto.txt"'
check "the verdict comes first, right after the setup" '[ "$(grep -n "^verdict: FITS, peak .* per GPU (rank [0-9]*) of .* usable$" "$TMP/auto.txt" | cut -d: -f1)" -lt "$(grep -n "^per-GPU memory" "$TMP/auto.txt" | cut -d: -f1)" ]'
check "per-stage plan lines" '[ $(grep -cE "^  stage [01]: layers" "$TMP/auto.txt") -eq 2 ]'
check "nanotron and Megatron equivalents" 'grep -q "recompute_layer:" "$TMP/auto.txt" && grep -q "Megatron-LM (closest)" "$TMP/auto.txt"'
check "time against recompute_layer: true" 'grep -qE "^  vs recompute_layer: true(, tp_recompute_allgather: (true|false))?: .* the plan is [0-9.]+% faster" "$TMP/auto.txt"'
check "each comparison names its flags" '[ "$(grep -c "^  vs recompute_layer: " "$TMP/auto.txt")" -eq 2 ]'
check "auto's setup line does not claim one all-gather flag" 'grep -q "recompute auto (per layer, and per all-gather" "$TMP/auto.txt" && ! grep -q "recompute auto, tp_recompute_allgather" "$TMP/auto.txt"'
# A plan keeping gathered tensors (70B, tp 8, 80 GB: everything kept) is not Megatron's: its SP
# layers always all-gather again.
"$NP" estimate --model llama-3.1-70b --tp 8 --pp 4 --dp 4 --zero 1 --budget 80GB >"$TMP/keep.txt" 2>&1
check "Megatron: kept all-gathers are named not expressible" 'grep -q "not expressible: the plan keeps 161 of 161 all-gathered tensors" "$TMP/keep.txt"'
check "nanotron: the kept all-gathers are tp_recompute_allgather: false" 'grep -q "tp_recompute_allgather: false" "$TMP/keep.txt"'
check "no planner jargon by default" '! grep -q "minimum cut" "$TMP/auto.txt" && grep -q "(--verbose: the layer options" "$TMP/auto.txt"'
"$NP" estimate "${S[@]}" --budget "$mid" --verbose >"$TMP/autov.txt" 2>&1
check "--verbose: named policies placed on the frontier" 'grep -q "full (nanotron recompute_layer): dominated by option" "$TMP/autov.txt"'

"$NP" estimate "${S[@]}" --budget "$mid" --format json >"$TMP/auto.json"
python3 - "$TMP/auto.json" "$mid" <<'PY' && ok "auto JSON plan keys, peaks within budget, faster than full" || fail "auto JSON plan keys"
import json, sys
j = json.load(open(sys.argv[1])); b = int(sys.argv[2]); p = j["plan"]
assert j["setup"]["recompute"] == "auto" and j["fits"] is True and j["peak_bytes"] <= b
for k in ("recompute_seconds", "step_seconds", "per_stage", "frontier"): assert k in p, k
assert len(p["per_stage"]) == 2
for st in p["per_stage"]:
    assert st["peak_bytes"] <= b
    for l in st["layers"]: assert set(l) >= {"index", "option", "kept_bytes"}
assert sorted(l["index"] for st in p["per_stage"] for l in st["layers"]) == list(range(32))
assert p["step_seconds"] < p["step_seconds_recompute_layer"]
assert p["recompute_seconds"] > 0
PY

"$NP" plan "${S[@]}" --budget "$mid" -o "$TMP/plan.json" 2>"$TMP/plan.err"
check "plan names its two peaks: per GPU, and the plan's tensors that run compares" \
  'grep -qE "peak per GPU .* on rank [0-9]+: the plan.s tensors [0-9.]+ [GM]iB \(what run compares\) \+ runtime overheads [0-9.]+ [GM]iB" "$TMP/plan.err"'
python3 - "$TMP/plan.json" <<'PY' && ok "plan file carries every layer's option" || fail "plan file carries every layer's option"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["setup"]["recompute"] == "auto"
layers = [b for st in j["stages"] for b in st["blocks"] if b["kind"] == "layer"]
assert len(layers) == 32 and all("policy" in b and "recomputed_ops" in b for b in layers)
assert any(b["recomputed_ops"] for b in layers)
PY

"$NP" estimate "${S[@]}" --recompute auto >"$TMP/o" 2>"$TMP/e"; rc=$?
check "auto without a budget is bad input" '[ $rc -eq 2 ] && grep -q "needs a budget" "$TMP/e"'

# Step time for every policy, labelled as the model's; in JSON with its source.
for r in none selective full; do
  "$NP" estimate "${S[@]}" --recompute $r >"$TMP/named.txt" 2>&1
  check "estimate --recompute $r prints its predicted step time" 'grep -qE "^predicted step time \(cost model\) [0-9.]+ s" "$TMP/named.txt" && grep -qF ", on h100-sxm-80gb (the default; --gpu picks another)" "$TMP/named.txt"'
done
"$NP" estimate "${S[@]}" --recompute full --gpu a100 --format json >"$TMP/named.json"
python3 - "$TMP/named.json" <<'PY' && ok "estimate JSON: step_time with its hardware and source" || fail "estimate JSON step_time"
import json, sys
t = json.load(open(sys.argv[1]))["step_time"]
assert t["seconds"] > 0 and 0 < t["mfu"] < t["hfu"] < 1 and t["recompute_seconds"] > 0, t
assert t["hardware"] == "a100-80gb" and "cost model" in t["source"], t
PY

# A plan with many custom options (405B, tp 8 pp 16): short per-stage lines, options spelled out
# once in a legend.
"$NP" estimate --model llama-3.1-405b --tp 8 --pp 16 --gpu h100 --microbatches 32 --pp-schedule 1f1b >"$TMP/405.txt" 2>&1
check "405B plan: 16 stage lines, none over 100 characters" '[ "$(grep -cE "^  stage [0-9]+: layers" "$TMP/405.txt")" -eq 16 ] && [ "$(grep -E "^  stage [0-9]+: layers" "$TMP/405.txt" | awk "length > 100" | wc -l)" -eq 0 ]'
check "405B plan: a legend of the custom options" 'grep -q "^  legend:" "$TMP/405.txt" && grep -qE "^    c1 = re-runs (attn|mlp)\." "$TMP/405.txt"'

# Configs in and out: a nanotron config (flags given too override it), Megatron-LM arguments, and
# the plan's closest config emitted.
CFG="$SRC_DIR/tests/data/nanotron_llama3_8b.yaml"
"$NP" estimate --nanotron-config "$CFG" --gpu h100 >"$TMP/cfg.txt" 2>&1; rc=$?
check "--nanotron-config: the config's setup" '[ $rc -eq 0 ] && grep -q "^setup: tp 2 (sp on) x pp 2 x dp 4 = 16 GPUs; micro-batch 2 x seq 8192, 8 micro-batches per step, 1f1b" "$TMP/cfg.txt" && grep -q "recompute none, tp_recompute_allgather true (the all-gathers re-done in backward are the recompute time below); grads fp32; adamw, ZeRO-1" "$TMP/cfg.txt"'
"$NP" estimate --nanotron-config "$CFG" --gpu h100 --tp 4 --recompute full >"$TMP/cfg4.txt" 2>&1
check "--nanotron-config: flags given override it" 'grep -q "^setup: tp 4 (sp on) x pp 2 x dp 4 = 32 GPUs" "$TMP/cfg4.txt" && grep -q "recompute full" "$TMP/cfg4.txt"'
"$NP" estimate --nanotron-config "$CFG" --gpu h100 --recompute auto --emit nanotron >"$TMP/emit.yaml" 2>&1; rc=$?
check "--emit nanotron: a YAML fragment of the plan" '[ $rc -eq 0 ] && grep -q "^  recompute_layer: " "$TMP/emit.yaml" && grep -q "^  batch_accumulation_per_replica: 8$" "$TMP/emit.yaml" && ! grep -q "per-GPU memory" "$TMP/emit.yaml"'
"$NP" estimate --model llama-3.1-70b --dp 8 --gpu h100 --megatron-args "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 512 --seq-length 4096 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --use-distributed-optimizer" >"$TMP/meg.txt" 2>&1; rc=$?
check "--megatron-args: the arguments' setup" '[ $rc -eq 0 ] && grep -q "^setup: tp 8 (sp on) x pp 4 x dp 8 = 256 GPUs; micro-batch 1 x seq 4096, 64 micro-batches per step, 1f1b" "$TMP/meg.txt" && grep -q "recompute full" "$TMP/meg.txt" && grep -q "ZeRO-1" "$TMP/meg.txt"'
"$NP" estimate --model llama-3.1-70b --dp 8 --gpu h100 --megatron-args "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 512 --seq-length 4096" --recompute auto --emit megatron >"$TMP/emit.flags" 2>&1; rc=$?
check "--emit megatron: one line of flags, then comments" '[ $rc -eq 0 ] && head -1 "$TMP/emit.flags" | grep -q "^--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 512 --seq-length 4096" && [ "$(grep -vc "^#" "$TMP/emit.flags")" -eq 1 ]'

# Sweep.
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 4096 >"$TMP/sw.txt" 2>"$TMP/sw.err"; rc=$?
check "sweep exits 0" '[ $rc -eq 0 ]'
check "sweep ranks setups" 'grep -qE "^ +1 +[0-9]+ +[0-9]+ +[0-9]+ " "$TMP/sw.txt" && grep -q "setups evaluated" "$TMP/sw.txt"'
check "no progress bar when piped" '[ ! -s "$TMP/sw.err" ]'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 4096 --format json --top 50 >"$TMP/sw.json"
python3 - "$TMP/sw.json" <<'PY' && ok "sweep JSON: sorted by throughput, all within budget, gpus add up" || fail "sweep JSON"
import json, sys
j = json.load(open(sys.argv[1])); top = j["top"]
assert len(top) > 3 and j["evaluated"] >= len(top)
tps = [t["tokens_per_second"] for t in top]
assert tps == sorted(tps, reverse=True)
for t in top:
    s = t["setup"]
    assert s["tp"] * s["pp"] * s["dp"] == 8 and t["peak_bytes"] <= j["budget_bytes"] and s["recompute"] == "auto"
PY
# A sweep over expert and context parallelism: every row's command reproduces the row's peak
# and step time (the layer frontier is cached by the layer graph's key, ep and cp in it).
write_tiny_moe "$TMP/moe.toml"
"$NP" sweep --model "$TMP/moe.toml" --gpus 8 --budget 1GiB --seq-len 64 --cp 1,2 --format json \
  --top 40 >"$TMP/swmoe.json" 2>/dev/null
python3 - "$TMP/swmoe.json" "$NP" <<'PY' && ok "sweep over ep and cp: every row's command reproduces its peak and step time, global batch shown" || fail "sweep over ep and cp"
import json, shlex, subprocess, sys
j = json.load(open(sys.argv[1])); top = j["top"]
assert {t["setup"]["ep"] for t in top} >= {1, 2} and {t["setup"]["cp"] for t in top} >= {1, 2}, top
for t in top:
    s = t["setup"]
    assert t["global_batch"] == s["micro_batch"] * s["microbatches"] * s["dp"]
    cmd = shlex.split(t["command"])[1:] + ["--format", "json"]
    e = json.loads(subprocess.run([sys.argv[2]] + cmd, capture_output=True, text=True, check=True).stdout)
    assert e["peak_bytes"] == t["peak_bytes"], (t["command"], e["peak_bytes"], t["peak_bytes"])
    assert abs(e["plan"]["step_seconds"] - t["step_seconds"]) <= 1e-9 * t["step_seconds"], t["command"]
PY
bad() { "$NP" "$@" >"$TMP/bo" 2>"$TMP/be"; local rc=$?; if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/be")" -eq 1 ]; then ok "bad input: $*"; else fail "bad input: $* (rc $rc: $(cat "$TMP/be"))"; fi; }
bad sweep --model llama-3.1-8b --gpus 0 --budget 40GB
bad sweep --model llama-3.1-8b --gpus 8
bad sweep --model llama-3.1-8b --gpus 8 --budget 40XB
bad sweep --model nope --gpus 8 --budget 40GB
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --virtual-stages 1,0
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --virtual-stages two
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --pp-schedule interleaved
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --pp-schedule afab,2f2b
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --format xml
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --ep 1,2
bad sweep --model llama-3.1-8b --gpus 8 --budget 40GB --headroom 60%
bad estimate --nanotron-config "$CFG" --model llama-3.1-8b
# The config's setup runs: a tiny model in the same file layout, executed and compared.
sed -e 's/hidden_size: 4096/hidden_size: 24/; s/intermediate_size: 14336/intermediate_size: 20/' \
    -e 's/num_hidden_layers: 32/num_hidden_layers: 2/; s/num_attention_heads: 32/num_attention_heads: 4/' \
    -e 's/num_key_value_heads: 8/num_key_value_heads: 2/; s/vocab_size: 128256/vocab_size: 30/' \
    -e 's/max_position_embeddings: 8192/max_position_embeddings: 64/; s/sequence_length: 8192/sequence_length: 8/' \
    -e 's/  dp: 4/  dp: 2/; s/batch_accumulation_per_replica: 8/batch_accumulation_per_replica: 2/' \
    "$CFG" >"$TMP/tiny-nanotron.yaml"
"$NP" run --nanotron-config "$TMP/tiny-nanotron.yaml" >"$TMP/cfgrun.txt" 2>&1; rc=$?
check "run --nanotron-config: the config's tp 2 x pp 2 x dp 2 ZeRO-1 setup executes, event-exact" \
  '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/cfgrun.txt" && [ "$(grep -cE "^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ " "$TMP/cfgrun.txt")" -eq 8 ]'
bad estimate --nanotron-config "$TMP/missing.yaml"
bad estimate --nanotron-config "$CFG" --emit deepspeed
bad estimate --model llama-3.1-70b --megatron-args "--num-layers 81"
bad run --model llama-3.1-8b --emit nanotron
bad report --model llama-3.1-8b --emit megatron -o "$TMP/x.html"

# Every row carries the estimate command that reproduces it: the same schedule, plan, step time
# and peak (sweep and estimate share their defaults; the command names every swept flag).
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 4096 --pp-schedule afab,1f1b --top 3 >"$TMP/swc.txt"
check "sweep table: a schedule column and one command per row" \
  '[ "$(grep -c "^       nanoplan estimate --model llama-3.1-8b " "$TMP/swc.txt")" -eq 3 ] && grep -qE "^ *rank +tp +cp +pp +sched " "$TMP/swc.txt"'
check "sweep header: the headroom taken from the budget" 'grep -q "budget 37.25 GiB (40.00 GB) less headroom 1.12 GiB = 36.14 GiB" "$TMP/swc.txt"'
first_cmd=$(grep -m1 "^       nanoplan estimate" "$TMP/swc.txt" | sed 's/^ *nanoplan //')
first_row=$(grep -m1 -E "^ +1 " "$TMP/swc.txt")
# shellcheck disable=SC2086
"$NP" $first_cmd >"$TMP/again.txt" 2>&1
row_step=$(echo "$first_row" | awk '{print $12}')
check "the first row's command gives its step time ($row_step s)" 'grep -q "predicted step time (cost model) $row_step s" "$TMP/again.txt"'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 4096 --pp-schedule afab,1f1b --top 5 --format csv >"$TMP/sw.csv"
python3 - "$TMP/sw.csv" "$TMP/sw.json" <<'PY' && ok "sweep CSV: header, 5 rows, both schedules searched, commands" || fail "sweep CSV"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 5, len(rows)
for r in rows:
    assert r["command"].startswith("nanoplan estimate --model llama-3.1-8b"), r["command"]
    assert int(r["tp"]) * int(r["cp"]) * int(r["pp"]) * int(r["dp"]) == 8
    assert r["recompute"] and float(r["step_seconds"]) > 0
tps = [float(r["tokens_per_second"]) for r in rows]
assert tps == sorted(tps, reverse=True)
j = json.load(open(sys.argv[2]))
assert j["budget_bytes"] == 40000000000 and j["headroom_bytes"] == 1200000000 and j["usable_bytes"] == 38800000000
assert {t["setup"]["pp_schedule"] for t in j["top"] if t["setup"]["pp"] > 1} <= {"afab"}  # the default: estimate's
PY

# Context parallelism: estimate halves a layer's activations at cp 2 and counts the GPUs; the
# sweep tries cp 1 and 2.
"$NP" estimate --model llama-3.1-8b --tp 2 --seq-len 16384 --format json >"$TMP/cp1.json"
"$NP" estimate --model llama-3.1-8b --tp 2 --cp 2 --seq-len 16384 --format json >"$TMP/cp2.json"
python3 - "$TMP/cp1.json" "$TMP/cp2.json" <<'PY' && ok "estimate --cp 2: half the activations, 4 GPUs" || fail "estimate --cp 2"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["setup"]["cp"] == 2 and b["setup"]["gpus"] == 4 and a["setup"]["gpus"] == 2
ra, rb = a["ranks"][0], b["ranks"][0]
assert 2 * rb["activation_bytes"] == ra["activation_bytes"], (ra["activation_bytes"], rb["activation_bytes"])
assert rb["parameter_bytes"] == ra["parameter_bytes"]
PY
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 16384 --pp-schedule 1f1b --cp 1,2 --format json --top 1000 >"$TMP/swcp.json"
python3 - "$TMP/swcp.json" <<'PY' && ok "sweep --cp 1,2: both degrees, GPUs add up" || fail "sweep --cp"
import json, sys
j = json.load(open(sys.argv[1]))
cps = {t["setup"]["cp"] for t in j["top"]}
assert cps == {1, 2}, cps
for t in j["top"]:
    s = t["setup"]; assert s["tp"] * s["cp"] * s["pp"] * s["dp"] == 8
PY

# Virtual stages: the sweep tries the interleaved schedule with 2 chunks beside 1F1B.
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 40GB --seq-len 4096 --pp-schedule 1f1b --virtual-stages 1,2 --format json --top 1000 >"$TMP/swv.json"
python3 - "$TMP/swv.json" "$TMP/sw.json" <<'PY' && ok "sweep --virtual-stages 1,2: interleaved rows beside 1f1b, more setups" || fail "sweep --virtual-stages"
import json, sys
j = json.load(open(sys.argv[1])); base = json.load(open(sys.argv[2]))
kinds = {(t["setup"]["pp_schedule"], t["setup"].get("virtual_stages", 1)) for t in j["top"]}
assert ("interleaved", 2) in kinds and ("1f1b", 1) in kinds, kinds
assert j["evaluated"] > base["evaluated"]
for t in j["top"]:
    s = t["setup"]
    if s["pp_schedule"] == "interleaved": assert s["pp"] > 1 and s["microbatches"] % s["pp"] == 0
PY

finish

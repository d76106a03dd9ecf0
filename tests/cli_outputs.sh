#!/usr/bin/env bash
# What the nanoplan CLI prints on good input: help, the estimate table and JSON, budgets, the
# model catalog, plan files, --explain-peak and model sources (--models-dir, .toml, config.json).
# Usage: bash tests/cli_outputs.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

# run NAME ARGS...: runs nanoplan, stdout in $TMP/NAME.out, stderr in $TMP/NAME.err, exit code in RC.
RC=0
run() {
  local name=$1
  shift
  "$NP" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" </dev/null
  RC=$?
}

snippet() { head -c 400 "$1" | tr '\n' '|'; }

# expect_rc0 DESC NAME: the last run exited 0.
expect_rc0() {
  if [ "$RC" -eq 0 ]; then ok "$1"; else fail "$1: want exit 0, got $RC; stderr: $(snippet "$TMP/$2.err")"; fi
}

# contains DESC FILE SUBSTR...: FILE contains every SUBSTR.
contains() {
  local desc=$1 file=$2 s missing=""
  shift 2
  for s in "$@"; do grep -qF -- "$s" "$file" || missing+="'$s' "; done
  if [ -z "$missing" ]; then ok "$desc"; else fail "$desc: output lacks $missing; got: $(snippet "$file")"; fi
}

# pycheck DESC FILE PYTHON: PYTHON runs with j = the JSON in FILE (and a helper need(cond, what));
# it prints problems, one a line; none means the case passes.
pycheck() {
  local desc=$1 file=$2 code=$3 result
  result=$(python3 -c '
import json, sys
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
try:
    with open(sys.argv[1]) as f:
        j = json.load(f)
except Exception as e:
    print("not valid JSON: %s" % e)
    sys.exit(0)
try:
    exec(sys.argv[2])
except Exception as e:
    problems.append("check raised %s: %s" % (type(e).__name__, e))
print("; ".join(problems))
' "$file" "$code" 2>&1)
  if [ -z "$result" ]; then ok "$desc"; else fail "$desc: $result"; fi
}

# json_value FILE EXPR: prints EXPR evaluated with j = the JSON in FILE (empty on error).
json_value() {
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

# ---- help --------------------------------------------------------------------------------------
run help --help
expect_rc0 "nanoplan --help exits 0" help
contains "nanoplan --help lists the subcommands" "$TMP/help.out" estimate plan models gpus
run version --version
expect_rc0 "nanoplan --version exits 0" version
contains "nanoplan --version names the version and the plan format" "$TMP/version.out" "nanoplan 0." "plan format"
# Each subcommand's help lists the options it takes, and only those.
for sub in plan run report; do run "help_$sub" $sub --help; done
check "plan --help: --emit, no --format" 'grep -q -- "--emit" "$TMP/help_plan.out" && ! grep -q -- "--format" "$TMP/help_plan.out"'
check "run --help: --format, no --emit" 'grep -q -- "--format" "$TMP/help_run.out" && ! grep -q -- "--emit" "$TMP/help_run.out"'
check "report --help: neither --format nor --emit" '! grep -qE -- "--format|--emit" "$TMP/help_report.out"'
run esthelp estimate --help
expect_rc0 "nanoplan estimate --help exits 0" esthelp
contains "nanoplan estimate --help mentions --budget and --model" "$TMP/esthelp.out" --budget --model --gpu
run planhelp plan --help
expect_rc0 "nanoplan plan --help exits 0" planhelp
contains "nanoplan plan --help mentions --output" "$TMP/planhelp.out" --output --budget

# ---- estimate table ----------------------------------------------------------------------------
run t70 estimate --model llama-70b --tp 8 --budget 80GB
expect_rc0 "llama-70b tp 8 on 80GB: exit 0 although it does not fit" t70
contains "llama-70b table names the model, its alias and its parameter count" "$TMP/t70.out" \
  "resolved from 'llama-70b'" "llama-3.1-70b" "70,553,706,496"
contains "llama-70b table says DOES NOT FIT against 80,000,000,000 bytes" "$TMP/t70.out" "DOES NOT FIT" "80,000,000,000"
if grep -qF "nearest setups that fit" "$TMP/t70.out" && grep -qE '^    --[a-z]' "$TMP/t70.out"; then
  ok "llama-70b table lists at least one suggestion"
else
  fail "llama-70b table lists at least one suggestion: no suggestion line; got: $(snippet "$TMP/t70.out")"
fi
if [ ! -s "$TMP/t70.err" ]; then ok "estimate table writes nothing on stderr"; else fail "estimate table writes nothing on stderr: got $(snippet "$TMP/t70.err")"; fi

# ---- estimate JSON -----------------------------------------------------------------------------
run j70 estimate --model llama-70b --tp 8 --budget 80GB --format json
expect_rc0 "llama-70b --format json: exit 0" j70
pycheck "llama-70b JSON: model, setup, budget, verdict" "$TMP/j70.out" '
need(j["model"]["name"] == "llama-3.1-70b", "model.name %r" % j["model"]["name"])
need(j["model"]["parameters"] == 70553706496, "model.parameters %r" % j["model"]["parameters"])
s = j["setup"]
for k in ("tp", "pp", "dp", "sp", "zero", "micro_batch", "seq_len", "microbatches", "recompute"):
    need(k in s, "setup lacks " + k)
need(s.get("tp") == 8 and s.get("pp") == 1 and s.get("dp") == 1, "setup tp/pp/dp %r/%r/%r" % (s.get("tp"), s.get("pp"), s.get("dp")))
need(s.get("sp") is True, "setup.sp %r, want true (auto with tp 8)" % s.get("sp"))
need(s.get("zero") == 0 and s.get("micro_batch") == 1 and s.get("seq_len") == 4096, "setup zero/micro_batch/seq_len")
need(s.get("microbatches") == 1 and s.get("recompute") == "auto", "setup microbatches/recompute (auto is the default with a budget)")
need(j["budget_bytes"] == 80000000000, "budget_bytes %r" % j["budget_bytes"])
need(j["fits"] is False, "fits %r, want false" % j["fits"])
need(isinstance(j["peak_bytes"], int) and j["peak_bytes"] > j["budget_bytes"], "peak_bytes %r not above the budget" % j["peak_bytes"])
need(isinstance(j["peak_rank"], int), "peak_rank %r" % j.get("peak_rank"))
'
pycheck "llama-70b JSON: the auto plan" "$TMP/j70.out" '
p = j["plan"]
for k in ("recompute_seconds", "step_seconds", "per_stage", "fits"):
    need(k in p, "plan lacks " + k)
need(p["fits"] is False and p["step_seconds"] > 0, "plan fits/step_seconds")
need(len(p["per_stage"]) == 1, "per_stage %r" % len(p["per_stage"]))
st = p["per_stage"][0]
need(st["stage"] == 0 and st["peak_bytes"] > j["budget_bytes"] and st["min_peak_bytes"] == st["peak_bytes"], "stage 0 peak / min_peak")
need(len(st["layers"]) == 80 and all(set(l) >= {"index", "option", "kept_bytes"} for l in st["layers"]), "stage 0 layers")
'
pycheck "llama-70b JSON: suggestions each fit the budget" "$TMP/j70.out" '
sg = j["suggestions"]
need(isinstance(sg, list) and len(sg) > 0, "suggestions empty")
for x in sg:
    need(isinstance(x.get("peak_bytes"), int) and x["peak_bytes"] <= j["budget_bytes"], "suggestion %r peak %r above budget" % (x.get("change"), x.get("peak_bytes")))
    need(bool(x.get("change")), "suggestion without a change")
'
pycheck "llama-70b JSON: ranks with the byte breakdown and layers" "$TMP/j70.out" '
ranks = j["ranks"]
need(isinstance(ranks, list) and len(ranks) == 1, "want 1 rank entry for pp 1, got %d" % len(ranks))
keys = ("pp_stage", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "transient_bytes", "overhead_bytes", "peak_bytes", "layers")
for r in ranks:
    for k in keys:
        need(k in r, "rank lacks " + k)
    for k in keys[1:-1]:
        need(isinstance(r.get(k), int) and r[k] >= 0, "rank %s = %r" % (k, r.get(k)))
    need(len(r["layers"]) == 80, "rank has %d layers, want 80" % len(r["layers"]))
    for l in r["layers"]:
        need("index" in l and "policy" in l and "saved_bytes" in l, "layer entry %r" % l)
        need(isinstance(l.get("saved_bytes"), int) and l["saved_bytes"] > 0, "layer saved_bytes %r" % l.get("saved_bytes"))
    parts = sum(r[k] for k in keys[1:7])
    need(r["peak_bytes"] == parts, "rank peak_bytes %d is not the sum of its categories and overheads, %d" % (r["peak_bytes"], parts))
    need(r["activation_bytes"] > 0 and r["optimizer_bytes"] > 0, "rank without activations or optimizer states")
need(j["peak_bytes"] == max(r["peak_bytes"] for r in ranks), "peak_bytes %r != max over ranks" % j["peak_bytes"])
'

# ---- budget spellings --------------------------------------------------------------------------
for spelling in 80GiB 85899345920 "80 GiB" 80gib 85899345920B 0.078125TiB; do
  run budget estimate --model llama-70b --tp 8 --budget "$spelling" --format json
  got=$(json_value "$TMP/budget.out" 'j["budget_bytes"]')
  if [ "$RC" -eq 0 ] && [ "$got" = "85899345920" ]; then
    ok "--budget '$spelling' is 85899345920 bytes"
  else
    fail "--budget '$spelling' is 85899345920 bytes: exit $RC, budget_bytes '$got'; stderr: $(snippet "$TMP/budget.err")"
  fi
done
for spelling in 80GB 80000000000 "80 GB" 0.08TB 80000MB; do
  run budget estimate --model llama-70b --tp 8 --budget "$spelling" --format json
  got=$(json_value "$TMP/budget.out" 'j["budget_bytes"]')
  if [ "$RC" -eq 0 ] && [ "$got" = "80000000000" ]; then
    ok "--budget '$spelling' is 80000000000 bytes"
  else
    fail "--budget '$spelling' is 80000000000 bytes: exit $RC, budget_bytes '$got'; stderr: $(snippet "$TMP/budget.err")"
  fi
done

# ---- --gpu -------------------------------------------------------------------------------------
run gpus gpus
expect_rc0 "nanoplan gpus: exit 0" gpus
for gpu in h100 h200 a100-80gb; do
  canon=$(awk -v g="$gpu" 'NR > 1 { for (i = 5; i <= NF; i++) { a = $i; sub(/,$/, "", a); if (a == g) print $1 } if ($1 == g) print $1 }' "$TMP/gpus.out" | head -1)
  want=$(awk -v g="$canon" 'NR > 1 && $1 == g { gsub(/,/, "", $2); print $2 }' "$TMP/gpus.out")
  run budget estimate --model llama-70b --tp 8 --gpu "$gpu" --format json
  got=$(json_value "$TMP/budget.out" 'j["budget_bytes"]')
  if [ "$RC" -eq 0 ] && [ -n "$want" ] && [ "$got" = "$want" ]; then
    ok "--gpu $gpu budget is the memory_bytes nanoplan gpus prints ($want)"
  else
    fail "--gpu $gpu budget is the memory_bytes nanoplan gpus prints: want '$want' (row '$canon'), got '$got', exit $RC; stderr: $(snippet "$TMP/budget.err")"
  fi
done
run notbudget estimate --model llama-70b --tp 8 --format json
pycheck "no budget: budget_bytes null" "$TMP/notbudget.out" 'need(j["budget_bytes"] is None, "budget_bytes %r" % j["budget_bytes"])'

# ---- a setup that fits -------------------------------------------------------------------------
run t8 estimate --model llama-3.1-8b --tp 8 --budget 80GB
expect_rc0 "llama-3.1-8b tp 8 on 80GB: exit 0" t8
contains "llama-3.1-8b tp 8 table says FITS" "$TMP/t8.out" "FITS"
if grep -qF "DOES NOT FIT" "$TMP/t8.out"; then fail "llama-3.1-8b tp 8 table does not say DOES NOT FIT"; else ok "llama-3.1-8b tp 8 table does not say DOES NOT FIT"; fi
run j8 estimate --model llama-3.1-8b --tp 8 --budget 80GB --format json
pycheck "llama-3.1-8b tp 8 JSON: fits, no suggestions" "$TMP/j8.out" '
need(j["fits"] is True, "fits %r" % j["fits"])
need(j["suggestions"] == [], "suggestions %r" % j["suggestions"])
need(j["peak_bytes"] <= j["budget_bytes"], "peak %r above budget %r" % (j["peak_bytes"], j["budget_bytes"]))
'

# ---- pipeline stages ---------------------------------------------------------------------------
run pp4 estimate --model llama-70b --tp 8 --pp 4 --budget 80GB --format json
expect_rc0 "llama-70b tp 8 pp 4: exit 0" pp4
pycheck "pp 4: four ranks, stages 0..3, layers 0..79 each once" "$TMP/pp4.out" '
ranks = j["ranks"]
need([r["pp_stage"] for r in ranks] == [0, 1, 2, 3], "pp_stages %r" % [r["pp_stage"] for r in ranks])
idx = sorted(l["index"] for r in ranks for l in r["layers"])
need(idx == list(range(80)), "layer indices cover %d entries, %d distinct, range %r..%r" % (len(idx), len(set(idx)), idx[0] if idx else None, idx[-1] if idx else None))
need(j["setup"]["pp"] == 4 and j["setup"]["microbatches"] == 4, "setup pp/microbatches %r/%r" % (j["setup"]["pp"], j["setup"]["microbatches"]))
need(j["peak_bytes"] == max(r["peak_bytes"] for r in ranks), "peak_bytes %r != max over ranks" % j["peak_bytes"])
top = max(ranks, key=lambda r: r["peak_bytes"])
need(j["peak_rank"] == top.get("rank"), "peak_rank %r, the largest peak is on rank %r" % (j["peak_rank"], top.get("rank")))
'
run pp4t estimate --model llama-70b --tp 8 --pp 4 --budget 80GB
contains "pp 4 table has the per-stage table" "$TMP/pp4t.out" "per pipeline stage" "<- peak"

# ---- recompute ---------------------------------------------------------------------------------
run rnone estimate --model llama-70b --tp 8 --recompute none --format json
run rsel estimate --model llama-70b --tp 8 --recompute selective --format json
run rfull estimate --model llama-70b --tp 8 --recompute full --format json
a_none=$(json_value "$TMP/rnone.out" 'j["ranks"][0]["activation_bytes"]')
a_sel=$(json_value "$TMP/rsel.out" 'j["ranks"][0]["activation_bytes"]')
a_full=$(json_value "$TMP/rfull.out" 'j["ranks"][0]["activation_bytes"]')
if [[ $a_none =~ ^[0-9]+$ && $a_full =~ ^[0-9]+$ ]] && [ "$a_full" -lt "$a_none" ]; then
  ok "--recompute full saves fewer activation bytes than none ($a_full < $a_none)"
else
  fail "--recompute full saves fewer activation bytes than none: full '$a_full', none '$a_none'"
fi
if [[ $a_none =~ ^[0-9]+$ && $a_sel =~ ^[0-9]+$ && $a_full =~ ^[0-9]+$ ]] && [ "$a_sel" -le "$a_none" ] && [ "$a_full" -le "$a_sel" ]; then
  ok "--recompute selective lies between full and none ($a_full <= $a_sel <= $a_none)"
else
  fail "--recompute selective lies between full and none: full '$a_full', selective '$a_sel', none '$a_none'"
fi
run enone estimate --model llama-70b --tp 8 --attention eager --recompute none --format json
run esel estimate --model llama-70b --tp 8 --attention eager --recompute selective --format json
e_none=$(json_value "$TMP/enone.out" 'j["ranks"][0]["activation_bytes"]')
e_sel=$(json_value "$TMP/esel.out" 'j["ranks"][0]["activation_bytes"]')
if [[ $e_none =~ ^[0-9]+$ && $e_sel =~ ^[0-9]+$ ]] && [ "$e_sel" -lt "$e_none" ]; then
  ok "eager attention: --recompute selective saves fewer activation bytes than none ($e_sel < $e_none)"
else
  fail "eager attention: --recompute selective saves fewer activation bytes than none: selective '$e_sel', none '$e_none'"
fi
pycheck "--recompute full is reported in setup and layer policies" "$TMP/rfull.out" '
need(j["setup"]["recompute"] == "full", "setup.recompute %r" % j["setup"]["recompute"])
need(all("full" in l["policy"] for l in j["ranks"][0]["layers"]), "layer policies %r" % sorted(set(l["policy"] for l in j["ranks"][0]["layers"])))
'

# ---- models ------------------------------------------------------------------------------------
run models models
expect_rc0 "nanoplan models: exit 0" models
missing=""
nfiles=0
for f in "$SRC_DIR"/models/*.toml; do
  nfiles=$((nfiles + 1))
  stem=$(basename "$f" .toml)
  awk -v s="$stem" 'NR > 1 && $1 == s && $2 ~ /^[0-9][0-9,]*$/ { found = 1 } END { exit !found }' "$TMP/models.out" || missing+="$stem "
done
if [ "$nfiles" -gt 0 ] && [ -z "$missing" ]; then
  ok "nanoplan models lists all $nfiles models/*.toml with a parameter count"
else
  fail "nanoplan models lists all models/*.toml with a parameter count: missing '$missing' ($nfiles files); got: $(snippet "$TMP/models.out")"
fi
rows=$(awk 'NR > 1 && NF > 0' "$TMP/models.out" | wc -l)
if [ "$rows" -eq "$nfiles" ]; then ok "nanoplan models has one row per file ($rows)"; else fail "nanoplan models has one row per file: $rows rows, $nfiles files"; fi
contains "nanoplan models shows llama-3.1-70b's 70,553,706,496" "$TMP/models.out" "70,553,706,496" "llama-70b"

# ---- plan --------------------------------------------------------------------------------------
PLAN=(plan --model llama-3.1-8b --tp 2 --pp 2 --pp-schedule 1f1b --microbatches 2)
run plan "${PLAN[@]}" -o "$TMP/plan.json"
expect_rc0 "plan -o: exit 0" plan
if [ -f "$TMP/plan.json" ] && [ ! -e "$TMP/plan.json.tmp" ]; then ok "plan -o wrote the file and no .tmp"; else fail "plan -o wrote the file and no .tmp: $(ls "$TMP")"; fi
if [ ! -s "$TMP/plan.out" ]; then ok "plan -o prints nothing on stdout"; else fail "plan -o prints nothing on stdout: got $(snippet "$TMP/plan.out")"; fi
contains "plan -o reports the file on stderr" "$TMP/plan.err" "$TMP/plan.json"
pycheck "plan file: format_version, setup tp 2 pp 2, two stages with programs" "$TMP/plan.json" '
need("format_version" in j and isinstance(j["format_version"], int), "format_version %r" % j.get("format_version"))
s = j["setup"]
need(s["tp"] == 2 and s["pp"] == 2, "setup tp/pp %r/%r" % (s["tp"], s["pp"]))
need(s["pp_schedule"] == "1f1b" and s["microbatches"] == 2, "setup schedule %r microbatches %r" % (s["pp_schedule"], s["microbatches"]))
st = j["stages"]
need(len(st) == 2, "%d stages" % len(st))
need([x["pp_stage"] for x in st] == [0, 1], "pp_stage %r" % [x["pp_stage"] for x in st])
for x in st:
    need(isinstance(x["program"], list) and len(x["program"]) > 0, "stage %r has an empty program" % x["pp_stage"])
    need(all("kind" in i for i in x["program"]), "stage %r has instructions without kind" % x["pp_stage"])
'
run planstdout "${PLAN[@]}"
expect_rc0 "plan to stdout: exit 0" planstdout
if cmp -s "$TMP/plan.json" "$TMP/planstdout.out"; then
  ok "plan to stdout prints the same JSON as the -o file"
else
  fail "plan to stdout prints the same JSON as the -o file: they differ ($(wc -c <"$TMP/plan.json") vs $(wc -c <"$TMP/planstdout.out") bytes)"
fi
run plandash "${PLAN[@]}" -o -
if [ "$RC" -eq 0 ] && cmp -s "$TMP/plan.json" "$TMP/plandash.out"; then ok "plan -o - prints the same JSON"; else fail "plan -o - prints the same JSON: exit $RC"; fi

# ---- --explain-peak ----------------------------------------------------------------------------
run explain estimate --model llama-70b --tp 8 --budget 80GB --explain-peak
expect_rc0 "--explain-peak: exit 0" explain
contains "--explain-peak groups the live tensors" "$TMP/explain.out" "by category and block, largest first"
# Grouped: one line per category (at most 5), not one per tensor; --verbose adds every tensor.
groups=$(sed -n '/^live at the peak/,/^$/p' "$TMP/explain.out" | grep -cE "^  (weights|gradients|optimizer|activations|transient) ")
if [ "$groups" -ge 3 ] && [ "$groups" -le 5 ]; then ok "--explain-peak: $groups category lines"; else fail "--explain-peak: $groups category lines (want 3-5)"; fi
if grep -qF "every tensor, largest first" "$TMP/explain.out"; then fail "--explain-peak without --verbose lists every tensor"; else ok "--explain-peak without --verbose: groups only"; fi
run explainv estimate --model llama-70b --tp 8 --budget 80GB --explain-peak --verbose
if [ "$(grep -c "^    weights " "$TMP/explainv.out")" -gt 100 ]; then ok "--explain-peak --verbose lists every tensor"; else fail "--explain-peak --verbose lists every tensor"; fi
run explainj estimate --model llama-70b --tp 8 --budget 80GB --explain-peak --format json
pycheck "--explain-peak JSON has live_at_peak on the peak rank" "$TMP/explainj.out" '
r = [x for x in j["ranks"] if x["pp_stage"] == j["peak_stage"]][0]
live = r.get("live_at_peak", [])
need(len(live) > 0, "no live_at_peak entries")
need(all(t["bytes"] > 0 and t["name"] for t in live), "live tensor without bytes or name")
'
run noexplain estimate --model llama-70b --tp 8 --budget 80GB
if grep -qF "live at the peak" "$TMP/noexplain.out"; then fail "without --explain-peak no live tensor list"; else ok "without --explain-peak no live tensor list"; fi

# ---- model sources -----------------------------------------------------------------------------
mkdir -p "$TMP/catalog"
cp "$SRC_DIR/models/llama-2-7b.toml" "$TMP/catalog/"
run mdir estimate --model llama-2-7b --models-dir "$TMP/catalog" --format json
expect_rc0 "--models-dir with one copied toml: exit 0" mdir
pycheck "--models-dir model resolves" "$TMP/mdir.out" 'need(j["model"]["name"] == "llama-2-7b" and j["model"]["parameters"] == 6738415616, "model %r" % j["model"])'
run mdiralias estimate --model llama2-7b --models-dir "$TMP/catalog"
expect_rc0 "--models-dir alias resolves" mdiralias
run mdirmodels models --models-dir "$TMP/catalog"
rows=$(awk 'NR > 1 && NF > 0' "$TMP/mdirmodels.out" | wc -l)
if [ "$RC" -eq 0 ] && [ "$rows" -eq 1 ] && grep -qF "6,738,415,616" "$TMP/mdirmodels.out"; then
  ok "models --models-dir lists only the copied model"
else
  fail "models --models-dir lists only the copied model: exit $RC, $rows rows; got: $(snippet "$TMP/mdirmodels.out")"
fi
run mdirother estimate --model llama-70b --models-dir "$TMP/catalog"
if [ "$RC" -eq 2 ] && grep -qF "unknown model" "$TMP/mdirother.err"; then
  ok "--models-dir hides the default catalog"
else
  fail "--models-dir hides the default catalog: want exit 2 'unknown model', got exit $RC; stderr: $(snippet "$TMP/mdirother.err")"
fi

cp "$SRC_DIR/models/llama-3.1-8b.toml" "$TMP/my-copy.toml"
run bypath estimate --model "$TMP/my-copy.toml" --tp 8 --budget 80GB --format json
expect_rc0 "model given as a .toml path: exit 0" bypath
pycheck "model given as a .toml path matches the catalog" "$TMP/bypath.out" '
need(j["model"]["name"] == "llama-3.1-8b", "model.name %r" % j["model"]["name"])
need(j["model"]["parameters"] == 8030261248, "parameters %r" % j["model"]["parameters"])
'
run bycat estimate --model llama-3.1-8b --tp 8 --budget 80GB --format json
if [ -n "$(json_value "$TMP/bycat.out" 'j["peak_bytes"]')" ] && \
   [ "$(json_value "$TMP/bycat.out" 'j["peak_bytes"]')" = "$(json_value "$TMP/bypath.out" 'j["peak_bytes"]')" ]; then
  ok "the .toml copy estimates the same peak as the catalog entry"
else
  fail "the .toml copy estimates the same peak as the catalog entry: catalog '$(json_value "$TMP/bycat.out" 'j["peak_bytes"]')', copy '$(json_value "$TMP/bypath.out" 'j["peak_bytes"]')'"
fi

mkdir -p "$TMP/Llama-2-7b-hf"
cat >"$TMP/Llama-2-7b-hf/config.json" <<'EOF'
{
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 4096,
  "intermediate_size": 11008,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 32,
  "vocab_size": 32000,
  "max_position_embeddings": 4096,
  "hidden_act": "silu",
  "tie_word_embeddings": false,
  "model_type": "llama",
  "rms_norm_eps": 1e-05,
  "torch_dtype": "float16"
}
EOF
run hf estimate --model "$TMP/Llama-2-7b-hf/config.json" --format json
expect_rc0 "Hugging Face config.json: exit 0" hf
pycheck "Hugging Face config.json for Llama-2-7B has 6738415616 parameters" "$TMP/hf.out" '
need(j["model"]["parameters"] == 6738415616, "parameters %r" % j["model"]["parameters"])
need(j["model"]["num_layers"] == 32 and j["model"]["hidden_size"] == 4096, "model %r" % j["model"])
'
run hfplan plan --model "$TMP/Llama-2-7b-hf/config.json" --tp 2
expect_rc0 "plan from a Hugging Face config.json: exit 0" hfplan
pycheck "plan from a config.json is valid JSON" "$TMP/hfplan.out" 'need(j["model"]["parameters"] == 6738415616, "parameters %r" % j["model"]["parameters"])'

# ---- the README's example output is what the command prints --------------------------------------
python3 - "$SRC_DIR/README.md" >"$TMP/readme_example.txt" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("$ tools/nanoplan estimate --model llama-70b --tp 8 --budget 80GB\n")
body = text[text.index("\n", start) + 1:]
print(body[:body.index("```")], end="")
PY
"$NP" estimate --model llama-70b --tp 8 --budget 80GB >"$TMP/example.txt" 2>&1
check "the README's example output is the command's (regenerate it when this fails)" \
  'cmp -s "$TMP/readme_example.txt" "$TMP/example.txt"'
finish

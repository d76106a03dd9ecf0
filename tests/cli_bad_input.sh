#!/usr/bin/env bash
# Bad input to the nanoplan CLI: every case must exit with code 2, print nothing on stdout and
# exactly one line on stderr that starts with "nanoplan: error:" and names the problem (and,
# where the code has them, the valid choices).
# Usage: bash tests/cli_bad_input.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$@"

# bad DESC [-m SUBSTR]... [-a "ALT1|ALT2|..."]... -- ARGS...
#   -m: the error line must contain SUBSTR
#   -a: the error line must contain at least one of the |-separated alternatives
bad() {
  local desc=$1
  shift
  local -a must=() any=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
      -m) must+=("$2"); shift 2 ;;
      -a) any+=("$2"); shift 2 ;;
      *) echo "internal test error: bad option $1 in case '$desc'" >&2; exit 1 ;;
    esac
  done
  shift  # the --
  local out="$TMP/stdout" errf="$TMP/stderr"
  "$NP" "$@" >"$out" 2>"$errf" </dev/null
  local rc=$?
  local err nlines problems=""
  err=$(cat "$errf")
  nlines=$(wc -l <"$errf")
  [ "$rc" -eq 2 ] || problems+="exit code $rc (want 2); "
  [ -s "$out" ] && problems+="stdout not empty ($(head -c 200 "$out" | tr '\n' ' ')); "
  if [ "$nlines" -ne 1 ] || [[ $err == *$'\n'* ]] || [ -z "$err" ]; then
    problems+="stderr has $nlines line(s) (want exactly 1); "
  fi
  [[ $err == "nanoplan: error:"* ]] || problems+="stderr does not start with 'nanoplan: error:'; "
  local s
  for s in ${must[@]+"${must[@]}"}; do
    [[ $err == *"$s"* ]] || problems+="message lacks '$s'; "
  done
  local alts found a
  for alts in ${any[@]+"${any[@]}"}; do
    found=0
    IFS='|' read -r -a parts <<<"$alts"
    for a in "${parts[@]}"; do [[ $err == *"$a"* ]] && found=1; done
    [ $found -eq 1 ] || problems+="message lacks any of '$alts'; "
  done
  if [ -z "$problems" ]; then
    ok "$desc"
  else
    fail "$desc: ${problems}command: nanoplan $*; stderr: $(head -c 600 "$errf" | tr '\n' '|')"
  fi
}

# good DESC ARGS...: the command must succeed (exit 0) with output on stdout.
good() {
  local desc=$1
  shift
  "$NP" "$@" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null
  local rc=$?
  if [ $rc -eq 0 ] && [ -s "$TMP/stdout" ]; then
    ok "$desc"
  else
    fail "$desc: want exit 0 with output, got exit $rc; command: nanoplan $*; stderr: $(head -c 600 "$TMP/stderr" | tr '\n' '|')"
  fi
}

# absent DESC PATH...: none of the paths may exist.
absent() {
  local desc=$1 p left=""
  shift
  for p in "$@"; do [ -e "$p" ] && left+="$p "; done
  if [ -z "$left" ]; then ok "$desc"; else fail "$desc: want no file, found: $left"; fi
}

E=(estimate --model llama-70b)
P=(plan --model llama-70b)

# ---- models ------------------------------------------------------------------------------------
bad "unknown model names closest catalog names" -m "unknown model" -m "llama-3.1-7b" \
  -a "llama-3.1-70b|llama-3.1-8b" -- estimate --model llama-3.1-7b
bad "plan: unknown model" -m "unknown model" -a "llama-3.1-70b|llama-3.1-8b" -- plan --model llama-3.1-7b
bad "missing --model" -m "--model" -- estimate --tp 8
TT="$SRC_DIR/tests/data/torchtitan_llama3_8b.toml"
bad "torchtitan config: shard degree -1 without --gpus" -m "data_parallel_shard_degree -1" -m "--gpus N" \
  -- estimate --torchtitan-config "$TT"
bad "torchtitan config beside --model" -m "--model and --torchtitan-config" \
  -- estimate --torchtitan-config "$TT" --model llama-3.1-8b --gpus 8
bad "--gpus without a torchtitan config" -m "needs --torchtitan-config" -- estimate --model llama-3.1-8b --gpus 8
bad "--fsdp with --zero" -m "use --zero 0" -- estimate --model llama-3.1-8b --dp 8 --fsdp --zero 1
bad "--fsdp with a bad value" -m "invalid --fsdp" -m "on, off" -- estimate --model llama-3.1-8b --dp 8 --fsdp maybe
bad "--recompute-every without full" -m "--recompute full" -- estimate --model llama-3.1-8b --recompute-every 2
bad "--emit of an unknown framework" -m "torchtitan" -- estimate --model llama-3.1-8b --emit deepspeed
bad "run refuses FSDP with tied embeddings" -m "tied embeddings" -m "--zero 3" -- run --model gpt3-175b --dp 2 --fsdp --seq-len 64 --microbatches 1
bad "model path that does not exist" -m "$TMP/no-such-model.toml" -- estimate --model "$TMP/no-such-model.toml"

printf 'name = "broken"\nhidden_size = 4096\nintermediate_size = = 11008\nnum_layers = 32\n' >"$TMP/broken.toml"
bad "malformed TOML reports file:line" -m "$TMP/broken.toml:3" -m "TOML" -- estimate --model "$TMP/broken.toml"
bad "plan: malformed TOML reports file:line" -m "$TMP/broken.toml:3" -- plan --model "$TMP/broken.toml"

mkdir -p "$TMP/badjson"
printf '{\n  "hidden_size": 4096,\n  "intermediate_size": 11008,\n  "num_hidden_layers": 32,,\n  "vocab_size": 32000\n}\n' \
  >"$TMP/badjson/config.json"
bad "malformed config.json reports file:line" -m "$TMP/badjson/config.json:4" -m "JSON" \
  -- estimate --model "$TMP/badjson/config.json"
echo '[1, 2]' >"$TMP/badjson/array.json"
bad "config.json that is not an object" -m "$TMP/badjson/array.json" -m "object" -- estimate --model "$TMP/badjson/array.json"

grep -v '^num_heads' "$SRC_DIR/models/llama-2-7b.toml" >"$TMP/missing-key.toml"
bad "TOML without a required key names the key" -m "num_heads" -m "missing" -m "$TMP/missing-key.toml" \
  -- estimate --model "$TMP/missing-key.toml"
grep -v '^vocab_size' "$SRC_DIR/models/llama-2-7b.toml" >"$TMP/missing-vocab.toml"
bad "TOML without vocab_size names the key" -m "vocab_size" -- estimate --model "$TMP/missing-vocab.toml"
sed 's/^num_layers = .*/num_layers = "many"/' "$SRC_DIR/models/llama-2-7b.toml" >"$TMP/wrong-type.toml"
bad "TOML key of the wrong type names key and line" -m "num_layers" -m "$TMP/wrong-type.toml:" \
  -- estimate --model "$TMP/wrong-type.toml"
sed 's/^num_heads = .*/num_heads = 0/' "$SRC_DIR/models/llama-2-7b.toml" >"$TMP/zero-heads.toml"
bad "TOML with zero heads" -m "num_heads" -- estimate --model "$TMP/zero-heads.toml"

mkdir -p "$TMP/badcat"
cp "$TMP/broken.toml" "$TMP/badcat/"
bad "catalog with a malformed file names it" -m "$TMP/badcat/broken.toml:3" -- models --models-dir "$TMP/badcat"
bad "--models-dir that does not exist" -m "$TMP/no-such-dir" -- estimate --model llama-70b --models-dir "$TMP/no-such-dir"

# ---- budgets -----------------------------------------------------------------------------------
bad "budget with an unknown unit" -m "--budget" -m "80XB" -m "GiB" -- "${E[@]}" --budget 80XB
bad "budget that is not a number" -m "--budget" -m "abc" -- "${E[@]}" --budget abc
bad "ambiguous budget unit G" -m "--budget" -m "80G" -m "ambiguous" -- "${E[@]}" --budget 80G
bad "zero budget" -m "--budget" -m "positive" -- "${E[@]}" --budget 0GB
bad "negative budget" -m "--budget" -m "positive" -- "${E[@]}" --budget=-5GB
bad "negative budget (separate argument)" -m "--budget" -m "-5GB" -- "${E[@]}" --budget -5GB
bad "budget with a fraction of a byte" -m "--budget" -m "whole number" -- "${E[@]}" --budget 1.5B
bad "plan: unparsable budget" -m "--budget" -m "abc" -- "${P[@]}" --budget abc
bad "ambiguous --cuda-context unit" -m "--cuda-context" -m "ambiguous" -- "${E[@]}" --cuda-context 5G
bad "--allocator-slack, replaced by the replay" -m "--allocator-slack" -m "--allocator caching|expandable|exact" -- "${E[@]}" --allocator-slack 0.05
bad "unknown --allocator" -m "'pooled'" -m "caching, expandable, exact" -- "${E[@]}" --allocator pooled
bad "--allocator-conf with an unknown key" -m "max_split_size" -m "valid:" -- "${E[@]}" --allocator-conf max_split_size:128
bad "--allocator-conf below PyTorch's minimum" -m "at least 20" -- "${E[@]}" --allocator-conf max_split_size_mb:8
bad "--allocator-conf with --allocator exact" -m "exact" -- "${E[@]}" --allocator exact --allocator-conf max_split_size_mb:128
bad "--headroom above 50%" -m "--headroom" -m "[0, 50]" -- "${E[@]}" --budget 80GB --headroom 51%
bad "--headroom as a bare number with %" -m "--headroom" -- "${E[@]}" --budget 80GB --headroom %
bad "--headroom of the whole budget" -m "--headroom" -m "leave nothing" -- "${E[@]}" --budget 80GB --headroom 80GB
bad "--headroom in an unknown unit" -m "--headroom" -- "${E[@]}" --budget 80GB --headroom 2XB
bad "a budget without its unit (bytes under 1 MiB)" -m "--budget" -m "under 1 MiB" -m "80GB" -- "${E[@]}" --budget 80
bad "--headroom as a bare number" -m "--headroom" -m "give a unit or %" -- "${E[@]}" --budget 80GB --headroom 3

# ---- parallelism against the model -------------------------------------------------------------
bad "--tp 3 does not divide the heads" -m "--tp 3" -m "heads" -- "${E[@]}" --tp 3
bad "plan: --tp 3 does not divide the heads" -m "--tp 3" -m "heads" -- "${P[@]}" --tp 3
bad "--tp 16 exceeds the 8 kv heads" -m "--tp 16" -m "kv heads" -m "8" -- "${E[@]}" --tp 16
bad "--pp 81 exceeds the 80 layers" -m "--pp 81" -m "80 layers" -- "${E[@]}" --pp 81
bad "plan: --pp 81 exceeds the 80 layers" -m "--pp 81" -- "${P[@]}" --pp 81
bad "--seq-len not divisible by tp under SP" -m "--seq-len 4097" -m "--tp 8" -m "--sp off" -- "${E[@]}" --seq-len 4097 --tp 8
good "--seq-len 4097 --tp 8 --sp off is accepted" "${E[@]}" --seq-len 4097 --tp 8 --sp off
bad "1f1b with fewer micro-batches than pp - 1" -m "--microbatches 2" -m "pp - 1" -- "${E[@]}" --pp 4 --pp-schedule 1f1b --microbatches 2
bad "plan: 1f1b with fewer micro-batches than pp - 1" -m "--microbatches 2" -- "${P[@]}" --pp 4 --pp-schedule 1f1b --microbatches 2
bad "--cp that does not split the sequence in 2 cp chunks" -m "--seq-len 4096" -m "2 x --cp 3" -m "multiple of 6" -- "${E[@]}" --cp 3
bad "--cp with eager attention" -m "--cp 2" -m "--attention flash" -- "${E[@]}" --cp 2 --attention eager
bad "--cp with the hf profile" -m "--cp 2" -m "--impl nanotron, megatron or fused" -- "${E[@]}" --cp 2 --impl hf
bad "--cp 0" -m "--cp" -- "${E[@]}" --cp 0
bad "sweep --cp with a zero" -m "--cp" -m "1,2,4" -- sweep --model llama-3.1-8b --gpus 8 --budget 80GB --cp 1,0
bad "--virtual-stages without the interleaved schedule" -m "--virtual-stages 2" -m "--pp-schedule interleaved" -- "${E[@]}" --pp 4 --virtual-stages 2
bad "interleaved with m not a multiple of pp" -m "--microbatches 6" -m "multiple of --pp 4" -m "use 8" -- "${E[@]}" --pp 4 --pp-schedule interleaved --microbatches 6
bad "interleaved on one stage" -m "--pp >= 2" -- "${E[@]}" --pp-schedule interleaved
bad "interleaved with one chunk" -m "--virtual-stages >= 2" -- "${E[@]}" --pp 4 --pp-schedule interleaved --virtual-stages 1
bad "interleaved chunks exceed the layers" -m "160 chunks" -m "80 layers" -- "${E[@]}" --pp 8 --pp-schedule interleaved --virtual-stages 20 --microbatches 8
bad "interleaved with --partition counts" -m "--partition" -m "balanced" -- "${E[@]}" --pp 2 --pp-schedule interleaved --partition 40,40
bad "interleaved with --partition auto" -m "--partition auto" -m "balanced" -- "${E[@]}" --pp 2 --pp-schedule interleaved --partition auto --budget 80GB
bad "--virtual-stages 0" -m "--virtual-stages" -- "${E[@]}" --pp 2 --pp-schedule interleaved --virtual-stages 0
bad "--partition with too few stages" -m "--partition" -m "2 stages" -m "--pp 4" -- "${E[@]}" --pp 4 --partition 40,40
bad "--partition that does not sum to the layers" -m "--partition" -m "79 layers" -m "80" -- "${E[@]}" --pp 2 --partition 40,39
bad "--partition with an empty stage" -m "--partition" -m "at least 1" -- "${E[@]}" --pp 2 --partition 80,0
bad "--partition that is not a list of counts" -m "--partition" -m "balanced, auto" -- "${E[@]}" --pp 2 --partition 40,forty
bad "--partition with a trailing comma" -m "--partition" -m "balanced, auto" -- "${E[@]}" --pp 2 --partition 40,40,
bad "--partition auto without a budget" -m "--partition auto" -m "--budget" -- "${E[@]}" --pp 2 --partition auto
bad "sweep: --partition with counts" -m "--partition" -m "balanced, auto" -- sweep --model llama-3.1-8b --gpus 8 --budget 80GB --partition 16,16
good "--partition 41,39 is accepted" "${E[@]}" --pp 2 --partition 41,39
bad "--ep that does not divide the experts" -m "--ep 3" -m "experts" -- estimate --model mixtral-8x7b --ep 3 --dp 3
bad "--ep that does not divide --dp" -m "--ep 2" -m "--dp 1" -- estimate --model mixtral-8x7b --ep 2
bad "--moe-capacity-factor that is not a number" -m "--moe-capacity-factor" -m "valid: 0 for dropless" -- estimate --model mixtral-8x7b --moe-capacity-factor lots
bad "--moe-capacity-factor above 64" -m "--moe-capacity-factor" -m "(0, 64]" -- estimate --model mixtral-8x7b --moe-capacity-factor 100
bad "--moe-capacity-factor on a dense model" -m "needs an MoE model" -- "${E[@]}" --moe-capacity-factor 1.25
bad "--mtp-layers past 16" -m "--mtp-layers" -m "16" -- estimate --model deepseek-v3 --mtp-layers 17
bad "--mtp-layers with learned positions" -m "learned position embeddings" -m "--mtp-layers 0" -- estimate --model gpt3-175b --mtp-layers 1
bad "run: expert parallelism without a capacity factor" -m "--ep 2 without one" -m "--moe-capacity-factor" -- run --model mixtral-8x7b --dp 2 --ep 2

# ---- sizes -------------------------------------------------------------------------------------
bad "--micro-batch 0" -m "--micro-batch" -m "positive" -- "${E[@]}" --micro-batch 0
bad "--seq-len -1" -m "--seq-len" -m "positive" -- "${E[@]}" --seq-len -1
bad "--dp 0" -m "--dp" -m "positive" -- "${E[@]}" --dp 0
bad "--tp 0" -m "--tp" -m "positive" -- "${E[@]}" --tp 0
bad "--microbatches -1" -m "--microbatches" -m "positive" -- "${E[@]}" --microbatches -1
bad "--zero 4" -m "--zero 4" -m "0, 1, 2, 3" -- "${E[@]}" --zero 4
bad "--tp that is not a number" -m "--tp" -m "abc" -- "${E[@]}" --tp abc
bad "--tp beyond int64" -m "--tp" -- "${E[@]}" --tp 99999999999999999999

# ---- conflicting flags -------------------------------------------------------------------------
bad "--sp on with --tp 1" -m "--sp on" -m "--tp" -- "${E[@]}" --sp on --tp 1
bad "--zero 2 with --pp 2" -m "--zero 2" -m "--pp 2" -- "${E[@]}" --zero 2 --pp 2
bad "--ep 2 on a dense model" -m "--ep 2" -m "dense" -- "${E[@]}" --ep 2
bad "--optimizer none with --zero 1" -m "--zero 1" -m "--optimizer none" -- "${E[@]}" --optimizer none --zero 1

# ---- enum values -------------------------------------------------------------------------------
bad "invalid --recompute lists the choices" -m "--recompute" -m "sometimes" -m "none, selective, selective-op, full" -- "${E[@]}" --recompute sometimes
bad "plan: invalid --recompute" -m "--recompute" -m "none, selective, selective-op, full" -- "${P[@]}" --recompute sometimes
bad "invalid --pp-schedule" -m "--pp-schedule" -m "gpipe" -m "1f1b" -m "afab" -- "${E[@]}" --pp-schedule gpipe
bad "invalid --attention" -m "--attention" -m "sdpa" -m "flash" -m "eager" -- "${E[@]}" --attention sdpa
bad "invalid --impl" -m "--impl" -m "deepspeed" -m "nanotron, megatron, fused, hf" -- "${E[@]}" --impl deepspeed
bad "invalid --format" -m "--format" -m "yaml" -m "table" -m "json" -- "${E[@]}" --format yaml
bad "invalid --grad-accum-dtype" -m "--grad-accum-dtype" -m "fp16" -m "fp32" -m "bf16" -- "${E[@]}" --grad-accum-dtype fp16
bad "invalid --optimizer" -m "--optimizer" -m "lion" -m "adamw" -- "${E[@]}" --optimizer lion
bad "invalid --tp-recompute-allgather" -m "--tp-recompute-allgather" -m "maybe" -m "true" -m "false" -- "${E[@]}" --tp-recompute-allgather maybe
bad "invalid --sp" -m "--sp" -m "maybe" -m "on" -m "off" -m "auto" -- "${E[@]}" --sp maybe
bad "unknown GPU lists the valid GPUs" -m "unknown GPU" -m "h1000" -m "h100-sxm-80gb" -m "h200" -m "b200" -- "${E[@]}" --gpu h1000
bad "plan: unknown GPU" -m "unknown GPU" -m "h1000" -- "${P[@]}" --gpu h1000
# Float8 on a GPU without float8 tensor cores: the frameworks refuse it (TE, torchtitan).
bad "float8 on an A100 (Transformer Engine)" -m "--fp8 delayed needs float8 tensor cores" -m "a100-80gb" \
  -m "Transformer Engine refuses" -m "--fp8 none" -- "${E[@]}" --impl megatron --fp8 delayed --gpu a100-80gb
bad "float8 on an A100 (torchtitan)" -m "--fp8 rowwise needs float8 tensor cores" -m "torchtitan refuses" \
  -m "--gpu h100-sxm-80gb" -- plan --model llama-3.1-8b --impl torchtitan --fsdp --dp 8 --fp8 rowwise --gpu a100-40gb
bad "sweep: float8 on an A100" -m "--fp8 tensorwise needs float8 tensor cores" \
  -- sweep --model llama-3.1-8b --gpus 8 --budget 80GB --impl torchtitan --fsdp --fp8 tensorwise --gpu a100-80gb

# ---- command line ------------------------------------------------------------------------------
bad "no subcommand" -m "subcommand" -m "estimate" -- 
bad "unknown subcommand is named, with the valid ones" -m "frobnicate" -m "estimate, plan, run, compare, sweep, report, calibrate, models, gpus" -- frobnicate
bad "unknown flag" -m "--bogus" -- "${E[@]}" --bogus
bad "plan: unknown flag" -m "--bogus" -- "${P[@]}" --bogus
# CLI11's words never reach the user: a subcommand's foreign option, a second subcommand.
bad "gpus --ep 2: named in the order given" -m "unexpected arguments for nanoplan gpus: '--ep 2'" -m "nanoplan gpus --help" -- gpus --ep 2
bad "run --emit is not run's" -m "unexpected argument" -m "--emit" -- run --model llama-3.1-8b --emit megatron
bad "plan --format is not plan's" -m "unexpected argument" -m "--format" -- plan --model llama-3.1-8b --format table
bad "a second subcommand is an unexpected argument" -m "unexpected argument for nanoplan estimate: 'plan'" -- estimate --model llama-3.1-8b plan
bad "flag without its value" -m "--tp" -- "${E[@]}" --tp
bad "-o is not an estimate flag" -m "-o" -- "${E[@]}" -o "$TMP/estimate.json"
absent "estimate -o wrote nothing" "$TMP/estimate.json" "$TMP/estimate.json.tmp"

# ---- plan output ------------------------------------------------------------------------------
rm -f /nonexistent-dir/plan.json 2>/dev/null
bad "plan -o into a missing folder" -m "/nonexistent-dir/plan.json" -- plan --model llama-3.1-8b -o /nonexistent-dir/plan.json
absent "plan -o into a missing folder created no file" /nonexistent-dir/plan.json /nonexistent-dir/plan.json.tmp /nonexistent-dir
mkdir -p "$TMP/out"
bad "plan -o with an unparsable budget" -m "--budget" -m "abc" -- plan --model llama-3.1-8b --budget abc -o "$TMP/out/p1.json"
absent "plan -o with an unparsable budget wrote no file" "$TMP/out/p1.json" "$TMP/out/p1.json.tmp"
bad "plan -o with an unknown GPU" -m "h1000" -- plan --model llama-3.1-8b --gpu h1000 -o "$TMP/out/p2.json"
absent "plan -o with an unknown GPU wrote no file" "$TMP/out/p2.json" "$TMP/out/p2.json.tmp"
bad "plan -o with a bad --cuda-context" -m "--cuda-context" -- plan --model llama-3.1-8b --cuda-context xyz -o "$TMP/out/p3.json"
absent "plan -o with a bad --cuda-context wrote no file" "$TMP/out/p3.json" "$TMP/out/p3.json.tmp"
bad "plan -o with a conflict" -m "--zero 2" -- plan --model llama-3.1-8b --zero 2 --pp 2 -o "$TMP/out/p4.json"
absent "plan -o with a conflict wrote no file" "$TMP/out/p4.json" "$TMP/out/p4.json.tmp"
mkdir -p "$TMP/out/adir"
bad "plan -o naming an existing folder" -m "$TMP/out/adir" -- plan --model llama-3.1-8b -o "$TMP/out/adir"
absent "plan -o naming an existing folder left no temp file" "$TMP/out/adir.tmp"
bad "plan to stdout with an unknown GPU" -m "h1000" -- plan --model llama-3.1-8b --gpu h1000

# ---- values that must never be ignored, wrapped or misreported ---------------------------------
bad "empty --budget" -m "empty value for --budget" -m "80GB" -- "${E[@]}" --budget ''
bad "empty --gpu" -m "empty value for --gpu" -m "h100" -- "${E[@]}" --gpu ''
bad "blank --budget" -m "empty value for --budget" -- "${E[@]}" --budget ' '
bad "empty --enforce-budget" -m "empty value for --enforce-budget" -- run --model llama-3.1-8b --enforce-budget ''
bad "empty --format" -m "empty value for --format" -- "${E[@]}" --format ''
bad "empty --tp" -m "invalid --tp ''" -m "not a whole number" -- "${E[@]}" --tp ''
bad "--microbatches 0 is refused, not the default" -m "--microbatches must be a positive integer, got 0" -- "${E[@]}" --microbatches 0
bad "sweep --global-batch 0 is refused, not the default" -m "invalid --global-batch 0" -- sweep --model llama-3.1-8b --gpus 8 --budget 80GB --global-batch 0
bad "--tp 2^63 is not echoed as 2^63 - 1" -m "invalid --tp '9223372036854775808'" -m "does not fit in 64 bits" -- "${E[@]}" --tp 9223372036854775808
bad "--tp -2^63 - 1" -m "'-9223372036854775809'" -- "${E[@]}" --tp -9223372036854775809
bad "--tp 1.5" -m "invalid --tp '1.5': not a whole number" -- "${E[@]}" --tp 1.5
bad "--tp 1e3" -m "invalid --tp '1e3': not a whole number" -- "${E[@]}" --tp 1e3
bad "--zero 4294967296 is not truncated to 0" -m "invalid --zero 4294967296" -m "0, 1, 2, 3" -- "${E[@]}" --zero 4294967296
bad "--steps 0" -m "invalid --steps 0" -- run --model llama-3.1-8b --steps 0
bad "--seed -1" -m "invalid --seed -1" -- run --model llama-3.1-8b --seed -1
bad "--budget 1e10: exponent notation named" -m "'1e10': exponent notation is not accepted" -- "${E[@]}" --budget 1e10
bad "tokens per micro-batch printed as integers" -m "--seq-len 1048576 x --micro-batch 1048576 is more than 16,777,216 tokens" -- "${E[@]}" --seq-len 1048576 --micro-batch 1048576
bad "random bytes are escaped, not echoed" -m "unknown model 'ab\\x01\\xff'" -- estimate --model "$(printf 'ab\001\377')"
bad "a long value is cut" -m "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'..." -- "${E[@]}" --recompute "$(printf 'a%.0s' {1..300})"
bad "a folder given as a plan" -m "is a folder" -- run "$TMP"
bad "a folder given as a scenario" -m "is a folder" -- run --scenario "$TMP"
mkdir -p "$TMP/cfgdir/config.json"
bad "a folder given as config.json" -m "is a folder" -- estimate --model "$TMP/cfgdir/config.json"

# Hugging Face config.json: wrong types named with the value, never "got 0" or library text.
hf() {  # hf NAME PYTHON: $TMP/hf-NAME/config.json, a Llama config with PYTHON applied to j
  mkdir -p "$TMP/hf-$1"
  python3 - "$SRC_DIR/tests/fuzz/seeds/hf/llama.json" "$TMP/hf-$1/config.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(j, open(sys.argv[2], "w"))
PY
  echo "$TMP/hf-$1/config.json"
}
bad "config.json: hidden_size as a string" -m 'config.json: hidden_size: expected an integer, got "4096"' -- estimate --model "$(hf str 'j["hidden_size"] = "4096"')"
bad "config.json: vocab_size 1e30" -m "config.json: vocab_size: expected an integer, got 1e+30" -- estimate --model "$(hf huge 'j["vocab_size"] = 1e30')"
bad "config.json: a boolean as text" -m 'tie_word_embeddings: expected true or false, got "no"' -- estimate --model "$(hf bool 'j["tie_word_embeddings"] = "no"')"
bad "config.json: missing hidden_size" -m "config.json: hidden_size: missing" -- estimate --model "$(hf miss 'del j["hidden_size"]')"
bad "config.json: an unknown activation" -m "hidden_act \"tanh\" is not supported" -m "silu" -- estimate --model "$(hf act 'j["hidden_act"] = "tanh"')"
bad "config.json: heads that do not divide hidden" -m "num_attention_heads 7 does not divide hidden_size 4096" -- estimate --model "$(hf heads 'j["num_attention_heads"] = 7; j["num_key_value_heads"] = 7')"
mkdir -p "$TMP/hf-junk"
printf '{"hidden_size": 4096,\n "x": \001\377}' >"$TMP/hf-junk/config.json"
bad "config.json: malformed, no library text or raw bytes" -m "config.json:2:7: malformed JSON: syntax error" -- estimate --model "$TMP/hf-junk/config.json"
good "config.json with nulls and keys that size nothing" estimate --model "$(hf ok 'j["sliding_window"] = None; j["rope_scaling"] = {"factor": 8.0}')"

# Model TOML: head_dim is never silently rounded; unknown keys are refused.
cat >"$TMP/hidden0.toml" <<'TOML'
name = "hidden0"
hidden_size = 50
intermediate_size = 128
num_layers = 2
num_heads = 8
vocab_size = 100
max_position_embeddings = 64
TOML
bad "model TOML: heads that do not divide hidden" -m "hidden0.toml: num_heads 8 does not divide hidden_size 50" -- estimate --model "$TMP/hidden0.toml"
sed 's/^num_heads = 8/num_heads = 8\nhead_dim = 6/' "$TMP/hidden0.toml" >"$TMP/hidden6.toml"
good "model TOML: an explicit head_dim is taken" estimate --model "$TMP/hidden6.toml"
sed 's/^num_heads = 8/num_heads = 5\nnum_kv_head = 5/' "$TMP/hidden0.toml" >"$TMP/typo.toml"
bad "model TOML: a misspelt key" -m "typo.toml:6: unknown key 'num_kv_head'" -m "num_kv_heads" -- estimate --model "$TMP/typo.toml"

# Scenario TOML: every key typed, no typo ignored, no check silently off.
sc() {  # sc NAME SED: $TMP/NAME.toml, scenarios/tiny-llama.toml edited by SED
  sed "$2" "$SRC_DIR/scenarios/tiny-llama.toml" >"$TMP/$1.toml"
  echo "$TMP/$1.toml"
}
bad "scenario: tp = \"two\"" -m "matrix.tp: expected a non-empty list of integers, got \"two\"" -- run --scenario "$(sc tptwo 's/^tp = \[.*\]/tp = "two"/')"
bad "scenario: tp = []" -m "matrix.tp: expected a non-empty list of integers, got []" -- run --scenario "$(sc tpempty 's/^tp = \[.*\]/tp = []/')"
bad "scenario: [matrixx]" -m "unknown table [matrixx]" -m "matrix" -- run --scenario "$(sc matrixx 's/^\[matrix\]/[matrixx]/')"
bad "scenario: an unknown [expect] key" -m "unknown key 'expect.loss_decrease'" -- run --scenario "$(sc expkey 's/^loss_decreases = /loss_decrease = /')"
bad "scenario: predicted_equals_measured = \"yes\"" -m "expect.predicted_equals_measured: expected true or false, got \"yes\"" -- run --scenario "$(sc yes 's/^predicted_equals_measured = true/predicted_equals_measured = "yes"/')"
bad "scenario: first_loss_rel_ln_vocab = 0" -m "expect.first_loss_rel_ln_vocab: expected a fraction in (0, 1]" -- run --scenario "$(sc rel0 's/^first_loss_rel_ln_vocab = [0-9.]*/first_loss_rel_ln_vocab = 0/')"
bad "scenario: an inline model error names the file once" -m "inline.toml: num_heads" -- run --scenario "$(sc inline 's/^hidden_size = .*/hidden_size = 50/')"
check "scenario: the file name is not doubled" '! grep -q "inline.toml.*inline.toml" "$TMP/stderr"'
printf 'name = "big"\nmodel = "llama-3.1-8b"\n' >"$TMP/big.toml"
# Host memory is the executor's limit, not bad input: exit 4 (README), one line, nothing on stdout.
for cmd in "run --scenario $TMP/big.toml" "run --model llama-3.1-8b"; do
  # shellcheck disable=SC2086
  "$NP" $cmd >"$TMP/hm.out" 2>"$TMP/hm.err" </dev/null
  rc=$?
  check "$cmd refused for host memory: exit 4, one line" \
    '[ $rc -eq 4 ] && [ ! -s "$TMP/hm.out" ] && [ "$(wc -l <"$TMP/hm.err")" -eq 1 ] && grep -q "nanoplan: error: .*of host memory" "$TMP/hm.err"'
done

finish

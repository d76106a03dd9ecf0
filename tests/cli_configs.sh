#!/usr/bin/env bash
# Configs in and out. Emitted configs say first when the setup does not fit. Real launch lines
# through --megatron-args: the argument arrays of two of Megatron-LM's own
# launch scripts (tests/data/launch/, each with its source), expanded by bash as the script's
# torchrun line expands them, and read as Megatron reads them: --flag=value, the switches, the
# flags no byte depends on (ignored and listed once on stderr), and the flags that change the
# memory in a way nanoplan does not model (refused by name).
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh" "$@"

# launch_args SCRIPT [SED-EXPRESSION ...]: the words the script's torchrun line passes to
# pretrain_gpt.py, after the edits a user would make to its settings (sed expressions).
launch_args() {
  local script=$1
  shift
  local -a edits=(-e '')
  for e in "$@"; do edits+=(-e "$e"); done
  sed "${edits[@]}" "$script" >"$TMP/launch.sh"
  bash -c 'f=$1; shift
           eval "$(cat "$f")"
           echo ${GPT_MODEL_ARGS[@]:-} ${MODEL_ARGS[@]:-} ${TRAINING_ARGS[@]:-} ${DTYPE_ARGS[@]:-} \
                ${MODEL_PARALLEL_ARGS[@]:-} ${DATA_ARGS[@]:-} ${DATA_ARGS_LIST[@]:-} \
                ${EVAL_AND_LOGGING_ARGS[@]:-}' _ "$TMP/launch.sh"
}

# GPT-3 175B (examples/gpt3): tp 8 x pp 16, fp16, a batch ramp-up, the attention backend.
args=$(launch_args "$SRC_DIR/tests/data/launch/megatron-gpt3-175b.sh" \
  's#^CHECKPOINT_PATH=$1#CHECKPOINT_PATH=/ckpt#' 's#^TENSORBOARD_LOGS_PATH=$2#TENSORBOARD_LOGS_PATH=/tb#' \
  's#^VOCAB_FILE=$3#VOCAB_FILE=/gpt2-vocab.json#' 's#^MERGE_FILE=$4#MERGE_FILE=/gpt2-merges.txt#' \
  's#^DATA_PATH=$5#DATA_PATH=/data_text_document#')
check "gpt3 script expands to its arguments" 'echo "$args" | grep -q -- "--num-layers 96" && echo "$args" | grep -q -- "--rampup-batch-size 16 16 5859375"'
"$NP" estimate --model gpt3-175b --dp 1 --megatron-args "$args" --format json >"$TMP/gpt3.json" 2>"$TMP/gpt3.err"
rc=$?
check "gpt3 script: exit 0" '[ $rc -eq 0 ]'
check "gpt3 script: tp 8, pp 16, 1536 micro-batches, megatron's 1F1B" \
  'python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"setup\"]; sys.exit(0 if (s[\"tp\"], s[\"pp\"], s[\"microbatches\"], s[\"pp_schedule\"], s[\"impl\"]) == (8, 16, 1536, \"1f1b\", \"megatron\") else 1)" "$TMP/gpt3.json"'
check "gpt3 script: the ignored flags listed once, on one stderr line" \
  '[ "$(wc -l <"$TMP/gpt3.err")" -eq 1 ] && grep -q "ignored, as no byte depends on them here: .*--rampup-batch-size" "$TMP/gpt3.err" && grep -q -- "--fp16" "$TMP/gpt3.err" && [ "$(grep -o -- "--lr," "$TMP/gpt3.err" | wc -l)" -eq 1 ]'

# Llama 3 8B (examples/llama): its default dtype is fp8 with fp8 parameters: Transformer
# Engine's delayed-scaling float8 with --fp8-param-gather (the weights float8 with their
# transposes, no cached copies). Without --use-distributed-optimizer that is refused by name, as
# Megatron refuses it; without --fp8-param-gather the copies are kept. With bf16 it reads: SP,
# the distributed optimizer, bf16 gradients, the native fused loss, the dataloader without its
# mask, and flags given as --flag=value.
args=$(launch_args "$SRC_DIR/tests/data/launch/megatron-llama3-8b.sh")
"$NP" estimate --model llama-3.1-8b --dp 8 --megatron-args "$args" --format json >"$TMP/fp8p.json" 2>/dev/null
rc=$?
check "llama3 script as published (fp8 parameters): exit 0, float8 parameters, no weight copies" \
  '[ $rc -eq 0 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d[\"setup\"]; sys.exit(0 if (s[\"fp8\"], s.get(\"fp8_param_gather\")) == (\"delayed\", True) and not any(o[\"name\"] == \"TE fp8 weight copies\" for o in d[\"ranks\"][0][\"overheads\"]) else 1)" "$TMP/fp8p.json"'
args=$(launch_args "$SRC_DIR/tests/data/launch/megatron-llama3-8b.sh" '/--use-distributed-optimizer/d')
"$NP" estimate --model llama-3.1-8b --dp 8 --megatron-args "$args" >"$TMP/out.txt" 2>&1
rc=$?
check "llama3 script without the distributed optimizer: exit 2, one line naming it" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out.txt")" -eq 1 ] && grep -q -- "--fp8-param-gather needs --use-distributed-optimizer" "$TMP/out.txt"'
args=$(launch_args "$SRC_DIR/tests/data/launch/megatron-llama3-8b.sh" '/--fp8-param-gather/d' 's/^TP_SIZE=1 */TP_SIZE=2/')
"$NP" estimate --model llama-3.1-8b --dp 4 --megatron-args "$args" --format json >"$TMP/fp8.json" 2>/dev/null
rc=$?
check "llama3 script in fp8 without fp8 parameters: exit 0, Transformer Engine's delayed float8" \
  '[ $rc -eq 0 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d[\"setup\"]; sys.exit(0 if (s[\"fp8\"], s[\"impl\"], s[\"tp\"]) == (\"delayed\", \"megatron\", 2) and any(o[\"name\"] == \"TE fp8 weight copies\" for o in d[\"ranks\"][0][\"overheads\"]) else 1)" "$TMP/fp8.json"'
args=$(launch_args "$SRC_DIR/tests/data/launch/megatron-llama3-8b.sh" 's/^DTYPE="fp8"/DTYPE="bf16"/' 's/^TP_SIZE=1 */TP_SIZE=2/')
"$NP" estimate --model llama-3.1-8b --dp 4 --megatron-args "$args" --format json >"$TMP/llama.json" 2>"$TMP/llama.err"
rc=$?
check "llama3 script in bf16 at tp 2: exit 0" '[ $rc -eq 0 ]'
check "llama3 script: SP, ZeRO-1, bf16 gradients, native loss, no mask, 32 micro-batches" \
  'python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"setup\"]; sys.exit(0 if (s[\"tp\"], s[\"sp\"], s[\"zero\"], s[\"grad_accum_dtype\"], s[\"cross_entropy_fusion\"], s[\"dataloader_attention_mask\"], s[\"microbatches\"]) == (2, True, 1, \"bf16\", \"native\", False, 32) else 1)" "$TMP/llama.json"'
eq_args=$(echo "$args" | sed 's/--tensor-model-parallel-size 2/--tensor-model-parallel-size=2/; s/--seq-length 8192/--seq-length=8192/')
"$NP" estimate --model llama-3.1-8b --dp 4 --megatron-args "$eq_args" --format json >"$TMP/eq.json" 2>/dev/null
check "--flag=value reads as --flag value" \
  'python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); sys.exit(0 if a[\"peak_bytes\"] == b[\"peak_bytes\"] and a[\"setup\"] == b[\"setup\"] else 1)" "$TMP/llama.json" "$TMP/eq.json"'

# A value flag followed by another flag, and an unknown flag: bad input, named.
"$NP" estimate --model llama-3.1-8b --megatron-args "--save --load /x" >"$TMP/out.txt" 2>&1
rc=$?
check "a value flag without its value: exit 2 naming it" '[ $rc -eq 2 ] && grep -q -- "--save'"'"' needs a value" "$TMP/out.txt"'
"$NP" estimate --model llama-3.1-8b --megatron-args "--cp-comm-type a2a" >"$TMP/out.txt" 2>&1
rc=$?
check "Ulysses CP: exit 2 naming the valid forms" '[ $rc -eq 2 ] && grep -q "valid: p2p, all_gather" "$TMP/out.txt"'
# --make-vocab-size-divisible-by 1000 at tp 2 pads 128256 to 130000 (a multiple of 2000) where 128
# keeps it: 1744 more rows, 872 per rank, in the embedding and the untied LM head, bf16.
for n in 128 1000; do
  "$NP" estimate --model llama-3.1-8b --dp 1 --format json \
    --megatron-args "--make-vocab-size-divisible-by=$n --tensor-model-parallel-size 2" >"$TMP/vocab$n.json" 2>/dev/null
done
check "--make-vocab-size-divisible-by pads as Megatron: 872 x 4096 x 2 x 2 more weight bytes per rank" \
  'python3 -c "import json,sys; a,b=(json.load(open(p))[\"ranks\"][0][\"parameter_bytes\"] for p in sys.argv[1:]); sys.exit(0 if b - a == 872 * 4096 * 2 * 2 else 1)" "$TMP/vocab128.json" "$TMP/vocab1000.json"'
# --emit for a setup that fits nowhere: the config's first line and stderr say so; exit 0.
for emit in megatron nanotron; do
  "$NP" estimate --model llama-70b --tp 8 --budget 80GB --emit $emit >"$TMP/emit.txt" 2>"$TMP/emit.err"
  rc=$?
  check "--emit $emit of a setup that does not fit: exit 0, first line and stderr say so" \
    '[ $rc -eq 0 ] && head -1 "$TMP/emit.txt" | grep -q "^# DOES NOT FIT: the smallest peak nanoplan finds is" && grep -q "the emitted config DOES NOT FIT" "$TMP/emit.err"'
done
"$NP" estimate --model llama-3.1-8b --tp 2 --budget 80GB --emit megatron >"$TMP/emit.txt" 2>"$TMP/emit.err"
check "--emit of a setup that fits: no such line, nothing on stderr" \
  '! grep -q "DOES NOT FIT" "$TMP/emit.txt" && [ ! -s "$TMP/emit.err" ]'

# --gpu with --budget: the budget given, the GPU's cost model.
for gpu in h100 b200; do
  "$NP" estimate --model llama-3.1-8b --tp 2 --gpu $gpu --budget 80GB --format json >"$TMP/$gpu.json" 2>/dev/null
done
check "--gpu with --budget: the given budget, each GPU's step time" \
  'python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); sys.exit(0 if a[\"budget_bytes\"] == b[\"budget_bytes\"] == 80000000000 and a[\"plan\"][\"step_seconds\"] != b[\"plan\"][\"step_seconds\"] else 1)" "$TMP/h100.json" "$TMP/b200.json"'

# --gpu FILE: a GPU file in the catalog's schema, one [[gpu]] table; its figures are the cost model's.
cat >"$TMP/mygpu.toml" <<'TOML'
[[gpu]]
name = "my-h100-half"
memory_bytes = 85520809984
bf16_dense_flops = 494.7e12
hbm_bytes_per_s = 3.35e12
nvlink_bytes_per_s = 450e9
TOML
"$NP" estimate --model llama-3.1-8b --tp 2 --gpu "$TMP/mygpu.toml" --budget 80GB --format json >"$TMP/mygpu.json" 2>"$TMP/err"; rc=$?
check "--gpu FILE: the file's GPU, named with its file in JSON, slower at half the FLOP/s" \
  '[ $rc -eq 0 ] && python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:3]); sys.exit(0 if a[\"plan\"][\"hardware\"] == \"my-h100-half\" and a[\"plan\"][\"hardware_origin\"] == \"from \" + sys.argv[3] and b[\"plan\"][\"hardware_origin\"] == \"\" and a[\"plan\"][\"step_seconds\"] > b[\"plan\"][\"step_seconds\"] else 1)" "$TMP/mygpu.json" "$TMP/h100.json" "$TMP/mygpu.toml"'
"$NP" estimate --model llama-3.1-8b --tp 2 --gpu "$TMP/mygpu.toml" >"$TMP/out" 2>&1
check "--gpu FILE: the table says which file the times come from, and the budget is its memory" \
  'grep -qF ", on my-h100-half (from $TMP/mygpu.toml)" "$TMP/out" && grep -q "^budget 85,520,809,984 bytes" "$TMP/out"'
cat "$TMP/mygpu.toml" "$TMP/mygpu.toml" | sed 's/my-h100-half/second/2' >"$TMP/two.toml"
"$NP" estimate --model llama-3.1-8b --gpu "$TMP/two.toml" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--gpu FILE with two GPUs: exit 2, one line" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "a GPU file holds one \[\[gpu\]\] table, this one 2" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" estimate --model llama-3.1-8b --gpu "$TMP/none.toml" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--gpu FILE that does not exist: exit 2, one line naming it" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -qF "$TMP/none.toml" "$TMP/err"'

# Megatron's overlap options: the step time's only, said on the step-time line and in JSON.
"$NP" estimate --model llama-3.1-8b --dp 8 --zero 1 --format json >"$TMP/plain.json" 2>"$TMP/err"
"$NP" estimate --model llama-3.1-8b --dp 8 --zero 1 --overlap-grad-reduce on --overlap-param-gather on --format json >"$TMP/overlap.json" 2>>"$TMP/err"
check "--overlap-grad-reduce on --overlap-param-gather on: a shorter step, the same bytes, said in JSON" \
  'python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:3]); sys.exit(0 if a[\"peak_bytes\"] == b[\"peak_bytes\"] and a[\"step_time\"][\"seconds\"] < b[\"step_time\"][\"seconds\"] and a[\"step_time\"][\"overlap\"].startswith(\"the DP gradient reduction and parameter gather overlapped\") and b[\"step_time\"][\"overlap\"] == \"no communication overlapped with compute\" else 1)" "$TMP/overlap.json" "$TMP/plain.json" || { cat "$TMP/err"; false; }'
"$NP" estimate --model llama-3.1-8b --dp 8 --zero 1 --overlap-grad-reduce on >"$TMP/out" 2>&1
check "the step-time line says what it overlapped" \
  'grep -q "^predicted step time (cost model) .*, the DP gradient reduction overlapped (--overlap-grad-reduce)$" "$TMP/out"'
"$NP" estimate --model llama-3.1-8b --dp 8 --overlap-grad-reduce on --overlap-param-gather on >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--overlap-param-gather without the distributed optimizer: exit 2, one line naming the fix" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "needs --zero 1 or more" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" estimate --model llama-3.1-8b --overlap-grad-reduce yes >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--overlap-grad-reduce yes: exit 2, one line with the valid values" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "invalid --overlap-grad-reduce .*valid: on, off" "$TMP/err"'

"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 80GB --overlap-grad-reduce on --overlap-param-gather on --top 3 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep --overlap-*: the table says what its times overlap; rows reproduce with the flags, ZeRO 1 or more" \
  '[ $rc -eq 0 ] && grep -q "^step times are the cost model.s predictions on h100-sxm-80gb (the default; --gpu picks another), the DP gradient reduction and parameter gather overlapped" "$TMP/out" && [ "$(grep -c "nanoplan estimate .*--zero [123] .*--overlap-grad-reduce on --overlap-param-gather on" "$TMP/out")" -eq 3 ] && ! grep -q -- "--zero 0" "$TMP/out"'

# Megatron's --tp-comm-overlap: Transformer Engine's userbuffers, in the memory and the step time;
# read from --megatron-args and written back by --emit megatron.
"$NP" estimate --model llama-3.1-70b --tp 8 --sp on --impl megatron --format json >"$TMP/tp.json" 2>"$TMP/err"
"$NP" estimate --model llama-3.1-70b --tp 8 --sp on --impl megatron --tp-comm-overlap on --format json >"$TMP/tpo.json" 2>>"$TMP/err"
check "--tp-comm-overlap on: a shorter step, the userbuffers in the device peak, said in JSON" \
  'python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:3]); sys.exit(0 if a[\"peak_bytes\"] > b[\"peak_bytes\"] and a[\"step_time\"][\"seconds\"] < b[\"step_time\"][\"seconds\"] and \"--tp-comm-overlap\" in a[\"step_time\"][\"overlap\"] else 1)" "$TMP/tpo.json" "$TMP/tp.json" || { cat "$TMP/err"; false; }'
"$NP" estimate --model llama-3.1-70b --tp 8 --sp on --impl megatron --tp-comm-overlap on >"$TMP/out" 2>&1
check "the table has the userbuffers' lines" \
  'grep -q "^  TE userbuffers  .*12 bf16 \[s\*b/cp, h\] buffers" "$TMP/out" && grep -q "^  TE userbuffers cuBLAS workspace +" "$TMP/out"'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 80GB --impl megatron --tp-comm-overlap on --top 40 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep --tp-comm-overlap on: overlapped where TP runs with SP, the tp 1 setups kept without it" \
  '[ $rc -eq 0 ] && grep -q "^step times are the cost model.s predictions .*--tp-comm-overlap" "$TMP/out" && grep -q "nanoplan estimate .*--tp [248] .*--tp-comm-overlap on" "$TMP/out" && grep "nanoplan estimate " "$TMP/out" | grep -- "--tp 1 " | grep -qv -- "--tp-comm-overlap" || { cat "$TMP/err"; false; }'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 80GB --tp-comm-overlap on >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep --tp-comm-overlap on under nanotron's profile: exit 2, one line naming the fix" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q -- "--impl megatron" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 80GB --impl megatron --fp8 tensorwise --top 40 --format json >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep --impl megatron --fp8 tensorwise: every setup in Transformer Engine's float8, its command saying so" \
  '[ $rc -eq 0 ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[\"top\"]; sys.exit(0 if r and all(s[\"setup\"][\"fp8\"] == \"tensorwise\" and \"--fp8 tensorwise\" in s[\"command\"] for s in r) else 1)" "$TMP/out" || { cat "$TMP/err"; false; }'
"$NP" sweep --model llama-3.1-8b --gpus 8 --budget 80GB --fp8 delayed >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep --fp8 delayed under nanotron's profile: exit 2, one line naming the profiles" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q -- "--impl megatron" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" estimate --model llama-3.1-70b --tp 8 --sp on --tp-comm-overlap on >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--tp-comm-overlap on under nanotron's profile: exit 2, one line naming the fix" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "needs --impl megatron" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" estimate --model llama-3.1-70b --tp 8 --sp off --impl megatron --tp-comm-overlap on >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--tp-comm-overlap on without SP: exit 2, one line" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "needs --tp 2 or more and --sp on" "$TMP/err"'
"$NP" estimate --model llama-3.1-70b --megatron-args "--tensor-model-parallel-size 8 --sequence-parallel --tp-comm-overlap --micro-batch-size 1 --seq-length 4096" --emit megatron >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--megatron-args --tp-comm-overlap: read, and --emit megatron writes it back" \
  '[ $rc -eq 0 ] && grep -q -- "--tp-comm-overlap" "$TMP/out" || { cat "$TMP/err"; false; }'
# Dense layers among MoE layers ([moe] dense_layers: DeepSeek's first layers, Qwen-MoE's
# mlp_only_layers): estimated and planned per layer kind (the auto planner solves each kind's
# options), swept; --partition auto refused in one line until it searches such models.
cp "$SRC_DIR/models/qwen3-30b-a3b.toml" "$TMP/mixed.toml"
sed -i -e 's/^name = .*/name = "qwen3-30b-a3b-mixed"/' -e '/^aliases/d' "$TMP/mixed.toml"
printf 'dense_layers = [0, 1]\n' >>"$TMP/mixed.toml"
"$NP" estimate --model "$TMP/mixed.toml" --ep 8 --dp 8 --zero 1 --recompute full --format json >"$TMP/mixed.json" 2>"$TMP/err"; rc=$?
"$NP" estimate --model qwen3-30b-a3b --ep 8 --dp 8 --zero 1 --recompute full --format json >"$TMP/allmoe.json" 2>>"$TMP/err"
check "[moe] dense_layers: two layers' experts traded for dense MLPs in the count and the bytes" \
  'python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:3]); sys.exit(0 if a[\"model\"][\"parameters\"] == b[\"model\"][\"parameters\"] - 2*(128*3*2048*768 + 128*2048) + 2*3*2048*6144 and a[\"peak_bytes\"] != b[\"peak_bytes\"] else 1)" "$TMP/mixed.json" "$TMP/allmoe.json" || { cat "$TMP/err"; false; }'
"$NP" estimate --model "$TMP/mixed.toml" --ep 8 --dp 8 --zero 1 --pp 2 --budget 60GB --format json >"$TMP/mixedauto.json" 2>"$TMP/err"; rc=$?
check "dense and MoE layers under --recompute auto: a plan that fits, each layer an option of its own kind" \
  'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); p=j[\"plan\"]; names=[l[\"option\"] for s in p[\"per_stage\"] for l in s[\"layers\"]]; sys.exit(0 if j[\"fits\"] and len(names)==48 and all((\"moe.\" in n) == (i>1) for i,n in enumerate(names) if n.startswith(\"custom\")) and p[\"dense_frontier\"] else 1)" "$TMP/mixedauto.json" || { cat "$TMP/err"; false; }'
"$NP" estimate --model "$TMP/mixed.toml" --ep 8 --dp 8 --pp 2 --budget 80GB --partition auto >"$TMP/out" 2>"$TMP/err"; rc=$?
check "dense and MoE layers under --partition auto: exit 2, one line naming what works" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "valid: --partition balanced" "$TMP/err" && [ ! -s "$TMP/out" ]'
"$NP" sweep --model "$TMP/mixed.toml" --gpus 8 --budget 80GB --top 3 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "sweep of a model with dense and MoE layers: ranked setups" \
  '[ $rc -eq 0 ] && grep -q "^   1 " "$TMP/out" || { cat "$TMP/err"; false; }'
# Labels that say what the setup does.
"$NP" estimate --model llama-3.1-8b --dp 2 --zero 3 >"$TMP/z3.txt" 2>&1
check "ZeRO-3: the gradient and optimizer lines say ZeRO-3" \
  'grep -q "^  gradients (fp32) .*ZeRO-3 shard" "$TMP/z3.txt" && grep -q "^  optimizer (adamw) .*ZeRO-3 shard" "$TMP/z3.txt"'
check "the cuBLAS line names no one GPU's compute capability" \
  'grep -q "cuBLAS workspaces" "$TMP/z3.txt" && ! grep -q "sm_90" "$TMP/z3.txt"'
"$NP" estimate --model llama-3.1-8b --tp 2 --recompute none >"$TMP/none.txt" 2>&1
check "recompute none under SP: its recompute time is the all-gathers'" \
  'grep -q "recompute none, tp_recompute_allgather true (the all-gathers re-done in backward are the recompute time below)" "$TMP/none.txt"'
"$NP" estimate --model llama-3.1-8b --recompute selective >"$TMP/sel.txt" 2>&1
check "selective under flash attention: keeps what none keeps, said without --verbose" \
  'grep -q "recompute selective (under flash attention it keeps what none keeps" "$TMP/sel.txt"'

# Multi-token prediction: DeepSeek-V3 trains with one depth by default, on the last stage
# (weights and activations), --mtp-layers 0 drops it; Megatron's flags read and written back;
# nanotron's closest config says it has none.
SPLIT=$(printf '4,%.0s' $(seq 15))1  # the same layers per stage with and without it
MTP=(estimate --model deepseek-v3 --tp 8 --pp 16 --partition "$SPLIT" --ep 8 --dp 8 --zero 1 --recompute full --format json)
"$NP" "${MTP[@]}" >"$TMP/mtp1.json" 2>"$TMP/err"
"$NP" "${MTP[@]}" --mtp-layers 0 >"$TMP/mtp0.json" 2>>"$TMP/err"
check "--mtp-layers: the last stage holds the depth's weights and activations, the first the same" \
  'python3 -c "
import json,sys
a,b=(json.load(open(p)) for p in sys.argv[1:3])
s1,s0=a[\"ranks\"],b[\"ranks\"]
ok=s1[-1][\"parameter_bytes\"]>s0[-1][\"parameter_bytes\"] and s1[-1][\"peak_bytes\"]>s0[-1][\"peak_bytes\"] and s1[0][\"peak_bytes\"]==s0[0][\"peak_bytes\"] and a[\"setup\"][\"mtp_layers\"]==1 and \"mtp_layers\" not in b[\"setup\"]
sys.exit(0 if ok else 1)" "$TMP/mtp1.json" "$TMP/mtp0.json" || { cat "$TMP/err"; false; }'
"$NP" estimate --model deepseek-v3 --megatron-args "--tensor-model-parallel-size 8 --expert-model-parallel-size 8 --sequence-parallel --micro-batch-size 1 --seq-length 4096 --mtp-num-layers 1" --dp 8 --emit megatron >"$TMP/out" 2>"$TMP/err"; rc=$?
check "--megatron-args --mtp-num-layers: read, and --emit megatron writes it back" \
  '[ $rc -eq 0 ] && grep -q -- "--mtp-num-layers 1" "$TMP/out" || { cat "$TMP/err"; false; }'
"$NP" estimate --model deepseek-v3 --tp 8 --pp 16 --ep 8 --dp 8 --emit nanotron >"$TMP/out" 2>"$TMP/err"
check "--emit nanotron: multi-token prediction said not expressible" \
  'grep -q "not expressible: nanotron has no multi-token prediction" "$TMP/out"'

# A sequence beyond the model's max_position_embeddings (RoPE): estimated, with a warning.
write_tiny_model "$TMP/tiny.toml"
"$NP" estimate --model "$TMP/tiny.toml" --seq-len 64 >"$TMP/out.txt" 2>"$TMP/err.txt"
rc=$?
check "--seq-len beyond max_position_embeddings: exit 0, a warning on stderr" \
  '[ $rc -eq 0 ] && grep -q "warning: --seq-len 64 is beyond tiny.s max_position_embeddings 32" "$TMP/err.txt"'
# torchtitan's job file: FSDP2 over the 8 GPUs --gpus gives (data_parallel_shard_degree -1), every
# second layer checkpointed, the notes on stderr; its emitted sections read back to the same
# setup; --fsdp alone is a switch.
TT="$SRC_DIR/tests/data/torchtitan_llama3_8b.toml"
"$NP" estimate --torchtitan-config "$TT" --gpus 8 --format json >"$TMP/tt.json" 2>"$TMP/tt.err"
rc=$?
check "torchtitan config: exit 0, FSDP2 over 8, micro-batch 2 x 8192, every 2nd layer recomputed" \
  '[ $rc -eq 0 ] && python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"setup\"]; sys.exit(0 if (s[\"dp\"], s.get(\"fsdp\"), s[\"micro_batch\"], s[\"seq_len\"], s[\"recompute\"], s.get(\"recompute_every\")) == (8, True, 2, 8192, \"full\", 2) else 1)" "$TMP/tt.json"'
check "torchtitan config: llama3 is the torchtitan profile" \
  'python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"setup\"][\"impl\"] == \"torchtitan\" else 1)" "$TMP/tt.json"'
sed 's/^name = "llama3"/name = "deepseek_v3"/; s/^flavor = "8B"/flavor = "16B"/' "$TT" >"$TMP/tt_ds.toml"
"$NP" estimate --torchtitan-config "$TMP/tt_ds.toml" --gpus 8 >/dev/null 2>"$TMP/tt.err"
check "torchtitan config: its notes on stderr, one line each" \
  'grep -q "tt_ds.toml: torchtitan.s deepseek_v3 16B code is estimated with the --impl kernels" "$TMP/tt.err"'
# Per-op checkpointing: the job file's "op", estimated, emitted back; the executors run the
# policy event-exact (the cache of kept outputs under TP too), the CPU one on torchtitan's code.
sed 's/^selective_ac_option = "2"/selective_ac_option = "op"/' "$TT" >"$TMP/tt_op.toml"
"$NP" estimate --torchtitan-config "$TMP/tt_op.toml" --gpus 8 >"$TMP/out.txt" 2>&1
rc=$?
check "torchtitan op checkpointing: exit 0, 994 MiB kept per layer" \
  '[ $rc -eq 0 ] && grep -q "per layer per micro-batch: 994 MiB .*policy selective-op" "$TMP/out.txt"'
"$NP" estimate --torchtitan-config "$TMP/tt_op.toml" --gpus 8 --emit torchtitan >"$TMP/out.txt" 2>&1
check "--emit torchtitan writes selective_ac_option \"op\" back" \
  'grep -q "^selective_ac_option = \"op\"" "$TMP/out.txt"'
write_tiny_model "$TMP/tiny.toml"
for setup in "--tp 1" "--tp 2 --sp on" "--tp 2 --sp on --pp 2 --pp-schedule 1f1b --microbatches 2"; do
  "$NP" run --model "$TMP/tiny.toml" --seq-len 16 --recompute selective-op $setup >"$TMP/run.txt" 2>&1
  check "selective-op event-exact: $setup" '[ $? -eq 0 ] && grep -q "predicted = measured" "$TMP/run.txt"'
done
"$NP" run --model "$TMP/tiny.toml" --seq-len 16 --impl torchtitan --recompute selective-op \
  --tp 2 --sp on >"$TMP/run.txt" 2>&1
check "run --impl torchtitan --recompute selective-op on the CPU executor: event-exact" \
  '[ $? -eq 0 ] && grep -q "predicted = measured" "$TMP/run.txt"'
"$NP" estimate --model deepseek-v3 --impl torchtitan >"$TMP/out.txt" 2>&1
rc=$?
check "--impl torchtitan with MLA: exit 2, one line naming what the model has" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out.txt")" -eq 1 ] && grep -q "multi-head latent attention" "$TMP/out.txt"'
"$NP" estimate --torchtitan-config "$TT" --gpus 8 --emit torchtitan >"$TMP/tt_emit.toml" 2>/dev/null
cp "$TMP/tt_emit.toml" "$TMP/tt_back.toml"
"$NP" estimate --torchtitan-config "$TMP/tt_back.toml" --format json >"$TMP/tt_back.json" 2>/dev/null
check "--emit torchtitan reads back into the same setup" \
  'python3 -c "import json,sys; a=json.load(open(sys.argv[1]))[\"setup\"]; b=json.load(open(sys.argv[2]))[\"setup\"]; sys.exit(0 if a==b else 1)" "$TMP/tt.json" "$TMP/tt_back.json"'
"$NP" estimate --model llama-3.1-8b --dp 8 --fsdp --format json >"$TMP/fsdp.json" 2>/dev/null
check "--fsdp given alone switches FSDP2 on" \
  'python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"setup\"]; sys.exit(0 if s.get(\"fsdp\") and s[\"pp_schedule\"] == \"1f1b\" else 1)" "$TMP/fsdp.json"'
finish

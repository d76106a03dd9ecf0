#!/usr/bin/env bash
# The planner binary and the executor (tools/CMakeLists.txt, executor/cuda/module.hpp): nanoplan
# links no CUDA, MPI or executor library, answers estimate, plan and sweep with no executor beside
# it and says in one line (exit 2) that run needs one; nanoplan-executor opens the CUDA backend
# module only for --backend cuda, says why in one line (exit 2) when it cannot, and runs a plan
# through the emulated CUDA module with predicted = measured.
# Usage: bash tests/cli_executor.sh /path/to/nanoplan /path/to/libnanoplan_cuda_emu.so
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$1"
EMU=$2
BIN_DIR=$(dirname "$NP")
write_tiny_model "$TMP/tiny.toml"

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
needed "$NP" >"$TMP/needed"
check "nanoplan needs no CUDA, cuBLAS, NCCL, MPI or OpenMP library" \
  '! grep -Eq "^lib(cuda|cudart|cublas|cublasLt|nccl|mpi|mpi_cxx|gomp)\." "$TMP/needed" && grep -q "^libc\.so" "$TMP/needed"'
needed "$BIN_DIR/nanoplan-executor" >"$TMP/needed-exec"
check "nanoplan-executor needs no CUDA library either (the backend is a module)" \
  '! grep -Eq "^lib(cuda|cudart|cublas|cublasLt|nccl)\." "$TMP/needed-exec"'

# The planner binary alone, in a folder with no executor and no CUDA module.
mkdir -p "$TMP/alone"
cp "$NP" "$TMP/alone/nanoplan"
export NANOPLAN_MODELS_DIR="$SRC_DIR/models"
"$TMP/alone/nanoplan" estimate --model llama-3.1-8b --tp 2 --budget 40GB >"$TMP/est" 2>&1; rc=$?
check "estimate without the executor" '[ $rc -eq 0 ] && grep -q "^budget 40,000,000,000 bytes" "$TMP/est"'
"$TMP/alone/nanoplan" plan --model "$TMP/tiny.toml" --tp 2 --seq-len 8 -o "$TMP/plan.json" 2>"$TMP/plan.err"; rc=$?
check "plan without the executor" '[ $rc -eq 0 ] && [ -s "$TMP/plan.json" ]'
"$TMP/alone/nanoplan" sweep --model llama-3.1-8b --gpus 8 --gpu h100 --top 3 >"$TMP/sweep" 2>&1; rc=$?
check "sweep without the executor" '[ $rc -eq 0 ] && grep -q "tp" "$TMP/sweep"'
"$TMP/alone/nanoplan" run "$TMP/plan.json" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run without the executor: exit 2, one line naming nanoplan-executor and how to build it" \
  '[ $rc -eq 2 ] && [ ! -s "$TMP/out" ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "^nanoplan: error: .*nanoplan-executor.*tools/build --target nanoplan-executor" "$TMP/err"'
"$TMP/alone/nanoplan" report --model "$TMP/tiny.toml" --seq-len 8 --run -o "$TMP/r.html" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "report --run without the executor: exit 2, nothing written" \
  '[ $rc -eq 2 ] && [ ! -e "$TMP/r.html" ] && grep -q "nanoplan-executor" "$TMP/err"'
"$TMP/alone/nanoplan" run --model "$TMP/tiny.toml" --tpp 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run's command line is parsed before the hand-over: an unknown flag is named, exit 2" \
  '[ $rc -eq 2 ] && grep -q "unexpected argument for nanoplan run: .--tpp" "$TMP/err"'
unset NANOPLAN_MODELS_DIR

# run hands over to nanoplan-executor beside the binary: the CPU executor needs no module.
NANOPLAN_CUDA_MODULE=/nonexistent/libnanoplan_cuda.so "$NP" run "$TMP/plan.json" >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend cpu with no CUDA module" '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out"'
NANOPLAN_CUDA_MODULE=/nonexistent/libnanoplan_cuda.so "$NP" run "$TMP/plan.json" --backend cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend cuda with no module: exit 2, one line saying it is not built" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "^nanoplan: error: --backend cuda: the CUDA backend module /nonexistent/libnanoplan_cuda.so is not built" "$TMP/err"'
printf 'not an ELF file\n' >"$TMP/libbroken.so"
NANOPLAN_CUDA_MODULE="$TMP/libbroken.so" "$NP" run "$TMP/plan.json" --backend cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend cuda with a module the loader refuses: exit 2, the loader's words in one line" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "^nanoplan: error: --backend cuda: cannot load the CUDA backend: .*libbroken.so" "$TMP/err"'
NANOPLAN_CUDA_MODULE=/nonexistent/libnanoplan_cuda.so "$NP" run "$TMP/plan.json" --backend auto >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend auto with no module: the CPU executor, the reason on stderr" \
  '[ $rc -eq 0 ] && grep -q "^nanoplan: --backend auto: the CPU executor (the CUDA backend module" "$TMP/err"'

"$NP" run "$TMP/plan.json" --backend gpu >"$TMP/out" 2>"$TMP/err"; rc=$?
check "the executor refuses its own bad input in one line, exit 2" \
  '[ $rc -eq 2 ] && [ $(wc -l <"$TMP/err") -eq 1 ] && grep -q "^nanoplan: error: invalid --backend .gpu. (valid: cpu, cuda, auto)" "$TMP/err"'

# The emulated module: the CUDA backend's whole path through the CLI, one emulated GPU.
"$NP" plan --model "$TMP/tiny.toml" --seq-len 8 --micro-batch 2 --recompute full -o "$TMP/one.json" 2>/dev/null
NANOPLAN_CUDA_MODULE="$EMU" "$NP" run "$TMP/one.json" --backend cuda --steps 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend cuda through the emulated module: predicted = measured" \
  '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out" || { cat "$TMP/err"; false; }'
check "the CUDA backend's segments from the caching allocator: reserved predicted = measured" \
  'grep -qE "reserved \(caching allocator\): predicted ([0-9,]+), measured \1; allocated blocks: predicted ([0-9,]+), measured \2$" "$TMP/out"'
NANOPLAN_CUDA_MODULE="$EMU" "$NP" run "$TMP/one.json" --backend cuda --record "$TMP/cuda.log" >"$TMP/out" 2>"$TMP/err"; rc=$?
"$NP" compare --log "$TMP/cuda.log" --model "$TMP/tiny.toml" --seq-len 8 --micro-batch 2 --recompute full \
  --format json >"$TMP/cmp.json" 2>>"$TMP/err"
check "run --backend cuda --record: the device's bytes in use on the line, read back by compare" \
  '[ $rc -eq 0 ] && grep -q "^\[Rank 0\] (after 1 iterations) memory (MB) | allocated: .* | total device memory used: " "$TMP/cuda.log" && python3 -c "import json, sys; r = json.load(open(sys.argv[1]))[\"ranks\"][0][\"measured\"]; assert r[\"device_used_bytes\"] > r[\"max_reserved_bytes\"] > 0" "$TMP/cmp.json" || { cat "$TMP/err"; false; }'
NANOPLAN_CUDA_MODULE="$EMU" "$NP" run "$TMP/one.json" --backend cuda --allocator expandable >"$TMP/out" 2>"$TMP/err"; rc=$?
check "run --backend cuda --allocator expandable: segments grown on the driver's virtual memory, reserved predicted = measured" \
  '[ $rc -eq 0 ] && grep -q "predicted = measured on every rank" "$TMP/out" && grep -qE "reserved \(caching allocator\): predicted ([0-9,]+), measured \1;" "$TMP/out" || { cat "$TMP/out" "$TMP/err"; false; }'
# nanoplan calibrate through the emulated module: a GPU file in the catalog's schema that --gpu
# FILE loads (the emulation's figures mean nothing: this is the path, not the numbers); a GPU
# missing, bad shapes, and no module are bad input (exit 2, one line).
NANOPLAN_CUDA_MODULE="$EMU" "$NP" calibrate --gpu h200 -o "$TMP/cal.toml" --gemm-shapes 64x48x32,96x64x64 \
  --attention-shapes 64x2 --head-dim 16 --copy-bytes 1MiB --repetitions 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
"$NP" estimate --model "$TMP/tiny.toml" --gpu "$TMP/cal.toml" --recompute none --format json >"$TMP/cal.json" 2>&1; rc2=$?
check "calibrate writes a GPU file that --gpu FILE loads, its tables measured" \
  '[ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "^gemm = \[" "$TMP/cal.toml" && [ "$(grep -c "^  \[" "$TMP/cal.toml")" -eq 3 ] && grep -q "nanoplan calibrate on the CUDA emulation" "$TMP/cal.json" || { cat "$TMP/out" "$TMP/err" "$TMP/cal.json"; false; }'
# NCCL's collectives over 2 ranks (threads over the NCCL emulation): the file's NVLink rows are
# this run's fit, the kinds not measured the catalog's, with both sources named.
NANOPLAN_CUDA_MODULE="$EMU" "$NP" calibrate --gpu h200 -o "$TMP/cal2.toml" --gemm-shapes 64x48x32 \
  --attention-shapes 64x2 --head-dim 16 --copy-bytes 1MiB --repetitions 2 --ranks 2 \
  --collective-bytes 64KiB,1MiB >"$TMP/out" 2>"$TMP/err"; rc=$?
"$NP" estimate --model "$TMP/tiny.toml" --gpu "$TMP/cal2.toml" --tp 2 --recompute none --format json >"$TMP/cal2.json" 2>&1; rc2=$?
check "calibrate --ranks 2: NCCL's all-reduce, all-gather, reduce-scatter, all-to-all and point-to-point timed and fitted into the NVLink rows" \
  '[ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "NCCL collectives over 2 ranks" "$TMP/out" && grep -q "^# all_gather over 2 ranks: 65,536 B .* us; 1,048,576 B .* us;" "$TMP/cal2.toml" && grep -q "^nvlink_source = \"nanoplan calibrate on the CUDA emulation.*NCCL over 2 ranks" "$TMP/cal2.toml" && [ "$(sed -n "/^\[gpu.perf.nvlink\]/,\$p" "$TMP/cal2.toml" | grep -cE "^(all_reduce|all_gather|reduce_scatter|all_to_all|p2p) = \[")" -eq 5 ] && grep -q "^# p2p over 2 ranks: 65,536 B .* us;" "$TMP/cal2.toml" || { cat "$TMP/out" "$TMP/err" "$TMP/cal2.toml"; false; }'
for bad in "--gpu nope -o $TMP/x.toml" "--gpu h200 -o $TMP/x.toml --gemm-shapes 64x48" "--gpu h200 -o $TMP/x.toml --attention-shapes 0x2" "--gpu h200 -o $TMP/x.toml --ranks 0" "--gpu h200 -o $TMP/x.toml --collective-bytes 1MiB,0"; do
  NANOPLAN_CUDA_MODULE="$EMU" "$NP" calibrate $bad >"$TMP/out" 2>&1; rc=$?
  check "calibrate $bad: exit 2, one line, nothing written" '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out")" -eq 1 ] && [ ! -e "$TMP/x.toml" ]'
done
NANOPLAN_CUDA_MODULE=/nonexistent/libnanoplan_cuda.so "$NP" calibrate --gpu h200 -o "$TMP/x.toml" >"$TMP/out" 2>&1; rc=$?
check "calibrate without the CUDA module: exit 2, one line" '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/out")" -eq 1 ] && grep -q "calibrate:" "$TMP/out"'
finish

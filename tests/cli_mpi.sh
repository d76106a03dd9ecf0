#!/usr/bin/env bash
# One process per rank: `mpirun -n N nanoplan run` on this machine (TP 2, PP 2, TP 2 x PP 2) gives
# every rank's event-exact comparison and the same losses, to the printed digit, as the in-process
# run (two steps, so the second loss also checks the first step's gradients and optimizer update);
# a wrong process count and --scenario under mpirun are refused in one line (exit 2).
# tests/mpi_grads.cpp then compares every first-step gradient bit for bit (tp 2 x pp 2).
# Usage: bash tests/cli_mpi.sh /path/to/nanoplan /path/to/mpirun /path/to/mpi_grads
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$1"
MPIRUN=$2
GRADS=$3
# Root in containers, two cores for four ranks, shared memory without ptrace (CMA) permissions.
MPI=("$MPIRUN" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none)
export OMPI_MCA_rmaps_base_oversubscribe=1
# OpenMPI's plugins keep allocations until exit and are unloaded before LeakSanitizer looks, so
# their leaks cannot be told from ours: leak checking is off for the MPI processes only (every
# other test checks nanoplan's own leaks; ASan and UBSan stay on here).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

write_tiny_model "$TMP/tiny.toml"
BASE=(--model "$TMP/tiny.toml" --seq-len 8 --micro-batch 2 --microbatches 2 --pp-schedule 1f1b --steps 2)

# same_run NAME N FLAGS...: in-process and under mpirun -n N.
same_run() {
  local name=$1 n=$2
  shift 2
  "$NP" run "${BASE[@]}" "$@" >"$TMP/$name.threads" 2>&1
  "${MPI[@]}" -n "$n" "$NP" run "${BASE[@]}" "$@" >"$TMP/$name.mpi" 2>"$TMP/$name.err"; rc=$?
  check "$name: mpirun -n $n exits 0" '[ $rc -eq 0 ] || { cat "$TMP/$name.err"; false; }'
  check "$name: predicted = measured on every rank, over MPI" \
    'grep -q "predicted = measured on every rank" "$TMP/$name.mpi" && grep -q "($n MPI processes)" "$TMP/$name.mpi"'
  check "$name: one row per rank, printed once" \
    '[ "$(grep -cE "^ +[0-9]+ +[0-9]+ +[0-9]+ " "$TMP/$name.mpi")" -eq "$n" ]'
  check "$name: the same losses as the in-process run" \
    '[ -n "$(grep "loss per step" "$TMP/$name.threads")" ] && [ "$(grep "loss per step" "$TMP/$name.mpi")" = "$(grep "loss per step" "$TMP/$name.threads")" ]'
}
same_run tp2 2 --tp 2 --recompute full
same_run pp2 2 --pp 2 --recompute selective
same_run tp2pp2 4 --tp 2 --pp 2 --recompute none
# Data-parallel replicas as processes: the DP group's reduce-scatter and all-gather over MPI.
same_run dp2zero1 2 --dp 2 --zero 1 --recompute selective
same_run tp2dp2zero0 4 --tp 2 --dp 2 --recompute full
same_run tp2dp2zero3 4 --tp 2 --dp 2 --zero 3 --recompute none
# Context parallelism: the K/V exchange over each replica's CP group, gradients over dp x cp.
same_run cp2 2 --cp 2 --recompute selective
same_run tp2cp2dp2 8 --tp 2 --cp 2 --dp 2 --zero 1 --recompute none
# Expert parallelism: the dispatch and combine all-to-alls over each EP group, the experts'
# gradients and ZeRO shards over dp / ep.
write_tiny_moe "$TMP/moe.toml"
BASE[1]="$TMP/moe.toml"
same_run ep2 2 --dp 2 --ep 2 --moe-capacity-factor 1 --zero 1 --recompute selective
same_run tp2dp4ep2 8 --tp 2 --dp 4 --ep 2 --moe-capacity-factor 1.5 --zero 3 --recompute none
BASE[1]="$TMP/tiny.toml"

"${MPI[@]}" -n 4 "$GRADS" >"$TMP/grads.out" 2>&1; rc=$?
check "tp 2 x pp 2 over MPI: losses and every gradient bitwise the in-process run's" \
  '[ $rc -eq 0 ] && grep -q "^ok: 4 processes event-exact yes" "$TMP/grads.out" || { cat "$TMP/grads.out"; false; }'

"${MPI[@]}" -n 3 "$NP" run "${BASE[@]}" --tp 2 >"$TMP/bad.out" 2>"$TMP/bad.err"; rc=$?
check "a process count other than tp x pp: exit 2, one line" \
  '[ $rc -eq 2 ] && [ "$(grep -c "start it with mpirun -n 2 (got 3 processes)" "$TMP/bad.err")" -eq 1 ]'
"${MPI[@]}" -n 2 "$NP" run --scenario "$SRC_DIR/scenarios/tiny-llama.toml" >"$TMP/sc.out" 2>"$TMP/sc.err"; rc=$?
check "--scenario under mpirun: exit 2, one line" \
  '[ $rc -eq 2 ] && [ "$(grep -c "under mpirun, run a plan or a setup" "$TMP/sc.err")" -eq 1 ]'
# The interleaved schedule: 4 layers over pp 2 x 2 chunks (the last stage's chunk 0 feeds the
# first stage's chunk 1: messages of both directions between one pair of processes, by tag).
sed 's/num_layers = 2/num_layers = 4/' "$TMP/tiny.toml" >"$TMP/tiny4.toml"
BASE=(--model "$TMP/tiny4.toml" --seq-len 8 --micro-batch 2 --microbatches 4 --pp-schedule interleaved --virtual-stages 2 --steps 2)
same_run interleaved 2 --pp 2 --recompute selective
finish

# Shared by the CLI test scripts, which source it with the nanoplan binary as $1. It sets NP (the
# binary), SRC_DIR (the source tree) and TMP (a folder removed on exit), and defines ok, fail,
# check, write_tiny_model, write_tiny_moe and finish.
set -u

if [ $# -lt 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 /path/to/nanoplan (got: '${1:-}')" >&2
  exit 1
fi
NP=$1
unset NANOPLAN_MODELS_DIR  # use the catalog the binary finds by itself
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

failures=0
cases=0

ok() { cases=$((cases + 1)); echo "ok - $1"; }
fail() { cases=$((cases + 1)); failures=$((failures + 1)); echo "FAIL - $1"; }
# check DESC EXPR: a case that passes when the shell expression EXPR succeeds.
check() { if eval "$2"; then ok "$1"; else fail "$1 (check: $2)"; fi; }
# write_tiny_model FILE: a two-layer GQA model small enough to run every rank in a moment.
write_tiny_model() {
  cat >"$1" <<'TOML'
name = "tiny"
hidden_size = 24
intermediate_size = 20
num_layers = 2
num_heads = 4
num_kv_heads = 2
vocab_size = 30
max_position_embeddings = 32
TOML
}
# write_tiny_moe FILE: the tiny model with 4 routed experts (top-2) in every layer.
write_tiny_moe() {
  write_tiny_model "$1"
  cat >>"$1" <<'TOML'

[moe]
num_experts = 4
top_k = 2
expert_intermediate_size = 12
TOML
}
# finish: the summary line; exits 1 when a case failed.
finish() {
  echo "# $cases cases, $failures failed"
  [ "$failures" -eq 0 ] && exit 0 || exit 1
}

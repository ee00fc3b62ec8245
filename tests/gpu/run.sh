#!/usr/bin/env bash
# The GPU machine's script: runs the GPU tests, the suite on the CUDA backend and the GPU
# benchmarks with the binaries tests/gpu/pack.sh put in .devrun/, writes every log under
# $OUT and prints a short table last.
#
# Here:   cmake --build build && tests/gpu/pack.sh build
# There:  (device tool, carry [".devrun"])  bash tests/gpu/run.sh [stage ...]
# Stages (default: all): info tests suite mutations bench. NCCL_NVLS_ENABLE=0 always.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/tpcheck-gpu}"
mkdir -p "$out"
# pack.sh ships one archive; unpack it once.
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$root/.devrun/tpcheck"
stages="${*:-info tests suite mutations bench}"
# TPCHECK_GPU_FILTER: a --filter regex for the suite and mutation stages (default: all).
filter=(); [ -n "${TPCHECK_GPU_FILTER:-}" ] && filter=(--filter "$TPCHECK_GPU_FILTER")
table="$out/table.md"
echo "| what | result | seconds |" >"$table"
echo "|---|---|---|" >>"$table"

row() { echo "| $1 | $2 | $3 |" >>"$table"; }
# timed NAME LOG CMD...: runs CMD, logs it, adds a row with its last line and time.
timed() {
  local name="$1" log="$2"
  shift 2
  local start end rc
  start=$(date +%s.%N)
  "$@" >"$out/$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  row "$name" "rc=$rc $(tail -n 1 "$out/$log" | tr '|' '/')" "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"
}

has() { [[ " $stages " == *" $1 "* ]]; }

if has info; then
  {
    uname -a; nproc; nvidia-smi 2>&1 | head -15
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    ldd "$bin"
  } >"$out/machine.txt" 2>&1
  row "GPU" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" ""
fi

if has tests; then
  for t in "$root"/.devrun/tests/*_test; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    timed "$name" "$name.log" "$t" --gtest_brief=1
    grep -E "^\[  (FAILED|PASSED|SKIPPED) +\]|Failure|error" "$out/$name.log" | head -40 >>"$out/failures.txt"
  done
fi

if has suite; then
  for tp in 1 2 4 8; do
    timed "te suite, cuda, tp $tp emulated" "te_cuda_tp$tp.log" \
      "$bin" run --backend cuda --suite te --tp "$tp" --quiet "${filter[@]}" --json "$out/te_cuda_tp$tp.json"
  done
  for tp in 2 4 8; do
    timed "full suite, cuda, tp $tp emulated" "full_cuda_tp$tp.log" \
      "$bin" run --backend cuda --suite full --tp "$tp" --quiet "${filter[@]}" --json "$out/full_cuda_tp$tp.json"
  done
  timed "te suite, cuda, tp 4, seq 32 x batch 32" "te_cuda_tp4_1024.log" \
    "$bin" run --backend cuda --suite te --tp 4 --seq 32 --batch 32 --quiet "${filter[@]}" --json "$out/te_cuda_tp4_1024.json"
fi

if has mutations; then
  for tp in 2 4 8; do
    for m in $("$bin" mutations | awk '{print $1}'); do
      # The full suite: it reaches every mutation's path (te misses the full-only ones).
      timed "mutation $m tp $tp" "mut_${m}_tp$tp.log" "$bin" run --backend cuda --suite full --tp "$tp" --quiet "${filter[@]}" --mutate "$m"
    done
  done
fi

if has bench; then
  for b in "$root"/.devrun/bench/*; do
    [ -x "$b" ] || continue
    timed "bench $(basename "$b")" "bench_$(basename "$b").log" "$b"
  done
fi

cat "$out/failures.txt" 2>/dev/null | grep -v PASSED | head -30
echo
cat "$table"

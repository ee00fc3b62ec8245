#!/usr/bin/env bash
# GPU machine smoke run: the tpcheck program built here (Debian 12, nvcc 13) run on the
# lent H200 machine, whose image has CUDA but not the Debian C++ libraries tpcheck links.
#
# Here, before the device call (see tests/gpu/README.md):
#   tests/gpu/pack.sh                  # copies build/tpcheck (stripped) + its .so files to .devrun/
# On the device machine (device tool, carry [".devrun"]):
#   NCCL_NVLS_ENABLE=0 bash tests/gpu/run.sh
# Writes logs and JSON reports under $OUT and prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out="${OUT:-/tmp/tpcheck-gpu}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devrun${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$PWD/.devrun/tpcheck"

{
  echo "== machine"; uname -a; nproc; nvidia-smi -L 2>&1
  echo "== C++ libraries on this image (tpcheck builds need them)"
  for h in fmt/format.h nlohmann/json.hpp CLI/CLI.hpp cblas.h gtest/gtest.h benchmark/benchmark.h; do
    if [ -e "/usr/include/$h" ] || [ -e "/usr/local/include/$h" ]; then echo "present $h"; else echo "missing $h"; fi
  done
  command -v g++ nvcc cmake ninja 2>&1
  echo "== ldd"; ldd "$bin"
} > "$out/machine.txt" 2>&1

declare -A seconds result
for tp in 4 8; do
  start=$(date +%s%N)
  "$bin" run --tp "$tp" --quiet --json "$out/te_tp$tp.json" > "$out/te_tp$tp.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  seconds[$tp]="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  result[$tp]="rc=$rc $(tail -1 "$out/te_tp$tp.log")"
done
devices=$(python3 -c "import json;print(json.load(open('$out/te_tp4.json'))['environment']['devices'])" 2>/dev/null)

cat "$out/machine.txt"
echo
echo "| what | result |"
echo "|---|---|"
echo "| devices seen by tpcheck | ${devices:-?} |"
for tp in 4 8; do
  echo "| te suite, CPU backend, tp $tp ($(nproc) cores) | ${result[$tp]}, ${seconds[$tp]} s |"
done

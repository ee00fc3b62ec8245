#!/usr/bin/env bash
# A sampling profiler for the GPU machine, which has no perf, gdb or nsys (only cuda-gdb,
# which can attach to a running program): starts a command, stops it every INTERVAL
# seconds with cuda-gdb to read every thread's stack, and prints which functions the
# busy threads were in (tests/gpu/fold_stacks.py). Host time is what it sees: a thread
# waiting for the GPU shows as the synchronizing call.
#   tests/gpu/sample_stacks.sh OUTDIR SAMPLES INTERVAL -- command ...
# tpcheck keeps its function names (tests/gpu/pack.sh strips debug information only).
set -uo pipefail
out="$1" samples="$2" interval="$3"
shift 3
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
"$@" >"$out/program.log" 2>&1 &
pid=$!
sleep "$interval"
for ((i = 0; i < samples; i++)); do
  kill -0 "$pid" 2>/dev/null || break
  timeout 60 cuda-gdb -q -p "$pid" -batch -ex "set pagination off" \
    -ex "thread apply all bt 40" >"$out/sample_$i.txt" 2>&1
  sleep "$interval"
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
python3 "$(dirname "$0")/fold_stacks.py" "$out"/sample_*.txt

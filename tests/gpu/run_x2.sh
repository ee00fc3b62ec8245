#!/usr/bin/env bash
# The 2-GPU run (nvidia-h200-x2): the te suite over NCCL at TP 2 through (a) one process
# with two GPUs and (b) mpirun -np 2; every mutation over NCCL; emulation ≡ NCCL (the
# suite emulated on one GPU against NCCL on two, with NCCL pinned to what the emulation
# models: Ring, Simple, one channel); a rank SIGKILLed under mpirun, REPS times.
# Binaries from tests/gpu/pack.sh (carry .devrun). Logs under $OUT, a table last.
#   bash tests/gpu/run_x2.sh [reps]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/tpcheck-x2}"
mkdir -p "$out"
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=1 NCCL_MAX_NCHANNELS=1
bin="$root/.devrun/tpcheck"
reps="${1:-20}"
# MUT_FILTER: the cases each mutation runs on over NCCL (default: all).
mut_filter=(); [ -n "${MUT_FILTER:-}" ] && mut_filter=(--filter "$MUT_FILTER")
table="$out/x2_table.md"
echo "| what | result | seconds |" >"$table"; echo "|---|---|---|" >>"$table"
row() { echo "| $1 | $2 | $3 |" >>"$table"; }
timed() {
  local name="$1" log="$2"; shift 2
  local start end rc
  start=$(date +%s.%N); "$@" >"$out/$log" 2>&1; rc=$?; end=$(date +%s.%N)
  row "$name" "rc=$rc $(tail -n 1 "$out/$log" | tr '|' '/')" "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"
}
nvidia-smi -L >"$out/x2_machine.txt" 2>&1

timed "te, nccl (a) one process, tp 2" nccl_a.log timeout 200 "$bin" run --backend cuda --comm nccl --suite te --tp 2 --quiet --json "$out/nccl_a.json"
timed "te, nccl (b) mpirun -np 2" nccl_b.log bash "$root/tests/gpu/launch_mpirun.sh" 2 "$bin" run --backend cuda --suite te --tp 2 --quiet --json "$out/nccl_b.json"
timed "te, emulated on one GPU, tp 2" emu.log timeout 100 "$bin" run --backend cuda --comm emulated --suite te --tp 2 --quiet --json "$out/emu.json"
# Emulation ≡ NCCL: every compared tensor's statistics (max |diff| and where, the values
# there, errors against truth, bit-difference counts: all functions of the sharded bits)
# and every GEMM site's algorithm, identical in both runs.
python3 - "$out/emu.json" "$out/nccl_a.json" "$out/nccl_b.json" >"$out/equiv.txt" 2>&1 <<'PY'
import json, sys
def load(p):
    return {c["id"]: c for c in json.load(open(p))["cases"]}
emu = load(sys.argv[1])
for other in sys.argv[2:]:
    nc = load(other)
    diffs = []
    for cid, c in emu.items():
        d = nc[cid]
        for t, u in zip(c["tensors"], d["tensors"]):
            if t["statistics"] != u["statistics"]:
                diffs.append(f"{cid}: {t['name']}")
        if [g["sharded"].get("cublaslt", {}).get("algo_id") for g in c["gemm_class_diffs"]] != \
           [g["sharded"].get("cublaslt", {}).get("algo_id") for g in d["gemm_class_diffs"]]:
            diffs.append(f"{cid}: gemm diffs differ")
    print(f"{other}: {len(emu)} cases, {len(diffs)} tensors whose statistics differ from the emulation")
    for x in diffs[:20]:
        print("  ", x)
PY
row "emulation ≡ NCCL (statistics of every tensor)" "$(tr '\n' ' ' <"$out/equiv.txt" | cut -c1-300)" ""

for m in $("$bin" mutations | awk '{print $1}'); do
  timed "mutation $m, nccl tp 2" "mut_$m.log" timeout 60 "$bin" run --backend cuda --comm nccl --tp 2 --quiet "${mut_filter[@]}" --mutate "$m"
done

# SIGKILL of rank 1 in the middle of the suite under mpirun: rank 0 must end, naming it.
hung=0
for i in $(seq "$reps"); do
  start=$(date +%s.%N)
  bash "$root/tests/gpu/launch_mpirun.sh" 2 "$bin" run --backend cuda --suite te --tp 2 --quiet >"$out/kill_$i.log" 2>&1 &
  launcher=$!
  sleep 3
  pkill -KILL -f -n "tpcheck run --backend cuda --suite te --tp 2" 2>/dev/null
  killed=$(date +%s.%N)
  wait "$launcher"; rc=$?
  end=$(date +%s.%N)
  secs=$(awk -v a="$killed" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  [ "$rc" -eq 124 ] && hung=$((hung + 1))
  echo "rep $i rc=$rc ended ${secs}s after the kill: $(grep -h 'error' "$out/kill_$i.log" | head -1)" >>"$out/kill_summary.txt"
done
row "SIGKILL one rank under mpirun, $reps reps" "hangs: $hung; $(awk '{print $5}' "$out/kill_summary.txt" | sort -n | tail -1) max" ""
head -3 "$out/kill_summary.txt"
cat "$out/equiv.txt"
cat "$table"

#!/usr/bin/env bash
# The 2-GPU run (nvidia-h200-x2), issue 12. Binaries from tests/gpu/pack.sh (carry
# .devrun). Logs under $OUT, a table last.
#   bash tests/gpu/run_x2.sh [stage ...]      stages (default: all):
#     suite      the te and full suites over NCCL at TP 2 through (a) one process with two
#                GPUs and (b) mpirun -np 2, and emulated on one GPU; emulation ≡ NCCL:
#                every compared tensor's statistics and every GEMM site's algorithm
#     mutations  every mutation of the catalog on the full suite, over (a) and over (b)
#     faults     REPS times each (default 20): rank 1 throws in the middle of the suite
#                under (a) and under (b); rank 1 SIGKILLed in the middle of the suite under
#                mpirun. The other rank must end with an error naming rank 1 within 10 s
#     pytorch    bench/suite_vs_pytorch.sh --distributed 2: tpcheck over NCCL against the
#                PyTorch twin under torchrun --nproc_per_node=2
# NCCL is pinned to what the emulation models (Ring, Simple, one channel); NVLink
# multicast stays off.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# Logs go to X2_LOGS (default $OUT, else /tmp/tpcheck-x2); when that is not $OUT, they
# come back as $OUT/x2_logs.tgz with the table.
out="${X2_LOGS:-${OUT:-/tmp/tpcheck-x2}}"
mkdir -p "$out"
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=1 NCCL_MAX_NCHANNELS=1
bin="$root/.devrun/tpcheck"
mpi="$root/tests/gpu/launch_mpirun.sh"
stages="${*:-suite mutations faults pytorch}"
reps="${REPS:-20}"
has() { [[ " $stages " == *" $1 "* ]]; }
table="$out/x2_table.md"
echo "| what | result | seconds |" >"$table"; echo "|---|---|---|" >>"$table"
row() { echo "| $1 | $2 | $3 |" >>"$table"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
# timed NAME LOG CMD...: a row with CMD's exit status, its summary line (rank 0's "N passed,
# M failed", which mpirun may follow with its own messages) or else its last line, and time.
timed() {
  local name="$1" log="$2"; shift 2
  local start rc summary
  start=$(date +%s.%N); "$@" >"$out/$log" 2>&1; rc=$?
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/$log" | tail -n 1)
  [ -n "$summary" ] || summary=$(tail -n 1 "$out/$log")
  row "$name" "rc=$rc $(echo "$summary" | tr '|' '/')" "$(secs "$start" "$(date +%s.%N)")"
}
# Prefixes every line with the time it arrived (seconds since the epoch).
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
{ nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version --format=csv; } >"$out/x2_machine.txt" 2>&1

if has suite; then
  for suite in te full; do
    timed "$suite, nccl (a) one process, tp 2" "nccl_a_$suite.log" timeout 200 "$bin" run --backend cuda --comm nccl --suite "$suite" --tp 2 --quiet --json "$out/nccl_a_$suite.json"
    timed "$suite, nccl (b) mpirun -np 2" "nccl_b_$suite.log" bash "$mpi" 2 "$bin" run --backend cuda --suite "$suite" --tp 2 --quiet --json "$out/nccl_b_$suite.json"
    timed "$suite, emulated on one GPU, tp 2" "emu_$suite.log" timeout 200 "$bin" run --backend cuda --comm emulated --suite "$suite" --tp 2 --quiet --json "$out/emu_$suite.json"
    # Emulation ≡ NCCL: every compared tensor's statistics (max |diff| and where, the values
    # there, errors against truth, bit-difference counts: functions of the sharded bits),
    # every GEMM site whose algorithm differs between single and sharded with its full
    # cuBLASLt record (the other sites ran single's algorithm, and single runs on GPU 0 in
    # both), and the collectives' ledger: identical in the emulated and both NCCL runs.
    python3 - "$out/emu_$suite.json" "$out/nccl_a_$suite.json" "$out/nccl_b_$suite.json" >"$out/equiv_$suite.txt" 2>&1 <<'PY'
import json, sys
def load(p):
    return {c["id"]: c for c in json.load(open(p))["cases"]}
def sites(c):
    return [(g["site"], g["occurrence"], json.dumps(g["sharded"].get("cublaslt"), sort_keys=True))
            for g in c["gemm_class_diffs"]]
def comms(c):
    return [(x["kind"], x["dtype"], x["shape"], x["bytes"]) for x in c["collectives"]]
emu = load(sys.argv[1])
for other in sys.argv[2:]:
    nc = load(other)
    diffs = []
    if set(nc) != set(emu):
        diffs.append(f"case sets differ: {sorted(set(nc) ^ set(emu))[:5]}")
    tensors = 0
    for cid, c in emu.items():
        d = nc.get(cid)
        if d is None:
            continue
        for t, u in zip(c["tensors"], d["tensors"]):
            tensors += 1
            if t["name"] != u["name"] or t["statistics"] != u["statistics"]:
                diffs.append(f"{cid}: {t['name']}")
        if sites(c) != sites(d):
            diffs.append(f"{cid}: GEMM algorithms differ")
        if comms(c) != comms(d):
            diffs.append(f"{cid}: collectives differ")
    print(f"{other.split('/')[-1]}: {len(emu)} cases, {tensors} tensors, {len(diffs)} differences from the emulation")
    for x in diffs[:20]:
        print("  ", x)
PY
    row "$suite: emulation ≡ NCCL (every tensor's statistics, GEMM algorithms, collectives)" "$(tr '\n' ' ' <"$out/equiv_$suite.txt" | cut -c1-400)" ""
  done
fi

if has mutations; then
  # Every mutation must make the run fail (exit 1) through both launches.
  for m in $("$bin" mutations | awk '{print $1}'); do
    timed "mutation $m, full suite, nccl (a)" "mut_a_$m.log" timeout 100 "$bin" run --backend cuda --comm nccl --suite full --tp 2 --quiet --mutate "$m"
    timed "mutation $m, full suite, nccl (b)" "mut_b_$m.log" bash "$mpi" 2 "$bin" run --backend cuda --suite full --tp 2 --quiet --mutate "$m"
  done
fi

if has faults; then
  # fault NAME LOGPREFIX PATTERN CMD...: REPS runs of CMD, whose rank 1 throws at the start
  # of the 60th sharded run (about half of the te suite); the time from the throw (the line
  # the hook prints) to the end of the run, the exit status and the first error line. The
  # error that must be printed matches PATTERN: under (a) the one process reports rank 1's
  # error; under (b) rank 0's process must say "rank 1 failed".
  fault() {
    local name="$1" prefix="$2" pattern="$3"; shift 3
    local hung=0 unnamed=0 worst=0 i log rc thrown end s
    for i in $(seq "$reps"); do
      log="$out/${prefix}_$i.log"
      "$@" 2>&1 | stamp >"$log"; rc=${PIPESTATUS[0]}
      end=$(date +%s.%N)
      thrown=$(grep -m1 -- '--inject-failure: rank 1 throws now' "$log" | cut -d' ' -f1)
      s=$([ -n "$thrown" ] && secs "$thrown" "$end" || echo "never-thrown")
      [ "$rc" -eq 124 ] && hung=$((hung + 1))
      grep -q "$pattern" "$log" || unnamed=$((unnamed + 1))
      worst=$(printf '%s\n%s\n' "$worst" "$s" | sort -g | tail -1)
      echo "rep $i rc=$rc ended ${s}s after the throw: $(grep -m1 'error:' "$log" | cut -d' ' -f2-)" >>"$out/${prefix}_summary.txt"
    done
    row "$name, $reps reps" "hangs: $hung; errors not naming rank 1: $unnamed; exit $(cut -d' ' -f3 "$out/${prefix}_summary.txt" | sort | uniq -c | tr '\n' ' ')" "max ${worst} after the throw"
  }
  fault "rank 1 throws mid-suite, nccl (a)" throw_a 'tpcheck: error: rank 1: injected failure' timeout 60 "$bin" run --backend cuda --comm nccl --suite te --tp 2 --quiet --inject-failure 1@60
  fault "rank 1 throws mid-suite, nccl (b) mpirun" throw_b 'tpcheck: error: rank 1 failed' bash "$mpi" 2 "$bin" run --backend cuda --suite te --tp 2 --quiet --inject-failure 1@60

  # SIGKILL of rank 1 under mpirun once rank 0 has printed 40 case lines.
  hung=0; unnamed=0; worst=0
  for i in $(seq "$reps"); do
    log="$out/kill_$i.log"
    bash "$mpi" 2 "$bin" run --backend cuda --suite te --tp 2 > >(stamp >"$log") 2>&1 &
    launcher=$!
    for _ in $(seq 300); do  # up to 30 s
      [ "$(grep -c -E '^[0-9.]+ (PASS|FAIL|WARN)' "$log" 2>/dev/null)" -ge 40 ] && break
      sleep 0.1
    done
    victim=""
    for pid in $(pgrep -f "tpcheck run --backend cuda --suite te --tp 2"); do
      if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
    done
    killed=$(date +%s.%N)
    [ -n "$victim" ] && kill -KILL "$victim"
    wait "$launcher"; rc=$?
    sleep 0.2  # the stamp process drains the last lines
    end=$(date +%s.%N)
    s=$(secs "$killed" "$end")
    [ "$rc" -eq 124 ] && hung=$((hung + 1))
    grep -q 'tpcheck: error: rank 1 failed' "$log" || unnamed=$((unnamed + 1))
    worst=$(printf '%s\n%s\n' "$worst" "$s" | sort -g | tail -1)
    echo "rep $i victim=${victim:-none} rc=$rc ended ${s}s after the kill, $(grep -c -E '^[0-9.]+ (PASS|FAIL|WARN)' "$log") cases printed: $(grep -m1 'error' "$log" | cut -d' ' -f2-)" >>"$out/kill_summary.txt"
  done
  row "SIGKILL rank 1 mid-suite under mpirun, $reps reps" "hangs: $hung; errors not naming rank 1: $unnamed" "max ${worst} after the kill"
  for f in throw_a throw_b kill; do head -2 "$out/${f}_summary.txt"; done
fi

if has pytorch; then
  # NCCL's own choices on both sides (the pins above are for the equivalence check).
  env -u NCCL_ALGO -u NCCL_PROTO -u NCCL_MIN_NCHANNELS -u NCCL_MAX_NCHANNELS \
    OUT="$out/suite_vs_pytorch" TPCHECK="$bin" \
    bash "$root/bench/suite_vs_pytorch.sh" --distributed 2 --runs 3 >"$out/suite_vs_pytorch.txt" 2>&1
  row "suite vs PyTorch, TP 2 over NCCL (torchrun --nproc_per_node=2), 3 runs" "$(tail -n 2 "$out/suite_vs_pytorch.txt" | head -1 | tr -s ' ')" ""
  cat "$out/suite_vs_pytorch.txt"
fi

for f in "$out"/equiv_*.txt; do [ -f "$f" ] && cat "$f"; done
# Every log in one archive (the device tool brings back a limited number of files).
[ -n "${OUT:-}" ] && [ "$out" != "$OUT" ] && { tar -C "$out" -czf "$OUT/x2_logs.tgz" .; cp "$table" "$OUT/"; }
cat "$table"

#!/usr/bin/env bash
# The multi-GPU run: TP N over NCCL with one rank per GPU, N = every GPU of the machine
# (TPCHECK_TP to choose fewer). Written for 2 GPUs (nvidia-h200-x2, issue 12, run there as
# run_x2.sh); the same stages at TP 4 and 8 are issues 13 and 14 (nvidia-h200-x4 / -x8),
# plus te_atol and production, which only those ask for. Binaries from tests/gpu/pack.sh
# (carry .devrun). Logs under $OUT, a table last.
#   bash tests/gpu/run_multi.sh [stage ...]      stages (default: suite mutations faults pytorch):
#     suite      the te and full suites over NCCL at TP N through (a) one process with N
#                GPUs and (b) mpirun -np N, and emulated on one GPU; emulation ≡ NCCL:
#                every compared tensor's statistics and every GEMM site's algorithm
#     mutations  every mutation of the catalog on the full suite, over (a) and over (b)
#     faults     REPS times each (default 20): rank 1 throws in the middle of the suite
#                under (a) and under (b); rank 1 SIGKILLed in the middle of the suite under
#                mpirun. The other ranks must end with an error naming rank 1 within 10 s
#     pytorch    bench/suite_vs_pytorch.sh --distributed N: tpcheck over NCCL against the
#                PyTorch twin under torchrun --nproc_per_node=N
#     te_atol    (issue 13) the te suite over NCCL (a) under --policy te --atol 1e-5 (the
#                reference's original fp32 tolerance): the cases te fails, and the GEMM
#                sites whose numerical class differs (scripts/gemm_class_table.py)
#     production (issue 14) the te suite at production shapes (hidden 4096, ffn 16384,
#                heads 32, sequence 2048, batch 8) over NCCL (a) and emulated on one GPU:
#                wall times, and the GEMM class-difference table of each
# NCCL is pinned to what the emulation models (Ring, Simple, one channel); NVLink
# multicast stays off.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# Logs go to X2_LOGS (default $OUT, else /tmp/tpcheck-multi); when that is not $OUT, they
# come back as $OUT/xN_logs.tgz with the table.
out="${X2_LOGS:-${OUT:-/tmp/tpcheck-multi}}"
mkdir -p "$out"
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=1 NCCL_MAX_NCHANNELS=1
bin="$root/.devrun/tpcheck"
mpi="$root/tests/gpu/launch_mpirun.sh"
n="${TPCHECK_TP:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
if [ "$n" -lt 2 ]; then
  echo "run_multi.sh: $n GPU(s) here; TP over NCCL needs one GPU per rank, at least 2" >&2
  exit 2
fi
stages="${*:-suite mutations faults pytorch}"
reps="${REPS:-20}"
has() { [[ " $stages " == *" $1 "* ]]; }
table="$out/x${n}_table.md"
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
{ nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version --format=csv; } >"$out/x${n}_machine.txt" 2>&1

if has suite; then
  for suite in te full; do
    timed "$suite, nccl (a) one process, tp $n" "nccl_a_$suite.log" timeout 200 "$bin" run --backend cuda --comm nccl --suite "$suite" --tp "$n" --quiet --json "$out/nccl_a_$suite.json"
    timed "$suite, nccl (b) mpirun -np $n" "nccl_b_$suite.log" bash "$mpi" "$n" "$bin" run --backend cuda --suite "$suite" --tp "$n" --quiet --json "$out/nccl_b_$suite.json"
    timed "$suite, emulated on one GPU, tp $n" "emu_$suite.log" timeout 200 "$bin" run --backend cuda --comm emulated --suite "$suite" --tp "$n" --quiet --json "$out/emu_$suite.json"
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
    timed "mutation $m, full suite, nccl (a)" "mut_a_$m.log" timeout 100 "$bin" run --backend cuda --comm nccl --suite full --tp "$n" --quiet --mutate "$m"
    timed "mutation $m, full suite, nccl (b)" "mut_b_$m.log" bash "$mpi" "$n" "$bin" run --backend cuda --suite full --tp "$n" --quiet --mutate "$m"
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
  fault "rank 1 throws mid-suite, nccl (a)" throw_a 'tpcheck: error: rank 1: injected failure' timeout 60 "$bin" run --backend cuda --comm nccl --suite te --tp "$n" --quiet --inject-failure 1@60
  fault "rank 1 throws mid-suite, nccl (b) mpirun" throw_b 'tpcheck: error: rank 1 failed' bash "$mpi" "$n" "$bin" run --backend cuda --suite te --tp "$n" --quiet --inject-failure 1@60

  # SIGKILL of rank 1 under mpirun once rank 0 has printed 40 case lines.
  hung=0; unnamed=0; worst=0
  for i in $(seq "$reps"); do
    log="$out/kill_$i.log"
    bash "$mpi" "$n" "$bin" run --backend cuda --suite te --tp "$n" > >(stamp >"$log") 2>&1 &
    launcher=$!
    for _ in $(seq 300); do  # up to 30 s
      [ "$(grep -c -E '^[0-9.]+ (PASS|FAIL|WARN)' "$log" 2>/dev/null)" -ge 40 ] && break
      sleep 0.1
    done
    victim=""
    for pid in $(pgrep -f "tpcheck run --backend cuda --suite te --tp $n"); do
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
    bash "$root/bench/suite_vs_pytorch.sh" --distributed "$n" --runs 3 >"$out/suite_vs_pytorch.txt" 2>&1
  row "suite vs PyTorch, TP $n over NCCL (torchrun --nproc_per_node=$n), 3 runs" "$(tail -n 2 "$out/suite_vs_pytorch.txt" | head -1 | tr -s ' ')" ""
  cat "$out/suite_vs_pytorch.txt"
fi

if has te_atol; then
  # The reference's original fp32 tolerance: every case te fails, then the GEMM sites whose
  # numerical class differs between single and sharded (whether they explain the failures
  # is for the reader: the table names the cases).
  timed "te suite --policy te --atol 1e-5, nccl (a), tp $n" te_atol.log timeout 200 "$bin" run --backend cuda --comm nccl --suite te --tp "$n" --policy te --atol 1e-5 --quiet --json "$out/te_atol.json"
  python3 - "$out/te_atol.json" >"$out/te_atol_failures.md" 2>&1 <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
failed = [c for c in cases if c["verdicts"]["te"]["status"] == "fail"]
print(f"{len(failed)} of {len(cases)} cases fail te at atol 1e-5\n")
for c in failed:
    names = [t["name"] for t in c["tensors"] if t["verdicts"]["te"]["status"] == "fail"]
    print(f'- {c["id"]}: {", ".join(names)}')
PY
  python3 "$root/scripts/gemm_class_table.py" "$out/te_atol.json" >>"$out/te_atol_failures.md" 2>&1
  row "te at atol 1e-5: failing cases" "$(head -1 "$out/te_atol_failures.md")" ""
fi

if has production; then
  # Issue 14's production shapes (run.sh's production stage, over NCCL too): sequence 2048
  # is 2048 / N per rank (the suite's --seq is per rank); batch 8, a multiple of N for the
  # Linear cases' sequence-parallel split.
  prod=(run --backend cuda --suite te --tp "$n" --hidden 4096 --ffn 16384 --heads 32 --seq $((2048 / n)) --batch 8)
  timed "te suite, production shapes, nccl (a), tp $n" prod_nccl.log timeout 540 "$bin" "${prod[@]}" --comm nccl --json "$out/prod_nccl.json"
  timed "te suite, production shapes, emulated on one GPU, tp $n" prod_emu.log timeout 540 "$bin" "${prod[@]}" --comm emulated --json "$out/prod_emu.json"
  python3 "$root/scripts/gemm_class_table.py" "$out/prod_nccl.json" "$out/prod_emu.json" >"$out/prod_gemm_classes.md" 2>&1
fi

for f in "$out"/equiv_*.txt "$out"/te_atol_failures.md; do [ -f "$f" ] && cat "$f"; done
# Every log in one archive (the device tool brings back a limited number of files).
[ -n "${OUT:-}" ] && [ "$out" != "$OUT" ] && { tar -C "$out" -czf "$OUT/x${n}_logs.tgz" .; cp "$table" "$OUT/"; }
cat "$table"

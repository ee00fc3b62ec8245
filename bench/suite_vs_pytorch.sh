#!/usr/bin/env bash
# Suite wall time, tpcheck against PyTorch (issue 8 "Suite wall time", issue 12 item 4).
#
# Runs the `te` suite (118 cases, truth policy, default sizes) twice — tpcheck and the
# eager-PyTorch implementation bench/pytorch_te_suite.py — and prints each one's wall time
# from process start to its last line (date +%s.%N around the process), side by side,
# with the ratio tpcheck / PyTorch (goal: <= 0.1).
#
#   bench/suite_vs_pytorch.sh                  TP 4 emulated on one GPU:
#        tpcheck run --backend cuda --comm emulated --tp 4 --suite te
#        python bench/pytorch_te_suite.py --device cuda --tp 4
#   bench/suite_vs_pytorch.sh --distributed N  one rank per GPU over NCCL:
#        tpcheck run --backend cuda --comm nccl --tp N --suite te   (one process, N GPUs)
#        torchrun --nproc_per_node=N bench/pytorch_te_suite.py --distributed
#   bench/suite_vs_pytorch.sh --cpu [--tp N]   both on the CPU (tpcheck's thread ranks,
#        PyTorch's emulated ranks), TP 2 unless --tp: for development, no GPU needed.
#   --tp N sets the emulated TP size (default 4; 2 with --cpu). --runs R repeats each
#   side R times (default 1) and reports every run and the median.
#
# Environment: TPCHECK (default: .devrun/tpcheck as tests/gpu/pack.sh ships it, with its
# libraries, else build/tpcheck), PYTHON (python3, the one with torch), TORCHRUN (default
# "$PYTHON -m torch.distributed.run"). NCCL_NVLS_ENABLE=0 and
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 unless set (no NVLink multicast on shared GPUs).
# Logs of every run go to $OUT (default bench/out/suite_vs_pytorch-<UTC time>/).
# Exit status: 0 when both sides ran and passed every case, 1 otherwise.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
python="${PYTHON:-python3}"
tp_env=()
if [[ -n "${TPCHECK:-}" ]]; then
  tpcheck="$TPCHECK"
else
  # tests/gpu/pack.sh ships one archive; unpack it once (as tests/gpu/run.sh does).
  if [[ -f "$root/.devrun/devrun.tgz" && ! -x "$root/.devrun/tpcheck" ]]; then
    tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
  fi
  if [[ -x "$root/.devrun/tpcheck" ]]; then
    tpcheck="$root/.devrun/tpcheck"
    tp_env=(env "LD_LIBRARY_PATH=$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  else
    tpcheck="$root/build/tpcheck"
  fi
fi
if [[ -n "${TORCHRUN:-}" ]]; then read -r -a torchrun <<<"$TORCHRUN"; else torchrun=("$python" -m torch.distributed.run); fi
mode=emulated
tp=""
runs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --distributed) mode=distributed; tp="${2:?--distributed needs the GPU count N}"; shift 2 ;;
    --cpu) mode=cpu; shift ;;
    --tp) tp="${2:?--tp needs a value}"; shift 2 ;;
    --runs) runs="${2:?--runs needs a value}"; shift 2 ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "suite_vs_pytorch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$tp" ]]; then tp=$([[ $mode == cpu ]] && echo 2 || echo 4); fi
[[ "$tp" =~ ^[1-9][0-9]*$ ]] || { echo "suite_vs_pytorch.sh: TP size '$tp' is not a positive integer" >&2; exit 2; }
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "suite_vs_pytorch.sh: --runs '$runs' is not a positive integer" >&2; exit 2; }
[[ -x "$tpcheck" ]] || { echo "suite_vs_pytorch.sh: no tpcheck at $tpcheck (build it, or set TPCHECK)" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "suite_vs_pytorch.sh: '$python' cannot import torch (set PYTHON)" >&2; exit 2; }

out="${OUT:-$root/bench/out/suite_vs_pytorch-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
bench_py="$root/bench/pytorch_te_suite.py"
# Emulated: both on one GPU (tpcheck would spread emulated ranks over the GPUs present).
[[ $mode == emulated ]] && export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
case "$mode" in
  emulated)
    tp_cmd=("${tp_env[@]}" "$tpcheck" run --backend cuda --comm emulated --tp "$tp" --suite te)
    pt_cmd=("$python" "$bench_py" --device cuda --tp "$tp") ;;
  distributed)
    tp_cmd=("${tp_env[@]}" "$tpcheck" run --backend cuda --comm nccl --tp "$tp" --suite te)
    pt_cmd=("${torchrun[@]}" --standalone --nproc_per_node="$tp" "$bench_py" --distributed --device cuda) ;;
  cpu)
    # PyTorch with one intra-op thread, as torchrun sets it: with its default (a thread
    # per core) the suite's tiny ops ran 10x slower on the shared 2-core machine.
    tp_cmd=("${tp_env[@]}" "$tpcheck" run --backend cpu --tp "$tp" --suite te)
    pt_cmd=(env OMP_NUM_THREADS=1 "$python" "$bench_py" --device cpu --tp "$tp") ;;
esac

# Runs "$@" with stdout+stderr to $log; prints "<wall seconds> <exit status> <CPU
# seconds, user + system, of the process and its children>" (CPU "?" without GNU time).
# The CPU figure matters on a shared machine, where the wall time includes waiting.
timed() {
  local log="$1"; shift
  local t0 t1 rc=0 cpu="?"
  local wrap=()
  [[ -x /usr/bin/time ]] && wrap=(/usr/bin/time -f "%U %S" -o "$log.cpu")
  t0=$(date +%s.%N)
  "${wrap[@]}" "$@" >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  [[ -s "$log.cpu" ]] && cpu=$(awk 'END {printf "%.1f", $1 + $2}' "$log.cpu")
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}') $rc $cpu"
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "suite_vs_pytorch: $mode, tp $tp, $runs run(s) each, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null 2>&1 && [[ $mode != cpu ]]; then
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | paste -sd';')"
else
  echo "cpu: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
echo "tpcheck: ${tp_cmd[*]}"
echo "pytorch: ${pt_cmd[*]}"
echo "logs:    $out"

status=0
tp_times=(); pt_times=()
for ((i = 1; i <= runs; i++)); do
  read -r t rc cpu < <(timed "$out/tpcheck.$i.log" "${tp_cmd[@]}")
  tp_times+=("$t")
  echo "run $i tpcheck: $(printf '%.2f' "$t") s wall, $cpu s CPU, exit $rc, $(tail -n 1 "$out/tpcheck.$i.log")"
  [[ $rc == 0 ]] || status=1
  read -r t rc cpu < <(timed "$out/pytorch.$i.log" "${pt_cmd[@]}")
  pt_times+=("$t")
  echo "run $i pytorch: $(printf '%.2f' "$t") s wall, $cpu s CPU, exit $rc, $(grep -E '^[0-9]+ passed' "$out/pytorch.$i.log" | tail -n 1)"
  [[ $rc == 0 ]] || status=1
done

tp_med=$(median "${tp_times[@]}")
pt_med=$(median "${pt_times[@]}")
ratio=$(awk -v a="$tp_med" -v b="$pt_med" 'BEGIN {printf "%.3f", a / b}')
speedup=$(awk -v a="$tp_med" -v b="$pt_med" 'BEGIN {printf "%.1f", b / a}')
printf '\n%-10s %12s %12s %10s\n' "" "tpcheck" "pytorch" "ratio"
printf '%-10s %11.2fs %11.2fs %10s   (tpcheck / pytorch; goal <= 0.1; tpcheck %sx faster)\n' \
  "wall time" "$tp_med" "$pt_med" "$ratio" "$speedup"
[[ $status == 0 ]] || echo "note: a run exited non-zero (see the logs); its time is still shown"
exit "$status"

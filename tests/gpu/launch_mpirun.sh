#!/usr/bin/env bash
# launch_mpirun.sh — runs a tpcheck program as N processes under OpenMPI's mpirun, one rank
# per GPU, the launch (b) of tpcheck/cuda_comm.h. MPI is only the launcher: tpcheck reads
# OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK and shares the NCCL id over TCP with rank 0
# at MASTER_ADDR:MASTER_PORT (defaults 127.0.0.1:29533, one node; exported to every rank).
#
#   tests/gpu/launch_mpirun.sh N [program [args...]]
#   tests/gpu/launch_mpirun.sh 1                       # build/tests/nccl_process_check
#   tests/gpu/launch_mpirun.sh 2 .devrun/tpcheck run --backend cuda --tp 2
#   tests/gpu/launch_mpirun.sh 2 build/tests/nccl_process_check --throw-rank 1   # expect rc != 0 within ~10 s
#
# Runs as root on the lent machine (--allow-run-as-root), passes NCCL_NVLS_ENABLE=0 (never
# NVLink multicast), LD_LIBRARY_PATH and any NCCL_* variables set here. Exit status: the
# first non-zero rank status (mpirun's), or 0.
set -uo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,15p' "$0"
  exit 2
fi
np="$1"
shift
here="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -eq 0 ]; then
  set -- "$here/build/tests/nccl_process_check"
fi
command -v mpirun >/dev/null || { echo "launch_mpirun.sh: mpirun not found (OpenMPI)" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
export MASTER_PORT="${MASTER_PORT:-29533}"
xs=(-x NCCL_NVLS_ENABLE -x MASTER_ADDR -x MASTER_PORT)
[ -n "${LD_LIBRARY_PATH:-}" ] && xs+=(-x LD_LIBRARY_PATH)
for v in $(env | grep -o '^NCCL_[A-Z_0-9]*' | grep -v '^NCCL_NVLS_ENABLE$'); do xs+=(-x "$v"); done
exec timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "${xs[@]}" "$@"

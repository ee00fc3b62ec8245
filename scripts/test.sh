#!/usr/bin/env bash
# Sets everything up and runs every test: the README's test command and CI's (.ci/run).
#
#   scripts/test.sh          the quick run (CI's; about 30 minutes on 2 cores from a clean clone)
#   scripts/test.sh --long   every element of every statistical sweep as well (hours on 2 cores;
#                            run it before landing a change to the policies or the layers)
#
# Both run every kind of check: the JAX, ml_dtypes and finite-difference references, every
# mutation caught at TP 2/4/8, held-out seeds, the calibration sample, the coverage baseline,
# fuzzing and the HTML report in Chromium. The quick run takes a sample of the sweeps that
# rotates by UTC day (tests/support/test_depth.h, TPCHECK_TEST_ROTATION reruns one day's);
# docs/TESTING.md lists what is sampled. Each phase's wall time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

long=0
fuzz_seconds=30
for arg in "$@"; do
  case "$arg" in
    --long) long=1; fuzz_seconds=120 ;;
    *) echo "scripts/test.sh: unknown argument '$arg'; expected --long or nothing" >&2; exit 2 ;;
  esac
done
if ((long)); then export TPCHECK_TEST_LONG=1; fi

phases=()
phase() {  # phase NAME COMMAND...: runs the command and records its wall time
  local name="$1"; shift
  local start=$SECONDS
  echo "=== $name"
  "$@"
  phases+=("$(printf '%-10s %5d s' "$name" $((SECONDS - start)))")
}
report() {
  echo "=== phase times (scripts/test.sh$( ((long)) && echo ' --long'))"
  printf '%s\n' "${phases[@]}"
}
trap report EXIT

jobs="$(nproc)"
py="$PWD/.venv/bin/python"
phase setup scripts/setup.sh
# One build tree: the program, the Python module, the tests and benchmarks (CUDA sources
# compile and link when nvcc is there), and the coverage program (the layers and the
# communicators instrumented for gcov, the rest shared; TPCHECK_COVERAGE_PROGRAM).
phase configure cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython3_EXECUTABLE="$py" -DTPCHECK_COVERAGE_PROGRAM=ON
phase build cmake --build build -j "$jobs"
# The long entries first, so the short ones fill the gaps (ctest orders by COST from the
# last run; a fresh tree has none, so the expensive entries carry a COST property).
phase ctest bash -c "cd build && ctest --output-on-failure -j $jobs"
# libFuzzer on the parsers (ASan + UBSan, its own clang build tree), a bounded time each.
phase fuzz scripts/fuzz.sh "$fuzz_seconds"

#!/usr/bin/env bash
# Builds Release and runs every benchmark, then appends one dated block of rows to
# bench/RESULTS.md (date UTC, machine, commit, load, benchmark, figure, reference, ratio).
#
#   scripts/bench.sh              # the working tree (about 3 minutes on 2 cores, plus the build)
#   scripts/bench.sh --committed  # HEAD exactly: exported with `git archive` to build-bench-src/
#                                 # and built in build-bench-committed/, so other people's
#                                 # uncommitted edits in a shared checkout stay out of it
#   BENCH_BUILD_DIR=/path BENCH_SUITE_RUNS=5 scripts/bench.sh
#
# Benchmarks: every bench/*_bench.cpp (Google Benchmark, JSON output) and the whole `te`
# and `full` suites at TP 4 on the CPU (`tpcheck run --suite te|full --tp 4 --quiet`,
# truth runs included), each timed BENCH_SUITE_RUNS times (default 3); the row gives the
# fastest run and the median.
# The build is Release with -g (debug info only: the same code, but `perf report` can name
# file:line).
# A machine shared with other work gives slower, noisier figures: the load average at
# start and end goes into every row, so a reader can tell.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
suite_runs="${BENCH_SUITE_RUNS:-3}"
jobs="$(nproc)"

commit="$(git -C "$root" rev-parse --short HEAD)"
if [ "${1:-}" = "--committed" ]; then
  src="$root/build-bench-src"
  rm -rf "$src"
  mkdir -p "$src"
  git -C "$root" archive HEAD | tar -x -C "$src"
  build="${BENCH_BUILD_DIR:-$root/build-bench-committed}"
elif [ -n "${1:-}" ]; then
  echo "usage: scripts/bench.sh [--committed]" >&2
  exit 2
else
  src="$root"
  build="${BENCH_BUILD_DIR:-$root/build-bench}"
  # Uncommitted changes to the code being timed make the commit an approximation: say so.
  if [ -n "$(git -C "$root" status --porcelain -- src include bench CMakeLists.txt)" ]; then
    commit="$commit+uncommitted"
  fi
fi

cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG -g" \
  -DTPCHECK_BUILD_BENCH=ON -DTPCHECK_BUILD_TESTS=OFF -DTPCHECK_CUDA=OFF >/dev/null
bench_names=()
for file in "$src"/bench/*_bench.cpp; do
  bench_names+=("$(basename "$file" .cpp)")
done
cmake --build "$build" -j "$jobs" --target tpcheck_cli "${bench_names[@]}"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"

for name in "${bench_names[@]}"; do
  echo "== $name"
  "$build/bench/$name" --benchmark_format=console --benchmark_out_format=json \
    --benchmark_out="$out/$name.json"
done

for suite in te full; do
  echo "== tpcheck run --suite $suite --tp 4 --quiet (x$suite_runs)"
  : >"$out/suite_times_$suite.txt"
  for _ in $(seq "$suite_runs"); do
    # Exit status 0/1 is the verdict (1: some case failed) and the time counts; anything
    # else (usage error, crash) is recorded as such instead of a time.
    start="$(date +%s.%N)"
    rc=0
    "$build/tpcheck" run --suite "$suite" --tp 4 --quiet >"$out/suite_output_$suite.txt" 2>&1 || rc=$?
    end="$(date +%s.%N)"
    echo "$start $end $rc" | awk '{printf "%.3f %d\n", $2 - $1, $3}' >>"$out/suite_times_$suite.txt"
    echo "exit $rc: $(tail -n 1 "$out/suite_output_$suite.txt")"
  done
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

model="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
machine="$model, $(nproc) cores"

python3 "$root/bench/write_results.py" \
  --results "$root/bench/RESULTS.md" \
  --date "$(date -u +%Y-%m-%dT%H:%MZ)" \
  --machine "$machine" \
  --commit "$commit" \
  --load "$load_start -> $load_end" \
  --suite-times "$out/suite_times_te.txt" \
  --suite-summary "$(tail -n 1 "$out/suite_output_te.txt")" \
  --full-suite-times "$out/suite_times_full.txt" \
  --full-suite-summary "$(tail -n 1 "$out/suite_output_full.txt")" \
  "$out"/*_bench.json
echo "appended to bench/RESULTS.md"

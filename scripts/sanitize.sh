#!/usr/bin/env bash
# Builds tpcheck and its tests with AddressSanitizer and UndefinedBehaviorSanitizer
# (gcc, build-asan/) and runs the CPU tests under them: scripts/sanitize.sh [CTEST_ARGS...]
# e.g. scripts/sanitize.sh -E 'seeds_test|mutation_test' to leave out the long suite runs.
# Any sanitizer report fails the test that triggered it (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# No Python module: an instrumented extension cannot be imported into an uninstrumented
# interpreter (its stub generation at build time failed with "ASan runtime does not come
# first"); the Python tests still drive the sanitized programs.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPCHECK_CUDA=OFF \
  -DTPCHECK_BUILD_BENCH=OFF -DTPCHECK_PYTHON=OFF -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build "$build" -j "$(nproc)"
# The Python tests drive sanitized programs from an unsanitized interpreter: the runtime
# must not insist on being loaded first, and leak checks on python itself are noise.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:verify_asan_link_order=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@"

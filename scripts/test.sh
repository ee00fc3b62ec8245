#!/usr/bin/env bash
# Sets everything up and runs every test: the README's second Quick start command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$PWD/.venv/bin/python"
# The build includes the Python module (TPCHECK_PYTHON: nanobind from requirements.txt) and
# ctest runs the package's tests against build/python; `pip wheel .` is not run here (it
# would compile every library a second time).
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)")
# Branch coverage of the layers under the full suite at TP 2 against the committed
# baseline (tests/coverage/baseline.txt): a Debug build of the program alone in build-cov/
# (instrumented layers and communicators), then the ctest entry coverage_baseline.
cmake -S . -B build-cov -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPCHECK_COVERAGE=ON \
  -DTPCHECK_BUILD_BENCH=OFF -DTPCHECK_CUDA=OFF -DPython3_EXECUTABLE="$PWD/.venv/bin/python"
cmake --build build-cov -j "$(nproc)" --target tpcheck_cli
(cd build-cov && ctest --output-on-failure -R '^coverage_baseline$')
# The parsers under libFuzzer (ASan + UBSan), a bounded time per target.
scripts/fuzz.sh 30

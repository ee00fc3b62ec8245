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
# The parsers under libFuzzer (ASan + UBSan), a bounded time per target.
scripts/fuzz.sh 30

#!/usr/bin/env bash
# Sets everything up and runs every test: the README's second Quick start command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$PWD/.venv/bin/python"
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)")
# The parsers under libFuzzer (ASan + UBSan), a bounded time per target.
scripts/fuzz.sh 30

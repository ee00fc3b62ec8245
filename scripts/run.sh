#!/usr/bin/env bash
# Sets everything up, builds, and runs `tpcheck run` with the given arguments: the
# README's first Quick start command. With no arguments: the `te` suite, CPU, 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build -j "$(nproc)" --target tpcheck_cli
exec build/tpcheck run "$@"

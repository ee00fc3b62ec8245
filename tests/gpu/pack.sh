#!/usr/bin/env bash
# Copies the built tpcheck program (stripped) and the shared libraries it needs that the
# GPU machine's image lacks into .devrun/ (git-ignored), for the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
rm -rf .devrun && mkdir -p .devrun
strip -o .devrun/tpcheck "$build/tpcheck"
for lib in libopenblas.so.0 libfmt.so.9 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/
done
du -sh .devrun

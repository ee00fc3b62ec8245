#!/usr/bin/env bash
# Packs what the GPU machine needs to run tpcheck built here (Debian 12, nvcc 13) into
# .devrun/ (git-ignored), for the device tool's `carry`: the tpcheck program, the GPU test
# binaries, the benchmarks, and the shared libraries that machine's image lacks (OpenBLAS,
# fmt, gfortran, quadmath). CUDA's runtime is linked statically; cuBLASLt and NCCL come
# from the machine's own CUDA (same major version).
#   tests/gpu/pack.sh [build-dir]
# TPCHECK_PACK_TESTS="cuda_fused_test cuda_ops_test": only these GPU tests (the carry limit
# holds about four fifths of them with everything else; default: all).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
rm -rf .devrun && mkdir -p .devrun/lib .devrun/tests .devrun/bench
# Debug information out, function names kept (tests/gpu/sample_stacks.sh reads them).
strip --strip-debug -o .devrun/tpcheck "$build/tpcheck"
for src in tests/gpu/*_test.cpp; do
  name="$(basename "$src" .cpp)"
  [ -n "${TPCHECK_PACK_TESTS:-}" ] && [[ " $TPCHECK_PACK_TESTS " != *" $name "* ]] && continue
  strip -o ".devrun/tests/$name" "$build/tests/$name"
done
strip -o .devrun/nccl_process_check "$build/tests/nccl_process_check"
for b in "$build"/bench/*_bench "$build"/bench/*_gpu; do
  [ -x "$b" ] && strip -o ".devrun/bench/$(basename "$b")" "$b"
done
for lib in libopenblas.so.0 libfmt.so.9 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/lib/
done
# The device tool carries at most 64 MiB: ship one compressed archive (run.sh unpacks it).
tar -C .devrun -cf - . | gzip -9 >/tmp/tpcheck-devrun.tgz
rm -rf .devrun && mkdir -p .devrun && mv /tmp/tpcheck-devrun.tgz .devrun/devrun.tgz
du -sh .devrun

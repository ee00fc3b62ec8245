#!/usr/bin/env bash
# Packs what the GPU machine needs to run tpcheck built here (Debian 12, nvcc 13) into
# .devrun/ (git-ignored), for the device tool's `carry`: the tpcheck program, the GPU test
# binaries, the benchmarks, and the shared libraries that machine's image lacks (OpenBLAS,
# fmt, gfortran, quadmath). CUDA's runtime is linked statically; cuBLASLt and NCCL come
# from the machine's own CUDA (same major version).
#   tests/gpu/pack.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
rm -rf .devrun && mkdir -p .devrun/lib .devrun/tests .devrun/bench
strip -o .devrun/tpcheck "$build/tpcheck"
for t in "$build"/tests/*_test; do
  case "$(basename "$t")" in
    cuda_*|comm_ring_test|nccl_test) strip -o ".devrun/tests/$(basename "$t")" "$t" ;;
  esac
done
for b in "$build"/bench/*_bench "$build"/bench/*_gpu; do
  [ -x "$b" ] && strip -o ".devrun/bench/$(basename "$b")" "$b"
done
for lib in libopenblas.so.0 libfmt.so.9 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/lib/
done
du -sh .devrun

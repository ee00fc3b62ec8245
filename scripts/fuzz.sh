#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan, in build-fuzz/) and runs
# each for a bounded time: scripts/fuzz.sh [SECONDS_PER_TARGET] (default 60).
# Fails on any crash, sanitizer report, or rejection that is not a clear input error
# (the targets abort on those). CI runs it from scripts/test.sh with a short time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTPCHECK_FUZZ=ON -DTPCHECK_CUDA=OFF -DTPCHECK_BUILD_TESTS=OFF -DTPCHECK_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target safetensors_fuzz json_options_fuzz cublaslt_log_fuzz

# Seed corpora: a valid safetensors file per dtype family, a few option objects, and
# cuBLASLt log lines (every field, defaults, a truncated line).
corpus="$build/corpus"
mkdir -p "$corpus/safetensors" "$corpus/json_options" "$corpus/cublaslt_log"
cp fuzz/corpus/json_options/*.json "$corpus/json_options/"
cp fuzz/corpus/cublaslt_log/*.log "$corpus/cublaslt_log/"
python3 - "$corpus/safetensors" <<'PY'
import json, struct, sys
def write(path, tensors, meta=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta: header["__metadata__"] = meta
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
d = sys.argv[1]
write(f"{d}/f32.safetensors", {"w": ("F32", [2, 3], struct.pack("<6f", *range(6)))}, {"k": "v"})
write(f"{d}/mixed.safetensors", {"a": ("F16", [4], b"\0<" * 4), "b": ("BF16", [2], b"\x80?" * 2),
                                 "c": ("F64", [1], struct.pack("<d", -0.0)), "e": ("F8_E4M3", [0], b"")})
PY

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$build/artifacts"
for target in safetensors_fuzz json_options_fuzz cublaslt_log_fuzz; do
  name="${target%_fuzz}"
  log="$build/$target.log"
  echo "fuzz: $target for ${seconds} s"
  rc=0
  "$build/fuzz/$target" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$corpus/$name" >"$log" 2>&1 || rc=$?
  grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
  # libFuzzer exits non-zero on a crash, sanitizer report, leak, timeout or OOM and
  # leaves the input in $build/artifacts/.
  if ((rc != 0)); then
    tail -n 60 "$log" >&2
    echo "fuzz: $target failed (exit $rc); input in $build/artifacts/" >&2
    exit 1
  fi
done
echo "fuzz: no crash, no sanitizer report"

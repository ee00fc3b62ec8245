#!/usr/bin/env bash
# The GPU machine's script: runs the GPU tests, the suite on the CUDA backend and the GPU
# benchmarks with the binaries tests/gpu/pack.sh put in .devrun/, writes every log under
# $OUT and prints a short table last.
#
# Here:   cmake --build build && tests/gpu/pack.sh build
# There:  (device tool, carry [".devrun"])  bash tests/gpu/run.sh [stage ...]
# Stages (default: all): info tests suite fused badinput mutations recipes bench; also, not in
# the default set: wheel (the wheel's CUDA backend, see below), bits (this build's JSON reports against TPCHECK_OLD's), emulate
# (tpcheck emulate with CUDA tensors; needs the wheel in .devrun/), and, not in
# the default set: kernels (each kernel's time in the layer benchmark's step, by ncu), recipe_mutations (each recipe's mutation table at TP 2, 4, 8), production (the te suite at production shapes, TP 8 emulated), profile
# (stack samples of its TransformerLayer cases), pytorch
# (the te suite against its PyTorch twin), forensics (the cuBLASLt log tools on real
# logs and programs), python (the package: the wheel in .devrun/, see below) and grid
# (issue 7's calibration grid on the CUDA backend).
# NCCL_NVLS_ENABLE=0 always.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/tpcheck-gpu}"
mkdir -p "$out"
# Several invocations may share one $OUT (one device call): each archives and removes only
# what it wrote (newer than this marker), under an archive name of its own.
start_marker="$(mktemp "$out/.start.XXXXXX")"
# pack.sh ships one archive; unpack it once.
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN for --attention fused (loaded at run time, fused_attention.cpp): the machine's
# PyTorch ships it as the nvidia-cudnn-cu13 package.
cudnn_lib="$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)"
[ -d "$cudnn_lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn_lib"
bin="$root/.devrun/tpcheck"
# Without pack.sh's archive (a call that carries only the wheel, e.g. beside the TE bundle,
# which leaves no room for the test binaries under the carry limit), the wheel's own program
# stands in for it: `python3 -m tpcheck` is the same command line, usable once the wheel is
# installed (python_package below).
if [ ! -x "$bin" ]; then
  bin="${TMPDIR:-/tmp}/tpcheck-from-wheel"
  printf '#!/bin/sh\nexec python3 -m tpcheck "$@"\n' >"$bin" && chmod +x "$bin"
fi
stages="${*:-info tests suite fused badinput mutations recipes bench}"
# TPCHECK_GPU_FILTER: a --filter regex for the suite and mutation stages (default: all).
filter=(); [ -n "${TPCHECK_GPU_FILTER:-}" ] && filter=(--filter "$TPCHECK_GPU_FILTER")
table="$out/table.md"
echo "| what | result | seconds |" >"$table"
echo "|---|---|---|" >>"$table"

row() { echo "| $1 | $2 | $3 |" >>"$table"; }
# timed NAME LOG CMD...: runs CMD, logs it, adds a row with its last line and time.
timed() {
  local name="$1" log="$2"
  shift 2
  local start end rc
  start=$(date +%s.%N)
  "$@" >"$out/$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  row "$name" "rc=$rc $(tail -n 1 "$out/$log" | tr '|' '/')" "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"
}

has() { [[ " $stages " == *" $1 "* ]]; }

# The Python package (stages python, emulate, models): the wheel built on the CPU machine
# for this machine's Python, carried in .devrun/ beside pack.sh's archive:
#   tests/gpu/pack.sh build && python3.12 -m pip wheel --no-deps . -w .devrun/
# installed into python3's environment (beside its torch and pip's nvidia packages, where
# the module finds cuBLASLt and NCCL) with --no-deps, once per invocation.
python_installed=""
python_package() {
  if [ -z "$python_installed" ]; then
    local whl
    whl="$(ls -t "$root"/.devrun/tpcheck-*.whl 2>/dev/null | head -1)"
    if [ -n "$whl" ] && python3 -m pip install -q --no-deps --force-reinstall "$whl" \
         >"$out/python_install.log" 2>&1; then
      python_installed="yes: $(basename "$whl")"
      row "python package" "installed $(basename "$whl")" ""
      if [ "${TPCHECK_PYTHON_SOURCES:-0}" = 1 ]; then
        # This checkout's .py files over the installed ones (the wheel's compiled module
        # kept): Python-only changes made after the wheel was built, without the 5-minute
        # rebuild. The table says so; figures from such a run name both commits.
        local site
        site="$(python3 -c 'import os, tpcheck; print(os.path.dirname(tpcheck.__file__))')"
        (cd "$root/python/tpcheck" && find . -name '*.py' -exec cp --parents {} "$site" \;)
        # (no commit here: the machine's copy of .git can name an older HEAD than the tree's)
        row "python package" "TPCHECK_PYTHON_SOURCES=1: the checkout's .py files over the wheel's${TPCHECK_COMMIT:+ ($TPCHECK_COMMIT)}" ""
      fi
    else
      python_installed="no"
    fi
  fi
  [ "$python_installed" != "no" ]
}
no_wheel="no wheel installed: python3.12 -m pip wheel --no-deps . -w .devrun/ on the CPU machine (see python_install.log)"

if has info; then
  {
    uname -a; nproc; nvidia-smi 2>&1 | head -15
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    ldd "$bin"
  } >"$out/machine.txt" 2>&1
  row "GPU" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" ""
fi

# Stage wheel (not in the default set): the wheel built on the CPU machine, as a PyTorch user
# gets it (pip install, no build tools here), runs the CUDA backend: a suite case on cuBLASLt
# and NCCL found at run time (the report's cuda_versions say which), and a missing cuBLASLt
# gives the loader's message and exit status 2, not a crash.
if has wheel; then
  if python_package; then
    timed "wheel: te suite case, cuda, TP 2 (python3 -m tpcheck)" wheel_cuda.log \
      python3 -m tpcheck run --suite te --tp 2 --backend cuda --filter '^Linear\.column\.sp0\.default$' \
      --json "$out/wheel_cuda.json"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); e = r.get("environment", {})
print("cuda_versions:", json.dumps(e.get("cuda_versions")))' "$out/wheel_cuda.json" >>"$out/wheel_cuda.log" 2>&1
    row "wheel: what the CUDA backend loaded" "$(tail -n 1 "$out/wheel_cuda.log" | tr '|' '/')" ""
    timed "wheel: TPCHECK_CUBLASLT_LIBRARY=/nonexistent (expect status 2, the loader's message)" wheel_missing_lib.log \
      bash -c 'env TPCHECK_CUBLASLT_LIBRARY=/nonexistent/libcublasLt.so.13 python3 -m tpcheck run --suite te \
        --tp 2 --backend cuda --filter "^Linear\.column\.sp0\.default$"; echo "exit status $?"'
    head -n 5 "$out/wheel_missing_lib.log" >>"$out/failures.txt"
  else
    row "wheel" "$no_wheel" ""
  fi
fi

if has tests; then
  for t in "$root"/.devrun/tests/*_test; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    timed "$name" "$name.log" "$t" --gtest_brief=1
    grep -E "^\[  (FAILED|PASSED|SKIPPED) +\]|Failure|error" "$out/$name.log" | head -40 >>"$out/failures.txt"
  done
fi

if has suite; then
  for tp in 1 2 4 8; do
    timed "te suite, cuda, tp $tp emulated" "te_cuda_tp$tp.log" \
      "$bin" run --backend cuda --suite te --tp "$tp" --quiet "${filter[@]}" --json "$out/te_cuda_tp$tp.json"
  done
  for tp in 2 4 8; do
    timed "full suite, cuda, tp $tp emulated" "full_cuda_tp$tp.log" \
      "$bin" run --backend cuda --suite full --tp "$tp" --quiet "${filter[@]}" --json "$out/full_cuda_tp$tp.json"
  done
  for tp in 2 4 8; do
    timed "te suite, cuda, tp $tp, seq 32 x batch 32" "te_cuda_tp${tp}_1024.log" \
      "$bin" run --suite te --backend cuda --tp "$tp" --seq 32 --batch 32 --quiet "${filter[@]}" \
      --json "$out/te_cuda_tp${tp}_1024.json"
  done
fi

# --attention fused (cuDNN's flash attention where it applies): the te suite at TP 1, 2, 4
# and 8 emulated and the full suite at TP 4, truth on, as the unfused runs above.
if has fused; then
  for tp in 1 2 4 8; do
    timed "te suite, cuda, tp $tp, --attention fused" "te_fused_tp$tp.log" \
      "$bin" run --backend cuda --suite te --tp "$tp" --attention fused --quiet "${filter[@]}" \
      --json "$out/te_fused_tp$tp.json"
  done
  timed "full suite, cuda, tp 4, --attention fused" full_fused_tp4.log \
    "$bin" run --backend cuda --suite full --tp 4 --attention fused --quiet "${filter[@]}" \
    --json "$out/full_fused_tp4.json"
fi

# expect NAME LOG "RC..." REGEX CMD...: CMD must exit with one of RC (space separated)
# within 120 s and print a line matching REGEX; the row says whether it did.
expect() {
  local name="$1" log="$2" rcs="$3" regex="$4"
  shift 4
  timeout 120 "$@" >"$out/$log" 2>&1
  local rc=$?
  local verdict="FAIL"
  [[ " $rcs " == *" $rc "* ]] && grep -Eq "$regex" "$out/$log" && verdict="ok"
  row "$name" "$verdict: rc=$rc $(grep -E "$regex" "$out/$log" | head -1 | cut -c1-160 | tr '|' '/')" ""
}

if has badinput; then
  expect "--backend cuda, no GPU visible" nogpu.log "2 3" "GPU|CUDA" \
    env CUDA_VISIBLE_DEVICES= "$bin" run --suite te --backend cuda --tp 2 --filter '^Linear'
  # A column-parallel Linear at hidden 200000: its f32 weight alone is 160 GB.
  expect "out of device memory" oom.log "2 3" "out of device memory" \
    "$bin" run --suite te --backend cuda --tp 1 --filter '^Linear.column.sp0.default$' --hidden 200000
  expect "--gemm-impl fma on f16" impl_fma_f16.log "0 1 2 3" "passed|no cuBLASLt algorithm|algorithm" \
    "$bin" run --suite te --backend cuda --tp 2 --gemm-impl fma --filter 'f16|bf16'
  expect "--comm nccl --tp 2 on one GPU" nccl_two_on_one.log "2 3" "GPU" \
    "$bin" run --suite te --backend cuda --comm nccl --tp 2 --filter '^Linear'
  expect "--attention fused, cuDNN not loadable" fused_no_cudnn.log "2" "could not be loaded" \
    env TPCHECK_CUDNN_LIBRARY=/nonexistent/libcudnn.so.9 "$bin" run --suite te --backend cuda \
    --tp 2 --attention fused --filter '^TransformerLayer.sp0.params_dtype=f16$'
fi

# The cuBLASLt log tools on real logs (issue 10): --query decodes each logged algorithm
# through the capability query; trace runs tpcheck and a PyTorch program under logging.
if has forensics; then
  d="$root/tests/data/cublaslt"
  timed "logdiff --query, tpcheck TP 1 vs 2 (level 2)" logdiff_query_tpcheck.log \
    "$bin" logdiff "$d/tpcheck_tp1_level2.log" "$d/tpcheck_tp2_level2.log" --query
  timed "logdiff --query, PyTorch tf32 full vs shard" logdiff_query_torch.log \
    "$bin" logdiff "$d/torch_tf32_tp1.log" "$d/torch_tf32_tp2.log" --query
  for tp in 1 2; do
    timed "trace --query of tpcheck, TP $tp" "trace_tp$tp.log" "$bin" trace --out "$out/trace_tp$tp" \
      --query -- "$bin" run --suite te --backend cuda --tp "$tp" --filter '^TransformerLayer.sp0.default$'
  done
  timed "diff of the two trace ledgers" diff_traces.log \
    "$bin" diff "$out/trace_tp1/ledger.json" "$out/trace_tp2/ledger.json"
  timed "trace of torchrun, 2 processes" trace_torchrun.log "$bin" trace --out "$out/trace_torch" -- \
    python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$d/torch_linear.py" tf32 2
fi

if has production; then
  # The production shapes: hidden 4096, ffn 16384, heads 32, sequence 2048 (256 per rank
  # at TP 8: the suite's --seq is per rank), TP 8 emulated, truth on. Batch 8, not 2: the
  # te matrix's Linear cases take [batch, hidden] inputs and split the batch over the
  # ranks under sequence parallel, so it must be a multiple of 8.
  # Every case's line is printed (no --quiet) so a run cut by the time limit still shows
  # how far it got and what each case cost.
  timed "te suite, cuda, tp 8, production shapes" "te_cuda_tp8_production.log" \
    timeout "${TPCHECK_PRODUCTION_LIMIT:-540}" "$bin" run --suite te --backend cuda --tp 8 --hidden 4096 \
    --ffn 16384 --heads 32 --seq 256 --batch 8 "${filter[@]}" \
    --json "$out/te_cuda_tp8_production.json"
fi

# Not in the default stages: each kernel's time in one step of the benchmark layer
# (bench/gpu_layer_bench's split configurations), read by Nsight Compute with the clocks
# left alone; tests/gpu/kernel_summary.py sums them by kernel name (kernels_*.md).
# TPCHECK_KERNEL_CONFIGS: the configurations, ';'-separated (default: bf16 and fp8_cs, both
# with the fused attention).
if has kernels; then
  IFS=';' read -r -a kernel_configs <<<"${TPCHECK_KERNEL_CONFIGS:-bf16, fused attention;fp8_cs, fused attention}"
  for config in "${kernel_configs[@]}"; do
    tag="$(echo "$config" | tr -c 'a-z0-9' '_')"
    timed "kernel times (ncu): $config" "kernels_$tag.log" \
      env TPCHECK_PROFILE_CONFIG="$config" ncu --clock-control none --profile-from-start off \
      --metrics gpu__time_duration.sum --csv --page raw --log-file "$out/kernels_$tag.csv" \
      "$root/.devrun/bench/gpu_layer_bench"
    python3 "$root/tests/gpu/kernel_summary.py" "$out/kernels_$tag.csv" "$config" \
      >"$out/kernels_$tag.md" 2>&1
    head -n 30 "$out/kernels_$tag.md"
  done
fi

# Not in the default stages: where the production-shape TransformerLayer cases spend the
# host's time, sampled with cuda-gdb (tests/gpu/sample_stacks.sh; the machine has no perf).
# TPCHECK_PROFILE_SAMPLES (default 20), 3 s apart; the folded stacks are in profile.txt.
if has profile; then
  timed "stack samples, production TransformerLayer" profile.txt \
    bash "$root/tests/gpu/sample_stacks.sh" "$out/profile" "${TPCHECK_PROFILE_SAMPLES:-20}" 3 -- \
    "$bin" run --suite te --backend cuda --tp 8 --hidden 4096 --ffn 16384 --heads 32 --seq 256 \
    --batch 8 --filter "${TPCHECK_PROFILE_FILTER:-^TransformerLayer}"
  cp "$out/profile.txt" "$out/profile_folded.md"
fi

if has mutations; then
  for tp in 2 4 8; do
    # (Not the mutations of one recipe's code, listed "(needs --recipe ...)": the
    # recipe_mutations stage runs those, with their recipe.)
    for m in $("$bin" mutations | awk '!/\(needs --recipe /{print $1}'); do
      # The full suite: it reaches every mutation's path (te misses the full-only ones).
      timed "mutation $m tp $tp" "mut_${m}_tp$tp.log" "$bin" run --backend cuda --suite full --tp "$tp" --quiet "${filter[@]}" --mutate "$m"
    done
  done
fi

# The quantized recipes on the CUDA backend (issue 11): the te suite under each recipe at
# TP 2, 4 and 8 emulated (the reference's per-recipe sizes, truth on), delayed scaling over
# 3 steps, and (recipe_mutations, not in the default set) each recipe's mutation table at
# TP 2, 4 and 8 (scripts/mutation_table.py, TPCHECK_MUTATION_JOBS runs at once; the TP
# sizes from TPCHECK_MUTATION_TPS).
# TPCHECK_RECIPES: the recipes these two stages run (default: all five).
read -r -a recipes <<<"${TPCHECK_RECIPES:-fp8 fp8_cs fp8_block_scaling mxfp8 nvfp4}"
if has recipes; then
  for r in "${recipes[@]}"; do
    for tp in 2 4 8; do
      timed "te suite --recipe $r, cuda, tp $tp" "te_${r}_tp$tp.log" \
        "$bin" run --backend cuda --suite te --tp "$tp" --recipe "$r" --quiet "${filter[@]}" \
        --json "$out/recipe_${r}_tp$tp.json"
    done
  done
  timed "te suite --recipe fp8 --steps 3, cuda, tp 4" te_fp8_steps3_tp4.log \
    "$bin" run --backend cuda --suite te --tp 4 --recipe fp8 --steps 3 --quiet "${filter[@]}"
fi
if has recipe_mutations; then
  for r in "${recipes[@]}"; do
    steps=(); [ "$r" = fp8 ] && steps=(--steps 2)
    timed "mutation table --recipe $r ${steps[*]}, cuda" "mutations_$r.md" \
      python3 "$root/scripts/mutation_table.py" "$bin" --recipe "$r" "${steps[@]}" \
      --jobs "${TPCHECK_MUTATION_JOBS:-8}" ${TPCHECK_MUTATION_TPS:-2 4 8}
    cp "$out/mutations_$r.md" "$out/mutations_${r}_table.md"
  done
fi

# TPCHECK_BENCHES: the benchmarks the bench stage runs, by name (default: all).
if has bench; then
  for b in "$root"/.devrun/bench/*; do
    [ -x "$b" ] || continue
    [ -n "${TPCHECK_BENCHES:-}" ] && [[ " $TPCHECK_BENCHES " != *" $(basename "$b") "* ]] && continue
    timed "bench $(basename "$b")" "bench_$(basename "$b").log" "$b"
  done
fi

# Not in the default stages: the te suite against its PyTorch twin (bench/suite_vs_pytorch.sh,
# TP 4 emulated on one GPU, 3 runs each; python3 must hold torch). Its table is in the log.
if has pytorch; then
  timed "suite vs PyTorch, TP 4 emulated" suite_vs_pytorch.log \
    env TPCHECK="$bin" OUT="$out/suite_vs_pytorch" bash "$root/bench/suite_vs_pytorch.sh" --runs 3
fi

# Not in the default stages: the Python package on the GPU (the wheel in .devrun/, built
# for this machine's Python): the package tests (CPU ones too, on this Python), the
# GPU ones (zero-copy CUDA tensors, the example, torchrun), the trace of a real PyTorch
# matmul, and the compare benchmark against torch.testing.assert_close.
if has python; then
  if python_package; then
    timed "python package: pytest test_package, test_package_gpu, test_package_trace" pytest_package.log \
      env TPCHECK_CLI="$bin" python3 -m pytest -q -p no:cacheprovider -rs \
      "$root/tests/python/test_package.py" "$root/tests/python/test_package_gpu.py" \
      "$root/tests/python/test_package_trace.py"
    grep -E "passed|failed|SKIPPED|Error" "$out/pytest_package.log" | tail -15 >>"$out/failures.txt"
    timed "compare vs torch.testing.assert_close, cuda, 1 GiB f32" compare_bench.log \
      python3 "$root/bench/compare_bench.py" --device cuda
    timed "compare --truth, cuda" compare_bench_truth.log \
      python3 "$root/bench/compare_bench.py" --device cuda --truth
    cat "$out/compare_bench.log" "$out/compare_bench_truth.log" >>"$out/failures.txt"
  else
    row "python package" "$no_wheel" ""
  fi
fi

# Not in the default stages: bits, the suite's JSON reports of this build against another
# build's (TPCHECK_OLD=path/to/tpcheck, e.g. main's before a refactor) on the CUDA backend,
# byte for byte but for each case's `seconds` and the run's `date`: te at TP 2, 4, 8, full
# at TP 4, TF32 off, a recipe over two steps, and fused attention.
if has bits; then
  if [ -x "${TPCHECK_OLD:-}" ]; then
    strip_times='import json, sys
r = json.load(open(sys.argv[1]))
r.get("environment", {}).pop("date", None)
for c in r.get("cases", []):
    c.pop("seconds", None)
json.dump(r, open(sys.argv[2], "w"), indent=1, sort_keys=True)'
    bits_run() {  # bits_run NAME ARGS...: both builds, then the comparison's row
      local name="$1"; shift
      "$TPCHECK_OLD" run --backend cuda --quiet "$@" --json "$out/bits_old_$name.json" \
        >"$out/bits_old_$name.log" 2>&1
      "$bin" run --backend cuda --quiet "$@" --json "$out/bits_new_$name.json" \
        >"$out/bits_new_$name.log" 2>&1
      python3 -c "$strip_times" "$out/bits_old_$name.json" "$out/bits_old_$name.cmp" &&
        python3 -c "$strip_times" "$out/bits_new_$name.json" "$out/bits_new_$name.cmp" &&
        cmp -s "$out/bits_old_$name.cmp" "$out/bits_new_$name.cmp"
      local rc=$?
      row "bits: $name ($*)" "$([ $rc = 0 ] && echo identical || echo DIFFERENT)" ""
      [ $rc = 0 ] || diff "$out/bits_old_$name.cmp" "$out/bits_new_$name.cmp" | head -20 \
        >>"$out/failures.txt"
    }
    for tp in 2 4 8; do bits_run "te_tp$tp" --suite te --tp "$tp"; done
    bits_run full_tp4 --suite full --tp 4
    bits_run te_tp4_tf32off --suite te --tp 4 --tf32 off
    bits_run fp8_steps2 --suite te --tp 2 --recipe fp8 --steps 2 --filter '^(Linear|LayerNormMLP)'
    bits_run fused_tp2 --suite te --tp 2 --attention fused --filter '^TransformerLayer'
  else
    row "bits" "TPCHECK_OLD is not an executable tpcheck" ""
  fi
fi

# Not in the default stages: `tpcheck emulate` with CUDA tensors,
# TP 2/4/8 ranks on this one GPU through CUDA IPC: every collective against its reference
# (the same worker as CI's, --cuda), the examples on the GPU, and the benchmarks of
# bench/emulate_bench.py and compare_bench.py --compare-tp at TP 8. Needs the wheel in .devrun/ and torch in python3.
if has emulate; then
  if python_package; then
    # The GPU machine sets PYTHONDONTWRITEBYTECODE=1 and its torch has no bytecode, so every
    # process would compile torch's modules from source (about 4.5 s of compare_tp's first
    # call at TP 8). Bytecode written to a cache here is what a pip install has: the first
    # launch fills it, the timed ones later in this stage read it.
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX="${TMPDIR:-/tmp}/tpcheck-pycache"
    # TPCHECK_EMULATE_PARTS: which parts run (default all): collectives, examples, bench.
    emulate_parts=" ${TPCHECK_EMULATE_PARTS:-collectives examples bench} "
    if [[ "$emulate_parts" == *" collectives "* ]]; then
      # Staged (--no-mps: the ranks take turns on the GPU), then under MPS, the default launch
      # wherever ranks share a GPU (its first line, in each log, says which mode ran).
      for n in 2 4 8; do
        timed "emulate: every collective, cuda, TP $n, --no-mps" emulate_collectives_tp$n.log \
          python3 -m tpcheck emulate -n $n --no-mps -- "$root/tests/python/emulate_workers/collectives.py" --cuda
        grep -E "ALL OK|Error|error" "$out/emulate_collectives_tp$n.log" | head -5 >>"$out/failures.txt"
      done
      # Every staged all-reduce split into per-rank shares (the default splits from 1 MiB),
      # zero copy (the default under MPS) without MPS, the ranks as MPS clients (the default
      # launch), and rank order on an odd group size, staged and in place.
      timed "emulate: every collective, cuda, TP 4, all-reduce always split" emulate_collectives_split.log \
        env TPCHECK_EMULATE_SPLIT_BYTES=0 python3 -m tpcheck emulate -n 4 --no-mps -- \
        "$root/tests/python/emulate_workers/collectives.py" --cuda
      timed "emulate: every collective, cuda, TP 4, zero copy" emulate_collectives_zc.log \
        env TPCHECK_EMULATE_ZERO_COPY=1 python3 -m tpcheck emulate -n 4 --no-mps -- \
        "$root/tests/python/emulate_workers/collectives.py" --cuda
      timed "emulate: every collective, cuda, TP 8, default launch (MPS)" emulate_collectives_mps.log \
        python3 -m tpcheck emulate -n 8 -- "$root/tests/python/emulate_workers/collectives.py" --cuda
      # The reduction kernel one element at a time (TPCHECK_REDUCE_VECTOR=0; the vector path is
      # the default above): bits at TP 8 under MPS (zero copy, the in-place all-reduce) and TP
      # 4 split, and the C++ device group's test.
      timed "emulate: every collective, cuda, TP 8, default launch (MPS), scalar kernel" emulate_collectives_scalar.log \
        env TPCHECK_REDUCE_VECTOR=0 python3 -m tpcheck emulate -n 8 -- \
        "$root/tests/python/emulate_workers/collectives.py" --cuda
      timed "emulate: every collective, cuda, TP 4 split, scalar kernel" emulate_collectives_scalar_split.log \
        env TPCHECK_REDUCE_VECTOR=0 TPCHECK_EMULATE_SPLIT_BYTES=0 python3 -m tpcheck emulate -n 4 --no-mps -- \
        "$root/tests/python/emulate_workers/collectives.py" --cuda
      if [ -x "$root/.devrun/tests/comm_ring_test" ]; then
        timed "device group ring test, scalar kernel" comm_ring_scalar.log \
          env TPCHECK_REDUCE_VECTOR=0 "$root/.devrun/tests/comm_ring_test"
    fi
    timed "emulate: every collective, cuda, TP 3, rank order, --no-mps" emulate_collectives_rank.log \
      python3 -m tpcheck emulate -n 3 --comm-order rank --no-mps -- \
      "$root/tests/python/emulate_workers/collectives.py" --cuda
    timed "emulate: every collective, cuda, TP 3, rank order, default launch (MPS)" emulate_collectives_rank_mps.log \
      python3 -m tpcheck emulate -n 3 --comm-order rank -- \
      "$root/tests/python/emulate_workers/collectives.py" --cuda
    for f in emulate_collectives_split emulate_collectives_zc emulate_collectives_mps emulate_collectives_rank \
             emulate_collectives_rank_mps emulate_collectives_scalar emulate_collectives_scalar_split; do
      grep -E "ALL OK|Error|error" "$out/$f.log" | head -5 >>"$out/failures.txt"
    done
    fi
    if [[ "$emulate_parts" == *" examples "* ]]; then
      timed "emulate: example, cuda, TP 4 SP bf16" emulate_example.log \
        python3 -m tpcheck emulate -n 4 -- "$root/examples/emulate_megatron_mlp.py" --sp --dtype bf16
      # --trace's GEMM half: cuBLASLt logs of a TP 1 and a TP 4 launch, and tpcheck diff.
      w="$root/tests/python/emulate_workers/trace_small.py"
      timed "emulate: --trace, cuda, TP 1 and TP 4, tpcheck diff" emulate_trace.log bash -c \
        "python3 -m tpcheck emulate -n 1 --trace '$out/trace1' -- '$w' --cuda &&
         python3 -m tpcheck emulate -n 4 --trace '$out/trace4' -- '$w' --cuda &&
         '$bin' diff '$out/trace1/ledger.json' '$out/trace4/ledger.json'; echo diff status \$?"
      timed "emulate: TF32 investigation example, TP 4" emulate_tf32.log \
        python3 -m tpcheck emulate -n 4 -- "$root/examples/tf32_investigation.py"
      cat "$out/emulate_example.log" "$out/emulate_tf32.log" >>"$out/failures.txt"
    fi
    if [[ "$emulate_parts" == *" bench "* ]]; then
      # The goals' figures (issue 32: the MLP step and the collectives at TP 8; issue 33:
      # compare_tp at TP 8), with gloo and the copy bandwidth measured in the same run.
      timed "emulate: bench, TP 8, --no-mps" emulate_bench.log python3 "$root/bench/emulate_bench.py" --tp 8 --no-mps
      timed "emulate: bench, TP 8, default launch (MPS)" emulate_bench_mps.log \
        env TPCHECK_BENCH_PROFILE="$out/emulate_bench_mps_profile.txt" \
        python3 "$root/bench/emulate_bench.py" --tp 8 --parts mlp coll
      timed "compare_tp: bench, TP 2 and 8, --mps" compare_bench.log \
        python3 "$root/bench/compare_bench.py" --compare-tp --device cuda --tp 2 8 --repeat 3 --mps
      cat "$out/emulate_bench.log" "$out/emulate_bench_mps.log" "$out/compare_bench.log" >>"$out/failures.txt"
    fi
  else
    row "emulate" "$no_wheel" ""
  fi
fi

# Not in the default stages: issue 7's calibration grid on the GPU (scripts/calibrate.py
# --backend cuda): false alarms and detection per policy over seeds x TP x GEMM class x
# size sets, many suite runs at once (they are host-bound). Resumes from
# docs/calibration/grid_cuda.jsonl; the grown file and its table come back in
# $OUT/calibration/. TPCHECK_GRID_DEADLINE (s, default 300), TPCHECK_GRID_JOBS,
# TPCHECK_GRID_ARGS (more calibrate.py arguments).
if has grid; then
  mkdir -p "$out/calibration"
  cp "$root/docs/calibration/grid_cuda.jsonl" "$out/calibration/" 2>/dev/null || true
  # shellcheck disable=SC2086
  timed "calibration grid, cuda" grid_cuda.log python3 "$root/scripts/calibrate.py" \
    --backend cuda --tpcheck "$bin" --jobs "${TPCHECK_GRID_JOBS:-$(($(nproc) - 2))}" \
    --deadline "${TPCHECK_GRID_DEADLINE:-300}" --results "$out/calibration/grid_cuda.jsonl" \
    --out "$out/calibration/grid_cuda.md" ${TPCHECK_GRID_ARGS:-}
fi

# Not in the default stages: models — real TP libraries under tpcheck emulate, judged by
# compare_tp (issue 42 item 5): Megatron-core's GPT TransformerLayer at TP 2, 4, 8 (f32 and
# bf16) and the Hugging Face models of tests/python/test_hf_models.py (bf16; f32 with TF32),
# tests/gpu/megatron_layer.py. Needs the wheel in .devrun/, transformers
# in python3, and megatron-core's wheel in a carried .whl/ folder (that script says how).
if has models; then
  if python_package; then
    unset PYTHONDONTWRITEBYTECODE   # as in the emulate stage: torch and transformers compiled once
    export PYTHONPYCACHEPREFIX="${TMPDIR:-/tmp}/tpcheck-pycache"
    mcore="${TMPDIR:-/tmp}/tpcheck-megatron"
    whl="$(ls "$root"/.whl/megatron_core-*.whl 2>/dev/null | head -1)"
    parts="${TPCHECK_MODELS_PARTS:-megatron hf}"   # which parts of megatron_layer.py
    if [[ " $parts " == *" megatron "* ]]; then
      if [ -n "$whl" ] && python3 -m pip install -q --no-deps --target "$mcore" "$whl" >"$out/models_pip.log" 2>&1; then
        export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$mcore"
      else
        row "models: megatron-core" "not installed: no .whl/megatron_core-*.whl or pip failed (models_pip.log)" ""
        parts="${parts/megatron/}"
      fi
    fi
    models_tp="${TPCHECK_MODELS_TP:-2 4 8}"   # TP sizes (each part: one launch per size)
    # shellcheck disable=SC2086
    timed "models: $parts under compare_tp, TP $models_tp" models.log \
      python3 "$root/tests/gpu/megatron_layer.py" --out "$out/models" --parts $parts --tp $models_tp
    cat "$out/models.log" >>"$out/failures.txt"
    cp "$out/models/summary.json" "$out/models_summary.json" 2>/dev/null
    # issue 42's GPU figure: compare_tp on the tiny Llama at TP 8 beside one unsharded
    # fwd+bwd and one float64 truth with its probe, in the same process
    timed "models: compare_tp on the tiny Llama, TP 8, cuda (bench/models_bench.py)" models_bench.log \
      python3 "$root/bench/models_bench.py" --device cuda --tp 8
    cat "$out/models_bench.log" >>"$out/failures.txt"
  else
    row "models" "$no_wheel" ""
  fi
fi

# Stage te (not in the default set; issue 43 item 1): TransformerEngine's own distributed
# numerics test, tests/pytorch/distributed/run_numerics.py exactly as TE ships it, under
# `tpcheck emulate` with every rank on this one GPU. Needs the wheel in .devrun/ (as the
# emulate stage) and a TransformerEngine 2.20 bundle for one Hopper GPU (install.sh,
# te_bundle.tar.xz with the installed package and TE's distributed tests, SHA256SUMS, the
# pure-Python wheels/ TE imports) copied into a git-ignored folder that the device call carries, .te/ by default
# (TPCHECK_TE_BUNDLE). The bundle is installed into /tmp/te (TE_DEST, install.sh's own knob)
# once per machine (again with TPCHECK_TE_REINSTALL=1). A row per run: TE's own "Passed test" lines, the exit status,
# the seconds. Knobs, to split the stage over device calls of at most 10 minutes:
#   TPCHECK_TE_QUANT   quantizations (default: every one TE runs on Hopper:
#                      none fp8 fp8_cs fp8_block_scaling; "none" runs without --quantization)
#   TPCHECK_TE_TP      TP sizes of the default (MPS) launches (default: 2 4)
#   TPCHECK_TE_NOMPS   1 (default): also TP 4 with --no-mps, for the wall time without MPS
#   TPCHECK_TE_PARTS   numerics (TP 2 and 4 under MPS, the default launch; TP 4 --no-mps),
#                      trace (fp32: TP 1 and TP 4 with --trace, tpcheck diff), modules (TE's
#                      modules against tpcheck's layers and the float64 truth,
#                      tests/gpu/te_modules.py), fidelity (the same at TP 4,
#                      tests/gpu/te_fidelity_tp.py), compare (compare_tp on TE's modules and
#                      their FP8 state, tests/gpu/te_compare_tp.py), failure (the reference
#                      failure on TE at TP 4, examples/te_reference_failure.py); default all
# MXFP8 and NVFP4 need Blackwell: their rows are TE's own availability answers.
stage_te() (
  local bundle="${TPCHECK_TE_BUNDLE:-$root/.te}" te_home="${TE_DEST:-/tmp/te}" quant parts te_dir
  quant="${TPCHECK_TE_QUANT:-none fp8 fp8_cs fp8_block_scaling}"
  parts="${TPCHECK_TE_PARTS:-modules fidelity compare failure numerics trace}"
  if ! python_package; then
    row "te" "$no_wheel" ""
    return
  fi
  if [ ! -f "$te_home/env.sh" ] || [ "${TPCHECK_TE_REINSTALL:-0}" = 1 ]; then
    if [ ! -f "$bundle/install.sh" ]; then
      row "te" "no TE bundle in $bundle: copy the TE bundle (install.sh, te_bundle.tar.xz, SHA256SUMS, wheels/) there and carry it" ""
      return
    fi
    timed "te: install the bundle (TE 2.20.2, sm_90)" te_install.log env TE_SKIP_SMOKE=1 bash "$bundle/install.sh"
  fi
  # shellcheck disable=SC1091
  source "$te_home/env.sh"
  # As the emulate stage: bytecode cached across the ranks' processes.
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${TMPDIR:-/tmp}/tpcheck-pycache"
  te_dir="$(dirname "$(find "$te_home/tests" -name run_numerics.py | head -1)")"
  if [ ! -f "$te_dir/run_numerics.py" ]; then
    row "te" "run_numerics.py not found under $te_home/tests (see te_install.log)" ""
    return
  fi
  python3 - >"$out/te_availability.log" 2>&1 <<'EOF'
import transformer_engine as t, transformer_engine.pytorch as te
print("transformer_engine", t.__version__)
for name, check in [("fp8", te.is_fp8_available), ("fp8_block_scaling", te.is_fp8_block_scaling_available),
                    ("mxfp8", te.is_mxfp8_available), ("nvfp4", te.is_nvfp4_available)]:
    ok, why = check(return_reason=True)
    print(f"{name}: available={ok} {why}".rstrip())
EOF
  while IFS= read -r line; do
    case "$line" in
      mxfp8:*|nvfp4:*) row "te: ${line%%:*} (TE's own availability check)" "${line#*: }" "" ;;
    esac
  done <"$out/te_availability.log"
  grep -q "^transformer_engine" "$out/te_availability.log" ||
    row "te: import transformer_engine.pytorch" "failed: $(tail -n 1 "$out/te_availability.log" | tr '|' '/')" ""

  # te_run NAME LOG -n N [launcher options] -- [run_numerics.py options]: one launch from TE's
  # test folder (run_numerics.py imports run_layer_with_overlap.py beside it), at most
  # TPCHECK_TE_TIMEOUT seconds (default 300).
  te_run() {
    local name="$1" log="$2" start end rc
    shift 2
    start=$(date +%s.%N)
    (cd "$te_dir" && timeout "${TPCHECK_TE_TIMEOUT:-300}" python3 -m tpcheck emulate "$@") >"$out/$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    row "$name" "rc=$rc, $(grep -c "Passed test" "$out/$log") Passed test; $(head -n 1 "$out/$log" | sed 's/^tpcheck emulate: //' | tr '|' '/')" \
      "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"
    grep -E "NUMERICAL CHECK FAILED|Error|error:" "$out/$log" | head -5 >>"$out/failures.txt"
  }
  if [[ " $parts " == *" modules "* ]]; then
    # TE's modules (one GPU; float32 with TF32, bfloat16, and one step of each Hopper
    # recipe) against tpcheck's layers on the same parameters, and both against the
    # float64 truth (the fidelity table).
    timed "te: TE modules vs tpcheck's layers and the float64 truth (te_modules.py)" te_modules.log \
      python3 "$root/tests/gpu/te_modules.py" --out "$out/te_modules.json"
    cat "$out/te_modules.log" >>"$out/failures.txt"
  fi
  if [[ " $parts " == *" fidelity "* ]]; then
    # The same at TP 4 under tpcheck emulate: TE's sharded modules, gathered, against
    # tpcheck's layers sharded at TP 4 in the suite's own group (layer_run(tp_size=4)),
    # unquantized and under one step of each Hopper recipe (fp8, fp8_cs, fp8_block_scaling).
    timed "te: TE's sharded modules vs tpcheck's sharded layers, TP 4 (te_fidelity_tp.py)" te_fidelity_tp4.log \
      timeout "${TPCHECK_TE_TIMEOUT:-300}" python3 -m tpcheck emulate -n 4 -- \
      "$root/tests/gpu/te_fidelity_tp.py" "$out/te_fidelity_tp4.json"
    cat "$out/te_fidelity_tp4.log" >>"$out/failures.txt"
  fi
  if [[ " $parts " == *" failure "* ]]; then
    # The reference failure on TE itself: LayerNormMLP and TransformerLayer at
    # run_numerics.py's float32 configuration, TP 4: TE's rule at atol 1e-5 and 5e-5,
    # truth's verdict, the GEMM sites whose class changed (examples/te_reference_failure.py).
    timed "te: the reference failure on TE, TP 4 (examples/te_reference_failure.py)" te_failure.log \
      timeout "${TPCHECK_TE_TIMEOUT:-300}" python3 -m tpcheck emulate -n 4 -- \
      "$root/examples/te_reference_failure.py" --out "$out/te_failure.json"
    cat "$out/te_failure.log" >>"$out/failures.txt"
  fi
  if [[ " $parts " == *" compare "* ]]; then
    # compare_tp on TE's own modules at TP 2 and 4, the truth from tpcheck's layers.
    local n
    for n in ${TPCHECK_TE_TP:-2 4}; do
      timed "te: compare_tp on TE modules, TP $n (te_compare_tp.py)" te_compare_tp$n.log \
        timeout "${TPCHECK_TE_TIMEOUT:-300}" python3 -m tpcheck emulate -n "$n" -- \
        "$root/tests/gpu/te_compare_tp.py" "$out/te_compare_tp$n.json"
      cat "$out/te_compare_tp$n.log" >>"$out/failures.txt"
    done
  fi
  local q qarg
  if [[ " $parts " == *" numerics "* ]]; then
    local n
    for q in $quant; do
      qarg=(); [ "$q" != none ] && qarg=(--quantization "$q")
      for n in ${TPCHECK_TE_TP:-2 4}; do
        te_run "te: run_numerics $q, TP $n" "te_numerics_${q}_tp$n.log" -n "$n" -- run_numerics.py "${qarg[@]}"
      done
      if [ "${TPCHECK_TE_NOMPS:-1}" = 1 ]; then
        te_run "te: run_numerics $q, TP 4, --no-mps" "te_numerics_${q}_tp4_nomps.log" -n 4 --no-mps -- \
          run_numerics.py "${qarg[@]}"
      fi
    done
  fi
  if [[ " $parts " == *" trace "* ]]; then
    # fp32 (no --quantization: the reference failure's configuration): every cuBLASLt GEMM
    # and collective of a TP 1 and a TP 4 launch, and the GEMM sites whose algorithm,
    # compute type or numerical class changed between them.
    rm -rf "$out/te_trace1" "$out/te_trace4"
    te_run "te: run_numerics fp32, TP 1, --trace" te_trace_tp1.log -n 1 --trace "$out/te_trace1" -- run_numerics.py
    te_run "te: run_numerics fp32, TP 4, --trace" te_trace_tp4.log -n 4 --trace "$out/te_trace4" -- run_numerics.py
    local start end rc
    start=$(date +%s.%N)
    python3 -m tpcheck diff "$out/te_trace1/ledger.json" "$out/te_trace4/ledger.json" >"$out/te_trace_diff.txt" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local summary
    summary="$(grep -m1 -E "^GEMMs whose algorithm|no GEMM recorded|error:" "$out/te_trace_diff.txt" ||
               tail -n 1 "$out/te_trace_diff.txt")"
    row "te: tpcheck diff of the TP 1 and TP 4 ledgers (te_trace_diff.txt)" \
      "status $rc (1: something differs); $(echo "$summary" | cut -c1-400 | tr '|' '/')" \
      "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"
  fi
)
has te && stage_te

# The GEMM algorithm / class differences of every suite run, in one file.
ls "$out"/te_cuda_tp*.json >/dev/null 2>&1 &&
  python3 "$root/scripts/gemm_class_table.py" "$out"/te_cuda_tp*.json >"$out/class_tables.md" 2>&1
# The device returns few files: the logs and reports this invocation wrote travel as one
# archive (logs.tgz, or logs-2.tgz ... when an earlier invocation made one).
(
  cd "$out" || exit
  archive=logs.tgz
  n=2
  while [ -e "$archive" ]; do archive="logs-$n.tgz"; n=$((n + 1)); done
  kept=(! -name '*.tgz' ! -name table.md ! -name class_tables.md ! -name profile_folded.md
        ! -name 'mutations_*_table.md' ! -name failures.txt ! -name '.start.*')
  find . -mindepth 1 -maxdepth 1 -newer "$start_marker" "${kept[@]}" ! -name calibration \
    -print0 >"$start_marker.list"
  [ -s "$start_marker.list" ] && tar -czf "$archive" --null -T "$start_marker.list" 2>/dev/null
  find . -maxdepth 1 -type f -newer "$start_marker" "${kept[@]}" -delete
  rm -f "$start_marker" "$start_marker.list"
)
cat "$out/failures.txt" 2>/dev/null | grep -v PASSED | head -30
echo
cat "$table"

#!/usr/bin/env bash
# Records cuBLASLt API-trace logs on the GPU machine for the log tools' tests
# (tests/data/cublaslt/): tpcheck running one case at TP 1 and at TP 2 (emulated), and a
# small PyTorch program doing the same products at the full and the sharded shape.
# Writes $OUT/cublaslt_logs.tgz.
#   bash tests/gpu/record_cublaslt_logs.sh [CASE_REGEX]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/tpcheck-gpu}"
mkdir -p "$out/cublaslt"
d="$out/cublaslt"
if [ -f "$root/.devrun/devrun.tgz" ] && [ ! -x "$root/.devrun/tpcheck" ]; then
  tar -C "$root/.devrun" -xzf "$root/.devrun/devrun.tgz"
fi
export LD_LIBRARY_PATH="$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$root/.devrun/tpcheck"
case_re="${1:-^TransformerLayer.sp0.default$}"
for level in 5 2; do
  for tp in 1 2; do
    CUBLASLT_LOG_LEVEL=$level CUBLASLT_LOG_FILE="$d/tpcheck_tp${tp}_level${level}.log" \
      "$bin" run --backend cuda --suite te --tp "$tp" --filter "$case_re" --quiet >"$d/tpcheck_tp${tp}_level${level}.out" 2>&1
  done
done
cat >"$d/torch_linear.py" <<'PY'
# Column-parallel fc1 of a 2-way TP LayerNormMLP: the full product and one rank's shard,
# as PyTorch runs them (F.linear with bias goes through cublasLt's bias epilogue).
import sys
import torch
import torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = sys.argv[1] == "tf32"
dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "tf32": torch.float32}[sys.argv[1]]
tp = int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(1024, 1024, device="cuda", dtype=dtype, generator=g)
w = torch.randn(4096 // tp, 1024, device="cuda", dtype=dtype, generator=g)
b = torch.randn(4096 // tp, device="cuda", dtype=dtype, generator=g)
y = F.linear(x, w, b)      # bias epilogue
z = x @ w.t()              # plain matmul
torch.cuda.synchronize()
print(sys.argv[1], tp, float(y.float().abs().sum()), float(z.float().abs().sum()))
PY
for dt in bf16 f32 tf32; do
  for tp in 1 2; do
    CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE="$d/torch_${dt}_tp${tp}.log" \
      python3 "$d/torch_linear.py" "$dt" "$tp" >"$d/torch_${dt}_tp${tp}.out" 2>&1
  done
done
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >"$d/versions.txt" 2>&1
ls -la "$d" >>"$d/versions.txt"
(cd "$out" && tar -czf cublaslt_logs.tgz cublaslt && rm -rf cublaslt)

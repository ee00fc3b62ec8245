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

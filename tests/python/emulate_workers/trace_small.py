"""A small tensor-parallel step for test_emulate_diff.py: python trace_small.py.

Megatron style, the collectives are skipped at TP 1 (a TP 1 run issues none): a column
parallel matmul whose output is gathered, and a row parallel one whose partial products
are all-reduced, in float32; then a bf16 reduce-scatter (sequence parallel)."""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, tp = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x = torch.randn(8, 16)
w1 = torch.randn(32, 16)[rank * 32 // tp:(rank + 1) * 32 // tp]  # this rank's rows
h = x @ w1.t()
if tp > 1:
    parts = torch.empty(tp, *h.shape)
    dist.all_gather_into_tensor(parts, h)
    h = torch.cat(list(parts), dim=1)
w2 = torch.randn(16, 32)[:, rank * 32 // tp:(rank + 1) * 32 // tp]  # this rank's columns
y = h[:, rank * 32 // tp:(rank + 1) * 32 // tp] @ w2.t()
if tp > 1:
    dist.all_reduce(y)
    z = torch.empty(8 // tp, 16, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(z, y.to(torch.bfloat16))
print("ALL OK", flush=True)
dist.destroy_process_group()

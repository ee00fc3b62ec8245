"""A small tensor-parallel step for test_emulate_diff.py: python trace_small.py.

Megatron style, the collectives are skipped at TP 1 (a TP 1 run issues none): a column
parallel matmul whose output is gathered, and a row parallel one whose partial products
are all-reduced, in float32; then a bf16 reduce-scatter (sequence parallel).
--cuda: on the rank's GPU, 1024 tokens, hidden 1024, ffn 4096 (tests/gpu/run.sh emulate:
the GEMM half of --trace)."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, tp = dist.get_rank(), dist.get_world_size()
cuda = "--cuda" in sys.argv
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
T, H, F = (1024, 1024, 4096) if cuda else (8, 16, 32)
torch.manual_seed(0)
x = torch.randn(T, H).to(dev)
w1 = torch.randn(F, H)[rank * F // tp:(rank + 1) * F // tp].to(dev)  # this rank's rows
h = x @ w1.t()
if tp > 1:
    parts = torch.empty(tp, *h.shape, device=dev)
    dist.all_gather_into_tensor(parts, h)
    h = torch.cat(list(parts), dim=1)
w2 = torch.randn(H, F)[:, rank * F // tp:(rank + 1) * F // tp].to(dev)  # this rank's columns
y = h[:, rank * F // tp:(rank + 1) * F // tp] @ w2.t()
if tp > 1:
    dist.all_reduce(y)
    z = torch.empty(T // tp, H, dtype=torch.bfloat16, device=dev)
    dist.reduce_scatter_tensor(z, y.to(torch.bfloat16))
print("ALL OK", flush=True)
dist.destroy_process_group()

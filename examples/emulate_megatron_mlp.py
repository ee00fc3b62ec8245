"""A Megatron-style tensor-parallel MLP (column -> gelu -> row), optionally with sequence
parallel, written as for torchrun + NCCL — and run at TP 2, 4 or 8 on ONE GPU (or the CPU)
with `tpcheck emulate`, the collectives summed in NCCL's ring order with its rounding:

    python -m tpcheck emulate -n 4 -- examples/emulate_megatron_mlp.py
    python -m tpcheck emulate -n 8 -- examples/emulate_megatron_mlp.py --sp --dtype bf16
    torchrun --nproc-per-node 4 examples/emulate_megatron_mlp.py    # the same, on 4 GPUs

Nothing in it knows about tpcheck's launcher: it calls init_process_group("nccl"),
torch.cuda.set_device(LOCAL_RANK) and dist.get_rank() like any torchrun program (the
launcher maps those; docs/EMULATE.md). Every rank also runs the unsharded MLP and an fp64
one on the same inputs, and tpcheck judges the gathered TP outputs and gradients (policy
"truth": the TP run's error against fp64 may be a few times the single run's). Exit
status 0 when every tensor passes.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tpcheck

p = argparse.ArgumentParser()
p.add_argument("--sp", action="store_true", help="sequence parallel (all-gather / reduce-scatter)")
p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--ffn", type=int, default=1024)
p.add_argument("--seq", type=int, default=64)
args = p.parse_args()

dist.init_process_group("nccl")
device = torch.device("cpu")
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda", torch.cuda.current_device())
rank, tp = dist.get_rank(), dist.get_world_size()
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]


class CopyToTP(torch.autograd.Function):  # Megatron's f
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g)
        return g


class ReduceFromTP(torch.autograd.Function):  # Megatron's g
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _gather_seq(x):
    out = torch.empty((x.shape[0] * tp, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def _scatter_seq(x):
    out = torch.empty((x.shape[0] // tp, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _gather_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _scatter_seq(g)


class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _scatter_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _gather_seq(g)


def mlp(x, w1, b1, w2, b2, tp_mode):
    if tp_mode == "sp":
        x = GatherSeq.apply(x)
    elif tp_mode == "tp":
        x = CopyToTP.apply(x)
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    y = F.linear(h, w2)
    if tp_mode == "sp":
        y = ScatterSeq.apply(y)
    elif tp_mode == "tp":
        y = ReduceFromTP.apply(y)
    return y + b2


# The same global parameters and inputs on every rank.
g = torch.Generator().manual_seed(1234)
H, FF, S = args.hidden, args.ffn, args.seq
full = {"w1": torch.randn(FF, H, generator=g) / H ** 0.5, "b1": torch.randn(FF, generator=g) * 0.1,
        "w2": torch.randn(H, FF, generator=g) / FF ** 0.5, "b2": torch.randn(H, generator=g) * 0.1}
x_full = torch.randn(S, 1, H, generator=g)
dy_full = torch.randn(S, 1, H, generator=g)


def run(params, x, dy, tp_mode, dt):
    leaves = {k: v.to(device, dt).requires_grad_() for k, v in params.items()}
    xl = x.to(device, dt).requires_grad_()
    y = mlp(xl, leaves["w1"], leaves["b1"], leaves["w2"], leaves["b2"], tp_mode)
    y.backward(dy.to(device, dt))
    grads = {"d" + k: v.grad for k, v in leaves.items()}
    return {"output": y.detach(), "dx": xl.grad, **grads}


def gather(t, dim):
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


# TP run: fc1 column parallel (rows of w1, b1), fc2 row parallel (columns of w2).
shard = {"w1": full["w1"].chunk(tp, 0)[rank], "b1": full["b1"].chunk(tp, 0)[rank],
         "w2": full["w2"].chunk(tp, 1)[rank], "b2": full["b2"]}
mode = "sp" if args.sp else "tp"
xs, dys = (x_full.chunk(tp, 0)[rank], dy_full.chunk(tp, 0)[rank]) if args.sp else (x_full, dy_full)
out = run(shard, xs, dys, mode, dtype)
if args.sp:
    out["output"], out["dx"] = gather(out["output"], 0), gather(out["dx"], 0)
    dist.all_reduce(out["db2"])  # grads of sequence-parallel params are summed over TP
sharded = {"output": out["output"], "dx": out["dx"], "dw1": gather(out["dw1"], 0),
           "db1": gather(out["db1"], 0), "dw2": gather(out["dw2"], 1), "db2": out["db2"]}

single = run(full, x_full, dy_full, "none", dtype)        # the TP 1 run, same process
truth = run(full, x_full, dy_full, "none", torch.float64)  # fp64

K = {"output": FF, "dx": FF, "dw1": S, "db1": S, "dw2": S, "db2": S}  # longest reduction
failed = 0
for name, t in sharded.items():
    v = tpcheck.compare(single[name], t, truth[name], reduction_length=K[name], tp_size=tp, name=name)
    if rank == 0:
        print(f"{name:7s} {'pass' if v.passed else 'FAIL'}  {v.reason}")
    failed += not v.passed

dist.destroy_process_group()
sys.exit(1 if failed else 0)

"""Megatron-style tensor-parallel mappings and MLP, written for tpcheck's tests (not
Megatron's code: the same parameter attributes and communication pattern,
megatron/core/tensor_parallel/mappings.py written anew), with switchable injected bugs.
The one definition of these mappings: the compare_tp tests (torch_tp_worker.py, spawned
gloo ranks) and the emulate tests (emulate_workers/mlp.py, under `python -m tpcheck
emulate`) both use them.

Mappings (torch.autograd.Functions on this rank's tensors, over the default group):
  CopyToRegion            identity forward, all-reduce of the gradient backward (Megatron's f)
  ReduceFromRegion        all-reduce forward, identity backward (Megatron's g)
  GatherFromSequence      all-gather along dim 0 forward, reduce-scatter backward
  ReduceScatterToSequence reduce-scatter along dim 0 forward, all-gather backward
(all_gather_into_tensor / reduce_scatter_tensor: gloo has both since PyTorch 2.x, and
the emulate backend too).

ColumnParallelLinear (weight rows split, partition_dim 0) → GELU → RowParallelLinear
(weight columns split, partition_dim 1), optionally sequence parallel (input and output
split along the sequence dim 0 of [seq, batch, hidden]).

BUG names the injected bug (module global, set by the test in each rank process):
  "none", "dropped-allreduce" (row-parallel output not reduced),
  "grad-averaged" (column-parallel input gradient averaged over ranks instead of summed),
  "rescale" (row-parallel output divided by N); under sequence parallel the first two
  act on the reduce-scatters that replace the all-reduces, "shard-offset" (each rank's weight shard
  taken one row further on), "wrong-group-gather" (sequence-parallel all-gather assembling
  the pieces of the wrong ranks: rotated by one).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

BUG = "none"


def _n() -> int:
    return dist.get_world_size()


def _all_gather0(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty((x.shape[0] * _n(), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    if BUG == "wrong-group-gather":
        pieces = out.chunk(_n(), 0)
        out = torch.cat(pieces[1:] + pieces[:1], 0)
    return out


def _reduce_scatter0(x: torch.Tensor, forward: bool) -> torch.Tensor:
    if forward and BUG == "dropped-allreduce":  # this rank's own partial, not summed
        return x.chunk(_n(), 0)[dist.get_rank()].clone()
    out = torch.empty((x.shape[0] // _n(), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous())
    if not forward and BUG == "grad-averaged":
        out /= _n()
    return out


class CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        if BUG == "grad-averaged":
            g /= _n()
        return g


class ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        if BUG != "dropped-allreduce":
            dist.all_reduce(x)
        if BUG == "rescale":
            x /= _n()
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _all_gather0(x)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter0(g, forward=False)


class ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = _reduce_scatter0(x, forward=True)
        if BUG == "rescale":
            x /= _n()
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_gather0(g)


def _shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    n, r = _n(), dist.get_rank()
    size = t.shape[dim] // n
    start = r * size + (1 if BUG == "shard-offset" else 0)
    idx = torch.arange(start, start + size) % t.shape[dim]
    return t.index_select(dim, idx).clone()


class MLP(torch.nn.Module):
    """The unsharded twin: fc1 (hidden → ffn), GELU, fc2 (ffn → hidden)."""

    def __init__(self, hidden: int, ffn: int, dtype=torch.float32):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn, dtype=dtype)
        self.fc2 = torch.nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TPMLP(torch.nn.Module):
    """This rank's shard of `single` (its parameters copied), Megatron style."""

    def __init__(self, single: MLP, sequence_parallel: bool = False):
        super().__init__()
        self.sp = sequence_parallel
        self.fc1 = torch.nn.Module()
        self.fc2 = torch.nn.Module()
        self.fc1.weight = torch.nn.Parameter(_shard(single.fc1.weight.detach(), 0))
        self.fc1.bias = torch.nn.Parameter(_shard(single.fc1.bias.detach(), 0))
        self.fc2.weight = torch.nn.Parameter(_shard(single.fc2.weight.detach(), 1))
        self.fc2.bias = torch.nn.Parameter(single.fc2.bias.detach().clone())
        for p, dim in ((self.fc1.weight, 0), (self.fc1.bias, 0), (self.fc2.weight, 1)):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
        self.fc2.bias.sequence_parallel = sequence_parallel

    def forward(self, x):
        x = GatherFromSequence.apply(x) if self.sp else CopyToRegion.apply(x)
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.fc1.weight, self.fc1.bias))
        y = torch.nn.functional.linear(h, self.fc2.weight)
        y = ReduceScatterToSequence.apply(y) if self.sp else ReduceFromRegion.apply(y)
        return y + self.fc2.bias

"""Reassembling a rank's shard into the full tensor, and telling replicas apart, for
compare_tp.

A sharded parameter says how it is split in one of three ways, tried in this order:
- it is a DTensor: its placements say it (`full_tensor()` gathers, reduces partials);
- Megatron's attributes: `tensor_model_parallel=True`, `partition_dim`, `partition_stride`
  (stride s: the full tensor is cut into s·N pieces along the dim and rank r holds pieces
  r, N + r, 2N + r, ... — megatron.core's _initialize_affine_weight_cpu);
- the caller's map {name: dim} (None for replicated).
Anything else is replicated: the rank holds the whole tensor.

`gather_all` reassembles many tensors with one all-gather of their packed bytes: those
split along one dim (Megatron's attributes, the shards map, the gradients of sharded
inputs) and DTensors sharded evenly on one dim of a 1-D mesh over the group itself. Other
DTensors (2-D meshes, partial sums, uneven or strided shards, another group) gather one by
one with their own full_tensor().
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .._errors import InputError

__all__ = ["ShardSpec", "is_dtensor", "spec_of_parameter", "gather", "gather_all",
           "local_chunk", "is_replica", "local_tensor", "waited"]


@dataclass(frozen=True)
class ShardSpec:
    """How one tensor is split over the group: dim None = replicated; source names where
    the spec came from (for error messages)."""
    dim: Optional[int]
    stride: int = 1
    source: str = "replicated"
    dtensor: bool = False


def is_dtensor(t: object) -> bool:
    # No DTensor exists before its module is imported, and importing it pulls in sympy and
    # torch._dynamo (seconds, once per process): a module without DTensors never pays it.
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(t, dtensor)


def spec_of_parameter(name: str, p: torch.Tensor, shards: dict) -> ShardSpec:
    """The shard spec of sharded parameter `name` (module docstring's order)."""
    if is_dtensor(p):
        return ShardSpec(None, 1, "DTensor placements", dtensor=True)
    if getattr(p, "tensor_model_parallel", False):
        dim = getattr(p, "partition_dim", None)
        if dim is None:
            raise InputError(f"compare_tp: parameter {name!r} has tensor_model_parallel=True but "
                             "no partition_dim; expected Megatron's attributes (partition_dim, "
                             "partition_stride)")
        return ShardSpec(int(dim), int(getattr(p, "partition_stride", 1)), "Megatron attributes")
    if name in shards:
        d = shards[name]
        return ShardSpec(None if d is None else int(d), 1, "shards map" if d is not None else "replicated")
    return ShardSpec(None)


def group_size(group) -> int:
    """The group's size; 1 when torch.distributed is not initialized (compare_tp in a
    single process: every tensor is whole)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group) -> int:
    """This process's rank in the group; 0 when torch.distributed is not initialized."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def all_gather_dim(t: torch.Tensor, dim: int, group, stride: int = 1) -> torch.Tensor:
    """The full tensor from every rank's piece along `dim` (no autograd)."""
    n = group_size(group)
    t = t.detach().contiguous()
    if n == 1:  # one rank holds the whole tensor (any stride's pieces are in order)
        return t
    pieces = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(pieces, t, group=group)
    return _joined(pieces, dim, stride)


def _joined(pieces: Sequence[torch.Tensor], dim: int, stride: int) -> torch.Tensor:
    """The full tensor from every rank's piece along `dim`, in rank order (each piece cut
    into `stride` parts that interleave: Megatron's partition_stride)."""
    n, t = len(pieces), pieces[0]
    if stride == 1:
        return torch.cat(list(pieces), dim=dim)
    if t.shape[dim] % stride:
        raise InputError(f"compare_tp: a shard of length {t.shape[dim]} along dim {dim} does "
                         f"not split into partition_stride {stride} pieces; expected a length divisible "
                         "by the parameter's partition_stride")
    split = [p.chunk(stride, dim=dim) for p in pieces]
    return torch.cat([split[r][s] for s in range(stride) for r in range(n)], dim=dim)


def gather(t: torch.Tensor, spec: ShardSpec, group) -> torch.Tensor:
    """The full tensor of `t` under `spec`."""
    if spec.dtensor or is_dtensor(t):
        return t.detach().full_tensor() if is_dtensor(t) else t.detach()
    if spec.dim is None:
        return t.detach()
    return all_gather_dim(t, spec.dim, group, spec.stride)


def _split_of(t: torch.Tensor, spec: ShardSpec, g) -> Optional[tuple[torch.Tensor, int, int]]:
    """(this rank's piece, dim, stride) when one all-gather along a dim reassembles `t`;
    None when it is whole here or a DTensor that gathers itself. The same answer on every
    rank (it reads specs, placements and global shapes, never local data)."""
    if not is_dtensor(t):
        return None if spec.dim is None else (t.detach(), spec.dim, spec.stride)
    from torch.distributed.tensor import Shard
    mesh, (place, *more) = t.device_mesh, t.placements
    if more or type(place) is not Shard or t.shape[place.dim] % g.size:
        return None
    if mesh.mesh.flatten().tolist() != _group_ranks(g):
        return None
    return waited(t.detach().to_local()), place.dim % t.dim(), 1


def _group_ranks(g) -> list[int]:
    return [g.global_rank(r) for r in range(g.size)]


def gather_all(items: Sequence[tuple[torch.Tensor, ShardSpec]], g, device: torch.device) -> list[torch.Tensor]:
    """The full tensors of many (tensor, spec) pairs: those split along a dim with one
    all-gather of their packed bytes (module docstring), the others one by one."""
    out: list = [None] * len(items)
    split = []
    for i, (t, spec) in enumerate(items):
        found = _split_of(t, spec, g) if g.size > 1 else None
        if found is None:
            out[i] = gather(t, spec, g.group)
        else:
            split.append((i, *found))
    if split:
        by_rank = g.all_gather_packed([piece for _, piece, _, _ in split], device)
        for j, (i, _, dim, stride) in enumerate(split):
            out[i] = _joined([pieces[j] for pieces in by_rank], dim, stride)
    return out


def local_chunk(t: torch.Tensor, dim: Optional[int], group) -> torch.Tensor:
    """This rank's piece of a global tensor along `dim` (the whole tensor for None)."""
    if dim is None:
        return t
    n, r = group_size(group), group_rank(group)
    if n == 1:
        return t
    if t.shape[dim] % n:
        raise InputError(f"compare_tp: a tensor of shape {tuple(t.shape)} does not split into "
                         f"{n} equal pieces along dim {dim}; expected a length divisible by the group "
                         "size there (uneven shards are not supported)")
    return t.chunk(n, dim=dim)[r].contiguous()


def is_replica(t: object, dim: Optional[int]) -> bool:
    """True when this rank's full tensor is its own copy (no collective made it, so ranks'
    copies may differ): a replicated plain tensor, or a DTensor replicated on every mesh
    dim."""
    if is_dtensor(t):
        from torch.distributed.tensor import Replicate
        return all(isinstance(p, Replicate) for p in t.placements)
    return dim is None


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor's local tensor (the whole tensor); a plain tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def waited(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a functional collective's AsyncCollectiveTensor (DTensor's
    use_local_output results), whose own data pointer is null."""
    return t.trigger_wait() if hasattr(t, "trigger_wait") else t

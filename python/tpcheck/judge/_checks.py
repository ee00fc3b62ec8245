"""compare_tp's checks of its call: the same call on every rank, inputs equal bit for bit,
buffers that forward must leave alone."""

from __future__ import annotations

from typing import Any

import torch

from .._errors import InputError
from ._naming import named_tensors

__all__ = ["call_signature", "check_same_call", "same_bits", "first_difference", "buffers",
           "check_buffers_unchanged"]


def _describe(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype).replace("torch.", "")]


def call_signature(single: torch.nn.Module, sharded: torch.nn.Module,
                   inputs: dict[str, torch.Tensor], grad_output: Any,
                   options: dict[str, Any]) -> dict[str, Any]:
    """What must be the same on every rank for the ranks to make the same collectives and
    the judging rank's unsharded run to stand for every rank's."""
    return {
        "inputs": {k: _describe(t) for k, t in inputs.items()},
        "grad_output": ({k: _describe(t) for k, t in named_tensors(grad_output, "output").items()}
                        if grad_output is not None else None),
        "unsharded parameters": {k: _describe(p) + [p.requires_grad]
                                 for k, p in single.named_parameters()},
        "unsharded buffers": {k: _describe(b) for k, b in single.named_buffers()},
        # a DTensor's local shape may differ between ranks (uneven shards): its global one
        "sharded parameters": {k: _describe(p) for k, p in sharded.named_parameters()},
        **options,
    }


def check_same_call(signatures: list[dict]) -> None:
    """InputError naming the first rank whose call differs from rank 0's, and how."""
    for r, sig in enumerate(signatures[1:], start=1):
        for key, ours in signatures[0].items():
            if key == "sharded parameters" and sig.get(key) != ours:
                theirs = sig.get(key) or {}
                for k in ours:
                    if k in theirs and theirs[k] != ours[k]:
                        raise InputError(
                            f"compare_tp: rank {r}'s sharded parameter {k!r} is {theirs[k]}, "
                            f"rank 0's {ours[k]}; expected the same shape and dtype on every "
                            "rank (uneven shards are not supported)")
            if sig.get(key) != ours:
                raise InputError(f"compare_tp: rank {r} was called with {key} {sig.get(key)}, "
                                 f"rank 0 with {ours}; expected the same call on every rank "
                                 "(the same global inputs, modules and options)")


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaNs with the same payload are equal; -0.0 is not 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(_as_bytes(a), _as_bytes(b))


def first_difference(ref: torch.Tensor, t: torch.Tensor) -> str:
    """How two same-shaped tensors differ bitwise: the count and the first index."""
    size = t.element_size()
    ne = (_as_bytes(ref).reshape(-1, size) != _as_bytes(t).reshape(-1, size)).any(dim=1)
    n = int(ne.sum())
    if not n:
        return "no element differs"
    first = ne.nonzero()[0, 0].cpu()
    where = [int(i) for i in torch.unravel_index(first, t.shape)] if t.dim() else []
    return f"{n} of {t.numel()} elements differ, the first at {where}"


def buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the module's buffers, to see whether forward changed them."""
    return {k: b.detach().clone() for k, b in module.named_buffers()}


def check_buffers_unchanged(which: str, module: torch.nn.Module, before: dict) -> None:
    for k, b in module.named_buffers():
        old = before.get(k)
        if old is not None and (old.shape != b.shape or not torch.equal(old, b.detach())):
            raise InputError(
                f"compare_tp: the {which} module's buffer {k!r} changed in forward (BatchNorm-"
                "style running statistics); its runs would not be repeatable and the truth run "
                "would update it again. Put the module in eval() or use "
                "track_running_stats=False")

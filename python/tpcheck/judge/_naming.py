"""Names for the tensors in a module's inputs and outputs, shared by the module truth and
compare_tp so that both call the same tensor the same thing.

A lone tensor is called by its prefix ("output"); tensors inside tuples, lists and dicts
get ".0", ".key" per level ("output.0", "output.logits"). A call's inputs are "input"
when the call has one tensor, else "input.<position>" / "input.<keyword>" (and deeper
levels as above: "input.0.1", "input.attention_mask").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten_with_path

__all__ = ["named_tensors", "named_inputs"]


def _key_text(k: Any) -> str:
    for attr in ("idx", "key", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def named_tensors(tree: Any, prefix: str) -> dict[str, torch.Tensor]:
    """{name: tensor} for every tensor in `tree` (module docstring's names)."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    leaves, _ = tree_flatten_with_path(tree)
    return {".".join([prefix] + [_key_text(k) for k in path]): leaf
            for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


def named_inputs(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """{name: tensor} for the tensors of a call module(*args, **kwargs)."""
    named: dict[str, torch.Tensor] = {}
    for i, a in enumerate(args):
        named.update(named_tensors(a, f"input.{i}"))
    for k, v in kwargs.items():
        named.update(named_tensors(v, f"input.{k}"))
    if len(named) == 1:
        return {"input": next(iter(named.values()))}
    return named

"""Names for the tensors in a module's inputs and outputs, shared by truth and compare_tp
so that both call the same tensor the same thing.

A lone tensor is called by its prefix ("output", "input"); tensors inside tuples, lists
and dicts get ".0", ".key" per level ("output.0", "input.attention_mask").
"""

from __future__ import annotations

from typing import Any, Union

import torch
from torch.utils._pytree import tree_flatten_with_path


def _key_text(k: Any) -> str:
    for attr in ("idx", "key", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def flat_named_tensors(tree: Any, prefix: Union[str, tuple]) -> dict[str, torch.Tensor]:
    """{name: tensor} for every tensor in `tree`. prefix: a string, or for the (args,
    kwargs) pair of a call the names input_names gives."""
    if isinstance(prefix, tuple):  # (args, kwargs) with input naming
        args, kwargs = tree
        single, = prefix
        named = {}
        for i, a in enumerate(args):
            named.update(flat_named_tensors(a, f"input.{i}"))
        for k, v in kwargs.items():
            named.update(flat_named_tensors(v, f"input.{k}"))
        if single and len(named) == 1:
            return {"input": next(iter(named.values()))}
        return named
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    leaves, _ = tree_flatten_with_path(tree)
    return {".".join([prefix] + [_key_text(k) for k in path]): leaf
            for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


def input_names(args: tuple, kwargs: dict) -> tuple:
    """The naming scheme for a call's inputs: "input" when the call has one tensor input."""
    return (True,)

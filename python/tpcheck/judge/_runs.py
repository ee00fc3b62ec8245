"""What the module truth and compare_tp both do with a module call: check that its tensors
are on one device, make fresh leaf copies of its inputs, and run backward from the loss
gradient of its outputs."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch
from torch.utils._pytree import tree_map

from .._errors import InputError
from ._naming import named_inputs

__all__ = ["one_device", "leaf_inputs", "backward_from", "input_gradients"]


def one_device(who: str, args: tuple, kwargs: dict,
               module: Optional[torch.nn.Module] = None) -> torch.device:
    """The one device of a call's tensors (and the module's parameters and buffers when
    given); an InputError naming a tensor on each device if there is more than one."""
    where: dict[str, str] = {}
    if module is not None:
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            where.setdefault(str(p.device), f"parameter/buffer {name!r}")
    for name, t in named_inputs(args, kwargs).items():
        where.setdefault(str(t.device), f"input {name!r}")
    if len(where) > 1:
        subject = "the module and its inputs are" if module is not None else "the inputs are"
        desc = "; ".join(f"{what} on {dev}" for dev, what in sorted(where.items()))
        raise InputError(f"{who}: {subject} on different devices ({desc}); expected one "
                         "device: move them with .to(device)")
    return torch.device(next(iter(where))) if where else torch.device("cpu")


def leaf_inputs(args: tuple, kwargs: dict,
                prepare: Callable[[str, torch.Tensor], torch.Tensor]) -> tuple[tuple, dict]:
    """Fresh leaf copies of a call's tensor arguments: prepare(name, detached tensor) for
    each (a cast, this rank's chunk), the floating ones requiring grad (token ids and masks
    do not); arguments that are not tensors (ints, flags, None) unchanged."""
    names = {id(t): n for n, t in named_inputs(args, kwargs).items()}

    def leaf(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        y = prepare(names.get(id(x), ""), x.detach())
        return y.requires_grad_(True) if y.is_floating_point() else y
    return tree_map(leaf, args), tree_map(leaf, kwargs)


def _lone_scalar(outputs: Mapping[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """The output when the call returned one tensor of one element that requires grad."""
    if len(outputs) != 1:
        return None
    t = next(iter(outputs.values()))
    return t if t.requires_grad and t.numel() == 1 else None


def backward_from(outputs: Mapping[str, torch.Tensor],
                  grads: Optional[Mapping[str, torch.Tensor]], who: str,
                  hint: str = "") -> bool:
    """Backward from `grads` (output name → loss gradient, each cast to its output's dtype;
    outputs that need no gradient are left out) or, with grads None, from a lone scalar
    output. Returns whether backward ran. InputError for a gradient whose name is no output,
    or whose shape or device is not its output's (`hint` is appended to the shape error)."""
    if grads is None:
        scalar = _lone_scalar(outputs)
        if scalar is not None:
            scalar.backward()
        return scalar is not None
    unknown = sorted(set(grads) - set(outputs))
    if unknown:
        raise InputError(f"{who}: grad_output has {unknown}, the module's outputs are "
                         f"{sorted(outputs)}; expected a gradient for outputs of these names")
    pairs = []
    for k, g in grads.items():
        t = outputs[k]
        if not t.requires_grad:
            continue
        if tuple(g.shape) != tuple(t.shape):
            raise InputError(f"{who}: grad_output {k!r} has shape {tuple(g.shape)}, the output "
                             f"{tuple(t.shape)}{hint}")
        if g.device != t.device:
            raise InputError(f"{who}: grad_output {k!r} is on {g.device}, the output on "
                             f"{t.device}; expected both on one device")
        pairs.append((t, g.detach().to(t.dtype)))
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    return True


def input_gradients(leaf_args: tuple, leaf_kwargs: dict,
                    missing_as_zeros: bool = True) -> dict[str, torch.Tensor]:
    """The gradients of a call's leaf inputs that require grad, by input name; one that
    backward did not reach is zeros, or left out with missing_as_zeros=False."""
    return {k: (t.grad if t.grad is not None else torch.zeros_like(t))
            for k, t in named_inputs(leaf_args, leaf_kwargs).items()
            if t.requires_grad and (missing_as_zeros or t.grad is not None)}

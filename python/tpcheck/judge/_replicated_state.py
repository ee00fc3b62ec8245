"""Replicated quantizer state: what every rank of a tensor-parallel group must hold bit for
bit between steps, read from the sharded module as the user's steps left it.

TransformerEngine's delayed scaling keeps, per module, the amax history and the scale of
every FP8 tensor it quantizes (`module.fp8_meta["scaling_fwd"|"scaling_bwd"]`, objects with
`amax_history` [history length, tensors] and `scale` [tensors]). The amaxes are max-reduced
over the module's fp8_group when a step's autocast region ends (forward) and when its
backward ends, and the scales are computed from the reduced history, so after every step
each rank holds the same bits. Amaxes not reduced (`DelayedScaling(reduce_amax=False)`, or
an fp8_group other than the TP group) leave each rank scaling its replicated activations
with its own factor: the sharded error may stay within the policy's bound while the ranks
quantize differently. The check reads the state only (duck-typed: TE need not be
importable) and compares it across ranks; it never runs a quantized step.

Current scaling and block scaling keep no state between steps: nothing is found for them.
"""

from __future__ import annotations

import sys
from typing import Optional

import torch

__all__ = ["replicated_state", "reduce_amax_off", "quantized_region_open", "state_difference"]

_META_KEYS = ("scaling_fwd", "scaling_bwd")   # forward and backward tensors' state
_FIELDS = ("amax_history", "scale")


def replicated_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{"<submodule>.fp8_meta.<scaling_fwd|scaling_bwd>.<amax_history|scale>": tensor} for
    every submodule holding delayed-scaling state (empty for modules without any)."""
    found: dict[str, torch.Tensor] = {}
    for qualname, m in module.named_modules():
        meta = getattr(m, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in _META_KEYS:
            state = meta.get(key)
            for field in _FIELDS:
                t = getattr(state, field, None)
                if isinstance(t, torch.Tensor):
                    found[f"{qualname + '.' if qualname else ''}fp8_meta.{key}.{field}"] = t
    return found


def reduce_amax_off(module: torch.nn.Module) -> list[str]:
    """Submodules whose delayed-scaling recipe says not to reduce the amaxes."""
    return [q or "(the module)" for q, m in module.named_modules()
            if isinstance(getattr(m, "fp8_meta", None), dict)
            and getattr(m.fp8_meta.get("recipe"), "reduce_amax", True) is False]


def quantized_region_open() -> bool:
    """Whether TransformerEngine's FP8 autocast is on in this thread (False when TE is not
    imported)."""
    te = sys.modules.get("transformer_engine.pytorch")
    manager = getattr(te, "FP8GlobalStateManager", None) if te is not None else None
    if manager is None:
        quantization = sys.modules.get("transformer_engine.pytorch.quantization")
        manager = getattr(quantization, "FP8GlobalStateManager", None)
    return bool(manager is not None and manager.is_fp8_enabled())


def state_difference(rank0: torch.Tensor, copy: torch.Tensor) -> Optional[str]:
    """None when `copy` holds rank 0's bits, else how it differs."""
    a, b = rank0.detach().cpu(), copy.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape {tuple(b.shape)} {b.dtype}, rank 0's {tuple(a.shape)} {a.dtype}"
    differs = a.ne(b) & ~(a.isnan() & b.isnan())
    if not bool(differs.any()):
        return None
    diff = torch.where(differs, (a.double() - b.double()).abs().nan_to_num(nan=float("inf")), 0.0)
    at = int(diff.argmax())
    idx = [int(i) for i in torch.unravel_index(torch.tensor(at), diff.shape)]
    return (f"{int(differs.sum())} of {a.numel()} values differ, the largest at {idx} "
            f"({b.flatten()[at].item():.6g} against rank 0's {a.flatten()[at].item():.6g})")

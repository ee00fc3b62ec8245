"""The float64 references tpcheck ships for kernels without a float64 path, written from
the kernels' documented math: apex's fused layer and RMS norms, and flash-attn's
attention (`flash_attn_func`: FlashAttnFunc); and for TransformerEngine's Linear,
LayerNormLinear, LayerNormMLP, LayerNorm and RMSNorm, tpcheck's own layers
(_te_reference). `shipped_references(sys.modules)` lists the
(target, fn) pairs of the packages already imported (nothing is imported here).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F

from .._errors import InputError

__all__ = ["shipped_references", "apex_layer_norm", "apex_rms_norm", "flash_attention"]

_APEX = "apex.normalization.fused_layer_norm"
_FLASH = "flash_attn.flash_attn_interface"
_TE = "transformer_engine.pytorch"
# TE's modules whose float64 reference is tpcheck's own layer (_te_reference)
_TE_MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm",
               "MultiheadAttention", "TransformerLayer")


def apex_layer_norm(module: torch.nn.Module, input: torch.Tensor, *args: Any) -> torch.Tensor:
    """apex FusedLayerNorm / MixedFusedLayerNorm: layer norm over normalized_shape."""
    affine = getattr(module, "elementwise_affine", True)
    weight = module.weight if affine else None
    bias = getattr(module, "bias", None) if affine else None
    return F.layer_norm(input, tuple(module.normalized_shape), weight, bias, module.eps)


def apex_rms_norm(module: torch.nn.Module, input: torch.Tensor, *args: Any) -> torch.Tensor:
    """apex FusedRMSNorm / MixedFusedRMSNorm: x / sqrt(mean(x²) + eps) · weight over
    normalized_shape."""
    dims = tuple(range(-len(tuple(module.normalized_shape)), 0))
    y = input * torch.rsqrt(input.pow(2).mean(dims, keepdim=True) + module.eps)
    return y * module.weight if getattr(module, "elementwise_affine", True) else y


def _mask(sq: int, sk: int, causal: bool, window: tuple[int, int],
          device: torch.device) -> Optional[torch.Tensor]:
    """flash-attn's mask (True: attend), aligned to the bottom-right corner: query i sits at
    key position i + sk - sq; window (left, right), -1 unbounded; causal is right = 0."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    pos = torch.arange(sq, device=device)[:, None] + (sk - sq)
    keys = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= keys <= pos + right
    if left >= 0:
        keep &= keys >= pos - left
    return keep


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None,
                    return_softmax: bool = False) -> Any:
    """flash_attn_func's math on (batch, seqlen, heads, head_dim) tensors, grouped-query
    heads (k and v with a divisor of q's heads) repeated; no dropout (a truth of a random
    op would not be the runs' draw)."""
    if dropout_p:
        raise InputError(f"flash_attn_func with dropout_p={dropout_p}: the float64 reference has "
                         "no dropout; run the truth with dropout_p=0 (the module in eval())")
    hq, hk = q.shape[2], k.shape[2]
    if hq != hk:
        k, v = (t.repeat_interleave(hq // hk, dim=2) for t in (k, v))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    sq, sk = q.shape[1], k.shape[1]
    if alibi_slopes is not None:
        pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        dist = (pos - torch.arange(sk, device=q.device)[None, :]).abs().to(scores.dtype)
        slopes = alibi_slopes.to(scores.dtype).reshape(-1, hq, 1, 1) if alibi_slopes.dim() == 2 \
            else alibi_slopes.to(scores.dtype).reshape(1, hq, 1, 1)
        scores = scores - slopes * dist
    keep = _mask(sq, sk, causal, tuple(window_size), q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # a row with no key: zeros
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return (out, lse, None) if return_softmax else out


def _flash_function_reference(cls: type) -> Callable:
    """FlashAttnFunc.apply's arguments (forward's parameters after ctx, read by name, so
    versions that add or split parameters bind alike) to flash_attention."""
    names = list(inspect.signature(cls.forward).parameters)[1:]

    def reference(*args: Any, **kwargs: Any) -> Any:
        a = dict(zip(names, args), **kwargs)
        window = a.get("window_size",
                       (a.get("window_size_left", -1), a.get("window_size_right", -1)))
        return flash_attention(a["q"], a["k"], a["v"], a.get("dropout_p", 0.0),
                               a.get("softmax_scale"), bool(a.get("causal", False)),
                               tuple(window), float(a.get("softcap", 0.0) or 0.0),
                               a.get("alibi_slopes"),
                               bool(a.get("return_softmax", a.get("return_attn_probs", False))))
    return reference


def shipped_references(modules: Mapping[str, Any]) -> Iterator[tuple[Any, Callable]]:
    """(target, fn) for the shipped references whose package is in `modules`."""
    apex = modules.get(_APEX)
    for name, fn in (("FusedLayerNorm", apex_layer_norm), ("MixedFusedLayerNorm", apex_layer_norm),
                     ("FusedRMSNorm", apex_rms_norm), ("MixedFusedRMSNorm", apex_rms_norm)):
        cls = getattr(apex, name, None)
        if isinstance(cls, type):
            yield cls, fn
    flash = getattr(modules.get(_FLASH), "FlashAttnFunc", None)
    if isinstance(flash, type):
        yield flash, _flash_function_reference(flash)
    te = modules.get(_TE)
    if te is not None:
        from ._te_reference import te_module_reference  # it reads TE's modules duck-typed
        for name in _TE_MODULES:
            cls = getattr(te, name, None)
            if isinstance(cls, type):
                yield cls, te_module_reference

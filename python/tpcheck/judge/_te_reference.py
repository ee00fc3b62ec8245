"""The float64 reference of TransformerEngine's modules: tpcheck's own layer.

TE's kernels have no float64 path, so the module truth (tpcheck.torch.truth, compare_tp's
truth) cannot run a TE module itself. tpcheck re-implements TE's layers (docs/LAYERS.md)
in C++ with a float64 path; `te_module_reference` is the reference the truth uses in
place of a TE module's forward (shipped: _reference_kernels registers it for TE's Linear,
LayerNormLinear, LayerNormMLP, LayerNorm, RMSNorm, MultiheadAttention and TransformerLayer
once transformer_engine.pytorch is imported; `register_reference(cls, te_module_reference)`
does it for a stand-in):

- the module's configuration is read by _te_mapping.te_layer_spec (an option tpcheck's
  layer does not follow is an InputError naming the module, the option and its value);
- its parameters (float64 in the truth run) go to tpcheck's layer under the mapped names;
- `_LayerTruth`, an autograd.Function, runs the layer's forward in C++, and in backward
  the layer's forward and backward again with the incoming gradients (the C++ truth is one
  call per direction; recomputing the forward costs one more forward of a layer);
- under the truth's rounding probe the C++ layer runs under the same probe
  (make_rounding_probe_backend), at the scale the probe gives the module's nominal dtype,
  with a seed of its own per call: its noise is one rounding of every value the layer
  stores, as for any other op of the run;
- the run's K (the longest GEMM reduction, the truth policy's error model) grows by the
  layer's: its GEMMs are not torch ops, so the dispatch mode does not see them.

The norms, the linears and the MLP treat every token alike: their input is flattened to
[tokens, hidden] and the results shaped back. The attention and the transformer layer
take the whole [s, b, hidden] input (TE's sbhd).
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .. import _tpcheck
from .._errors import InputError
from ._compiled import input_errors
from ._te_mapping import te_layer_spec
from ._verdict import as_dlpack

__all__ = ["te_module_reference", "te_gather_strides"]

# TE 2.20's forward arguments after the input, by class, in order (positional ones are
# read by this order).
_FORWARD_ARGS = {
    "Linear": ("is_first_microbatch", "fp8_output", "fp8_grad"),
    "LayerNormLinear": ("is_first_microbatch", "fp8_output", "fp8_grad"),
    "LayerNormMLP": ("is_first_microbatch",),
    "LayerNorm": (), "RMSNorm": (),
    "MultiheadAttention": (
        "attention_mask", "encoder_output", "attn_mask_type", "window_size",
        "bottom_right_diagonal", "is_first_microbatch", "checkpoint_core_attention",
        "inference_params", "rotary_pos_emb", "core_attention_bias_type",
        "core_attention_bias", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_kv",
        "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv",
        "fast_zero_fill", "pad_between_seqs", "thd_attention_policies",
        "thd_attention_policy_dispatch", "softcap"),
    "TransformerLayer": (
        "attention_mask", "self_attn_mask_type", "window_size", "bottom_right_diagonal",
        "encoder_output", "enc_dec_attn_mask", "enc_dec_attn_mask_type", "enc_dec_window_size",
        "enc_dec_bottom_right_diagonal", "is_first_microbatch", "checkpoint_core_attention",
        "inference_params", "rotary_pos_emb", "core_attention_bias_type", "core_attention_bias",
        "alibi_slopes", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded",
        "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv", "fast_zero_fill",
        "pad_between_seqs", "thd_attention_policies", "thd_attention_policy_dispatch", "softcap"),
}
# Arguments whose value does not change the function (weight caching across microbatches,
# recomputation, a diagonal that only matters when queries and keys differ in length).
_ANY_VALUE = {"is_first_microbatch", "checkpoint_core_attention", "bottom_right_diagonal",
              "enc_dec_bottom_right_diagonal", "fast_zero_fill", "thd_attention_policy_dispatch"}
# Layers that treat every token alike: their input is flattened to [tokens, hidden].
_TOKEN_WISE = {"Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm"}


def _check_forward_args(te_class: str, module: Any, args: tuple, kwargs: dict) -> None:
    """Every forward argument beside the input is one whose value the layer follows;
    anything else is an InputError naming it."""
    names = _FORWARD_ARGS[te_class]
    if len(args) > len(names):
        raise InputError(f"{te_class}: {len(args)} positional arguments after the input; "
                         f"TE's forward takes {list(names)}")
    given = dict(zip(names, args))
    given.update(kwargs)
    for name, value in given.items():
        if name not in names:
            raise InputError(f"{te_class}: forward argument {name!r} is not one of TE 2.20's "
                             f"({list(names)})")
        if name in _ANY_VALUE:
            continue
        if name in ("fp8_output", "fp8_grad"):
            ok = not value
        elif name in ("attn_mask_type", "self_attn_mask_type"):
            ok = value in (None, getattr(module, name, None))
        elif name == "window_size":
            own = getattr(module, "window_size", None)
            ok = value is None or (own is not None and tuple(value) == tuple(own))
        elif name == "core_attention_bias_type":
            ok = value == "no_bias"
        else:
            ok = value is None
        if not ok:
            raise InputError(f"{te_class}: forward argument {name}={value!r} is not followed "
                             "by tpcheck's float64 reference (its layer computes the module's "
                             "configured function: no FP8 outputs, masks, biases, rotary "
                             "embeddings or packed sequences passed at call time)")

# The C++ probe's seed per call. Both probes draw position k of a stream as
# splitmix64(seed + 0x9E3779B97F4A7C15·k), so a seed that differs from the run's by a
# multiple of that constant would replay the Python probe's own positions; the run's seed
# XOR another odd constant times the call's number lands elsewhere (an overlap needs the
# difference to be one of the few multiples a run uses, of 2^64).
_SEED_MIX = 0xD1B54A32D192ED03


def _truth_mode() -> Any:
    """The truth run's dispatch mode (_dispatch.F64TruthMode), or None outside a truth run."""
    from ._dispatch import F64TruthMode
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, F64TruthMode):
            return mode
    return None


class _Call:
    """One reference call: the layer, its options, and the probe it runs under."""

    def __init__(self, kind: str, options: dict, names: list, returned: list,
                 probe_u: float, probe_seed: int):
        self.kind = kind
        self.options_json = json.dumps(options)
        self.names = names          # tpcheck parameter names, in the order of the params
        self.returned = returned    # the layer's results in TE's order
        self.probe_u = probe_u
        self.probe_seed = probe_seed

    def run(self, x: torch.Tensor, params: tuple, grads: Optional[dict]) -> dict:
        device = "cuda" if x.is_cuda else "cpu"
        prepared = {n: as_dlpack(p.detach(), n) for n, p in zip(self.names, params)}
        g = {k: as_dlpack(v.detach().contiguous(), k) for k, v in (grads or {}).items()}
        with input_errors():
            return _tpcheck.run_layer(self.kind, self.options_json, prepared,
                                      as_dlpack(x.detach().contiguous(), "input"), g, device,
                                      probe_u=self.probe_u, probe_seed=self.probe_seed)


def _tensor(a: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(a).to(device=like.device, dtype=torch.float64)


class _LayerTruth(torch.autograd.Function):
    """tpcheck's layer in float64 as one autograd node: inputs x and the parameters."""

    @staticmethod
    def forward(ctx: Any, call: _Call, x: torch.Tensor, *params: torch.Tensor) -> tuple:
        ctx.call = call
        ctx.save_for_backward(x, *params)
        out = call.run(x, params, None)["outputs"]
        return tuple(_tensor(out[name], x) for name in call.returned)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> tuple:
        x, *params = ctx.saved_tensors
        call: _Call = ctx.call
        # autograd gives every result a gradient (zeros for one not in the loss)
        raw = call.run(x, tuple(params), dict(zip(call.returned, grads)))
        grad_x = _tensor(raw["grad_input"], x)
        return (None, grad_x, *(_tensor(raw["grads"][n], x) for n in call.names))


def _returned(options: dict) -> list:
    """The tpcheck layer's results in the order TE's module returns them."""
    names = ["output"]
    if options.get("return_bias"):
        names.append("bias")
    if options.get("return_layernorm_output"):
        names.append("layernorm_output")
    return names


def _layer_k(params: dict, tokens: int, seq: int) -> int:
    """The layer's longest GEMM reduction: a weight's dims (forward and input gradient),
    the tokens (weight gradient), and for attention the sequence (the context product; the
    scores' head dim is below the weights'); 0 for the norms (no GEMM)."""
    weights = [p for n, p in params.items() if n.endswith("weight") and p.dim() == 2]
    if not weights:
        return 0
    return max([tokens, seq] + [d for w in weights for d in w.shape])


def te_module_reference(module: torch.nn.Module, inp: torch.Tensor, *args: Any,
                        **kwargs: Any) -> Any:
    """The float64 value of TE `module(inp, ...)` computed by tpcheck's layer (module
    docstring); returns what TE's forward returns (a tensor, or a tuple with the bias and
    the norm's output when the module returns them)."""
    spec = te_layer_spec(module)
    _check_forward_args(spec.te_class, module, args, kwargs)
    if not isinstance(inp, torch.Tensor) or inp.dim() < 2:
        raise InputError(f"{spec.te_class}: the input is a "
                         f"{type(inp).__name__ if not isinstance(inp, torch.Tensor) else f'{inp.dim()}-D tensor'}; "
                         "expected a tensor [..., hidden]")
    te_params = dict(module.named_parameters())
    by_name = spec.to_tpcheck(te_params)
    names = list(by_name)
    token_wise = spec.te_class in _TOKEN_WISE
    x = inp.reshape(-1, inp.shape[-1]) if token_wise else inp
    if not token_wise and inp.dim() != 3:
        raise InputError(f"{spec.te_class}: the input has shape {tuple(inp.shape)}; expected "
                         "[s, b, hidden] (qkv_format sbhd)")
    mode = _truth_mode()
    probe_u, probe_seed = 0.0, 0
    if mode is not None:
        tokens = x.shape[0] if token_wise else x.shape[0] * x.shape[1]
        mode.reduction_length = max(mode.reduction_length,
                                    _layer_k(te_params, tokens, x.shape[0]))
        if mode.probe_u is not None:
            nominal = mode.nominal.of(inp) if mode.nominal is not None else None
            scale = mode.nominal.scale(nominal) if nominal is not None else 1.0
            probe_u = mode.probe_u * scale
            mode.counter += 1  # a number of its own for this call
            probe_seed = (mode.probe_seed ^ (_SEED_MIX * mode.counter)) % (1 << 64)
    call = _Call(spec.kind, spec.options, names, _returned(spec.options), probe_u, probe_seed)
    outs = _LayerTruth.apply(call, x, *(by_name[n] for n in names))
    shaped = []
    for name, t in zip(call.returned, outs):
        if name == "bias" or not token_wise:
            shaped.append(t)
        else:
            shaped.append(t.reshape(*inp.shape[:-1], t.shape[-1]))
        if mode is not None and mode.nominal is not None:
            mode.nominal.tag(shaped[-1], mode.nominal.of(inp))
    return shaped[0] if len(shaped) == 1 else tuple(shaped)


def _is_te(module: torch.nn.Module, name: str) -> bool:
    return any(c.__name__ == name and (c.__module__ or "").startswith("transformer_engine.pytorch")
               for c in type(module).__mro__)


def te_gather_strides(root: torch.nn.Module) -> dict[str, int]:
    """{qualified parameter name: gather stride} where a TE module's layout needs one that
    its parameters' partition_stride (1) does not say: gated LayerNormMLP's fc1, whose
    rank r holds pieces r and N + r of [a; b] (TeLayerSpec.shard_strides). A sharded
    layout no stride gathers is an InputError: MultiheadAttention's fused QKV weight not
    interleaved (rank r holds [Q_r; K_r; V_r], pieces of unequal blocks)."""
    out: dict[str, int] = {}
    for prefix, m in root.named_modules():
        if _is_te(m, "MultiheadAttention") and int(getattr(m, "tp_size", 1) or 1) > 1:
            o = te_layer_spec(m).options
            if o["fuse_qkv_params"] and not o["qkv_weight_interleaved"]:
                raise InputError(f"compare_tp: {prefix or 'the module'} (MultiheadAttention) "
                                 "has fuse_qkv_params=True with qkv_weight_interleaved=False at "
                                 f"tp_size {m.tp_size}: each rank holds [Q_r; K_r; V_r], which "
                                 "no strided gather puts back together; use interleaved or "
                                 "separate QKV weights")
        if _is_te(m, "LayerNormMLP"):
            for name, stride in te_layer_spec(m).shard_strides.items():
                out[f"{prefix}.{name}" if prefix else name] = stride
    return out

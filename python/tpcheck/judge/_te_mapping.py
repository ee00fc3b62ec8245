"""From a TransformerEngine module to tpcheck's own layer.

tpcheck re-implements TransformerEngine's layers (docs/LAYERS.md) and computes their
float64 truth (tpcheck.layer_truth). This module reads a TE module's configuration and
says which of tpcheck's layers computes the same function, with which options and
parameter names:

    spec = te_layer_spec(te_module)          # TeLayerSpec
    truth = tpcheck.layer_truth(spec.kind, spec.options,
                                spec.to_tpcheck(full_state_dict), x, grad_output=dy)
    te_shard_dims(te_module)                 # {"weight": 0, "bias": 0, ...}

The module is read duck-typed, by TransformerEngine's attribute names (in_features,
parallel_mode, tp_size, ...); the class by its name and module path. Nothing here imports
TransformerEngine or torch, so the mapping runs (and is tested) where TE cannot be
installed. A TE option that changes the computed function and that tpcheck's layer does
not follow raises tpcheck.InputError naming the module's class, the option and its value:
a wrong truth is never returned in silence.

Mapped: Linear, LayerNormLinear, LayerNormMLP, LayerNorm, RMSNorm, MultiheadAttention
(self-attention) and TransformerLayer (encoder) of transformer_engine.pytorch. Never:
GroupedLinear (MoE; tpcheck has no such layer), the fusible ops (transformer_engine.pytorch.ops)
and other frameworks' modules.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .._errors import InputError

__all__ = ["TeLayerSpec", "te_layer_spec", "te_shard_dims", "check_te_version",
           "TE_CHECKED_VERSION"]

# The TransformerEngine release whose sources the attribute and parameter names below were
# read from (transformer_engine/pytorch/module/*.py, ops/basic/{layer_norm,rmsnorm}.py,
# distributed.py's set_tensor_model_parallel_attributes).
TE_CHECKED_VERSION = "2.20.2"

# Classes this mapping reads, by name, and tpcheck's layer for each.
_KINDS = {
    "Linear": "Linear",
    "LayerNormLinear": "LayerNormLinear",
    "LayerNormMLP": "LayerNormMLP",
    "LayerNorm": "LayerNorm",
    "RMSNorm": "RMSNorm",
    "MultiheadAttention": "MultiheadAttention",
    "TransformerLayer": "TransformerLayer",
}
_NOT_YET = {
    "GroupedLinear": "MoE grouped GEMMs; tpcheck has no grouped layer",
    "DotProductAttention": "tpcheck has no stand-alone attention core layer",
}

# The activations tpcheck's LayerNormMLP computes (docs/LAYERS.md); TE 2.20 offers more
# (glu, reglu, sreglu, qgeglu, silu, clamped_swiglu), which are refused.
_TPCHECK_ACTIVATIONS = ("gelu", "relu", "srelu", "qgelu", "geglu", "swiglu")
_GATED = ("geglu", "swiglu")

# Userbuffers communication-GEMM overlap flags as TE stores them after construction
# (Linear/LayerNormLinear keep the per-GEMM ones, LayerNormMLP the constructor's). The
# overlapped GEMMs split and reorder the products and reductions in ways tpcheck's layers
# do not model, so they are refused with a clear error rather than given a wrong truth.
_UB_FLAGS = ("ub_overlap_ag_fprop", "ub_overlap_rs_fprop", "ub_overlap_ag_dgrad",
             "ub_overlap_rs_dgrad", "ub_bulk_dgrad", "ub_bulk_wgrad",
             "ub_overlap_ag", "ub_overlap_rs")


@dataclass(frozen=True)
class TeLayerSpec:
    """What te_layer_spec read from one TransformerEngine module.

    te_class: the TE class's name. kind: tpcheck's layer ("Linear", ...). options: tpcheck's
    options for the unsharded layer (full sizes; JSON keys of docs/LAYERS.md), accepted by
    tpcheck.layer_parameters / layer_truth. te_to_tpcheck / tpcheck_to_te: parameter names
    both ways (only parameters that exist: no bias entries without bias). tp_size: TE's
    tp_size (None for the norms, which have none). parallel_mode: None (unsharded),
    "column", "row", or "column+row" for LayerNormMLP (fc1 column, fc2 row).
    sequence_parallel: as TE resolved it (only with tp_size > 1). shard_strides: the
    partition stride the gather must use where it differs from 1 (LayerNormMLP's gated fc1:
    each rank holds [a_r; b_r], i.e. pieces r and N + r of [a; b], while TE marks the
    parameter with stride 1).
    """
    te_class: str
    kind: str
    options: dict
    te_to_tpcheck: dict
    tpcheck_to_te: dict
    tp_size: Optional[int]
    parallel_mode: Optional[str]
    sequence_parallel: bool
    shard_strides: dict = field(default_factory=dict)

    def to_tpcheck(self, params: Mapping[str, Any]) -> dict:
        """A TE state dict (full tensors) under tpcheck's names; TE's "_extra_state"
        (FP8 metadata) is dropped; any other unknown name is an InputError."""
        out = {}
        for name, value in params.items():
            if str(name).endswith("_extra_state"):
                continue
            if name not in self.te_to_tpcheck:
                raise InputError(f"{self.te_class}: parameter {name!r} is not one of the "
                                 f"mapped layer's ({sorted(self.te_to_tpcheck)})")
            out[self.te_to_tpcheck[name]] = value
        return out

    def to_te(self, tensors: Mapping[str, Any]) -> dict:
        """tpcheck names (e.g. LayerTruth.grads) back to TE's; other names (outputs,
        "input") pass unchanged."""
        return {self.tpcheck_to_te.get(k, k): v for k, v in tensors.items()}


def check_te_version(version: Optional[str]) -> None:
    """Warn (UserWarning, naming both versions) when `version` is not the TransformerEngine
    version this mapping was checked against (TE_CHECKED_VERSION). "Checked" means: the
    attribute names, parameter names, sharding attributes and refused options were read
    from that release's Python sources; the mapping has not been run against TE modules on
    a GPU. None (version unknown) warns too."""
    if version is None or str(version) != TE_CHECKED_VERSION:
        warnings.warn(f"TransformerEngine {version if version is not None else '(unknown version)'}: "
                      f"tpcheck's mapping of TE modules was checked against TE "
                      f"{TE_CHECKED_VERSION} (its sources); other versions may name or mean "
                      "options differently", UserWarning, stacklevel=2)


def _te_class(module: Any) -> str:
    """The TE class name of `module`, or an InputError. A subclass of a TE class is read as
    that class (its attributes are TE's), with a warning: a changed forward is not seen."""
    for cls in type(module).__mro__:
        mod = getattr(cls, "__module__", "") or ""
        if not mod.startswith("transformer_engine"):
            continue
        name = cls.__name__
        if not mod.startswith("transformer_engine.pytorch") or mod.startswith(
                "transformer_engine.pytorch.ops"):
            raise InputError(f"{name} ({mod}): only transformer_engine.pytorch's modules are "
                             "mapped to tpcheck's layers, not the fusible ops or other frameworks'")
        if name in _NOT_YET:
            raise InputError(f"{name}: this TransformerEngine module is not mapped to a tpcheck "
                             f"layer: {_NOT_YET[name]}")
        if name not in _KINDS:
            raise InputError(f"{name} ({mod}): no tpcheck layer for this TransformerEngine "
                             f"module; mapped: {', '.join(_KINDS)}")
        if cls is not type(module):
            warnings.warn(f"{type(module).__name__} subclasses TransformerEngine's {name}: it is "
                          f"mapped as {name}; an overridden forward is not seen", UserWarning,
                          stacklevel=3)
        return name
    raise InputError(f"{type(module).__name__} ({type(module).__module__}) is not a "
                     "TransformerEngine module (its class is not from transformer_engine)")


def _refuse(te_class: str, option: str, value: Any, why: str) -> InputError:
    return InputError(f"{te_class}: option {option}={value!r} is not followed by tpcheck's "
                      f"layer ({why}); its float64 truth would be wrong")


def _shape(t: Any) -> Optional[tuple]:
    shape = getattr(t, "shape", None)
    return None if shape is None else tuple(int(s) for s in shape)


def _delay_wgrad(m: Any) -> bool:
    # TE keeps delay_wgrad_compute in its WeightGradStore (a method), not as a flag.
    store = getattr(m, "wgrad_store", None)
    if store is not None and hasattr(store, "delay_wgrad_compute"):
        return bool(store.delay_wgrad_compute())
    return bool(getattr(m, "delay_wgrad_compute", False))


def _common_refusals(te_class: str, m: Any, split_ok: bool = False) -> None:
    """Options every TE GEMM module has that change what the module computes (or from what)
    in ways tpcheck's layers do not follow (split_ok: MultiheadAttention's QKV projection,
    whose query/key/value split tpcheck's attention layer follows)."""
    for flag in _UB_FLAGS:
        value = getattr(m, flag, False)
        if value:
            raise _refuse(te_class, flag, value, "userbuffers communication-GEMM overlap")
    sym = getattr(m, "symmetric_ar_type", None)
    if sym is not None:
        raise _refuse(te_class, "symmetric_ar_type", sym,
                      "all-reduce through symmetric memory (multimem), not modelled")
    if getattr(m, "primary_weights_in_fp8", False):
        raise _refuse(te_class, "primary_weights_in_fp8 (fp8_model_init)", True,
                      "the weights are held only in FP8, so there are no high-precision "
                      "weights for the truth; FP8 weight caching is not modelled")
    names = getattr(m, "weight_names", None)
    if names is not None and list(names) != ["weight"] and not split_ok:
        raise _refuse(te_class, "parameters_split", list(names),
                      "split weights are parent-internal in tpcheck, not an option")
    # Options that do not change the function, ignored on purpose: init_method /
    # output_layer_init_method (the truth takes the parameters as given), params_dtype and
    # device (the truth is one float64 run), get_rng_state_tracker / rng_tracker_name / name
    # / ub_name (bookkeeping), tp_group (read as tp_size), seq_length / micro_batch_size
    # (userbuffers buffer sizes), TE's fusion switches (bias_gelu_nvfusion,
    # gemm_gelu_fusion: same function, other rounding points), sm margins.


def _tp(m: Any) -> int:
    tp = int(getattr(m, "tp_size", 1) or 1)
    if tp < 1:
        raise InputError(f"{type(m).__name__}: tp_size={tp} is not a positive size")
    return tp


def _norm_options(te_class: str, m: Any) -> dict:
    normalization = getattr(m, "normalization", "LayerNorm")
    if normalization not in ("LayerNorm", "RMSNorm"):
        raise _refuse(te_class, "normalization", normalization,
                      "tpcheck has LayerNorm and RMSNorm")
    return {"normalization": normalization, "eps": float(m.eps),
            "zero_centered_gamma": bool(getattr(m, "zero_centered_gamma", False))}


def _ln_output_gathered(te_class: str, m: Any, sp: bool) -> None:
    gathered = bool(getattr(m, "return_layernorm_output_gathered", False))
    if gathered and sp and getattr(m, "return_layernorm_output", False):
        # tpcheck returns the local token slice under SP; TE would return the gathered one.
        raise _refuse(te_class, "return_layernorm_output_gathered", True,
                      "tpcheck returns the layernorm output as the local sequence slice")
    # Without SP the gathered output is the output: nothing to map.


def _identity(names: list) -> tuple[dict, dict]:
    # TE 2.20 and tpcheck's layers use the same state-dict names for these modules.
    forward = {n: n for n in names}
    return forward, dict(forward)


def _linear_like(te_class: str, m: Any, with_norm: bool) -> tuple[dict, list, Optional[str], int, bool]:
    _common_refusals(te_class, m)
    tp = _tp(m)
    mode = getattr(m, "parallel_mode", None)
    if mode not in (None, "column", "row"):
        raise _refuse(te_class, "parallel_mode", mode, "tpcheck has none, column and row")
    if with_norm and mode == "row":
        raise _refuse(te_class, "parallel_mode", mode,
                      "the norm cannot be row parallel (TE refuses it too)")
    # TE divides the sharded dimension by tp_size at construction.
    in_f, out_f = int(m.in_features), int(m.out_features)
    local = (out_f, in_f)
    if mode == "column":
        out_f *= tp
    elif mode == "row":
        in_f *= tp
    w = _shape(getattr(m, "weight", None))
    if w is not None and w != local:
        raise InputError(f"{te_class}: weight has shape {w}, but in_features={m.in_features}, "
                         f"out_features={m.out_features} (local sizes) say {local}")
    sp = bool(getattr(m, "sequence_parallel", False)) and tp > 1
    use_bias = bool(getattr(m, "use_bias", True))
    opts: dict = {"in_features": in_f, "out_features": out_f, "bias": use_bias,
                  # return_bias changes what is returned (the bias unadded): tpcheck follows it.
                  "return_bias": bool(getattr(m, "return_bias", False)),
                  "sequence_parallel": sp,
                  # Gradients into main_grad: where they land, not their values; followed.
                  "fuse_wgrad_accumulation": bool(getattr(m, "fuse_wgrad_accumulation", False)),
                  "delay_wgrad_compute": _delay_wgrad(m)}
    if mode is not None:
        opts["parallel_mode"] = mode
    names = []
    if with_norm:
        opts.update(_norm_options(te_class, m))
        opts["return_layernorm_output"] = bool(getattr(m, "return_layernorm_output", False))
        _ln_output_gathered(te_class, m, sp)
        names += ["layer_norm_weight"] + (["layer_norm_bias"]
                                          if opts["normalization"] == "LayerNorm" else [])
    elif getattr(m, "save_original_input", False):
        # Same numbers, less memory (docs/LAYERS.md): followed.
        opts["save_original_input"] = True
    names += ["weight"] + (["bias"] if use_bias else [])
    return opts, names, mode, tp, sp


def _mlp(te_class: str, m: Any) -> tuple[dict, list, Optional[str], int, bool, dict]:
    _common_refusals(te_class, m)
    tp = _tp(m)
    set_mode = bool(getattr(m, "set_parallel_mode", False))
    if tp > 1 and not set_mode:
        # TE shards the weights by tp_size but runs no collective: each rank's output is a
        # partial sum, which is not the layer's function.
        raise _refuse(te_class, "set_parallel_mode", False,
                      f"with tp_size={tp} TE shards the weights but does not reduce the output")
    activation = getattr(m, "activation", "gelu")
    if activation not in _TPCHECK_ACTIVATIONS:
        raise _refuse(te_class, "activation", activation,
                      f"tpcheck has {' | '.join(_TPCHECK_ACTIVATIONS)}")
    params = getattr(m, "activation_params", None)
    if params:
        raise _refuse(te_class, "activation_params", params, "tpcheck's activations have no parameters")
    hidden_shape = _shape(getattr(m, "layer_norm_weight", None))
    if hidden_shape is None or len(hidden_shape) != 1:
        raise InputError(f"{te_class}: cannot read hidden_size: layer_norm_weight has shape "
                         f"{hidden_shape} (expected one dimension)")
    hidden = hidden_shape[0]
    ffn = int(m.size_per_partition) * tp
    sp = bool(getattr(m, "sequence_parallel", False)) and tp > 1
    use_bias = bool(getattr(m, "use_bias", True))
    opts = {"hidden_size": hidden, "ffn_hidden_size": ffn, "activation": activation,
            "bias": use_bias, "return_bias": bool(getattr(m, "return_bias", False)),
            "return_layernorm_output": bool(getattr(m, "return_layernorm_output", False)),
            "sequence_parallel": sp,
            # Recompute in backward: same numbers (docs/LAYERS.md); followed.
            "checkpoint": bool(getattr(m, "checkpoint", False)),
            "fuse_wgrad_accumulation": bool(getattr(m, "fuse_wgrad_accumulation", False)),
            "delay_wgrad_compute": _delay_wgrad(m)}
    opts.update(_norm_options(te_class, m))
    _ln_output_gathered(te_class, m, sp)
    names = ["layer_norm_weight"] + (["layer_norm_bias"] if opts["normalization"] == "LayerNorm" else [])
    names += ["fc1_weight"] + (["fc1_bias"] if use_bias else [])
    names += ["fc2_weight"] + (["fc2_bias"] if use_bias else [])
    strides = {}
    if tp > 1 and activation in _GATED:
        strides = {"fc1_weight": 2, **({"fc1_bias": 2} if use_bias else {})}
    mode = "column+row" if tp > 1 else None
    return opts, names, mode, tp, sp, strides


def _mha(te_class: str, m: Any) -> tuple[dict, list, Optional[str], int, bool]:
    """TE 2.20's MultiheadAttention (self-attention, sbhd): its QKV projection (`qkv`, or
    `layernorm_qkv` with input_layernorm), the core attention and `proj`."""
    if getattr(m, "attention_type", "self") != "self":
        raise _refuse(te_class, "attention_type", m.attention_type, "tpcheck has self-attention")
    for name, default, why in (
            ("qkv_format", "sbhd", "tpcheck's attention takes [s, b, hidden]"),
            ("softmax_type", "vanilla", "tpcheck's softmax is the plain one"),
            ("softcap", 0.0, "no logit soft-capping in tpcheck's attention")):
        value = getattr(m, name, default)
        if value != default:
            raise _refuse(te_class, name, value, why)
    if getattr(m, "q_norm", None) is not None or getattr(m, "k_norm", None) is not None:
        raise _refuse(te_class, "qk_norm_type", "set", "no query/key norm in tpcheck's attention")
    cp_size = int(getattr(m, "cp_size", 1) or 1)
    if cp_size > 1:  # set_context_parallel_group: each rank holds a slice of the sequence
        raise _refuse(te_class, "context parallel (set_context_parallel_group), cp_size", cp_size,
                      "tpcheck's attention sees the whole sequence on every rank")
    mask = getattr(m, "attn_mask_type", "causal")
    if mask not in ("causal", "no_mask"):
        raise _refuse(te_class, "attn_mask_type", mask, "tpcheck has causal and no_mask")
    core = getattr(m, "core_attention", None)
    dropout = float(getattr(core, "attention_dropout", 0.0) or 0.0)
    if dropout > 0 and getattr(m, "training", False):
        raise _refuse(te_class, "attention_dropout", dropout,
                      "random dropout in training mode (eval() or 0 gives the function)")
    heads = int(m.num_attention_heads)
    groups = int(getattr(m, "num_gqa_groups", heads) or heads)
    proj = m.proj
    hidden = int(proj.out_features)
    d = int(getattr(m, "hidden_size_per_attention_head", hidden // heads))
    if d * heads != hidden:
        raise _refuse(te_class, "kv_channels", d, f"tpcheck's head dim is hidden_size / "
                      f"num_attention_heads = {hidden // heads}")
    ln = bool(getattr(m, "input_layernorm", False))
    prefix = "layernorm_qkv" if ln else "qkv"
    qkv = getattr(m, prefix, None)
    if qkv is None:
        raise InputError(f"{te_class}: no {prefix} submodule (input_layernorm={ln})")
    _common_refusals(te_class, qkv, split_ok=True)
    _common_refusals(te_class, proj)
    tp = _tp(m)
    mode = getattr(qkv, "parallel_mode", None)
    if tp > 1 and mode != "column":
        raise _refuse(te_class, "set_parallel_mode", False,
                      f"with tp_size={tp} TE shards the heads but does not reduce the output")
    fused = _shape(getattr(qkv, "weight", None)) is not None
    bias = bool(getattr(qkv, "use_bias", True))
    sp = bool(getattr(m, "sequence_parallel", False)) and tp > 1
    opts = {"hidden_size": hidden, "num_attention_heads": heads, "num_gqa_groups": groups,
            "attn_mask_type": mask, "input_layernorm": ln, "bias": bias,
            "return_bias": bool(getattr(m, "return_bias", False)),
            "return_layernorm_output": ln and bool(getattr(m, "return_layernorm_output", False)),
            "fuse_qkv_params": fused,
            "qkv_weight_interleaved": fused and bool(getattr(m, "qkv_weight_interleaved", True)),
            "sequence_parallel": sp,
            "fuse_wgrad_accumulation": bool(getattr(qkv, "fuse_wgrad_accumulation", False))}
    window = getattr(m, "window_size", None)
    if window is not None:
        opts["window_size"] = [int(w) for w in window]
    names = []
    if ln:
        norm = _norm_options(te_class, qkv)
        opts.update({"normalization": norm["normalization"], "layernorm_epsilon": norm["eps"],
                     "zero_centered_gamma": norm["zero_centered_gamma"]})
        names += [f"{prefix}.layer_norm_weight"] + (
            [f"{prefix}.layer_norm_bias"] if norm["normalization"] == "LayerNorm" else [])
    parts = ["weight"] if fused else ["query_weight", "key_weight", "value_weight"]
    if bias:
        parts += ["bias"] if fused else ["query_bias", "key_bias", "value_bias"]
    names += [f"{prefix}.{p}" for p in parts]
    names += ["proj.weight"] + (["proj.bias"] if bool(getattr(proj, "use_bias", True)) else [])
    return opts, names, ("column+row" if tp > 1 else None), tp, sp


def _transformer_layer(te_class: str, m: Any) -> tuple[dict, list, Optional[str], int, bool, dict]:
    """TE 2.20's TransformerLayer (encoder): its `self_attention` (MultiheadAttention),
    `layernorm_mlp` (LayerNormMLP) and, with output_layernorm, `layernorm`."""
    if getattr(m, "layer_type", "encoder") != "encoder":
        raise _refuse(te_class, "layer_type", m.layer_type,
                      "tpcheck's layer has no cross-attention (decoder)")
    for name, default, why in (("attn_input_format", "sbhd", "tpcheck's layer takes [s, b, hidden]"),
                               ("softmax_type", "vanilla", "tpcheck's softmax is the plain one")):
        value = getattr(m, name, default)
        if value != default:
            raise _refuse(te_class, name, value, why)
    training = bool(getattr(m, "training", False))
    hidden_dropout = float(getattr(m, "hidden_dropout", 0.0) or 0.0)
    if hidden_dropout > 0 and training:
        raise _refuse(te_class, "hidden_dropout", hidden_dropout,
                      "random dropout in training mode (eval() or 0 gives the function)")
    if getattr(m, "drop_path", None) is not None and training:
        raise _refuse(te_class, "drop_path_rate", getattr(m.drop_path, "drop_prob", "> 0"),
                      "random stochastic depth in training mode")
    attn, attn_names, _, tp, sp = _mha("MultiheadAttention", m.self_attention)
    mlp, mlp_names, _, _, _, mlp_strides = _mlp("LayerNormMLP", m.layernorm_mlp)
    output_ln = bool(getattr(m, "output_layernorm", False))
    opts = {"hidden_size": attn["hidden_size"], "ffn_hidden_size": mlp["ffn_hidden_size"],
            "num_attention_heads": attn["num_attention_heads"],
            "num_gqa_groups": attn["num_gqa_groups"], "self_attn_mask_type": attn["attn_mask_type"],
            "apply_residual_connection_post_layernorm":
                bool(getattr(m, "apply_residual_connection_post_layernorm", False)),
            "output_layernorm": output_ln,
            "parallel_attention_mlp": bool(getattr(m, "parallel_attention_mlp", False)),
            "normalization": mlp["normalization"], "zero_centered_gamma": mlp["zero_centered_gamma"],
            "layernorm_epsilon": mlp["eps"], "fuse_qkv_params": attn["fuse_qkv_params"],
            "qkv_weight_interleaved": attn["qkv_weight_interleaved"], "bias": attn["bias"],
            "activation": mlp["activation"], "sequence_parallel": sp,
            "fuse_wgrad_accumulation": attn["fuse_wgrad_accumulation"]}
    if "window_size" in attn:
        opts["window_size"] = attn["window_size"]
    names = [f"self_attention.{n}" for n in attn_names] + [f"layernorm_mlp.{n}" for n in mlp_names]
    if output_ln:
        names += ["layernorm.weight"] + (["layernorm.bias"] if mlp["normalization"] == "LayerNorm" else [])
    strides = {f"layernorm_mlp.{k}": v for k, v in mlp_strides.items()}
    return opts, names, ("column+row" if tp > 1 else None), tp, sp, strides


def _norm(te_class: str, m: Any) -> tuple[dict, list, bool]:
    shape = _shape(getattr(m, "weight", None))
    if shape is None or len(shape) != 1:
        raise _refuse(te_class, "normalized_shape", shape,
                      "tpcheck normalizes over the last dimension only")
    # The norms' sequence_parallel is a legacy flag (None: unset), only marking the
    # parameters for Megatron's gradient all-reduce.
    sp = bool(getattr(m, "sequence_parallel", None) or False)
    opts = {"normalized_shape": shape[0], "eps": float(m.eps),
            "zero_centered_gamma": bool(getattr(m, "zero_centered_gamma", False)),
            "sequence_parallel": sp}
    names = ["weight"] + (["bias"] if te_class == "LayerNorm" else [])
    return opts, names, sp


def _installed_te_version() -> Optional[str]:
    # Only when TE is already imported: this module never imports it.
    te = sys.modules.get("transformer_engine")
    return None if te is None else getattr(te, "__version__", None)


def te_layer_spec(module: Any, *, te_version: Optional[str] = None) -> TeLayerSpec:
    """The tpcheck layer that computes what TransformerEngine `module` computes (see
    TeLayerSpec). te_version: the TE version to check (check_te_version); by default the
    imported transformer_engine's, and no check when TE is not imported (stand-ins)."""
    te_class = _te_class(module)
    version = te_version if te_version is not None else _installed_te_version()
    if version is not None:
        check_te_version(version)
    strides: dict = {}
    if te_class in ("Linear", "LayerNormLinear"):
        opts, names, mode, tp, sp = _linear_like(te_class, module, te_class == "LayerNormLinear")
    elif te_class == "LayerNormMLP":
        opts, names, mode, tp, sp, strides = _mlp(te_class, module)
    elif te_class == "MultiheadAttention":
        opts, names, mode, tp, sp = _mha(te_class, module)
    elif te_class == "TransformerLayer":
        opts, names, mode, tp, sp, strides = _transformer_layer(te_class, module)
    else:
        opts, names, sp = _norm(te_class, module)
        mode, tp = None, None
    forward, backward = _identity(names)
    return TeLayerSpec(te_class, _KINDS[te_class], opts, forward, backward, tp, mode, sp, strides)


# The partition dim each parameter has under each parallel mode (TE's reset_parameters).
def _expected_dims(spec: TeLayerSpec) -> dict:
    dims = {n: None for n in spec.te_to_tpcheck}
    if spec.kind in ("MultiheadAttention", "TransformerLayer"):
        if spec.parallel_mode is None:
            return dims
        for n in dims:
            parts = n.split(".")
            if parts[0] == "self_attention":
                parts = parts[1:]
            if parts[0] in ("qkv", "layernorm_qkv") and "layer_norm" not in parts[-1]:
                dims[n] = 0       # the QKV projection: column parallel
            elif parts[0] == "proj" and parts[-1] == "weight":
                dims[n] = 1       # the output projection: row parallel
            elif parts[0] == "layernorm_mlp" and parts[-1] in ("fc1_weight", "fc1_bias"):
                dims[n] = 0
            elif parts[0] == "layernorm_mlp" and parts[-1] == "fc2_weight":
                dims[n] = 1
        return dims
    if spec.parallel_mode == "column":
        dims.update({n: 0 for n in ("weight", "bias") if n in dims})
    elif spec.parallel_mode == "row":
        dims["weight"] = 1          # the row-parallel bias is replicated
    elif spec.parallel_mode == "column+row":
        dims.update({n: 0 for n in ("fc1_weight", "fc1_bias") if n in dims})
        dims["fc2_weight"] = 1
    return dims


def te_shard_dims(module: Any, spec: Optional[TeLayerSpec] = None) -> dict:
    """{TE parameter name: partition dim, or None for replicated} of a (sharded) TE module,
    from TE's attributes on its parameters (tensor_model_parallel, partition_dim). TE marks
    Linear's weight as partitioned even when the module is not sharded (tp_size 1 or no
    parallel_mode): such a module gives None everywhere. An attribute missing or
    disagreeing with the parallel mode (e.g. deferred init on the meta device, or a stride
    other than 1) is an InputError. For the gather stride of gated LayerNormMLP's fc1 see
    TeLayerSpec.shard_strides."""
    spec = spec or te_layer_spec(module)
    expected = _expected_dims(spec)
    if spec.parallel_mode is None or (spec.tp_size or 1) == 1:
        return {n: None for n in expected}
    dims = {}
    for name, want in expected.items():
        p = getattr(module, name, None)
        if p is None:
            raise InputError(f"{spec.te_class}: parameter {name!r} is missing")
        dim = int(p.partition_dim) if getattr(p, "tensor_model_parallel", False) else None
        if dim is None and want is not None:
            raise InputError(f"{spec.te_class}: parameter {name!r} has no tensor-parallel "
                             f"attributes (tensor_model_parallel, partition_dim), but "
                             f"parallel_mode={spec.parallel_mode!r} shards it along dim {want} "
                             "(deferred initialisation?)")
        if dim != want:
            raise InputError(f"{spec.te_class}: parameter {name!r} says partition_dim={dim}, "
                             f"but parallel_mode={spec.parallel_mode!r} gives {want}")
        stride = int(getattr(p, "partition_stride", 1)) if dim is not None else 1
        if stride != 1:
            raise InputError(f"{spec.te_class}: parameter {name!r} has partition_stride="
                             f"{stride}; TE 2.20 sets 1 for every parameter")
        dims[name] = dim
    return dims

"""The mapping from a TransformerEngine module to tpcheck's layer (judge/_te_mapping.py),
on stand-in objects with TE 2.20's attribute names: TE itself is never imported."""

import warnings

import numpy as np
import pytest
import torch

import tpcheck
from tpcheck.judge._te_mapping import (TE_CHECKED_VERSION, check_te_version, te_layer_spec,
                                       te_shard_dims)

_MODULE_PATHS = {
    "Linear": "transformer_engine.pytorch.module.linear",
    "LayerNormLinear": "transformer_engine.pytorch.module.layernorm_linear",
    "LayerNormMLP": "transformer_engine.pytorch.module.layernorm_mlp",
    "LayerNorm": "transformer_engine.pytorch.module.layernorm",
    "RMSNorm": "transformer_engine.pytorch.module.rmsnorm",
    "MultiheadAttention": "transformer_engine.pytorch.attention.multi_head_attention",
    "TransformerLayer": "transformer_engine.pytorch.transformer",
    "GroupedLinear": "transformer_engine.pytorch.module.grouped_linear",
}


def _cls(name, module=None):
    return type(name, (), {"__module__": module or _MODULE_PATHS[name]})


class _Store:
    def __init__(self, delay):
        self._delay = delay

    def delay_wgrad_compute(self):
        return self._delay


def _param(shape, dim=None):
    # As TE's set_tensor_model_parallel_attributes marks a parameter.
    p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
    if dim is not None:
        p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
    return p


def _gemm_common(m, tp, sp, bias):
    m.tp_size = tp
    m.sequence_parallel = tp > 1 and sp
    m.use_bias = bias
    m.return_bias = False
    m.fuse_wgrad_accumulation = False
    m.wgrad_store = _Store(False)
    m.symmetric_ar_type = None
    m.primary_weights_in_fp8 = False
    m.weight_names, m.bias_names = ["weight"], ["bias"]
    for flag in ("ub_overlap_ag_fprop", "ub_overlap_rs_fprop", "ub_overlap_ag_dgrad",
                 "ub_overlap_rs_dgrad", "ub_bulk_dgrad", "ub_bulk_wgrad"):
        setattr(m, flag, False)


def make_linear(in_f=16, out_f=8, mode=None, tp=1, sp=False, bias=True, norm=None):
    """A stand-in Linear (norm=None) or LayerNormLinear (norm="LayerNorm"/"RMSNorm") as TE
    2.20's __init__ and reset_parameters leave it: sharded sizes divided by tp."""
    m = _cls("Linear" if norm is None else "LayerNormLinear")()
    _gemm_common(m, tp, sp, bias)
    m.parallel_mode = mode
    m.in_features = in_f // tp if mode == "row" else in_f
    m.out_features = out_f // tp if mode == "column" else out_f
    m.weight = _param((m.out_features, m.in_features), 1 if mode == "row" else 0)
    if bias:
        m.bias = _param((m.out_features,), 0 if mode == "column" else None)
        if mode == "row":
            m.bias.sequence_parallel = m.sequence_parallel
    if norm is None:
        m.save_original_input = False
    else:
        m.normalization, m.eps, m.zero_centered_gamma = norm, 1e-5, False
        m.return_layernorm_output, m.return_layernorm_output_gathered = False, False
        m.layer_norm_weight = _param((in_f,))
        if norm == "LayerNorm":
            m.layer_norm_bias = _param((in_f,))
    return m


def make_mlp(hidden=16, ffn=32, tp=1, sp=False, bias=True, norm="LayerNorm", activation="gelu"):
    m = _cls("LayerNormMLP")()
    _gemm_common(m, tp, sp, bias)
    del m.weight_names, m.bias_names  # LayerNormMLP has fixed names
    m.ub_overlap_ag = m.ub_overlap_rs = False
    m.set_parallel_mode = tp > 1
    m.size_per_partition = ffn // tp
    m.activation, m.activation_params = activation, None
    m.normalization, m.eps, m.zero_centered_gamma = norm, 1e-5, False
    m.return_layernorm_output, m.return_layernorm_output_gathered = False, False
    m.checkpoint = False
    rows = m.size_per_partition * (2 if activation in ("geglu", "swiglu") else 1)
    m.layer_norm_weight = _param((hidden,))
    if norm == "LayerNorm":
        m.layer_norm_bias = _param((hidden,))
    m.fc1_weight = _param((rows, hidden), 0)
    m.fc2_weight = _param((hidden, m.size_per_partition), 1)
    if bias:
        m.fc1_bias = _param((rows,), 0)
        m.fc2_bias = _param((hidden,))
    return m


def make_norm(kind="LayerNorm", hidden=16, sp=None, zcg=False):
    m = _cls(kind)()
    m.eps, m.zero_centered_gamma, m.sequence_parallel = 1e-6, zcg, sp
    m.weight = _param((hidden,))
    if kind == "LayerNorm":
        m.bias = _param((hidden,))
    return m


def _check_names(spec):
    """The mapped options are accepted by tpcheck's layer, and the names agree both ways."""
    expected = tpcheck.layer_parameters(spec.kind, spec.options)
    assert set(spec.tpcheck_to_te) == set(expected)
    assert set(spec.te_to_tpcheck.values()) == set(expected)
    for te_name, tp_name in spec.te_to_tpcheck.items():
        assert spec.tpcheck_to_te[tp_name] == te_name
    return expected


@pytest.mark.parametrize("mode,tp,sp", [(None, 1, False), ("column", 2, False),
                                        ("column", 4, True), ("row", 2, False), ("row", 4, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(mode, tp, sp, bias):
    m = make_linear(16, 8, mode, tp, sp, bias)
    spec = te_layer_spec(m)
    assert (spec.kind, spec.tp_size, spec.parallel_mode, spec.sequence_parallel) == \
        ("Linear", tp, mode, sp)
    assert spec.options["in_features"] == 16 and spec.options["out_features"] == 8
    shapes = _check_names(spec)
    assert shapes["weight"] == (8, 16)
    dims = te_shard_dims(m)
    want = {"weight": None if mode is None else (0 if mode == "column" else 1)}
    if bias:
        want["bias"] = 0 if mode == "column" else None
    assert dims == want


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("mode,tp,sp", [(None, 1, False), ("column", 2, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_linear(norm, mode, tp, sp, bias):
    m = make_linear(16, 8, mode, tp, sp, bias, norm=norm)
    m.zero_centered_gamma, m.eps, m.return_layernorm_output = True, 1e-6, True
    spec = te_layer_spec(m)
    assert spec.kind == "LayerNormLinear" and spec.options["normalization"] == norm
    assert spec.options["eps"] == 1e-6 and spec.options["zero_centered_gamma"] is True
    assert spec.options["return_layernorm_output"] is True
    _check_names(spec)
    assert ("layer_norm_bias" in spec.te_to_tpcheck) == (norm == "LayerNorm")
    dims = te_shard_dims(m)
    assert dims["layer_norm_weight"] is None
    assert dims["weight"] == (0 if mode == "column" else None)


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu", "geglu"])
@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (4, True)])
@pytest.mark.parametrize("norm,bias", [("LayerNorm", True), ("RMSNorm", False)])
def test_layernorm_mlp(activation, tp, sp, norm, bias):
    m = make_mlp(16, 32, tp, sp, bias, norm, activation)
    spec = te_layer_spec(m)
    assert spec.kind == "LayerNormMLP"
    assert (spec.options["hidden_size"], spec.options["ffn_hidden_size"]) == (16, 32)
    assert spec.parallel_mode == ("column+row" if tp > 1 else None)
    shapes = _check_names(spec)
    # TE's local fc1 rows times tp are tpcheck's full rows (both halves for gated).
    assert shapes["fc1_weight"][0] == m.fc1_weight.shape[0] * tp
    gated = activation in ("swiglu", "geglu")
    assert spec.shard_strides.get("fc1_weight", 1) == (2 if gated and tp > 1 else 1)
    dims = te_shard_dims(m)
    if tp == 1:
        assert set(dims.values()) == {None}
    else:
        assert dims["fc1_weight"] == 0 and dims["fc2_weight"] == 1
        if bias:
            assert dims["fc1_bias"] == 0 and dims["fc2_bias"] is None


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("sp,zcg", [(None, False), (True, True)])
def test_norms(kind, sp, zcg):
    m = make_norm(kind, 16, sp, zcg)
    spec = te_layer_spec(m)
    assert spec.kind == kind and spec.tp_size is None and spec.parallel_mode is None
    assert spec.options == {"normalized_shape": 16, "eps": 1e-6, "zero_centered_gamma": zcg,
                            "sequence_parallel": bool(sp)}
    _check_names(spec)
    assert set(te_shard_dims(m).values()) == {None}


def _refused(m, *words):
    with pytest.raises(tpcheck.InputError) as e:
        te_layer_spec(m)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def _set(m, **kw):
    for k, v in kw.items():
        setattr(m, k, v)
    return m


@pytest.mark.parametrize("flag", ["ub_overlap_ag_fprop", "ub_overlap_rs_dgrad", "ub_bulk_wgrad",
                                  "ub_overlap_rs_fprop"])
def test_userbuffers_refused(flag):
    _refused(_set(make_linear(mode="column", tp=2, sp=True), **{flag: True}),
             "Linear", flag, "True")
    _refused(_set(make_mlp(tp=2, sp=True), ub_overlap_ag=True), "LayerNormMLP", "ub_overlap_ag")


def test_refused_options():
    _refused(_set(make_linear(), symmetric_ar_type="multimem_all_reduce"),
             "Linear", "symmetric_ar_type", "'multimem_all_reduce'")
    _refused(_set(make_linear(), primary_weights_in_fp8=True), "Linear",
             "primary_weights_in_fp8", "True")
    _refused(_set(make_linear(), weight_names=["query_weight", "key_weight"]), "Linear",
             "parameters_split", "query_weight")
    _refused(_set(make_linear(norm="LayerNorm"), normalization="BatchNorm"),
             "LayerNormLinear", "normalization", "'BatchNorm'")
    _refused(_set(make_linear(mode="column", tp=2, sp=True, norm="LayerNorm"),
                  return_layernorm_output=True, return_layernorm_output_gathered=True),
             "LayerNormLinear", "return_layernorm_output_gathered", "True")
    _refused(_set(make_linear(), parallel_mode="diagonal"), "Linear", "parallel_mode", "'diagonal'")
    _refused(make_mlp(activation="clamped_swiglu"), "LayerNormMLP", "activation", "'clamped_swiglu'")
    _refused(make_mlp(activation="silu"), "LayerNormMLP", "activation", "'silu'")
    _refused(_set(make_mlp(activation="swiglu"), activation_params={"limit": 7.0}),
             "LayerNormMLP", "activation_params", "limit")
    _refused(_set(make_mlp(tp=2), set_parallel_mode=False), "LayerNormMLP",
             "set_parallel_mode", "False")
    norm = make_norm("RMSNorm")
    norm.weight = _param((4, 16))
    _refused(norm, "RMSNorm", "normalized_shape", "(4, 16)")


def test_unmapped_classes():
    _refused(_cls("GroupedLinear")(), "GroupedLinear", "MoE")
    _refused(_cls("Linear", "transformer_engine.pytorch.ops.basic.basic_linear")(), "ops")
    _refused(_cls("Linear", "torch.nn.modules.linear")(), "not a TransformerEngine module")


def test_ignored_options_map_or_pass():
    # Options that do not change the values: mapped through (tpcheck follows them).
    m = _set(make_linear(mode="column", tp=2), fuse_wgrad_accumulation=True, return_bias=True,
             wgrad_store=_Store(True), save_original_input=True)
    spec = te_layer_spec(m)
    assert spec.options["fuse_wgrad_accumulation"] and spec.options["return_bias"]
    assert spec.options["delay_wgrad_compute"] and spec.options["save_original_input"]
    _check_names(spec)
    # Without SP, a gathered layernorm output is the output: accepted.
    m = _set(make_linear(norm="LayerNorm"), return_layernorm_output=True,
             return_layernorm_output_gathered=True)
    te_layer_spec(m)


def test_shard_dims_checks_attributes():
    m = make_linear(mode="column", tp=2)
    del m.weight.tensor_model_parallel  # as after deferred (meta-device) initialisation
    with pytest.raises(tpcheck.InputError, match="no tensor-parallel attributes"):
        te_shard_dims(m)
    m = make_linear(mode="row", tp=2)
    m.weight.partition_dim = 0
    with pytest.raises(tpcheck.InputError, match="partition_dim=0"):
        te_shard_dims(m)
    # Unsharded: TE still marks Linear's weight partitioned; nothing is gathered.
    assert te_shard_dims(make_linear(mode="column", tp=1)) == {"weight": None, "bias": None}


def test_version_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_te_version(TE_CHECKED_VERSION)
        te_layer_spec(make_linear(), te_version=TE_CHECKED_VERSION)
    with pytest.warns(UserWarning, match=r"2\.21\.0.*2\.20\.2"):
        check_te_version("2.21.0")
    with pytest.warns(UserWarning, match=r"1\.13.*2\.20\.2"):
        te_layer_spec(make_linear(), te_version="1.13")


def test_names_both_ways():
    spec = te_layer_spec(make_mlp())
    state = {n: np.zeros(1) for n in spec.te_to_tpcheck}
    state["_extra_state"] = b""
    assert set(spec.to_tpcheck(state)) == set(tpcheck.layer_parameters(spec.kind, spec.options))
    assert spec.to_te({"fc1_weight": 1, "output": 2}) == {"fc1_weight": 1, "output": 2}
    with pytest.raises(tpcheck.InputError, match="'extra'"):
        spec.to_tpcheck({"extra": 0})


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_truth_matches_plain_torch(norm):
    """End to end: the mapped spec's float64 truth equals TE's documented math, written
    here with plain torch ops (norm over the last dim, then x Wᵀ + b), forward and
    backward."""
    g = torch.Generator().manual_seed(7)
    hidden, out, tokens, eps = 16, 12, 10, 1e-6
    m = make_linear(hidden, out, norm=norm)
    m.eps, m.zero_centered_gamma = eps, True
    spec = te_layer_spec(m)
    te_state = {"layer_norm_weight": torch.randn(hidden, generator=g, dtype=torch.float64) * 0.1,
                "weight": torch.randn(out, hidden, generator=g, dtype=torch.float64) * 0.2,
                "bias": torch.randn(out, generator=g, dtype=torch.float64)}
    if norm == "LayerNorm":
        te_state["layer_norm_bias"] = torch.randn(hidden, generator=g, dtype=torch.float64) * 0.1
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    dy = torch.randn(tokens, out, generator=g, dtype=torch.float64)

    truth = tpcheck.layer_truth(spec.kind, spec.options, spec.to_tpcheck(te_state), x,
                                grad_output=dy)

    leaves = {k: v.clone().requires_grad_(True) for k, v in te_state.items()}
    xr = x.clone().requires_grad_(True)
    gamma = 1 + leaves["layer_norm_weight"]  # zero_centered_gamma
    if norm == "LayerNorm":
        mean = xr.mean(-1, keepdim=True)
        var = ((xr - mean) ** 2).mean(-1, keepdim=True)
        ln = (xr - mean) / torch.sqrt(var + eps) * gamma + leaves["layer_norm_bias"]
    else:
        ln = xr / torch.sqrt((xr ** 2).mean(-1, keepdim=True) + eps) * gamma
    y = ln @ leaves["weight"].T + leaves["bias"]
    y.backward(dy)

    np.testing.assert_allclose(np.asarray(truth.output), y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(truth.input_grads["input"]), xr.grad.numpy(),
                               rtol=1e-11, atol=1e-11)
    grads = spec.to_te(truth.grads)
    assert set(grads) == set(te_state)
    for name, leaf in leaves.items():
        np.testing.assert_allclose(np.asarray(grads[name]), leaf.grad.numpy(), rtol=1e-11,
                                   atol=1e-11, err_msg=name)

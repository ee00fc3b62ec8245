"""TransformerEngine modules' float64 reference (judge/_te_reference.py): tpcheck's own
layer stands in for the TE module in the truth run. On stand-ins with TE's class names,
attributes and documented math (te_standins.py; TE itself is never imported): the
reference's results against the stand-in's own math run in float64, its rounding noise,
its refusals, and compare_tp at TP 2 under `tpcheck emulate` (correct code passes, a
dropped reduction fails)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import tpcheck
import te_standins as S
from tpcheck.judge import register_reference, unregister_reference
from tpcheck.judge._te_reference import te_gather_strides, te_module_reference
from tpcheck.torch import truth

HERE = os.path.dirname(os.path.abspath(__file__))


STANDINS = (S.Linear, S.LayerNormMLP, S.MultiheadAttention, S.TransformerLayer)


@pytest.fixture(autouse=True)
def te_references():
    for cls in STANDINS:
        register_reference(cls, te_module_reference)
    yield
    for cls in STANDINS:
        unregister_reference(cls)


def _filled(m, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 0.2))
    return m


MODULES = {
    "Linear": lambda: S.Linear(24, 40),
    "Linear, no bias": lambda: S.Linear(24, 40, bias=False),
    "LayerNormMLP gelu": lambda: S.LayerNormMLP(24, 48),
    "LayerNormMLP swiglu RMSNorm": lambda: S.LayerNormMLP(24, 48, normalization="RMSNorm",
                                                          activation="swiglu"),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_reference_is_the_modules_math_in_float64(name):
    """The truth of the stand-in (tpcheck's C++ layer in its place) equals the stand-in's
    own forward and backward run in float64 (its parameters and input cast), output, input
    gradient and every parameter gradient, to float64's rounding; the report says the
    reference stood in, and the run's K includes the layer's GEMMs."""
    m = _filled(MODULES[name]())
    x = torch.randn(6, 2, 24, generator=torch.Generator().manual_seed(4))
    out_features = m.out_features if isinstance(m, S.Linear) else 24
    dy = torch.randn(6, 2, out_features, generator=torch.Generator().manual_seed(5))
    t = truth(m, x, grad_output=dy)
    assert [r["target"] for r in t.references] == [f"{type(m).__module__}.{type(m).__name__}"]

    ref = type(m).__new__(type(m))
    ref.__dict__.update(m.__dict__)  # same attributes, its own float64 parameters below
    ref._parameters = {k: torch.nn.Parameter(v.detach().double()) for k, v in m._parameters.items()}
    xr = x.double().requires_grad_(True)
    y = ref(xr)
    y.backward(dy.double())
    torch.testing.assert_close(t.outputs["output"], y.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(t.input_grads["input"], xr.grad, rtol=1e-11, atol=1e-11)
    assert set(t.grads) == set(ref._parameters)
    for k, p in ref._parameters.items():
        torch.testing.assert_close(t.grads[k], p.grad, rtol=1e-11, atol=1e-11, msg=k)
    weights = [d for k, p in m.named_parameters() if p.dim() == 2 for d in p.shape]
    assert t.reduction_length == max(weights + [12])
    # the module is left as it was: its own parameters, no gradients
    assert all(p.dtype == torch.float32 and p.grad is None for p in m.parameters())


def test_the_probe_runs_in_the_reference():
    """Under the probe the C++ layer runs perturbed too: the noise is non-zero, finite, of
    the size of one rounding of what the layer stores (|noise| ~ |value|), and the same in
    a second truth (a fixed stream)."""
    m = _filled(S.LayerNormMLP(24, 48))
    x = torch.randn(6, 2, 24, generator=torch.Generator().manual_seed(4))
    dy = torch.randn(6, 2, 24, generator=torch.Generator().manual_seed(5))
    a, b = truth(m, x, grad_output=dy), truth(m, x, grad_output=dy)
    n = a.noise.outputs["output"]
    assert torch.isfinite(n).all() and n.abs().max() > 0
    ratio = n.abs().max() / a.outputs["output"].abs().max()
    assert 1e-3 < ratio < 1e3, ratio
    torch.testing.assert_close(n, b.noise.outputs["output"], rtol=0, atol=0)
    assert a.noise.grads["fc1_weight"].abs().max() > 0
    no_probe = truth(m, x, grad_output=dy, probe=False)
    torch.testing.assert_close(no_probe.outputs["output"], a.outputs["output"], rtol=0, atol=0)


def test_refusals_name_the_module_and_the_option():
    """A TE option tpcheck's layer does not follow, or an FP8 output asked of the forward,
    stops the truth with an InputError naming them."""
    m = _filled(S.LayerNormMLP(24, 48))
    m.activation = "reglu"
    with pytest.raises(tpcheck.InputError, match=r"LayerNormMLP: option activation='reglu'"):
        truth(m, torch.randn(4, 24))
    lin = _filled(S.Linear(24, 40))
    with pytest.raises(tpcheck.InputError, match=r"Linear: forward argument fp8_output=True"):
        truth(lin, torch.randn(4, 24), fp8_output=True)


MHA = {
    "separate QKV, LayerNorm, GQA, causal": dict(groups=2),
    "fused interleaved QKV, RMSNorm, no mask": dict(fuse_qkv_params=True, normalization="RMSNorm",
                                                    attn_mask_type="no_mask"),
    "fused QKV not interleaved, no input norm, no bias": dict(
        fuse_qkv_params=True, qkv_weight_interleaved=False, input_layernorm=False, bias=False),
}


def _check_against_layer_truth(m, kind):
    """The mapping's parameter names are exactly tpcheck's layer's, and the truth through
    the reference is tpcheck.layer_truth of the mapped layer on the module's parameters
    (output, input and parameter gradients, bit for bit: one C++ layer). Returns the truth
    and the input."""
    from tpcheck.judge._te_mapping import te_layer_spec
    spec = te_layer_spec(m)
    assert spec.kind == kind
    state = {k: v.detach() for k, v in m.named_parameters()}
    assert set(spec.to_tpcheck(state)) == set(tpcheck.layer_parameters(spec.kind, spec.options))
    x = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(4))
    dy = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(5))
    t = truth(m, x, grad_output=dy, probe=False)
    ref = tpcheck.layer_truth(spec.kind, spec.options, spec.to_tpcheck(state), x, grad_output=dy)
    torch.testing.assert_close(t.outputs["output"], torch.as_tensor(ref.output), rtol=0, atol=0)
    torch.testing.assert_close(t.input_grads["input"], torch.as_tensor(ref.input_grads["input"]),
                               rtol=0, atol=0)
    for k, g in spec.to_te(ref.grads).items():
        torch.testing.assert_close(t.grads[k], torch.as_tensor(g), rtol=0, atol=0, msg=k)
    return t, x


@pytest.mark.parametrize("name", list(MHA))
def test_multihead_attention_maps_to_tpcheck_s_layer(name):
    """MultiheadAttention (self-attention, sbhd) through the reference is tpcheck's
    attention layer, bit for bit; the run's K counts the layer's GEMMs."""
    t, _ = _check_against_layer_truth(_filled(S.MultiheadAttention(32, 4, **MHA[name])),
                                      "MultiheadAttention")
    assert t.reduction_length >= 16  # the tokens, s·b, at least


TL = {
    "LayerNorm, gelu, GQA": dict(groups=2),
    "RMSNorm, swiglu, fused QKV, residual after the norm": dict(
        normalization="RMSNorm", activation="swiglu", fuse_qkv_params=True,
        apply_residual_connection_post_layernorm=True),
    "output layernorm": dict(output_layernorm=True),
    "parallel attention and MLP": dict(parallel_attention_mlp=True),
}


@pytest.mark.parametrize("name", list(TL))
def test_transformer_layer_maps_to_tpcheck_s_layer(name):
    """TransformerLayer (encoder) through the reference is tpcheck's TransformerLayer, bit
    for bit; hidden dropout in training mode is refused by name."""
    m = _filled(S.TransformerLayer(32, 64, 4, **TL[name]))
    _, x = _check_against_layer_truth(m, "TransformerLayer")
    m.hidden_dropout = 0.1
    with pytest.raises(tpcheck.InputError, match=r"TransformerLayer: option hidden_dropout=0.1"):
        truth(m, x)


def test_multihead_attention_refusals():
    """What tpcheck's attention does not compute is named: a mask passed at call time,
    rotary embeddings, dropout in training mode, a padding mask type, qk norms; and a fused
    QKV weight that is not interleaved cannot be gathered at TP > 1."""
    m = _filled(S.MultiheadAttention(32, 4))
    x = torch.randn(8, 2, 32)
    with pytest.raises(tpcheck.InputError, match=r"attention_mask=tensor"):
        truth(m, x, attention_mask=torch.ones(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(tpcheck.InputError, match=r"rotary_pos_emb"):
        truth(m, x, rotary_pos_emb=torch.ones(8, 1, 1, 8))
    m.core_attention.attention_dropout = 0.1
    with pytest.raises(tpcheck.InputError, match=r"attention_dropout=0.1"):
        truth(m, x)
    m.eval()
    truth(m, x, probe=False)  # eval(): the dropout does nothing, the truth runs
    m.train()
    m.core_attention.attention_dropout = 0.0
    m.attn_mask_type = "padding"
    with pytest.raises(tpcheck.InputError, match=r"attn_mask_type='padding'"):
        truth(m, x)
    m.attn_mask_type, m.q_norm = "causal", torch.nn.Identity()
    with pytest.raises(tpcheck.InputError, match=r"qk_norm_type"):
        truth(m, x)
    m.q_norm, m.cp_size = None, 2   # what TE's set_context_parallel_group leaves
    with pytest.raises(tpcheck.InputError, match=r"context parallel .*cp_size=2 is not followed"):
        truth(m, x)
    m.cp_size = 1
    fused = S.MultiheadAttention(32, 4, fuse_qkv_params=True, qkv_weight_interleaved=False)
    fused.tp_size = 2
    fused.layernorm_qkv.parallel_mode = "column"
    with pytest.raises(tpcheck.InputError, match=r"qkv_weight_interleaved=False at tp_size 2"):
        te_gather_strides(fused)


def test_gated_fc1_gathers_with_stride_two():
    """Gated LayerNormMLP's fc1 holds [a_r; b_r] on rank r while TE marks stride 1:
    compare_tp gathers it with stride 2 (one gather stride, from the mapping)."""
    sharded = torch.nn.Sequential(S.LayerNormMLP(24, 48, activation="swiglu", tp_size=2,
                                                 set_parallel_mode=True))
    assert te_gather_strides(sharded) == {"0.fc1_weight": 2, "0.fc1_bias": 2}
    assert te_gather_strides(S.LayerNormMLP(24, 48, tp_size=2, set_parallel_mode=True)) == {}


@pytest.fixture(scope="module")
def tp2_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("te_tp2") / "results.json"
    worker = os.path.join(HERE, "emulate_workers", "te_standins_tp.py")
    p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", "2", "--", worker,
                        str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def test_compare_tp_checks_the_replicated_fp8_state_across_ranks(tp2_results):
    """The delayed-scaling state two steps left (amax histories, scales) is compared across
    ranks bit for bit: with the amaxes max-reduced every rank's is rank 0's and compare_tp
    passes with the state listed; without the reduction each rank scales with its own
    amaxes, and the scale and the history fail as replicated state while every tensor
    passes (the run itself is unquantized)."""
    state = [r for r in tp2_results if r["case"] == "Linear row, FP8 state"]
    assert [r["bug"] for r in state] == ["none", "none", "amax-not-reduced"]
    names = ["fp8_meta.scaling_fwd.amax_history", "fp8_meta.scaling_fwd.scale"]
    for r in state:
        assert r["state"] == names, r
        assert any("FP8 delayed-scaling state of 1 modules (2 amax histories and scales)" in n
                   for n in r["notes"]), r
        if r["bug"] == "none":
            assert r["passed"], r
        else:
            assert not r["passed"] and r["failing"] == names, r
            assert all("rank 1: " in why and "reduce_amax=False" in why for why in r["reasons"]), r
            assert any("has reduce_amax=False" in n for n in r["notes"]), r


def test_compare_tp_on_te_modules_at_tp2(tp2_results):
    """compare_tp under `truth` on the stand-ins at TP 2 (LayerNormMLP gelu/LayerNorm and
    swiglu/RMSNorm, row-parallel Linear): correct code passes on seeds 101 and 102 with the
    reference standing in once per truth; a dropped row-parallel all-reduce fails on the
    output."""
    tp2_results = [r for r in tp2_results if r["case"] != "Linear row, FP8 state"]
    assert len(tp2_results) == 9
    for r in tp2_results:
        assert [x["calls"] for x in r["references"]] == [1], r
        if r["bug"] == "none":
            assert r["passed"], r
        else:
            assert not r["passed"] and "output" in r["failing"], r


def test_compare_tp_refuses_to_run_inside_fp8_autocast(monkeypatch):
    """Inside TE's fp8_autocast the unsharded twin (rank 0 alone) would join the amax
    reduction at the region's end on one rank only: compare_tp says so before running."""
    import types
    from tpcheck.torch import compare_tp
    # TE 2.20's layout: the manager lives in transformer_engine.pytorch.quantization, which
    # the package imports but does not re-export
    te = types.ModuleType("transformer_engine.pytorch")
    quantization = types.ModuleType("transformer_engine.pytorch.quantization")
    quantization.FP8GlobalStateManager = type("FP8GlobalStateManager", (), {
        "is_fp8_enabled": classmethod(lambda cls: True)})
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.quantization", quantization)
    m = _filled(S.Linear(8, 4))
    with pytest.raises(tpcheck.InputError, match="inside TransformerEngine's fp8_autocast; call "
                                                 "it outside"):
        compare_tp(m, m, (torch.randn(3, 8),), grad_output=torch.randn(3, 4))
    quantization.FP8GlobalStateManager.is_fp8_enabled = classmethod(lambda cls: False)
    assert compare_tp(m, m, (torch.randn(3, 8),), grad_output=torch.randn(3, 4)).passed

"""bench/pytorch_te_suite.py (the PyTorch baseline of the suite wall-time benchmark)
checked against references it did not write. Skipped where torch is not installed (CI).

1. Its fp64 truth run (unsharded, float64, torch.autograd) against the independent JAX
   reference (jax_layers.py, autodiff of the te suite's loss MSE(output, target)) on the
   same parameters, input and target: every output and gradient, norm-wise relative error
   below 1e-10 (both are f64 and differ only in the order of additions; a wrong term gives
   1e-3 .. 1).
2. The emulated TP 2 run passes the truth policy on a sample of cases, and a TP bug (the
   row-parallel all-reduce dropped, the SP norm-gradient all-reduce dropped) is caught.
"""

import importlib.util
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_layers as jl  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pytorch_te_suite",
                                               ROOT / "bench" / "pytorch_te_suite.py")
pts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pts)

REL_TOL = 1e-10
CPU = torch.device("cpu")

# TP 2 sizes (tpcheck's defaults); truth runs are unsharded.
_NOTES = []
CASES = {c.id: c for c in pts.te_cases(2, pts.resolve_sizes(2, None, None, None, None, None,
                                                            _NOTES), _NOTES)}
JAX_CASES = [
    "Linear.column.sp0.default",
    "Linear.row.sp0.return_bias=true",
    "RMSNorm.sp0.zero_centered_gamma=true",
    "LayerNormLinear.column.sp0.return_layernorm_output=true",
    "LayerNormMLP.sp0.default",
    "LayerNormMLP.sp0.normalization=RMSNorm",
    "TransformerLayer.sp0.default",
    "TransformerLayer.sp0.num_gqa_groups=4",
    "TransformerLayer.sp0.output_layernorm=true",
    "TransformerLayer.sp0.parallel_attention_mlp=true",
    "TransformerLayer.sp0.apply_residual_connection_post_layernorm=true",
    "TransformerLayer.sp0.window_size=[2,2]",
    "TransformerLayer.sp0.fuse_qkv_params=true",
    "TransformerLayer.sp0.qkv_weight_interleaved=false",
    "TransformerLayer.sp0.activation=relu",
]


def _jax_options(case):
    o = dict(case.options)
    o.pop("params_dtype", None)
    return o


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    den = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (den if den > 0 else 1.0)


@pytest.mark.parametrize("case_id", JAX_CASES)
def test_truth_run_matches_jax(case_id):
    case = CASES[case_id]
    full = pts.generate(case, CPU, 1234)
    truth = pts.run_case_on(case, pts.LocalGroup(), full, torch.float64, False)

    params = {n: jnp.asarray(t.numpy()) for n, t in full["params"].items()}
    x = jnp.asarray(full["input"].numpy())
    target = jnp.asarray(full["target"].numpy())
    kind, options = case.module, _jax_options(case)
    assert [n for n, _ in jl.parameter_specs(kind, options)] == [s.name for s in full["specs"]]

    def loss(p, xx):  # the te suite's loss: MSE(output, target) only
        outs = jl.forward(kind, options, p, xx)
        return jnp.mean((outs["output"] - target) ** 2), outs

    (_, outs), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    dparams, dx = grads
    checked = 0
    for (what, name), value in truth.items():
        if what == "output":
            ref = outs[name]
        elif what == "input_gradient":
            ref = dx
        else:
            ref = dparams[name]
        assert tuple(value.shape) == tuple(ref.shape), (what, name)
        checked += 1
        if name.endswith("key_bias"):
            _check_key_bias_grad(name, value, ref, dparams)
            continue
        err = _rel(value.numpy(), ref)
        assert err < REL_TOL, f"{case_id} {what} {name}: norm-wise rel. error {err:.3g}"
    assert checked == 2 + len(full["specs"]) + sum(n in outs for n in ("bias", "layernorm_output"))


def _check_key_bias_grad(name, value, ref, dparams):
    """The key bias shifts every score of a query by the same amount, which the softmax
    ignores: its gradient is exactly zero and both sides hold only rounding, so a relative
    error means nothing (test_layers_vs_jax.py does the same). Both must be negligible
    against the key_weight gradient (a mishandled key bias gives a ratio ~1)."""
    scale = np.linalg.norm(np.asarray(dparams[name[: -len("bias")] + "weight"]))
    for side, g in (("torch", value.numpy()), ("JAX", ref)):
        ratio = np.linalg.norm(np.asarray(g)) / scale
        assert ratio <= 1e-13, f"{name} ({side}) should be ~0: |g|/|key_weight grad| = {ratio}"


SAMPLE = ("^(Linear.row.sp0.default|Linear.column.sp1.default|LayerNorm.sp1.zero.*|"
          "LayerNormMLP.sp1.default|TransformerLayer.sp1.default|"
          "TransformerLayer.sp0.fuse_qkv_params=true)$")


def test_tp2_emulated_sample_passes(capsys):
    rc = pts.main(["--device", "cpu", "--tp", "2", "--filter", SAMPLE])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "6 passed, 0 failed" in out, out


@pytest.mark.parametrize("bug,case_id", [
    ("reduce_from_tp", "Linear.row.sp0.default"),  # the row-parallel all-reduce lost
    ("sp_grads", "LayerNorm.sp1.zero_centered_gamma=true"),  # SP norm grads not reduced
])
def test_tp_bug_is_caught(monkeypatch, capsys, bug, case_id):
    if bug == "reduce_from_tp":
        monkeypatch.setattr(pts, "reduce_from_tp", lambda g, xs: xs)
    else:
        real = pts.param_specs

        def no_sp_reduce(case):
            specs = real(case)
            for s in specs:
                s.sp_grad = False
            return specs

        monkeypatch.setattr(pts, "param_specs", no_sp_reduce)
    rc = pts.main(["--device", "cpu", "--tp", "2", "--filter", case_id.replace("[", r"\[")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL " + case_id in out, out

"""tests/python/test_package.py — the Python package `tpcheck`, on the CPU.

References are independent of tpcheck: numpy formulas for every statistic (the reference
suite's rule written out: |a - b| in the tensors' dtype, first argmax, rel = d /
max(|b|, 1e-5)), TF32 rounding by bit manipulation, JAX x64 autodiff (jax_layers.py, written
from docs/LAYERS.md) for tpcheck.layer_truth, and the `tpcheck` program's own JSON for
tpcheck.run. The package is imported from the build tree (ctest sets PYTHONPATH to
build/python); a missing package is a failure, not a skip.
"""

import inspect
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jax_layers as jl  # noqa: E402
import tpcheck  # noqa: E402

jax.config.update("jax_enable_x64", True)


# ---- independent references ---------------------------------------------------------------


def reference_te(sharded, single, rtol, atol):
    """The reference suite's check, as its Python does it: d in the dtype, first argmax."""
    d = np.abs(sharded - single).astype(single.dtype).reshape(-1)  # rounded to the dtype
    i = int(np.argmax(d))
    rel = float(d[i]) / max(abs(float(single.reshape(-1)[i])), 1e-5)
    return i, float(d[i]), rel, not (rel > rtol and float(d[i]) > atol)


def tf32(x):
    """f32 → TF32 (10 mantissa bits), round to nearest even, by bits."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0xFFF + ((b >> 13) & 1)) & ~np.uint64(0x1FFF)
    return b.astype(np.uint32).view(np.float32)


def rel_norm(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ---- compare: statistics against numpy ---------------------------------------------------


def test_statistics_match_numpy_formulas():
    rng = np.random.default_rng(1)
    truth = rng.normal(size=(6, 5, 7))
    single = (truth + rng.normal(scale=1e-6, size=truth.shape)).astype(np.float32)
    sharded = (truth + rng.normal(scale=2e-6, size=truth.shape)).astype(np.float32)
    v = tpcheck.compare(single, sharded, truth, policy="allclose", rtol=1e-5, atol=1e-6)
    s = v.statistics
    i, d, rel, _ = reference_te(sharded, single, 1e-5, 1e-6)
    assert s["argmax"] == i
    assert s["argmax_index"] == tuple(int(k) for k in np.unravel_index(i, truth.shape))
    assert s["max_abs_diff"] == d
    assert s["rel_at_max"] == pytest.approx(rel, rel=1e-15)
    assert s["sharded_value"] == float(sharded.reshape(-1)[i])
    assert s["single_value"] == float(single.reshape(-1)[i])
    a64, b64 = sharded.astype(np.float64), single.astype(np.float64)
    assert s["norm_rel_diff"] == pytest.approx(rel_norm(a64, b64), rel=1e-12)
    assert s["count_over_allclose"] == int(np.sum(~(np.abs(a64 - b64) <= 1e-6 + 1e-5 * np.abs(b64))))
    assert s["count_bits_differ"] == int(np.sum(sharded.view(np.uint32) != single.view(np.uint32)))
    e1, e2 = b64 - truth, a64 - truth
    assert s["single_vs_truth"]["max_abs"] == np.max(np.abs(e1))
    assert s["single_vs_truth"]["argmax"] == int(np.argmax(np.abs(e1)))
    assert s["sharded_vs_truth"]["rms"] == pytest.approx(np.sqrt(np.mean(e2 ** 2)), rel=1e-12)
    assert s["truth_rms"] == pytest.approx(np.sqrt(np.mean(truth ** 2)), rel=1e-12)
    assert s["truth_max_abs"] == np.max(np.abs(truth))
    assert (v.passed, v.status) == (s["count_over_allclose"] == 0, "pass" if v.passed else "fail")


def test_large_tensor_is_blocked_like_the_small_one():
    # Several blocks of 2^20 elements on several threads: same maxima, counts, positions
    # as the numpy formulas (the block structure must not change them).
    rng = np.random.default_rng(2)
    n = (1 << 20) * 3 + 12345
    single = rng.normal(size=n).astype(np.float32)
    sharded = single.copy()
    sharded[[17, 2_500_000, n - 1]] += np.float32(1e-3)
    sharded[1_500_000] += np.float32(1e-3)  # same difference, later: the first one wins
    v = tpcheck.compare(single, sharded, policy="allclose", rtol=0, atol=0)
    i, d, _, _ = reference_te(sharded, single, 0, 0)
    assert (v.argmax, v.max_abs_diff) == (i, d)
    assert v.count_over_allclose == 4 and v.count_bits_differ == 4
    assert v.norm_rel_diff == pytest.approx(rel_norm(sharded, single), rel=1e-9)


def test_te_policy_is_the_reference_rule():
    rng = np.random.default_rng(3)
    for trial in range(20):
        single = rng.normal(scale=10.0 ** rng.integers(-6, 1), size=(8, 9)).astype(np.float32)
        sharded = (single * (1 + rng.normal(scale=10.0 ** rng.integers(-7, -2), size=single.shape))
                   ).astype(np.float32)
        v = tpcheck.compare(single, sharded, policy="te")
        _, _, _, ok = reference_te(sharded, single, 1e-3, 5e-5)  # the fp32 row of the table
        assert v.passed == ok, (trial, v)


def _f32_gemm(a, b):
    """C = A B accumulated in f32 in k order (each product and sum rounded to f32)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * b[k:k + 1, :]
    return acc


def _gemm_story():
    """The reference failure, hand-built: C = A B with K = 32, computed once with TF32
    inputs (the unsharded shape's tensor-core kernel) and once with full FP32 inputs (the
    sharded shape's FMA kernel), both accumulating in f32; the truth in f64. Row 5 and
    column 3 hold the larger values, and C[5, 3] is made to cancel to 3.7e-4, as the
    fc1_weight gradient element did (|error| 2e-5 there, rel. 0.05: the story's 2.27e-5
    and 0.0617)."""
    rng = np.random.default_rng(10)
    a = rng.normal(scale=0.02, size=(64, 32)).astype(np.float32)
    b = rng.normal(scale=0.02, size=(32, 16)).astype(np.float32)
    a[5] = rng.normal(scale=0.1, size=32).astype(np.float32)
    b[:, 3] = rng.normal(scale=0.1, size=32).astype(np.float32)
    b[-1, 3] = np.float32(0.1)
    partial = float(a[5, :-1].astype(np.float64) @ b[:-1, 3].astype(np.float64))
    a[5, -1] = np.float32((3.7e-4 - partial) / 0.1)
    truth = a.astype(np.float64) @ b.astype(np.float64)
    single = _f32_gemm(tf32(a), tf32(b))
    sharded = _f32_gemm(a, b)
    return single, sharded, truth


def test_reference_failure_near_zero_element():
    single, sharded, truth = _gemm_story()
    # The reference's own rule with the original atol flags the near-zero element ...
    i, d, rel, ok = reference_te(sharded, single, 1e-3, 1e-5)
    assert not ok and i == 5 * 16 + 3
    v = tpcheck.compare(single, sharded, policy="te", atol=1e-5)
    assert not v and v.argmax_index == (5, 3)
    assert v.rel_at_max == pytest.approx(rel, rel=1e-12) and v.max_abs_diff == d
    with pytest.raises(tpcheck.CheckFailed, match=r"NUMERICAL CHECK FAILED: tensor not close enough "
                                                  r"at index 83 with .* \| rel\. error = .* \(tol = 0\.001\)"):
        tpcheck.assert_close(single, sharded, atol=1e-5)
    # ... the truth says it is rounding: the sharded run is closer to it than the single
    # run (TF32 inputs, u = 2^-11), within the error model for K = 32.
    v = tpcheck.compare(single, sharded, truth, dtype="float32", math="tf32", reduction_length=32,
                        tp_size=1)
    assert v, v.reason
    assert v.statistics["sharded_vs_truth"]["max_abs"] < v.statistics["single_vs_truth"]["max_abs"]
    assert tpcheck.assert_close(single, sharded, truth, math="tf32", reduction_length=32, tp_size=1)


def test_truth_policy_catches_a_real_bug():
    single, sharded, truth = _gemm_story()
    broken = sharded.copy()
    broken[:, 3] *= np.float32(0.5)  # a lost partial sum in one column
    v = tpcheck.compare(single, broken, truth, math="tf32", reduction_length=32, tp_size=2)
    assert not v and "EXCEEDED" in v.reason
    with pytest.raises(tpcheck.CheckFailed, match="tpcheck \\(truth\\): fc1_weight grad: against truth"):
        tpcheck.assert_close(single, broken, truth, math="tf32", reduction_length=32, tp_size=2,
                             name="fc1_weight grad")
    with pytest.raises(AssertionError, match=r"tpcheck \(truth\): tensor: against truth"):
        v.assert_ok()  # CheckFailed is an AssertionError
    assert v.failures == [{"name": "tensor", "policy": "truth", "status": "fail",
                           "reason": v.reason}]


def test_global_rules_and_verdict_object():
    z = np.zeros((3, 4), np.float32)
    x = np.ones((3, 4), np.float32)
    v = tpcheck.compare(x, z, policy="te")
    assert not v and "all zeros" in v.reason
    w = tpcheck.compare(z, z, policy="bitwise")
    assert w.status == "warning" and bool(w)  # passes with a warning, as in the C++ rules
    n = x.copy()
    n[1, 2] = np.nan
    v = tpcheck.compare(x, n, policy="allclose")
    assert not v and "NaN" in v.reason and v.sharded_nan == 1
    assert v.argmax_index == (1, 2)  # the reference's argmax: a NaN first
    r = repr(tpcheck.compare(x, x, policy="bitwise"))
    assert r.startswith("Verdict(PASS under 'bitwise': bit-identical (12 elements)")
    assert tpcheck.policies() == ["te", "allclose", "truth", "bitwise"]


# ---- DLPack: numpy, JAX, torch -------------------------------------------------------------


def test_jax_arrays_every_dtype_zero_copy():
    rng = np.random.default_rng(5)
    base = rng.normal(size=(4, 8))
    truth = jnp.asarray(base, dtype=jnp.float64)
    for dt in (jnp.float64, jnp.float32, jnp.float16, jnp.bfloat16,
               jnp.float8_e4m3fn, jnp.float8_e5m2):
        single = jnp.asarray(base, dtype=dt)
        sharded = jnp.asarray(base * 1.01, dtype=dt)
        v = tpcheck.compare(single, sharded, truth, policy="bitwise")
        s64, h64 = np.asarray(single, np.float64), np.asarray(sharded, np.float64)
        d = np.abs(h64 - s64)
        assert v.max_abs_diff == pytest.approx(float(d.max()), rel=2 ** -7), dt
        assert v.single_vs_truth["max_abs"] == np.max(np.abs(s64 - base)), dt
        assert v.count_bits_differ == int(np.sum(s64 != h64)), dt


def test_numpy_sees_the_memory_in_place():
    # A view into a larger buffer: tpcheck reads that memory (no copy is made; a copy of the
    # base array would not see later writes either, so we check values, offsets included).
    big = np.arange(40, dtype=np.float32).reshape(4, 10)
    view = big[1:3]  # contiguous rows, non-zero offset
    v = tpcheck.compare(view, view + np.float32(1), policy="bitwise")
    assert v.single_value == float(view.reshape(-1)[v.argmax])


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")  # CI: skipped (no torch); the GPU machine runs it
    a = torch.randn(16, 32, dtype=torch.float32)
    b = (a.double() * (1 + 3e-8)).float()  # within an ulp of a
    truth = a.double() * (1 + 1.5e-8)
    v = tpcheck.compare(a, b, truth, policy="truth", reduction_length=32, tp_size=1)
    assert v, v.reason
    assert v.single_vs_truth["max_abs"] == float((a.double() - truth).abs().max())
    assert not tpcheck.compare(a, a * 1.001, truth, reduction_length=32, tp_size=1)
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        v = tpcheck.compare(a.to(dt), b.to(dt), policy="bitwise")
        assert v.max_abs_diff == float((b.to(dt).double() - a.to(dt).double()).abs().max())
    w = torch.randn(4, 4, requires_grad=True)
    assert tpcheck.compare(w, w, policy="bitwise")  # detached for DLPack
    with pytest.raises(ValueError, match="not C-contiguous"):
        tpcheck.compare(a.t(), a.t(), policy="bitwise")


# ---- every error path ----------------------------------------------------------------------


def test_errors_name_the_problem():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match="single: dtype int32 is not supported; expected float64"):
        tpcheck.compare(np.ones((4, 4), np.int32), x, policy="te")
    with pytest.raises(TypeError, match="sharded: dtype complex128"):
        tpcheck.compare(x, np.ones((4, 4), np.complex128), policy="te")
    with pytest.raises(TypeError, match="dtype bool"):
        tpcheck.compare(np.ones(3, bool), np.ones(3, bool), policy="te")
    with pytest.raises(ValueError, match=r"layout not supported: shape \[4, 2\] with strides 4, 2"):
        tpcheck.compare(x[:, ::2], x[:, ::2], policy="te")
    with pytest.raises(ValueError, match=r"sharded has shape \[4, 3\] but single has shape \[4, 4\]"):
        tpcheck.compare(x, x[:, :3].copy(), policy="te")
    with pytest.raises(TypeError, match="truth: dtype f32 given; the fp64 truth must be float64"):
        tpcheck.compare(x, x, x, reduction_length=1, tp_size=1)
    with pytest.raises(ValueError, match=r"truth has shape \[2, 4\]"):
        tpcheck.compare(x, x, np.ones((2, 4)), reduction_length=1, tp_size=1)
    with pytest.raises(ValueError, match="policy 'truth' judges both runs against the fp64 truth"):
        tpcheck.compare(x, x)
    with pytest.raises(ValueError, match="unknown policy 'close'"):
        tpcheck.compare(x, x, policy="close")
    with pytest.raises(TypeError, match="single: list is not an array"):
        tpcheck.compare([1.0, 2.0], x, policy="te")
    with pytest.raises(ValueError, match="rtol must be >= 0, got -1"):
        tpcheck.compare(x, x, policy="te", rtol=-1)
    with pytest.raises(ValueError, match="reduction_length must be >= 1, got 0"):
        tpcheck.compare(x, x, np.ones((4, 4)), reduction_length=0, tp_size=1)
    with pytest.raises(ValueError, match="unknown math class|expected one of"):
        tpcheck.compare(x, x, np.ones((4, 4)), math="int8", reduction_length=1, tp_size=1)
    with pytest.raises(ValueError, match="dtype 'float128'"):
        tpcheck.compare(x, x, np.ones((4, 4)), dtype="float128", reduction_length=1, tp_size=1)
    v = tpcheck.compare(x.astype(np.float64), x.astype(np.float64), policy="te")
    assert not v and "no reference tolerance for dtype f64" in v.reason


# ---- one API convention -------------------------------------------------------------------


def test_truth_policy_needs_its_error_model_and_never_defaults_it():
    """compare under `truth` needs K and N: given, or carried by a TruthTensor; missing
    ones are an InputError naming the argument and where it comes from."""
    single, sharded, truth = _gemm_story()
    with pytest.raises(tpcheck.InputError, match=r"needs reduction_length=.*truth_for"):
        tpcheck.compare(single, sharded, truth, tp_size=2)
    with pytest.raises(tpcheck.InputError, match=r"needs tp_size="):
        tpcheck.compare(single, sharded, truth, reduction_length=32)
    explicit = tpcheck.compare(single, sharded, truth, math="tf32", reduction_length=32, tp_size=2)
    carried = tpcheck.compare(single, sharded, tpcheck.TruthTensor(truth, 32, 2), math="tf32")
    assert carried.to_dict() == explicit.to_dict()
    assert carried.error_model["reduction_length"] == 32 and carried.error_model["tp_size"] == 2
    # an argument overrides what the truth carries
    wider = tpcheck.compare(single, sharded, tpcheck.TruthTensor(truth, 32, 2), math="tf32",
                            reduction_length=4096)
    assert wider.error_model["reduction_length"] == 4096
    # the other policies need no error model
    assert tpcheck.compare(single, single, policy="bitwise").passed


def test_assert_close_takes_single_then_sharded():
    """The te rule is not symmetric (rel = |d| / |single|): the order matters. The old
    keywords actual= (sharded) / expected= (single) still work, with a warning."""
    single, sharded, _ = _gemm_story()
    with pytest.raises(tpcheck.CheckFailed) as new_order:
        tpcheck.assert_close(single, sharded, atol=1e-5)
    v = tpcheck.compare(single, sharded, policy="te", atol=1e-5)
    assert v.reason in str(new_order.value)
    with pytest.warns(DeprecationWarning, match="actual=, expected="):
        with pytest.raises(tpcheck.CheckFailed) as old_keywords:
            tpcheck.assert_close(actual=sharded, expected=single, atol=1e-5)
    assert str(old_keywords.value) == str(new_order.value)
    with pytest.warns(DeprecationWarning), pytest.raises(tpcheck.InputError, match="given twice"):
        tpcheck.assert_close(single, sharded, actual=sharded)
    with pytest.raises(tpcheck.InputError, match="missing sharded"):
        tpcheck.assert_close(single)


def test_the_reference_layer_truth_has_its_own_name_and_the_module_truths_fields():
    opts = {"hidden_size": 8, "ffn_hidden_size": 4}
    rng = np.random.default_rng(9)
    params = {k: rng.normal(size=s) for k, s in tpcheck.layer_parameters("LayerNormMLP", opts).items()}
    x, dy = rng.normal(size=(3, 8)), rng.normal(size=(3, 8))
    t = tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output=dy)
    assert isinstance(t, tpcheck.LayerTruth) and set(t.input_grads) == {"input"}
    assert sorted(t.tensors()) == sorted(["output", "input", *t.grads])
    with pytest.warns(DeprecationWarning, match="tpcheck.truth is deprecated"):
        old = tpcheck.truth("LayerNormMLP", opts, params, x, grad_output=dy)
    with pytest.warns(DeprecationWarning, match="input_grads"):
        assert np.array_equal(old.grad_input, t.input_grads["input"])
    with pytest.warns(DeprecationWarning, match="LayerTruth"):
        assert tpcheck.TruthResult is tpcheck.LayerTruth
    one = t.truth_for("fc1_weight", reduction_length=8, tp_size=2)
    assert (one.reduction_length, one.tp_size, one.name) == (8, 2, "fc1_weight")
    with pytest.raises(tpcheck.InputError, match=r"no tensor 'fc9_weight'; expected one of"):
        t.truth_for("fc9_weight")


def test_every_error_is_a_tpcheck_error():
    assert issubclass(tpcheck.InputError, tpcheck.Error) and issubclass(tpcheck.InputError, ValueError)
    assert issubclass(tpcheck.InputError, TypeError)
    assert issubclass(tpcheck.CheckFailed, AssertionError) and issubclass(tpcheck.RunError, RuntimeError)
    x = np.ones((4, 4), np.float32)
    for call in (lambda: tpcheck.compare(x, x, policy="close"),          # Python's check
                 lambda: tpcheck.compare([1.0], x, policy="te"),         # not an array
                 lambda: tpcheck.compare(x, x[:, :3].copy(), policy="te"),  # the compiled side's
                 lambda: tpcheck.layer_truth("Transformer", {}, {}, x),
                 lambda: tpcheck.run(tp=0, backend="cpu"),
                 lambda: tpcheck.run(steps=1.5)):
        with pytest.raises(tpcheck.InputError):
            call()
    with pytest.raises(tpcheck.CheckFailed):
        tpcheck.assert_close(x, x + 1, policy="bitwise")


# ---- truth against JAX -----------------------------------------------------------------------


def _random_params(kind, options, rng):
    return {name: rng.normal(scale=0.3, size=shape) for name, shape in jl.parameter_specs(kind, options)}


@pytest.mark.parametrize("kind,options,shape", [
    ("LayerNormMLP", {"hidden_size": 16, "ffn_hidden_size": 24}, (12, 16)),
    ("LayerNormMLP", {"hidden_size": 16, "ffn_hidden_size": 8, "activation": "swiglu",
                      "normalization": "RMSNorm", "return_bias": True}, (6, 2, 16)),
    ("Linear", {"in_features": 16, "out_features": 12, "return_bias": True}, (10, 16)),
    ("TransformerLayer", {"hidden_size": 16, "ffn_hidden_size": 12, "num_attention_heads": 4},
     (6, 2, 16)),
])
def test_truth_matches_jax(kind, options, shape):
    rng = np.random.default_rng(6)
    # Parameters as a float32 state_dict holds them (the truth widens them exactly), plus the
    # reference library's FP8 metadata entry, which is ignored.
    sd = {k: v.astype(np.float32) for k, v in _random_params(kind, options, rng).items()}
    sd["_extra_state"] = np.zeros(1, np.float32)
    x = rng.normal(size=shape)

    def f(p, xx):
        return jl.forward(kind, options, p, xx)

    p64 = {k: jnp.asarray(v.astype(np.float64)) for k, v in sd.items() if k != "_extra_state"}
    out32, vjp32 = jax.vjp(f, p64, jnp.asarray(x))
    dy = {k: rng.normal(size=np.shape(v)) for k, v in out32.items()}
    dparams32, dx32 = vjp32({k: jnp.asarray(v) for k, v in dy.items()})
    t = tpcheck.layer_truth(kind, {**options, "params_dtype": "float32"}, sd, x,
                            grad_output=dy if len(dy) > 1 else dy["output"])
    assert sorted(t.outputs) == sorted(out32)
    # f64 on both sides, different summation orders: ~1e-15 (test_layers_vs_jax.py's bound).
    for k in out32:
        assert t.outputs[k].dtype == np.float64
        assert rel_norm(t.outputs[k], out32[k]) < 1e-10, k
    assert rel_norm(t.input_grads["input"], dx32) < 1e-10
    assert sorted(t.grads) == sorted(dparams32)
    # A gradient that is zero in exact arithmetic (the attention key bias: softmax ignores a
    # shift) is rounding noise (~1e-16) on both sides: measured against the input
    # gradient's norm instead.
    floor = np.linalg.norm(np.asarray(dx32))
    for k in dparams32:
        ref = np.asarray(dparams32[k])
        err = np.linalg.norm(t.grads[k] - ref)
        assert err < 1e-10 * max(np.linalg.norm(ref), floor), k


def _layer_case(kind, opts, seed, scale, x_shape, dy_shape, fmt=np.float32):
    """Random parameters (normal, `scale`), input and output gradient for `kind`, drawn in
    that order from `seed` and rounded to `fmt`, held as float64 (exact in `fmt`)."""
    rng = np.random.default_rng(seed)
    exact = lambda a: a.astype(fmt).astype(np.float64)  # noqa: E731
    params = {k: exact(rng.normal(scale=scale, size=s))
              for k, s in tpcheck.layer_parameters(kind, opts).items()}
    return params, exact(rng.normal(size=x_shape)), exact(rng.normal(size=dy_shape))


@pytest.mark.parametrize("dtype,np_dtype,u", [("float32", np.float32, 2.0**-24),
                                               ("bfloat16", None, 2.0**-8)])
def test_layer_run_computes_in_the_dtype_asked_and_stays_near_the_truth(dtype, np_dtype, u):
    """layer_run is the suite's layer in the caller's precision: every value it returns is
    one of that format's (the run did not stay in float64), and its error against
    layer_truth on the same parameters is rounding-sized, not zero and not O(1)."""
    import ml_dtypes
    fmt = np_dtype or ml_dtypes.bfloat16
    opts = {"hidden_size": 16, "ffn_hidden_size": 24}
    params, x, dy = _layer_case("LayerNormMLP", opts, 11, 0.3, (12, 16), (12, 16), fmt)
    run = tpcheck.layer_run("LayerNormMLP", opts, params, x, grad_output=dy, dtype=dtype,
                            device="cpu", tf32=False)
    truth = tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output=dy)
    assert isinstance(run, tpcheck.LayerRun) and run.dtype == {"float32": "f32"}.get(dtype, "bf16")
    assert sorted(run.tensors()) == sorted(truth.tensors())
    for k, v in run.tensors().items():
        assert v.dtype == np.float64 and np.array_equal(v.astype(fmt).astype(np.float64), v), k
        err = rel_norm(v, truth.tensors()[k])
        # K <= 24 (fc2's reduction; the weight gradients sum 12 tokens): sqrt(K) u = 4.9 u;
        # worst 3.6 u (f32) and 1.6 u (bf16) on seed 5 (calibration), 2.6 u and 0.9 u on
        # seed 11 (this test)
        assert 0 < err < 20 * u, (k, err)


def test_layer_run_with_tf32_rounds_its_float32_gemms_to_tf32():
    """tf32=True puts the float32 GEMMs in the TF32 class (on the CPU: their operands rounded
    to TF32's 10-bit mantissa), as TE's float32 GEMMs run: the worst tensor's error against
    the truth grows from float32's to TF32's (u = 2^-11). Seed 5 (calibration): worst
    2.2e-7 without, 7.6e-4 = 1.5 u with, 3500x; seed 11 (this test): 1.6e-7, 4.3e-4, 2750x."""
    opts = {"hidden_size": 16, "ffn_hidden_size": 24}
    params, x, dy = _layer_case("LayerNormMLP", opts, 11, 0.3, (12, 16), (12, 16))
    truth = tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output=dy).tensors()
    worst = {}
    for tf32 in (False, True):
        run = tpcheck.layer_run("LayerNormMLP", opts, params, x, grad_output=dy, dtype="float32",
                                device="cpu", tf32=tf32)
        assert run.tf32 == tf32
        worst[tf32] = max(rel_norm(v, truth[k]) for k, v in run.tensors().items())
    assert worst[True] > 100 * worst[False], worst
    assert worst[True] < 20 * 2.0**-11, worst


@pytest.mark.parametrize("kind,opts,shape", [
    ("LayerNormMLP", {"hidden_size": 16, "ffn_hidden_size": 24, "set_parallel_mode": True,
                      "sequence_parallel": True, "activation": "swiglu"}, (8, 2, 16)),
    ("Linear", {"in_features": 16, "out_features": 24, "parallel_mode": "column"}, (8, 2, 16)),
    ("Linear", {"in_features": 16, "out_features": 24, "parallel_mode": "row"}, (8, 2, 16)),
    ("TransformerLayer", {"hidden_size": 16, "ffn_hidden_size": 24, "num_attention_heads": 4,
                          "set_parallel_mode": True}, (8, 2, 16)),
])
def test_layer_run_sharded_gives_the_full_tensors(kind, opts, shape):
    """tp_size=N runs the layer in the suite's group of N thread ranks, each on its shards
    of the full parameters, input and output gradient, and reassembles full tensors: same
    shapes as the unsharded run, within float32 rounding of the truth (a shard put back in
    the wrong place is an O(1) error), and not all bitwise the unsharded run's (it really
    ran sharded). Worst: 7.2 u on seed 5 (calibration), 6.1 u on seed 13 (this test)."""
    params, x, dy = _layer_case(kind, opts, 13, 0.3, shape,
                                shape[:-1] + (opts.get("out_features", 16),))
    one = tpcheck.layer_run(kind, opts, params, x, grad_output=dy, dtype="float32", device="cpu",
                            tf32=False).tensors()
    truth = tpcheck.layer_truth(kind, opts, params, x, grad_output=dy).tensors()
    # a gradient zero in exact arithmetic (the attention's key bias) is measured against the
    # input gradient's norm, as in test_truth_matches_jax
    floor = np.linalg.norm(truth["input"])
    for n in (2, 4):
        many = tpcheck.layer_run(kind, opts, params, x, grad_output=dy, dtype="float32",
                                 device="cpu", tf32=False, tp_size=n).tensors()
        assert sorted(many) == sorted(one)
        for k, v in many.items():
            assert v.shape == one[k].shape, (n, k)
            ref = np.linalg.norm(truth[k])
            err = np.linalg.norm(v - truth[k]) / (ref if ref > 1e-6 * floor else floor)
            assert err < 20 * 2.0**-24, (n, k, err)
        assert not all(np.array_equal(many[k], one[k]) for k in one), n
    with pytest.raises(tpcheck.InputError, match="tp_size 0; expected an int >= 1"):
        tpcheck.layer_run(kind, opts, params, x, dtype="float32", device="cpu", tp_size=0)


def test_layer_run_with_a_recipe_quantizes_its_gemms():
    """recipe= quantizes every Linear GEMM as one step of `tpcheck run --recipe` does: the
    error against the truth grows from float32's to the format's (E4M3, u = 2^-4; the
    relative RMS of fc1's weight gradient, a reduction over 32 tokens of quantized
    operands). Seed 5 (calibration): fp8 7.4e-2, fp8_cs 7.7e-2 against 1.9e-7
    unquantized; seed 17 (this test): 8.7e-2, 8.2e-2, 2.2e-7."""
    opts = {"hidden_size": 64, "ffn_hidden_size": 128}
    params, x, dy = _layer_case("LayerNormMLP", opts, 17, 0.1, (32, 64), (32, 64))
    truth = tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output=dy).grads
    err = {}
    for recipe in (None, "fp8", "fp8_cs"):
        g = tpcheck.layer_run("LayerNormMLP", opts, params, x, grad_output=dy, dtype="float32",
                              device="cpu", tf32=False, recipe=recipe).grads
        err[recipe] = rel_norm(g["fc1_weight"], truth["fc1_weight"])
    for recipe in ("fp8", "fp8_cs"):
        assert 1e4 * err[None] < err[recipe] < 0.5, err
    with pytest.raises(tpcheck.InputError, match="fp8_block_scaling quantizes the last "
                                                 "dimension 64, which is not a multiple of 128"):
        tpcheck.layer_run("LayerNormMLP", opts, params, x, dtype="float32", device="cpu",
                          recipe="fp8_block_scaling")
    with pytest.raises(tpcheck.InputError, match="fp9"):
        tpcheck.layer_run("LayerNormMLP", opts, params, x, dtype="float32", device="cpu",
                          recipe="fp9")


def test_layer_run_refuses_what_it_does_not_run():
    opts = {"hidden_size": 8, "ffn_hidden_size": 4}
    params = {k: np.zeros(s) for k, s in tpcheck.layer_parameters("LayerNormMLP", opts).items()}
    with pytest.raises(tpcheck.InputError, match="dtype 'float64'; expected float32, bfloat16 or "
                                                 "float16 \\(the float64 run is layer_truth\\)"):
        tpcheck.layer_run("LayerNormMLP", opts, params, np.zeros((3, 8)), dtype="float64")
    with pytest.raises(tpcheck.InputError, match="int8"):
        tpcheck.layer_run("LayerNormMLP", opts, params, np.zeros((3, 8)), dtype="int8")


def test_truth_forward_only_and_layer_parameters():
    opts = {"hidden_size": 8, "ffn_hidden_size": 4}
    specs = tpcheck.layer_parameters("LayerNormMLP", opts)
    assert specs == {name: tuple(s) for name, s in jl.parameter_specs("LayerNormMLP", opts)}
    rng = np.random.default_rng(7)
    params = {k: rng.normal(size=s) for k, s in specs.items()}
    t = tpcheck.layer_truth("LayerNormMLP", opts, params, rng.normal(size=(3, 8)))
    assert t.grads == {} and t.input_grads == {} and t.output.shape == (3, 8)


def test_truth_errors_list_expected_and_given():
    opts = {"hidden_size": 8, "ffn_hidden_size": 4}
    specs = tpcheck.layer_parameters("LayerNormMLP", opts)
    params = {k: np.zeros(s) for k, s in specs.items()}
    x = np.zeros((3, 8))
    bad = dict(params)
    del bad["fc2_bias"]
    bad["fc3_weight"] = np.zeros((2, 2))
    bad["fc1_weight"] = np.zeros((8, 4))
    with pytest.raises(ValueError) as e:
        tpcheck.layer_truth("LayerNormMLP", opts, bad, x)
    msg = str(e.value)
    assert "missing: fc2_bias" in msg and "unexpected: fc3_weight" in msg
    assert "fc1_weight expected [4, 8] given [8, 4]" in msg
    assert "expected: layer_norm_weight [8], layer_norm_bias [8], fc1_weight [4, 8]" in msg
    with pytest.raises(ValueError, match="unknown|not a known|ffn_hiden_size"):
        tpcheck.layer_truth("LayerNormMLP", {**opts, "ffn_hiden_size": 4}, params, x)
    with pytest.raises(ValueError, match="Transformer"):
        tpcheck.layer_truth("Transformer", opts, params, x)
    with pytest.raises(ValueError, match="grad_output 'bias' given, but the layer returns only output"):
        tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output={"bias": np.zeros(8)})
    with pytest.raises(ValueError, match=r"grad_output 'output' has shape \[3, 7\]"):
        tpcheck.layer_truth("LayerNormMLP", opts, params, x, grad_output=np.zeros((3, 7)))
    with pytest.raises(ValueError, match="device 'tpu'"):
        tpcheck.layer_truth("LayerNormMLP", opts, params, x, device="tpu")
    with pytest.raises(TypeError, match=r"params\['fc1_weight'\]: dtype int64"):
        tpcheck.layer_truth("LayerNormMLP", opts, {**params, "fc1_weight": np.zeros((4, 8), np.int64)}, x)


# ---- the suite from Python -------------------------------------------------------------------

FILTER = "^Linear.column.sp0.default$"


def test_run_returns_the_cli_report(tmp_path):
    report = tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER)
    assert report["schema"] == "tpcheck.run/1"
    assert [c["id"] for c in report["cases"]] == ["Linear.column.sp0.default"]
    cli = os.environ.get("TPCHECK_CLI")
    assert cli, "ctest sets TPCHECK_CLI"
    out = tmp_path / "r.json"
    subprocess.run([cli, "run", "--suite", "te", "--tp", "2", "--backend", "cpu", "--filter", FILTER,
                    "--json", str(out)], check=True, capture_output=True)
    want = json.loads(out.read_text())

    def strip(r):  # timings and the date differ from run to run
        r = json.loads(json.dumps(r))
        for c in r["cases"]:
            c.pop("seconds", None)
        r["environment"].pop("date", None)
        return r

    assert strip(report) == strip(want)
    path = tmp_path / "py.json"
    tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER, json=str(path))
    assert strip(json.loads(path.read_text())) == strip(want)


def test_the_run_report_speaks_the_result_protocol():
    report = tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER)
    assert isinstance(report, tpcheck.RunReport) and isinstance(report, dict)
    assert report.passed and bool(report) and report.failures == []
    assert report.assert_ok() is report
    assert report.to_dict() == dict(report) and json.loads(report.to_json()) == json.loads(json.dumps(report))
    bad = tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER, mutate="shard-off-by-one")
    assert not bad.passed and [f["name"] for f in bad.failures] == ["Linear.column.sp0.default"]
    with pytest.raises(tpcheck.CheckFailed, match=r"1 of 1 cases fail truth: Linear.column.sp0.default: "):
        bad.assert_ok()


def test_run_keywords_are_the_cli_run_options():
    # tpcheck.run(**options) takes exactly `tpcheck run`'s options with the command line's
    # defaults (both come from include/tpcheck/run_options.h's table; this compares what
    # each side shows: `tpcheck run --help` and run's signature), plus Python's `echo`.
    cli = os.environ.get("TPCHECK_CLI")
    assert cli, "ctest sets TPCHECK_CLI"
    shown = subprocess.run([cli, "run", "--help"], check=True, capture_output=True,
                           text=True).stdout
    flags = {}  # keyword -> the default --help shows (CLI11: "--tp INT=4"; None: none)
    for m in re.finditer(r"^ +--([a-z][a-z0-9-]*)(?: ([^ =]+)(?:=(\S+))?)?", shown, re.M):
        flags[m.group(1).replace("-", "_")] = m.group(3)
    assert {"backend", "suite", "steps", "json", "html", "quiet", "filter"} <= set(flags), shown
    params = dict(inspect.signature(tpcheck.run).parameters)
    echo = params.pop("echo")
    assert echo.default is False
    assert set(params) == set(flags)
    for name, p in params.items():
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
        if p.default is None or p.default is False or p.default == "":
            assert flags[name] is None, (name, p.default, flags[name])
        else:
            assert flags[name] == str(p.default), (name, p.default, flags[name])
    # the program's defaults: the full suite, no html
    assert params["suite"].default == "full" and params["html"].default is None
    assert params["steps"].default == 1 and params["quiet"].default is False
    with pytest.raises(TypeError, match="no_such_option"):
        tpcheck.run(no_such_option=1)


def test_run_with_a_recipe():
    # fp8_cs at its reference sizes (seq 16, batch 16, hidden 64): the report names the
    # recipe, the sharded GEMMs are FP8 in the ledger, truth passes.
    report = tpcheck.run(suite="te", tp=2, backend="cpu", filter="^Linear.column.sp0.default$",
                         recipe="fp8_cs")
    assert report["environment"]["recipe"] == "fp8_cs"
    case = report["cases"][0]
    assert case["verdicts"]["truth"]["status"] == "pass"
    assert case["input_shape"] == [16, 64]
    with pytest.raises(ValueError, match="unknown recipe|recipe 'fp9'|fp9"):
        tpcheck.run(suite="te", tp=2, backend="cpu", recipe="fp9")


def test_run_with_steps_forwards_them(tmp_path):
    # steps=2 is `--steps 2`: the same report as the program's, every step in it.
    report = tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER, steps=2)
    assert report["environment"]["steps"] == 2
    case = report["cases"][0]
    assert [s["step"] for s in case["steps"]] == [1, 2]
    out = tmp_path / "cli.json"
    subprocess.run([os.environ["TPCHECK_CLI"], "run", "--suite", "te", "--tp", "2", "--backend",
                    "cpu", "--filter", FILTER, "--steps", "2", "--json", str(out)], check=True,
                   capture_output=True)
    want = json.loads(out.read_text())
    assert case["steps"] == want["cases"][0]["steps"]
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"--steps '{bad}'"):
            tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER, steps=bad)
    for bad in (1.5, "2", True):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            tpcheck.run(suite="te", tp=2, backend="cpu", filter=FILTER, steps=bad)


def test_run_and_main_errors():
    # --attention: checked like the CLI's (fused is the GPU's; unknown values named).
    with pytest.raises(ValueError, match="--attention fused"):
        tpcheck.run(suite="te", tp=2, backend="cpu", attention="fused")
    with pytest.raises(ValueError, match="--attention 'flash'"):
        tpcheck.run(suite="te", tp=2, backend="cpu", attention="flash")
    with pytest.raises(ValueError, match="--tp must be between 1 and 64, got 0"):
        tpcheck.run(tp=0, backend="cpu")
    with pytest.raises(ValueError, match="unknown suite|suite 'nope'"):
        tpcheck.run(suite="nope", tp=2, backend="cpu")
    with pytest.raises(ValueError, match="matches none"):
        tpcheck.run(tp=2, backend="cpu", filter="^nothing$")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "tpcheck", "list", "--suite", "te", "--tp", "2"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "Linear.column.sp0.default" in r.stdout.split()
    r = subprocess.run([sys.executable, "-m", "tpcheck", "run", "--tp", "0"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "--tp must be between 1 and 64" in r.stderr
    r = subprocess.run([sys.executable, "-m", "tpcheck", "run", "--suite", "te", "--tp", "2", "--backend", "cpu",
                        "--filter", FILTER], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed"


def test_type_stubs_ship_with_the_package():
    stub = os.path.join(os.path.dirname(tpcheck._tpcheck.__file__), "_tpcheck.pyi")
    text = open(stub).read()
    for name in ("def compare(", "def run_layer(", "def run(", "def make_nccl_id("):
        assert name in text
    assert os.path.exists(os.path.join(os.path.dirname(tpcheck.__file__), "py.typed"))

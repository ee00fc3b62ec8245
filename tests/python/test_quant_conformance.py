"""Quantization conformance: tpcheck's element formats and recipes (src/core/dtype.cpp,
src/quant) against ml_dtypes and an independent numpy implementation of the formulas
(quant_reference.py), bit for bit; the quantized GEMM against numpy dequantize + matmul.

The C++ side is driven through tests/tools/dtype_table (element casts) and
tests/tools/quant_table (scales, recipes, GEMMs), found through TPCHECK_TOOLS_DIR.
Every comparison is of bit patterns (integer views), so -0, NaN and ties count.
"""

import os
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import quant_reference as ref  # noqa: E402

F32 = np.float32


def _tool(name):
    d = os.environ.get("TPCHECK_TOOLS_DIR")
    if not d:
        pytest.fail("TPCHECK_TOOLS_DIR is not set: it must name the build's tests/ folder "
                    "(ctest sets it; by hand: TPCHECK_TOOLS_DIR=<build>/tests pytest ...)")
    tool = os.path.join(d, name)
    if not os.access(tool, os.X_OK):
        pytest.fail(f"{tool} is missing or not executable (build the {name} target)")
    return tool


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("quant")


def run_tool(name, *args, expect_ok=True):
    r = subprocess.run([_tool(name), *map(str, args)], capture_output=True, text=True)
    if expect_ok:
        assert r.returncode == 0, f"{name} {' '.join(map(str, args))} failed: {r.stderr}"
    return r


def table(tmp, conversion, mode, values, out_dtype):
    inp, out = tmp / "in.bin", tmp / "out.bin"
    np.ascontiguousarray(values).tofile(inp)
    run_tool("dtype_table", conversion, mode, inp, out)
    return np.fromfile(out, dtype=out_dtype)


def qtool(tmp, cmd, kind, values, out_dtype):
    inp, out = tmp / "qin.bin", tmp / "qout.bin"
    np.ascontiguousarray(values).tofile(inp)
    run_tool("quant_table", cmd, kind, inp, out)
    return np.fromfile(out, dtype=out_dtype)


def assert_same_bits(got, want, inputs, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    gb = got.view(np.uint32) if got.dtype == np.float32 else got
    wb = want.view(np.uint32) if want.dtype == np.float32 else want
    bad = np.flatnonzero(gb.ravel() != wb.ravel())
    if bad.size:
        flat = np.asarray(inputs).reshape(-1) if np.size(inputs) == got.size else None
        lines = [f"  [{i}] input {flat[i] if flat is not None else '?'!r}: got "
                 f"{got.ravel()[i]!r}, want {want.ravel()[i]!r}" for i in bad[:10]]
        pytest.fail(f"{what}: {bad.size} of {got.size} differ\n" + "\n".join(lines))


def quiet_astype(x, t):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return x.astype(t)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(20261130)


def f32_inputs(rng, lo_exp, hi_exp):
    """>= 10^6 f32 values: random bit patterns, random values over [2^lo, 2^hi] with full
    mantissas, both signs, ties (midpoints of the format), specials and NaNs."""
    parts = [rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(F32)]
    e = rng.integers(lo_exp, hi_exp, 600_000)
    parts.append(quiet_astype(np.where(rng.integers(0, 2, e.size) == 1, -1.0, 1.0)
                              * np.ldexp(rng.uniform(1.0, 2.0, e.size), e), F32))
    # f32 subnormals
    parts.append(rng.integers(1, 2**23, 100_000, dtype=np.uint64).astype(np.uint32).view(F32))
    f = np.finfo(F32)
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, f.max, -f.max,
                           f.tiny, f.smallest_subnormal, 1.0, -1.0], F32))
    return np.concatenate(parts)


# --- element formats: f4e2m1 and f8e8m0 against ml_dtypes ---------------------------------

NEW = {"f4e2m1": ml_dtypes.float4_e2m1fn, "f8e8m0": ml_dtypes.float8_e8m0fnu}


@pytest.mark.parametrize("name", list(NEW))
def test_every_pattern_decodes_like_ml_dtypes(tmp, name):
    n = 16 if name == "f4e2m1" else 256
    patterns = np.arange(n, dtype=np.uint8)
    got = table(tmp, f"{name}_to_f32", "-", patterns, np.uint32)
    want = patterns.view(NEW[name]).astype(F32).view(np.uint32)
    assert_same_bits(got, want, patterns, f"{name} -> f32")


@pytest.mark.parametrize("name", list(NEW))
def test_f32_encode_matches_ml_dtypes(tmp, rng, name):
    x = f32_inputs(rng, -4, 4) if name == "f4e2m1" else f32_inputs(rng, -130, 129)
    if name == "f4e2m1":
        # every tie of the format, and its f32 neighbours
        vals = np.arange(8, dtype=np.uint8).view(NEW[name]).astype(np.float64)
        mids = ((vals[:-1] + vals[1:]) / 2).astype(F32)
        extra = np.concatenate([mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(9)),
                                np.array([5.0, 7.0, 6.5, 1e30], F32)])
    else:
        e = np.arange(-127, 128)
        pw = np.ldexp(1.0, e)
        extra = np.concatenate([pw, 1.5 * pw, 0.75 * pw]).astype(F32)
        extra = np.concatenate([extra, np.nextafter(extra, F32(0)), np.nextafter(extra, F32(np.inf))])
    x = np.concatenate([x, extra, -extra])
    assert x.size >= 1_000_000
    want = quiet_astype(x, NEW[name]).view(np.uint8)
    got = table(tmp, f"f32_to_{name}", "plain", x, np.uint8)
    assert_same_bits(got, want, x, f"f32 -> {name} plain ({x.size} values)")
    # Saturating: finite inputs whose plain result is not finite become max finite (no
    # sign in e8m0; f4e2m1 saturates in both modes).
    sat_want = want.copy()
    if name == "f8e8m0":
        over = np.isfinite(x) & (x > 0) & (want == 0xFF)
        assert over.any()
        sat_want[over] = 0xFE
    got = table(tmp, f"f32_to_{name}", "saturate", x, np.uint8)
    assert_same_bits(got, sat_want, x, f"f32 -> {name} saturate")


def test_f4e2m1_ties_go_both_ways(tmp):
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)  # every tie between values
    got = table(tmp, "f32_to_f4e2m1", "plain", x, np.uint8)
    assert got.tolist() == [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6]  # to the even pattern


# --- the saturating cast quantization uses ---------------------------------------------------


@pytest.mark.parametrize("fmt", ["f8e4m3", "f8e5m2", "f4e2m1"])
def test_cast_satfinite(tmp, rng, fmt):
    x = f32_inputs(rng, -20, 20)
    got = qtool(tmp, "cast", fmt, x, np.uint8)
    want = ref.sat_cast(x, fmt)
    ok = ~np.isnan(x) if fmt == "f4e2m1" else np.ones(x.size, bool)  # f4e2m1 has no NaN
    assert_same_bits(got[ok], want[ok], x[ok], f"cast_satfinite {fmt}")
    # inf saturates to max finite (not NaN, as dtype.h's kSaturate gives E4M3)
    inf_bits = qtool(tmp, "cast", fmt, np.array([np.inf, -np.inf], F32), np.uint8)
    fmax = np.finfo(F32).max
    assert inf_bits.tolist() == ref.sat_cast(np.array([fmax, -fmax], F32), fmt).tolist()


# --- scales ------------------------------------------------------------------------------------


def amax_inputs(rng):
    f = np.finfo(F32)
    special = np.array([0.0, np.inf, np.nan, f.max, f.tiny, f.smallest_subnormal, 1e-40, 1e-38,
                        448.0, 57344.0, 1.0, 3.0, 2688.0, 1e-30, 1e30, 2.0**-127, 2.0**127],
                       F32)
    e = rng.integers(-149, 128, 20_000)
    rand = np.ldexp(rng.uniform(1, 2, e.size), e).astype(F32)
    pw = np.ldexp(1.0, np.arange(-149, 128)).astype(F32)
    exact_mx = (448.0 * np.ldexp(1.0, np.arange(-120, 100))).astype(F32)  # amax · fl(1/448)
    return np.concatenate([special, rand, pw, exact_mx, np.nextafter(pw, F32(0))])


@pytest.mark.parametrize("kind,fn,out", [
    ("fp8_current_f8e4m3", lambda a: ref.fp8_current_scale(a, "f8e4m3"), F32),
    ("fp8_current_f8e5m2", lambda a: ref.fp8_current_scale(a, "f8e5m2"), F32),
    ("fp8_block", ref.fp8_block_scale, F32),
    ("mxfp8", ref.mxfp8_scale_exponent, np.uint8),
    ("e8m0_round_up", ref.e8m0_round_up, np.uint8),
    ("nvfp4_global", ref.nvfp4_global_encode_scale, F32),
])
def test_scale_from_amax(tmp, rng, kind, fn, out):
    a = amax_inputs(rng)
    got = qtool(tmp, "scale", kind, a, out)
    want = np.array([fn(v) for v in a], dtype=out)
    assert_same_bits(got, want, a, kind)


def test_scale_special_cases(tmp):
    """The documented special cases, spelled out (the reference agrees, see above)."""
    f = np.finfo(F32)
    a = np.array([0.0, np.inf, np.nan, f.smallest_subnormal], F32)
    cs = qtool(tmp, "scale", "fp8_current_f8e4m3", a, F32)
    assert cs.tolist() == [1.0, 1.0, 1.0, f.max]  # 0 / inf / NaN → 1; overflow → FLT_MAX
    assert qtool(tmp, "scale", "fp8_block", a, F32).tolist() == [1.0, 1.0, 1.0, 2.0**127]
    e = qtool(tmp, "scale", "e8m0_round_up",
              np.array([np.nan, np.inf, 0.0, 1.0, 1.5, 2.0**-127, 2.0**-126, 2.0**127, f.max],
                       F32), np.uint8)
    assert e.tolist() == [0xFF, 0xFE, 0x00, 127, 128, 0, 1, 254, 254]
    g = qtool(tmp, "scale", "nvfp4_global", a, F32)
    assert g[0] == 1.0 and g[1] == 1.0 and g[3] == f.max


def test_scale_reciprocal_and_e8m0_reciprocal(tmp, rng):
    s = np.concatenate([amax_inputs(rng), np.array([3.0, 7.0, 1e-3], F32)])
    got = qtool(tmp, "scale", "scale_reciprocal", s, F32)
    assert_same_bits(got, np.array([ref.reciprocal(v) for v in s], F32), s, "1/scale")
    b = np.arange(256, dtype=np.uint8)
    got = qtool(tmp, "scale", "e8m0_reciprocal", b, F32)
    assert_same_bits(got, np.array([ref.e8m0_reciprocal(v) for v in b], F32), b, "2^(127-e)")


def test_nvfp4_block_scale_factor_alpha(tmp, rng):
    a = amax_inputs(rng)[:4000]
    s_enc = np.array([ref.nvfp4_global_encode_scale(v) for v in rng.permutation(a)], F32)
    pairs = np.stack([a, s_enc], 1).astype(F32)
    # a block amax far below the tensor's: the decode scale rounds to 0
    pairs = np.concatenate([pairs, np.array([[1e-6, ref.nvfp4_global_encode_scale(1e4)]], F32)])
    got = qtool(tmp, "scale", "nvfp4_block", pairs, np.uint8)
    want = np.array([ref.nvfp4_block_decode_scale(x, y) for x, y in pairs], np.uint8)
    assert_same_bits(got, want, pairs[:, 0], "nvfp4 block decode scale")
    assert got[-1] == 0, "the tiny block's decode scale should round to 0"

    sb = ref.decode(want, "f8e4m3")
    pairs2 = np.stack([sb, pairs[:, 1]], 1).astype(F32)
    ok = ~np.isnan(sb)
    got = qtool(tmp, "scale", "nvfp4_factor", pairs2[ok], F32)
    want = np.array([ref.nvfp4_encode_factor(b, y) for b, y in zip(want[ok], pairs2[ok, 1])], F32)
    assert_same_bits(got, want, pairs2[ok, 0], "nvfp4 encode factor")
    assert got[-1] == np.finfo(F32).max  # 1 / 0 → FLT_MAX

    got = qtool(tmp, "scale", "nvfp4_alpha", pairs, F32)
    want = np.array([ref.nvfp4_gemm_alpha(x, y) for x, y in pairs], F32)
    assert_same_bits(got, want, pairs[:, 0], "nvfp4 alpha")


def test_delayed_scaling_history(tmp, rng):
    # 80 steps: a peak that leaves the 32-step window, zeros and an inf that keep the scale.
    amax = np.abs(rng.normal(0, 3, 80)).astype(F32)
    amax[5] = 1000.0
    amax[40:43] = 0.0
    amax[60] = np.inf
    for fmt in ("f8e4m3", "f8e5m2"):
        got = qtool(tmp, "delayed", fmt, amax, F32)
        want = ref.delayed_scales(amax, fmt)
        assert_same_bits(got, want, amax, f"delayed scaling {fmt}")
        assert got[0] == 1.0 and got[1] == F32(ref.FORMATS[fmt][1]) / amax[0]
        assert got[6] == F32(ref.FORMATS[fmt][1]) / F32(1000.0)  # the peak rules
        assert got[38] != got[6]  # ... until it leaves the window (step 5 + 32)


# --- recipes: every byte ---------------------------------------------------------------------

RECIPES = [("fp8", "input"), ("fp8", "grad_output"), ("fp8_cs", "input"),
           ("fp8_cs", "grad_output"), ("fp8_block_scaling", "input"),
           ("fp8_block_scaling", "weight"), ("mxfp8", "input"), ("nvfp4", "input")]


def matrix_with_edges(rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-6, 6, (rows, 1)))).astype(F32)
    x[0, :32] = 0.0  # an all-zero block (amax 0)
    x[1, :16] = 1e-6  # a tiny block next to large ones (NVFP4 scale rounds to 0)
    x[2, 0] = 1e4
    x[3, :32] = np.ldexp(1.0, np.arange(32) - 10)  # exact powers of two (E8M0 edges)
    x[4, 5] = 448.0 * 2.0**-3
    x[5, :] = np.where(np.arange(cols) % 2 == 0, 0.25, 0.75)  # ties after scaling
    return x


def compare_quantized(tmp, x, recipe, role, amax=None, scale=None):
    rows, cols = x.shape
    inp = tmp / "x.bin"
    x.astype(F32).tofile(inp)
    prefix = str(tmp / "q_")
    args = ["quantize", recipe, role, rows, cols, inp, prefix,
            "-" if amax is None else repr(float(F32(amax)))]
    if scale is not None:
        args.append(repr(float(scale)))
    run_tool("quant_table", *args)
    want = ref.quantize(x, recipe, role, amax_override=amax,
                        delayed_scale=1.0 if scale is None else scale)
    for copy in ("rowwise", "columnwise"):
        data = np.fromfile(prefix + copy + "_data", np.uint8)
        q, sc = want[copy]
        assert_same_bits(data, q.ravel(), None, f"{recipe}/{role} {copy} data")
        sdt = F32 if sc.dtype == F32 else np.uint8
        s = np.fromfile(prefix + copy + "_scale_inv", sdt)
        assert_same_bits(s, sc.ravel().astype(sdt), None, f"{recipe}/{role} {copy} scale_inv")
    got_amax = np.fromfile(prefix + "amax", F32)
    assert_same_bits(got_amax, np.array([want["amax"]], F32), None, "amax")
    return want


@pytest.mark.parametrize("recipe,role", RECIPES)
def test_recipe_bytes(tmp, rng, recipe, role):
    rows, cols = (256, 256) if role == "weight" else (128, 256)
    x = matrix_with_edges(rng, rows, cols)
    scale = 3.0 if recipe == "fp8" else None
    want = compare_quantized(tmp, x, recipe, role, scale=scale)
    if recipe == "nvfp4":
        sb = want["rowwise"][1]
        assert (sb[1, 0] == 0), "row 1's first block should have a zero decode scale"


@pytest.mark.parametrize("recipe", ["fp8_cs", "nvfp4"])
@pytest.mark.parametrize("amax", [0.0, np.inf, np.nan, 1e-40, 123.5])
def test_given_amax(tmp, rng, recipe, amax):
    """The amax after a reduction across the group, including 0 / inf / NaN and one so
    small that the scale overflows."""
    x = matrix_with_edges(rng, 32, 64)
    compare_quantized(tmp, x, recipe, "input", amax=amax)


def test_bf16_input_is_exact(tmp, rng):
    """bf16 values pass to f32 exactly; the result equals quantizing their f32 value."""
    x = rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16).astype(F32)
    compare_quantized(tmp, x, "mxfp8", "input")


# --- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe,role,rows,cols,needle", [
    ("fp8_cs", "input", 32, 24, "last dimension 24, which is not a multiple of 16"),
    ("fp8", "input", 24, 32, "24 rows"),
    ("fp8_block_scaling", "input", 128, 64, "64, which is not a multiple of 128"),
    ("fp8_block_scaling", "weight", 64, 128, "64 rows"),
    ("mxfp8", "input", 32, 48, "48, which is not a multiple of 32"),
    ("nvfp4", "input", 8, 32, "8 rows"),
])
def test_unquantizable_shapes_are_input_errors(tmp, recipe, role, rows, cols, needle):
    inp = tmp / "bad.bin"
    np.zeros(rows * cols, F32).tofile(inp)
    r = run_tool("quant_table", "quantize", recipe, role, rows, cols, inp, str(tmp / "b_"),
                 expect_ok=False)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and recipe in r.stderr, r.stderr


# --- quantized GEMM ---------------------------------------------------------------------------

GEMMS = [  # (recipe, role_a, role_b)
    ("fp8", "input", "weight"), ("fp8_cs", "grad_output", "weight"),
    ("fp8_block_scaling", "input", "weight"), ("fp8_block_scaling", "grad_output", "input"),
    ("mxfp8", "input", "weight"), ("nvfp4", "input", "weight"),
]


@pytest.mark.parametrize("recipe,role_a,role_b", GEMMS)
@pytest.mark.parametrize("trans_a,trans_b", [(0, 1), (0, 0), (1, 0)])  # fprop, dgrad, wgrad
def test_quantized_gemm_against_numpy(tmp, rng, recipe, role_a, role_b, trans_a, trans_b):
    m, n, k = 128, 256, 384
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    a = rng.standard_normal(a_shape).astype(F32)
    b = (rng.standard_normal(b_shape) * 0.05).astype(F32)
    a.tofile(tmp / "a.bin")
    b.tofile(tmp / "b.bin")
    run_tool("quant_table", "gemm", recipe, role_a, trans_a, *a_shape, role_b, trans_b, *b_shape,
             tmp / "a.bin", tmp / "b.bin", tmp / "c.bin", tmp / "cls.txt")
    got = np.fromfile(tmp / "c.bin", F32).reshape(m, n).astype(np.float64)
    assert (tmp / "cls.txt").read_text() == {"fp8": "fp8", "fp8_cs": "fp8",
                                             "fp8_block_scaling": "fp8_block",
                                             "mxfp8": "mxfp8", "nvfp4": "nvfp4"}[recipe]
    # The copy each operand uses (rowwise when its blocks run along k), in [rows, k] form.
    va, fa, qa = ref.dequantized_operand(a, recipe, role_a, columnwise=bool(trans_a))
    vb, fb, qb = ref.dequantized_operand(b, recipe, role_b, columnwise=not trans_b)
    prod = va @ vb.T  # f64: exact products, nearly exact sums
    if recipe in ("fp8", "fp8_cs"):
        alpha = np.float64(F32(fa) * F32(fb))
    elif recipe == "nvfp4":
        alpha = np.float64(ref.nvfp4_gemm_alpha(qa["global_amax"], qb["global_amax"]))
    else:
        alpha = 1.0
    want = alpha * prod
    # f32 accumulation of k exact products (any order) and one f32 scaling: the standard
    # bound |err| <= (k + 1) u Σ|a_i b_i| |alpha|, u = 2^-24.
    bound = (k + 1) * 2.0**-24 * (np.abs(va) @ np.abs(vb).T) * abs(alpha) + 1e-45
    err = np.abs(got - want)
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"
    # Not vacuous: the quantization error itself is far above that bound.
    ha = a.T if trans_a else a
    hb = b.T if trans_b else b
    exact = ha.astype(np.float64) @ hb.astype(np.float64)
    assert np.max(np.abs(exact - want)) > 100 * np.max(bound)


def test_quantized_gemm_exact_on_small_integers(tmp, rng):
    """With integer data whose f32 sums are exact, the GEMM is bit-exact with numpy."""
    m, n, k = 32, 32, 64
    a = rng.integers(-8, 9, (m, k)).astype(F32)
    b = rng.integers(-8, 9, (n, k)).astype(F32)
    a.tofile(tmp / "a.bin")
    b.tofile(tmp / "b.bin")
    run_tool("quant_table", "gemm", "mxfp8", "input", 0, m, k, "weight", 1, n, k, tmp / "a.bin",
             tmp / "b.bin", tmp / "c.bin")
    got = np.fromfile(tmp / "c.bin", F32).reshape(m, n)
    va, _, _ = ref.dequantized_operand(a, "mxfp8", "input", False)
    vb, _, _ = ref.dequantized_operand(b, "mxfp8", "weight", False)
    assert np.array_equal(va, a) and np.array_equal(vb, b)  # |x| <= 8: exact in E4M3
    assert_same_bits(got, (va @ vb.T).astype(F32), None, "mxfp8 integer GEMM")

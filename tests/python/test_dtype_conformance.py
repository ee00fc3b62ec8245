"""Number-format conformance: tpcheck's conversions against ml_dtypes, bit for bit.

tpcheck's conversions (src/core/dtype.cpp) are driven through the `dtype_table` helper
program (tests/tools/dtype_table.cpp), which ctest points to with TPCHECK_TOOLS_DIR.
Expected results always come from outside tpcheck:

* ml_dtypes (bfloat16, float8_e4m3fn, float8_e5m2) and numpy (float16, which ml_dtypes
  does not define) for every decode and every f32 -> narrow cast;
* the saturating cast: the plain ml_dtypes cast, then finite inputs whose result is not
  finite are clamped to +-max finite (bits of ml_dtypes' own max);
* f64 -> narrow: tpcheck promises one rounding. The expectation is an exact
  single-rounding reference built here from ml_dtypes' table of representable values
  (nearest, ties to the even bit pattern), itself checked against ml_dtypes on every f32
  input; the inputs hold double-rounding traps (values that f64 -> f32 -> narrow would
  round elsewhere). ml_dtypes >= 0.7 also rounds f64 once (0.6 converted through float32)
  and must agree everywhere; numpy's float64 -> float16 cast rounds once, and is compared
  directly;
* TF32: jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10) on f32 (round to
  nearest even), plus a numpy bit-manipulation reference for truncation (and nearest);
* f64 -> f32: numpy's float64 -> float32 cast (one rounding, ties to even).

Every comparison is of bit patterns (integer views), so -0 vs +0 and NaN payloads count.
"""

import os
import subprocess
import warnings

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

# name -> (numpy type, unsigned integer type of the same width)
FORMATS = {
    "f16": (np.float16, np.uint16),
    "bf16": (ml_dtypes.bfloat16, np.uint16),
    "f8e4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
    "f8e5m2": (ml_dtypes.float8_e5m2, np.uint8),
}
NAMES = list(FORMATS)
N_RANDOM_BITS = 350_000  # random f32 bit patterns per format
N_RANDOM_RANGE = 500_000  # random values spread over (and just outside) the format's range
N_RANDOM_SUBNORMAL = 150_000  # near the format's subnormals, and f32 subnormals


def _tools_dir():
    d = os.environ.get("TPCHECK_TOOLS_DIR")
    if not d:
        pytest.fail(
            "TPCHECK_TOOLS_DIR is not set: it must name the build's tests/ folder holding "
            "dtype_table (ctest sets it; by hand: TPCHECK_TOOLS_DIR=<build>/tests pytest ...)"
        )
    tool = os.path.join(d, "dtype_table")
    if not os.access(tool, os.X_OK):
        pytest.fail(f"{tool} is missing or not executable (build the dtype_table target)")
    return tool


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    exe = _tools_dir()
    tmp = tmp_path_factory.mktemp("dtype")

    def run(conversion, mode, values, out_dtype):
        inp, out = tmp / "in.bin", tmp / "out.bin"
        np.ascontiguousarray(values).tofile(inp)
        r = subprocess.run([exe, conversion, mode, str(inp), str(out)], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"dtype_table {conversion} {mode} failed: {r.stderr}"
        got = np.fromfile(out, dtype=out_dtype)
        assert got.size == values.size
        return got

    return run


def quiet_cast(x, dtype):
    """x.astype(dtype) without numpy's overflow / invalid-value warnings."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return x.astype(dtype)


def ml_bits(x, name):
    """The bits ml_dtypes (numpy for f16) gives when casting array x to format `name`."""
    t, u = FORMATS[name]
    return quiet_cast(x, t).view(u)


def assert_same_bits(got, want, inputs, what):
    bad = np.flatnonzero(got != want)
    if bad.size:
        lines = [f"  input {inputs[i]!r} ({inputs[i:i+1].view(_uint_of(inputs)).item():#x}): "
                 f"got {got[i]:#x}, want {want[i]:#x}" for i in bad[:10]]
        pytest.fail(f"{what}: {bad.size} of {got.size} differ\n" + "\n".join(lines))


def _uint_of(a):
    return {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize]


class Table:
    """Every finite non-negative value of a format, in increasing order (which is also
    bit-pattern order), plus a virtual next value above max finite standing for overflow."""

    def __init__(self, name):
        t, u = FORMATS[name]
        self.name = name
        nbits = 8 * np.dtype(u).itemsize
        self.sign = np.uint64(1) << np.uint64(nbits - 1)
        pos = np.arange(int(self.sign), dtype=np.uint64).astype(u)
        vals = quiet_cast(pos.view(t), np.float64)
        keep = np.isfinite(vals)
        self.bits = pos[keep].astype(np.int64)
        self.vals = vals[keep]
        assert np.all(np.diff(self.vals) > 0) and np.all(np.diff(self.bits) == 1)
        self.max_bits = int(self.bits[-1])
        # Bits a plain cast gives on overflow (inf, or NaN for f8e4m3fn), from ml_dtypes.
        self.overflow_bits = int(ml_bits(np.array([np.inf]), name)[0])
        # One past max finite, one top-binade ulp further: the value overflow rounds to.
        top_ulp = self.vals[-1] - self.vals[-2]
        self.ext_vals = np.append(self.vals, self.vals[-1] + top_ulp)
        self.ext_bits = np.append(self.bits, self.max_bits + 1)
        self.u = u

    def round_single(self, x):
        """Round finite-or-inf, non-NaN f64 array x once, ties to even; returns plain-cast
        bits (overflow -> ml_dtypes' overflow pattern)."""
        a = np.abs(x.astype(np.float64))
        n = self.ext_vals.size
        i = np.clip(np.searchsorted(self.ext_vals, a, side="left"), 1, n - 1)
        lo_v, hi_v = self.ext_vals[i - 1], self.ext_vals[i]
        lo_b, hi_b = self.ext_bits[i - 1], self.ext_bits[i]
        mid = (lo_v + hi_v) / 2  # exact: both have far fewer than 52 significant bits
        pick_hi = (a > mid) | ((a == mid) & (hi_b % 2 == 0))
        b = np.where(a <= lo_v, lo_b, np.where(pick_hi, hi_b, lo_b))
        b = np.where(a > self.ext_vals[-1], self.max_bits + 1, b)  # beyond everything
        b = np.where(b > self.max_bits, self.overflow_bits, b)
        b = b.astype(np.uint64) | np.where(np.signbit(x), self.sign, np.uint64(0))
        return b.astype(self.u)

    def saturate(self, inputs, plain_bits):
        """The saturating rule applied to plain-cast results: finite inputs whose plain
        result is inf/NaN become +-max finite."""
        t, _ = FORMATS[self.name]
        out_finite = np.isfinite(quiet_cast(plain_bits.view(t), np.float32))
        clamp = np.isfinite(inputs) & ~out_finite
        sat = np.uint64(self.max_bits) | np.where(np.signbit(inputs), self.sign, np.uint64(0))
        return np.where(clamp, sat.astype(self.u), plain_bits)

    def midpoints(self):
        """Exact midpoints of adjacent values (incl. max finite / overflow), as f64."""
        return (self.ext_vals[:-1] + self.ext_vals[1:]) / 2


def with_signs(x):
    return np.concatenate([x, -x])


def f32_inputs(name, rng):
    """>= 10^6 f32 inputs for narrowing to `name`: random bits, random values across the
    format's range and subnormals, f32 subnormals, every exact midpoint with its f32
    neighbours, the representable values themselves, and special values."""
    table = Table(name)
    t, _ = FORMATS[name]
    fi = ml_dtypes.finfo(t)
    m_bits, e_min, e_max = int(fi.nmant), int(fi.minexp), int(fi.maxexp) - 1
    parts = [rng.integers(0, 2**32, N_RANDOM_BITS, dtype=np.uint64).astype(np.uint32)]
    # Random exponents from below the smallest subnormal to above max, full f32 mantissas.
    e = rng.integers(e_min - m_bits - 3, e_max + 3, N_RANDOM_RANGE)
    man = rng.integers(0, 2**23, N_RANDOM_RANGE, dtype=np.uint64)
    biased = e + 127
    normal = biased >= 1
    bits = np.where(normal, (np.clip(biased, 1, 254).astype(np.uint64) << np.uint64(23)) | man,
                    (man | np.uint64(1 << 23)) >> np.minimum(1 - biased, 31).astype(np.uint64))
    sign = rng.integers(0, 2, N_RANDOM_RANGE, dtype=np.uint64) << np.uint64(31)
    parts.append((bits | sign).astype(np.uint32))
    # Uniform over the destination's subnormals and first normal binades.
    sub = rng.uniform(-4 * float(fi.smallest_normal), 4 * float(fi.smallest_normal),
                      N_RANDOM_SUBNORMAL // 2).astype(np.float32)
    parts.append(sub.view(np.uint32))
    # f32 subnormals (source subnormals).
    parts.append((rng.integers(1, 2**23, N_RANDOM_SUBNORMAL // 2, dtype=np.uint64)
                  | (rng.integers(0, 2, N_RANDOM_SUBNORMAL // 2, dtype=np.uint64) << 31))
                 .astype(np.uint32))
    # Exact midpoints and their nearest f32 neighbours on both sides.
    mids = table.midpoints()
    mids32 = mids.astype(np.float32)
    exact = mids32.astype(np.float64) == mids
    # Only the midpoint above bf16's max (2^128 - 2^119, fine) could fail; none should.
    assert exact.all(), f"{name}: midpoints not representable in f32: {mids[~exact][:4]}"
    around = [mids32, np.nextafter(mids32, np.float32(np.inf)),
              np.nextafter(mids32, np.float32(0)), table.vals.astype(np.float32)]
    parts += [with_signs(np.concatenate(around)).view(np.uint32)]
    f32 = np.finfo(np.float32)
    mx = np.float32(fi.max)
    specials = np.array([0.0, np.inf, np.nan, f32.max, f32.smallest_subnormal,
                         f32.smallest_normal, mx, np.nextafter(mx, np.float32(np.inf)),
                         np.nextafter(mx, np.float32(0)), fi.smallest_subnormal,
                         fi.smallest_subnormal / 2, fi.smallest_normal, 1e6, 1e30],
                        dtype=np.float32)
    parts.append(with_signs(specials).view(np.uint32))
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FFFFFFF, 0x7F802000, 0x7FBFFFFF,
                     0x7FC02000, 0x7F801FFF], dtype=np.uint32)
    parts.append(np.concatenate([nans, nans | np.uint32(0x80000000)]))
    x = np.concatenate(parts).view(np.float32)
    return x, table


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(20240611)


# --- narrow -> f32: every bit pattern ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_pattern_decodes_like_ml_dtypes(tool, name):
    t, u = FORMATS[name]
    patterns = np.arange(2 ** (8 * np.dtype(u).itemsize), dtype=np.uint64).astype(u)
    got = tool(f"{name}_to_f32", "-", patterns, np.uint32)
    want = patterns.view(t).astype(np.float32).view(np.uint32)
    assert_same_bits(got, want, patterns, f"{name} -> f32")


# --- f32 -> narrow --------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_f32_to_narrow_matches_ml_dtypes(tool, rng, name):
    x, table = f32_inputs(name, rng)
    assert x.size >= 1_000_000
    want = ml_bits(x, name)
    got = tool(f"f32_to_{name}", "plain", x, table.u)
    assert_same_bits(got, want, x, f"f32 -> {name} plain ({x.size} values)")

    # The single-rounding reference used for f64 inputs agrees with ml_dtypes on f32.
    ok = ~np.isnan(x)
    assert_same_bits(table.round_single(x[ok]), want[ok], x[ok], f"reference f32 -> {name}")

    # Ties were exercised in both directions (to the even neighbour below and above).
    mids = with_signs(table.midpoints().astype(np.float32))
    mb = ml_bits(mids, name)
    a = np.abs(mids.astype(np.float64))
    rounded_up = np.abs(quiet_cast(mb.view(FORMATS[name][0]), np.float64)) > a
    assert rounded_up.any() and (~rounded_up).any(), "ties must go both up and down"

    sat_want = table.saturate(x, want)
    sat_got = tool(f"f32_to_{name}", "saturate", x, table.u)
    assert_same_bits(sat_got, sat_want, x, f"f32 -> {name} saturate")
    assert (sat_want != want).any(), "no input exercised saturation"

    # round_to(dtype, float) is the decoded plain cast.
    # round_to(dtype, float) is the decoded plain cast, bit for bit (NaNs included: the
    # decode of every pattern is checked against ml_dtypes above).
    r = tool(f"f32_round_{name}", "plain", x, np.float32)
    r_want = quiet_cast(want.view(FORMATS[name][0]), np.float32)
    assert_same_bits(r.view(np.uint32), r_want.view(np.uint32), x, f"round_to({name}, float)")


# --- f64 -> narrow --------------------------------------------------------------------


def f64_inputs(name, rng, table):
    t, _ = FORMATS[name]
    fi = ml_dtypes.finfo(t)
    m_bits, e_min, e_max = int(fi.nmant), int(fi.minexp), int(fi.maxexp) - 1
    n = 200_000
    parts = [rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False).view(np.float64)]
    # Random values over the range with full 52-bit mantissas.
    e = rng.integers(e_min - m_bits - 3, e_max + 3, 400_000)
    signs = np.where(rng.integers(0, 2, e.size) == 1, -1.0, 1.0)
    parts.append(signs * np.ldexp(rng.uniform(1.0, 2.0, e.size), e))
    # Double-rounding traps: just above / below every midpoint by far less than half an
    # f32 ulp, so f32 rounds them onto the midpoint, where ties-to-even decides.
    mids = table.midpoints()
    traps = [mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), mids]
    parts.append(with_signs(np.concatenate(traps)))
    parts.append(with_signs(table.vals))
    f64 = np.finfo(np.float64)
    specials = np.array([0.0, np.inf, f64.max, f64.smallest_subnormal, 1e300, 1e-300,
                         float(fi.max), float(fi.smallest_subnormal) / 2,
                         np.nextafter(float(fi.smallest_subnormal) / 2, 1.0)])
    parts.append(with_signs(specials))
    x = np.concatenate(parts)
    return x[~np.isnan(x)]  # NaNs: test_f64_nan_bits


@pytest.mark.parametrize("name", NAMES)
def test_f64_to_narrow_rounds_once(tool, rng, name):
    table = Table(name)
    x = f64_inputs(name, rng, table)
    got = tool(f"f64_to_{name}", "plain", x, table.u)
    want = table.round_single(x)
    assert_same_bits(got, want, x, f"f64 -> {name} plain vs single-rounding reference")

    ml = ml_bits(x, name)
    if name == "f16":
        # numpy's float64 -> float16 rounds once: it must agree everywhere.
        assert_same_bits(got, ml, x, "f64 -> f16 vs numpy")
    else:
        # ml_dtypes >= 0.7 rounds f64 once too (0.6 went through f32): the same bits
        # everywhere, on inputs that contain double-rounding traps (where going through
        # f32 would give other bits), so agreement shows a single rounding.
        assert_same_bits(got, ml, x, f"f64 -> {name} vs ml_dtypes")
        via_f32 = table.round_single(quiet_cast(x, np.float32).astype(np.float64))
        assert (want != via_f32).any(), "the inputs should contain double-rounding cases"

    sat = tool(f"f64_to_{name}", "saturate", x, table.u)
    assert_same_bits(sat, table.saturate(x, want), x, f"f64 -> {name} saturate")

    r = tool(f"f64_round_{name}", "plain", x, np.float64)
    r_want = quiet_cast(want.view(FORMATS[name][0]), np.float64)
    assert_same_bits(r.view(np.uint64), r_want.view(np.uint64), x, f"round_to({name}, double)")


def test_f64_nan_bits(tool):
    # Quiet, signalling and negative NaNs with various payloads.
    nans = np.array([0x7FF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
                     0x7FF0040000000000, 0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000],
                    dtype=np.uint64)
    x = np.concatenate([nans, nans | np.uint64(1 << 63)]).view(np.float64)
    for name in NAMES:
        got = tool(f"f64_to_{name}", "plain", x, FORMATS[name][1])
        # ml_dtypes' bf16/fp8 NaN result is canonical (no payload), so going through
        # f32 does not matter; numpy's float16 cast keeps the top payload bits.
        assert_same_bits(got, ml_bits(x, name), x, f"f64 NaN -> {name}")


def test_f64_to_f32_round_to(tool, rng):
    x = np.concatenate([rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64),
                        with_signs(np.ldexp(rng.uniform(1, 2, 100_000),
                                            rng.integers(-152, 130, 100_000)))])
    x = x[~np.isnan(x)]
    got = tool("f64_round_f32", "plain", x, np.float64)
    want = quiet_cast(quiet_cast(x, np.float32), np.float64)
    assert_same_bits(got.view(np.uint64), want.view(np.uint64), x, "round_to(f32, double)")
    got = tool("f64_round_f32", "saturate", x, np.float64)
    fmax = float(np.finfo(np.float32).max)
    want = np.where(np.isfinite(x) & np.isinf(want), np.copysign(fmax, x), want)
    assert_same_bits(got.view(np.uint64), want.view(np.uint64), x,
                     "round_to(f32, double) saturate")


# --- f64 -> f32: ties ---------------------------------------------------------------------


def f64_f32_tie_inputs(rng):
    """Exact f64 midpoints between adjacent f32 values (lower neighbour with even and odd
    low bits): random normals, random subnormals, the last subnormal / first normal, and
    the top of the range, including the midpoint between FLT_MAX and 2^128."""
    lo = np.concatenate([
        rng.integers(0x00800000, 0x7F7FFFFF, 200_000),  # normals; lo + 1 is finite
        rng.integers(0, 0x00800000, 100_000),  # zero and subnormals
        np.arange(0x7F7FFF00, 0x7F7FFFFF),  # just below FLT_MAX
        np.array([0, 1, 2, 0x007FFFFE, 0x007FFFFF, 0x00800000, 0x7F7FFFFE]),
    ]).astype(np.uint32)
    a = lo.view(np.float32).astype(np.float64)
    b = (lo + np.uint32(1)).view(np.float32).astype(np.float64)
    mids = (a + b) / 2  # exact: 25 significant bits at most
    assert np.all((mids > a) & (mids < b))
    fmax = float(np.finfo(np.float32).max)
    top = fmax + (2.0**128 - fmax) / 2  # tie between FLT_MAX (odd) and 2^128 (inf, even)
    return np.append(mids, top), np.append(lo, np.uint32(0x7F7FFFFF))


def test_f64_to_f32_ties_to_even(tool, rng):
    ties, lo = f64_f32_tie_inputs(rng)
    assert (lo % 2 == 0).any() and (lo % 2 == 1).any(), "both even and odd lower neighbours"
    # The ties themselves, and one f64 ulp either side (which must not round to even).
    x = with_signs(np.concatenate([ties, np.nextafter(ties, np.inf),
                                   np.nextafter(ties, 0.0)]))
    want = quiet_cast(x, np.float32).view(np.uint32)  # numpy: one rounding, ties to even
    # numpy itself rounded every tie to the even pattern (inf, 0x7F800000, is even).
    w_ties = want[:ties.size]
    assert np.all(w_ties % 2 == 0), "numpy's reference did not round ties to even"
    assert np.array_equal(w_ties, np.where(lo % 2 == 0, lo, lo + np.uint32(1)))
    got = tool("f64_to_f32", "plain", x, np.uint32)
    assert_same_bits(got, want, x, f"f64 -> f32 ties ({x.size} values)")
    sat_want = np.where(np.isfinite(x) & ((want & 0x7FFFFFFF) == 0x7F800000),
                        np.where(np.signbit(x), 0xFF7FFFFF, 0x7F7FFFFF), want).astype(np.uint32)
    assert (sat_want != want).any()
    got = tool("f64_to_f32", "saturate", x, np.uint32)
    assert_same_bits(got, sat_want, x, "f64 -> f32 saturate ties")


# --- signed zero and NaN patterns --------------------------------------------------------


def _sign_bit(u):
    return u(1 << (8 * np.dtype(u).itemsize - 1))


def test_negative_zero_pattern(tool):
    """-0.0 (and negatives that underflow to zero) give the negative-zero pattern in every
    format and every direction; +0.0 gives the zero pattern."""
    for name in NAMES:
        t, u = FORMATS[name]
        fi = ml_dtypes.finfo(t)
        neg0 = _sign_bit(u)
        tiny = float(fi.smallest_subnormal) / 4  # rounds to zero
        for src, ftype in (("f32", np.float32), ("f64", np.float64)):
            x = np.array([-0.0, 0.0, -tiny, tiny], dtype=ftype)
            want = np.array([neg0, 0, neg0, 0], dtype=u)
            assert_same_bits(ml_bits(x, name), want, x, f"ml_dtypes {src} -> {name} zero")
            for mode in ("plain", "saturate"):
                got = tool(f"{src}_to_{name}", mode, x, u)
                assert_same_bits(got, want, x, f"{src} -> {name} {mode} signed zero")
            utype = _uint_of(x)
            r = tool(f"{src}_round_{name}", "plain", x, ftype).view(utype)
            zeros = np.array([_sign_bit(utype), 0, _sign_bit(utype), 0], dtype=utype)
            assert_same_bits(r, zeros, x, f"round_to({name}, {src}) signed zero")
        d = tool(f"{name}_to_f32", "-", np.array([neg0, 0], dtype=u), np.uint32)
        assert_same_bits(d, np.array([0x80000000, 0], np.uint32), np.array([neg0, 0], dtype=u),
                         f"{name} -> f32 signed zero")
    x = np.array([-0.0, 0.0, -2.0**-160, 2.0**-160])
    want = np.array([0x80000000, 0, 0x80000000, 0], np.uint32)
    assert_same_bits(quiet_cast(x, np.float32).view(np.uint32), want, x, "numpy f64 -> f32")
    for mode in ("plain", "saturate"):
        assert_same_bits(tool("f64_to_f32", mode, x, np.uint32), want, x, "f64 -> f32 zero")
    x32 = np.array([-0.0, 0.0], np.float32)
    for mode in ("nearest", "truncate"):
        assert_same_bits(tool("f32_to_tf32", mode, x32, np.uint32),
                         np.array([0x80000000, 0], np.uint32), x32, f"tf32 {mode} zero")


# ml_dtypes' NaN result for bf16 / fp8 targets is canonical: its quiet NaN with the input's
# sign, whatever the payload (measured here; the test checks ml_dtypes still does this).
CANONICAL_NAN = {"bf16": (0x7FC0, 0xFFC0), "f8e4m3": (0x7F, 0xFF), "f8e5m2": (0x7E, 0xFE)}
NAN32 = np.array([0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FFFFFFF, 0x7F802000, 0x7FBFFFFF,
                  0x7FC02000, 0x7F801FFF, 0x7FC00001], dtype=np.uint32)
NAN64 = np.array([0x7FF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
                  0x7FF0040000000000, 0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000,
                  0x7FF8000000000001], dtype=np.uint64)


def test_nan_patterns(tool):
    inputs = {"f32": np.concatenate([NAN32, NAN32 | _sign_bit(np.uint32)]).view(np.float32),
              "f64": np.concatenate([NAN64, NAN64 | _sign_bit(np.uint64)]).view(np.float64)}
    for name in NAMES:
        t, u = FORMATS[name]
        for src, x in inputs.items():
            neg = np.signbit(x)
            for mode in ("plain", "saturate"):
                got = tool(f"{src}_to_{name}", mode, x, u)
                assert np.isnan(quiet_cast(got.view(t), np.float32)).all(), f"{src}->{name}"
                assert np.array_equal(got >= _sign_bit(u), neg), f"{src} -> {name}: NaN sign"
                if name in CANONICAL_NAN:
                    pos_nan, neg_nan = CANONICAL_NAN[name]
                    want = np.where(neg, neg_nan, pos_nan).astype(u)
                    assert_same_bits(ml_bits(x, name), want, x, f"ml_dtypes {src} NaN -> {name}")
                    assert_same_bits(got, want, x, f"{src} NaN -> {name} {mode}")
                # f16 is numpy's, not ml_dtypes': which payload bits survive is numpy's
                # implementation choice (it keeps the top ones), so only NaN-ness and sign
                # are checked here (test_f32_to_narrow / test_f64_nan_bits still compare
                # with numpy bit for bit).
    # f64 -> f32: which payload bits survive is implementation-defined (IEEE 754 only
    # recommends preserving them): check that the result is a NaN pattern with the sign.
    x = inputs["f64"]
    for mode in ("plain", "saturate"):
        got = tool("f64_to_f32", mode, x, np.uint32)
        assert np.isnan(got.view(np.float32)).all(), "f64 NaN -> f32 must be NaN"
        assert np.array_equal(got >= 0x80000000, np.signbit(x)), "f64 NaN -> f32 sign"


# --- TF32 -------------------------------------------------------------------------------


def tf32_reference(x, nearest):
    u = x.view(np.uint32).astype(np.uint64)
    if nearest:
        u = u + 0xFFF + ((u >> 13) & 1)  # carries exactly when above half, or half & odd
    return (u & 0xFFFFE000).astype(np.uint32)


def jax_tf32(x):
    """jax.lax.reduce_precision to 8 exponent / 10 mantissa bits, f32 in, f32 out."""
    y = np.asarray(lax.reduce_precision(jax.numpy.asarray(x, dtype=np.float32),
                                        exponent_bits=8, mantissa_bits=10))
    assert y.dtype == np.float32 and y.shape == x.shape
    return y.view(np.uint32)


def test_tf32(tool, rng):
    k = rng.integers(0, 2**19, 300_000, dtype=np.uint64) << np.uint64(13)
    ties = k | np.uint64(0x1000)  # exactly halfway, even and odd kept lsb alike
    parts = [rng.integers(0, 2**32, 700_000, dtype=np.uint64), ties, ties + 1, ties - 1,
             ties | np.uint64(0x80000000),
             np.array([0x7F7FFFFF, 0x7F7FF000, 0x7F7FEFFF, 0x7F800000, 0, 1, 0x1000, 0x3000,
                       0x7FFFFF, 0x7FF000, 0x7FEFFF, 0x800000, 0xFF800000,
                       0x7FC00000, 0x7F800001, 0x7F801000, 0x7FA00000, 0xFFFFFFFF, 0x80000000],
                      dtype=np.uint64)]
    x = np.concatenate(parts).astype(np.uint32).view(np.float32)
    nan = np.isnan(x)
    # jax (XLA) reduce_precision is the reference for round-to-nearest-even, bit for bit on
    # every input, f32 subnormals and NaNs included (measured: 0 differences; XLA keeps a
    # NaN's bits when it would otherwise turn into inf, and so does tpcheck).
    got = tool("f32_to_tf32", "nearest", x, np.uint32)
    assert_same_bits(got, jax_tf32(x), x, f"tf32 nearest vs jax reduce_precision ({x.size})")
    for mode, nearest in [("nearest", True), ("truncate", False)]:
        got = tool("f32_to_tf32", mode, x, np.uint32)
        # jax has no truncating mode; NaN payloads after truncation are tpcheck's choice,
        # so only NaN-ness and sign are checked for NaN inputs.
        assert np.isnan(got[nan].view(np.float32)).all(), f"tf32 {mode}: NaN must stay NaN"
        assert np.array_equal(got[nan] >= 0x80000000, np.signbit(x[nan]))
        assert_same_bits(got[~nan], tf32_reference(x[~nan], nearest),
                         x[~nan], f"tf32 {mode}")

"""An independent numpy implementation of the quantized recipes, written from the formulas
in docs/QUANTIZATION.md (TransformerEngine's), to check tpcheck's src/quant bit for bit.

Every f32 operation is a numpy float32 operation (IEEE, round to nearest even, one
rounding per operation); element casts go through ml_dtypes after an explicit clip to the
finite range (the GPU's `cvt.rn.satfinite`: ±inf and overflow → ±max, NaN stays NaN).
Nothing here calls tpcheck.
"""

import warnings

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
FORMATS = {
    "f8e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "f8e5m2": (ml_dtypes.float8_e5m2, 57344.0),
    "f4e2m1": (ml_dtypes.float4_e2m1fn, 6.0),
}


def _quiet():
    return np.errstate(all="ignore")


def fminf(a, b):
    """C's fminf: the smaller of a and b; a NaN argument is dropped."""
    a, b = F32(a), F32(b)
    if np.isnan(a):
        return b
    if np.isnan(b):
        return a
    return min(a, b)


def sat_cast(x, fmt):
    """Bits (uint8) of x rounded to nearest even in `fmt`, saturated to the finite range."""
    t, fmax = FORMATS[fmt]
    x = np.asarray(x, dtype=F32)
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clipped = np.where(np.isnan(x), x, np.clip(x, -fmax, fmax)).astype(F32)
        return clipped.astype(t).view(np.uint8)


def decode(bits, fmt):
    t, _ = FORMATS[fmt]
    return np.asarray(bits, dtype=np.uint8).view(t).astype(F32)


def amax(x):
    x = np.asarray(x, dtype=F32)
    if x.size == 0:
        return F32(0)
    if np.isnan(x).any():
        return F32(np.nan)
    return F32(np.max(np.abs(x)))


# --- scales -------------------------------------------------------------------------------


def fp8_current_scale(a, fmt):
    a = F32(a)
    if a == 0 or np.isinf(a) or np.isnan(a):
        return F32(1)
    with _quiet():
        s = F32(FORMATS[fmt][1]) / a
    return FLT_MAX if np.isinf(s) else s


def reciprocal(s):
    with _quiet():
        return F32(1) / F32(s)


def fp8_block_scale(a):
    """The largest power of two <= the current scale (a power-of-two floor via frexp)."""
    s = fp8_current_scale(a, "f8e4m3")
    m, e = np.frexp(np.float64(s))  # s = m * 2^e, m in [0.5, 1)
    return F32(np.ldexp(1.0, int(e) - 1))


def e8m0_round_up(v):
    """The smallest biased exponent b (0..254) with 2^(b - 127) >= v; NaN -> 255, inf -> 254."""
    v = F32(v)
    if np.isnan(v):
        return 255
    if np.isinf(v):
        return 254
    if v == 0:
        return 0
    m, e = np.frexp(np.float64(v))  # exact: v = m * 2^e
    b = (e - 1 if m == 0.5 else e) + 127
    return int(min(max(b, 0), 254))


def e8m0_reciprocal(b):
    if b == 255:
        return F32(np.nan)
    if b == 0:
        return F32(1)  # TE's exp2f_rcp
    return F32(np.ldexp(1.0, 127 - int(b)))


def mxfp8_scale_exponent(a):
    with _quiet():
        return e8m0_round_up(F32(a) * (F32(1) / F32(448)))


def nvfp4_global_encode_scale(a):
    a = F32(a)
    with _quiet():
        q = F32(F32(448) * F32(6)) / a
    s = fminf(q, FLT_MAX)  # a NaN quotient gives FLT_MAX
    if a == 0 or s == 0:
        return F32(1)
    return F32(s)


def nvfp4_block_decode_scale(block_amax, s_enc):
    with _quiet():
        t = F32(s_enc) * (F32(1) / F32(6))
        d = F32(block_amax) * t
    return int(sat_cast(np.array([fminf(d, FLT_MAX)], F32), "f8e4m3")[0])


def nvfp4_encode_factor(sb_bits, s_enc):
    sb = decode(np.array([sb_bits]), "f8e4m3")[0]
    with _quiet():
        s_dec = F32(1) / F32(s_enc)
        r = F32(1) / (sb * s_dec)
    return fminf(r, FLT_MAX)


def nvfp4_gemm_alpha(a, b):
    inv = F32(1.0 / (6.0 * 6.0 * 448.0 * 448.0))
    with _quiet():
        return (F32(a) * F32(b)) * inv


def delayed_scales(amaxes, fmt, history=32):
    """The scale used at each step: from the history of the steps before it."""
    out, hist, scale = [], [], F32(1)
    fmax = F32(FORMATS[fmt][1])
    for a in amaxes:
        out.append(scale)
        hist = ([F32(a)] + hist)[:history]
        h = np.array(hist, F32)
        m = F32(np.max(h))  # NaN if any NaN
        if np.all(np.isfinite(h)) and m > 0:
            with _quiet():
                s = fmax / m
            scale = FLT_MAX if np.isinf(s) else s
    return np.array(out, F32)


# --- recipes ------------------------------------------------------------------------------


def _blocks(x, br, bc, fmt, factor_of):
    """Quantize x [R, C] in br x bc blocks; factor_of(amax) -> (factor, scale_inv)."""
    R, C = x.shape
    q = np.zeros((R, C), np.uint8)
    scales = []
    for i in range(R // br):
        row = []
        for j in range(C // bc):
            blk = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            factor, s_inv = factor_of(amax(blk))
            with _quiet():
                q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = sat_cast(blk * F32(factor), fmt)
            row.append(s_inv)
        scales.append(row)
    return q, np.array(scales)


def quantize(x, recipe, role, amax_override=None, delayed_scale=1.0):
    """dict with rowwise/columnwise data (uint8) and scale_inv (f32 or uint8 bits)."""
    x = np.asarray(x, F32)
    own = amax(x)
    a = own if amax_override is None else F32(amax_override)
    grad = role == "grad_output"
    out = {"amax": own, "global_amax": a}
    copies = {"rowwise": x, "columnwise": x.T.copy()}
    for name, m in copies.items():
        if recipe in ("fp8", "fp8_cs"):
            fmt = "f8e5m2" if grad else "f8e4m3"
            s = F32(delayed_scale) if recipe == "fp8" else fp8_current_scale(a, fmt)
            q, _ = _blocks(m, m.shape[0], m.shape[1], fmt, lambda _a: (s, None))
            out[name] = (q, np.array([reciprocal(s)], F32))
            out["scale"] = s
        elif recipe == "fp8_block_scaling":
            br = 128 if role == "weight" else 1

            def f(ba):
                s = fp8_block_scale(ba)
                return s, reciprocal(s)

            q, sc = _blocks(m, br, 128, "f8e4m3", f)
            out[name] = (q, sc.astype(F32))
        elif recipe == "mxfp8":

            def f(ba):
                e = mxfp8_scale_exponent(ba)
                return e8m0_reciprocal(e), e

            q, sc = _blocks(m, 1, 32, "f8e4m3", f)
            out[name] = (q, sc.astype(np.uint8))
        elif recipe == "nvfp4":
            s_enc = nvfp4_global_encode_scale(a)
            out["scale"] = s_enc

            def f(ba):
                sb = nvfp4_block_decode_scale(ba, s_enc)
                return nvfp4_encode_factor(sb, s_enc), sb

            q, sc = _blocks(m, 1, 16, "f4e2m1", f)
            out[name] = (q, sc.astype(np.uint8))
        else:
            raise ValueError(recipe)
    return out


def dequantized_operand(x, recipe, role, columnwise):
    """(values, tensor_factor): the f64 values a GEMM multiplies (quantized value times its
    block scale) in the copy's own layout, and the per-tensor factor."""
    q = quantize(x, recipe, role)
    data, sc = q["columnwise" if columnwise else "rowwise"]
    if recipe in ("fp8", "fp8_cs"):
        fmt = "f8e5m2" if role == "grad_output" else "f8e4m3"
        return decode(data, fmt).astype(np.float64), np.float64(sc[0]), q
    if recipe == "fp8_block_scaling":
        br = 128 if role == "weight" else 1
        s = np.repeat(np.repeat(sc.astype(np.float64), br, 0), 128, 1)
        return decode(data, "f8e4m3").astype(np.float64) * s, 1.0, q
    if recipe == "mxfp8":
        s = np.ldexp(1.0, sc.astype(np.int64) - 127)
        return decode(data, "f8e4m3").astype(np.float64) * np.repeat(s, 32, 1), 1.0, q
    if recipe == "nvfp4":
        s = decode(sc, "f8e4m3").astype(np.float64)
        return decode(data, "f4e2m1").astype(np.float64) * np.repeat(s, 16, 1), 1.0, q
    raise ValueError(recipe)

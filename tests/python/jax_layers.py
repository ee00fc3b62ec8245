"""An independent JAX reference of every tpcheck layer, written from docs/LAYERS.md only.

This module is the second opinion on tpcheck's layers: it was written from the contract
in docs/LAYERS.md (and the activation / mask definitions in include/tpcheck/backend.h),
never from src/layers, so a misreading of the contract in the C++ shows up as a
disagreement instead of being copied. It is single-device (no tensor parallelism): it
checks tpcheck's unsharded f64 run. Gradients come from JAX autodiff (jax.vjp), not from
hand-written backward formulas, so they are independent of tpcheck's explicit backward.

API (all pure functions on float64 arrays; enable x64 before calling, see below):
  resolve_options(kind, options)           -> options with the documented defaults filled
  parameter_specs(kind, options)           -> [(name, shape)] in the documented order
  forward(kind, options, params, x)        -> {"output", "bias"?, "layernorm_output"?}
  loss_and_grads(kind, options, params, x, target, target_ln=None)
                                           -> (outputs, {"input": dx, name: dparam, ...})
Names (`params` keys, gradient keys) are the documented parameter names, e.g.
"self_attention.layernorm_qkv.query_weight", "layernorm_mlp.fc1_weight" in a
TransformerLayer; a layer built on its own has no prefix ("fc1_weight",
"layernorm_qkv.query_weight"), as include/tpcheck/layers/any_layer.h says.
Thread safety: pure functions.
"""

import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)

LN_EPS = 1e-5  # docs/LAYERS.md, LayerNorm and RMSNorm

KINDS = (
    "Linear",
    "LayerNorm",
    "RMSNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "MultiheadAttention",
    "TransformerLayer",
)
ACTIVATIONS = ("gelu", "relu", "srelu", "qgelu", "geglu", "swiglu")
GATED = ("geglu", "swiglu")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")

# Options that change no number on one device (or that this reference ignores because
# they are about memory, sharding or where a gradient is stored, not about its value).
_NUMERICALLY_NEUTRAL = {
    "parallel_mode": "none",
    "sequence_parallel": False,
    "fuse_wgrad_accumulation": False,
    "delay_wgrad_compute": False,
    "save_original_input": False,
    "checkpoint": False,
    "params_dtype": "f64",
}

# Documented defaults per layer (docs/LAYERS.md). Sizes have no default: they must be given.
_LINEAR = {"bias": True, "return_bias": False, "init_method": "normal"}
_NORM = {"zero_centered_gamma": False, "eps": LN_EPS}
# MultiheadAttention and TransformerLayer spell the norm epsilon as the reference does.
_NORM_LE = {"zero_centered_gamma": False, "layernorm_epsilon": LN_EPS}
_DEFAULTS = {
    "Linear": {"in_features": None, "out_features": None, **_LINEAR},
    "LayerNorm": {"hidden_size": None, **_NORM},
    "RMSNorm": {"hidden_size": None, **_NORM},
    "LayerNormLinear": {
        "in_features": None,
        "out_features": None,
        "normalization": "LayerNorm",
        "return_layernorm_output": False,
        **_NORM,
        **_LINEAR,
    },
    "LayerNormMLP": {
        "hidden_size": None,
        "ffn_hidden_size": None,
        "activation": "gelu",
        "normalization": "LayerNorm",
        "bias": True,
        "return_bias": False,
        "return_layernorm_output": False,
        "init_method": "normal",
        "output_layer_init_method": "normal",
        **_NORM,
    },
    "MultiheadAttention": {
        "hidden_size": None,
        "num_attention_heads": None,
        "num_gqa_groups": None,  # None: heads
        "self_attn_mask_type": "causal",
        "window_size": [-1, -1],
        "normalization": "LayerNorm",
        "fuse_qkv_params": False,
        "qkv_weight_interleaved": True,
        "bias": True,
        "input_layernorm": False,  # the reference's default; TransformerLayer sets it
        "return_bias": False,  # the reference's default; TransformerLayer sets it
        "return_layernorm_output": False,
        "init_method": "normal",
        "output_layer_init_method": "normal",
        **_NORM_LE,
    },
    "TransformerLayer": {
        "hidden_size": None,
        "ffn_hidden_size": None,
        "num_attention_heads": None,
        "num_gqa_groups": None,
        "self_attn_mask_type": "causal",
        "window_size": [-1, -1],
        "apply_residual_connection_post_layernorm": False,
        "output_layernorm": False,
        "parallel_attention_mlp": False,
        "normalization": "LayerNorm",
        "fuse_qkv_params": False,
        "qkv_weight_interleaved": True,
        "bias": True,
        "activation": "gelu",
        "init_method": "normal",
        "output_layer_init_method": "normal",
        **_NORM_LE,
    },
}


def resolve_options(kind, options):
    """The options of `kind` with every documented default filled; rejects unknown names."""
    if kind not in _DEFAULTS:
        raise ValueError(f"unknown layer kind {kind!r}; expected one of {KINDS}")
    known = {**_DEFAULTS[kind], **_NUMERICALLY_NEUTRAL}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{kind}: unknown option(s) {unknown}; expected some of {sorted(known)}")
    out = {**known, **options}
    missing = [k for k, v in out.items() if v is None and k != "num_gqa_groups"]
    if missing:
        raise ValueError(f"{kind}: size option(s) {missing} must be given")
    if "num_gqa_groups" in out and out["num_gqa_groups"] is None:
        out["num_gqa_groups"] = out["num_attention_heads"]
    if out.get("activation", "gelu") not in ACTIVATIONS:
        raise ValueError(f"unknown activation {out['activation']!r}; expected {ACTIVATIONS}")
    if out.get("normalization", "LayerNorm") not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {out['normalization']!r}")
    if "layernorm_epsilon" in out:
        out["eps"] = out["layernorm_epsilon"]
    if "window_size" in out:
        out["window_size"] = normalize_window_size(out["self_attn_mask_type"],
                                                   tuple(out["window_size"]))
    if kind == "TransformerLayer":
        if out["parallel_attention_mlp"] and out["output_layernorm"]:
            raise ValueError("parallel_attention_mlp and output_layernorm cannot both be true")
        if out["parallel_attention_mlp"] and out["apply_residual_connection_post_layernorm"]:
            raise ValueError("parallel_attention_mlp and apply_residual_connection_post_layernorm"
                             " cannot both be true")
        if out["fuse_wgrad_accumulation"] and not out["fuse_qkv_params"]:
            raise ValueError("fuse_wgrad_accumulation requires fuse_qkv_params")
    return out


def normalize_window_size(mask_type, window):
    """docs/LAYERS.md's window rule: causal (-1, -1) -> (-1, 0), (l >= 0, r) -> (l, 0),
    (-1, 0) and (l >= 0, 0) kept, else rejected; no_mask (-1, 0) -> (-1, -1) (no mask),
    (-1, -1) and (>= 0, >= 0) kept, a single -1 rejected."""
    left, right = window
    if mask_type == "causal":
        if (left, right) == (-1, -1) or (left >= 0 and right != 0):
            return (left, 0)
        if (left == -1 or left >= 0) and right == 0:
            return (left, right)
        raise ValueError(f"window_size {window} is not allowed with causal")
    if (left, right) == (-1, 0):
        return (-1, -1)
    if (left, right) == (-1, -1) or (left >= 0 and right >= 0):
        return (left, right)
    raise ValueError(f"window_size {window} is not allowed with no_mask")


# ---- parameters ----------------------------------------------------------------------


def _norm_specs(prefix, names, hidden, normalization):
    """names = (weight name, bias name) under `prefix`; the bias only for LayerNorm."""
    specs = [(prefix + names[0], (hidden,))]
    if normalization == "LayerNorm":
        specs.append((prefix + names[1], (hidden,)))
    return specs


def _mlp_specs(prefix, o):
    h, f = o["hidden_size"], o["ffn_hidden_size"]
    fc1_rows = 2 * f if o["activation"] in GATED else f
    specs = _norm_specs(prefix, ("layer_norm_weight", "layer_norm_bias"), h, o["normalization"])
    specs.append((prefix + "fc1_weight", (fc1_rows, h)))
    if o["bias"]:
        specs.append((prefix + "fc1_bias", (fc1_rows,)))
    specs.append((prefix + "fc2_weight", (h, f)))
    if o["bias"]:
        specs.append((prefix + "fc2_bias", (h,)))
    return specs


def _attention_specs(prefix, o):
    h, heads, g = o["hidden_size"], o["num_attention_heads"], o["num_gqa_groups"]
    d = h // heads
    specs = []
    if o["input_layernorm"]:
        qkv = prefix + "layernorm_qkv."
        specs += _norm_specs(qkv, ("layer_norm_weight", "layer_norm_bias"), h, o["normalization"])
    else:
        qkv = prefix + "qkv."
    if o["fuse_qkv_params"]:
        specs.append((qkv + "weight", ((heads + 2 * g) * d, h)))
        if o["bias"]:
            specs.append((qkv + "bias", ((heads + 2 * g) * d,)))
    else:
        specs += [
            (qkv + "query_weight", (heads * d, h)),
            (qkv + "key_weight", (g * d, h)),
            (qkv + "value_weight", (g * d, h)),
        ]
        if o["bias"]:
            specs += [
                (qkv + "query_bias", (heads * d,)),
                (qkv + "key_bias", (g * d,)),
                (qkv + "value_bias", (g * d,)),
            ]
    specs.append((prefix + "proj.weight", (h, heads * d)))
    if o["bias"]:
        specs.append((prefix + "proj.bias", (h,)))
    return specs


def _attention_options(o):
    """The MultiheadAttention options a TransformerLayer's options imply."""
    keys = [k for k in _DEFAULTS["MultiheadAttention"]
            if k not in ("input_layernorm", "return_layernorm_output", "return_bias")]
    a = {k: o[k] for k in keys}
    a["input_layernorm"] = not o["output_layernorm"]
    a["return_layernorm_output"] = a["input_layernorm"]
    a["return_bias"] = not o["parallel_attention_mlp"]
    a["eps"] = o["layernorm_epsilon"]
    return a


def _mlp_options(o):
    """The LayerNormMLP options a TransformerLayer's options imply (its bias is returned
    to the parent, which adds it)."""
    keys = [k for k in _DEFAULTS["LayerNormMLP"]
            if k not in ("return_bias", "return_layernorm_output", "eps")]
    return {**{k: o[k] for k in keys}, "eps": o["layernorm_epsilon"],
            "return_bias": not o["parallel_attention_mlp"], "return_layernorm_output": True}


def parameter_specs(kind, options):
    """[(name, shape)] of `kind`'s parameters, in docs/LAYERS.md's order."""
    o = resolve_options(kind, options)
    if kind == "Linear":
        specs = [("weight", (o["out_features"], o["in_features"]))]
        if o["bias"]:
            specs.append(("bias", (o["out_features"],)))
        return specs
    if kind in ("LayerNorm", "RMSNorm"):
        return _norm_specs("", ("weight", "bias"), o["hidden_size"], kind)
    if kind == "LayerNormLinear":
        specs = _norm_specs(
            "", ("layer_norm_weight", "layer_norm_bias"), o["in_features"], o["normalization"]
        )
        specs.append(("weight", (o["out_features"], o["in_features"])))
        if o["bias"]:
            specs.append(("bias", (o["out_features"],)))
        return specs
    if kind == "LayerNormMLP":
        return _mlp_specs("", o)
    if kind == "MultiheadAttention":
        return _attention_specs("", o)  # standalone: no prefix (any_layer.h)
    # TransformerLayer
    specs = _attention_specs("self_attention.", _attention_options(o))
    specs += _mlp_specs("layernorm_mlp.", _mlp_options(o))
    if o["output_layernorm"]:
        specs += _norm_specs("", ("layernorm.weight", "layernorm.bias"), o["hidden_size"],
                             o["normalization"])
    return specs


# ---- ops (docs/LAYERS.md; activations and masks as include/tpcheck/backend.h defines) --


def norm(normalization, x, gamma, beta, zero_centered_gamma, eps=LN_EPS):
    """LayerNorm (biased variance) or RMSNorm over the last dimension."""
    scale = 1.0 + gamma if zero_centered_gamma else gamma
    if normalization == "LayerNorm":
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * scale + beta
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x / jnp.sqrt(ms + eps) * scale


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def activation(name, h):
    """gelu (tanh form), relu, srelu = relu², qgelu = x·sigmoid(1.702x);
    gated: h = [a | b] along the last dim, geglu = gelu(a)·b, swiglu = silu(a)·b."""
    if name == "gelu":
        return _gelu_tanh(h)
    if name == "relu":
        return jnp.maximum(h, 0.0)
    if name == "srelu":
        return jnp.maximum(h, 0.0) ** 2
    if name == "qgelu":
        return h * _sigmoid(1.702 * h)
    n = h.shape[-1] // 2
    a, b = h[..., :n], h[..., n:]
    if name == "geglu":
        return _gelu_tanh(a) * b
    if name == "swiglu":
        return a * _sigmoid(a) * b
    raise ValueError(f"unknown activation {name!r}")


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def attention_mask(s, mask_type, window_size):
    """[s_q, s_k] boolean: key j visible to query i, for a window normalized by
    normalize_window_size. causal: j <= i and, with a window, j >= i - left; no_mask:
    i - left <= j <= i + right, a negative bound unbounded."""
    left, right = normalize_window_size(mask_type, tuple(window_size))
    i = jnp.arange(s)[:, None]
    j = jnp.arange(s)[None, :]
    if mask_type == "causal":
        right = 0
    elif mask_type != "no_mask":
        raise ValueError(f"unknown self_attn_mask_type {mask_type!r}")
    ok = jnp.ones((s, s), dtype=bool)
    if left >= 0:
        ok = ok & (j >= i - left)
    if right >= 0:
        ok = ok & (j <= i + right)
    return ok


def sdpa(q, k, v, mask):
    """q [s, b, heads, d]; k, v [s, b, g, d]; query head i uses group i / (heads / g)."""
    heads, g, d = q.shape[2], k.shape[2], q.shape[3]
    rep = heads // g
    k = jnp.repeat(k, rep, axis=2)  # head i -> group i // rep
    v = jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("ibhd,jbhd->bhij", q, k) / math.sqrt(d)
    scores = jnp.where(mask[None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhij,jbhd->ibhd", probs, v)


# ---- layers ---------------------------------------------------------------------------


def _maybe(params, name):
    return params.get(name)


def _norm(o, x, p, weight, bias):
    """The layer's norm (o: normalization, zero_centered_gamma, eps) with parameters
    p[weight] and p[bias] (absent for RMSNorm)."""
    return norm(o["normalization"], x, p[weight], p.get(bias), o["zero_centered_gamma"],
                o["eps"])


def _mlp(o, p, prefix, x):
    """Returns (m without fc2 bias, fc2 bias or None, ln)."""
    ln = _norm(o, x, p, prefix + "layer_norm_weight", prefix + "layer_norm_bias")
    h = linear(ln, p[prefix + "fc1_weight"], _maybe(p, prefix + "fc1_bias"))
    a = activation(o["activation"], h)
    return linear(a, p[prefix + "fc2_weight"]), _maybe(p, prefix + "fc2_bias"), ln


def _attention(o, p, prefix, x):
    """x [s, b, hidden]. Returns (a without proj bias, proj bias or None, ln or None)."""
    s, bsz, hidden = x.shape
    heads, g = o["num_attention_heads"], o["num_gqa_groups"]
    d = hidden // heads
    if o["input_layernorm"]:
        qp = prefix + "layernorm_qkv."
        ln = _norm(o, x, p, qp + "layer_norm_weight", qp + "layer_norm_bias")
    else:
        qp = prefix + "qkv."
        ln = None
    inp = x if ln is None else ln
    if o["fuse_qkv_params"]:
        qkv = linear(inp, p[qp + "weight"], _maybe(p, qp + "bias"))
        if o["qkv_weight_interleaved"]:
            # rows [g][heads/g + 2][d]: the group's query heads, its key, its value
            qkv = qkv.reshape(s, bsz, g, heads // g + 2, d)
            q = qkv[:, :, :, : heads // g, :].reshape(s, bsz, heads, d)
            k = qkv[:, :, :, heads // g, :]
            v = qkv[:, :, :, heads // g + 1, :]
        else:
            q = qkv[..., : heads * d].reshape(s, bsz, heads, d)
            k = qkv[..., heads * d : (heads + g) * d].reshape(s, bsz, g, d)
            v = qkv[..., (heads + g) * d :].reshape(s, bsz, g, d)
    else:
        q = linear(inp, p[qp + "query_weight"], _maybe(p, qp + "query_bias"))
        k = linear(inp, p[qp + "key_weight"], _maybe(p, qp + "key_bias"))
        v = linear(inp, p[qp + "value_weight"], _maybe(p, qp + "value_bias"))
        q = q.reshape(s, bsz, heads, d)
        k = k.reshape(s, bsz, g, d)
        v = v.reshape(s, bsz, g, d)
    mask = attention_mask(s, o["self_attn_mask_type"], tuple(o["window_size"]))
    out = sdpa(q, k, v, mask).reshape(s, bsz, heads * d)
    return linear(out, p[prefix + "proj.weight"]), _maybe(p, prefix + "proj.bias"), ln


def _returned(out, bias, ln, return_bias, return_ln):
    result = {}
    if return_bias or bias is None:
        result["output"] = out
        if return_bias and bias is not None:
            result["bias"] = bias
    else:
        result["output"] = out + bias
    if return_ln:
        result["layernorm_output"] = ln
    return result


def forward(kind, options, params, x):
    """Forward of `kind` per docs/LAYERS.md: {"output", "bias"?, "layernorm_output"?}.

    MultiheadAttention always returns its projection bias as "bias" (the parent adds it),
    as the contract says; a TransformerLayer returns only "output"."""
    o = resolve_options(kind, options)
    p = params
    if kind == "Linear":
        return _returned(linear(x, p["weight"]), p.get("bias"), None, o["return_bias"], False)
    if kind in ("LayerNorm", "RMSNorm"):
        return {"output": _norm({**o, "normalization": kind}, x, p, "weight", "bias")}
    if kind == "LayerNormLinear":
        ln = _norm(o, x, p, "layer_norm_weight", "layer_norm_bias")
        return _returned(linear(ln, p["weight"]), p.get("bias"), ln, o["return_bias"],
                         o["return_layernorm_output"])
    if kind == "LayerNormMLP":
        m, mb, ln = _mlp(o, p, "", x)
        return _returned(m, mb, ln, o["return_bias"], o["return_layernorm_output"])
    if kind == "MultiheadAttention":
        a, ab, ln = _attention(o, p, "", x)
        return _returned(a, ab, ln, o["return_bias"], o["return_layernorm_output"])
    # TransformerLayer
    ao, mo = _attention_options(o), _mlp_options(o)
    a, ab, ln_a = _attention(ao, p, "self_attention.", x)
    a_full = a if ab is None else a + ab
    if o["parallel_attention_mlp"]:
        m, mb, _ = _mlp(mo, p, "layernorm_mlp.", x)
        m_full = m if mb is None else m + mb
        y = x + (a_full + m_full)
    else:
        # With output_layernorm the attention has no input norm, so there is no ln_a and
        # the residual is x (as in TransformerEngine).
        post = o["apply_residual_connection_post_layernorm"]
        r1 = ln_a if (post and ln_a is not None) else x
        h = a_full + r1
        m, mb, ln_m = _mlp(mo, p, "layernorm_mlp.", h)
        m_full = m if mb is None else m + mb
        y = m_full + (ln_m if post else h)
    if o["output_layernorm"]:
        y = _norm(o, y, p, "layernorm.weight", "layernorm.bias")
    return {"output": y}


def suite_loss(outputs, target, target_ln=None):
    """docs/LAYERS.md "Loss used by the suite": MSE(output (+ bias), target)
    (+ MSE(layernorm_output, target_ln) when returned)."""
    y = outputs["output"]
    if "bias" in outputs:
        y = y + outputs["bias"]
    loss = jnp.mean((y - target) ** 2)
    if "layernorm_output" in outputs:
        loss = loss + jnp.mean((outputs["layernorm_output"] - target_ln) ** 2)
    return loss


def loss_and_grads(kind, options, params, x, target, target_ln=None):
    """(outputs, grads): grads["input"] and grads[name] for every parameter, by jax.vjp
    of the suite loss."""
    params = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in params.items()}
    x = jnp.asarray(x, dtype=jnp.float64)

    def f(p, xx):
        outs = forward(kind, options, p, xx)
        return suite_loss(outs, target, target_ln), outs

    loss, vjp, outs = jax.vjp(f, params, x, has_aux=True)
    dparams, dx = vjp(jnp.ones_like(loss))
    grads = {"input": dx, **dparams}
    return outs, grads

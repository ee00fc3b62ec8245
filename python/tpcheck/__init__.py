"""tpcheck from Python: judge your own tensors, get the fp64 truth of a layer, run the suite.

    import tpcheck
    v = tpcheck.compare(single, sharded, truth, reduction_length=4096, tp_size=4)
    assert v, v.reason                      # a Verdict is truthy when it passes
    tpcheck.assert_close(sharded, single, truth)   # raises AssertionError with the reason
    t = tpcheck.truth("LayerNormMLP", {"hidden_size": 64, "ffn_hidden_size": 256},
                      module.state_dict(), x, grad_output=dy)
    report = tpcheck.run(suite="te", tp=2, backend="cpu")   # the JSON report as a dict
    with tpcheck.trace() as t: ...          # the cuBLASLt calls of any library in the block

Arrays are anything that speaks DLPack (PyTorch, numpy, JAX, CuPy), on the CPU or a CUDA
GPU, read in place (no copies): float64, float32, float16, bfloat16, float8_e4m3fn,
float8_e5m2, C-contiguous. docs/PYTHON.md is the manual.
"""

from __future__ import annotations

import inspect as _inspect
import json as _json
import math as _math
import numbers as _numbers
from typing import Any, Mapping, Optional

from . import _tpcheck
from ._launch import share_nccl_id_if_torchrun as _share_nccl_id_if_torchrun
from ._trace import Trace, loaded_cublaslt, trace

__all__ = ["Verdict", "TruthResult", "compare", "assert_close", "truth", "layer_parameters",
           "run", "policies", "trace", "Trace", "loaded_cublaslt"]

_DTYPE_ALIASES = {
    "float64": "f64", "double": "f64", "f64": "f64",
    "float32": "f32", "float": "f32", "f32": "f32",
    "float16": "f16", "half": "f16", "f16": "f16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float8_e4m3fn": "f8e4m3", "f8e4m3": "f8e4m3", "e4m3": "f8e4m3",
    "float8_e5m2": "f8e5m2", "f8e5m2": "f8e5m2", "e5m2": "f8e5m2",
}


def policies() -> list[str]:
    """The policies compare accepts: te, allclose, truth, bitwise (docs/POLICIES.md)."""
    return list(_tpcheck.policy_names())


def _as_dlpack(x: Any, what: str) -> Any:
    """Objects nanobind takes as DLPack arrays: anything with __dlpack__ (torch, numpy >= 1.22,
    JAX, CuPy). Python lists and scalars are refused rather than silently copied."""
    if x is None or hasattr(x, "__dlpack__"):
        return x
    raise TypeError(f"{what}: {type(x).__name__} is not an array; pass a DLPack array "
                    "(torch.Tensor, numpy.ndarray, jax.Array, cupy.ndarray)")


def _dtype_key(dtype: Any) -> str:
    """'f32' for torch.float32, np.float32, jnp.float32, 'float32', 'f32', ..."""
    name = str(getattr(dtype, "name", dtype)).replace("torch.", "")
    key = _DTYPE_ALIASES.get(name)
    if key is None:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(set(_DTYPE_ALIASES))}")
    return key


def _array_dtype_key(x: Any) -> Optional[str]:
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    try:
        return _dtype_key(dt)
    except ValueError:
        return None  # the compiled side names the unsupported dtype


class Verdict:
    """A comparison's verdict under one policy, and the statistics behind it.

    `passed` (also `bool(verdict)`), `status` ("pass", "warning" or "fail"), `reason` (one
    line with the figures that decided), `policy`, and `statistics`: the C++ side's
    TensorComparison as a dict (max_abs_diff at argmax / argmax_index with sharded_value and
    single_value there, rel_at_max, norm_rel_diff, count_over_allclose, count_bits_differ,
    NaN / Inf counts, and with a truth: single_vs_truth / sharded_vs_truth {max_abs, argmax,
    rms}, truth_rms, truth_max_abs, and the scale test's scale_shift, scale_shift_sigma,
    single_scale_error, truth_variation, single_error_offset_share). `error_model` holds u, K, N as applied (truth policy).
    `reference_line` is the reference suite's "NUMERICAL CHECK FAILED" line for this
    comparison (when the dtype has a tolerance).
    """

    __slots__ = ("passed", "status", "reason", "policy", "statistics", "error_model",
                 "reference_line", "name")

    def __init__(self, raw: Mapping[str, Any], error_model: Mapping[str, Any], name: str):
        self.passed: bool = bool(raw["passed"])
        self.status: str = raw["status"]
        self.reason: str = raw["reason"]
        self.policy: str = raw["policy"]
        self.statistics: dict[str, Any] = dict(raw["statistics"])
        self.error_model: dict[str, Any] = dict(error_model)
        self.reference_line: Optional[str] = raw.get("reference_line")
        self.name = name

    def __bool__(self) -> bool:
        return self.passed

    def __getattr__(self, key: str) -> Any:  # v.max_abs_diff, v.norm_rel_diff, ...
        stats = object.__getattribute__(self, "statistics")
        if key in stats:
            return stats[key]
        raise AttributeError(key)

    def __repr__(self) -> str:
        s = self.statistics
        where = ", ".join(str(i) for i in s["argmax_index"])
        return (f"Verdict({self.status.upper()} under {self.policy!r}: {self.reason}; "
                f"max |diff| {s['max_abs_diff']:.3g} at [{where}], "
                f"norm-wise rel. diff {s['norm_rel_diff']:.3g}, {s['numel']} elements)")


def compare(single: Any, sharded: Any, truth: Any = None, *, policy: str = "truth",
            dtype: Any = None, math: Optional[str] = None, reduction_length: int = 1,
            tp_size: int = 1, unit_roundoff: Optional[float] = None,
            rtol: Optional[float] = None, atol: Optional[float] = None,
            multiplier: float = 4.0, floor_factor: float = 1.0,
            rounding_noise: Any = None, name: str = "tensor") -> Verdict:
    """Judges `sharded` against `single` (both against the fp64 `truth` when given).

    Policies (docs/POLICIES.md): "truth" (default; needs `truth`): the sharded run's error
    against the truth may be at most multiplier·sqrt(tp_size) times the single run's plus a
    rounding floor floor_factor·u·sqrt(reduction_length)·|truth|; "te": the reference
    suite's rule at the max-difference element; "allclose": every element within
    atol + rtol·|single|; "bitwise".

    The error model (truth policy): u is the larger of the storage dtype's unit roundoff
    (`dtype`, default single's dtype) and the GEMM math class's (`math`: "fp32", "tf32",
    "bf16", "fp16", "fp64"; default none beyond the dtype), unless `unit_roundoff` gives it;
    K = `reduction_length` (the longest GEMM reduction behind the tensor: the hidden size
    for a column-parallel output, ...); N = `tp_size`. rtol / atol override the te /
    allclose table (the reference's, by single's dtype).

    Arrays: DLPack (torch, numpy, JAX, CuPy), CPU or CUDA, read in place; `truth` and
    `rounding_noise` float64. On CUDA arrays the statistics are computed on the GPU (the
    arrays' device; the legacy default stream).
    """
    if policy not in _tpcheck.policy_names():
        raise ValueError(f"unknown policy {policy!r}; expected one of {policies()}")
    if policy == "truth" and truth is None:
        raise ValueError("policy 'truth' judges both runs against the fp64 truth: pass truth= "
                         "(tpcheck.truth computes it for a reference layer), or choose "
                         "policy='te', 'allclose' or 'bitwise'")
    single = _as_dlpack(single, "single")
    sharded = _as_dlpack(sharded, "sharded")
    truth = _as_dlpack(truth, "truth")
    rounding_noise = _as_dlpack(rounding_noise, "rounding_noise")
    if unit_roundoff is None:
        key = _dtype_key(dtype) if dtype is not None else _array_dtype_key(single)
        if key is not None:
            unit_roundoff = _tpcheck.dtype_unit_roundoff(key)
            if math is not None:
                unit_roundoff = max(unit_roundoff, _tpcheck.math_class_unit_roundoff(math))
    elif math is not None or dtype is not None:
        raise ValueError("give unit_roundoff or dtype/math, not both")
    raw = _tpcheck.compare(sharded, single, truth, rounding_noise, policy, rtol, atol,
                           unit_roundoff, int(reduction_length), int(tp_size), float(multiplier),
                           float(floor_factor), name)
    model = {"unit_roundoff": unit_roundoff, "reduction_length": int(reduction_length),
             "tp_size": int(tp_size), "multiplier": multiplier, "floor_factor": floor_factor}
    return Verdict(raw, model, name)


def assert_close(actual: Any, expected: Any, truth: Any = None, *, policy: Optional[str] = None,
                 msg: Optional[str] = None, **kwargs: Any) -> Verdict:
    """torch.testing.assert_close's shape, tpcheck's judgement: `actual` is the sharded
    run's tensor, `expected` the single run's. Raises AssertionError with the verdict's
    reason (and the reference suite's line under policy "te"); returns the Verdict.

    policy defaults to "truth" when `truth` is given, else "te" (the reference suite's own
    rule). Other keywords as compare().
    """
    if policy is None:
        policy = "truth" if truth is not None else "te"
    v = compare(expected, actual, truth, policy=policy, **kwargs)
    if not v.passed:
        lines = [msg] if msg else []
        lines.append(f"tpcheck ({policy}): {v.name}: {v.reason}")
        if policy == "te" and v.reference_line:
            lines.append(v.reference_line)
        raise AssertionError("\n".join(lines))
    return v


class TruthResult:
    """fp64 results of tpcheck.truth: `outputs` ({"output", "bias"?, "layernorm_output"?}),
    `grads` (parameter name → gradient, the state_dict names; empty without grad_output),
    `grad_input` (None without grad_output). numpy float64 arrays (DLPack:
    torch.from_dlpack(t.outputs["output"]) shares them)."""

    __slots__ = ("outputs", "grads", "grad_input")

    def __init__(self, raw: Mapping[str, Any]):
        self.outputs: dict[str, Any] = dict(raw["outputs"])
        self.grads: dict[str, Any] = dict(raw["grads"])
        self.grad_input: Any = raw["grad_input"]

    @property
    def output(self) -> Any:
        return self.outputs["output"]

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.outputs.items()}
        return f"TruthResult(outputs={shapes}, grads={sorted(self.grads)})"


# TransformerEngine constructor keywords that say where a module lives or how it is
# distributed, not what it computes: the truth is one f64 run on one device.
_PLACEMENT_KEYWORDS = {"params_dtype", "device", "tp_group", "tp_size", "set_parallel_mode",
                       "get_rng_state_tracker", "rng_tracker_name", "ub_overlap_ag",
                       "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_wgrad", "ub_bulk_dgrad",
                       "ub_name", "ub_overlap_ag_fprop", "ub_overlap_rs_fprop", "ub_overlap_ag_dgrad",
                       "ub_overlap_rs_dgrad", "name", "ub_bulk_wgrad"}


def _options_json(options: Optional[Mapping[str, Any]]) -> str:
    opts = {k: v for k, v in dict(options or {}).items() if k not in _PLACEMENT_KEYWORDS}
    try:
        return _json.dumps(opts)
    except TypeError as e:
        raise TypeError(f"layer options must be plain values (numbers, strings, lists): {e}") from e


def layer_parameters(layer: str, options: Optional[Mapping[str, Any]] = None) -> dict[str, tuple]:
    """The parameters tpcheck's `layer` has with these options: {state_dict name: shape}."""
    return {name: tuple(shape) for name, shape in _tpcheck.layer_parameters(layer, _options_json(options))}


def truth(layer: str, options: Optional[Mapping[str, Any]], params: Mapping[str, Any],
          inputs: Any, grad_output: Any = None, device: str = "cpu") -> TruthResult:
    """fp64 outputs (and, with grad_output, parameter and input gradients) of tpcheck's
    implementation of the reference library's `layer` ("Linear", "LayerNorm", "RMSNorm",
    "LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer").

    options: the layer's constructor keywords (TransformerEngine's names: hidden_size,
    ffn_hidden_size, activation, normalization, bias, return_bias, ...); placement keywords
    (params_dtype, device, tp_group, tp_size, ...) are ignored: the truth is one f64 run.
    params: the module's state_dict (or any name → array mapping); "_extra_state" entries
    are skipped; names and shapes must be the layer's (an error lists expected vs given).
    inputs: the input array (the whole, unsharded one). grad_output: the loss gradient of
    the output (an array), or a dict {"output", "bias", "layernorm_output"} for layers
    that return more; returned tensors not in it get zero gradient.
    """
    if isinstance(inputs, (list, tuple)):
        if len(inputs) != 1:
            raise ValueError(f"inputs: tpcheck's layers take one input, got {len(inputs)}")
        inputs = inputs[0]
    inputs = _as_dlpack(inputs, "inputs")
    prepared = {}
    for name, value in dict(params).items():
        if str(name).endswith("_extra_state"):
            continue
        prepared[str(name)] = _as_dlpack(_detached(value), f"params['{name}']")
    if grad_output is None:
        grads = {}
    elif isinstance(grad_output, Mapping):
        grads = {str(k): _as_dlpack(_detached(v), f"grad_output['{k}']") for k, v in grad_output.items()}
    else:
        grads = {"output": _as_dlpack(_detached(grad_output), "grad_output")}
    raw = _tpcheck.truth(layer, _options_json(options), prepared, _detached(inputs), grads, device)
    return TruthResult(raw)


def _detached(x: Any) -> Any:
    """A torch tensor that requires grad refuses __dlpack__; its data is what is meant."""
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) and getattr(x, "requires_grad", False) else x


def _option_default(o: Mapping[str, Any]) -> Any:
    """A run option's default as Python has it: the command line's text, typed."""
    if o["optional"]:
        return None
    text = o["default"]
    return {"flag": lambda t: t == "true", "int": int, "float": float}.get(o["kind"], str)(text)


_RUN_OPTIONS = {o["keyword"]: o for o in _tpcheck.run_options()}
_RUN_TYPES = {"flag": bool, "int": int, "float": float, "str": str, "choice": str}


def _option_text(keyword: str, value: Any) -> str:
    """The command line's text for a keyword's value, its Python type checked first (a bool
    is not an int; 1.5 is not a whole number of steps)."""
    kind = _RUN_OPTIONS[keyword]["kind"]
    if kind == "flag" and isinstance(value, bool):
        return "true" if value else "false"
    if kind == "int" and isinstance(value, _numbers.Integral) and not isinstance(value, bool):
        return str(int(value))  # numpy's integers too
    if kind == "float" and isinstance(value, _numbers.Real) and not isinstance(value, bool):
        return repr(float(value))
    if kind in ("str", "choice") and isinstance(value, str):
        return value
    expected = {"flag": "True or False", "int": "an int", "float": "a number",
                "str": "a str", "choice": "one of " + ", ".join(_RUN_OPTIONS[keyword]["choices"])}
    raise ValueError(f"{keyword}={value!r}: expected {expected[kind]} "
                     f"(`tpcheck run {_RUN_OPTIONS[keyword]['flag']}`)")


def run(**options: Any) -> dict[str, Any]:
    """Runs a suite as `tpcheck run` does and returns its report as the JSON has it (schema
    tpcheck.run/1). The keywords are `tpcheck run`'s options with their defaults (--cpu-gemm
    is cpu_gemm; an option the command line leaves unset is None here), checked by the same
    code, plus `echo`: print the console report (`quiet` shortens it as on the command
    line). Under torchrun (one process per rank, backend cuda) the NCCL id goes through the
    process group's store; ranks other than 0 return the report too (rank 0 alone prints
    and writes `json` / `html`).
    """
    bound = run.__signature__.bind(**options)  # TypeError naming an unknown keyword
    bound.apply_defaults()
    given = dict(bound.arguments)
    echo = given.pop("echo")
    if not isinstance(echo, bool):
        raise ValueError(f"echo={echo!r}: expected True or False")
    texts = {k: _option_text(k, v) for k, v in given.items() if v is not None}
    if given["backend"] in ("auto", "cuda"):
        _share_nccl_id_if_torchrun()
    report, console, _passed, _failed, _reports = _tpcheck.run(texts)
    if echo and console:
        print(console, end="", flush=True)
    return _json.loads(report)


def _run_signature() -> _inspect.Signature:
    keyword = _inspect.Parameter.KEYWORD_ONLY
    params = [_inspect.Parameter(k, keyword, default=_option_default(o),
                                 annotation=(Optional[_RUN_TYPES[o["kind"]]] if o["optional"]
                                             else _RUN_TYPES[o["kind"]]))
              for k, o in _RUN_OPTIONS.items()]
    params.append(_inspect.Parameter("echo", keyword, default=False, annotation=bool))
    return _inspect.Signature(params, return_annotation=dict[str, Any])


def _run_options_doc() -> str:
    lines = ["", "Options (`tpcheck run --help`):"]
    for k, o in _RUN_OPTIONS.items():
        lines.append(f"    {k} = {_option_default(o)!r}: {o['help']}")
    lines.append("    echo = False: print the console report (Python only)")
    return "\n".join(lines) + "\n"


# run's keywords are the run options' table (include/tpcheck/run_options.h), as the
# command line's flags are: an option added there is a keyword here.
run.__signature__ = _run_signature()  # type: ignore[attr-defined]
run.__doc__ = (run.__doc__ or "") + _run_options_doc()

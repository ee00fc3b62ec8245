"""tpcheck.compare and tpcheck.assert_close: one tensor of the sharded run judged against
the single run's (and against the fp64 truth) under one of the suite's policies.

    v = tpcheck.compare(single, sharded, truth, reduction_length=4096, tp_size=4)
    v.assert_ok()                          # tpcheck.CheckFailed with the reason

Every function here takes its tensors in the order (single, sharded[, truth]). The
statistics and the verdict are computed by the compiled module (src/numerics), the same
code the suite judges its own layers with; docs/POLICIES.md has the policies and the
truth policy's error model, docs/PYTHON.md the arrays accepted.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .. import _tpcheck
from .._errors import InputError
from .._names import array_dtype_name, dtype_name
from ._compiled import input_errors
from ._result import Result

__all__ = ["Verdict", "TruthTensor", "compare", "assert_close", "policies"]


def policies() -> list[str]:
    """The policies compare accepts: te, allclose, truth, bitwise (docs/POLICIES.md)."""
    return list(_tpcheck.policy_names())


def as_dlpack(x: Any, what: str) -> Any:
    """Objects nanobind takes as DLPack arrays: anything with __dlpack__ (torch, numpy >=
    1.22, JAX, CuPy). Python lists and scalars are refused rather than silently copied."""
    if x is None or hasattr(x, "__dlpack__"):
        return x
    raise InputError(f"{what}: {type(x).__name__} is not an array; pass a DLPack array "
                     "(torch.Tensor, numpy.ndarray, jax.Array, cupy.ndarray)")


def detached(x: Any) -> Any:
    """A torch tensor that requires grad refuses __dlpack__; its data is what is meant."""
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) and getattr(x, "requires_grad", False) else x


@dataclass(frozen=True)
class TruthTensor:
    """One tensor of a truth result with what the truth policy's error model needs from it:
    `value` (float64 array), `rounding_noise` (the probe's, or None), `reduction_length`
    (K, None when the truth did not measure it), `tp_size` (N, when the caller said it).
    `tpcheck.compare(single, sharded, t)` takes K, N and the noise from it."""

    value: Any
    reduction_length: Optional[int] = None
    tp_size: Optional[int] = None
    rounding_noise: Any = None
    name: Optional[str] = None


class Verdict(Result):
    """A comparison's verdict under one policy, and the statistics behind it.

    `passed` (also `bool(verdict)`), `status` ("pass", "warning" or "fail"), `reason` (one
    line with the figures that decided), `policy`, and `statistics`: the C++ side's
    TensorComparison as a dict (max_abs_diff at argmax / argmax_index with sharded_value and
    single_value there, rel_at_max, norm_rel_diff, count_over_allclose, count_bits_differ,
    NaN / Inf counts, and with a truth: single_vs_truth / sharded_vs_truth {max_abs, argmax,
    rms}, truth_rms, truth_max_abs, and the scale test's scale_shift, scale_shift_sigma,
    single_scale_error, truth_variation, single_error_offset_share). `error_model` holds u,
    K, N as applied (truth policy). `reference_line` is the reference suite's "NUMERICAL
    CHECK FAILED" line for this comparison (when the dtype has a tolerance). The result
    protocol (tpcheck.judge.Result): `failures`, `assert_ok()`, `to_dict()`, `to_json()`.
    """

    __slots__ = ("_passed", "status", "reason", "policy", "statistics", "error_model",
                 "reference_line", "name")

    def __init__(self, raw: Mapping[str, Any], error_model: Mapping[str, Any], name: str):
        self._passed: bool = bool(raw["passed"])
        self.status: str = raw["status"]
        self.reason: str = raw["reason"]
        self.policy: str = raw["policy"]
        self.statistics: dict[str, Any] = dict(raw["statistics"])
        self.error_model: dict[str, Any] = dict(error_model)
        self.reference_line: Optional[str] = raw.get("reference_line")
        self.name = name

    @property
    def passed(self) -> bool:
        return self._passed

    @property
    def failures(self) -> list[dict[str, Any]]:
        if self._passed:
            return []
        return [{"name": self.name, "policy": self.policy, "status": self.status,
                 "reason": self.reason}]

    def _failure_message(self) -> str:
        lines = [f"tpcheck ({self.policy}): {self.name}: {self.reason}"]
        if self.policy == "te" and self.reference_line:
            lines.append(self.reference_line)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        stats = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.statistics.items()}
        return {"name": self.name, "policy": self.policy, "passed": self._passed,
                "status": self.status, "reason": self.reason, "statistics": stats,
                "error_model": dict(self.error_model), "reference_line": self.reference_line}

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


_K_HELP = ("the longest GEMM reduction behind the tensor: the hidden size for an fc1 output, "
           "the token count for a weight gradient; tpcheck.torch.truth(module, ...) measures it "
           "(its .reduction_length, or pass truth=t.truth_for(name, tp_size=N))")
_N_HELP = "the tensor-parallel size the sharded run used"


def _model_size(given: Optional[int], carried: Optional[int], keyword: str, help_: str) -> int:
    """K or N of the truth policy: the argument, else the truth object's; never a default."""
    value = given if given is not None else carried
    if value is None:
        raise InputError(f"compare: policy 'truth' needs {keyword}= ({help_}); it was not "
                         "given and the truth carries none. Pass it, or choose policy='te', "
                         "'allclose' or 'bitwise'")
    return int(value)


def _unit_roundoff(single: Any, dtype: Any, math: Optional[str],
                   unit_roundoff: Optional[float]) -> Optional[float]:
    """u of the truth policy: given, or the coarser of the dtype's and the math class's."""
    if unit_roundoff is not None:
        if math is not None or dtype is not None:
            raise InputError(f"compare: unit_roundoff={unit_roundoff!r} with dtype={dtype!r} / "
                             f"math={math!r}; expected either u itself or the dtype and math "
                             "class it comes from, not both")
        return unit_roundoff
    key = dtype_name(dtype) if dtype is not None else array_dtype_name(single)
    if key is None:
        return None  # the compiled side names the unsupported dtype
    u = _tpcheck.dtype_unit_roundoff(key)
    return max(u, _tpcheck.math_class_unit_roundoff(math)) if math is not None else u


def compare(single: Any, sharded: Any, truth: Any = None, *, policy: str = "truth",
            dtype: Any = None, math: Optional[str] = None,
            reduction_length: Optional[int] = None, tp_size: Optional[int] = None,
            unit_roundoff: Optional[float] = None, rtol: Optional[float] = None,
            atol: Optional[float] = None, multiplier: float = 4.0, floor_factor: float = 1.0,
            rounding_noise: Any = None, name: str = "tensor") -> Verdict:
    """Judges `sharded` against `single` (both against the fp64 `truth` when given).

    Policies (docs/POLICIES.md): "truth" (default; needs `truth`): the sharded run's error
    against the truth may be at most multiplier·sqrt(tp_size) times the single run's plus a
    rounding floor floor_factor·u·sqrt(reduction_length)·|truth|; "te": the reference
    suite's rule at the max-difference element; "allclose": every element within
    atol + rtol·|single|; "bitwise".

    The truth policy's error model: u is the larger of the storage dtype's unit roundoff
    (`dtype`, default single's dtype) and the GEMM math class's (`math`: "fp32", "tf32",
    "bf16", "fp16", "fp64"), unless `unit_roundoff` gives it; K = `reduction_length` (the
    longest GEMM reduction behind the tensor) and N = `tp_size` are required: pass them, or
    pass as `truth` a TruthTensor that carries them (`tpcheck.torch.truth(...)`'s
    `truth_for(name, tp_size=N)`). rtol / atol override the te / allclose table (the
    reference's, by single's dtype).

    Arrays: DLPack (torch, numpy, JAX, CuPy), CPU or CUDA, read in place; `truth` and
    `rounding_noise` float64. On CUDA arrays the statistics are computed on the GPU.
    """
    if policy not in _tpcheck.policy_names():
        raise InputError(f"compare: unknown policy {policy!r}; expected one of {policies()}")
    carried = truth if isinstance(truth, TruthTensor) else TruthTensor(truth)
    if rounding_noise is None:
        rounding_noise = carried.rounding_noise
    if policy == "truth":
        if carried.value is None:
            raise InputError("compare: policy 'truth' judges both runs against the fp64 truth: "
                             "pass truth= (tpcheck.layer_truth for a reference layer, "
                             "tpcheck.torch.truth for any module), or choose policy='te', "
                             "'allclose' or 'bitwise'")
        k = _model_size(reduction_length, carried.reduction_length, "reduction_length", _K_HELP)
        n = _model_size(tp_size, carried.tp_size, "tp_size", _N_HELP)
    else:
        k, n = reduction_length or 1, tp_size or 1
    arrays = [as_dlpack(detached(a), what) for a, what in
              ((single, "single"), (sharded, "sharded"), (carried.value, "truth"),
               (rounding_noise, "rounding_noise"))]
    with input_errors():
        u = _unit_roundoff(arrays[0], dtype, math, unit_roundoff)
        raw = _tpcheck.compare(arrays[1], arrays[0], arrays[2], arrays[3], policy, rtol, atol, u,
                               int(k), int(n), float(multiplier), float(floor_factor), name)
    model = {"unit_roundoff": u, "reduction_length": int(k), "tp_size": int(n),
             "multiplier": multiplier, "floor_factor": floor_factor}
    return Verdict(raw, model, name)


_UNSET: Any = object()


def assert_close(single: Any = _UNSET, sharded: Any = _UNSET, truth: Any = None, *,
                 policy: Optional[str] = None, msg: Optional[str] = None,
                 actual: Any = _UNSET, expected: Any = _UNSET, **kwargs: Any) -> Verdict:
    """compare(single, sharded, truth, ...) that raises tpcheck.CheckFailed (an
    AssertionError) with the verdict's reason (and the reference suite's line under policy
    "te") when it fails; returns the Verdict.

    policy defaults to "truth" when `truth` is given, else "te" (the reference suite's own
    rule). Other keywords as compare(). `actual=` (the sharded tensor) and `expected=` (the
    single one), torch.testing.assert_close's names, are accepted for one release with a
    DeprecationWarning.
    """
    single, sharded = _old_keywords(single, sharded, actual, expected)
    if policy is None:
        policy = "truth" if truth is not None else "te"
    v = compare(single, sharded, truth, policy=policy, **kwargs)
    v.assert_ok(msg)
    return v


def _old_keywords(single: Any, sharded: Any, actual: Any, expected: Any) -> tuple[Any, Any]:
    """(single, sharded) from the arguments, mapping the deprecated actual= / expected=."""
    if actual is not _UNSET or expected is not _UNSET:
        warnings.warn("tpcheck.assert_close(actual=, expected=) is deprecated: call "
                      "assert_close(single, sharded, truth) (actual is the sharded tensor, "
                      "expected the single one)", DeprecationWarning, stacklevel=3)
        if (actual is not _UNSET and sharded is not _UNSET) or \
                (expected is not _UNSET and single is not _UNSET):
            raise InputError("assert_close: a tensor given twice (positionally and as actual= "
                             "/ expected=); expected assert_close(single, sharded, truth)")
        sharded = actual if actual is not _UNSET else sharded
        single = expected if expected is not _UNSET else single
    missing = [n for n, v in (("single", single), ("sharded", sharded)) if v is _UNSET]
    if missing:
        raise InputError(f"assert_close: missing {' and '.join(missing)}; expected "
                         "assert_close(single, sharded, truth=None, ...)")
    return single, sharded

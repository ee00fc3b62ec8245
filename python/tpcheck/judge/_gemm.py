"""The GEMM math class behind compare_tp's unit roundoff, from a cuBLASLt trace.

compare_tp runs the unsharded and the sharded module inside `tpcheck.trace()` (when the
tensors are on CUDA and a libcublasLt is loaded) and reads the numerical class of every
recorded cublasLtMatmul: the class the capability query decoded ("tf32", "fp32", "bf16",
"fp16", "fp64", "fp8"; tpcheck built with CUDA), else the one the call's compute type and
operand type ask for (COMPUTE_32F_FAST_TF32 → "tf32", COMPUTE_32F with f32 operands →
"fp32", bf16 operands → "bf16", ...). The coarsest class seen (largest unit roundoff)
becomes the truth policy's `math`: a TF32 GEMM on float32 inputs gives u = 2^-11, an FP32
one leaves the dtype's u. Without a trace (CPU tensors, no cuBLASLt loaded, a trace
already open, CUBLASLT_LOG_LEVEL set by an outside trace) or with no GEMM recorded,
torch's allow_tf32 flag decides.

A trace costs about two untraced runs (cuBLASLt writes a log line per call, tpcheck reads
them back and queries each algorithm's class), so by default compare_tp traces a module's
run once per call key: the same module on inputs and gradients of the same shapes and
dtypes, its parameters' dtypes, and torch's matmul switches (matmul_switches) run the
same GEMMs, whose classes cuBLASLt's heuristic picks from those alone. Later calls with
that key reuse the first call's classes, and the report says so (`gemm_trace_reused`);
trace_gemms=True traces every call.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import weakref
from typing import Any, Hashable, Optional

import torch

from .. import _tpcheck
from .. import _trace as cublaslt_trace

# compute types that let cuBLASLt round f32 operands (cuBLASLt's names without COMPUTE_)
_FAST = {"32F_FAST_TF32": "tf32", "32F_FAST_16BF": "bf16", "32F_FAST_16F": "fp16"}
# operand (A) dtypes, as the ledger names them, that fix the class on their own
_OPERAND = {"bf16": "bf16", "f16": "fp16", "f8e4m3": "fp8", "f8e5m2": "fp8", "f64": "fp64"}


def class_of_call(call: dict[str, Any]) -> str:
    """The numerical class of one ledger call; "" when neither the query nor the compute
    type and operand type say it."""
    if call.get("math_class"):
        return str(call["math_class"])
    compute = str(call.get("cublaslt", {}).get("compute_type", ""))
    dtypes = call.get("dtypes") or [""]
    a = str(dtypes[0])
    if a in _OPERAND:
        return _OPERAND[a]
    if compute in _FAST:
        return _FAST[compute]
    if compute.startswith("64F"):
        return "fp64"
    if compute.startswith("32F") and a == "f32":
        return "fp32"
    return ""


def class_unit_roundoff(name: str) -> Optional[float]:
    """The unit roundoff tpcheck.compare gives a math class (the quantized classes, fp8...,
    accumulate in f32: fp32's); None for a name it does not know."""
    try:
        return float(_tpcheck.math_class_unit_roundoff(name))
    except ValueError:  # parse_math_class refuses the name: not a class compare models
        return None


def coarsest_class(classes: set[str]) -> Optional[str]:
    """The modelled class with the largest unit roundoff (ties: by name), None if none."""
    known = [(u, c) for c in classes if (u := class_unit_roundoff(c)) is not None]
    return max(known)[1] if known else None


def choose_math(math: Optional[str], unit_roundoff: Optional[float], classes: Optional[set[str]],
                device: torch.device) -> tuple[Optional[str], str]:
    """(math class for tpcheck.compare, where it came from). An explicit `unit_roundoff`
    or `math` wins; then the trace's classes; then torch's allow_tf32 flag on CUDA; else
    the dtype's u alone (math None)."""
    if unit_roundoff is not None:
        return None, "unit_roundoff argument"
    if math is not None:
        return math, "math argument"
    if classes:
        found = coarsest_class(classes)
        if found is not None:
            return found, "trace"
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32", "torch.backends.cuda.matmul.allow_tf32"
    return None, "dtype"


def matmul_switches() -> tuple:
    """torch's switches that choose a float GEMM's compute type: TF32, the reduced-precision
    reductions, the float32 matmul precision, and autocast on CUDA."""
    m = torch.backends.cuda.matmul
    return (m.allow_tf32, m.allow_bf16_reduced_precision_reduction,
            m.allow_fp16_reduced_precision_reduction, torch.get_float32_matmul_precision(),
            torch.backends.cudnn.allow_tf32, torch.is_autocast_enabled("cuda"),
            str(torch.get_autocast_dtype("cuda")))


# module → {call key: the summary of its first traced run with that key}
_first_traces: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


class GemmTrace:
    """`with GemmTrace(wanted, device, reuse=(module, key)): run()` records the classes of
    the GEMMs cuBLASLt ran in the block (`classes`, `calls`), or says in `why_not` why
    nothing was traced. With `reuse`, a block whose (module, key) was traced before is not
    traced again: its summary is the first one's (module docstring). A failure of the trace
    itself never hides or replaces an error of the block."""

    def __init__(self, wanted: bool, device: torch.device,
                 reuse: Optional[tuple[torch.nn.Module, Hashable]] = None):
        self.wanted = wanted
        self.device = device
        self.reuse = reuse
        self.reused: Optional[dict[str, Any]] = None
        self.classes: set[str] = set()
        self.calls = 0
        self.why_not: Optional[str] = (None if wanted else
                                       "not traced: the inputs are not on CUDA, or trace_gemms=False")
        self.query_error: Optional[str] = None  # the capability query failed: classes from compute types
        self._query = False
        self._trace = None
        self._ledger = None
        self._dir: Optional[str] = None

    def __enter__(self) -> "GemmTrace":
        if not self.wanted:
            return self
        if self.reuse is not None:
            module, key = self.reuse
            self.reused = _first_traces.get(module, {}).get(key)
            if self.reused is not None:
                return self
        if os.environ.get("CUBLASLT_LOG_LEVEL", "0").strip() not in ("", "0"):
            # the process is traced from outside (tpcheck trace, tpcheck emulate --trace):
            # taking cuBLASLt's one logger would cut those lines out of its log
            self.why_not = ("CUBLASLT_LOG_LEVEL is set: the process is traced from outside; "
                            "its logger is left alone")
            return self
        try:
            if not cublaslt_trace.loaded_cublaslt() and self.device.type == "cuda":
                # torch loads cuBLAS(Lt) with its first matmul on the device
                torch.ones(2, 2, device=self.device) @ torch.ones(2, 2, device=self.device)
            if not cublaslt_trace.loaded_cublaslt():
                self.why_not = "no libcublasLt loaded in this process"
                return self
            self._dir = tempfile.mkdtemp(prefix="tpcheck-compare-trace-")
            self._query = bool(_tpcheck.built_with_cuda()) and self.device.type == "cuda"
            self._trace = cublaslt_trace.trace(query=self._query, directory=self._dir)
            self._ledger = self._trace.__enter__()
        except Exception as e:  # a trace already open, a cuBLASLt without the logger API
            self.why_not = f"tpcheck.trace() could not start: {type(e).__name__}: {e}"
            self._trace = None
            self._cleanup()
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self._trace is None:
            return False
        try:
            try:
                self._trace.__exit__(*exc)
                calls = self._ledger.calls
            except Exception as e:
                if not self._query:
                    raise
                # the capability query failed (no GPU for tpcheck's own cuBLASLt...): the
                # logs are ours, read them again without it
                logs = sorted(glob.glob(os.path.join(self._dir, "*.log")))
                ledger = json.loads(_tpcheck.trace_ledger(logs, os.getpid(), False))
                calls = [c for p in ledger.get("processes", []) for c in p.get("gemms", [])]
                self.query_error = f"{type(e).__name__}: {e}"
            self.calls = len(calls)
            self.classes = {c for c in map(class_of_call, calls) if c}
            if not calls:
                self.why_not = "the trace recorded no cublasLtMatmul"
            if self.reuse is not None and exc[0] is None and self.query_error is None:
                module, key = self.reuse
                _first_traces.setdefault(module, {})[key] = self.summary()
        except Exception as e:
            self.why_not = f"the trace could not be read: {type(e).__name__}: {e}"
        finally:
            self._cleanup()
        return False  # the block's own exception, if any, goes on

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def summary(self) -> dict[str, Any]:
        """What this rank's trace found (sent to the judging rank); "reused": whether it is
        an earlier call's."""
        if self.reused is not None:
            return dict(self.reused, reused=True)
        return {"classes": sorted(self.classes), "calls": self.calls, "why_not": self.why_not,
                "reused": False}

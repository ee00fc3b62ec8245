"""tpcheck from Python: judge your own tensors, get the fp64 truth of a layer, run the suite.

    import tpcheck
    v = tpcheck.compare(single, sharded, truth, reduction_length=4096, tp_size=4)
    v.assert_ok()                           # tpcheck.CheckFailed with the reason
    tpcheck.assert_close(single, sharded, truth, reduction_length=4096, tp_size=4)
    t = tpcheck.layer_truth("LayerNormMLP", {"hidden_size": 64, "ffn_hidden_size": 256},
                            module.state_dict(), x, grad_output=dy)
    report = tpcheck.run(suite="te", tp=2, backend="cpu")   # a RunReport (a dict)
    with tpcheck.trace() as t: ...          # the cuBLASLt calls of any library in the block

One convention everywhere: tensors in the order (single, sharded[, truth]); every result
(Verdict, tpcheck.torch's TPReport, RunReport) has `passed`, `failures`, `assert_ok()`,
`to_dict()` and `to_json()`; every error is a `tpcheck.Error` (InputError, CheckFailed,
RunError). The fp64 truth of any PyTorch module, compare_tp and the module truth are in
tpcheck.judge (also tpcheck.torch.truth / compare_tp); importing tpcheck imports no torch.

Arrays are anything that speaks DLPack (PyTorch, numpy, JAX, CuPy), on the CPU or a CUDA
GPU, read in place (no copies): float64, float32, float16, bfloat16, float8_e4m3fn,
float8_e5m2, C-contiguous. docs/PYTHON.md is the manual.
"""

from __future__ import annotations

import warnings as _warnings
from typing import Any

from ._errors import CheckFailed, Error, InputError, RunError
from ._run import RunReport, run
from ._trace import Trace, loaded_cublaslt, trace
from .judge._layer_truth import LayerRun, LayerTruth, layer_parameters, layer_run, layer_truth
from .judge._verdict import TruthTensor, Verdict, assert_close, compare, policies

__all__ = ["Error", "InputError", "CheckFailed", "RunError", "Verdict", "TruthTensor",
           "compare", "assert_close", "policies", "LayerTruth", "layer_truth", "LayerRun",
           "layer_run", "layer_parameters", "RunReport", "run", "trace", "Trace", "loaded_cublaslt"]


def truth(*args: Any, **kwargs: Any) -> LayerTruth:
    """Deprecated name of tpcheck.layer_truth (the truth of a reference layer); the truth of
    any PyTorch module is tpcheck.torch.truth."""
    _warnings.warn("tpcheck.truth is deprecated: call tpcheck.layer_truth (the reference "
                   "layer's truth; tpcheck.torch.truth is the truth of any nn.Module)",
                   DeprecationWarning, stacklevel=2)
    return layer_truth(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "TruthResult":
        _warnings.warn("tpcheck.TruthResult is deprecated: it is tpcheck.LayerTruth",
                       DeprecationWarning, stacklevel=2)
        return LayerTruth
    raise AttributeError(f"module 'tpcheck' has no attribute {name!r}")

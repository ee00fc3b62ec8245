"""tpcheck.judge: judging a tensor-parallel run against its unsharded twin and the fp64
truth. docs/JUDGE.md is the manual, docs/POLICIES.md the policies.

Tensors (no torch needed; also at the top of the package, `tpcheck.compare`, ...):
    compare(single, sharded, truth, ...) -> Verdict     one tensor under one policy
    assert_close(single, sharded, truth, ...)           the same, raising CheckFailed
    layer_truth(layer, options, params, x) -> LayerTruth  tpcheck's reference layers
    layer_run(layer, options, params, x, dtype=...) -> LayerRun  the same, in float32/bf16
    TruthTensor                                         a truth value with its K, N, noise
    Result                                              the result protocol (passed,
                                                        failures, assert_ok, to_dict, to_json)
PyTorch modules (imported on first use; also tpcheck.torch.truth / compare_tp):
    module_truth(module, *args, ...) -> ModuleTruth     the fp64 twin with its rounding probe
    compare_tp(single, sharded, args, ...) -> TPReport  every rank's shard judged
    CompareOptions                                      compare_tp's options
    register_reference(target, fn)                      a float64 stand-in for a kernel
    TruthRunError                                       the module truth cannot run

Modules: _verdict (compare, Verdict), _layer_truth, _result (the protocol), _module_truth
(the module truth: _dispatch is its dispatch mode, _probe the rounding probe's factors,
_lifting the precision casts it lifts, _references the float64 stand-ins for kernels and
_reference_kernels the shipped ones), _compiled (the compiled module's argument errors as
InputError), _compare_tp
(compare_tp's phases over CompareOptions; _group its collectives, _runs the forward and
backward runs, _gather the shards' reassembly, _gemm the GEMM math class, _report
TPReport), _naming (one name for each tensor of a call). None of them registers a
torch.distributed backend (tpcheck.emulate does, when asked).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._layer_truth import LayerRun, LayerTruth, layer_parameters, layer_run, layer_truth
from ._result import Result
from ._verdict import TruthTensor, Verdict, assert_close, compare, policies

# name -> the submodule that defines it; those modules import torch
_TORCH_SIDE = {
    "module_truth": "_module_truth", "ModuleTruth": "_module_truth",
    "TruthRunError": "_dispatch", "compare_tp": "_compare_tp", "CompareOptions": "_compare_tp",
    "TPReport": "_report", "register_reference": "_references",
    "unregister_reference": "_references",
}

__all__ = ["compare", "assert_close", "policies", "Verdict", "TruthTensor", "Result",
           "layer_truth", "layer_run", "layer_parameters", "LayerTruth", "LayerRun",
           *_TORCH_SIDE]


def __getattr__(name: str) -> Any:
    module = _TORCH_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module 'tpcheck.judge' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_SIDE))

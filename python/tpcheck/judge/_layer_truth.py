"""tpcheck.layer_truth: the fp64 truth of one of tpcheck's reference layers (its own
implementation of TransformerEngine's Linear, LayerNorm, RMSNorm, LayerNormLinear,
LayerNormMLP, MultiheadAttention, TransformerLayer; docs/LAYERS.md), given the module's
options and parameters; tpcheck.layer_run: the same layer as the suite runs it, in float32
(TF32 GEMMs on CUDA by default), bfloat16 or float16, to measure it against the real
library on the same parameters (docs/LAYERS.md, "Fidelity").

    t = tpcheck.layer_truth("LayerNormMLP", {"hidden_size": 64, "ffn_hidden_size": 256},
                            module.state_dict(), x, grad_output=dy)
    t.output, t.input_grads["input"], t.grads["fc1_weight"]      # numpy float64
    r = tpcheck.layer_run("LayerNormMLP", {...}, module.state_dict(), x, grad_output=dy,
                          dtype="float32", device="cuda")         # float32 values, as float64

For any nn.Module use the module truth, tpcheck.torch.truth (tpcheck.judge.module_truth):
both results have the same fields (outputs, output, input_grads, grads).
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Mapping, Optional

from .. import _tpcheck
from .._errors import InputError
from .._names import dtype_name
from ._compiled import input_errors
from ._verdict import TruthTensor, as_dlpack, detached

__all__ = ["LayerTruth", "LayerRun", "layer_truth", "layer_run", "layer_parameters"]


class _LayerResults:
    """`outputs` ({"output", "bias"?, "layernorm_output"?}), `output` (outputs["output"]),
    `input_grads` ({"input": ...}; empty without grad_output), `grads` (parameter name →
    gradient, the state_dict names; empty without grad_output): numpy float64 arrays
    (DLPack: torch.from_dlpack shares them)."""

    __slots__ = ("outputs", "grads", "input_grads")

    def __init__(self, raw: Mapping[str, Any]):
        self.outputs: dict[str, Any] = dict(raw["outputs"])
        self.grads: dict[str, Any] = dict(raw["grads"])
        grad = raw["grad_input"]
        self.input_grads: dict[str, Any] = {} if grad is None else {"input": grad}

    @property
    def output(self) -> Any:
        return self.outputs["output"]

    def tensors(self) -> dict[str, Any]:
        """Every result under one name space: outputs, "input", then the parameters."""
        return {**self.outputs, **self.input_grads, **self.grads}


class LayerRun(_LayerResults):
    """Results of tpcheck.layer_run: the values the layer computed in `dtype` (tpcheck's
    name: "f32", "bf16", "f16"), held exactly as float64 arrays; `tf32` whether its float32
    GEMMs were in the TF32 class."""

    __slots__ = ("dtype", "tf32")

    def __init__(self, raw: Mapping[str, Any], dtype: str, tf32: bool):
        super().__init__(raw)
        self.dtype = dtype
        self.tf32 = tf32

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.outputs.items()}
        return f"LayerRun({self.dtype}, outputs={shapes}, grads={sorted(self.grads)})"


class LayerTruth(_LayerResults):
    """fp64 results of tpcheck.layer_truth (the fields of _LayerResults).
    `truth_for(name, ...)` gives one of them to tpcheck.compare."""

    __slots__ = ()

    @property
    def grad_input(self) -> Any:
        """Deprecated: input_grads["input"] (None without grad_output)."""
        warnings.warn("LayerTruth.grad_input is deprecated: use input_grads['input'] (the "
                      "field the module truth has too)", DeprecationWarning, stacklevel=2)
        return self.input_grads.get("input")

    def truth_for(self, name: str, *, reduction_length: Optional[int] = None,
                  tp_size: Optional[int] = None) -> TruthTensor:
        """The tensor `name` for tpcheck.compare, with the error model's K and N given here
        (the layer truth does not measure K: pass the layer's longest GEMM reduction)."""
        found = self.tensors()
        if name not in found:
            raise InputError(f"LayerTruth.truth_for: no tensor {name!r}; expected one of "
                             f"{sorted(found)}")
        return TruthTensor(found[name], reduction_length, tp_size, None, name)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.outputs.items()}
        return f"LayerTruth(outputs={shapes}, grads={sorted(self.grads)})"


# TransformerEngine constructor keywords that say where a module lives or how it is
# distributed, not what it computes: the truth is one f64 run on one device.
_PLACEMENT_KEYWORDS = frozenset({
    "params_dtype", "device", "tp_group", "tp_size", "set_parallel_mode",
    "get_rng_state_tracker", "rng_tracker_name", "name", "ub_name", "ub_overlap_ag",
    "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_wgrad", "ub_bulk_dgrad",
    "ub_overlap_ag_fprop", "ub_overlap_rs_fprop", "ub_overlap_ag_dgrad"})


def _options_json(options: Optional[Mapping[str, Any]]) -> str:
    opts = {k: v for k, v in dict(options or {}).items() if k not in _PLACEMENT_KEYWORDS}
    try:
        return json.dumps(opts)
    except TypeError as e:
        raise InputError(f"layer options must be plain values (numbers, strings, lists): {e}") from e


def layer_parameters(layer: str, options: Optional[Mapping[str, Any]] = None) -> dict[str, tuple]:
    """The parameters tpcheck's `layer` has with these options: {state_dict name: shape}."""
    with input_errors():
        shapes = _tpcheck.layer_parameters(layer, _options_json(options))
    return {name: tuple(shape) for name, shape in shapes}


def _arrays(params: Mapping[str, Any], grad_output: Any) -> tuple[dict, dict]:
    """The parameters (without TransformerEngine's "_extra_state") and the output
    gradients by name, as DLPack arrays."""
    prepared = {str(k): as_dlpack(detached(v), f"params['{k}']")
                for k, v in dict(params).items() if not str(k).endswith("_extra_state")}
    if grad_output is None:
        grads = {}
    elif isinstance(grad_output, Mapping):
        grads = {str(k): as_dlpack(detached(v), f"grad_output['{k}']")
                 for k, v in grad_output.items()}
    else:
        grads = {"output": as_dlpack(detached(grad_output), "grad_output")}
    return prepared, grads


def layer_truth(layer: str, options: Optional[Mapping[str, Any]], params: Mapping[str, Any],
                inputs: Any, grad_output: Any = None, device: str = "cpu") -> LayerTruth:
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
    arrays = _layer_arrays(params, inputs, grad_output)
    with input_errors():
        raw = _tpcheck.run_layer(layer, _options_json(options), *arrays, device, dtype="f64")
    return LayerTruth(raw)


def layer_run(layer: str, options: Optional[Mapping[str, Any]], params: Mapping[str, Any],
              inputs: Any, grad_output: Any = None, *, dtype: Any = "float32",
              device: str = "cuda", tf32: bool = True, tp_size: int = 1,
              recipe: Optional[str] = None) -> LayerRun:
    """tpcheck's `layer` run as the suite runs it, on the caller's parameters, in `dtype`
    ("float32", "bfloat16", "float16", or a torch/numpy dtype): the parameters, input and
    grad_output are rounded to it first (exact when they already are in it), every op
    computes in it, and float32 GEMMs are in the TF32 class when `tf32` (on CUDA cuBLASLt's
    CUBLAS_COMPUTE_32F_FAST_TF32, as TransformerEngine's float32 GEMMs; on the CPU their
    operands rounded to TF32, as the suite's CPU runs do). The arguments are
    layer_truth's; the results are the run's values, exactly, in float64 arrays. For the
    truth use layer_truth.

    tp_size > 1 runs the layer sharded over that many ranks as `tpcheck run --backend
    <device> --tp N --comm emulated` does (threads of this process, even inside a torchrun
    or emulate rank: on the CPU the thread group, on CUDA every rank on GPU 0 over the
    device group in NCCL's ring order), each rank on its shards of the full parameters,
    input and output gradients given here (the layer's options say the parallel mode and
    sequence parallel); the results are the full tensors reassembled from the ranks' pieces
    (a replicated one: rank 0's).

    recipe: the quantized recipe of every Linear GEMM ("fp8" delayed scaling, "fp8_cs",
    "fp8_block_scaling", "mxfp8", "nvfp4"; docs/QUANTIZATION.md), as one step of `tpcheck
    run --recipe` runs it: delayed scaling with its initial scales (1), as the reference
    library's first step. None: high precision."""
    name = dtype_name(dtype)
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise InputError(f"layer_run: tp_size {tp_size!r}; expected an int >= 1")
    if name not in ("f32", "bf16", "f16"):
        raise InputError(f"layer_run: dtype {dtype!r}; expected float32, bfloat16 or float16 "
                         "(the float64 run is layer_truth)")
    arrays = _layer_arrays(params, inputs, grad_output)
    with input_errors():
        raw = _tpcheck.run_layer(layer, _options_json(options), *arrays, device, dtype=name,
                                 allow_tf32=bool(tf32), tp_size=tp_size,
                                 recipe="none" if recipe is None else str(recipe))
    return LayerRun(raw, name, bool(tf32) and name == "f32")


def _layer_arrays(params: Mapping[str, Any], inputs: Any,
                  grad_output: Any) -> tuple[dict, Any, dict]:
    """(parameters, input, output gradients) as the compiled run takes them."""
    if isinstance(inputs, (list, tuple)):
        if len(inputs) != 1:
            raise InputError(f"inputs: tpcheck's layers take one input, got {len(inputs)}")
        inputs = inputs[0]
    prepared, grads = _arrays(params, grad_output)
    return prepared, as_dlpack(detached(inputs), "inputs"), grads

"""The module truth: the fp64 truth of any nn.Module, with its rounding noise
(tpcheck.judge.module_truth, also tpcheck.torch.truth).

    t = module_truth(mlp, x, grad_output=dy)
    t.outputs["output"], t.input_grads["input"], t.grads["fc1.weight"]   # float64
    t.noise.grads["fc1.weight"]         # what one rounding of everything moves it by

The module is deep-copied and converted to float64 on its own device, the inputs are cast
to float64, and forward and backward run once exactly as the module's code says, under a
dispatch mode (_dispatch) that refuses anything that would make the answer not float64 (a
cast, an FP8 op, an op without a float64 kernel) or not reproducible (a random op without
a seed).

With probe=True the same computation runs a second time with every op's result multiplied
by 1 + 2^-30·r (r uniform in [-1, 1), the suite's probe stream): `noise` = (probed −
truth) / 2^-30 is, to first order, how far one rounding of every intermediate moves each
element: the `rounding_noise` of tpcheck.compare, whose floor keeps the truth policy fair
on tensors whose exact value cancels to ~0 (an attention key-bias gradient) while their
rounding errors do not. docs/JUDGE.md is the manual.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Optional

import torch

from .._errors import InputError
from .._names import (PROBE_U, REPORT_KIND_INPUT_GRADIENT, REPORT_KIND_OUTPUT,
                      REPORT_KIND_PARAMETER_GRADIENT)
from ._dispatch import F64TruthMode
from ._naming import named_tensors
from ._runs import backward_from, input_gradients, leaf_inputs, one_device
from ._verdict import TruthTensor

__all__ = ["ModuleTruth", "module_truth"]

_WHO = "tpcheck.torch.truth"


class ModuleTruth:
    """float64 results of one run of a module: `outputs`, `input_grads`, `grads`, each a
    dict name → tensor (outputs: "output" for a lone tensor, "output.0", "output.key" for
    tuples and dicts; inputs: "input" for a lone tensor argument, else "input.0",
    "input.<keyword>"; parameters by named_parameters()); `output` is the first output.
    `noise` is a ModuleTruth of the rounding noise (None without the probe);
    `reduction_length` the longest GEMM reduction the run made (K of the truth policy),
    `gemm_calls` how many GEMMs it made, `backward` whether a backward ran (else the
    gradients are empty). `truth_for(name, tp_size=N)` gives one tensor to tpcheck.compare."""

    __slots__ = ("outputs", "input_grads", "grads", "noise", "reduction_length", "gemm_calls",
                 "backward")

    def __init__(self, outputs: dict, input_grads: dict, grads: dict,
                 noise: Optional["ModuleTruth"] = None, reduction_length: int = 0,
                 gemm_calls: int = 0, backward: bool = True):
        self.outputs = outputs
        self.input_grads = input_grads
        self.grads = grads
        self.noise = noise
        self.reduction_length = reduction_length
        self.gemm_calls = gemm_calls
        self.backward = backward

    @property
    def output(self) -> torch.Tensor:
        """The first output."""
        return next(iter(self.outputs.values()))

    def tensors(self) -> dict[str, tuple[str, torch.Tensor]]:
        """Every tensor under one name space: name → (kind, tensor), kind one of the
        suite's report kinds (tpcheck._names.REPORT_KINDS)."""
        out = {k: (REPORT_KIND_OUTPUT, v) for k, v in self.outputs.items()}
        out.update({k: (REPORT_KIND_INPUT_GRADIENT, v) for k, v in self.input_grads.items()})
        out.update({k: (REPORT_KIND_PARAMETER_GRADIENT, v) for k, v in self.grads.items()})
        return out

    def truth_for(self, name: str, *, tp_size: Optional[int] = None) -> TruthTensor:
        """Tensor `name` with this run's K (and its rounding noise, with the probe) for
        tpcheck.compare(single, sharded, truth); `tp_size` is the N of the sharded run."""
        found = self.tensors()
        if name not in found:
            raise InputError(f"ModuleTruth.truth_for: no tensor {name!r}; expected one of "
                             f"{sorted(found)}")
        noise = self.noise.tensors()[name][1].contiguous() if self.noise is not None else None
        return TruthTensor(found[name][1].contiguous(), max(1, self.reduction_length), tp_size,
                           noise, name)

    def __repr__(self) -> str:
        return (f"ModuleTruth(outputs={list(self.outputs)}, input_grads={list(self.input_grads)}, "
                f"grads={list(self.grads)}, K={self.reduction_length}, "
                f"probe={'yes' if self.noise is not None else 'no'})")


def _f64_leaf(_name: str, t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.is_floating_point() else t


def _run_once(module: torch.nn.Module, args: tuple, kwargs: dict, grad_output: Any,
              loss: Optional[Callable], backward: bool, mode: F64TruthMode,
              rng_seed: Optional[int]) -> ModuleTruth:
    """One float64 forward (and backward, unless `backward` is False) of a deep copy of
    `module` under `mode`."""
    model = copy.deepcopy(module).to(torch.float64)
    for p in model.parameters():
        p.grad = None
    f_args, f_kwargs = leaf_inputs(args, kwargs, _f64_leaf)
    grads = None
    if grad_output is not None:
        grads = {k: g.detach().to(torch.float64)
                 for k, g in named_tensors(grad_output, "output").items()}
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    with mode:
        out = model(*f_args, **f_kwargs)
        out_named = named_tensors(out, "output")
        if not backward:
            ran = False
        elif loss is not None:
            ran = _loss_backward(loss(out))
        else:
            ran = backward_from(out_named, grads, _WHO)
    input_grads = input_gradients(f_args, f_kwargs) if ran else {}
    params = {k: (p.grad.detach() if p.grad is not None else torch.zeros_like(p.detach()))
              for k, p in model.named_parameters() if p.requires_grad} if ran else {}
    return ModuleTruth({k: v.detach() for k, v in out_named.items()}, input_grads, params, None,
                       mode.reduction_length, mode.gemm_calls, ran)


def _loss_backward(value: Any) -> bool:
    if not (isinstance(value, torch.Tensor) and value.numel() == 1):
        raise InputError(f"{_WHO}: loss(output) returned {type(value).__name__} "
                         f"{getattr(value, 'shape', '')}; expected a one-element tensor")
    value.backward()
    return True


def module_truth(module: torch.nn.Module, *args: Any, grad_output: Any = None,
                 loss: Optional[Callable[[Any], torch.Tensor]] = None, probe: bool = True,
                 probe_seed: int = 1234, rng_seed: Optional[int] = None,
                 backward: bool = True, **kwargs: Any) -> ModuleTruth:
    """The fp64 truth of `module(*args, **kwargs)` and, with probe=True, its rounding noise.

    module: any nn.Module (left untouched: a deep copy runs, in float64, on its device).
    args / kwargs: the module's inputs; floating tensors are cast to float64 and get input
    gradients, anything else (token ids, masks, flags) is passed as is.
    grad_output: the loss gradient of the output (a tensor, or a tuple/dict like the output);
    or loss: a function of the output returning a scalar; with neither, backward runs only
    when the output is a scalar (else forward only: no gradients, `backward` False).
    backward=False: forward only, whatever grad_output or loss say.
    probe_seed: the probe stream's seed (the suite uses the run's seed).
    rng_seed: allows random ops (dropout...), seeding torch's generator with it before each
    run; without it they are refused by name.

    Errors: TruthRunError (naming the aten op) for an op without a float64 kernel, a
    floating result not in float64 (a cast or autocast in the module, FP8), a random op
    without rng_seed; InputError for inputs on more than one device or a grad_output that
    does not fit.
    """
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{_WHO}: module is a {type(module).__name__}; expected a "
                         "torch.nn.Module")
    if loss is not None and grad_output is not None:
        raise InputError(f"{_WHO}: give grad_output or loss, not both")
    one_device(_WHO, args, kwargs, module)
    exact = _run_once(module, args, kwargs, grad_output, loss, backward,
                      F64TruthMode(rng_seed=rng_seed), rng_seed)
    if probe:
        probed = _run_once(module, args, kwargs, grad_output, loss, backward,
                           F64TruthMode(probe_u=PROBE_U, probe_seed=probe_seed, rng_seed=rng_seed),
                           rng_seed)
        exact.noise = ModuleTruth(*(_noise(getattr(probed, f), getattr(exact, f))
                                    for f in ("outputs", "input_grads", "grads")),
                                  backward=exact.backward)
    return exact


def _noise(probed: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> dict:
    """(probed − truth) / PROBE_U per tensor: one f64 rounding, then an exact scaling."""
    return {k: (probed[k] - exact[k]) * (1.0 / PROBE_U) for k in exact}

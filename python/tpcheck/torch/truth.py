"""tpcheck.torch.truth: the fp64 truth of any nn.Module, with its rounding noise.

    from tpcheck.torch.truth import truth
    t = truth(mlp, x, grad_output=dy)
    t.outputs["output"], t.input_grads["input"], t.grads["fc1.weight"]   # float64
    t.noise.grads["fc1.weight"]         # what one rounding of everything moves it by

The module is deep-copied and converted to float64 on its own device, the inputs are cast
to float64, and forward and backward run once exactly as the module's code says — under a
dispatch mode that refuses anything that would make the answer not float64 (a cast, an
FP8 op, an op without a float64 kernel) or not reproducible (a random op without a seed).

With probe=True the same computation runs a second time with every op's result multiplied
by 1 + 2^-30·r (r uniform in [-1, 1), the suite's probe stream): `noise` = (probed −
truth) / 2^-30 is, to first order, how far one rounding of every intermediate moves each
element — the `rounding_noise` of tpcheck.compare, whose floor keeps the truth policy fair
on tensors whose exact value cancels to ~0 (an attention key-bias gradient) while their
rounding errors do not. docs/JUDGE.md is the manual.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Optional

import torch
from torch.utils._pytree import tree_map

from ._judge_dispatch import F64TruthMode, TruthRunError
from ._judge_names import flat_named_tensors, input_names

PROBE_U = 2.0 ** -30  # the suite's kProbeU (src/suite/runner.cpp)

__all__ = ["truth", "TorchTruth", "TruthRunError", "PROBE_U"]


class TorchTruth:
    """float64 results of one run of a module: `outputs`, `input_grads`, `grads` — each a
    dict name → tensor (outputs: "output" for a lone tensor, "output.0", "output.key" for
    tuples and dicts; inputs: "input" for a lone floating tensor argument, else "input.0",
    "input.<keyword>"; parameters by named_parameters()). `noise` is a TorchTruth of the
    rounding noise (None without the probe); `reduction_length` the longest GEMM reduction
    the run made (K of the truth policy), `gemm_calls` how many GEMMs it made."""

    __slots__ = ("outputs", "input_grads", "grads", "noise", "reduction_length", "gemm_calls")

    def __init__(self, outputs: dict, input_grads: dict, grads: dict, noise: Optional["TorchTruth"] = None,
                 reduction_length: int = 0, gemm_calls: int = 0):
        self.outputs = outputs
        self.input_grads = input_grads
        self.grads = grads
        self.noise = noise
        self.reduction_length = reduction_length
        self.gemm_calls = gemm_calls

    @property
    def output(self) -> torch.Tensor:
        """The first output."""
        return next(iter(self.outputs.values()))

    def tensors(self) -> dict[str, tuple[str, torch.Tensor]]:
        """Every tensor under one name space: name → (kind, tensor); kind is "output",
        "input_gradient" or "parameter_gradient" (the suite's report kinds)."""
        out = {k: ("output", v) for k, v in self.outputs.items()}
        out.update({k: ("input_gradient", v) for k, v in self.input_grads.items()})
        out.update({k: ("parameter_gradient", v) for k, v in self.grads.items()})
        return out

    def __repr__(self) -> str:
        return (f"TorchTruth(outputs={list(self.outputs)}, input_grads={list(self.input_grads)}, "
                f"grads={list(self.grads)}, K={self.reduction_length}, "
                f"probe={'yes' if self.noise is not None else 'no'})")


def _module_device(module: torch.nn.Module, args: tuple, kwargs: dict) -> torch.device:
    """The one device of the module's tensors and the inputs; an error naming two if not one."""
    seen: dict[str, str] = {}
    for name, p in list(module.named_parameters()) + list(module.named_buffers()):
        seen.setdefault(str(p.device), f"parameter/buffer {name!r}")
    for name, t in flat_named_tensors((args, kwargs), input_names(args, kwargs)).items():
        seen.setdefault(str(t.device), f"input {name!r}")
    if len(seen) > 1:
        desc = "; ".join(f"{what} on {dev}" for dev, what in seen.items())
        raise ValueError(f"tpcheck.torch.truth: the module and its inputs are on more than one "
                         f"device ({desc}); expected one device")
    return torch.device(next(iter(seen))) if seen else torch.device("cpu")


def _as_f64_input(x: Any) -> Any:
    """A float64 leaf copy of a floating tensor (requiring grad), anything else unchanged."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(torch.float64).requires_grad_(True)
    return x


def _run_once(module: torch.nn.Module, args: tuple, kwargs: dict, grad_output: Any,
              loss: Optional[Callable], mode: F64TruthMode, rng_seed: Optional[int]) -> TorchTruth:
    model = copy.deepcopy(module).to(torch.float64)
    for p in model.parameters():
        p.grad = None
    f_args = tree_map(_as_f64_input, args)
    f_kwargs = tree_map(_as_f64_input, kwargs)
    grads_named = {}
    if grad_output is not None:
        grads_named = {k: g.detach().to(torch.float64)
                       for k, g in flat_named_tensors(grad_output, "output").items()}
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    with mode:
        out = model(*f_args, **f_kwargs)
        out_named = flat_named_tensors(out, "output")
        diff_outputs = {k: v for k, v in out_named.items() if v.requires_grad}
        if loss is not None:
            value = loss(out)
            if not (isinstance(value, torch.Tensor) and value.numel() == 1):
                raise ValueError(f"tpcheck.torch.truth: loss(output) returned {type(value).__name__} "
                                 f"{getattr(value, 'shape', '')}; expected a one-element tensor")
            value.backward()
        elif grad_output is not None:
            missing = sorted(set(grads_named) - set(out_named))
            if missing:
                raise ValueError(f"tpcheck.torch.truth: grad_output has {missing}, the module's "
                                 f"outputs are {sorted(out_named)}")
            for k, g in grads_named.items():
                if k in diff_outputs and tuple(g.shape) != tuple(diff_outputs[k].shape):
                    raise ValueError(f"tpcheck.torch.truth: grad_output {k!r} has shape "
                                     f"{tuple(g.shape)}, the output {tuple(diff_outputs[k].shape)}")
                if k in diff_outputs and g.device != diff_outputs[k].device:
                    raise ValueError(f"tpcheck.torch.truth: grad_output {k!r} is on {g.device}, "
                                     f"the output on {diff_outputs[k].device}")
            pairs = [(diff_outputs[k], g) for k, g in grads_named.items() if k in diff_outputs]
            if pairs:
                torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        elif len(diff_outputs) == 1 and next(iter(diff_outputs.values())).numel() == 1:
            next(iter(diff_outputs.values())).backward()
    outputs = {k: v.detach() for k, v in out_named.items()}
    backward_ran = loss is not None or grad_output is not None or (
        len(diff_outputs) == 1 and next(iter(diff_outputs.values())).numel() == 1)
    input_grads, grads = {}, {}
    if backward_ran:
        for k, t in flat_named_tensors((f_args, f_kwargs), input_names(args, kwargs)).items():
            if t.requires_grad:
                input_grads[k] = t.grad if t.grad is not None else torch.zeros_like(t)
        for k, p in model.named_parameters():
            if p.requires_grad:
                grads[k] = p.grad.detach() if p.grad is not None else torch.zeros_like(p.detach())
    return TorchTruth(outputs, input_grads, grads, None, mode.reduction_length, mode.gemm_calls)


def truth(module: torch.nn.Module, *args: Any, grad_output: Any = None,
          loss: Optional[Callable[[Any], torch.Tensor]] = None, probe: bool = True,
          probe_seed: int = 1234, rng_seed: Optional[int] = None, **kwargs: Any) -> TorchTruth:
    """The fp64 truth of `module(*args, **kwargs)` and, with probe=True, its rounding noise.

    module: any nn.Module (left untouched: a deep copy runs, in float64, on its device).
    args / kwargs: the module's inputs; floating tensors are cast to float64 and get input
    gradients, anything else (token ids, masks, flags) is passed as is.
    grad_output: the loss gradient of the output (a tensor, or a tuple/dict like the output);
    or loss: a function of the output returning a scalar; with neither, backward runs only
    when the output is a scalar (else forward only: no gradients).
    probe_seed: the probe stream's seed (the suite uses the run's seed).
    rng_seed: allows random ops (dropout...), seeding torch's generator with it before each
    run; without it they are refused by name.

    Errors (TruthRunError, naming the aten op): an op without a float64 kernel, a floating
    result not in float64 (a cast or autocast in the module, FP8), a random op without
    rng_seed. ValueError: inputs on more than one device, a grad_output that does not fit.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"tpcheck.torch.truth: module is a {type(module).__name__}; expected a "
                        "torch.nn.Module")
    if loss is not None and grad_output is not None:
        raise ValueError("tpcheck.torch.truth: give grad_output or loss, not both")
    _module_device(module, args, kwargs)
    exact = _run_once(module, args, kwargs, grad_output, loss,
                      F64TruthMode(rng_seed=rng_seed), rng_seed)
    if probe:
        probed = _run_once(module, args, kwargs, grad_output, loss,
                           F64TruthMode(probe_u=PROBE_U, probe_seed=probe_seed, rng_seed=rng_seed),
                           rng_seed)
        exact.noise = TorchTruth(*(_noise(getattr(probed, f), getattr(exact, f))
                                   for f in ("outputs", "input_grads", "grads")))
    return exact


def _noise(probed: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> dict:
    """(probed − truth) / PROBE_U per tensor: one f64 rounding, then an exact scaling."""
    return {k: (probed[k] - exact[k]) * (1.0 / PROBE_U) for k in exact}

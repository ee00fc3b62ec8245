"""The module truth: the fp64 truth of any nn.Module, with its rounding noise
(tpcheck.judge.module_truth, also tpcheck.torch.truth).

    t = module_truth(mlp, x, grad_output=dy)
    t.outputs["output"], t.input_grads["input"], t.grads["fc1.weight"]   # float64
    t.noise.grads["fc1.weight"]         # what one rounding of everything moves it by
    t.lifted                            # the casts below float64 that kept float64

The module itself runs, on float64 copies of its parameters and buffers swapped in for
the call (torch.func.functional_call): nothing of it is copied or changed — parameters,
their .grad and requires_grad, buffers, hooks, and torch's RNG state are as they were — so
modules that hold process groups, streams or RNG trackers (which cannot be deep-copied)
have a truth too. The inputs are cast to float64, and forward and backward run once as
the module's code says, under a dispatch mode (_dispatch) that keeps every value float64:
casts to a narrower type are lifted (_lifting; strict=True refuses them instead), an op
without a float64 path is named with the module that called it, unless a float64
reference was registered for it (_references), and a random op without a seed is refused.

With probe=True the same computation runs a second time with every op's result multiplied
by 1 + 2^-30·s·r (r uniform in [-1, 1), the suite's probe stream; s = u(the op's nominal
dtype) / u(the run dtype), at most 1: _nominal): `noise` = (probed − truth) / 2^-30 is, to
first order, how far one rounding of every intermediate, each at the precision the real
run computes it in, moves each element, in units of the run dtype's rounding: the
`rounding_noise` of tpcheck.compare, whose floor keeps the truth policy fair on tensors
whose exact value cancels to ~0 (an attention key-bias gradient) while their rounding
errors do not. docs/JUDGE.md is the manual.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from torch.func import functional_call

from .._errors import Error, InputError
from .._names import (PROBE_U, REPORT_KIND_INPUT_GRADIENT, REPORT_KIND_OUTPUT,
                      REPORT_KIND_PARAMETER_GRADIENT)
from ._dispatch import FIX, F64TruthMode, TruthRunError
from ._lifting import ModuleStack
from ._nominal import Nominal
from ._naming import named_tensors
from ._references import References
from ._runs import backward_from, input_gradients, leaf_inputs, one_device
from ._verdict import TruthTensor

__all__ = ["ModuleTruth", "module_truth", "truth_request", "exact_run", "probed_run", "with_noise"]

_WHO = "tpcheck.torch.truth"


class ModuleTruth:
    """float64 results of one run of a module: `outputs`, `input_grads`, `grads`, each a
    dict name → tensor (outputs: "output" for a lone tensor, "output.0", "output.key" for
    tuples and dicts; inputs: "input" for a lone tensor argument, else "input.0",
    "input.<keyword>"; parameters by named_parameters()); `output` is the first output.
    `noise` is a ModuleTruth of the rounding noise (None without the probe);
    `reduction_length` the longest GEMM reduction the run made (K of the truth policy),
    `gemm_calls` how many GEMMs it made, `backward` whether a backward ran (else the
    gradients are empty), `lifted` the casts below float64 it kept in float64 (one dict per
    op, dtype and place: op, dtype, kind, module, where, count), `references` the float64
    references that stood in for kernels. With the probe, `probe_dtype` is the run dtype
    (the coarsest of the parameters', buffers' and floating inputs' dtypes), whose unit
    roundoff is the noise's unit, and `probed` counts the op results the probe perturbed
    by their nominal dtype ({"bfloat16": 310, "float32": 24}). `truth_for(name,
    tp_size=N)` gives one tensor to tpcheck.compare."""

    __slots__ = ("outputs", "input_grads", "grads", "noise", "reduction_length", "gemm_calls",
                 "backward", "lifted", "references", "probe_dtype", "probed")

    def __init__(self, outputs: dict, input_grads: dict, grads: dict,
                 noise: Optional["ModuleTruth"] = None, reduction_length: int = 0,
                 gemm_calls: int = 0, backward: bool = True, lifted: Optional[list] = None,
                 references: Optional[list] = None, probe_dtype: Optional[str] = None,
                 probed: Optional[dict] = None):
        self.outputs = outputs
        self.input_grads = input_grads
        self.grads = grads
        self.noise = noise
        self.reduction_length = reduction_length
        self.gemm_calls = gemm_calls
        self.backward = backward
        self.lifted = list(lifted or [])
        self.references = list(references or [])
        self.probe_dtype = probe_dtype
        self.probed = dict(probed or {})

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

    def flat(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """(its tensors, everything else) to send to another rank; from_flat rebuilds it
        (without its noise, which is computed where both runs meet)."""
        tensors, names = [], {}
        for field in ("outputs", "input_grads", "grads"):
            names[field] = list(getattr(self, field))
            tensors += [t.detach() for t in getattr(self, field).values()]
        meta = {f: getattr(self, f) for f in ("reduction_length", "gemm_calls", "backward",
                                               "lifted", "references", "probe_dtype", "probed")}
        return tensors, {"names": names, **meta}

    @classmethod
    def from_flat(cls, tensors: list[torch.Tensor], meta: dict[str, Any]) -> "ModuleTruth":
        found, at = {}, 0
        for field, names in meta["names"].items():
            found[field] = dict(zip(names, tensors[at:at + len(names)]))
            at += len(names)
        return cls(found["outputs"], found["input_grads"], found["grads"],
                   **{k: v for k, v in meta.items() if k != "names"})

    def __repr__(self) -> str:
        return (f"ModuleTruth(outputs={list(self.outputs)}, input_grads={list(self.input_grads)}, "
                f"grads={list(self.grads)}, K={self.reduction_length}, "
                f"probe={'yes' if self.noise is not None else 'no'}, lifted={len(self.lifted)})")


@dataclass
class _Request:
    """What module_truth was asked for: each run (exact, probed) repeats it."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    grad_output: Any
    loss: Optional[Callable]
    backward: bool
    rng_seed: Optional[int]
    strict: bool
    device: torch.device


def _f64_state(module: torch.nn.Module, nominal: Optional[Nominal]) -> dict[str, torch.Tensor]:
    """float64 copies of the module's parameters (leaves, with its requires_grad and its
    plain attributes: Megatron's tensor_model_parallel, ...) and buffers (others cloned),
    tagged with their dtypes in `nominal`."""
    state: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        q = p.detach().to(torch.float64, copy=True) if p.is_floating_point() else p.detach().clone()
        q = torch.nn.Parameter(q, requires_grad=p.requires_grad and q.is_floating_point())
        for k, v in vars(p).items():
            if not isinstance(v, torch.Tensor):
                setattr(q, k, v)
        state[name] = _leaf(nominal, q, p.dtype)
    for name, b in module.named_buffers():
        state[name] = _leaf(nominal, b.detach().to(torch.float64, copy=True), b.dtype) \
            if b.is_floating_point() else b.detach().clone()
    return state


def _leaf(nominal: Optional[Nominal], t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return nominal.leaf(t, dtype) if nominal is not None else t


def _f64_leaf(nominal: Optional[Nominal]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    def cast(_name: str, t: torch.Tensor) -> torch.Tensor:
        return _leaf(nominal, t.to(torch.float64), t.dtype) if t.is_floating_point() else t
    return cast


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _environment(r: _Request, modules: ModuleStack, references: References) -> Iterator[None]:
    """Around one run: torch's RNG state saved and restored (seeded from rng_seed inside),
    float64 as the default dtype (unless strict), the module stack, the references."""
    cuda = [r.device.index or 0] if r.device.type == "cuda" else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda))
        if r.rng_seed is not None:
            torch.random.default_generator.manual_seed(r.rng_seed)
            if cuda:
                torch.cuda.default_generators[cuda[0]].manual_seed(r.rng_seed)
        if not r.strict:
            stack.enter_context(_default_dtype(torch.float64))
        stack.enter_context(modules)
        stack.enter_context(references)
        yield


def _forward_backward(r: _Request, state: dict, f_args: tuple, f_kwargs: dict,
                      grads: Optional[dict], modules: ModuleStack) -> tuple[dict, bool]:
    """The module's forward (+ backward) on the float64 state; its own failures become a
    TruthRunError naming the module that was running."""
    try:
        out = functional_call(r.module, state, f_args, f_kwargs, tie_weights=True, strict=False)
        out_named = named_tensors(out, "output")
        if not r.backward:
            return out_named, False
        if r.loss is not None:
            return out_named, _loss_backward(r.loss(out))
        return out_named, backward_from(out_named, grads, _WHO)
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - a kernel or the module's code, named below
        raise TruthRunError(f"{_WHO}: the float64 run failed in module {modules.current()}"
                            f"{_function_of(e)}: {type(e).__name__}: {e}; if a kernel refused "
                            f"float64 operands, {FIX}") from e


def _function_of(e: BaseException) -> str:
    """", in autograd.Function pkg.Cls" when the innermost autograd.Function forward on the
    exception's way up is one (its ctx knows its class), else ""."""
    found = ""
    tb = e.__traceback__
    while tb is not None:
        ctx = tb.tb_frame.f_locals.get("ctx") if tb.tb_frame.f_code.co_name == "forward" else None
        cls = getattr(ctx, "_forward_cls", None)
        if isinstance(cls, type):
            found = f", in autograd.Function {cls.__module__}.{cls.__qualname__}"
        tb = tb.tb_next
    return found


def _run_once(r: _Request, mode: F64TruthMode, references: References) -> ModuleTruth:
    """One float64 forward (and backward) of `r.module` under `mode` (its leaves tagged with
    their dtypes when the mode tracks nominal dtypes)."""
    nominal = mode.nominal
    state = _f64_state(r.module, nominal)
    f_args, f_kwargs = leaf_inputs(r.args, r.kwargs, _f64_leaf(nominal))
    grads = None
    if r.grad_output is not None:
        grads = {k: _leaf(nominal, g.detach().to(torch.float64), g.dtype)
                 for k, g in named_tensors(r.grad_output, "output").items()}
    with _environment(r, mode.modules, references), mode:
        out_named, ran = _forward_backward(r, state, f_args, f_kwargs, grads, mode.modules)
    params = dict(r.module.named_parameters())
    input_grads = input_gradients(f_args, f_kwargs) if ran else {}
    param_grads = {k: (state[k].grad.detach() if state[k].grad is not None
                       else torch.zeros_like(state[k].detach()))
                   for k, p in params.items() if p.requires_grad} if ran else {}
    run_dtype = nominal.run_dtype if nominal is not None else None
    return ModuleTruth({k: v.detach() for k, v in out_named.items()}, input_grads, param_grads,
                       None, mode.reduction_length, mode.gemm_calls, ran, mode.lifts.records(),
                       references.used(),
                       str(run_dtype).replace("torch.", "") if run_dtype is not None else None,
                       mode.probed)


def _loss_backward(value: Any) -> bool:
    if not (isinstance(value, torch.Tensor) and value.numel() == 1):
        raise InputError(f"{_WHO}: loss(output) returned {type(value).__name__} "
                         f"{getattr(value, 'shape', '')}; expected a one-element tensor")
    value.backward()
    return True


def truth_request(module: torch.nn.Module, args: tuple, kwargs: dict, *, grad_output: Any = None,
                  loss: Optional[Callable[[Any], torch.Tensor]] = None, backward: bool = True,
                  rng_seed: Optional[int] = None, strict: bool = False) -> _Request:
    """What one module truth runs, checked (module_truth's arguments): the float64 run
    (exact_run) and the probed run (probed_run) each repeat it; compare_tp gives them to
    two ranks."""
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{_WHO}: module is a {type(module).__name__}; expected a "
                         "torch.nn.Module")
    if loss is not None and grad_output is not None:
        raise InputError(f"{_WHO}: give grad_output or loss, not both")
    device = one_device(_WHO, args, kwargs, module)
    return _Request(module, args, kwargs, grad_output, loss, backward, rng_seed, strict, device)


def exact_run(r: _Request) -> ModuleTruth:
    """The float64 run: the truth, without its noise."""
    return _run_once(r, F64TruthMode(rng_seed=r.rng_seed, strict=r.strict,
                                     modules=ModuleStack(r.module)), References(r.module))


def probed_run(r: _Request, probe_seed: int = 1234) -> ModuleTruth:
    """The probed run: the float64 run with every op's result perturbed by one rounding at
    its nominal precision (module docstring); with_noise turns it into the noise."""
    return _run_once(r, F64TruthMode(probe_u=PROBE_U, probe_seed=probe_seed,
                                     rng_seed=r.rng_seed, strict=r.strict,
                                     modules=ModuleStack(r.module),
                                     nominal=Nominal(torch.get_default_dtype())),
                     References(r.module))


def with_noise(exact: ModuleTruth, probed: ModuleTruth) -> ModuleTruth:
    """`exact` with the rounding noise of its probed twin (and what the probe counted)."""
    exact.noise = ModuleTruth(*(_noise(getattr(probed, f), getattr(exact, f))
                                for f in ("outputs", "input_grads", "grads")),
                              backward=exact.backward)
    exact.probe_dtype, exact.probed = probed.probe_dtype, probed.probed
    return exact


def module_truth(module: torch.nn.Module, *args: Any, grad_output: Any = None,
                 loss: Optional[Callable[[Any], torch.Tensor]] = None, probe: bool = True,
                 probe_seed: int = 1234, rng_seed: Optional[int] = None,
                 backward: bool = True, strict: bool = False, **kwargs: Any) -> ModuleTruth:
    """The fp64 truth of `module(*args, **kwargs)` and, with probe=True, its rounding noise.

    module: any nn.Module; it runs itself on float64 copies of its parameters and buffers
    and is left exactly as it was (module docstring).
    args / kwargs: the module's inputs; floating tensors are cast to float64 and get input
    gradients, anything else (token ids, masks, flags) is passed as is.
    grad_output: the loss gradient of the output (a tensor, or a tuple/dict like the output);
    or loss: a function of the output returning a scalar; with neither, backward runs only
    when the output is a scalar (else forward only: no gradients, `backward` False).
    backward=False: forward only, whatever grad_output or loss say.
    probe_seed: the probe stream's seed (the suite uses the run's seed).
    rng_seed: allows random ops (dropout...), seeding torch's generator with it for each
    run (torch's RNG state is restored afterwards); without it they are refused by name.
    strict: refuse casts below float64 (and FP8) by name instead of lifting them.

    Errors: TruthRunError (naming the op, the module that called it and what to do) for an
    op or kernel without a float64 path, a cast with strict=True, a random op without
    rng_seed; InputError for inputs on more than one device or a grad_output that does not
    fit.
    """
    r = truth_request(module, args, kwargs, grad_output=grad_output, loss=loss,
                      backward=backward, rng_seed=rng_seed, strict=strict)
    exact = exact_run(r)
    return with_noise(exact, probed_run(r, probe_seed)) if probe else exact


def _noise(probed: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> dict:
    """(probed − truth) / PROBE_U per tensor: one f64 rounding, then an exact scaling."""
    return {k: (probed[k] - exact[k]) * (1.0 / PROBE_U) for k in exact}

"""One compare_tp call: its options (CompareOptions), its state as the phases fill it
(Call), and the forward and backward of one module as compare_tp runs it on any rank
(forward_backward)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch

from .._errors import InputError
from ._gather import ShardSpec, gather, is_dtensor, is_replica, local_chunk, waited
from ._gemm import matmul_switches
from ._group import Group
from ._module_truth import ModuleTruth
from ._naming import named_tensors
from ._runs import backward_from

__all__ = ["CompareOptions", "Call", "Clock", "options_from", "forward_backward", "REPLICA_MODES"]

WHO = "compare_tp"
# compare_tp's replicas= values (CompareOptions.replicas).
REPLICA_MODES = ("identical", "judge")


@dataclass
class CompareOptions:
    """compare_tp's options (its keywords; compare_tp's docstring says what each does).

    grad_output, backward: the loss gradient of the output; whether backward runs (None:
    when grad_output is given or the output is a scalar). shards, input_dims, output_dims:
    how parameters, inputs and outputs are split. policy, and the te / allclose
    tolerances rtol, atol (None: the reference suite's table by dtype). group. The truth
    policy's error
    model: unit_roundoff, math, reduction_length, tp_size, multiplier, floor_factor. The
    truth: probe, strict_truth (refuse casts below float64 instead of lifting them),
    truth (a precomputed module truth), spread_truth (the truth's two runs on ranks 1 and
    2, beside the unsharded run on rank 0: _work). check_parameters, trace_gemms.
    replicas: what a replicated tensor's copies that differ between ranks are
    ("identical": a failure of their own, beside the policy's verdict; "judge": only the
    policy's verdict)."""

    grad_output: Any = None
    backward: Optional[bool] = None
    shards: Mapping[str, Optional[int]] = field(default_factory=dict)
    input_dims: Mapping[str, Optional[int]] = field(default_factory=dict)
    output_dims: Mapping[str, Optional[int]] = field(default_factory=dict)
    policy: str = "truth"
    rtol: Optional[float] = None
    atol: Optional[float] = None
    group: Any = None
    unit_roundoff: Optional[float] = None
    math: Optional[str] = None
    reduction_length: Optional[int] = None
    tp_size: Optional[int] = None
    multiplier: float = 4.0
    floor_factor: float = 1.0
    probe: bool = True
    strict_truth: bool = False
    truth: Optional[ModuleTruth] = None
    spread_truth: bool = True
    check_parameters: bool = True
    trace_gemms: Optional[bool] = None
    replicas: str = "identical"

    def __post_init__(self) -> None:
        self.shards = dict(self.shards or {})
        self.input_dims = dict(self.input_dims or {})
        self.output_dims = dict(self.output_dims or {})


def options_from(options: Optional[CompareOptions], keywords: dict[str, Any]) -> CompareOptions:
    """The options object from compare_tp's `options=` and keywords (keywords win)."""
    known = {f.name for f in dataclasses.fields(CompareOptions)}
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise InputError(f"compare_tp: unknown keywords {unknown}; expected CompareOptions' "
                         f"fields {sorted(known)}")
    if options is None:
        return CompareOptions(**keywords)
    if not isinstance(options, CompareOptions):
        raise InputError(f"compare_tp: options is a {type(options).__name__}; expected a "
                         "tpcheck.judge.CompareOptions")
    return dataclasses.replace(options, **keywords)


class Clock:
    """Wall seconds of compare_tp's phases, for the report's `seconds` (host time: a phase
    that ends in a collective or a verdict read back includes its GPU work)."""

    def __init__(self):
        self._start = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        """The time since the last lap goes to `phase` (added, when it had some)."""
        now = time.perf_counter()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._last, 4)
        self._last = now

    def done(self) -> dict[str, float]:
        return dict(self.seconds, total=round(self._last - self._start, 4))


@dataclass
class Call:
    """One compare_tp call's arguments and what its phases found so far."""

    single: torch.nn.Module
    sharded: torch.nn.Module
    args: tuple
    kwargs: dict
    opts: CompareOptions
    g: Group
    clock: Clock
    device: torch.device = torch.device("cpu")
    inputs: dict = field(default_factory=dict)            # global inputs by name
    single_params: dict = field(default_factory=dict)
    sharded_params: dict = field(default_factory=dict)
    specs: dict = field(default_factory=dict)             # sharded parameter → ShardSpec
    gathered_params: dict = field(default_factory=dict)   # judging rank only
    sharded_full: dict = field(default_factory=dict)      # name → (kind, full tensor)
    replicas: set = field(default_factory=set)            # names of this rank's own copies
    copies: dict = field(default_factory=dict)            # replicas differing from rank 0's
    state: dict = field(default_factory=dict)             # replicated quantizer state by name
    trace_summary: Optional[dict] = None
    backward: bool = False                                # did the sharded backward run
    plan: Any = None                                      # _work.Plan: who runs what

    @property
    def tp_size(self) -> int:
        return self.opts.tp_size if self.opts.tp_size is not None else self.g.size

    @property
    def want_trace(self) -> bool:
        wanted = self.opts.trace_gemms
        return wanted if wanted is not None else self.device.type == "cuda"

    def trace_reuse(self, module: torch.nn.Module) -> Optional[tuple[torch.nn.Module, tuple]]:
        """(module, call key) under which an earlier call's GEMM trace of `module` stands for
        this call's (_gemm's module docstring); None with trace_gemms=True (trace every call)."""
        if self.opts.trace_gemms:
            return None
        o = self.opts
        grads = named_tensors(o.grad_output, "output") if o.grad_output is not None else {}
        key = (tuple((k, tuple(t.shape), t.dtype) for k, t in self.inputs.items()),
               tuple((k, tuple(t.shape), t.dtype) for k, t in grads.items()),
               tuple(sorted(o.input_dims.items())), tuple(sorted(o.output_dims.items())),
               o.backward, tuple(p.dtype for p in module.parameters()), matmul_switches())
        return module, key


def _backward_wanted(c: Call) -> bool:
    return c.opts.backward is not False


def forward_backward(c: Call, module: torch.nn.Module, args: tuple, kwargs: dict,
                     sharded: bool) -> tuple[dict[str, torch.Tensor], set, bool]:
    """forward (+ backward) of one module: (outputs by name, full for the sharded run; the
    names of outputs that are this rank's own copy; whether backward ran)."""
    named = named_tensors(module(*args, **kwargs), "output")
    grads = named_tensors(c.opts.grad_output, "output") if c.opts.grad_output is not None else None
    full, starts, start_grads, replicas = {}, {}, {}, set()
    for k, t in named.items():
        dim = c.opts.output_dims.get(k) if sharded else None
        if sharded and is_dtensor(t):
            if is_replica(t, None):
                replicas.add(k)
            t = t.full_tensor()  # autograd-aware: backward slices the global gradient
        elif dim is not None:
            full[k] = gather(t, ShardSpec(dim), c.g.group)
            if grads is not None and k in grads:
                start_grads[k] = local_chunk(grads[k], dim, c.g.group)
        else:
            replicas.add(k)
        full.setdefault(k, waited(t.detach()))
        starts[k] = t
        if grads is not None and k in grads:
            start_grads.setdefault(k, grads[k])
    ran = False
    if _backward_wanted(c):
        hint = "; pass output_dims for outputs that stay sharded"
        ran = backward_from(starts, start_grads if grads is not None else None, WHO, hint)
        if c.opts.backward and not ran:
            raise InputError(f"{WHO}: backward=True, but no grad_output was given and the "
                             f"output is not a scalar ({sorted(named)}); pass grad_output=")
    return full, replicas, ran

"""compare_tp's judging work, shared over the group: the unsharded run, the truth's float64
run and its probed run need nothing of one another, so they run side by side on three
ranks, and what the others computed travels to rank 0, which judges.

The plan (`plan_of`): rank 0 runs the unsharded module (its `single` is the one judged,
and keeps the gradients); the probed run, the longest (every op's result is perturbed),
goes to the first helper, the float64 run to the second; a run without a helper runs on
rank 0 after the unsharded one. A helper is a rank whose unsharded module is rank 0's:
its parameters and buffers equal rank 0's bit for bit (compared with the inputs, in the
same broadcast) and its modules are in the same train/eval modes. Without helpers (one
rank, spread_truth=False, a policy without a truth, a precomputed truth, or no rank whose
module is rank 0's) rank 0 runs everything.

Each rank catches its parts' errors; the errors, timings and the layout of each helper's
results go to every rank in one object collective (`share`), then each helper's results
go to rank 0 packed in one broadcast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .._errors import InputError
from ._call import WHO, Call, forward_backward
from ._checks import buffers, check_buffers_unchanged
from ._gemm import GemmTrace
from ._group import Layout, Portable, portable
from ._module_truth import ModuleTruth, exact_run, probed_run, truth_request
from ._runs import input_gradients, leaf_inputs

__all__ = ["PARTS", "Plan", "Work", "helper_view", "plan_of", "run_parts", "share"]

SINGLE, EXACT, PROBED = "unsharded run", "float64 run", "probed run"
PARTS = (SINGLE, EXACT, PROBED)  # also the order in which their errors are reported


@dataclass(frozen=True)
class Plan:
    """Which rank runs each part: the unsharded run always on rank 0; `exact` and `probed`
    None when that run is not made. `refused`: (rank, why) for the ranks that could not
    help."""

    exact: Optional[int] = None
    probed: Optional[int] = None
    refused: tuple[tuple[int, str], ...] = ()

    def rank_of(self, part: str) -> Optional[int]:
        return {SINGLE: 0, EXACT: self.exact, PROBED: self.probed}[part]

    def parts(self, rank: int) -> list[str]:
        return [p for p in PARTS if self.rank_of(p) == rank]


def _modes(module: torch.nn.Module) -> tuple[bool, ...]:
    return tuple(m.training for m in module.modules())


def helper_view(c: Call, same_state: bool) -> dict[str, Any]:
    """What this rank tells the others for the plan: whether its unsharded module's state is
    rank 0's (`same_state`, from the broadcast of rank 0's), its modules' train/eval modes,
    and (rank 0) whether the caller passed a truth."""
    return {"same_state": same_state, "modes": _modes(c.single),
            "truth_given": c.opts.truth is not None}


def plan_of(c: Call, views: list[dict[str, Any]]) -> Plan:
    """The plan from every rank's helper_view (the same on every rank)."""
    o = c.opts
    if o.policy != "truth" or views[0]["truth_given"]:
        return Plan()
    helpers, refused = [], []
    for r, v in enumerate(views[1:] if o.spread_truth else [], start=1):
        if not v["same_state"]:
            refused.append((r, "the unsharded module's parameters or buffers differ from "
                               "rank 0's bit for bit"))
        elif v["modes"] != views[0]["modes"]:
            refused.append((r, "the unsharded module's train/eval modes differ from rank 0's"))
        else:
            helpers.append(r)
    runs = [PROBED, EXACT] if o.probe else [EXACT]
    ranks = {part: helpers[i] if i < len(helpers) else 0 for i, part in enumerate(runs)}
    return Plan(ranks[EXACT], ranks.get(PROBED), tuple(refused))


@dataclass
class Work:
    """One rank's parts and, on rank 0 after `share`, everything the judging needs: the
    unsharded run's outputs, input gradients and GEMM trace; the truth's float64 and
    probed runs; every rank's failed parts in PARTS order (`errors`: (part, rank,
    portable error)); where each part ran and how long it took (`ranks`, `seconds`)."""

    outputs: dict = field(default_factory=dict)
    input_grads: dict = field(default_factory=dict)
    trace: Optional[dict] = None
    exact: Optional[ModuleTruth] = None
    probed: Optional[ModuleTruth] = None
    own_error: Optional[BaseException] = None
    failed: dict[str, Portable] = field(default_factory=dict)
    errors: list[tuple[str, int, Portable]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)


def _single_run(c: Call, w: Work) -> None:
    """The unsharded module's forward (+ backward) on the global inputs."""
    before = buffers(c.single)
    for p in c.single.parameters():
        p.grad = None
    s_args, s_kwargs = leaf_inputs(c.args, c.kwargs, lambda _name, t: t.clone())
    with GemmTrace(c.want_trace, c.device, c.trace_reuse(c.single)) as tr:
        w.outputs, _, ran = forward_backward(c, c.single, s_args, s_kwargs, False)
    check_buffers_unchanged("unsharded", c.single, before)
    if ran != c.backward:
        raise InputError(f"{WHO}: backward ran in the {'unsharded' if ran else 'sharded'} run "
                         "only (a scalar output in one of them); pass grad_output= or "
                         "backward=False")
    w.input_grads = input_gradients(s_args, s_kwargs, missing_as_zeros=False) if ran else {}
    w.trace = tr.summary()


def _request(c: Call):
    return truth_request(c.single, c.args, c.kwargs, grad_output=c.opts.grad_output,
                         backward=c.backward, strict=c.opts.strict_truth)


def run_parts(c: Call) -> Work:
    """This rank's parts of c.plan, in PARTS order; a failed part ends the rank's work (its
    error is the call's outcome anyway)."""
    w = Work()
    for part in c.plan.parts(c.g.rank):
        start = time.perf_counter()
        try:
            if part == SINGLE:
                _single_run(c, w)
            elif part == EXACT:
                w.exact = exact_run(_request(c))
            else:
                w.probed = probed_run(_request(c))
        except Exception as e:  # noqa: BLE001 - the call's outcome, on every rank
            w.own_error, w.failed[part] = e, portable(e)
            break
        w.seconds[part] = round(time.perf_counter() - start, 4)
        if c.g.judging:
            c.clock.lap(SINGLE if part == SINGLE else "truth")
    return w


def share(c: Call, w: Work) -> None:
    """Every rank's failed parts and timings to every rank; the helpers' results to rank 0
    (module docstring). Afterwards rank 0's `w` holds the truth's two runs."""
    sending = {}
    for part, result in ((EXACT, w.exact), (PROBED, w.probed)):
        if result is not None and not c.g.judging:
            tensors, meta = result.flat()
            sending[part] = (tensors, Layout.of(tensors), meta)
    told = c.g.all_objects({"failed": w.failed, "seconds": w.seconds,
                            "results": {p: (lay, meta) for p, (_, lay, meta) in sending.items()}})
    for part in PARTS:
        r = c.plan.rank_of(part)
        if r is None:
            continue
        if part in told[r]["failed"]:
            w.errors.append((part, r, told[r]["failed"][part]))
        if part in told[r]["seconds"]:
            w.ranks[part], w.seconds[part] = r, told[r]["seconds"][part]
        if r == 0 or part not in told[r]["results"]:
            continue
        layout, meta = told[r]["results"][part]
        buf = c.g.packed_from(r, layout, sending[part][0] if r == c.g.rank else None, c.device)
        if c.g.judging:
            setattr(w, "exact" if part == EXACT else "probed",
                    ModuleTruth.from_flat(layout.unpack(buf), meta))
    if not c.g.judging:
        w.exact = w.probed = None
    elif c.plan.exact is not None:
        c.clock.lap("truth")

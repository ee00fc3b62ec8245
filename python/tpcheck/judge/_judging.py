"""compare_tp's judging rank (the group's rank 0): the error model and every verdict, from
the sharded run's gathers and the judging work (_work: the unsharded run, the module
truth), each a function over the call (_call.Call)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._errors import InputError
from .._names import REPORT_KIND_INPUT_GRADIENT, REPORT_KIND_OUTPUT, REPORT_KIND_PARAMETER_GRADIENT
from ._call import WHO, Call
from ._gemm import choose_math
from ._group import portable
from ._module_truth import ModuleTruth, with_noise
from ._nominal import unit_roundoff
from ._replicated_state import reduce_amax_off, state_difference
from ._report import TPReport
from ._work import Work

__all__ = ["judge_on_root"]

# name → (kind, single's tensor, the gathered sharded tensor)
Pairs = dict[str, tuple[str, torch.Tensor, torch.Tensor]]

_NO_BACKWARD = ("no backward ran ({why}): the outputs and the parameters' gather are "
                "judged, no gradient is")


def _pairs(c: Call, outputs: dict, input_grads: dict) -> Pairs:
    """Every tensor of the unsharded run with its gathered sharded counterpart."""
    pairs: Pairs = {}
    for k, v in outputs.items():
        if k not in c.sharded_full:
            raise InputError(f"{WHO}: the sharded module returned no {k!r}; expected the "
                             "outputs of the unsharded module")
        got = c.sharded_full[k][1]
        if tuple(got.shape) != tuple(v.shape):
            raise InputError(f"{WHO}: output {k!r} gathered from the shards has shape "
                             f"{tuple(got.shape)}, the unsharded output {tuple(v.shape)}; "
                             f"pass output_dims={{{k!r}: dim}} for an output that stays sharded")
        pairs[k] = (REPORT_KIND_OUTPUT, v, got)
    for k, g in input_grads.items():
        if k in c.sharded_full:
            pairs[k] = (REPORT_KIND_INPUT_GRADIENT, g, c.sharded_full[k][1])
    for k, p in c.single_params.items():
        kind, got = c.sharded_full.get(k, (None, None))
        if kind == REPORT_KIND_PARAMETER_GRADIENT:
            pairs[k] = (kind, p.grad if p.grad is not None else torch.zeros_like(p), got)
    return pairs


def _truth(c: Call, work: Work) -> Optional[ModuleTruth]:
    """The module truth the truth policy judges against: the caller's, or the one the work
    computed (with the noise of its probed run)."""
    if c.opts.policy != "truth":
        return None
    if c.opts.truth is not None:
        return c.opts.truth
    return with_noise(work.exact, work.probed) if work.probed is not None else work.exact


def _error_model(c: Call, truth: Optional[ModuleTruth], traces: list[dict]) -> tuple[dict, dict]:
    """(the report's error_model, the model each tensor is judged under)."""
    o = c.opts
    calls = sum(t["calls"] for t in traces)
    classes = sorted({k for t in traces for k in t["classes"]})
    math, source = choose_math(o.math, o.unit_roundoff, set(classes) if calls else None, c.device)
    k = o.reduction_length if o.reduction_length is not None else \
        max(1, truth.reduction_length if truth is not None else 1)
    judged = {"unit_roundoff": o.unit_roundoff, "math": math, "reduction_length": k,
              "tp_size": c.tp_size, "multiplier": o.multiplier, "floor_factor": o.floor_factor,
              "rtol": o.rtol, "atol": o.atol}
    reported = {"multiplier": o.multiplier, "floor_factor": o.floor_factor,
                "reduction_length": k, "tp_size": c.tp_size, "math": math,
                "math_source": source, "gemm_classes": classes if calls else None,
                "gemm_calls_traced": calls,
                "gemm_trace_reused": any(t.get("reused") for t in traces),
                "gemm_trace_note": None if calls else traces[0]["why_not"]}
    return reported, judged


def _note_truth(report: TPReport, truth: ModuleTruth) -> None:
    """What the truth lifted to float64 and which references stood in, in the report."""
    report.truth_lifted = truth.lifted
    report.truth_references = truth.references
    if truth.lifted:
        ops = sorted({f"{r['op']} to {r['dtype']}" for r in truth.lifted})
        count = sum(r["count"] for r in truth.lifted)
        report.notes.append(f"the truth kept float64 through {count} casts below it "
                            f"({', '.join(ops)}): truth_lifted lists where")
    run = getattr(torch, truth.probe_dtype) if truth.probe_dtype is not None else None
    finer = {d: n for d, n in truth.probed.items()
             if run is not None and unit_roundoff(getattr(torch, d)) < unit_roundoff(run)}
    if finer:
        counts = ", ".join(f"{n} in {d}" for d, n in sorted(finer.items()))
        report.notes.append(f"the rounding probe counted op results at the precision the "
                            f"real run computes them in ({counts}; the others in "
                            f"{truth.probe_dtype}, the noise's unit)")
    for r in truth.references:
        report.notes.append(f"the truth used the float64 reference of {r['kind']} {r['target']} "
                            f"({r['calls']} calls)")


def _copies(c: Call, payloads: list[dict]) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """Other ranks' replicas that differ from rank 0's: {key: [(rank, tensor)]}."""
    out: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for r, p in enumerate(payloads):
        for key, t in p["copies"].items():
            out.setdefault(key, []).append((r, t.to(c.device)))
    return out


def _judge_parameters(c: Call, report: TPReport, copies: dict) -> None:
    """The gathered parameters (and differing replicated copies) against single's."""
    if not c.opts.check_parameters:
        return
    for k, full in c.gathered_params.items():
        single = c.single_params[k].detach()
        source = c.specs[k].source
        report.add_parameter_check(k, single, full, source)
        for r, t in copies.get(f"p:{k}", []):
            report.add_parameter_check(f"{k} (rank {r}'s copy)", single, t, source,
                                       extra={"rank": r, "copy_of": k})


def _judge_state(c: Call, report: TPReport, copies: dict) -> None:
    """The replicated quantizer state: every rank's must be rank 0's bits."""
    if not c.state:
        return
    for name, own in c.state.items():
        report.add_state_check(name, [(r, state_difference(own, t))
                                      for r, t in copies.get(f"s:{name}", [])])
    modules = sorted({k.split("fp8_meta.")[0].rstrip(".") or "(the module)" for k in c.state})
    off = reduce_amax_off(c.sharded)
    report.notes.append(
        f"the FP8 delayed-scaling state of {len(modules)} modules ({len(c.state)} amax "
        "histories and scales) compared across ranks as the steps before this call left it"
        + (f"; the recipe of {', '.join(off)} has reduce_amax=False" if off else ""))


def _judge_tensors(report: TPReport, pairs: Pairs, truth: Optional[ModuleTruth],
                   copies: dict, model: dict, replicas: str) -> None:
    """Every output and gradient (and differing replicated copies) under the policy; with
    replicas="identical" a differing copy fails on that alone too."""
    truths = truth.tensors() if truth is not None else {}
    noises = truth.noise.tensors() if truth is not None and truth.noise is not None else {}
    for k, (kind, s, p) in pairs.items():
        t = truths.get(k, (None, None))[1]
        nz = noises.get(k, (None, None))[1]
        report.judge(k, kind, s, p, t, nz, model)
        for r, copy in copies.get(f"t:{k}", []):
            report.judge(f"{k} (rank {r}'s copy)", kind, s, copy, t, nz, model,
                         extra={"rank": r, "copy_of": k})
            if replicas == "identical":
                report.add_replica_verdict(p, copy, r)


def _judge(c: Call, payloads: list[dict], work: Work) -> TPReport:
    """Rank 0's part: every verdict."""
    c.clock.lap("collecting")
    pairs = _pairs(c, work.outputs, work.input_grads)
    truth = _truth(c, work)
    traces = [work.trace] + [p["trace"] for p in payloads if p["trace"] is not None]
    reported, model = _error_model(c, truth, traces)
    report = TPReport(c.opts.policy, c.g.rank, c.tp_size, reported)
    report.backward = c.backward
    report.work = {part: {"rank": work.ranks[part], "seconds": work.seconds[part]}
                   for part in work.ranks}
    for why in dict.fromkeys(why for _, why in c.plan.refused):
        ranks = [r for r, w in c.plan.refused if w == why]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        report.notes.append(f"{who} ran no part of the truth: {why}")
    if not c.backward:
        why = ("backward=False" if c.opts.backward is False
               else "no grad_output was given and the output is not a scalar")
        report.notes.append(_NO_BACKWARD.format(why=why))
    if truth is not None:
        _note_truth(report, truth)
    copies = _copies(c, payloads)
    _judge_parameters(c, report, copies)
    _judge_state(c, report, copies)
    _judge_tensors(report, pairs, truth, copies, model, c.opts.replicas)
    c.clock.lap("judging")
    report.seconds = c.clock.done()
    return report


def judge_on_root(c: Call, payloads: list[dict], work: Work
                  ) -> tuple[Optional[TPReport], Any, Optional[BaseException]]:
    """(rank 0's report, the outcome every rank gets, rank 0's own error): the first
    rank's error of the sharded run if any rank failed there, else the first failed part
    of the judging work's, else the judged report's shared part."""
    errors = [p["error"] for p in payloads]
    first = next((r for r, e in enumerate(errors) if e is not None), None)
    if first is not None:
        return None, ("error", first, errors[first]), None
    if work.errors:
        _, rank, error = work.errors[0]
        return None, ("error", rank, error), None
    try:
        report = _judge(c, payloads, work)
        return report, ("report", report.shared()), None
    except Exception as e:  # noqa: BLE001 - sent to every rank
        return None, ("error", 0, portable(e)), e

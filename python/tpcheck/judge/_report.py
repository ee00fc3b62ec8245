"""TPReport: compare_tp's verdicts, one entry per tensor in the suite's JSON style
({"name", "kind", "statistics", "verdicts": {policy: {passed, status, reason}},
"truth_model"}), plus the rank and error model they were judged under.

compare_tp judges on the group's rank 0 and sends the judged part (`shared()`) to every
rank, which rebuilds its report with `from_shared` under its own rank number: every rank
holds the same entries, verdicts and error model. `raw` (the judged tensors) stays on
rank 0."""

from __future__ import annotations

import html
from typing import Any, Optional

import torch

from .._names import SCHEMA_COMPARE_TP
from ._result import Result, failure_summary
from ._verdict import compare

__all__ = ["TPReport", "KIND_PARAMETER", "KIND_REPLICATED_STATE"]

# the kind of the gathered-parameter checks (bitwise; compare_tp's own, not a suite kind)
KIND_PARAMETER = "parameter"
# the kind of the replicated quantizer state's checks (bitwise across ranks; compare_tp's own)
KIND_REPLICATED_STATE = "replicated_state"

_SHARED = ("policy", "tp_size", "error_model", "entries", "seconds", "work", "backward",
           "notes", "truth_lifted", "truth_references")


def _host(t: Optional[torch.Tensor], dtype: Optional[torch.dtype] = None) -> Any:
    """A detached, C-contiguous tensor tpcheck.compare can read (DLPack)."""
    if t is None:
        return None
    if hasattr(t, "trigger_wait"):  # a functional collective's AsyncCollectiveTensor
        t = t.trigger_wait()
    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()


def _first_verdict(entry: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (policy, v), = list(entry["verdicts"].items())[:1]
    return policy, v


class TPReport(Result):
    """Per-tensor verdicts of one rank: `entries` (list of dicts), `passed`, `failures`
    (the failing entries, each with its "reason" and "policy"), `assert_ok()`,
    `to_dict()`, `to_json()`, `to_html()`; `seconds` (rank 0's phases) and `work` (where
    the unsharded run and the truth's two runs ran, and their seconds); `backward`
    (whether a backward ran: without one only outputs and parameters are judged), `notes` (what the judging left out, why), and
    what the truth lifted to float64 (`truth_lifted`) and which float64 references stood in
    for kernels (`truth_references`)."""

    def __init__(self, policy: str, rank: int, tp_size: int, error_model: dict):
        self.policy = policy
        self.rank = rank
        self.tp_size = tp_size
        self.error_model = error_model
        self.entries: list[dict[str, Any]] = []
        # wall seconds of compare_tp's phases on the judging rank (the group's rank 0)
        self.seconds: dict[str, float] = {}
        # the judging work's parts: {"unsharded run" | "float64 run" | "probed run":
        # {"rank": where it ran, "seconds": how long it took there}}
        self.work: dict[str, dict[str, Any]] = {}
        self.backward = True
        self.notes: list[str] = []
        self.truth_lifted: list[dict[str, Any]] = []      # ModuleTruth.lifted
        self.truth_references: list[dict[str, Any]] = []  # ModuleTruth.references
        self.raw: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name → (single, sharded)

    def shared(self) -> dict[str, Any]:
        """What every rank's report holds (plain Python: sent with an object collective)."""
        return {k: getattr(self, k) for k in _SHARED}

    @classmethod
    def from_shared(cls, shared: dict[str, Any], rank: int) -> "TPReport":
        """Rank `rank`'s report from the judging rank's `shared()` (raw stays empty)."""
        report = cls(shared["policy"], rank, shared["tp_size"], shared["error_model"])
        for k in _SHARED[3:]:
            setattr(report, k, shared[k])
        return report

    def add_parameter_check(self, name: str, single: torch.Tensor, gathered: torch.Tensor,
                            source: str, extra: Optional[dict] = None) -> None:
        """The gathered sharded parameter must be single's, bit for bit. extra: more keys
        for the entry (the rank whose replicated copy this is)."""
        same = torch.equal(single, gathered.to(single.dtype)) and single.dtype == gathered.dtype
        if same:
            reason = "the gathered shards equal the unsharded parameter bit for bit"
        else:
            diff = (single.double() - gathered.double()).abs()
            idx = [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)] if diff.numel() else []
            reason = (f"the shards gathered ({source}) differ from the unsharded parameter: "
                      f"{int((diff > 0).sum())} of {diff.numel()} elements, first largest at "
                      f"{idx} (|diff| {diff.max().item():.3g}); a shard taken from the wrong "
                      "offset, or parameters not copied from the unsharded module")
        self.entries.append({"name": name, "kind": KIND_PARAMETER, "statistics": {},
                             "verdicts": {"bitwise": {"passed": same,
                                                      "status": "pass" if same else "fail",
                                                      "reason": reason}}, **(extra or {})})

    def add_state_check(self, name: str, differences: list[tuple[int, Optional[str]]]) -> None:
        """One tensor of the replicated quantizer state: `differences` holds (rank, how its
        copy differs from rank 0's) for the ranks whose copy does."""
        bad = [(r, d) for r, d in differences if d is not None]
        if not bad:
            reason = "every rank holds rank 0's bits"
        else:
            reason = ("; ".join(f"rank {r}: {d}" for r, d in bad) +
                      ". Between steps every rank of the group holds the same delayed-scaling "
                      "state (the amaxes are max-reduced over the group and the scales computed "
                      "from them); different state means the ranks quantize with different "
                      "scales: the amaxes were not reduced over the TP group "
                      "(DelayedScaling(reduce_amax=False), or an fp8_group that is not it)")
        self.entries.append({"name": name, "kind": KIND_REPLICATED_STATE, "statistics": {},
                             "verdicts": {"replica": {"passed": not bad,
                                                      "status": "fail" if bad else "pass",
                                                      "reason": reason}}})

    def add_replica_verdict(self, rank0_copy: torch.Tensor, copy: torch.Tensor, rank: int) -> None:
        """The last entry (rank `rank`'s copy of a replicated tensor, which differs bitwise
        from rank 0's) gets a failing "replica" verdict beside the policy's: how many
        elements differ, and by how much."""
        a, b = rank0_copy.detach().double(), copy.detach().to(rank0_copy.device).double()
        differs = a.ne(b) & ~(a.isnan() & b.isnan())
        # |a - b| where they differ (inf where one side is NaN), 0 elsewhere
        diff = torch.where(differs, (a - b).abs().nan_to_num(nan=float("inf")), 0.0)
        at = int(diff.argmax()) if diff.numel() else 0
        idx = [int(i) for i in torch.unravel_index(torch.tensor(at), diff.shape)] if diff.numel() else []
        reason = (f"rank {rank}'s copy of this replicated tensor differs from rank 0's: "
                  f"{int(differs.sum())} of {diff.numel()} elements, first largest at {idx} "
                  f"(|diff| {diff.max().item():.3g}, |rank 0's| there "
                  f"{a.abs().flatten()[at].item():.3g}); "
                  "a collective's result, or the same computation on the same inputs, is the "
                  "same on every rank, so a reduction was left out or made over part of the "
                  "group (replicas='judge' if kernels that are not deterministic made it)")
        self.entries[-1]["verdicts"]["replica"] = {"passed": False, "status": "fail",
                                                   "reason": reason}

    def judge(self, name: str, kind: str, single: torch.Tensor, sharded: torch.Tensor,
              truth: Optional[torch.Tensor], noise: Optional[torch.Tensor],
              model: dict[str, Any], extra: Optional[dict] = None) -> None:
        """One tensor judged under the report's policy. model: the truth policy's error
        model (unit_roundoff or math, reduction_length, tp_size, multiplier, floor_factor)
        and the te / allclose tolerances (rtol, atol: None for the reference's table)."""
        self.raw[name] = (single.detach(), sharded.detach())
        kwargs: dict[str, Any] = {"policy": self.policy, "name": name}
        if self.policy in ("te", "allclose"):
            kwargs.update(rtol=model["rtol"], atol=model["atol"])
        if self.policy == "truth":
            kwargs.update({k: v for k, v in model.items()
                           if k not in ("unit_roundoff", "math", "rtol", "atol")})
            if model["unit_roundoff"] is not None:
                kwargs["unit_roundoff"] = model["unit_roundoff"]
            else:
                kwargs["math"] = model["math"]
        v = compare(_host(single), _host(sharded, single.dtype), _host(truth, torch.float64),
                    rounding_noise=_host(noise, torch.float64), **kwargs)
        entry = v.to_dict()
        self.entries.append({"name": name, "kind": kind, "statistics": entry["statistics"],
                             "verdicts": {self.policy: {"passed": v.passed, "status": v.status,
                                                        "reason": v.reason}},
                             "truth_model": v.error_model if self.policy == "truth" else None,
                             **(extra or {})})

    @property
    def failures(self) -> list[dict[str, Any]]:
        out = []
        for e in self.entries:
            bad = [(p, v) for p, v in e["verdicts"].items() if not v["passed"]]
            if bad:
                out.append(dict(e, policy=bad[0][0], reason=bad[0][1]["reason"]))
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def _failure_message(self) -> str:
        return (f"tpcheck compare_tp, rank {self.rank} of {self.tp_size}: "
                + failure_summary(self.failures,
                                  lambda e: f"{e['kind']} {e['name']!r} fails {e['policy']}: "
                                            f"{e['reason']}"))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_COMPARE_TP, "policy": self.policy, "rank": self.rank,
                "tp_size": self.tp_size, "passed": self.passed, "backward": self.backward,
                "notes": list(self.notes), "truth_lifted": self.truth_lifted,
                "truth_references": self.truth_references, "error_model": self.error_model,
                "tensors": self.entries, "seconds": self.seconds, "work": self.work}

    def to_html(self) -> str:
        """A self-contained table of the verdicts (one row per tensor)."""
        rows = []
        for e in self.entries:
            pol, v = _first_verdict(e)
            color = {"pass": "#dfd", "warning": "#ffd", "fail": "#fdd"}[v["status"]]
            rows.append(f"<tr style='background:{color}'><td>{html.escape(e['name'])}</td>"
                        f"<td>{e['kind']}</td><td>{pol}</td><td>{v['status']}</td>"
                        f"<td>{html.escape(v['reason'])}</td></tr>")
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return ("<!doctype html><meta charset='utf-8'><title>tpcheck compare_tp</title>"
                f"<h1>compare_tp, rank {self.rank} of {self.tp_size}: "
                f"{'PASS' if self.passed else 'FAIL'} under {self.policy}</h1>{notes}"
                "<table border=1 cellpadding=3><tr><th>tensor</th><th>kind</th><th>policy</th>"
                "<th>status</th><th>reason</th></tr>" + "".join(rows) + "</table>")

    def __repr__(self) -> str:
        return (f"TPReport(rank {self.rank}/{self.tp_size}, {self.policy}: "
                f"{'PASS' if self.passed else 'FAIL'}, {len(self.entries)} tensors, "
                f"{len(self.failures)} failing)")

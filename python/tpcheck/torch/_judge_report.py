"""TPReport: compare_tp's verdicts, one entry per tensor in the suite's JSON style
({"name", "kind", "statistics", "verdicts": {policy: {passed, status, reason}},
"truth_model"}), plus the rank and error model they were judged under.

compare_tp judges on the group's rank 0 and sends the judged part (`shared()`) to every
rank, which rebuilds its report with `from_shared` under its own rank number: every rank
holds the same entries, verdicts and error model. `raw` (the judged tensors) stays on
rank 0."""

from __future__ import annotations

import json
from typing import Any, Optional

import torch


def _host(t: Optional[torch.Tensor], dtype: Optional[torch.dtype] = None) -> Any:
    """A detached, C-contiguous tensor tpcheck.compare can read (DLPack)."""
    if t is None:
        return None
    if hasattr(t, "trigger_wait"):  # a functional collective's AsyncCollectiveTensor
        t = t.trigger_wait()
    t = t.detach()
    if dtype is not None:
        t = t.to(dtype)
    return t.contiguous()


class TPReport:
    """Per-tensor verdicts of one rank. `entries` (list of dicts), `passed`, `failures`,
    `assert_ok()`, `to_json()`, `to_html()`."""

    def __init__(self, policy: str, rank: int, tp_size: int, error_model: dict):
        self.policy = policy
        self.rank = rank
        self.tp_size = tp_size
        self.error_model = error_model
        self.entries: list[dict[str, Any]] = []
        # wall seconds of compare_tp's phases on the judging rank (the group's rank 0)
        self.seconds: dict[str, float] = {}
        self.raw: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name → (single, sharded)

    def shared(self) -> dict[str, Any]:
        """What every rank's report holds (plain Python: sent with an object collective)."""
        return {"policy": self.policy, "tp_size": self.tp_size, "error_model": self.error_model,
                "entries": self.entries, "seconds": self.seconds}

    @classmethod
    def from_shared(cls, shared: dict[str, Any], rank: int) -> "TPReport":
        """Rank `rank`'s report from the judging rank's `shared()` (raw stays empty)."""
        report = cls(shared["policy"], rank, shared["tp_size"], shared["error_model"])
        report.entries = shared["entries"]
        report.seconds = shared.get("seconds", {})
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
        self.entries.append({"name": name, "kind": "parameter", "statistics": {},
                             "verdicts": {"bitwise": {"passed": same,
                                                      "status": "pass" if same else "fail",
                                                      "reason": reason}}, **(extra or {})})

    def judge(self, name: str, kind: str, single: torch.Tensor, sharded: torch.Tensor,
              truth: Optional[torch.Tensor], noise: Optional[torch.Tensor],
              extra: Optional[dict] = None, **model: Any) -> None:
        import tpcheck
        self.raw[name] = (single.detach(), sharded.detach())
        policy = self.policy
        unit_roundoff = model.pop("unit_roundoff")
        math = model.pop("math")
        kwargs: dict[str, Any] = {"policy": policy, "name": name}
        if policy == "truth":
            kwargs.update(model)
            if unit_roundoff is not None:
                kwargs["unit_roundoff"] = unit_roundoff
            else:
                kwargs["math"] = math
        v = tpcheck.compare(_host(single), _host(sharded, single.dtype) if sharded.dtype != single.dtype else _host(sharded),
                            _host(truth, torch.float64) if truth is not None else None,
                            rounding_noise=_host(noise, torch.float64) if noise is not None else None,
                            **kwargs)
        stats = {k: (list(v) if isinstance(v, tuple) else v) for k, v in v.statistics.items()}
        self.entries.append({"name": name, "kind": kind, "statistics": stats,
                             "verdicts": {policy: {"passed": v.passed, "status": v.status,
                                                   "reason": v.reason}},
                             "truth_model": v.error_model if policy == "truth" else None,
                             **(extra or {})})

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if not all(x["passed"] for x in e["verdicts"].values())]

    @property
    def passed(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def assert_ok(self) -> "TPReport":
        """Raises AssertionError naming the first failing tensor, its kind and reason."""
        bad = self.failures
        if bad:
            e = bad[0]
            (pol, v), = list(e["verdicts"].items())[:1]
            more = f" (and {len(bad) - 1} more: {[b['name'] for b in bad[1:6]]})" if len(bad) > 1 else ""
            raise AssertionError(f"tpcheck compare_tp, rank {self.rank} of {self.tp_size}: "
                                 f"{e['kind']} {e['name']!r} fails {pol}: {v['reason']}{more}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "tpcheck.compare_tp/1", "policy": self.policy, "rank": self.rank,
                "tp_size": self.tp_size, "passed": self.passed, "error_model": self.error_model,
                "tensors": self.entries, "seconds": self.seconds}

    def to_json(self, indent: Optional[int] = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_html(self) -> str:
        """A self-contained table of the verdicts (one row per tensor)."""
        import html
        rows = []
        for e in self.entries:
            (pol, v), = list(e["verdicts"].items())[:1]
            color = {"pass": "#dfd", "warning": "#ffd", "fail": "#fdd"}[v["status"]]
            rows.append(f"<tr style='background:{color}'><td>{html.escape(e['name'])}</td>"
                        f"<td>{e['kind']}</td><td>{pol}</td><td>{v['status']}</td>"
                        f"<td>{html.escape(v['reason'])}</td></tr>")
        return ("<!doctype html><meta charset='utf-8'><title>tpcheck compare_tp</title>"
                f"<h1>compare_tp, rank {self.rank} of {self.tp_size}: "
                f"{'PASS' if self.passed else 'FAIL'} under {self.policy}</h1>"
                "<table border=1 cellpadding=3><tr><th>tensor</th><th>kind</th><th>policy</th>"
                "<th>status</th><th>reason</th></tr>" + "".join(rows) + "</table>")

    def __repr__(self) -> str:
        return (f"TPReport(rank {self.rank}/{self.tp_size}, {self.policy}: "
                f"{'PASS' if self.passed else 'FAIL'}, {len(self.entries)} tensors, "
                f"{len(self.failures)} failing)")

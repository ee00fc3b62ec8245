"""tpcheck.run: a suite run from Python, the same code path as `tpcheck run` (tpcheck_run's
run_suite, include/tpcheck/run_suite.h); its report as a RunReport.

run()'s keywords are the run options' table (include/tpcheck/run_options.h), as the command
line's flags are: an option added there is a keyword here.
"""

from __future__ import annotations

import inspect
import json
import numbers
from typing import Any, Mapping, Optional

from . import _tpcheck
from ._errors import InputError
from ._launch import share_nccl_id_if_torchrun
from .judge._compiled import input_errors
from .judge._result import Result, failure_summary

__all__ = ["RunReport", "run"]


class RunReport(dict, Result):
    """A suite run's report (schema tpcheck.run/1, docs/RUNNING.md "JSON report"): the JSON
    as a dict (report["cases"], report["summary"], ...), with the result protocol:
    `passed` (no case fails the run's policy), `failures` (the failing cases: "name" is the
    case id, "policy", "status", "reason", "case"), `assert_ok()`, `to_dict()`,
    `to_json()`."""

    __slots__ = ()

    @property
    def policy(self) -> str:
        return self.get("summary", {}).get("policy", "")

    @property
    def failures(self) -> list[dict[str, Any]]:
        out = []
        for case in self.get("cases", []):
            v = case.get("verdicts", {}).get(self.policy, {})
            if v.get("status") == "fail":
                out.append({"name": case.get("id", "?"), "policy": self.policy,
                            "status": "fail", "reason": v.get("reason", ""), "case": case})
        return out

    @property
    def passed(self) -> bool:
        return self.get("summary", {}).get("failed", 0) == 0 and not self.failures

    def _failure_message(self) -> str:
        bad = self.failures
        total = len(self.get("cases", []))
        head = f"tpcheck run: {len(bad)} of {total} cases fail {self.policy}"
        if not bad:
            return f"{head} (summary: {self.get('summary')})"
        return f"{head}: " + failure_summary(bad, lambda f: f"{f['name']}: {f['reason']}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self)



def _option_default(o: Mapping[str, Any]) -> Any:
    """A run option's default as Python has it: the command line's text, typed."""
    if o["optional"]:
        return None
    text = o["default"]
    return {"flag": lambda t: t == "true", "int": int, "float": float}.get(o["kind"], str)(text)


_RUN_OPTIONS = {o["keyword"]: o for o in _tpcheck.run_options()}
_RUN_TYPES = {"flag": bool, "int": int, "float": float, "str": str, "choice": str}


def _option_text(keyword: str, value: Any) -> str:
    """The command line's text for a keyword's value, its Python type checked first (a bool
    is not an int; 1.5 is not a whole number of steps)."""
    kind = _RUN_OPTIONS[keyword]["kind"]
    if kind == "flag" and isinstance(value, bool):
        return "true" if value else "false"
    if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))  # numpy's integers too
    if kind == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return repr(float(value))
    if kind in ("str", "choice") and isinstance(value, str):
        return value
    expected = {"flag": "True or False", "int": "an int", "float": "a number",
                "str": "a str", "choice": "one of " + ", ".join(_RUN_OPTIONS[keyword]["choices"])}
    raise InputError(f"{keyword}={value!r}: expected {expected[kind]} "
                     f"(`tpcheck run {_RUN_OPTIONS[keyword]['flag']}`)")


def run(**options: Any) -> RunReport:
    """Runs a suite as `tpcheck run` does and returns its report as the JSON has it (schema
    tpcheck.run/1) in a RunReport (a dict with passed, failures, assert_ok()). The keywords
    are `tpcheck run`'s options with their defaults (--cpu-gemm is cpu_gemm; an option the
    command line leaves unset is None here), checked by the same code, plus `echo`: print
    the console report (`quiet` shortens it as on the command line). Under torchrun (one
    process per rank, backend cuda) the NCCL id goes through the process group's store;
    ranks other than 0 return the report too (rank 0 alone prints and writes `json` /
    `html`).
    """
    try:
        bound = run.__signature__.bind(**options)
    except TypeError as e:  # Python's message names the unknown keyword
        raise InputError(f"tpcheck.run: {e}; expected `tpcheck run`'s options "
                         "(help(tpcheck.run) lists them)") from e
    bound.apply_defaults()
    given = dict(bound.arguments)
    echo = given.pop("echo")
    if not isinstance(echo, bool):
        raise InputError(f"echo={echo!r}: expected True or False")
    texts = {k: _option_text(k, v) for k, v in given.items() if v is not None}
    if given["backend"] in ("auto", "cuda"):
        share_nccl_id_if_torchrun()
    with input_errors():
        report, console, _passed, _failed, _reports = _tpcheck.run(texts)
    if echo and console:
        print(console, end="", flush=True)
    return RunReport(json.loads(report))


def _run_signature() -> inspect.Signature:
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(k, keyword, default=_option_default(o),
                                annotation=(Optional[_RUN_TYPES[o["kind"]]] if o["optional"]
                                            else _RUN_TYPES[o["kind"]]))
              for k, o in _RUN_OPTIONS.items()]
    params.append(inspect.Parameter("echo", keyword, default=False, annotation=bool))
    return inspect.Signature(params, return_annotation=RunReport)


def _run_options_doc() -> str:
    lines = ["", "Options (`tpcheck run --help`):"]
    for k, o in _RUN_OPTIONS.items():
        lines.append(f"    {k} = {_option_default(o)!r}: {o['help']}")
    lines.append("    echo = False: print the console report (Python only)")
    return "\n".join(lines) + "\n"


run.__signature__ = _run_signature()  # type: ignore[attr-defined]
run.__doc__ = (run.__doc__ or "") + _run_options_doc()

"""The result protocol every tpcheck result speaks: `Verdict` (one tensor), `TPReport`
(compare_tp: every tensor of a module) and `RunReport` (a suite run).

    result.passed        True when nothing failed (also `bool(result)`)
    result.failures      the failing items, each a dict with at least "name" and "reason"
    result.assert_ok()   raises tpcheck.CheckFailed with the reasons; returns the result
    result.to_dict()     plain JSON-able data (with "schema" where the format has one)
    result.to_json()     the same as a JSON string

A subclass defines `passed`, `failures`, `to_dict()` and `_failure_message()`.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .._errors import CheckFailed

__all__ = ["Result", "failure_summary"]


class Result:
    """Mixin of the shared result protocol (module docstring)."""

    __slots__ = ()

    @property
    def passed(self) -> bool:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def failures(self) -> list[dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def _failure_message(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def __bool__(self) -> bool:
        return self.passed

    def assert_ok(self, msg: Optional[str] = None):
        """Raises tpcheck.CheckFailed (an AssertionError) naming what failed and why, with
        `msg` as its first line when given; returns the result when it passed."""
        if not self.passed:
            text = self._failure_message()
            raise CheckFailed(f"{msg}\n{text}" if msg else text)
        return self

    def to_json(self, indent: Optional[int] = 1) -> str:
        """to_dict() as JSON (NaN and Inf as JSON allows them in Python's reader)."""
        return json.dumps(self.to_dict(), indent=indent, default=str)


def failure_summary(failures: list[dict[str, Any]], line) -> str:
    """The first failure's line, then how many more fail and the next names."""
    first = line(failures[0])
    if len(failures) == 1:
        return first
    names = [f["name"] for f in failures[1:6]]
    return f"{first} (and {len(failures) - 1} more: {names})"

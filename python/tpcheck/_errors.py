"""The exception types of the tpcheck package: every error tpcheck raises is a `tpcheck.Error`.

Each subclass also derives from the built-in exception a caller would expect for that kind
of failure, so `except ValueError` around a bad argument, or `pytest.raises(AssertionError)`
around a failed check, keeps working:

    Error                     base of every tpcheck error
    ├── InputError            a value passed in is not what was expected (ValueError, TypeError);
    │                         the message names the value, what was expected and the fix
    ├── CheckFailed           a judged tensor failed its policy (AssertionError)
    └── RunError              the run itself failed: a rank died, a kernel refused, a
                              timeout (RuntimeError); the message names where

The C++ library's errors reach Python as these types as well: its input errors as
InputError, its runtime errors as RunError (src/python/bindings.cpp).
"""

from __future__ import annotations

__all__ = ["Error", "InputError", "CheckFailed", "RunError"]


class Error(Exception):
    """Base class of every exception tpcheck raises."""


class InputError(Error, ValueError, TypeError):
    """A value passed to tpcheck is not what was expected; the message says which and why."""


class CheckFailed(Error, AssertionError):
    """A tensor failed the policy it was judged by; the message has the verdicts' reasons."""


class RunError(Error, RuntimeError):
    """The run failed (a rank, a kernel, a timeout); the message names where."""

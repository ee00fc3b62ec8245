"""Calls into the compiled module (tpcheck._tpcheck) with its argument errors as tpcheck's.

The compiled side raises tpcheck.InputError / RunError for the C++ library's errors; the
checks nanobind and the bindings make on the arguments themselves (an unsupported dtype,
a layout, a shape) come out as the builtin ValueError / TypeError. Inside `input_errors()`
those become InputError with the same message, so every error the package raises is a
tpcheck.Error (and still a ValueError / TypeError).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .._errors import Error, InputError

__all__ = ["input_errors"]


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    try:
        yield
    except (ValueError, TypeError) as e:
        if isinstance(e, Error):
            raise
        raise InputError(str(e)) from e

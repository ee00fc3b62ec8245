"""tpcheck.trace(): the cuBLASLt calls a block of Python code makes, from any library.

    with tpcheck.trace() as t:
        y = torch.nn.functional.linear(x, w)        # PyTorch's own cuBLASLt
    print(t.summary())                              # GEMMs by shape, algorithm, class
    print(t.diff(other))                            # what changed against another trace
    t.save("ledger.json")                           # `tpcheck diff` reads it

cuBLASLt reads CUBLASLT_LOG_LEVEL and CUBLASLT_LOG_FILE once, when it loads, so a
running process cannot be traced through the environment (`tpcheck trace -- CMD` does
that for a whole program). Its logger API can be changed at any time, though, and it is
per loaded copy of the library: PyTorch's wheels bring their own libcublasLt, and
tpcheck's CUDA build links another. On entry every copy already mapped into the process
(read from /proc/self/maps) gets its own log file (`cublasLtLoggerSetFile` with a FILE*
opened here) and level 2 (Trace: one line per cublasLtMatmul) or 5 (every API call); on
exit its level goes back to 0 (or to CUBLASLT_LOG_LEVEL when that was set), its file to
stderr, and the file is closed and parsed by the same parser as `tpcheck logdiff`. Logging
happens when the host calls cublasLtMatmul, so no device synchronisation is needed.
"""

from __future__ import annotations

import ctypes
import json as _json
import os
import tempfile
from typing import Any, Optional

from . import _tpcheck
from ._errors import InputError, RunError

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.fopen.restype = ctypes.c_void_p
_LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
_LIBC.fflush.argtypes = [ctypes.c_void_p]
_LIBC.fclose.argtypes = [ctypes.c_void_p]

# cuBLASLt has one logger per loaded copy: a second block would take it from the first.
_active = False


def loaded_cublaslt() -> list[str]:
    """Paths of the libcublasLt copies mapped into this process (empty before a library
    that uses cuBLASLt, e.g. torch, is imported)."""
    paths = set()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6:
                path = fields[5].strip()
                if os.path.basename(path).startswith("libcublasLt.so"):
                    paths.add(path)
    return sorted(paths)


class _Logger:
    """One loaded libcublasLt's logger, pointed at a file of ours."""

    def __init__(self, path: str):
        self.path = path
        # RTLD_NOLOAD: the copy already in the process, never a second one.
        self.lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        for name in ("cublasLtLoggerSetFile", "cublasLtLoggerSetLevel"):
            if not hasattr(self.lib, name):
                raise RunError(f"{path} has no {name}: not a cuBLASLt with the logger API "
                                   "(CUDA 11 or newer)")
        self.lib.cublasLtLoggerSetFile.argtypes = [ctypes.c_void_p]
        self.lib.cublasLtLoggerSetLevel.argtypes = [ctypes.c_int]
        self.file: Optional[int] = None
        self.log: Optional[str] = None

    def start(self, log: str, level: int) -> None:
        self.file = _LIBC.fopen(log.encode(), b"w")
        if not self.file:
            raise RunError(f"cannot open the trace log {log}: {os.strerror(ctypes.get_errno())}")
        self.log = log
        self._check(self.lib.cublasLtLoggerSetFile(self.file), "cublasLtLoggerSetFile")
        self._check(self.lib.cublasLtLoggerSetLevel(level), "cublasLtLoggerSetLevel")

    def stop(self, level_after: int) -> None:
        if self.file is None:
            return
        self.lib.cublasLtLoggerSetLevel(level_after)
        # Away from our FILE* before it is closed; stderr is where cuBLASLt logs by default.
        self.lib.cublasLtLoggerSetFile(ctypes.c_void_p.in_dll(_LIBC, "stderr"))
        _LIBC.fflush(self.file)
        _LIBC.fclose(self.file)
        self.file = None

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            raise RunError(f"{call} in {self.path} returned cublasStatus {status}")


class Trace:
    """The GEMMs cuBLASLt ran inside a `with tpcheck.trace()` block: `ledger` (the JSON
    `tpcheck trace` writes, one process per loaded cuBLASLt), `calls`, `summary()`,
    `diff(other)`, `save(path)`. Filled when the block exits."""

    def __init__(self, level: int, query: bool, directory: str):
        self.level = level
        self.query = query
        self.directory = directory
        self.ledger: dict[str, Any] = {}

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every recorded cublasLtMatmul as a dict (shapes, compute type, algorithm, ...)."""
        return [c for p in self.ledger.get("processes", []) for c in p.get("gemms", [])]

    @property
    def problems(self) -> list[dict[str, Any]]:
        """Log lines the parser skipped (line number and reason)."""
        return [q for p in self.ledger.get("processes", []) for q in p.get("malformed_lines", [])]

    def summary(self) -> str:
        """GEMM count by shape, algorithm and numerical class, most frequent first."""
        return _tpcheck.trace_summary(_json.dumps(self.ledger))

    def diff(self, other: "Trace", label: str = "this", other_label: str = "other") -> str:
        """The calls of both traces aligned (by order and shape, the sharded dimension may
        differ) and those whose algorithm, compute type or class differ, grouped."""
        text, _changed = _tpcheck.trace_diff(_json.dumps(self.ledger), _json.dumps(other.ledger),
                                             label, other_label)
        return text

    def save(self, path: str) -> None:
        """Writes the ledger (schema tpcheck.trace/1) for `tpcheck diff`."""
        with open(path, "w", encoding="utf-8") as f:
            _json.dump(self.ledger, f, indent=1)
            f.write("\n")

    def __repr__(self) -> str:
        return f"<tpcheck.Trace: {len(self.calls)} cublasLtMatmul calls, logs in {self.directory}>"


class trace:  # noqa: N801 — used as `with tpcheck.trace() as t:`
    """Records the cuBLASLt calls made inside the block by any library in the process.

    level: 2 (one line per cublasLtMatmul, default) or 5 (every API call logged; the
    ledger still holds the matmuls). query: decode each algorithm's numerical
    implementation through cuBLASLt's capability query (tpcheck built with CUDA, on a GPU).
    directory: where the logs go (a new temporary directory by default; kept)."""

    def __init__(self, level: int = 2, query: bool = False, directory: Optional[str] = None):
        if level not in (2, 5):
            raise InputError(f"level must be 2 (Trace) or 5 (API trace), got {level!r}")
        self._level = level
        self._query = bool(query)
        self._directory = directory
        self._loggers: list[_Logger] = []
        self._trace: Optional[Trace] = None

    def __enter__(self) -> Trace:
        global _active
        if _active:
            raise RunError("tpcheck.trace() blocks cannot be nested or overlap: cuBLASLt "
                               "has one logger per process")
        libraries = loaded_cublaslt()
        if not libraries:
            raise RunError("no libcublasLt is loaded in this process: import the library "
                               "whose GEMMs you want traced (e.g. torch) and let it load its "
                               "CUDA libraries first (one CUDA matmul does it)")
        directory = self._directory or tempfile.mkdtemp(prefix="tpcheck-trace-")
        os.makedirs(directory, exist_ok=True)
        self._trace = Trace(self._level, self._query, directory)
        _active = True
        try:
            for i, path in enumerate(libraries):
                logger = _Logger(path)
                logger.start(os.path.join(directory, f"cublaslt.{os.getpid()}.{i}.log"), self._level)
                self._loggers.append(logger)
        except BaseException:
            self._stop()
            raise
        return self._trace

    def __exit__(self, *exc: Any) -> None:
        self._stop()
        assert self._trace is not None
        logs = [logger.log for logger in self._loggers if logger.log]
        self._trace.ledger = _json.loads(_tpcheck.trace_ledger(logs, os.getpid(), self._query))
        self._loggers = []

    def _stop(self) -> None:
        global _active
        _active = False
        try:
            level_after = int(os.environ.get("CUBLASLT_LOG_LEVEL", "0"))
        except ValueError:
            level_after = 0
        for logger in self._loggers:
            logger.stop(level_after)

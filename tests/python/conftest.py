"""tests/python/conftest.py — lets `python -m pytest tests/python/test_X.py` run by hand.

ctest gives every Python test three environment variables (tests/CMakeLists.txt):
TPCHECK_TOOLS_DIR (the build's tests/ folder with the helper programs), TPCHECK_CLI (the
tpcheck program) and PYTHONPATH (the package as built, build/python). Run by hand, this
file sets the ones that are missing from a build tree:

  TPCHECK_BUILD_DIR if set, else build/ at the repository root
    TPCHECK_TOOLS_DIR  <build>/tests
    TPCHECK_CLI        <build>/tpcheck
    PYTHONPATH         <build>/python (also put on sys.path, so `import tpcheck` works)

A variable that is already set is kept as it is, so ctest's values win. What could not be
found is printed in pytest's header; the tests that need it then fail with their own
message naming the variable. It also holds the fixtures several test files share.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TPCHECK_BUILD_DIR") or ROOT / "build").resolve()

# (variable, path in the build tree, what it is)
_WANTED = (
    ("TPCHECK_TOOLS_DIR", BUILD / "tests", "the helper programs (layer_dump, dtype_table, ...)"),
    ("TPCHECK_CLI", BUILD / "tpcheck", "the tpcheck program"),
    ("PYTHONPATH", BUILD / "python", "the Python package as built (needs TPCHECK_PYTHON=ON)"),
)

_notes: list[str] = []


def _set_from_build() -> None:
    if not BUILD.is_dir():
        unset = [name for name, _, _ in _WANTED if not os.environ.get(name)]
        if unset:
            _notes.append(
                f"no build tree at {BUILD}: {', '.join(unset)} not set. Build first "
                "(cmake -S . -B build -G Ninja && cmake --build build), or set "
                "TPCHECK_BUILD_DIR to your build folder.")
        return
    for name, path, what in _WANTED:
        if name == "PYTHONPATH":
            # Set for the subprocesses some tests start, and on sys.path for this one.
            if os.environ.get(name):
                continue
            if path.is_dir():
                os.environ[name] = str(path)
                sys.path.insert(0, str(path))
            else:
                _notes.append(f"{path} does not exist: {what}; PYTHONPATH not set")
            continue
        if os.environ.get(name):
            continue
        if path.exists():
            os.environ[name] = str(path)
        else:
            _notes.append(f"{path} does not exist: {what}; {name} not set")


_set_from_build()


def pytest_report_header(config):  # noqa: ARG001 — pytest's hook signature
    lines = [f"tpcheck build: {BUILD}" + ("" if BUILD.is_dir() else " (missing)")]
    for name, _, _ in _WANTED:
        lines.append(f"  {name}={os.environ.get(name, '(not set)')}")
    lines += [f"  note: {n}" for n in _notes]
    return lines


def pytest_terminal_summary(terminalreporter):
    # Repeated at the end, where a failure's reader looks (-q hides the header).
    for n in _notes:
        terminalreporter.write_line(f"tpcheck conftest: {n}", yellow=True)


@pytest.fixture(scope="module")
def cli():
    """The tpcheck program (TPCHECK_CLI), checked to be there."""
    path = os.environ.get("TPCHECK_CLI")
    assert path, "TPCHECK_CLI is not set (ctest sets it to the tpcheck program)"
    assert os.access(path, os.X_OK), f"TPCHECK_CLI={path} is not an executable"
    return path

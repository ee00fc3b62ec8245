"""The pytest plugin (tpcheck.pytest_plugin) end to end, in a pytester sandbox.

The ranks are launched as a user's run launches them: by `python -m tpcheck emulate` (the
default; the `tpcheck` backend on the CPU), and once more by torchrun
(TPCHECK_PYTEST_LAUNCHER=torchrun, gloo on the CPU).
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
pytest_plugins = ["pytester"]

from tpcheck import pytest_plugin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

TESTS = f'''
import sys
sys.path.insert(0, {HERE!r})
import pytest
import torch
import torch.distributed as dist
from torch_tp_layers import MLP, TPMLP
from tpcheck.torch import compare_tp


@pytest.mark.tpcheck(tp=[2])
def test_a_bug_on_rank_one(tpcheck_group):
    assert dist.get_rank() != 1, "rank one disagrees"


@pytest.mark.tpcheck(tp=[2])
def test_megatron_mlp_ok(tpcheck_group):
    torch.manual_seed(0)
    single = MLP(16, 32)
    report = compare_tp(single, TPMLP(single), (torch.randn(4, 16),), grad_output=torch.randn(4, 16))
    report.assert_ok()


def test_plain():
    pass
'''


@pytest.fixture
def sandbox(pytester, monkeypatch):
    monkeypatch.delenv(pytest_plugin.LAUNCHER_ENV, raising=False)  # emulate
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    pytester.makepyfile(test_sandbox=TESTS)
    return pytester


def test_marker_makes_one_item_per_tp_size_and_k_selects(sandbox):
    r = sandbox.runpytest_subprocess("-p", "tpcheck.pytest_plugin", "--collect-only", "-q",
                                     "-k", "megatron")
    r.stdout.fnmatch_lines(["*test_megatron_mlp_ok[[]tp2[]]*", "*1/3 tests collected*"])


@pytest.mark.parametrize("launcher", ["emulate", "torchrun"])
def test_ranks_run_and_a_rank_failure_is_one_failure_naming_the_rank(sandbox, monkeypatch, launcher):
    if launcher == "torchrun":
        monkeypatch.setenv(pytest_plugin.LAUNCHER_ENV, "torchrun")
    r = sandbox.runpytest_subprocess("-p", "tpcheck.pytest_plugin", "-q")
    r.assert_outcomes(passed=2, failed=1)
    r.stdout.fnmatch_lines(["*rank 1 of 2 failed (call): AssertionError: rank one disagrees*"])
    assert "rank 0 of 2 failed" not in r.stdout.str()


def test_x_stops_after_the_first_failing_item(sandbox):
    r = sandbox.runpytest_subprocess("-p", "tpcheck.pytest_plugin", "-q", "-x")
    r.assert_outcomes(failed=1)


def test_bad_marker_argument_is_a_usage_error(pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.tpcheck(tp=[0])\ndef test_x():\n    pass\n")
    r = pytester.runpytest_subprocess("-p", "tpcheck.pytest_plugin", "-q")
    r.stdout.fnmatch_lines(["*tpcheck(tp=[[]0[]]); expected tp= a list of TP sizes*"])


def test_emulate_is_the_default_launcher(monkeypatch):
    monkeypatch.delenv(pytest_plugin.LAUNCHER_ENV, raising=False)
    cmd = pytest_plugin.launch_command(4, ["t.py::test_x[tp4]"])
    assert cmd[1:7] == ["-m", "tpcheck", "emulate", "-n", "4", "--"]
    assert cmd[8:] == ["-m", "pytest", "t.py::test_x[tp4]"]

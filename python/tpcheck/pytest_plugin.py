"""pytest plugin: `@pytest.mark.tpcheck(tp=[2, 4, 8])` runs a test on every rank.

    @pytest.mark.tpcheck(tp=[2, 4])
    def test_my_tp_mlp(tpcheck_group):          # the initialized TP process group
        tpcheck.torch.compare_tp(mlp, tp_mlp, (x,), grad_output=dy).assert_ok()

A marked test becomes one item per TP size (`test_my_tp_mlp[tp2]`, `...[tp4]`), so -k and
-x select and stop as usual, without xdist. Running an item launches

    python -m tpcheck emulate -n N -- python -m pytest <the item's node id> ...

(the emulate launcher: one process per rank, torchrun's environment, on the GPU when there is
one, else the CPU), in which each rank runs the test body and writes its outcome to a file;
the item then fails once, naming every rank that failed and its reason (the first failing
rank's full traceback below). Inside the ranks (TPCHECK_PYTEST_RANK_DIR is set) the items
run as ordinary tests.

The `tpcheck_group` fixture initializes torch.distributed from the launcher's environment
(backend "tpcheck" when the emulate launcher registered it, else "nccl" with a GPU, else
"gloo") and destroys the group after the test.

TPCHECK_PYTEST_LAUNCHER=torchrun launches with `python -m torch.distributed.run` instead
(e.g. for a program that needs one GPU per rank).
Registered through the `pytest11` entry point `tpcheck` (pyproject.toml), or `-p
tpcheck.pytest_plugin`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from ._errors import RunError

RANK_DIR_ENV = "TPCHECK_PYTEST_RANK_DIR"
LAUNCHER_ENV = "TPCHECK_PYTEST_LAUNCHER"
MARK = "tpcheck"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tpcheck(tp=[2, 4, 8]): run the test on every rank of a tensor-parallel "
        "launch (python -m tpcheck emulate -n N), once per TP size")


def _tp_sizes(marker: pytest.Mark, where: str) -> list[int]:
    tp = marker.kwargs.get("tp", marker.args[0] if marker.args else None)
    if isinstance(tp, int):
        tp = [tp]
    if not tp or not all(isinstance(n, int) and n >= 1 for n in tp):
        raise pytest.UsageError(f"{where}: @pytest.mark.tpcheck(tp={tp!r}); expected tp= a list "
                                "of TP sizes >= 1, e.g. tp=[2, 4, 8]")
    return list(tp)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARK)
    if marker is None:
        return
    sizes = _tp_sizes(marker, metafunc.definition.nodeid)
    if "tpcheck_tp" not in metafunc.fixturenames:
        metafunc.fixturenames.append("tpcheck_tp")
    metafunc.parametrize("tpcheck_tp", sizes, ids=[f"tp{n}" for n in sizes])


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Outside the ranks a marked item only launches them: its fixtures (the process
    group, anything costly or device-bound the test asks for) are set up in the ranks
    alone, so the launching process sets up only the TP size."""
    if os.environ.get(RANK_DIR_ENV) is not None:
        return
    for item in items:
        if item.get_closest_marker(MARK) is not None and hasattr(item, "fixturenames"):
            item.fixturenames = ["tpcheck_tp"]


@pytest.fixture
def tpcheck_tp(request) -> int:
    """The TP size of this item (the marker's parametrization)."""
    return request.param


@pytest.fixture
def tpcheck_group(tpcheck_tp):
    """torch.distributed initialized from the launcher's environment; the WORLD group."""
    import torch
    import torch.distributed as dist
    if os.environ.get(RANK_DIR_ENV) is None:
        pytest.skip("tpcheck_group exists inside the ranks of a @pytest.mark.tpcheck test")
    if not dist.is_initialized():
        # `tpcheck emulate` registers its backend in every rank (tpcheck.emulate's hook)
        if "tpcheck" in dist.Backend.backend_list:
            backend = "tpcheck"
        else:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if dist.get_world_size() != tpcheck_tp:
        raise RunError(f"tpcheck_group: launched with WORLD_SIZE {dist.get_world_size()}, "
                       f"the item is tp{tpcheck_tp}; expected the launcher's -n to be the "
                       "marker's TP size")
    yield dist.group.WORLD
    dist.destroy_process_group()


def launch_command(n: int, pytest_argv: list[str]) -> list[str]:
    """The command that runs `pytest_argv` (arguments to `python -m pytest`) on n ranks."""
    if os.environ.get(LAUNCHER_ENV) == "torchrun":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
                f"--master-port={port}", "-m", "pytest", *pytest_argv]
    return [sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--",
            sys.executable, "-m", "pytest", *pytest_argv]


def _rank_pytest_argv(item: pytest.Item) -> list[str]:
    config = item.config
    argv = [item.nodeid, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    if not config.pluginmanager.has_plugin(MARK):  # not loaded by entry point: name it
        argv += ["-p", __name__]
    return argv


def _outcomes(rank_dir: Path) -> list[dict]:
    out = []
    for f in sorted(rank_dir.glob("rank*.json")):
        out.append(json.loads(f.read_text()))
    return sorted(out, key=lambda r: r["rank"])


def _summary(n: int, outcomes: list[dict], proc: subprocess.CompletedProcess, cmd: list[str]) -> Optional[str]:
    """None when every rank passed, else the failure text."""
    failed = [o for o in outcomes if o["outcome"] == "failed"]
    if len(outcomes) == n and not failed and proc.returncode == 0:
        return None
    lines = []
    for o in failed:
        lines.append(f"rank {o['rank']} of {n} failed ({o['when']}): {o['reason']}")
    missing = sorted(set(range(n)) - {o["rank"] for o in outcomes})
    if missing:
        lines.append(f"ranks {missing} reported no outcome (launcher exit status {proc.returncode})")
    if not failed and not missing:
        lines.append(f"every rank passed but the launcher exited with {proc.returncode}")
    if failed:
        lines += ["", f"rank {failed[0]['rank']}'s report:", failed[0]["longrepr"]]
    else:
        tail = (proc.stdout or "")[-4000:]
        lines += ["", "command: " + " ".join(cmd), "output (tail):", tail]
    return "\n".join(lines)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker(MARK) is None or os.environ.get(RANK_DIR_ENV) is not None:
        return None  # an ordinary test, or this process is a rank: run the body here
    n = pyfuncitem.callspec.params["tpcheck_tp"]
    rank_dir = Path(pyfuncitem.config._tmp_path_factory.mktemp("tpcheck_ranks"))  # type: ignore[attr-defined]
    cmd = launch_command(n, _rank_pytest_argv(pyfuncitem))
    env = dict(os.environ, **{RANK_DIR_ENV: str(rank_dir)})
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(pyfuncitem.config.rootpath),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except FileNotFoundError as e:
        pytest.fail(f"tpcheck: could not start the launcher {cmd[0]!r}: {e}", pytrace=False)
    outcomes = _outcomes(rank_dir)
    if len(outcomes) == n and all(o["outcome"] == "skipped" for o in outcomes):
        pytest.skip(f"every rank skipped: {outcomes[0]['reason']}")
    text = _summary(n, outcomes, proc, cmd)
    if text is not None:
        pytest.fail(text, pytrace=False)
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Inside a rank: each item's outcome to the launcher's folder (call phase, or the
    setup/teardown phase that failed)."""
    rank_dir = os.environ.get(RANK_DIR_ENV)
    if rank_dir is None or "[tp" not in report.nodeid:
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    rank = int(os.environ.get("RANK", "0"))
    crash = getattr(report.longrepr, "reprcrash", None)
    reason = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1:] or [""]
    if isinstance(reason, list):
        reason = reason[0] if reason else ""
    path = Path(rank_dir) / f"rank{rank}.json"
    if path.exists() and json.loads(path.read_text())["outcome"] == "failed":
        return  # keep the first failure of this rank
    path.write_text(json.dumps({"rank": rank, "outcome": report.outcome, "when": report.when,
                                "reason": reason, "longrepr": str(report.longrepr or "")}))

"""The protocol between the `tpcheck emulate` launcher and its ranks: one definition of the
environment it sets, the files of a launch and the error a rank raises.

Environment of every rank (besides torchrun's own variables, docs/EMULATE.md):
    TPCHECK_EMULATE=1          the start-up hook (_hook/sitecustomize.py) is active
    TPCHECK_EMULATE_JOB=<id>   the launch's id: it names the launch's files
    TPCHECK_COMM_ORDER         the order of additions, one of tpcheck._names.COMM_ORDERS
    TPCHECK_TRACE_DIR          --trace DIR, absolute (ledger.py writes there)
    TPCHECK_EMULATE_PHYSICAL_GPUS   tests only: the number of GPUs the start-up hook takes
                               as present (its device_count mapping, on machines without one)

Files of a launch, all named `tpcheck-<job>-...` in /dev/shm (/tmp where there is none),
removed by the launcher once every rank has ended (also after a failure):
    events                     one JSON line per rank that ended, {"rank": r, "what": ...},
                               appended by the launcher; a rank waiting in a collective reads
                               it to name a peer that is gone (watch.py)
    init-<rank>                empty: the rank made a process group (the launcher names the
                               ranks that never did)
    <pid>-g<n>-<0|1>           a group's CPU exchange buffers (shm.py)
    <pid>-g<n>-records-<id>    a group's record file (records.py)
Outside the launcher (plain torchrun) the job is "nojob" and every rank removes its own
files at exit.

Imports nothing heavy (no torch): the launcher reads it before any rank starts.
"""

from __future__ import annotations

import json
import os
import uuid

from .._errors import RunError
from .._names import COMM_ORDER_NCCL_RING, COMM_ORDER_RANK, check_comm_order

EMULATE_ENV = "TPCHECK_EMULATE"
JOB_ENV = "TPCHECK_EMULATE_JOB"
ORDER_ENV = "TPCHECK_COMM_ORDER"
TRACE_ENV = "TPCHECK_TRACE_DIR"
# The two orders by name (shared_names(), src/python/bindings.cpp).
NCCL_RING, RANK_ORDER = COMM_ORDER_NCCL_RING, COMM_ORDER_RANK
NO_JOB = "nojob"


class EmulateError(RunError):
    """A collective the tpcheck backend refuses or cannot finish; the message names the
    cause (the rank that ended, the mismatched calls, the tensor it cannot handle)."""


def comm_order() -> str:
    """The order this rank's groups add in: TPCHECK_COMM_ORDER, nccl-ring when unset."""
    return check_comm_order(os.environ.get(ORDER_ENV, NCCL_RING), ORDER_ENV)


def in_launch() -> bool:
    """Whether this process is a rank of `tpcheck emulate` (which removes the job's files)."""
    return JOB_ENV in os.environ


def new_job() -> str:
    return uuid.uuid4().hex[:12]


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"


def job_file(name: str, job: str | None = None) -> str:
    """The path of file `name` of the launch `job` (this process's launch by default)."""
    job = job or os.environ.get(JOB_ENV, NO_JOB)
    return f"{_shm_dir()}/tpcheck-{job}-{name}"


def group_file(group_tag: str, name: str) -> str:
    """A file a process group of this process owns (exchange buffers, record file)."""
    return job_file(f"{os.getpid()}-{group_tag}-{name}")


def append_event(job: str, rank: int, what: str) -> None:
    """The launcher: rank `rank` ended (`what` says how)."""
    with open(job_file("events", job), "a", encoding="utf-8") as f:  # one short write: atomic
        f.write(json.dumps({"rank": rank, "what": what}) + "\n")


def read_events() -> list[dict]:
    """A rank: the launcher's events so far ({"rank", "what"}); [] outside a launch."""
    if not in_launch():
        return []
    try:
        with open(job_file("events"), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def mark_initialized(rank: int) -> None:
    """A rank: it has a process group (the launcher's end-of-run check)."""
    if in_launch():
        with open(job_file(f"init-{rank}"), "w", encoding="utf-8"):
            pass


def was_initialized(job: str, rank: int) -> bool:
    return os.path.exists(job_file(f"init-{rank}", job))


def remove_job_files(job: str) -> None:
    """The launcher, when every rank has ended: every file of the launch."""
    prefix = f"tpcheck-{job}-"
    for d in ("/dev/shm", "/tmp"):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for f in names:
            if f.startswith(prefix):
                try:
                    os.unlink(os.path.join(d, f))
                except OSError:
                    pass

"""`python -m tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] [--mps|--no-mps]
-- CMD ...`

Starts N processes of CMD (a `.py` first word runs under this Python) with torchrun's
environment, each rank's output prefixed `[rank<r>]: `, and the start-up hook
(_hook/sitecustomize.py) first on PYTHONPATH. The launcher hosts the rendezvous store on
MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's agent does): the
backend's groups use the store, so it must outlive every rank (hosted by rank 0 it would
vanish while the others finish their last collective). It talks to the ranks through the
files of protocol.py.

Before starting anything it checks that N ranks fit (memory.py) and decides whether they run
under a private MPS daemon (mps.py); the first line it prints says which.

Faults: when a rank exits or is killed, the launcher appends it to the events file (the
other ranks' collectives then fail naming it), waits up to GRACE_S for the others to end,
then stops them (SIGTERM, SIGKILL KILL_S later): every launch ends within ~6 s of the first
failure. The exit status is the first failed rank's (128 + signal for a killed one); a
launch whose ranks all exit 0 but some never initialized the process group exits 1 and
says which.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .._names import COMM_ORDERS
from . import protocol
from .ledger import write_ledger
from .memory import check_memory, visible_gpus
from .mps import AUTO, MPS_CONTROL, OFF, ON, decide_mps, start_mps

USAGE = ("python -m tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] "
         "[--mps|--no-mps] -- CMD [ARGS...]")
GRACE_S = 3.0
KILL_S = 2.0
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hook")
_VALUE_OPTIONS = ("-n", "--nproc", "--comm-order", "--trace")


def _fail(msg: str, code: int = 2) -> int:
    print(f"tpcheck emulate: {msg}", file=sys.stderr, flush=True)
    return code


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the launcher's options, the command). `--` separates them; without it the command
    starts at the first word that is neither an option nor an option's value."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    j = 0
    while j < len(argv):
        if argv[j] in _VALUE_OPTIONS:
            j += 2
        elif argv[j].startswith("-"):
            j += 1
        else:
            return argv[:j], argv[j:]
    return argv, []


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tpcheck emulate", usage=USAGE,
        epilog="--trace DIR writes DIR/ledger.json; `tpcheck diff tp1/ledger.json tpN/ledger.json` "
               "compares two launches. Before starting, N ranks are checked to fit in host memory "
               "and on the GPUs (estimates; TPCHECK_EMULATE_RANK_MEMORY and "
               "TPCHECK_EMULATE_RANK_GPU_MEMORY set the per-rank figures, 0 turns a check off). "
               "docs/EMULATE.md has the details.")
    p.add_argument("-n", "--nproc", type=int, required=True, help="ranks (processes)")
    p.add_argument("--comm-order", default=protocol.NCCL_RING, choices=list(COMM_ORDERS))
    p.add_argument("--trace", default=None, metavar="DIR")
    mps = p.add_mutually_exclusive_group()
    mps.add_argument("--mps", dest="mps", action="store_const", const=ON, default=AUTO,
                     help=f"run the ranks under a private CUDA MPS daemon even where no GPU is "
                          f"shared; an error when it cannot start (the default uses MPS when "
                          f"several ranks share a GPU and {MPS_CONTROL} is on PATH)")
    mps.add_argument("--no-mps", dest="mps", action="store_const", const=OFF,
                     help="never use MPS: ranks that share a GPU take turns on it")
    return p


def _command(cmd: list[str]) -> tuple[list[str] | None, str]:
    """The command to start (a .py file runs under this Python), or None and why not."""
    if cmd[0].endswith(".py"):
        if not os.path.isfile(cmd[0]):
            return None, f"command not found: {cmd[0]} (no such file)"
        return [sys.executable, *cmd], ""
    if shutil.which(cmd[0]) is None:
        return None, f"command not found: {cmd[0]}"
    return cmd, ""


def main(argv: list[str]) -> int:
    opts, cmd = _split_argv(argv)
    try:
        a = _parser().parse_args(opts)
    except SystemExit as e:
        return int(e.code or 2)
    if a.nproc < 1:
        return _fail(f"-n {a.nproc}: the number of ranks must be at least 1")
    if not cmd:
        return _fail(f"no command to run; usage: {USAGE}")
    cmd, why = _command(cmd)
    if cmd is None:
        return _fail(why, 127)
    gpus = visible_gpus()
    try:
        too_big = check_memory(a.nproc, gpus)
    except ValueError as e:
        return _fail(str(e))
    if too_big:
        return _fail(too_big)
    choice = decide_mps(a.nproc, gpus, a.mps, shutil.which(MPS_CONTROL))
    try:
        mps, line = start_mps(a.nproc, choice)
    except RuntimeError as e:
        return _fail(str(e))
    print(line, file=sys.stderr, flush=True)
    try:
        launch = Launch(a.nproc, cmd, a.comm_order, a.trace, mps.env if mps else {})
        return launch.run()
    finally:
        if mps is not None:
            mps.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _package_parent() -> str:
    """The folder holding the tpcheck package (the ranks import it from there)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(os.path.dirname(here))


def _status_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _signal(pr: subprocess.Popen, sig) -> None:
    try:
        os.killpg(pr.pid, sig)  # the rank and anything it started (its own session)
    except (ProcessLookupError, PermissionError):
        try:
            pr.send_signal(sig)
        except ProcessLookupError:
            pass


def _pump(stream, out, prefix: bytes, lock) -> None:
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if not line.startswith(prefix):  # torch prefixes its own tracebacks already
            line = prefix + line
        with lock:
            out.buffer.write(line)
            out.buffer.flush()
    stream.close()


@dataclass
class Launch:
    """One launch: N ranks of `cmd`, supervised until all have ended."""

    n: int
    cmd: list[str]
    order: str
    trace: str | None
    extra_env: dict
    job: str = field(default_factory=protocol.new_job)
    port: int = field(default_factory=_free_port)
    procs: list = field(default_factory=list)
    pumps: list = field(default_factory=list)

    def base_env(self) -> dict:
        """torchrun's environment for every rank, and tpcheck's own (protocol.py)."""
        env = dict(os.environ)
        pp = [HOOK_DIR, _package_parent()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        n = str(self.n)
        env.update({
            "PYTHONPATH": os.pathsep.join(pp), "PYTHONUNBUFFERED": "1",
            "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n, "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default", "ROLE_WORLD_SIZE": n, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port), "TORCHELASTIC_RUN_ID": f"tpcheck-{self.job}",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            protocol.EMULATE_ENV: "1", protocol.JOB_ENV: self.job, protocol.ORDER_ENV: self.order,
        })
        if self.n > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun does
        if self.trace:
            os.makedirs(self.trace, exist_ok=True)
            env[protocol.TRACE_ENV] = os.path.abspath(self.trace)
        env.update(self.extra_env)
        return env

    def rank_env(self, base: dict, r: int) -> dict:
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r))
        if self.trace:
            env["CUBLASLT_LOG_LEVEL"] = env.get("CUBLASLT_LOG_LEVEL", "2")
            env["CUBLASLT_LOG_FILE"] = os.path.join(env[protocol.TRACE_ENV],
                                                    f"cublaslt.rank{r}.log")
        return env

    def start(self) -> str:
        """Starts the ranks; the error when one cannot start (the others are killed)."""
        base = self.base_env()
        lock = threading.Lock()
        for r in range(self.n):
            try:
                pr = subprocess.Popen(self.cmd, env=self.rank_env(base, r), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                for q in self.procs:
                    _signal(q, signal.SIGKILL)
                return f"cannot start {self.cmd[0]}: {e}"
            self.procs.append(pr)
            for stream, out in ((pr.stdout, sys.stdout), (pr.stderr, sys.stderr)):
                t = threading.Thread(target=_pump, daemon=True,
                                     args=(stream, out, f"[rank{r}]: ".encode(), lock))
                t.start()
                self.pumps.append(t)
        return ""

    def run(self) -> int:
        """Starts, supervises, writes the trace ledger; the launch's exit status."""
        failed = self.start()
        if failed:
            self.end()
            return _fail(failed, 127)

        def on_signal(signum, _frame):
            for q in self.procs:
                _signal(q, signum)

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = self.supervise()
            if self.trace:
                write_ledger(os.path.abspath(self.trace), [q.pid for q in self.procs], self.order)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.end()
        return code

    def end(self) -> None:
        for q in self.procs:
            if q.poll() is None:
                _signal(q, signal.SIGKILL)
                q.wait()
        for t in self.pumps:
            t.join(timeout=2)
        protocol.remove_job_files(self.job)

    def supervise(self) -> int:
        # The store is made after the ranks started (they spend their first seconds importing
        # torch, and their store clients retry until it listens).
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", self.port, self.n, True, timedelta(seconds=60),
                         wait_for_workers=False)
        try:
            return Watch(self).run()
        finally:
            del store


class Watch:
    """Polls the ranks until all have ended: records each end in the events file, stops the
    others after a failure, and gives the launch's exit status."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.done: dict[int, int] = {}
        self.first_fail: tuple[int, int] | None = None  # (rank, status)
        self.fail_time = 0.0
        self.term_sent = False

    def run(self) -> int:
        n = self.launch.n
        while len(self.done) < n:
            self.collect()
            if self.first_fail is not None and len(self.done) < n:
                self.stop_the_others()
            time.sleep(0.02)
        if self.first_fail is not None:
            code = self.first_fail[1]
            return 128 - code if code < 0 else code
        return self.check_initialized()

    def collect(self) -> None:
        for r, pr in enumerate(self.launch.procs):
            if r in self.done:
                continue
            code = pr.poll()
            if code is None:
                continue
            self.done[r] = code
            protocol.append_event(self.launch.job, r,
                                  "exited (status 0)" if code == 0 else _status_text(code))
            if code != 0 and self.first_fail is None:
                self.first_fail = (r, code)
                self.fail_time = time.monotonic()
                alive = [str(q) for q in range(self.launch.n) if q not in self.done]
                print(f"tpcheck emulate: rank {r} {_status_text(code)}"
                      + (f"; ending ranks {', '.join(alive)}" if alive else ""),
                      file=sys.stderr, flush=True)

    def stop_the_others(self) -> None:
        waited = time.monotonic() - self.fail_time
        if waited > GRACE_S and not self.term_sent:
            sig = signal.SIGTERM
            self.term_sent = True
        elif waited > GRACE_S + KILL_S:
            sig = signal.SIGKILL
        else:
            return
        for r, pr in enumerate(self.launch.procs):
            if r not in self.done:
                _signal(pr, sig)

    def check_initialized(self) -> int:
        job = self.launch.job
        never = [r for r in range(self.launch.n) if not protocol.was_initialized(job, r)]
        if not never:
            return 0
        print(f"tpcheck emulate: rank{'s' if len(never) > 1 else ''} "
              f"{', '.join(map(str, never))} never initialized the process group "
              f"(torch.distributed.init_process_group was not called)", file=sys.stderr, flush=True)
        return 1

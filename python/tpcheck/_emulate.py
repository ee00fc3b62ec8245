"""`python -m tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] -- CMD ...`

Starts N processes of CMD (a `.py` first word runs under this Python) with torchrun's
environment, each rank's output prefixed `[rank<r>]: `, and its `tpcheck` start-up hook
(torch/_hook/sitecustomize.py) first on PYTHONPATH. The launcher hosts the rendezvous store
on MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's agent does):
every collective of the backend goes through the store, so it must outlive every rank
(hosted by rank 0 it would vanish while the others finish their last collective). It
talks to the ranks through files of the job in /dev/shm: `events` (which ranks ended,
and how) and `init-<rank>` (the rank initialized the process group).

Faults: when a rank exits or is killed, the launcher appends it to the events file
(the other ranks' collectives then fail naming it), waits up to 3 s for the others to end,
then stops them (SIGTERM, SIGKILL 2 s later): every launch ends within ~6 s of the first
failure. The exit status is the first failed rank's (128 + signal for a killed one); a
launch whose ranks all exit 0 but some never initialized the process group exits 1 and
says which.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

USAGE = "python -m tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] -- CMD [ARGS...]"
GRACE_S = 3.0
KILL_S = 2.0


def _fail(msg: str, code: int = 2) -> int:
    print(f"tpcheck emulate: {msg}", file=sys.stderr, flush=True)
    return code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, out, prefix: bytes, lock):
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if not line.startswith(prefix):  # torch prefixes its own tracebacks already
            line = prefix + line
        with lock:
            out.buffer.write(line)
            out.buffer.flush()
    stream.close()


def _status_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        opts, cmd = argv[:i], argv[i + 1:]
    else:
        opts, cmd = argv, []
        # Allow `emulate -n 2 script.py args` without `--` when the options are clear.
        j = 0
        while j < len(argv):
            if argv[j] in ("-n", "--nproc", "--comm-order", "--trace"):
                j += 2
            elif argv[j].startswith("-"):
                j += 1
            else:
                opts, cmd = argv[:j], argv[j:]
                break
    p = argparse.ArgumentParser(prog="python -m tpcheck emulate", usage=USAGE)
    p.add_argument("-n", "--nproc", type=int, required=True, help="ranks (processes)")
    p.add_argument("--comm-order", default="nccl-ring", choices=["nccl-ring", "rank"])
    p.add_argument("--trace", default=None, metavar="DIR")
    try:
        a = p.parse_args(opts)
    except SystemExit as e:
        return int(e.code or 2)
    if a.nproc < 1:
        return _fail(f"-n {a.nproc}: the number of ranks must be at least 1")
    if not cmd:
        return _fail(f"no command to run; usage: {USAGE}")
    if cmd[0].endswith(".py"):
        if not os.path.isfile(cmd[0]):
            return _fail(f"command not found: {cmd[0]} (no such file)", 127)
        cmd = [sys.executable, *cmd]
    elif shutil.which(cmd[0]) is None:
        return _fail(f"command not found: {cmd[0]}", 127)

    import tpcheck

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(tpcheck.__file__)))
    hook_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch", "_hook")
    port = _free_port()
    job = uuid.uuid4().hex[:12]
    n = a.nproc
    base_env = dict(os.environ)
    pp = [hook_dir, pkg_parent] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
    base_env.update({
        "PYTHONPATH": os.pathsep.join(pp),
        "PYTHONUNBUFFERED": "1",
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": f"tpcheck-{job}", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TPCHECK_EMULATE": "1", "TPCHECK_EMULATE_JOB": job, "TPCHECK_COMM_ORDER": a.comm_order,
    })
    if n > 1 and "OMP_NUM_THREADS" not in base_env:
        base_env["OMP_NUM_THREADS"] = "1"  # as torchrun does
    if a.trace:
        os.makedirs(a.trace, exist_ok=True)
        base_env["TPCHECK_TRACE_DIR"] = os.path.abspath(a.trace)

    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    lock = threading.Lock()
    for r in range(n):
        env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r))
        if a.trace:
            env["CUBLASLT_LOG_LEVEL"] = env.get("CUBLASLT_LOG_LEVEL", "2")
            env["CUBLASLT_LOG_FILE"] = os.path.join(env["TPCHECK_TRACE_DIR"], f"cublaslt.rank{r}.log")
        try:
            pr = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        except OSError as e:
            for q in procs:
                _signal(q, signal.SIGKILL)
            return _fail(f"cannot start {cmd[0]}: {e}", 127)
        procs.append(pr)
        for stream, out in ((pr.stdout, sys.stdout), (pr.stderr, sys.stderr)):
            t = threading.Thread(target=_pump, args=(stream, out, f"[rank{r}]: ".encode(), lock),
                                 daemon=True)
            t.start()
            pumps.append(t)

    def on_signal(signum, _frame):
        for q in procs:
            _signal(q, signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = _supervise(procs, n, job, port)
        if a.trace:
            _write_ledger(base_env["TPCHECK_TRACE_DIR"], [q.pid for q in procs], a.comm_order)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for q in procs:
            if q.poll() is None:
                _signal(q, signal.SIGKILL)
                q.wait()
        for t in pumps:
            t.join(timeout=2)
        _cleanup_shm(job)
    return code


def _write_ledger(d: str, pids: list[int], order: str) -> None:
    """--trace: one ledger of the launch (ledger.json, schema tpcheck.emulate/1): every
    rank's collectives (comm.rank<r>.jsonl, written by the backend) and cuBLASLt GEMMs
    (cublaslt.rank<r>.log, parsed as tpcheck.trace() does); each rank's GEMMs also as
    gemms.rank<r>.json (tpcheck.trace/1), which `tpcheck diff` compares across runs."""
    from . import _tpcheck

    ranks = []
    for r, pid in enumerate(pids):
        rec = {"rank": r, "pid": pid, "collectives": [], "gemms": None}
        comm = os.path.join(d, f"comm.rank{r}.jsonl")
        if os.path.exists(comm):
            with open(comm, encoding="utf-8") as f:
                rec["collectives"] = [json.loads(line) for line in f if line.strip()]
        log = os.path.join(d, f"cublaslt.rank{r}.log")
        if os.path.exists(log) and os.path.getsize(log) > 0:
            try:
                ledger = json.loads(_tpcheck.trace_ledger([log], pid, False))
                rec["gemms"] = ledger
                with open(os.path.join(d, f"gemms.rank{r}.json"), "w", encoding="utf-8") as f:
                    json.dump(ledger, f, indent=1)
            except Exception as e:  # noqa: BLE001 - the ledger says what failed
                rec["gemms_error"] = str(e)
        ranks.append(rec)
    with open(os.path.join(d, "ledger.json"), "w", encoding="utf-8") as f:
        json.dump({"schema": "tpcheck.emulate/1", "world_size": len(pids), "comm_order": order,
                   "ranks": ranks}, f, indent=1)


def _signal(pr: subprocess.Popen, sig) -> None:
    try:
        os.killpg(pr.pid, sig)  # the rank and anything it started (its own session)
    except (ProcessLookupError, PermissionError):
        try:
            pr.send_signal(sig)
        except ProcessLookupError:
            pass


def _cleanup_shm(job: str) -> None:
    for d in ("/dev/shm", "/tmp"):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for f in names:
            if f.startswith(f"tpcheck-{job}-"):
                try:
                    os.unlink(os.path.join(d, f))
                except OSError:
                    pass


def job_file(name: str, job: str | None = None) -> str:
    """A file of this launch in /dev/shm (removed with the others when the launch ends)."""
    job = job or os.environ.get("TPCHECK_EMULATE_JOB", "nojob")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    return f"{base}/tpcheck-{job}-{name}"


def read_events() -> list[dict]:
    """The launcher's events ({"rank", "what"}) so far; [] outside a launch."""
    if "TPCHECK_EMULATE_JOB" not in os.environ:
        return []
    try:
        with open(job_file("events"), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def mark_initialized(rank: int) -> None:
    """Called in a rank when it has a process group (the launcher's end-of-run check)."""
    if "TPCHECK_EMULATE_JOB" in os.environ:
        with open(job_file(f"init-{rank}"), "w", encoding="utf-8"):
            pass


def _supervise(procs, n: int, job: str, port: int) -> int:
    # Made after the ranks started (they spend their first seconds importing torch, and
    # their store clients retry until it listens).
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, n, True, timedelta(seconds=60), wait_for_workers=False)
    try:
        return _watch(procs, n, job)
    finally:
        del store


def _watch(procs, n: int, job: str) -> int:
    events = job_file("events", job)
    done: dict[int, int] = {}
    first_fail = None  # (rank, code)
    fail_time = None
    term_sent = False
    while len(done) < n:
        for r, pr in enumerate(procs):
            if r in done:
                continue
            code = pr.poll()
            if code is None:
                continue
            done[r] = code
            ev = {"rank": r, "what": _status_text(code)}
            if code == 0:
                ev["what"] = "exited (status 0)"
            with open(events, "a", encoding="utf-8") as f:  # one short write: atomic
                f.write(json.dumps(ev) + "\n")
            if code != 0 and first_fail is None:
                first_fail = (r, code)
                fail_time = time.monotonic()
                alive = [str(q) for q in range(n) if q not in done]
                print(f"tpcheck emulate: rank {r} {_status_text(code)}"
                      + (f"; ending ranks {', '.join(alive)}" if alive else ""),
                      file=sys.stderr, flush=True)
        if first_fail is not None and len(done) < n:
            waited = time.monotonic() - fail_time
            if waited > GRACE_S and not term_sent:
                for r, pr in enumerate(procs):
                    if r not in done:
                        _signal(pr, signal.SIGTERM)
                term_sent = True
            elif waited > GRACE_S + KILL_S:
                for r, pr in enumerate(procs):
                    if r not in done:
                        _signal(pr, signal.SIGKILL)
        time.sleep(0.02)
    if first_fail is not None:
        r, code = first_fail
        return 128 - code if code < 0 else code
    never = [r for r in range(n) if not os.path.exists(job_file(f"init-{r}", job))]
    if never:
        print(f"tpcheck emulate: rank{'s' if len(never) > 1 else ''} "
              f"{', '.join(map(str, never))} never initialized the process group "
              f"(torch.distributed.init_process_group was not called)", file=sys.stderr, flush=True)
        return 1
    return 0

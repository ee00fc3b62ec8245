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

Before starting anything it checks that N ranks fit: N processes with torch imported in
host memory (MemAvailable), and, where nvidia-smi answers, one CUDA context per rank on
the GPU it maps to (rank r → GPU r mod G); see _check_memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

USAGE = "python -m tpcheck emulate -n N [--comm-order nccl-ring|rank] [--trace DIR] [--mps] -- CMD [ARGS...]"
GRACE_S = 3.0
KILL_S = 2.0


def _fail(msg: str, code: int = 2) -> int:
    print(f"tpcheck emulate: {msg}", file=sys.stderr, flush=True)
    return code


# Host memory one rank takes before the program does anything: a Python process that has
# imported torch and torch.distributed. Measured 2026-12-04 here (torch 2.11.0+cu130,
# Python 3.11, x86-64, no GPU) from /proc/self/status after
# `python -c "import torch, torch.distributed"`: VmRSS 0.47 GiB (481 MiB), of which RssAnon
# 269 MiB is the process's own and RssFile 212 MiB is torch's shared libraries, whose pages
# every rank shares (counted once). A rank that creates a CUDA context holds more (VmRSS
# 0.60 GiB measured on the H200 below): this is the least a rank needs, so the check only
# refuses launches that cannot fit at all. TPCHECK_EMULATE_RANK_MEMORY replaces the
# per-rank figure (0 turns the host check off).
RANK_HOST_BYTES = 269 << 20
SHARED_HOST_BYTES = 212 << 20
# GPU memory of one rank's CUDA context, an estimate: measured 2026-12-04 on one H200
# (driver 580.159.04, torch 2.11.0+cu130) with nvidia-smi's memory.used while 4 processes
# each held torch.zeros(1, device="cuda"): 618 MiB per process (736 MiB after a first bf16
# GEMM: cuBLAS's workspace and torch's caching allocator). Other GPUs, drivers and
# CUDA_MODULE_LOADING settings differ. TPCHECK_EMULATE_RANK_GPU_MEMORY replaces it (0 turns
# the GPU check off, e.g. for a program that uses no CUDA on a machine with GPUs).
RANK_CUDA_BYTES = 618 << 20

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _bytes_from_env(name: str, default: int) -> int:
    """A size from the environment: bytes, or a number with K, M, G or T (binary: 1G = 1 GiB;
    KiB, GB and the like are read the same). ValueError naming the variable otherwise."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"{name}={text!r}: expected a size in bytes, or a number with K, M, G "
                         f"or T (e.g. 2G for 2 GiB; 0 turns the check off)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _visible_gpus() -> list[tuple[str, int]] | None:
    """(GPU name for messages, free bytes) of the GPUs this launch's ranks can use, in CUDA's
    order, from `nvidia-smi` (never through torch.cuda: the launcher must not create a CUDA
    context). None when there is no nvidia-smi, it fails, or CUDA_VISIBLE_DEVICES names
    devices it cannot be matched with (MIG instances)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        p = subprocess.run([smi, "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    gpus = []  # (index, uuid, free MiB)
    for line in p.stdout.splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            gpus.append((fields[0], fields[1], int(float(fields[2]))))
        except ValueError:
            continue  # "[N/A]" and the like: nothing to check against
    if not gpus:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen = gpus
    else:
        chosen = []
        for tok in (t.strip() for t in visible.split(",")):
            # CUDA stops at the first entry that names no device; so do we.
            match = [g for g in gpus if tok and (tok == g[0] or (tok.startswith("GPU-") and g[1].startswith(tok)))]
            if not match:
                if tok.startswith("MIG-"):
                    return None
                break
            chosen.append(match[0])
    return [(f"GPU {i} ({u})", free << 20) for i, u, free in chosen]


def _check_memory(n: int) -> str | None:
    """Why N ranks cannot fit (the message), or None. Only estimates: see RANK_HOST_BYTES
    and RANK_CUDA_BYTES."""
    per_rank = _bytes_from_env("TPCHECK_EMULATE_RANK_MEMORY", RANK_HOST_BYTES)
    avail = _mem_available()
    if per_rank > 0 and avail is not None:
        # The launcher imports torch too (it hosts the store), so it counts as one more.
        need = (n + 1) * per_rank + SHARED_HOST_BYTES
        if need > avail:
            return (f"-n {n}: each rank needs about {_gib(per_rank)} of host memory (a Python "
                    f"process with torch imported; TPCHECK_EMULATE_RANK_MEMORY sets it); {n} "
                    f"rank{'s' if n > 1 else ''} need {_gib(need)} (with the launcher and "
                    f"{_gib(SHARED_HOST_BYTES)} of torch's libraries, shared), the machine has "
                    f"{_gib(avail)} available (MemAvailable)")
    per_gpu_rank = _bytes_from_env("TPCHECK_EMULATE_RANK_GPU_MEMORY", RANK_CUDA_BYTES)
    gpus = _visible_gpus() if per_gpu_rank > 0 else None
    if gpus:
        g = len(gpus)
        for j, (name, free) in enumerate(gpus):
            ranks = n // g + (1 if j < n % g else 0)  # ranks r with r mod G == j
            if ranks * per_gpu_rank > free:
                return (f"-n {n}: each rank that uses CUDA needs about {_gib(per_gpu_rank)} of GPU "
                        f"memory for its CUDA context (an estimate; "
                        f"TPCHECK_EMULATE_RANK_GPU_MEMORY sets it, 0 for a program that uses no "
                        f"CUDA); rank r runs on GPU r mod {g}, so {name} would hold {ranks} "
                        f"rank{'s' if ranks > 1 else ''}: {_gib(ranks * per_gpu_rank)}, it has "
                        f"{_gib(free)} free (nvidia-smi memory.free)")
    return None


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
    p = argparse.ArgumentParser(
        prog="python -m tpcheck emulate", usage=USAGE,
        epilog="--trace DIR writes DIR/ledger.json; `tpcheck diff tp1/ledger.json tpN/ledger.json` "
               "compares two launches. Before starting, N ranks are checked to fit in host memory "
               "and on the GPUs (estimates; TPCHECK_EMULATE_RANK_MEMORY and "
               "TPCHECK_EMULATE_RANK_GPU_MEMORY set the per-rank figures, 0 turns a check off). "
               "docs/EMULATE.md has the details.")
    p.add_argument("-n", "--nproc", type=int, required=True, help="ranks (processes)")
    p.add_argument("--comm-order", default="nccl-ring", choices=["nccl-ring", "rank"])
    p.add_argument("--trace", default=None, metavar="DIR")
    p.add_argument("--mps", action="store_true",
                   help="run the ranks as clients of a CUDA MPS server of this launch (a private "
                        "nvidia-cuda-mps-control daemon, stopped at the end): ranks sharing a GPU "
                        "then run their kernels side by side instead of in time slices")
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
    try:
        too_big = _check_memory(a.nproc)
    except ValueError as e:
        return _fail(str(e))
    if too_big:
        return _fail(too_big)

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

    mps = None
    if a.mps:
        try:
            mps = MpsDaemon()
        except RuntimeError as e:
            return _fail(str(e))
        base_env.update(mps.env)
    try:
        return _launch(a, cmd, n, job, port, base_env)
    finally:
        if mps is not None:
            mps.stop()


class MpsDaemon:
    """--mps: a CUDA MPS control daemon of this launch only. Its pipe and log folders are a
    temporary folder of ours (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, given to the
    ranks), so it serves this launch's ranks and no other program, and another MPS daemon on
    the machine is left alone. The GPU's settings (compute mode, clocks) are not touched.
    Why: without MPS, processes that share a GPU take turns on it (time slices), and every
    collective waits for each rank's turn; with MPS their kernels share the GPU at once."""

    def __init__(self):
        import tempfile

        self.exe = shutil.which("nvidia-cuda-mps-control")
        if self.exe is None:
            raise RuntimeError("--mps: nvidia-cuda-mps-control is not on PATH (it comes with "
                               "the NVIDIA driver); run without --mps")
        self.dir = tempfile.mkdtemp(prefix="tpcheck-mps-")
        pipe, log = os.path.join(self.dir, "pipe"), os.path.join(self.dir, "log")
        os.makedirs(pipe)
        os.makedirs(log)
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
        p = subprocess.run([self.exe, "-d"], env=dict(os.environ, **self.env),
                           capture_output=True, text=True, timeout=30)
        deadline = time.monotonic() + 10
        while p.returncode == 0 and not os.path.exists(os.path.join(pipe, "control")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if p.returncode != 0 or not os.path.exists(os.path.join(pipe, "control")):
            why = (p.stderr or p.stdout).strip() or self._log_tail()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"--mps: the MPS control daemon did not start "
                               f"(status {p.returncode}): {why}")

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.env["CUDA_MPS_LOG_DIRECTORY"], "control.log"),
                      encoding="utf-8", errors="replace") as f:
                return " / ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "no log"

    def stop(self) -> None:
        try:
            subprocess.run([self.exe], input="quit\n", env=dict(os.environ, **self.env),
                           capture_output=True, text=True, timeout=30)
            # The daemon removes its control pipe once it has ended.
            deadline = time.monotonic() + 10
            while os.path.exists(os.path.join(self.env["CUDA_MPS_PIPE_DIRECTORY"], "control")):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _launch(a, cmd, n, job, port, base_env) -> int:
    """Starts the N ranks, supervises them, writes the trace ledger; the exit status."""
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
    gemms.rank<r>.json (tpcheck.trace/1). `tpcheck diff A/ledger.json B/ledger.json` reads
    this file (src/cli/emulate_diff.cpp): keep its keys in step with that reader."""
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

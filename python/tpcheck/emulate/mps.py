"""CUDA MPS for a launch: whether the ranks run as clients of a private MPS daemon, and the
daemon itself.

Why: processes that share a GPU without MPS take turns on it in time slices, and every
collective waits for each rank's turn; under MPS their kernels run side by side
(bench/RESULTS.md has the figures). So MPS is the default whenever several ranks share a
GPU and `nvidia-cuda-mps-control` (it comes with the driver) is on PATH; `--no-mps` opts
out, `--mps` insists (an error when it cannot start). The launch's first line says which
mode runs and why (decide_mps); where the daemon does not start by default, the launch
goes on without it and says so in that line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

from .memory import ranks_on_gpu

MPS_CONTROL = "nvidia-cuda-mps-control"
AUTO, ON, OFF = "auto", "on", "off"  # the default, --mps, --no-mps


@dataclass(frozen=True)
class MpsChoice:
    use: bool       # start a private daemon for the launch
    required: bool  # --mps: a daemon that cannot start is an error, not a note
    reason: str     # why, for the launch's first line


def _ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def decide_mps(n: int, gpus: Optional[list], choice: str = AUTO,
               exe: Optional[str] = None) -> MpsChoice:
    """Whether n ranks run under MPS. gpus: memory.visible_gpus() (None or []: no GPU seen);
    choice: AUTO, ON (--mps) or OFF (--no-mps); exe: nvidia-cuda-mps-control's path (None:
    not on PATH)."""
    if choice == OFF:
        return MpsChoice(False, False, "--no-mps")
    if choice == ON:
        return MpsChoice(True, True, "--mps")
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return MpsChoice(False, False, "CUDA_MPS_PIPE_DIRECTORY is set: the ranks are clients "
                                       "of that MPS server")
    if not gpus:
        return MpsChoice(False, False, "no GPU visible to nvidia-smi")
    g = len(gpus)
    shared = max(ranks_on_gpu(n, g, j) for j in range(g))
    if shared < 2:
        return MpsChoice(False, False, f"no GPU is shared: {_ranks(n)} on {g} GPU"
                                       f"{'s' if g != 1 else ''}")
    if exe is None:
        return MpsChoice(False, False, f"{MPS_CONTROL} is not on PATH; ranks that share a GPU "
                                       f"take turns on it")
    return MpsChoice(True, False, f"up to {shared} ranks share a GPU; --no-mps to opt out")


def mode_line(n: int, choice: MpsChoice, started: bool, failure: str = "") -> str:
    """The launch's first line: which mode runs and why (failure: why the default daemon did
    not start)."""
    if started:
        return f"tpcheck emulate: {_ranks(n)} under a private MPS daemon ({choice.reason})"
    if failure:
        return (f"tpcheck emulate: {_ranks(n)} without MPS: {failure}; ranks that share a GPU "
                f"take turns on it (--no-mps skips MPS)")
    return f"tpcheck emulate: {_ranks(n)} without MPS ({choice.reason})"


class MpsDaemon:
    """A CUDA MPS control daemon of this launch only. Its pipe and log folders are a
    temporary folder of ours (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, given to the
    ranks in `env`), so it serves this launch's ranks and no other program, and another MPS
    daemon on the machine is left alone. The GPU's settings (compute mode, clocks) are not
    touched. RuntimeError naming the cause when it cannot start."""

    def __init__(self, flag: str = "--mps"):
        self.exe = shutil.which(MPS_CONTROL)
        if self.exe is None:
            raise RuntimeError(f"{flag}: {MPS_CONTROL} is not on PATH (it comes with "
                               f"the NVIDIA driver); run without {flag}")
        self.dir = tempfile.mkdtemp(prefix="tpcheck-mps-")
        pipe, log = os.path.join(self.dir, "pipe"), os.path.join(self.dir, "log")
        os.makedirs(pipe)
        os.makedirs(log)
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
        self._control = os.path.join(pipe, "control")
        try:
            p = subprocess.run([self.exe, "-d"], env=dict(os.environ, **self.env),
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"{flag}: {MPS_CONTROL} -d could not run: {e}") from e
        if p.returncode == 0:
            self._wait_for(lambda: os.path.exists(self._control))
        if p.returncode != 0 or not os.path.exists(self._control):
            why = " / ".join((p.stderr or p.stdout).strip().splitlines()) or self._log_tail()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"{flag}: the MPS control daemon did not start "
                               f"(status {p.returncode}): {why}")

    @staticmethod
    def _wait_for(cond, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.05)

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
            self._wait_for(lambda: not os.path.exists(self._control))
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def start_mps(n: int, choice: MpsChoice) -> tuple[Optional[MpsDaemon], str]:
    """The daemon the choice asks for (None when it does not), and the launch's first line.
    RuntimeError only for --mps (choice.required) when the daemon cannot start."""
    if not choice.use:
        return None, mode_line(n, choice, started=False)
    try:
        daemon = MpsDaemon("--mps" if choice.required else "MPS")
    except RuntimeError as e:
        if choice.required:
            raise
        return None, mode_line(n, choice, started=False, failure=str(e).split(": ", 1)[-1])
    return daemon, mode_line(n, choice, started=True)

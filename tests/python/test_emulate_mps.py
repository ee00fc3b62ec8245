"""tests/python/test_emulate_mps.py — whether `python -m tpcheck emulate` runs its ranks
under a private MPS daemon (tpcheck.emulate.mps), on the CPU.

MPS is the default when several ranks share a GPU and nvidia-cuda-mps-control is on PATH;
--no-mps opts out, --mps insists; the launch's first line says which mode runs and why, and
a default daemon that cannot start is a one-line note, not a failure. Checked in-process on
the decision itself, then end to end with stand-ins on PATH: an `nvidia-smi` that lists one
GPU (or fails: no GPU) and an `nvidia-cuda-mps-control` that makes the control pipe on `-d`
and removes it on `quit` (or fails). The ranks only print their MPS environment (they never
make a process group: the launch exits 1 saying so), so a launch costs the launcher's torch
import.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tpcheck.emulate import mps  # noqa: E402

ONE_GPU = [("GPU 0 (GPU-aaaa)", 80 << 30)]
TWO_GPUS = ONE_GPU + [("GPU 1 (GPU-bbbb)", 80 << 30)]
EXE = "/usr/bin/nvidia-cuda-mps-control"


def test_decision(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    d = mps.decide_mps(8, ONE_GPU, mps.AUTO, EXE)
    assert d.use and not d.required and d.reason == "up to 8 ranks share a GPU; --no-mps to opt out"
    assert mps.decide_mps(3, TWO_GPUS, mps.AUTO, EXE).reason.startswith("up to 2 ranks share a GPU")
    # No GPU shared: CPU ranks, or a GPU per rank.
    for gpus in (None, []):
        d = mps.decide_mps(4, gpus, mps.AUTO, EXE)
        assert not d.use and d.reason == "no GPU visible to nvidia-smi"
    d = mps.decide_mps(2, TWO_GPUS, mps.AUTO, EXE)
    assert not d.use and d.reason == "no GPU is shared: 2 ranks on 2 GPUs"
    assert not mps.decide_mps(1, ONE_GPU, mps.AUTO, EXE).use
    d = mps.decide_mps(4, ONE_GPU, mps.AUTO, None)
    assert not d.use and "nvidia-cuda-mps-control is not on PATH" in d.reason
    # The flags win over everything.
    assert mps.decide_mps(8, ONE_GPU, mps.OFF, EXE) == mps.MpsChoice(False, False, "--no-mps")
    assert mps.decide_mps(2, None, mps.ON, None) == mps.MpsChoice(True, True, "--mps")
    # An MPS server of the user's own is left in charge.
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/their-mps")
    d = mps.decide_mps(8, ONE_GPU, mps.AUTO, EXE)
    assert not d.use and "CUDA_MPS_PIPE_DIRECTORY is set" in d.reason


FAKE_SMI = {
    "one": "#!/bin/sh\necho '0, GPU-aaaa, 80000'\n",
    "none": "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n",
}
FAKE_MPS = {
    "works": ('#!/bin/sh\nif [ "$1" = -d ]; then echo start >>"$MPS_CALLS"; '
              ': >"$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi\n'
              'read cmd; echo "$cmd" >>"$MPS_CALLS"; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"\n'),
    "fails": "#!/bin/sh\necho 'cannot find a GPU for MPS' >&2\nexit 1\n",
}
RANK = "import os; print('MPS', os.environ.get('CUDA_MPS_PIPE_DIRECTORY'))"


def launch(tmp_path, args, smi="one", mps_control="works"):
    """`emulate ARGS -- python -c RANK` with the stand-ins on PATH: (status, stdout, stderr,
    the daemon's calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nvidia-smi", FAKE_SMI[smi]), ("nvidia-cuda-mps-control", FAKE_MPS[mps_control])):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "mps_calls"
    calls.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", MPS_CALLS=str(calls))
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", *args, "--", sys.executable, "-c", RANK],
                       capture_output=True, text=True, timeout=120, env=env)
    return p.returncode, p.stdout, p.stderr, calls.read_text().split() if calls.exists() else []


def rank_mps(out):
    return sorted(line.split("MPS ", 1)[1] for line in out.splitlines() if "]: MPS " in line)


def test_shared_gpu_runs_under_mps_by_default(tmp_path):
    rc, out, err, calls = launch(tmp_path, ["-n", "2"])
    assert err.splitlines()[0] == ("tpcheck emulate: 2 ranks under a private MPS daemon (up to 2 "
                                   "ranks share a GPU; --no-mps to opt out)"), err
    pipes = rank_mps(out)
    assert len(pipes) == 2 and pipes[0] == pipes[1] and "tpcheck-mps-" in pipes[0], out
    assert calls == ["start", "quit"] and not os.path.exists(pipes[0]), (calls, pipes)
    assert rc == 1 and "never initialized the process group" in err  # the ranks ran


def test_no_mps_and_cpu_ranks_run_without_it(tmp_path):
    rc, out, err, calls = launch(tmp_path, ["-n", "2", "--no-mps"])
    assert err.splitlines()[0] == "tpcheck emulate: 2 ranks without MPS (--no-mps)", err
    assert rank_mps(out) == ["None", "None"] and calls == []
    # CPU ranks (nvidia-smi answers nothing): no GPU is shared, MPS is not started even
    # though nvidia-cuda-mps-control is on PATH.
    rc, out, err, calls = launch(tmp_path, ["-n", "3"], smi="none")
    assert err.splitlines()[0] == "tpcheck emulate: 3 ranks without MPS (no GPU visible to nvidia-smi)", err
    assert rank_mps(out) == ["None"] * 3 and calls == []


def test_a_daemon_that_does_not_start(tmp_path):
    # By default: a one-line note, and the launch runs without MPS.
    rc, out, err, _ = launch(tmp_path, ["-n", "2"], mps_control="fails")
    assert err.splitlines()[0] == (
        "tpcheck emulate: 2 ranks without MPS: the MPS control daemon did not start (status 1): "
        "cannot find a GPU for MPS; ranks that share a GPU take turns on it (--no-mps skips MPS)"), err
    assert rank_mps(out) == ["None", "None"] and rc == 1
    # Asked for with --mps: an error before any rank starts.
    rc, out, err, _ = launch(tmp_path, ["-n", "2", "--mps"], mps_control="fails")
    assert rc == 2 and out == "", out
    assert "--mps: the MPS control daemon did not start (status 1): cannot find a GPU for MPS" in err

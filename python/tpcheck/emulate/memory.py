"""Whether N ranks fit before any starts: host memory (MemAvailable) and, where nvidia-smi
answers, GPU memory for one CUDA context per rank on the GPU it maps to (rank r → GPU
r mod G). The figures are estimates of the least a rank needs, so only launches that
cannot fit at all are refused; docs/EMULATE.md says how they were measured.

Also the GPUs a launch sees (visible_gpus), which the MPS decision (mps.py) reads: through
nvidia-smi, never torch.cuda (the launcher must not create a CUDA context).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Optional

# Host memory of one rank before the program does anything: RssAnon of a Python process
# that imported torch and torch.distributed (torch 2.11, x86-64, no GPU). The RssFile part,
# torch's shared libraries, is counted once for all ranks. A rank with a CUDA context holds
# more. TPCHECK_EMULATE_RANK_MEMORY replaces the per-rank figure (0 turns the check off).
RANK_HOST_BYTES = 269 << 20
SHARED_HOST_BYTES = 212 << 20
# GPU memory of one rank's CUDA context (nvidia-smi's memory.used per process holding
# torch.zeros(1, device="cuda"), torch 2.11 on an H200); GPUs, drivers and
# CUDA_MODULE_LOADING change it. TPCHECK_EMULATE_RANK_GPU_MEMORY replaces it (0 turns the
# GPU check off, e.g. for a program that uses no CUDA on a machine with GPUs).
RANK_CUDA_BYTES = 618 << 20

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def bytes_from_env(name: str, default: int) -> int:
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


def mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _smi_gpus() -> Optional[list[tuple[str, str, int]]]:
    """(index, uuid, free MiB) of every GPU nvidia-smi lists; None without an answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        p = subprocess.run([smi, "--query-gpu=index,uuid,memory.free",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    gpus = []
    for line in p.stdout.splitlines():
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            gpus.append((fields[0], fields[1], int(float(fields[2]))))
        except ValueError:
            continue  # "[N/A]" and the like: nothing to check against
    return gpus or None


def visible_gpus() -> Optional[list[tuple[str, int]]]:
    """(GPU name for messages, free bytes) of the GPUs this launch's ranks can use, in CUDA's
    order. None when there is no nvidia-smi, it fails, or CUDA_VISIBLE_DEVICES names devices
    it cannot be matched with (MIG instances); [] when CUDA_VISIBLE_DEVICES hides them all."""
    gpus = _smi_gpus()
    if gpus is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen = gpus
    else:
        chosen = []
        for tok in (t.strip() for t in visible.split(",")):
            # CUDA stops at the first entry that names no device; so do we.
            match = [g for g in gpus
                     if tok and (tok == g[0] or (tok.startswith("GPU-") and g[1].startswith(tok)))]
            if not match:
                if tok.startswith("MIG-"):
                    return None
                break
            chosen.append(match[0])
    return [(f"GPU {i} ({u})", free << 20) for i, u, free in chosen]


def ranks_on_gpu(n: int, gpus: int, j: int) -> int:
    """How many of n ranks run on GPU j of `gpus` (rank r on GPU r mod gpus)."""
    return n // gpus + (1 if j < n % gpus else 0)


def _host_message(n: int) -> Optional[str]:
    per_rank = bytes_from_env("TPCHECK_EMULATE_RANK_MEMORY", RANK_HOST_BYTES)
    avail = mem_available()
    if per_rank <= 0 or avail is None:
        return None
    # The launcher imports torch too (it hosts the store), so it counts as one more.
    need = (n + 1) * per_rank + SHARED_HOST_BYTES
    if need <= avail:
        return None
    return (f"-n {n}: each rank needs about {gib(per_rank)} of host memory (a Python "
            f"process with torch imported; TPCHECK_EMULATE_RANK_MEMORY sets it); {n} "
            f"rank{'s' if n > 1 else ''} need {gib(need)} (with the launcher and "
            f"{gib(SHARED_HOST_BYTES)} of torch's libraries, shared), the machine has "
            f"{gib(avail)} available (MemAvailable)")


def _gpu_message(n: int, gpus: Optional[list[tuple[str, int]]]) -> Optional[str]:
    per_gpu_rank = bytes_from_env("TPCHECK_EMULATE_RANK_GPU_MEMORY", RANK_CUDA_BYTES)
    if per_gpu_rank <= 0 or not gpus:
        return None
    g = len(gpus)
    for j, (name, free) in enumerate(gpus):
        ranks = ranks_on_gpu(n, g, j)
        if ranks * per_gpu_rank > free:
            return (f"-n {n}: each rank that uses CUDA needs about {gib(per_gpu_rank)} of GPU "
                    f"memory for its CUDA context (an estimate; "
                    f"TPCHECK_EMULATE_RANK_GPU_MEMORY sets it, 0 for a program that uses no "
                    f"CUDA); rank r runs on GPU r mod {g}, so {name} would hold {ranks} "
                    f"rank{'s' if ranks > 1 else ''}: {gib(ranks * per_gpu_rank)}, it has "
                    f"{gib(free)} free (nvidia-smi memory.free)")
    return None


def check_memory(n: int, gpus: Optional[list[tuple[str, int]]]) -> Optional[str]:
    """Why n ranks cannot fit (the message), or None. `gpus`: visible_gpus(). ValueError for
    a per-rank figure in the environment that is not a size."""
    return _host_message(n) or _gpu_message(n, gpus)

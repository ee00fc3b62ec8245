"""Exchange of CPU tensors between the rank processes through shared memory (/dev/shm).

Every rank of a group owns two segment files (double buffering: collective number s uses
segment s % 2) and writes its contribution to a collective there; the collective's
metadata, published through the process group's store, names the file, its size and the
offset of every tensor, and every other rank maps the file read-only and reads it in place.
Why two segments suffice: a rank writes segment s % 2 at collective s only after every
rank published collective s - 1, which each did after it finished reading collective s - 2.
Point-to-point messages do not use the segments (see _backend.py).
"""

from __future__ import annotations

import mmap
import os

import torch

_ALIGN = 64


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class ShmExchange:
    def __init__(self, tag: str):
        job = os.environ.get("TPCHECK_EMULATE_JOB", "nojob")
        base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
        self._paths = [f"{base}/tpcheck-{job}-{os.getpid()}-{tag}-{i}" for i in range(2)]
        self._own = [None, None]  # (mmap, size, its bytes as a tensor)
        self._peers: dict[str, tuple[mmap.mmap, int, torch.Tensor]] = {}

    def close(self) -> None:
        for p in self._paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def _own_buffer(self, which: int, need: int) -> tuple[mmap.mmap, int]:
        cur = self._own[which]
        if cur is not None and cur[1] >= need:
            return cur
        size = max(1 << 16, 1 << (max(need, 1) - 1).bit_length())
        fd = os.open(self._paths[which], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._own[which] = (mm, size, torch.frombuffer(mm, dtype=torch.uint8))
        return self._own[which]

    def put(self, seq: int, tensors: list[torch.Tensor]) -> dict:
        """Writes the tensors (CPU) into this rank's segment for collective `seq`; returns
        the location metadata peers need."""
        offs, off = [], 0
        for t in tensors:
            offs.append(off)
            off = _round_up(off + t.numel() * t.element_size(), _ALIGN)
        which = seq % 2
        if off == 0:
            return {"path": self._paths[which], "size": 0, "offs": offs}
        _, size, base = self._own_buffer(which, off)
        for t, o in zip(tensors, offs):
            n = t.numel()
            if n == 0:
                continue
            base[o:o + n * t.itemsize].view(t.dtype).copy_(t.reshape(-1))
        return {"path": self._paths[which], "size": size, "offs": offs}

    def inputs(self, recs: list[dict], index: int, dtype: torch.dtype, numel: int,
               op: str) -> list:
        """Every rank's tensor `index` of this collective, flat (the CUDA exchange's
        counterpart gives the kernel addresses)."""
        return [self.view(rec["loc"], index, dtype, numel) for rec in recs]

    def view(self, loc: dict, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Tensor `index` of a peer's (or this rank's) segment, flat, in place."""
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        path, size = loc["path"], loc["size"]
        for which in range(2):
            if self._paths[which] == path:
                base = self._own[which][2]
                break
        else:
            cur = self._peers.get(path)
            if cur is None or cur[1] < size:
                fd = os.open(path, os.O_RDONLY)
                try:
                    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
                finally:
                    os.close(fd)
                self._peers[path] = (mm, size, _bytes_ro(mm))
            base = self._peers[path][2]
        off = loc["offs"][index]
        return base[off:off + numel * dtype.itemsize].view(dtype)


def _bytes_ro(mm) -> torch.Tensor:
    """The whole mapping as a uint8 tensor, made once per mapping (views are slices of it).
    Read-only memory: torch warns about non-writable buffers; the views are only read."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(mm, dtype=torch.uint8)

"""ShmExchange: CPU tensors of a group's ranks through shared memory (/dev/shm).

Every rank of a group owns two segment files (double buffering: call s uses segment s % 2)
and copies its contribution to a collective there; its record names the file, its size and
the offset of every tensor, and every other rank maps the file read-only and reads it in
place. Why two segments suffice: a rank writes segment s % 2 at call s only after every
rank published call s - 1, which each did after it finished reading call s - 2.
"""

from __future__ import annotations

import mmap
import os
import warnings

import torch

from . import protocol
from .exchange import Exchange, Intent, Step
from .reduce import cpu_fold

_ALIGN = 64


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _bytes_ro(mm) -> torch.Tensor:
    """The whole mapping as a uint8 tensor, made once per mapping (views are slices of it).
    Read-only memory: torch warns about non-writable buffers; the views are only read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(mm, dtype=torch.uint8)


class ShmExchange(Exchange):
    def __init__(self, group_tag: str, rank: int, size: int, order: str):
        super().__init__(rank, size, order)
        self._paths = [protocol.group_file(group_tag, str(i)) for i in range(2)]
        self._own: list = [None, None]  # (mmap, size, its bytes as a tensor)
        self._peers: dict[str, tuple[mmap.mmap, int, torch.Tensor]] = {}

    def _own_buffer(self, which: int, need: int):
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

    def put(self, seq: int, tensors: list, intent: Intent) -> dict:
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
            if n:
                base[o:o + n * t.itemsize].view(t.dtype).copy_(t.reshape(-1))
        return {"path": self._paths[which], "size": size, "offs": offs}

    def _mapping(self, path: str, size: int) -> torch.Tensor:
        for which in range(2):
            if self._paths[which] == path:
                return self._own[which][2]
        cur = self._peers.get(path)
        if cur is None or cur[1] < size:
            fd = os.open(path, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
            cur = self._peers[path] = (mm, size, _bytes_ro(mm))
        return cur[2]

    def view(self, loc: dict, index: int, dtype, numel: int) -> torch.Tensor:
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        off = loc["offs"][index]
        return self._mapping(loc["path"], loc["size"])[off:off + numel * dtype.itemsize].view(dtype)

    def inputs(self, step: Step, index: int, dtype, count: int, op: str) -> list:
        return [self.view(rec["loc"], index, dtype, count) for rec in step.recs]

    def fold(self, out, inputs: list, count: int, kind: str, op: str, root: int) -> None:
        cpu_fold(out, inputs, kind, op, self.order, self.rank, root)

    def close(self, exit_barrier) -> None:
        """Under the launcher its files go with the job's. Otherwise this rank removes them
        once every rank of the group has reached exit_barrier(): a peer may still have to
        map one to read this rank's last contribution."""
        if protocol.in_launch():
            return
        exit_barrier()
        for p in self._paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

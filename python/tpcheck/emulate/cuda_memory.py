"""The CUDA memory behind CudaExchange (cuda_ipc.py): this rank's staging buffers and its
mappings of the peers' allocations.

Staging buffers are tpcheck's own CUDA IPC allocations (_tpcheck.ipc_alloc: cudaMalloc and
cudaIpcGetMemHandle; src/python/cuda_ipc.cpp), viewed as torch uint8 tensors that do not
own them (_tpcheck.cuda_bytes). A buffer's "share" is [device, IPC handle (base64), bytes];
a peer maps it once (_tpcheck.ipc_open, cached by handle). Not torch's storage sharing
(_share_cuda_ / _new_shared_cuda): that puts a cross-process reference count on each shared
storage, which N - 1 readers of a buffer that lives as long as the process never bring back
to zero, and torch then warns at every exit ("Producer process has been terminated before
all shared CUDA tensors released"). Lifetimes here are explicit: a buffer that grows keeps
its old allocation until exit; at exit every rank unmaps its peers' memory
(PeerMemory.release), all ranks meet at the exit barrier, then each frees its own
(StagingBuffers.free).
"""

from __future__ import annotations

import base64

import torch

from .. import _tpcheck
from .protocol import EmulateError


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def unb64(s: str) -> bytes:
    return base64.b64decode(s)


def _first_error(calls) -> None:
    """Runs every call; raises the first RuntimeError once all have run."""
    first = None
    for call in calls:
        try:
            call()
        except RuntimeError as e:
            first = first or e
    if first is not None:
        raise first


class StagingBuffers:
    """This rank's two staging buffers on GPU `dev` (call s uses s % 2), grown by doubling."""

    def __init__(self, dev: torch.device):
        self._dev = dev
        self.bufs: list = [None, None]    # views of the allocations
        self.shares: list = [None, None]  # [device, handle, bytes] for the records
        self._allocs: list = [None, None]  # their addresses
        # Allocations a grown buffer replaced, freed at exit only: peers keep them mapped
        # (cached by handle) and may still have reads of an earlier call from them queued on
        # their own streams, which nothing here waits for (the done events order this
        # process's stream only). Sizes double, so the kept ones are smaller than the new one.
        self._superseded: list[int] = []

    def get(self, which: int, need: int) -> torch.Tensor:
        """Buffer `which`, at least `need` bytes."""
        cur = self.bufs[which]
        if cur is not None and cur.numel() >= need:
            return cur
        size = max(1 << 20, 1 << (max(need, 1) - 1).bit_length())
        dev = self._dev.index
        try:
            addr, handle = _tpcheck.ipc_alloc(size, dev)
        except RuntimeError as e:
            if "cudaIpcGetMemHandle" in str(e):
                raise EmulateError(f"CUDA IPC is not available for {self._dev} (ranks that "
                                   f"share a GPU exchange CUDA tensors through it): {e}") from e
            raise EmulateError(f"cannot allocate a CUDA staging buffer of {size} bytes on "
                               f"{self._dev} for the collective's tensors: {e}") from e
        if self._allocs[which] is not None:
            self._superseded.append(self._allocs[which])
        self._allocs[which] = addr
        self.bufs[which] = _tpcheck.cuda_bytes(addr, size, dev)
        self.shares[which] = [dev, b64(handle), size]
        return self.bufs[which]

    def which_is(self, handle: str):
        """0 or 1 when `handle` is one of this rank's current buffers, else None."""
        for which in range(2):
            if self.shares[which] is not None and self.shares[which][1] == handle:
                return which
        return None

    def address(self, which: int) -> int:
        return self._allocs[which]

    def free(self) -> None:
        """At exit, after every peer unmapped them: the current and the superseded buffers."""
        self.bufs, self.shares = [None, None], [None, None]
        addrs = [a for a in self._allocs if a is not None] + self._superseded
        self._allocs, self._superseded = [None, None], []
        dev = self._dev.index
        _first_error([lambda a=a: _tpcheck.ipc_free(a, dev) for a in addrs])


class PeerMemory:
    """The peers' allocations mapped into this process (staging buffers, and under zero copy
    the allocations that hold lent tensors), each once: an IPC handle opens once per process.
    Mappings stay until exit: a peer's tensors come from its caching allocator, whose few
    large allocations are reused."""

    def __init__(self):
        self._maps: dict[str, tuple[int, int]] = {}  # handle -> (address, device)
        self._bufs: dict[str, torch.Tensor] = {}     # handle -> the whole allocation, uint8

    def map(self, h: str, dev: int, nbytes: int) -> int:
        got = self._maps.get(h)
        if got is None:
            try:
                addr = _tpcheck.ipc_open(unb64(h), dev)
            except RuntimeError as e:
                raise EmulateError(f"cannot map a peer rank's CUDA memory (a tensor of {nbytes} "
                                   f"bytes on cuda:{dev}) through CUDA IPC: {e}") from e
            got = self._maps[h] = (addr, dev)
        return got[0]

    def buffer(self, share: list) -> torch.Tensor:
        """A peer's allocation, whole, as a uint8 tensor made once: views of it are slices."""
        dev, h, size = share
        t = self._bufs.get(h)
        if t is None:
            t = self._bufs[h] = _tpcheck.cuda_bytes(self.map(h, dev, size), size, dev)
        return t

    def release(self, own_device: int) -> None:
        """At exit, before the exit barrier: waits for this process's GPU work (on its own GPU
        and on the peers' GPUs it read from), then unmaps everything. Every mapping is tried;
        the first failure is raised after the others are closed."""
        for d in {own_device, *(d for _, d in self._maps.values())}:
            torch.cuda.synchronize(d)
        self._bufs.clear()  # no view may outlive its mapping
        maps, self._maps = self._maps, {}
        _first_error([lambda a=a, d=d: _tpcheck.ipc_close(a, d) for a, d in maps.values()])

"""compare_tp's view of the process group: its size, this rank, the judging rank (group
rank 0), the few collectives compare_tp makes, and errors that every rank raises.

Errors stay collective: every check a rank makes on its own is followed by an exchange of
"ok or which error" (`agree`) before the next collective, so bad input raises the same
error on every rank instead of leaving the others waiting in a collective.

Tensors travel packed: the bytes of many tensors (any dtypes) in one buffer, one
collective for all of them (`all_gather_packed`, `packed_from`). At TP 8 on one GPU a
collective costs a fixed ~0.5 ms whatever its size, and a model has dozens of parameters:
one collective per tensor made compare_tp's gathers cost more than the module's own run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from .._errors import InputError, RunError

__all__ = ["Group", "Layout", "portable"]

Portable = tuple[str, str, str]

# Offsets of packed tensors are multiples of this: a byte slice viewed as float64 or
# complex128 must start on its element size.
_ALIGN = 16
# packed_from moves at most this many bytes per broadcast: the ranks that only pass the
# bytes on hold one such chunk, not the whole payload.
_CHUNK = 1 << 26


@dataclass(frozen=True)
class Layout:
    """Where each of several tensors lies in one byte buffer: (shape, dtype, offset)."""

    entries: tuple[tuple[tuple[int, ...], torch.dtype, int], ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> "Layout":
        entries, at = [], 0
        for t in tensors:
            entries.append((tuple(t.shape), t.dtype, at))
            at += -(-t.numel() * t.dtype.itemsize // _ALIGN) * _ALIGN
        return cls(tuple(entries), at)

    def pack(self, tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        buf = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        for t, (_, _, at) in zip(tensors, self.entries):
            data = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buf[at:at + data.numel()].copy_(data)
        return buf

    def unpack(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """The tensors, as views of `buf`."""
        out = []
        for shape, dtype, at in self.entries:
            n = torch.Size(shape).numel() * dtype.itemsize
            out.append(buf[at:at + n].view(dtype).reshape(shape))
        return out


def portable(e: Optional[BaseException]) -> Optional[Portable]:
    """An exception as plain strings (its class may not pickle): (module, class, message)."""
    return None if e is None else (type(e).__module__, type(e).__qualname__, str(e))


def _rebuilt(p: Portable, rank: int, size: int) -> BaseException:
    """Rank `rank`'s exception, raised again on a rank that did not see it: the same class
    (InputError, TruthRunError, ...) and message, naming the rank where it was found."""
    module, name, message = p
    message = f"{message} (found on rank {rank} of {size})"
    try:
        cls: Any = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(message)
    except Exception:  # noqa: BLE001 - a class that cannot be found or built from a message
        pass
    return RunError(f"{name}: {message}")


class Group:
    """The process group compare_tp runs over. Without torch.distributed initialized: one
    rank and no collectives (compare_tp in a single process)."""

    def __init__(self, group: Any):
        if not (dist.is_available() and dist.is_initialized()):
            if group is not None:
                raise InputError("compare_tp: group= was given but torch.distributed is not "
                                 "initialized; expected an initialized process group, or no "
                                 "group for a single process")
            self.group, self.size, self.rank, self.root = None, 1, 0, 0
            return
        self.group = group if group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        # broadcast / gather_object name the source by its global rank
        self.root = dist.get_global_rank(self.group, 0)

    @property
    def judging(self) -> bool:
        return self.rank == 0

    def all_objects(self, obj: Any) -> list:
        if self.size == 1:
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def objects_to_root(self, obj: Any) -> Optional[list]:
        """Every rank's `obj` on the judging rank (None elsewhere)."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size if self.judging else None
        dist.gather_object(obj, out, dst=self.root, group=self.group)
        return out

    def object_from_root(self, obj: Any) -> Any:
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.root, group=self.group)
        return box[0]

    def global_rank(self, rank: int) -> int:
        """The global rank of group rank `rank` (collectives name their source by it)."""
        return dist.get_global_rank(self.group, rank) if self.size > 1 else rank

    def tensors_from_root(self, tensors: Sequence[torch.Tensor],
                          device: torch.device) -> list[torch.Tensor]:
        """The judging rank's copies of `tensors` (the same shapes and dtypes on every rank),
        in one broadcast."""
        if self.size == 1 or not tensors:
            return list(tensors)
        layout = Layout.of(tensors)
        got = self.packed_from(0, layout, tensors if self.judging else None, device, everyone=True)
        return list(tensors) if self.judging else layout.unpack(got)

    def packed_from(self, rank: int, layout: Layout, tensors: Optional[Sequence[torch.Tensor]],
                    device: torch.device, everyone: bool = False) -> Optional[torch.Tensor]:
        """Rank `rank`'s tensors (`tensors` there, laid out by `layout`, which every rank
        passes) as one byte buffer on the judging rank (on every rank with everyone=True;
        None on the others), broadcast in chunks of at most _CHUNK bytes."""
        mine = self.rank == rank
        keep = everyone or self.judging
        buf = layout.pack(tensors, device) if mine else (
            torch.empty(layout.nbytes, dtype=torch.uint8, device=device) if keep else None)
        scratch = None
        for at in range(0, layout.nbytes, _CHUNK):
            n = min(_CHUNK, layout.nbytes - at)
            if buf is not None:
                piece = buf[at:at + n]
            else:
                if scratch is None or scratch.numel() < n:
                    scratch = torch.empty(n, dtype=torch.uint8, device=device)
                piece = scratch[:n]
            dist.broadcast(piece, src=self.global_rank(rank), group=self.group)
        return buf if keep else None

    def all_gather_packed(self, tensors: Sequence[torch.Tensor],
                          device: torch.device) -> list[list[torch.Tensor]]:
        """Every rank's `tensors` (the same shapes and dtypes on every rank), in one
        all-gather: [rank][i]."""
        layout = Layout.of(tensors)
        mine = layout.pack(tensors, device)
        if self.size == 1 or not layout.nbytes:
            return [layout.unpack(mine)] * self.size
        out = torch.empty(self.size * layout.nbytes, dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(out, mine, group=self.group)
        return [layout.unpack(piece) for piece in out.chunk(self.size)]

    def raise_first(self, own: Optional[BaseException], errors: list) -> None:
        """Raises this rank's own error, else the first rank's that failed (if any did)."""
        if own is not None:
            raise own
        for r, e in enumerate(errors):
            if e is not None:
                raise _rebuilt(e, r, self.size)

    def agree(self, own: Optional[BaseException], value: Any = None) -> list:
        """Every rank learns whether any rank failed so far; if one did, all raise. Called
        after each step whose checks a rank makes on its own, before the next collective.
        Returns every rank's `value`."""
        exchanged = self.all_objects((portable(own), value))
        self.raise_first(own, [e for e, _ in exchanged])
        return [v for _, v in exchanged]

"""compare_tp's view of the process group: its size, this rank, the judging rank (group
rank 0), the few collectives compare_tp makes, and errors that every rank raises.

Errors stay collective: every check a rank makes on its own is followed by an exchange of
"ok or which error" (`agree`) before the next collective, so bad input raises the same
error on every rank instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch
import torch.distributed as dist

from .._errors import InputError, RunError

__all__ = ["Group", "portable"]

Portable = tuple[str, str, str]


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

    def tensor_from_root(self, t: torch.Tensor) -> torch.Tensor:
        """The judging rank's copy of `t` (same shape and dtype on every rank)."""
        t = t.detach().contiguous()
        if self.size == 1 or self.judging:
            if self.size > 1:
                dist.broadcast(t, src=self.root, group=self.group)
            return t
        buf = torch.empty_like(t)
        dist.broadcast(buf, src=self.root, group=self.group)
        return buf

    def raise_first(self, own: Optional[BaseException], errors: list) -> None:
        """Raises this rank's own error, else the first rank's that failed (if any did)."""
        if own is not None:
            raise own
        for r, e in enumerate(errors):
            if e is not None:
                raise _rebuilt(e, r, self.size)

    def agree(self, own: Optional[BaseException]) -> None:
        """Every rank learns whether any rank failed so far; if one did, all raise. Called
        after each step whose checks a rank makes on its own, before the next collective."""
        self.raise_first(own, self.all_objects(portable(own)))

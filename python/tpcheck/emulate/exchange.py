"""The Exchange interface: how the ranks of one group read each other's tensors.

Every collective of the engine (engine.py) is one step on every rank:

    loc = ex.put(seq, tensors, intent)     1. make this rank's contribution readable by the
                                              peers; `loc` (plain dict) says where
    ... the engine publishes loc in this rank's record and reads every rank's (records.py)
    ex.note_peers(recs)                    2. learn what the peers' first records carry
    ex.view(loc, i, dtype, n)              3. read tensor i of a rank's contribution, or
    ex.reduce(step, outs, counts, ...)        compute this rank's result of a reduction
    ex.finish(step)                        4. this rank is done with the peers' data (and
                                              they with its own, where it lent them)
    ex.close(exit_barrier)                 at exit: release what the exchange holds

Two implementations, picked by the tensors' device: ShmExchange (shm.py, CPU tensors in
shared memory) and CudaExchange (cuda_ipc.py, CUDA tensors through CUDA IPC, with its
in-place, split and zero-copy all-reduce). The engine never asks which one it has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional

from .checks import flat_output


@dataclass(frozen=True)
class Intent:
    """What a collective will do with the contributions (an exchange may stage them
    differently: scaled for AVG, with room for shares of a split all-reduce, or lent)."""

    op: Optional[str] = None  # the reduction's op ("sum", "avg", ...); None: data movement
    all_reduce: bool = False  # an all-reduce (which may run in place or split)


@dataclass
class Step:
    """One collective as the exchange sees it once every rank's record is in."""

    seq: int                                # the call number within the group
    recs: list                              # every rank's record ({"loc": ..., ...})
    second_round: Callable[[int], None]     # waits until every rank set flag k (records.py)

    def loc(self, r: int) -> dict:
        return self.recs[r]["loc"]


class Exchange(ABC):
    """One group's exchange for one kind of device; see the module's docstring for the
    order of the calls. rank, size, order: this rank, the group's size, its order of
    additions (protocol.NCCL_RING or RANK_ORDER)."""

    def __init__(self, rank: int, size: int, order: str):
        self.rank, self.size, self.order = rank, size, order

    @abstractmethod
    def put(self, seq: int, tensors: list, intent: Intent) -> dict:
        """Makes the tensors of call `seq` readable by the peers; returns their location (a
        dict of built-in types: it travels in the record)."""

    def note_peers(self, recs: list) -> None:
        """Called with every rank's record before anything is read."""

    @abstractmethod
    def view(self, loc: dict, index: int, dtype, numel: int):
        """Tensor `index` of the contribution at `loc`, flat, `numel` elements of `dtype`."""

    @abstractmethod
    def inputs(self, step: Step, index: int, dtype, count: int, op: str) -> list:
        """Every rank's tensor `index` of this call, in the form fold() takes."""

    @abstractmethod
    def fold(self, out, inputs: list, count: int, kind: str, op: str, root: int) -> None:
        """out (flat) = this rank's result of `kind` ("all_reduce", "reduce",
        "reduce_scatter") over inputs() of `count` elements each."""

    def output(self, t, kind: str, step: Step):
        """Where this rank's result of t is written, and the finisher that puts it in t."""
        return flat_output(t)

    def reduce(self, step: Step, outs: list, counts: list, kind: str, op: str, root: int) -> None:
        """outs[i] = this rank's result of `kind` over every rank's tensor i (counts[i]
        elements); for "reduce" only the root has a result."""
        for i, (t, count) in enumerate(zip(outs, counts)):
            if (kind == "reduce" and self.rank != root) or t.numel() == 0:
                continue
            ins = self.inputs(step, i, t.dtype, count, op)
            out, fin = self.output(t, kind, step)
            self.fold(out, ins, count, kind, op, root)
            fin()

    def finish(self, step: Step) -> None:
        """This rank has read what it needs of call step.seq."""

    @abstractmethod
    def close(self, exit_barrier: Callable[[], None]) -> None:
        """At exit. exit_barrier() returns once every rank of the group reached it."""

"""The collective engine of one process group: every collective is one step on every rank.

    step = engine.step(kind, sig, tensors, intent)
        1. the exchange for the tensors' device makes this rank's contribution readable by
           the others (exchange.py: ShmExchange for CPU tensors, CudaExchange for CUDA);
        2. this rank's record (call number, kind, signature, the contribution's location,
           call site) is published and every rank's record of the same call is read
           (records.py), watching the launcher's events meanwhile (watch.py);
        3. the records are compared: ranks that called different collectives or sizes at
           the same call all raise an error naming both calls; --trace writes the call.
    ... the collective computes this rank's output from step.exchange (collectives.py) ...
    engine.finish(step)
        4. this rank is done with the peers' data of the call.

At exit the engine closes its exchanges (CUDA: unmap the peers' memory, meet every rank at
an exit barrier through the store, free its own; CPU outside the launcher: meet at the
barrier, remove its files).
"""

from __future__ import annotations

import atexit
import datetime
import itertools
from dataclasses import dataclass

import torch

from .checks import call_site, format_call
from .cuda_ipc import CudaExchange
from .exchange import Exchange, Intent, Step
from .ledger import CommTrace
from .protocol import EmulateError, comm_order
from .records import FLAG_REDUCED, Records
from .shm import ShmExchange
from .watch import Watch

_group_numbers = itertools.count(1)  # names this process's groups' files
EXIT_TIMEOUT = datetime.timedelta(seconds=10)


@dataclass
class Call(Step):
    """A step as the collectives see it: the exchange holding the data, and the call named."""

    exchange: Exchange = None
    desc: str = ""

    def view(self, r: int, index: int, dtype, numel: int) -> torch.Tensor:
        """Tensor `index` of rank r's contribution, flat."""
        return self.exchange.view(self.recs[r]["loc"], index, dtype, numel)


class CollectiveEngine:
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: list[int]):
        self.store, self.rank, self.size = store, rank, size
        self.global_ranks = global_ranks
        self.order = comm_order()
        self.tag = f"g{next(_group_numbers)}"
        self.watch = Watch(store, global_ranks, rank, timeout)
        self.records = Records(store, rank, size, self.tag, self.watch)
        self._exchanges: dict[str, Exchange] = {}
        self._trace = CommTrace.open_for(global_ranks[rank])
        self._seq = 0
        atexit.register(self.records.close)

    def who(self, r: int) -> str:
        return self.watch.who(r)

    def exchange(self, dev) -> Exchange:
        """This group's exchange for tensors on `dev` (None: no tensor, the CPU's)."""
        kind = "cpu" if dev is None else dev.type
        ex = self._exchanges.get(kind)
        if ex is None:
            if kind == "cpu":
                ex = ShmExchange(self.tag, self.rank, self.size, self.order)
            elif kind == "cuda":
                ex = CudaExchange(dev, self.rank, self.size, self.order)
            else:
                raise EmulateError(f"tensors on {dev} are not supported (cpu or cuda)")
            self._exchanges[kind] = ex
            # Closed at exit before whatever registered its exit handler earlier (as torch's
            # CUDA state may have, when this is a CUDA exchange).
            atexit.register(self._close, ex)
        return ex

    def step(self, kind: str, sig: dict, contrib: list, intent: Intent = Intent(),
             extra=None, device=None) -> Call:
        """Steps 1-3 of a collective (the module's docstring). `device`: the tensors' device
        when this rank contributes none (a broadcast's receivers); `extra`: data every rank
        sees in the others' records (all_to_all's splits)."""
        seq = self._seq
        self._seq += 1
        dev = contrib[-1].device if contrib else device
        if kind != "barrier":
            sig = dict(sig, device=dev.type if dev is not None else "cpu")
        ex = self.exchange(dev)
        desc = format_call(kind, sig)
        rec = {"seq": seq, "kind": kind, "sig": sig, "desc": desc,
               "loc": ex.put(seq, contrib, intent), "extra": extra, "at": call_site()}
        recs = self.records.exchange(seq, rec, f"{desc} (call #{seq} of the group, at {rec['at']})")
        ex.note_peers(recs)
        self._check_match(seq, rec, recs)
        if self._trace is not None:
            self._trace.write(seq, self.global_ranks, kind, sig,
                              sum(t.numel() * t.element_size() for t in contrib), self.order,
                              rec["at"])
        return Call(seq, recs, lambda flag: self._second_round(flag, seq, desc), ex, desc)

    def _check_match(self, seq: int, rec: dict, recs: list) -> None:
        for r, other in enumerate(recs):
            if other["kind"] != rec["kind"] or other["sig"] != rec["sig"]:
                raise EmulateError(
                    f"mismatched collectives at call #{seq} of group {self.global_ranks}: "
                    f"{self.who(self.rank)} called {rec['desc']} at {rec['at']}, but "
                    f"{self.who(r)} called {other['desc']} at {other['at']}")

    def _second_round(self, flag: int, seq: int, desc: str) -> None:
        what = desc if flag == FLAG_REDUCED else f"the end of {desc}"
        self.records.second_round(flag, seq, what)

    def finish(self, call: Call) -> None:
        call.exchange.finish(call)

    def _exit_barrier(self) -> None:
        self.store.set(f"tpcheck/exit/{self.rank}", "1")
        keys = [f"tpcheck/exit/{r}" for r in range(self.size)]
        self.watch.wait_keys(keys, "exit (the peers may still read this rank's buffers)",
                             EXIT_TIMEOUT)

    def _close(self, ex: Exchange) -> None:
        """At exit. A peer that died or a store that is gone must not keep this process from
        exiting: every failure here is ignored."""
        try:
            ex.close(self._exit_barrier)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass

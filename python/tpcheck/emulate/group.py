"""TpcheckProcessGroup: the `tpcheck` torch.distributed backend, a Python ProcessGroup, one
process per rank. A thin adapter: it maps c10d's calls (their argument lists and options)
onto the collectives of collectives.py over this group's engine (engine.py) and
point-to-point messages (p2p.py), and returns completed Work objects (work.py).
`create` is the creator that tpcheck.emulate.register_backend() registers.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from . import collectives as C
from .checks import reduce_op
from .engine import CollectiveEngine
from .p2p import PointToPoint
from .protocol import EmulateError, mark_initialized
from .work import LazyWork, completed

# The device types the backend is registered for (register_backend()): it serves both itself.
DEVICE_TYPES = ("cpu", "cuda")


def _root(opts) -> int:
    return getattr(opts, "rootRank", 0)


class TpcheckProcessGroup(dist.ProcessGroup):
    """Rank `rank` of a group of `size` processes; global_ranks: the group's ranks in the
    default group (for messages and the trace)."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: list[int] | None = None, group_id: str = ""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._global = list(global_ranks) if global_ranks else list(range(size))
        self._engine = CollectiveEngine(store, rank, size, timeout, self._global)
        self._p2p = PointToPoint(self._engine)
        self._gid = group_id or self._engine.tag
        self._coalesced: list | None = None  # receives since _start_coalescing, else None

    # ---- identity ------------------------------------------------------------------------
    def size(self):
        return self._size

    def getBackendName(self):
        return "tpcheck"

    # c10d names a group after creating it; a Python group keeps the name itself (the C++
    # ProcessGroup keeps it in its backends, which a Python group has none of).
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", self._gid)

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return f"TpcheckProcessGroup(rank {self._rank} of {self._size}, ranks {self._global})"

    # ---- backend per device type -----------------------------------------------------------
    # c10d keeps a Python process group as the group itself and registers no backend in it,
    # yet asks the group for its backend per device type: init_process_group(device_id=...)
    # and new_group() ask whether it can split, _coalescing_manager(device=...) starts and
    # ends coalescing on it. This group is its own backend for both device types it is
    # registered for; it cannot split (every group is made from the store) and coalesces
    # by running each collective as it is called.
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def supports_tensor_alloc(self, device=None):
        return False

    @property
    def _device_types(self):
        return [torch.device(t) for t in DEVICE_TYPES]

    def _get_backend(self, device):
        if isinstance(device, int):  # an index: the accelerator's
            kind = "cuda"
        else:
            kind = str(device if isinstance(device, str) else getattr(device, "type", None))
            kind = kind.split(":", 1)[0]
        if kind not in DEVICE_TYPES:
            # RuntimeError, as c10d's own answer: its callers catch that one.
            raise EmulateError(f"the tpcheck backend has no backend for device type {kind!r} "
                               f"(from {device!r}); it serves {', '.join(DEVICE_TYPES)}")
        return self

    def eager_connect_single_device(self, device=None):
        """Nothing to connect: the group's exchanges open at its first collective."""

    def _start_coalescing(self, device):
        self._get_backend(device)  # the device type's check
        if self._coalesced is not None:
            raise EmulateError("_coalescing_manager inside another one on the same group: "
                               "coalescing managers do not nest; end the first one first")
        self._coalesced = []

    def _end_coalescing(self, device):
        """The Work of everything run since _start_coalescing: collectives have completed
        already; receives run in its wait()."""
        pending, self._coalesced = self._coalesced or [], None
        if not pending:
            return completed([])
        return LazyWork(lambda: [w.wait() for w in pending], [])

    # ---- reductions ----------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        C.all_reduce(self._engine, tensors, reduce_op(opts, "all_reduce", tensors))
        return completed(tensors)

    allreduce_coalesced = allreduce

    def reduce(self, tensors, opts=None):
        op = reduce_op(opts, "reduce", tensors)
        C.all_reduce(self._engine, tensors, op, "reduce", _root(opts))
        return completed(tensors)

    def _reduce_scatter_base(self, out, inp, opts=None):
        op = reduce_op(opts, "reduce_scatter_tensor", [inp])
        C.reduce_scatter(self._engine, out, inp, op, "reduce_scatter_tensor")
        return completed([out])

    def reduce_scatter(self, outs, in_lists, opts=None):
        for out, ins in zip(outs, in_lists):
            C.reduce_scatter_list(self._engine, out, ins, reduce_op(opts, "reduce_scatter", ins))
        return completed(outs)

    def reduce_scatter_tensor_coalesced(self, outs, ins, opts=None):
        for o, i in zip(outs, ins):
            op = reduce_op(opts, "reduce_scatter_tensor", [i])
            C.reduce_scatter(self._engine, o, i, op, "reduce_scatter_tensor")
        return completed(outs)

    # ---- data movement ---------------------------------------------------------------------
    def _allgather_base(self, out, inp, opts=None):
        C.gather_into(self._engine, out, inp, "all_gather_into_tensor")
        return completed([out])

    def allgather_into_tensor_coalesced(self, outs, ins, opts=None):
        for o, i in zip(outs, ins):
            C.gather_into(self._engine, o, i, "all_gather_into_tensor")
        return completed(outs)

    def allgather(self, out_lists, ins, opts=None):
        C.all_gather(self._engine, out_lists, ins)
        return completed(out_lists)

    allgather_coalesced = allgather

    def broadcast(self, tensors, opts=None):
        C.broadcast(self._engine, tensors, _root(opts))
        return completed(tensors)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        C.all_to_all_single(self._engine, out, inp, out_splits, in_splits)
        return completed([out])

    def alltoall(self, outs, ins, opts=None):
        C.all_to_all(self._engine, outs, ins)
        return completed(outs)

    def gather(self, out_lists, ins, opts=None):
        C.gather(self._engine, out_lists, ins, _root(opts))
        return completed(out_lists)

    def scatter(self, outs, in_lists, opts=None):
        C.scatter(self._engine, outs[0], in_lists, _root(opts))
        return completed(outs)

    def barrier(self, opts=None):
        C.barrier(self._engine)
        return completed([])

    # ---- point to point --------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        self._p2p.send(tensors, dst, tag)
        return completed(tensors)

    def recv(self, tensors, src, tag=0):
        work = self._p2p.recv(tensors, src, tag)
        if self._coalesced is not None:  # the coalesced Work receives it too (_end_coalescing)
            self._coalesced.append(work)
        return work

    def recv_anysource(self, tensors, tag=0):
        raise EmulateError("recv from any source is not supported by the tpcheck backend")


def create(opts, backend_options=None) -> TpcheckProcessGroup:
    """The backend's creator (extended API: c10d passes the group's global ranks)."""
    global_ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
    pg = TpcheckProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             global_ranks or None, str(getattr(opts, "group_id", "") or ""))
    mark_initialized(pg._global[opts.group_rank])
    return pg

"""CudaExchange: CUDA tensors of a group's ranks through CUDA IPC, stream-ordered on the
caller's current stream, with no host copy of the data and no host synchronisation.

Per group and rank: two staging buffers on the rank's GPU (call s uses s % 2; the memory:
cuda_memory.py), and per buffer three interprocess events: `ready` (recorded after this
rank's contribution is readable), `reduced` (after it wrote its share of a split
all-reduce) and `done` (after it finished reading the others' data of that call). A rank's
first record carries its events' IPC handles (peers open them once, keyed by the rank's
pid).
  put(s):   stage: the caller's stream waits on every peer's done[s % 2] (their reads of
            call s - 2 from this buffer), copies the contribution in (times AVG's 1/N,
            rounded to the dtype: NCCL's PreMulSum), records ready[s % 2].
            zero copy: records ready[s % 2]; the peers read the caller's tensors where they
            are (the IPC handle of the caching allocator's allocation that holds them).
  read:     the caller's stream waits on the peer's ready[s % 2]; a peer on another GPU is
            copied to this one first (no peer-to-peer kernels).
  finish(): records done[s % 2]; after a zero-copy call every rank also waits until every
            peer recorded its done (a second round): a lent tensor may change only once all
            have read it.
Why an event is never re-recorded too early: rank A re-records done[b] only after reading
call s + 2, which needs B's record of s + 2, which B publishes after its stream already
waited on A's done[b] of call s.

The current stream is looked up once per call (put), and the reductions hand the kernel
data addresses, not tensor views: a collective's host work is Python, and at TP 8 every
torch call per peer counts.

All-reduce of floats with SUM or AVG, three ways (reduce()):
  * in place, when every rank lent its tensors on this GPU (zero copy): rank r folds its 1/N
    of the elements from every rank's tensor and writes the result into every rank's tensor
    in one kernel, so every byte is read once and written once;
  * split, when staged and large (TPCHECK_EMULATE_SPLIT_BYTES, default 1 MiB): rank r folds
    its 1/N into a result region of its staging buffer, records `reduced`, and after a
    second round every rank copies the N shares; every input byte is read once;
  * whole: every rank folds every element (small calls, where one more round costs more).
The folds are the C++ device group's kernel (reduce.kernel_fold); max, min, product and
integers fold with torch ops (reduce.torch_fold: correct, not fast; TP code reduces sums).

Zero copy is the default under MPS (CUDA_MPS_PIPE_DIRECTORY set, as `emulate` sets it):
without MPS, where the ranks take turns on the GPU, its extra round costs more than the copy
it saves. TPCHECK_EMULATE_ZERO_COPY=1 or 0 decides it.
"""

from __future__ import annotations

import os

import torch

from .. import _tpcheck
from . import reduce as R
from .cuda_memory import PeerMemory, StagingBuffers, b64, unb64
from .exchange import Exchange, Intent, Step
from .protocol import EmulateError, NCCL_RING
from .records import FLAG_DONE, FLAG_REDUCED

_EVENTS = ("ready", "reduced", "done")


def zero_copy_enabled() -> bool:
    """Whether CUDA collectives lend the caller's tensors instead of staging copies."""
    env = os.environ.get("TPCHECK_EMULATE_ZERO_COPY")
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise EmulateError(f"TPCHECK_EMULATE_ZERO_COPY={env!r}: expected 0 or 1")
    return bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))


def split_bytes() -> int:
    """From how many bytes (of the largest tensor) a staged all-reduce is split into per-rank
    shares. TPCHECK_EMULATE_SPLIT_BYTES overrides it (0: always; the GPU tests run both)."""
    text = os.environ.get("TPCHECK_EMULATE_SPLIT_BYTES", str(1 << 20))
    try:
        return int(text)
    except ValueError:
        raise EmulateError(f"TPCHECK_EMULATE_SPLIT_BYTES={text!r}: expected a number of "
                           f"bytes (0 splits every all-reduce)") from None


def zero_copy_in(recs: list) -> bool:
    """Whether some rank lent its own tensors (zero copy) to this call."""
    return any((rec.get("loc") or {}).get("zc") is not None for rec in recs)


def _align(n: int) -> int:
    return (n + 255) // 256 * 256


class CudaExchange(Exchange):
    def __init__(self, device: torch.device, rank: int, size: int, order: str):
        super().__init__(rank, size, order)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._dev = torch.device("cuda", index)
        self._staging = StagingBuffers(self._dev)
        self._peer_memory = PeerMemory()
        try:
            self._events = {k: [torch.cuda.Event(interprocess=True) for _ in range(2)]
                            for k in _EVENTS}
        except RuntimeError as e:
            raise EmulateError(f"CUDA tensors need interprocess events (CUDA IPC), which this "
                               f"GPU/driver refuses: {e}") from e
        self._peer_events: dict[str, torch.cuda.Event] = {}  # IPC handle -> opened event
        self._peer_ev: dict[int, dict] = {}  # peer pid -> its events' handles and device
        self._peer_done: dict[int, tuple[int, list]] = {}  # peer rank -> (device, done handles)
        self._waited: set = set()  # (which, peer pid, event) this call's stream waited on
        self._sent_events = False  # whether this rank's first record carried them
        self._no_export = False  # the allocator's memory has no IPC handle: stage from now on
        # This call's state (put): its stream, its number, the tensors this rank lent, whether
        # a staged all-reduce is split, other GPUs' inputs copied here, results to put back.
        self._stream = None
        self._seq = -1
        self._mine: list = []
        self._split = False
        self._copies: list = []
        self._pending: list = []

    # ---- writing ---------------------------------------------------------------------------
    def put(self, seq: int, tensors: list, intent: Intent) -> dict:
        if torch.cuda.current_device() == self._dev.index:
            return self._put_here(seq, tensors, intent)
        with torch.cuda.device(self._dev):  # events and buffers on this rank's GPU
            return self._put_here(seq, tensors, intent)

    def _plan(self, tensors: list, intent: Intent):
        """(per tensor AVG's scale or None, split, zero copy) of this call."""
        kernel = [R.uses_kernel(t.dtype, intent.op or "") for t in tensors]
        scales = [R.premul(t.dtype, self.size) if k and intent.op == "avg" else None
                  for t, k in zip(tensors, kernel)]
        split = (intent.all_reduce and self.size > 1 and bool(tensors) and all(kernel)
                 and len({t.dtype for t in tensors}) == 1
                 and max(t.numel() * t.element_size() for t in tensors) >= split_bytes())
        staged_only = any(s is not None for s in scales)  # AVG's copies are scaled
        return scales, split, zero_copy_enabled() and not staged_only

    def _put_here(self, seq: int, tensors: list, intent: Intent) -> dict:
        self._stream = torch.cuda.current_stream(self._dev)
        self._copies, self._pending = [], []  # the previous call's kernels are enqueued
        self._seq = seq
        self._waited.clear()
        scales, self._split, zero_copy = self._plan(tensors, intent)
        if zero_copy and not self._no_export:
            loc = self._export(tensors)
            if loc is not None:
                return loc
        return self._stage(tensors, scales, self._split)

    def _loc(self) -> dict:
        which = self._seq % 2
        loc = {"cuda": True, "pid": os.getpid(), "dev": self._dev.index, "which": which}
        if not self._sent_events:  # an event's IPC handle never changes: sent once
            loc["ev"] = {k: [b64(e.ipc_handle()) for e in self._events[k]] for k in _EVENTS}
            self._sent_events = True
        return loc

    def _export(self, tensors: list):
        """Zero copy: the location of the caller's tensors themselves; None when one cannot
        be lent (not contiguous, another device, memory without an IPC handle: torch's
        expandable segments)."""
        srcs = []
        for t in tensors:
            if t.device != self._dev or not t.is_contiguous():
                return None
            if t.numel() == 0:
                srcs.append(None)
                continue
            try:
                h, off, size = _tpcheck.ipc_export(t.data_ptr(), self._dev.index)
            except RuntimeError:
                self._no_export = True
                return None
            srcs.append([b64(h), off, size])
        self._mine = list(tensors)
        self._events["ready"][self._seq % 2].record(self._stream)
        return dict(self._loc(), zc=srcs)

    def _stage(self, tensors: list, scales: list, results: bool) -> dict:
        """Copies the tensors into staging buffer seq % 2 (with a result region per tensor for
        a split all-reduce)."""
        which = self._seq % 2
        for dev, handles in self._peer_done.values():
            self._stream.wait_event(self._event(handles[which], dev))
        offs, off = [], 0
        for t in tensors:
            if t.device != self._dev:
                raise EmulateError(f"a collective's tensors are on {t.device} and {self._dev}; "
                                   f"one device per collective")
            offs.append(off)
            off = _align(off + t.numel() * t.element_size())
        res_offs = []
        for t in tensors if results else []:
            res_offs.append(off)
            off = _align(off + t.numel() * t.element_size())
        buf = self._staging.get(which, off)
        for t, o, scale in zip(tensors, offs, scales):
            n = t.numel() * t.element_size()
            if n == 0:
                continue
            dst = buf[o:o + n].view(t.dtype)
            if scale is None:
                dst.copy_(t.reshape(-1))
            else:  # one rounding to the dtype, as NCCL's PreMulSum
                torch.mul(t.reshape(-1), scale, out=dst)
        self._events["ready"][which].record(self._stream)
        self._mine = []
        return dict(self._loc(), zc=None, share=self._staging.shares[which], offs=offs,
                    res=res_offs)

    # ---- reading ---------------------------------------------------------------------------
    def note_peers(self, recs: list) -> None:
        """Keeps the peers' event handles, which a rank's first record carries."""
        for r, rec in enumerate(recs):
            loc = rec.get("loc") or {}
            if r != self.rank and "ev" in loc:
                self._peer_ev[loc["pid"]] = dict(loc["ev"], dev=loc["dev"])
                self._peer_done[r] = (loc["dev"], loc["ev"]["done"])

    def _event(self, h: str, dev: int) -> torch.cuda.Event:
        ev = self._peer_events.get(h)
        if ev is None:  # on the device the event was made on (the peer's)
            ev = self._peer_events[h] = torch.cuda.Event.from_ipc_handle(
                torch.device("cuda", dev), unb64(h))
        return ev

    def _wait_peer(self, loc: dict, event: str) -> None:
        """This call's stream waits on a peer's `event` of this call (once)."""
        pid = loc["pid"]
        if pid == os.getpid():
            return
        key = (loc["which"], pid, event)
        if key not in self._waited:
            ev = self._peer_ev[pid]
            self._stream.wait_event(self._event(ev[event][loc["which"]], ev["dev"]))
            self._waited.add(key)

    def _here(self, v: torch.Tensor) -> torch.Tensor:
        return v if v.device == self._dev else v.to(self._dev, non_blocking=True)

    def view(self, loc: dict, index: int, dtype, numel: int) -> torch.Tensor:
        if loc.get("zc") is None:
            return self._region(loc, loc["offs"][index], "ready", dtype, numel)
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=self._dev)
        if loc["pid"] == os.getpid():
            return self._mine[index].reshape(-1).view(dtype)[:numel]
        h, off, size = loc["zc"][index]
        self._wait_peer(loc, "ready")
        base = self._peer_memory.buffer([loc["dev"], h, size])
        return self._here(base[off:off + numel * dtype.itemsize].view(dtype))

    def _region(self, loc: dict, offset: int, event: str, dtype, numel: int) -> torch.Tensor:
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=self._dev)
        which = loc["which"]
        if loc["share"] == self._staging.shares[which]:
            base = self._staging.bufs[which]
        else:
            base = self._peer_memory.buffer(loc["share"])
            self._wait_peer(loc, event)
        return self._here(base[offset:offset + numel * dtype.itemsize].view(dtype))

    def address(self, loc: dict, index: int, dtype, numel: int) -> int:
        """The data address on this GPU of tensor `index` of a rank's contribution (as view(),
        without making a tensor)."""
        if loc["dev"] != self._dev.index:  # a peer on another GPU: copied here first
            copy = self.view(loc, index, dtype, numel)
            self._copies.append(copy)  # alive until the call's kernel is enqueued
            return copy.data_ptr()
        if loc.get("zc") is None:
            self._wait_peer(loc, "ready")
            h = loc["share"][1]
            which = self._staging.which_is(h)
            base = (self._staging.address(which) if which is not None
                    else self._peer_memory.map(h, loc["share"][0], loc["share"][2]))
            return base + loc["offs"][index]
        if loc["pid"] == os.getpid():
            return self._mine[index].data_ptr()
        h, off, size = loc["zc"][index]
        self._wait_peer(loc, "ready")
        return self._peer_memory.map(h, loc["dev"], size) + off

    def inputs(self, step: Step, index: int, dtype, count: int, op: str) -> list:
        """Addresses for the kernel's reductions (float SUM and AVG), else flat views."""
        if R.uses_kernel(dtype, op) and count > 0:
            return [self.address(rec["loc"], index, dtype, count) for rec in step.recs]
        return [self.view(rec["loc"], index, dtype, count) for rec in step.recs]

    # ---- reductions ------------------------------------------------------------------------
    def fold(self, out, inputs: list, count: int, kind: str, op: str, root: int) -> None:
        if not R.uses_kernel(out.dtype, op):
            R.torch_fold(out, inputs, kind, op, self.order, self.rank, root)
            return
        m = out.numel()
        first, offset = R.kernel_start(kind, self.order, len(inputs), self.rank, root, m)
        R.kernel_fold(out.data_ptr(), m, out.dtype, inputs, count, first, offset, self.order,
                      self._stream, self._dev.index)

    def output(self, t, kind: str, step: Step):
        """A lent tensor (zero copy) is read by the peers until finish(): an all-reduce's
        result waits in a copy until then."""
        if kind == "reduce_scatter" or not zero_copy_in(step.recs):
            return super().output(t, kind, step)
        tmp = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        return tmp, (lambda: self._pending.append((t, tmp)))

    def reduce(self, step: Step, outs: list, counts: list, kind: str, op: str, root: int) -> None:
        if (kind == "all_reduce" and op == "sum" and self._in_place_ok(step.recs)
                and all(R.uses_kernel(t.dtype, op) for t in outs)):
            self._all_reduce_in_place(outs, step)
        elif self._split and not zero_copy_in(step.recs):
            flat = [self.output(t, kind, step) for t in outs]
            self._split_all_reduce([o for o, _ in flat], step)
            for _, fin in flat:
                fin()
        else:
            super().reduce(step, outs, counts, kind, op, root)

    def _in_place_ok(self, recs: list) -> bool:
        """Whether every rank lent its tensors on this GPU."""
        return all((rec.get("loc") or {}).get("zc") is not None
                   and rec["loc"]["dev"] == self._dev.index for rec in recs)

    def _ring_first(self) -> int:
        return -1 if self.order == NCCL_RING else 0

    def _all_reduce_in_place(self, tensors: list, step: Step) -> None:
        """This rank folds its share of the elements from every rank's tensor and writes the
        result into every rank's tensor, in one kernel (each element is read from all before
        it is written; only this rank touches its share)."""
        for i, t in enumerate(tensors):
            count = t.numel()
            lo, hi = R.share(count, self.size, self.rank)
            if hi <= lo:
                continue
            ptrs = [self.address(rec["loc"], i, t.dtype, count) for rec in step.recs]
            at = lo * t.itemsize
            R.kernel_fold(ptrs[0] + at, hi - lo, t.dtype, ptrs, count, self._ring_first(), lo,
                          self.order, self._stream, self._dev.index,
                          extra_outs=[p + at for p in ptrs[1:]])

    def _split_all_reduce(self, outs: list, step: Step) -> None:
        """The all-reduce of each flat out, staged by every rank with result regions: this
        rank folds its share into its result region, records `reduced`; after the second
        round every share is copied into out."""
        mine = step.loc(self.rank)
        for i, out in enumerate(outs):
            count = out.numel()
            lo, hi = R.share(count, self.size, self.rank)
            ins = [self.address(rec["loc"], i, out.dtype, count) for rec in step.recs]
            res = self._region(mine, mine["res"][i], "reduced", out.dtype, count)
            if hi > lo:
                R.kernel_fold(res[lo:hi].data_ptr(), hi - lo, out.dtype, ins, count,
                              self._ring_first(), lo, self.order, self._stream, self._dev.index)
        self._events["reduced"][self._seq % 2].record(self._stream)
        step.second_round(FLAG_REDUCED)
        for i, out in enumerate(outs):
            count = out.numel()
            for r, rec in enumerate(step.recs):
                lo, hi = R.share(count, self.size, r)
                if hi > lo:
                    loc = rec["loc"]
                    res = self._region(loc, loc["res"][i], "reduced", out.dtype, count)
                    out[lo:hi].copy_(res[lo:hi])

    # ---- the end of a call, and of the process ---------------------------------------------
    def finish(self, step: Step) -> None:
        """Records `done`. When some rank lent its own tensors, waits until every rank
        recorded its `done`, and this stream waits on each: a lent tensor may be changed by
        its owner only after every peer has read it, and read only after every peer wrote its
        share into it (the in-place all-reduce)."""
        if self._seq < 0:
            return
        self._events["done"][self._seq % 2].record(self._stream)
        if zero_copy_in(step.recs):
            step.second_round(FLAG_DONE)
            for rec in step.recs:
                loc = rec.get("loc") or {}
                if loc.get("cuda") and loc["pid"] != os.getpid():
                    self._wait_peer(loc, "done")
        pending, self._pending = self._pending, []
        for t, tmp in pending:
            t.copy_(tmp.view(t.shape))

    def close(self, exit_barrier) -> None:
        """Every rank unmaps the others' memory, waits until all have (exit_barrier), then
        frees its own: freeing memory a peer still maps, or may still read, is not safe."""
        self._peer_memory.release(self._dev.index)
        exit_barrier()
        self._staging.free()

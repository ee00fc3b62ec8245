"""Exchange of CUDA tensors between rank processes through CUDA IPC, stream-ordered on the
caller's current stream, no host copy of the data.

Per group and rank: two staging buffers on the rank's GPU (collective s uses s % 2), and
per buffer three interprocess events: `ready` (recorded after this rank copied its
contribution in), `reduced` (after it wrote its share of a split all-reduce, below) and
`done` (after it finished reading the others' buffers of that collective). A rank's first
record of the group carries its events' IPC handles (peers open them once, keyed by the
rank's pid); every record names the staging buffer's handle (peers map each once and cache
it). The current stream is looked up once per collective (put), and the reductions pass
data addresses to the kernel instead of tensor views: a collective's host work is Python,
and at TP 8 every torch call per peer counts (bench/RESULTS.md: 0.67 ms a call at 1024
elements on an H100 with views and a stream lookup per peer, 0.27 ms on an H200 without).
  put(s):   the caller's stream waits on every peer's `done[s % 2]` (their reads of
            collective s - 2 from this buffer), copies the contribution in (times the
            average's 1/N, rounded to the dtype, for AVG: NCCL's PreMulSum), records
            ready[s % 2].
  view():   the caller's stream waits on the peer's ready[s % 2]; a peer on another GPU
            is copied to this one first (no peer-to-peer kernels).
  finish(): records done[s % 2] on the caller's stream.
Why the events are never re-recorded too early: rank A re-records done[b] only after
reading collective s + 2, which needs B's record of s + 2, which B publishes after its
stream already waited on A's done[b] of collective s.

The staging buffers are tpcheck's own CUDA IPC allocations (_tpcheck.ipc_alloc: cudaMalloc
and cudaIpcGetMemHandle; cuda_ipc.cpp), viewed as torch uint8 tensors that do not own them
(_tpcheck.cuda_bytes). A record's "share" is [device, IPC handle (base64), bytes]; a peer
maps it once (_tpcheck.ipc_open, cached by handle). Not torch's storage sharing
(_share_cuda_ / _new_shared_cuda): that puts a cross-process reference count on each shared
storage, which N - 1 readers of a buffer that lives as long as the process never bring back
to zero, and torch then warns at every exit ("Producer process has been terminated before
all shared CUDA tensors released"). Lifetimes here are explicit: a buffer that grows keeps
its old allocation until exit; at exit every rank unmaps its peers' buffers
(release_peers), all ranks meet at the exit barrier (_backend.py), then each frees its own
(free_own). The events stay torch's interprocess events (no reference counts on those).

Reductions (sum and average of float dtypes) run the C++ device group's kernel
(_tpcheck.ring_fold_cuda; comm/cuda/device_collectives.cu): the same per-element fold —
start rank, ring order, every step rounded to the dtype — as NCCL's Ring/Simple and as the
CPU path's _tpcheck.ring_reduce. A large all-reduce is split (split_all_reduce): rank r
folds only its 1/N of the elements, from every rank's staging buffer, into a result region
of its own buffer and records `reduced`; after one more exchange of records through the
store each rank copies the N shares into its output. That reads every input byte once in
the fold instead of N times. Max, min, product and integers fold with torch ops in the
order the model gives (correct, not fast: TP code reduces sums).
"""

from __future__ import annotations

import base64
import os

import torch

from .. import _tpcheck


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


_SEGMENTS: dict = {}
_DT = {torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class CudaExchange:
    def __init__(self, group, device: torch.device):
        from ._backend import EmulateError

        self._g = group
        self._dev = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self._bufs: list[torch.Tensor | None] = [None, None]  # views of the allocations
        self._allocs: list[int | None] = [None, None]  # their addresses (ipc_alloc)
        self._shares: list[list | None] = [None, None]
        # Allocations a grown buffer replaced: freed at exit only (_buffer says why).
        self._superseded: list[int] = []
        try:
            self._ready = [torch.cuda.Event(interprocess=True) for _ in range(2)]
            self._reduced = [torch.cuda.Event(interprocess=True) for _ in range(2)]
            self._done = [torch.cuda.Event(interprocess=True) for _ in range(2)]
        except RuntimeError as e:
            raise EmulateError(f"CUDA tensors need interprocess events (CUDA IPC), which this "
                               f"GPU/driver refuses: {e}") from e
        self._peer_bufs: dict[str, torch.Tensor] = {}  # IPC handle (base64) -> view
        self._peer_maps: dict[str, tuple[int, int]] = {}  # handle -> (address, device)
        self._peer_events: dict[str, torch.cuda.Event] = {}
        self._waited: set[tuple[int, int, str]] = set()  # (which, peer pid, event) waited on
        self._peer_ev: dict[int, dict] = {}  # peer pid -> its events' handles and device
        self._stream = None  # the caller's current stream of this collective (put)
        self._copies: list[torch.Tensor] = []  # other GPUs' inputs copied here (address)
        self._seq = -1
        self._peer_done: dict[int, tuple[int, list[str]]] = {}  # peer rank -> (device, done handles)
        self._mine: list[torch.Tensor] = []  # this rank's tensors of the current collective
        self._no_export = False  # set when the allocator's memory has no IPC handle
        self._sent_events = False  # whether this rank's first record carried them

    # ---- writing ---------------------------------------------------------------------------
    def _buffer(self, which: int, need: int) -> torch.Tensor:
        from ._backend import EmulateError

        cur = self._bufs[which]
        if cur is None or cur.numel() < need:
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
            # The allocation this replaces is not freed now: peers keep it mapped (cached by
            # handle) until exit and may still have reads of an earlier collective from it
            # queued on their own streams, which nothing here waits for (the done events
            # order this process's stream only). Sizes double, so the kept ones together
            # are smaller than the new one.
            if self._allocs[which] is not None:
                self._superseded.append(self._allocs[which])
            self._allocs[which] = addr
            cur = _tpcheck.cuda_bytes(addr, size, dev)
            self._shares[which] = [dev, _b64(handle), size]
            self._bufs[which] = cur
        return cur

    def put(self, seq: int, tensors: list[torch.Tensor], scale: float | None = None,
            results: bool = False, zero_copy: bool = False) -> dict:
        """Makes the tensors of collective `seq` readable by the peers: with `zero_copy`, in
        place (their allocations' IPC handles), else staged (each times `scale` when
        given; with `results`, also a result region per tensor for split_all_reduce)."""
        if torch.cuda.current_device() == self._dev.index:
            return self._put_here(seq, tensors, scale, results, zero_copy)
        with torch.cuda.device(self._dev):  # events and buffers on this rank's GPU
            return self._put_here(seq, tensors, scale, results, zero_copy)

    def _put_here(self, seq, tensors, scale, results, zero_copy) -> dict:
        self._stream = torch.cuda.current_stream(self._dev)
        self._copies = []  # the previous collective's kernels are enqueued
        if zero_copy and not self._no_export:
            loc = self._export(seq, tensors)
            if loc is not None:
                return loc
        return self._put(seq, tensors, scale, results)

    def _events(self, which: int) -> dict:
        loc = {"cuda": True, "pid": os.getpid(), "dev": self._dev.index, "which": which}
        if not self._sent_events:  # an event's IPC handle never changes: sent once
            loc["ev"] = {"ready": [_b64(e.ipc_handle()) for e in self._ready],
                         "reduced": [_b64(e.ipc_handle()) for e in self._reduced],
                         "done": [_b64(e.ipc_handle()) for e in self._done]}
            self._sent_events = True
        return loc

    def _export(self, seq: int, tensors: list[torch.Tensor]) -> dict | None:
        """Zero copy: the peers read (and the in-place all-reduce writes) the caller's
        tensors themselves. None when one cannot be exported (not contiguous, another
        device, memory without an IPC handle: torch's expandable segments)."""
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
                self._no_export = True  # the allocator's memory: stage from now on
                return None
            srcs.append([_b64(h), off, size])
        self._seq = seq
        self._waited.clear()
        self._mine = list(tensors)
        which = seq % 2
        self._ready[which].record(self._stream)
        return dict(self._events(which), zc=srcs)

    def _put(self, seq: int, tensors: list[torch.Tensor], scale, results) -> dict:
        from ._backend import EmulateError

        self._seq = seq
        self._waited.clear()
        which = seq % 2
        stream = self._stream
        for dev, handles in self._peer_done.values():
            stream.wait_event(self._event(handles[which], dev))
        offs, off = [], 0
        for t in tensors:
            if t.device != self._dev:
                raise EmulateError(f"a collective's tensors are on {t.device} and {self._dev}; "
                                   f"one device per collective")
            offs.append(off)
            off = (off + t.numel() * t.element_size() + 255) // 256 * 256
        res_offs = []
        for t in tensors if results else []:
            res_offs.append(off)
            off = (off + t.numel() * t.element_size() + 255) // 256 * 256
        buf = self._buffer(which, off)
        for t, o in zip(tensors, offs):
            n = t.numel() * t.element_size()
            if n == 0:
                continue
            dst = buf[o:o + n].view(t.dtype)
            if scale is None:
                dst.copy_(t.reshape(-1))
            else:  # one rounding to the dtype, as NCCL's PreMulSum
                torch.mul(t.reshape(-1), scale, out=dst)
        self._ready[which].record(stream)
        self._mine = []
        return dict(self._events(which), zc=None, share=self._shares[which], offs=offs,
                    res=res_offs)

    # ---- reading ---------------------------------------------------------------------------
    def _event(self, h: str, dev: int) -> torch.cuda.Event:
        ev = self._peer_events.get(h)
        if ev is None:  # the device the event was made on (the peer's)
            ev = torch.cuda.Event.from_ipc_handle(torch.device("cuda", dev), _unb64(h))
            self._peer_events[h] = ev
        return ev

    def view(self, loc: dict, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Tensor `index` of a rank's collective (flat; staged, or the rank's own tensor
        under zero copy), after its `ready` event."""
        if loc.get("zc") is None:
            return self._region(loc, loc["offs"][index], "ready", dtype, numel)
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=self._dev)
        if loc["pid"] == os.getpid():
            return self._mine[index].reshape(-1).view(dtype)[:numel]
        h, off, size = loc["zc"][index]
        self._wait_peer(loc, "ready")
        base = self._peer_buffer([loc["dev"], h, size])
        v = base[off:off + numel * dtype.itemsize].view(dtype)
        if v.device != self._dev:
            v = v.to(self._dev, non_blocking=True)
        return v

    def address(self, loc: dict, index: int, dtype: torch.dtype, numel: int) -> int:
        """The data address of tensor `index` of a rank's collective on this GPU (as view,
        without making a tensor: the reductions pass addresses to the kernel)."""
        if loc["dev"] != self._dev.index:  # a peer on another GPU: copied here first
            copy = self.view(loc, index, dtype, numel)
            self._copies.append(copy)  # alive until the collective's kernel is enqueued
            return copy.data_ptr()
        if loc.get("zc") is None:
            self._wait_peer(loc, "ready")
            return self._base_address(loc["share"]) + loc["offs"][index]
        if loc["pid"] == os.getpid():
            return self._mine[index].data_ptr()
        h, off, size = loc["zc"][index]
        self._wait_peer(loc, "ready")
        return self._map(h, loc["dev"], size) + off

    def inputs(self, recs: list[dict], index: int, dtype: torch.dtype, numel: int,
               op: str) -> list:
        """Every rank's tensor `index` of this collective: data addresses for the kernel's
        reductions (float sum and average), else flat views (torch_fold)."""
        if dtype in _DT and op in ("sum", "avg") and numel > 0:
            return [self.address(rec["loc"], index, dtype, numel) for rec in recs]
        return [self.view(rec["loc"], index, dtype, numel) for rec in recs]

    def _wait_peer(self, loc: dict, event: str) -> None:
        """This stream waits on a peer's `event` of the current collective (once)."""
        pid = loc["pid"]
        if pid == os.getpid():
            return
        key = (loc["which"], pid, event)
        if key not in self._waited:
            ev = self._peer_ev[pid]
            self._stream.wait_event(self._event(ev[event][loc["which"]], ev["dev"]))
            self._waited.add(key)

    def result_view(self, loc: dict, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Result region `index` of a rank's split all-reduce, after its `reduced` event."""
        return self._region(loc, loc["res"][index], "reduced", dtype, numel)

    def _region(self, loc, offset, event, dtype, numel) -> torch.Tensor:
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=self._dev)
        which = loc["which"]
        if loc["share"] == self._shares[which]:
            base = self._bufs[which]
        else:
            base = self._peer_buffer(loc["share"])
            self._wait_peer(loc, event)
        v = base[offset:offset + numel * dtype.itemsize].view(dtype)
        if v.device != self._dev:
            v = v.to(self._dev, non_blocking=True)
        return v

    def _peer_buffer(self, share: list) -> torch.Tensor:
        """A peer's allocation (a staging buffer, or under zero copy the allocation holding
        a lent tensor), whole, as a uint8 tensor made once: views of it are slices."""
        dev, h, size = share
        t = self._peer_bufs.get(h)
        if t is None:
            t = _tpcheck.cuda_bytes(self._map(h, dev, size), size, dev)
            self._peer_bufs[h] = t
        return t

    def _base_address(self, share: list) -> int:
        """A staging buffer's address here: this rank's own or a peer's mapping."""
        dev, h, size = share
        for which in range(2):
            if self._shares[which] is not None and self._shares[which][1] == h:
                return self._allocs[which]
        return self._map(h, dev, size)

    def _map(self, h: str, dev: int, nbytes: int) -> int:
        """A peer's allocation mapped here (on the peer's GPU), once per allocation: an IPC
        handle opens once per process. Mappings stay until exit (release_peers): a peer's
        tensors come from its caching allocator, whose few large allocations are reused."""
        got = self._peer_maps.get(h)
        if got is None:
            from ._backend import EmulateError

            try:
                addr = _tpcheck.ipc_open(_unb64(h), dev)
            except RuntimeError as e:
                raise EmulateError(f"cannot map a peer rank's CUDA memory (a tensor of {nbytes} "
                                   f"bytes on cuda:{dev}) through CUDA IPC: {e}") from e
            got = self._peer_maps[h] = (addr, dev)
        return got[0]

    def note_peers(self, recs: list[dict], me: int) -> None:
        """Keeps the peers' event handles, which a rank's first record carries."""
        for r, rec in enumerate(recs):
            loc = rec.get("loc") or {}
            if r != me and "ev" in loc:
                self._peer_ev[loc["pid"]] = dict(loc["ev"], dev=loc["dev"])
                self._peer_done[r] = (loc["dev"], loc["ev"]["done"])

    @staticmethod
    def zero_copy_in(recs: list[dict]) -> bool:
        """Whether some rank lent its own tensors (zero copy) to this collective."""
        return any((rec.get("loc") or {}).get("zc") is not None for rec in recs)

    def in_place_ok(self, recs: list[dict]) -> bool:
        """Whether every rank lent its tensors on this GPU: the in-place all-reduce."""
        return all((rec.get("loc") or {}).get("zc") is not None
                   and rec["loc"]["dev"] == self._dev.index for rec in recs)

    def release_peers(self) -> None:
        """At exit, before the exit barrier: waits for this process's GPU work (on its own
        GPU and on the peers' GPUs it read from), then unmaps every peer buffer. Every
        mapping is tried; the first failure is raised after the others are closed."""
        for d in {self._dev.index, *(d for _, d in self._peer_maps.values())}:
            torch.cuda.synchronize(d)
        self._peer_bufs.clear()  # no view may outlive its mapping
        maps, self._peer_maps = self._peer_maps, {}
        first = None
        for addr, dev in maps.values():
            try:
                _tpcheck.ipc_close(addr, dev)
            except RuntimeError as e:
                first = first or e
        if first is not None:
            raise first

    def free_own(self) -> None:
        """At exit, after the exit barrier (every peer has unmapped this rank's buffers):
        frees this rank's staging buffers, the current and the superseded ones."""
        self._bufs = [None, None]
        self._shares = [None, None]
        addrs = [a for a in self._allocs if a is not None] + self._superseded
        self._allocs, self._superseded = [None, None], []
        first = None
        for addr in addrs:
            try:
                _tpcheck.ipc_free(addr, self._dev.index)
            except RuntimeError as e:
                first = first or e
        if first is not None:
            raise first

    def finish(self, recs: list[dict], wait_done) -> None:
        """Records `done` (this rank has enqueued all it reads from and writes to the
        peers). When some rank lent its own tensors, wait_done() waits until every rank
        recorded its `done`, and this stream waits on each: a lent tensor may be changed
        by its owner only after every peer has read it, and read only after every peer
        wrote its share into it (the in-place all-reduce)."""
        if self._seq < 0:
            return
        which = self._seq % 2
        stream = self._stream
        self._done[which].record(stream)
        if self.zero_copy_in(recs):
            wait_done()
            for rec in recs:
                loc = rec.get("loc") or {}
                if loc.get("cuda") and loc["pid"] != os.getpid():
                    self._wait_peer(loc, "done")

    # ---- reductions ------------------------------------------------------------------------
    def fold(self, out: int, n_out: int, dtype, inputs: list[int], count: int, first: int,
             offset: int = 0, extra_outs=()) -> None:
        """out[j] (and each of extra_outs[j]) = the fold of inputs[*][offset + j], j < n_out,
        starting at rank `first` (-1: the all-reduce's nccl-ring start of each element), on
        the collective's stream. Addresses; `count`: the inputs' element count."""
        if n_out == 0:
            return
        _tpcheck.ring_fold_cuda(inputs, out, n_out, _DT[dtype], first, offset, count,
                                self._stream.cuda_stream, self._dev.index,
                                extra_outs=list(extra_outs))

    def all_reduce_in_place(self, tensors, recs, rank, order):
        """The all-reduce when every rank lent its tensors (in_place_ok): this rank folds its
        share of the elements from every rank's tensor and writes the result into every
        rank's tensor, in one kernel (each element is read from all before it is written;
        only this rank touches its share). Every byte is read once and written once."""
        n = len(recs)
        for i, t in enumerate(tensors):
            count = t.numel()
            lo, hi = share(count, n, rank)
            if hi <= lo:
                continue
            ptrs = [self.address(rec["loc"], i, t.dtype, count) for rec in recs]
            at = lo * t.itemsize
            self.fold(ptrs[0] + at, hi - lo, t.dtype, ptrs, count,
                      -1 if order == "nccl-ring" else 0, offset=lo,
                      extra_outs=[p + at for p in ptrs[1:]])

    def split_all_reduce(self, outs, recs, rank, order, wait_all):
        """The all-reduce of each out (flat, staged by every rank with results=True): this
        rank folds its share into its result region, records `reduced`, wait_all() waits
        for every rank's record of that, then every share is copied into out."""
        n = len(recs)
        mine = recs[rank]["loc"]
        for i, out in enumerate(outs):
            count = out.numel()
            lo, hi = share(count, n, rank)
            ins = [self.address(rec["loc"], i, out.dtype, count) for rec in recs]
            res = self.result_view(mine, i, out.dtype, count)
            if hi > lo:
                self.fold(res[lo:hi].data_ptr(), hi - lo, out.dtype, ins, count,
                          -1 if order == "nccl-ring" else 0, offset=lo)
        self._reduced[self._seq % 2].record(self._stream)
        wait_all()
        for i, out in enumerate(outs):
            count = out.numel()
            for r, rec in enumerate(recs):
                lo, hi = share(count, n, r)
                if hi > lo:
                    out[lo:hi].copy_(self.result_view(rec["loc"], i, out.dtype, count)[lo:hi])

    def reduce_into(self, out, inputs, count, kind, op, order, rank, root):
        """out = this rank's result of `kind` over every rank's input of `count` elements
        (from inputs(): addresses for the kernel's float sum/avg, avg already scaled when
        staged; else flat views for torch_fold)."""
        n = len(inputs)
        dtype = out.dtype
        if dtype in _DT and op in ("sum", "avg"):
            ring = order == "nccl-ring"
            m = out.numel()
            if kind == "reduce_scatter":
                first, offset = ((rank + 1) % n if ring else 0), rank * m
            elif kind == "reduce":
                first, offset = ((root + 1) % n if ring else 0), 0
            else:
                first, offset = (-1 if ring else 0), 0
            self.fold(out.data_ptr(), m, dtype, inputs, count, first, offset)
            return
        torch_fold(out, inputs, kind, op, order, rank, root)


def share(count: int, n: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s elements [lo, hi) of a split all-reduce: N near-equal runs, 256-element
    aligned (whole cache lines and vector loads for every dtype)."""
    q = (count + n - 1) // n
    q = (q + 255) // 256 * 256
    return min(rank * q, count), min((rank + 1) * q, count)


def torch_fold(out, inputs, kind, op, order, rank, root):
    """The reductions the kernel does not do (max, min, product; integers) with torch ops in
    the model's order, one op per step (each rounds to the dtype). Also runs on CPU tensors
    (test_emulate_ring.py checks it against ring_reduce)."""
    n = len(inputs)
    dtype = out.dtype
    if dtype not in _DT:  # integers: any order gives the same bits
        st = torch.stack([x[: out.numel()] if kind != "reduce_scatter" else
                          x[rank * out.numel():(rank + 1) * out.numel()] for x in inputs])
        r = {"sum": st.sum(0), "avg": torch.div(st.sum(0), n, rounding_mode="trunc"),
             "max": st.amax(0), "min": st.amin(0), "prod": st.prod(0)}[op]
        out.copy_(r.to(dtype))
        return
    if op not in ("max", "min", "prod"):
        raise ValueError(f"torch_fold: op {op!r} of {dtype} is the kernel's (sum, avg)")
    fn = {"max": torch.fmax, "min": torch.fmin, "prod": torch.mul}[op]

    def fold(lo, hi, first, shift=0):
        acc = inputs[first][shift + lo:shift + hi]
        for s in range(1, n):
            acc = fn(acc, inputs[(first + s) % n][shift + lo:shift + hi])
        out[lo:hi].copy_(acc)

    m = out.numel()
    if kind == "reduce_scatter":
        fold(0, m, (rank + 1) % n if order == "nccl-ring" else 0, shift=rank * m)
    elif kind == "reduce" or order == "rank":
        fold(0, m, (root + 1) % n if order == "nccl-ring" else 0)
    else:
        key = (m, n, dtype)
        segs = _SEGMENTS.get(key)
        if segs is None:
            segs = _SEGMENTS[key] = _tpcheck.ring_segments(m, n, _DT[dtype])
        for lo, hi, first in segs:
            fold(lo, hi, first)

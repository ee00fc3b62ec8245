"""Exchange of CUDA tensors between rank processes through CUDA IPC — NOT RUN YET (written
without a GPU; docs/EMULATE.md says what to try first). Stream-ordered on the caller's
current stream, no host copy of the data.

Per group and rank: two staging buffers on the rank's GPU (collective s uses s % 2), and
per buffer two interprocess events: `ready` (recorded after this rank copied its
contribution in) and `done` (recorded after this rank finished reading the others'
buffers of that collective). Every record a rank publishes carries the IPC handles of its
staging buffer and events (peers open each handle once and cache it).
  put(s):   the caller's stream waits on every peer's `done[s % 2]` (their reads of
            collective s - 2 from this buffer), copies the contribution in, records
            ready[s % 2].
  view():   the caller's stream waits on the peer's ready[s % 2]; a peer on another GPU
            is copied to this one first (no peer-to-peer kernels).
  finish(): records done[s % 2] on the caller's stream.
Why the events are never re-recorded too early: rank A re-records done[b] only after
reading collective s + 2, which needs B's record of s + 2, which B publishes after its
stream already waited on A's done[b] of collective s.
Reductions: reduce_into folds with torch ops on the GPU in the order the compiled ring
model gives (_tpcheck.ring_segments: which rank starts each run of elements), one torch op
per step, each rounding to the dtype (bf16/f16 ops compute in f32 and round once: the
correctly rounded result, as NCCL's).
"""

from __future__ import annotations

import base64

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
        self._bufs: list[torch.Tensor | None] = [None, None]
        self._shares: list[list | None] = [None, None]
        try:
            self._ready = [torch.cuda.Event(interprocess=True) for _ in range(2)]
            self._done = [torch.cuda.Event(interprocess=True) for _ in range(2)]
        except RuntimeError as e:
            raise EmulateError(f"CUDA tensors need interprocess events (CUDA IPC), which this "
                               f"GPU/driver refuses: {e}") from e
        self._peer_bufs: dict[str, torch.Tensor] = {}
        self._peer_events: dict[str, torch.cuda.Event] = {}
        self._waited: set[tuple[int, str]] = set()
        self._seq = -1
        self._peer_done: dict[int, list[str]] = {}  # peer rank -> its done-event handles

    # ---- writing ---------------------------------------------------------------------------
    def _buffer(self, which: int, need: int) -> torch.Tensor:
        from ._backend import EmulateError

        cur = self._bufs[which]
        if cur is None or cur.numel() < need:
            size = max(1 << 20, 1 << (max(need, 1) - 1).bit_length())
            cur = torch.empty(size, dtype=torch.uint8, device=self._dev)
            try:
                # Shared once per buffer: _share_cuda_ makes a ref counter and an event.
                sh = cur.untyped_storage()._share_cuda_()
            except RuntimeError as e:
                raise EmulateError(f"CUDA IPC is not available for {self._dev} (ranks that "
                                   f"share a GPU exchange CUDA tensors through it): {e}") from e
            self._shares[which] = [int(sh[0]), _b64(sh[1]), int(sh[2]), int(sh[3]),
                                   _b64(sh[4]), int(sh[5]), _b64(sh[6] or b""), bool(sh[7])]
            self._bufs[which] = cur
        return cur

    def put(self, seq: int, tensors: list[torch.Tensor]) -> dict:
        with torch.cuda.device(self._dev):  # events and buffers on this rank's GPU
            return self._put(seq, tensors)

    def _put(self, seq: int, tensors: list[torch.Tensor]) -> dict:
        from ._backend import EmulateError

        self._seq = seq
        self._waited.clear()
        which = seq % 2
        stream = torch.cuda.current_stream(self._dev)
        for dev, handles in self._peer_done.values():
            stream.wait_event(self._event(handles[which], dev))
        offs, off = [], 0
        for t in tensors:
            if t.device != self._dev:
                raise EmulateError(f"a collective's tensors are on {t.device} and {self._dev}; "
                                   f"one device per collective")
            offs.append(off)
            off = (off + t.numel() * t.element_size() + 255) // 256 * 256
        buf = self._buffer(which, off)
        for t, o in zip(tensors, offs):
            n = t.numel() * t.element_size()
            if n:
                buf[o:o + n].view(t.dtype).copy_(t.reshape(-1))
        self._ready[which].record(stream)
        return {"cuda": True, "share": self._shares[which], "offs": offs, "which": which,
                "ready": [_b64(e.ipc_handle()) for e in self._ready],
                "done": [_b64(e.ipc_handle()) for e in self._done]}

    # ---- reading ---------------------------------------------------------------------------
    def _event(self, h: str, dev: int) -> torch.cuda.Event:
        ev = self._peer_events.get(h)
        if ev is None:  # the device the event was made on (the peer's)
            ev = torch.cuda.Event.from_ipc_handle(torch.device("cuda", dev), _unb64(h))
            self._peer_events[h] = ev
        return ev

    def view(self, loc: dict, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=self._dev)
        which = loc["which"]
        if loc["share"] == self._shares[which]:
            base = self._bufs[which]
        else:
            base = self._peer_buffer(loc["share"])
            key = (which, loc["share"][1])
            if key not in self._waited:
                torch.cuda.current_stream(self._dev).wait_event(
                    self._event(loc["ready"][which], loc["share"][0]))
                self._waited.add(key)
        o = loc["offs"][index]
        v = base[o:o + numel * torch.empty(0, dtype=dtype).element_size()].view(dtype)
        if v.device != self._dev:
            v = v.to(self._dev, non_blocking=True)
        return v

    def _peer_buffer(self, share: list) -> torch.Tensor:
        key = f"{share[1]}:{share[3]}"
        t = self._peer_bufs.get(key)
        if t is None:
            dev, h, size, off, rh, roff, eh, sync = share
            st = torch.UntypedStorage._new_shared_cuda(dev, _unb64(h), size, off, _unb64(rh), roff,
                                                       _unb64(eh) if eh else None, sync)
            t = torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", dev)).set_(st)
            self._peer_bufs[key] = t
        return t

    def note_peers(self, recs: list[dict], me: int) -> None:
        for r, rec in enumerate(recs):
            if r != me and rec.get("loc", {}).get("cuda"):
                self._peer_done[r] = (rec["loc"]["share"][0], rec["loc"]["done"])

    def finish(self) -> None:
        if self._seq >= 0:
            self._done[self._seq % 2].record(torch.cuda.current_stream(self._dev))

    # ---- reductions ------------------------------------------------------------------------
    def reduce_into(self, out, inputs, kind, op, order, rank, root):
        n = len(inputs)
        dtype = out.dtype
        if dtype not in _DT:  # integers: any order gives the same bits
            st = torch.stack([x[: out.numel()] if kind != "reduce_scatter" else
                              x[rank * out.numel():(rank + 1) * out.numel()] for x in inputs])
            r = {"sum": st.sum(0), "avg": torch.div(st.sum(0), n, rounding_mode="trunc"),
                 "max": st.amax(0), "min": st.amin(0), "prod": st.prod(0)}[op]
            out.copy_(r.to(dtype))
            return
        if op == "avg":
            s = torch.tensor(1.0 / n, dtype=dtype).item()  # NCCL's PreMulSum scalar
            inputs = [x * s for x in inputs]
            op = "sum"
        fn = {"sum": torch.add, "max": torch.fmax, "min": torch.fmin, "prod": torch.mul}[op]

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

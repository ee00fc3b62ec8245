"""The `tpcheck` torch.distributed backend: a Python ProcessGroup, one process per rank.

Every collective is one step of the group: each rank
  1. writes its contribution (the tensors the others need) into its exchange buffer
     (shared memory for CPU tensors, _shm.py; a CUDA IPC buffer for GPU tensors,
     _cuda_ipc.py),
  2. publishes a record (call number, kind, signature = op/dtype/shapes, buffer location,
     call site) in its record file in shared memory (_records.py; the files' names go
     through the group's store once),
  3. waits for every rank's record of the same call number, checks that all ranks called
     the same collective with the same signature (else an error naming both calls), and
  4. computes its own output from the others' buffers, read in place: reductions through
     the compiled ring model (_tpcheck.ring_reduce: NCCL's Ring/Simple order and per-step
     rounding, or rank order; on a GPU the device group's kernel, with a large all-reduce
     split into one share per rank and a second round of flags, _cuda_ipc.py), gathers
     and copies by plain copies.
While it waits it watches the launch's events file, where the launcher (`python -m tpcheck
emulate`) records ranks that exited or were killed: a rank waiting on one that is gone
raises an error naming it instead of waiting for the timeout.

Collectives complete before they return (Work objects are already completed; async_op
only changes the return value), except `irecv`, whose Work receives in `wait()`.
Point-to-point messages go through the store (a host copy; TP code rarely sends).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed import ReduceOp
from torch.futures import Future

from .._emulate import mark_initialized, read_events
from ._records import FLAG_DONE, FLAG_REDUCED, decode_record, encode_record
from ._shm import ShmExchange


_RING_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16}
_COPY_ONLY_DTYPES = {
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
    torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2,
}
_INT_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool}

_OPS = {
    ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
    ReduceOp.PRODUCT: "prod",
}

_groups = 0  # groups made by this process (names their buffers)


def _zero_copy() -> bool:
    """Whether CUDA collectives lend the caller's tensors to the peers instead of staging
    copies (_cuda_ipc.py). By default only under MPS (`emulate --mps` sets
    CUDA_MPS_PIPE_DIRECTORY): measured on one H200 at TP 8 (bench/RESULTS.md, 2026-12-04),
    zero copy halves the all-reduce's time under MPS, but without MPS, where the ranks take
    turns on the GPU, its extra round makes the sequence-parallel step slower (3.1x TP 1
    against 2.4x staged). TPCHECK_EMULATE_ZERO_COPY=1 or 0 decides it."""
    env = os.environ.get("TPCHECK_EMULATE_ZERO_COPY")
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise EmulateError(f"TPCHECK_EMULATE_ZERO_COPY={env!r}: expected 0 or 1")
    return bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))


def _split_bytes() -> int:
    """The size from which a CUDA all-reduce is split into per-rank shares (bytes of the
    largest tensor). TPCHECK_EMULATE_SPLIT_BYTES overrides it (0: always; the GPU tests
    use it to run both paths on every size)."""
    return int(os.environ.get("TPCHECK_EMULATE_SPLIT_BYTES", 1 << 20))


class EmulateError(RuntimeError):
    """A collective the tpcheck backend refuses or cannot finish (names the cause)."""


def comm_order() -> str:
    order = os.environ.get("TPCHECK_COMM_ORDER", "nccl-ring")
    if order not in ("nccl-ring", "rank"):
        raise EmulateError(f"TPCHECK_COMM_ORDER={order!r}: expected nccl-ring or rank")
    return order


_SKIP_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
              os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _call_site() -> str:
    """The first frame outside torch and tpcheck: where the user called the collective."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP_DIRS) and not fn.startswith("<frozen"):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} on {t.device}"


def _done(result=None):
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class _LazyWork(dist.Work):
    """Work of an irecv: the receive runs in wait() (so isend/irecv pairs cannot deadlock)."""

    def __init__(self, fn, tensors):
        super().__init__()
        self._fn, self._tensors = fn, tensors

    def wait(self, timeout=None):
        if self._fn is not None:
            fn, self._fn = self._fn, None
            fn()
        return True

    def is_completed(self):
        return self._fn is None

    def is_success(self):
        return self._fn is None

    def get_future(self):
        self.wait()
        fut = Future()
        fut.set_result(self._tensors)
        return fut


class TpcheckProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: list[int] | None = None, group_id: str = ""):
        super().__init__(rank, size)
        global _groups
        _groups += 1
        self._store = store
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._global = list(global_ranks) if global_ranks else list(range(size))
        self._gid = group_id or str(_groups)
        self._seq = 0
        self._p2p_sent: dict[tuple[int, int], int] = {}
        self._p2p_recv: dict[tuple[int, int], int] = {}
        self._order = comm_order()
        self._shm = ShmExchange(f"g{_groups}")
        self._cuda = None  # _cuda_ipc.CudaExchange, made on the first CUDA tensor
        self._records = None  # _records.RecordFile, made at the first collective
        self._trace = None
        tdir = os.environ.get("TPCHECK_TRACE_DIR")
        if tdir:
            os.makedirs(tdir, exist_ok=True)
            g = self._global[rank]
            self._trace = open(os.path.join(tdir, f"comm.rank{g}.jsonl"), "a", buffering=1)
        if "TPCHECK_EMULATE_JOB" not in os.environ:
            # Outside the launcher (which removes the job's files when every rank is done),
            # remove them at exit; a peer still reading then may fail (never under emulate).
            import atexit

            atexit.register(self._shm.close)

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

    # ---- the step --------------------------------------------------------------------------
    def _who(self, r: int) -> str:
        g = self._global[r]
        return f"rank {g}" if g == r else f"rank {g} (rank {r} of group {self._global})"

    def _check_events(self, waiting_for: str):
        for ev in read_events():
            if ev.get("rank") in self._global and ev.get("rank") != self._global[self._rank]:
                raise EmulateError(f"rank {ev['rank']} {ev['what']} while rank "
                                   f"{self._global[self._rank]} waits in {waiting_for}")

    def _check(self, keys: list[str], what: str) -> bool:
        try:
            return self._store.check(keys)
        except (dist.DistError, RuntimeError) as e:
            # The store is gone (the launcher's, or rank 0's without it): say which rank
            # ended (the launcher's events come within its 20 ms poll) if one did.
            for _ in range(50):
                self._check_events(what)
                time.sleep(0.02)
            raise EmulateError(f"lost the rendezvous store while rank "
                               f"{self._global[self._rank]} waits in {what}: {e}") from e

    def _wait(self, keys: list[str], what: str):
        """Polls the store until every key exists (a timed-out store.wait logs a C++
        warning each time, so it is not used)."""
        self._poll(lambda: self._check(keys, what), what,
                   lambda: ", ".join(k for k in keys if not self._store.check([k])))

    def _poll(self, done, what: str, missing):
        """Calls done() until it returns true, watching the launcher's events meanwhile
        (every 0.2 s); after the group's timeout, an error naming missing()'s answer. It
        spins for the first 0.1 ms (a peer's record usually arrives within it), then sleeps
        a little between polls, and 1 ms once a peer is 10 ms late."""
        start = time.monotonic()
        deadline = start + self._timeout.total_seconds()
        next_events = start + 0.2
        while not done():
            now = time.monotonic()
            if now > next_events:
                self._check_events(what)
                next_events = now + 0.2
            if now > deadline:
                raise EmulateError(f"timeout ({self._timeout}) in {what}: no record from "
                                   f"{missing()}")
            late = now - start
            if late > 0.01:
                time.sleep(0.001)
            elif late > 1e-4:
                time.sleep(2e-5)

    def _record_file(self):
        """This rank's RecordFile, its peers' mapped; the file names go through the store
        once, at the group's first collective."""
        if self._records is None:
            from ._records import RecordFile

            rf = RecordFile(f"g{self._gid}")
            self._store.set(f"tpcheck/records/{self._rank}", rf.path)
            keys = [f"tpcheck/records/{r}" for r in range(self._size)]
            self._wait(keys, "the group's first collective (exchanging record files)")
            rf.open_peers([b.decode() for b in self._store.multi_get(keys)], self._rank)
            self._records = rf
            if "TPCHECK_EMULATE_JOB" not in os.environ:  # the launcher removes the job's files
                import atexit

                atexit.register(rf.close)
        return self._records

    def _exchange_records(self, seq: int, rec: dict, what: str) -> list[dict]:
        """Publishes this rank's record of call `seq`; returns every rank's."""
        rf = self._record_file()
        payload = encode_record(rec)
        if not rf.fits(payload):
            key = f"tpcheck/big/{seq}/{self._rank}"
            self._store.set(key, payload)
            payload = encode_record({"seq": seq, "store": key})
        rf.publish(seq, payload)
        recs: list = [None] * self._size

        def all_there():
            for r in range(self._size):
                if recs[r] is None:
                    recs[r] = rf.read(r, seq)
                    if recs[r] is None:
                        return False
            return True

        self._poll(all_there, what,
                   lambda: ", ".join(self._who(r) for r in range(self._size) if recs[r] is None))
        for r, got in enumerate(recs):
            if "store" in got:
                recs[r] = decode_record(self._store.get(got["store"]))
        return recs

    def _wait_flag(self, kind: int, seq: int, what: str):
        """A second round: every rank set flag `kind` (_records.FLAG_*) of call `seq`."""
        rf = self._record_file()
        rf.set_flag(kind, seq)
        self._poll(lambda: all(rf.flag(kind, r, seq) for r in range(self._size)),
                   f"{what} (call #{seq} of the group, its second round)",
                   lambda: ", ".join(self._who(r) for r in range(self._size)
                                     if not rf.flag(kind, r, seq)))

    def _step(self, kind: str, sig: dict, contrib: list[torch.Tensor], extra=None, device=None,
              put_options=None):
        """Publishes this rank's part of collective `kind`; returns (every rank's record,
        the exchange holding the data). `device`: the tensors' device when this rank
        contributes none (a broadcast's receivers); put_options: the CUDA exchange's
        staging options (scale, results)."""
        seq = self._seq
        self._seq += 1
        dev = device
        for t in contrib:
            dev = t.device
        if kind != "barrier":
            sig = dict(sig, device=dev.type if dev is not None else "cpu")
        ex = self._exchange(dev)
        if put_options is None and ex is not self._shm:
            put_options = {"zero_copy": _zero_copy()}
        loc = ex.put(seq, contrib, **(put_options or {}))
        desc = self._format_call(kind, sig)
        rec = {"seq": seq, "kind": kind, "sig": sig, "desc": desc, "loc": loc, "extra": extra,
               "at": _call_site()}
        recs = self._exchange_records(seq, rec, f"{desc} (call #{seq} of the group, at {rec['at']})")
        if ex is not self._shm:
            ex.note_peers(recs, self._rank)
        for r, other in enumerate(recs):
            if other["kind"] != kind or other["sig"] != sig:
                raise EmulateError(
                    f"mismatched collectives at call #{seq} of group {self._global}: "
                    f"{self._who(self._rank)} called {desc} at {rec['at']}, but "
                    f"{self._who(r)} called {other['desc']} at {other['at']}")
        self._last = (seq, rec)
        if self._trace is not None:
            nbytes = sum(t.numel() * t.element_size() for t in contrib)
            self._trace.write(json.dumps({
                "seq": seq, "group": self._global, "kind": kind, "sig": sig,
                "bytes": nbytes, "order": self._order if sig.get("op") else None,
                "algorithm": "ring/simple" if sig.get("op") and self._order == "nccl-ring"
                else ("rank-order" if sig.get("op") else "copy"),
                "at": rec["at"]}) + "\n")
        return recs, ex

    @staticmethod
    def _format_call(kind, sig):
        parts = [f"{d}{s}" for d, s in zip(sig.get("dtypes", []), sig.get("shapes", []))]
        args = ", ".join(parts)
        for k in ("op", "root"):
            if k in sig:
                args += f", {k}={sig[k]}"
        if sig.get("device") not in (None, "cpu"):
            args += f", on {sig['device']}"
        return f"{kind}({args})"

    def _exchange(self, dev):
        if dev is None or dev.type == "cpu":
            return self._shm
        if dev.type == "cuda":
            if self._cuda is None:
                from ._cuda_ipc import CudaExchange

                self._cuda = CudaExchange(self, dev)
                import atexit

                atexit.register(self._release_cuda)
            return self._cuda
        raise EmulateError(f"tensors on {dev} are not supported (cpu or cuda)")

    def _release_cuda(self):
        """At exit: every rank unmaps the others' staging buffers, waits (at most 10 s)
        until all have, then frees its own (_cuda_ipc.py): freeing memory a peer still
        has mapped, or may still be reading, is not safe."""
        try:
            self._cuda.release_peers()
            self._store.set(f"tpcheck/exit/{self._rank}", "1")
            keys = [f"tpcheck/exit/{r}" for r in range(self._size)]
            saved, self._timeout = self._timeout, datetime.timedelta(seconds=10)
            try:
                self._wait(keys, "exit (releasing the CUDA staging buffers)")
            finally:
                self._timeout = saved
            self._cuda.free_own()
        except Exception:  # noqa: BLE001 - a peer that died or a store that is gone: exit anyway
            pass

    # ---- argument checks -------------------------------------------------------------------
    def _accept(self, t: torch.Tensor, what: str, reduce: bool = False):
        if not isinstance(t, torch.Tensor):
            raise EmulateError(f"{what}: expected a tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise EmulateError(f"{what}: layout {t.layout} is not supported (strided only): "
                               f"{_describe(t)}")
        if t.device.type not in ("cpu", "cuda"):
            raise EmulateError(f"{what}: device {t.device} is not supported (cpu, cuda): "
                               f"{_describe(t)}")
        if reduce and t.dtype not in _RING_DTYPES and t.dtype not in _INT_DTYPES:
            raise EmulateError(f"{what}: dtype {t.dtype} cannot be reduced by the tpcheck "
                               f"backend (float64/32/16, bfloat16, integers): {_describe(t)}")
        if not reduce and t.dtype not in _RING_DTYPES and t.dtype not in _COPY_ONLY_DTYPES:
            raise EmulateError(f"{what}: dtype {t.dtype} is not supported: {_describe(t)}")

    def _op(self, op, what) -> str:
        key = getattr(op, "op", op)
        for k, v in _OPS.items():
            if key == k:
                return v
        raise EmulateError(f"{what}: reduce op {op} is not supported (SUM, AVG, MAX, MIN, "
                           f"PRODUCT)")

    @staticmethod
    def _sig(tensors, **kw):
        d = {"dtypes": [str(t.dtype).replace("torch.", "") for t in tensors],
             "shapes": [list(t.shape) for t in tensors]}
        d.update(kw)
        return d

    # ---- reductions ------------------------------------------------------------------------
    def _reduce_into(self, out_flat, inputs, count, kind, op, root=0):
        """out_flat = this rank's result of `kind` over `inputs`, every rank's input of
        `count` elements (the exchange's inputs(): flat tensors; on CUDA, addresses for
        the kernel's reductions)."""
        if out_flat.numel() == 0:
            return
        if out_flat.device.type == "cuda":
            self._cuda.reduce_into(out_flat, inputs, count, kind, op, self._order, self._rank,
                                   root)
            return
        if out_flat.dtype in _RING_DTYPES:
            from .. import _tpcheck

            _tpcheck.ring_reduce(inputs, out_flat, kind, op, self._order, self._rank, root)
            return
        # Integers: every order gives the same bits (wrap-around arithmetic is associative).
        n = out_flat.numel()
        if kind == "reduce_scatter":
            inputs = [x[self._rank * n:(self._rank + 1) * n] for x in inputs]
        st = torch.stack(list(inputs)).to(torch.int64 if out_flat.dtype != torch.bool else torch.bool)
        if op in ("sum", "avg"):
            r = st.sum(0) if st.dtype != torch.bool else st.any(0)
            if op == "avg":
                r = torch.div(r, self._size, rounding_mode="trunc")
        elif op == "max":
            r = st.amax(0)
        elif op == "min":
            r = st.amin(0)
        else:
            r = st.prod(0) if st.dtype != torch.bool else st.all(0)
        out_flat.copy_(r.to(out_flat.dtype))

    def _out(self, t):
        """A flat tensor to write t's result into, and a finisher copying it back."""
        if t.is_contiguous():
            return t.view(-1), (lambda: None)
        tmp = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        return tmp, (lambda: t.copy_(tmp.view(t.shape)))

    def _put_options(self, tensors, op, split=False):
        """CUDA options for the kernel's reductions: sums lend the tensors themselves (zero
        copy) where they can; AVG is staged times 1/N (rounded to the dtype, NCCL's
        PreMulSum); a split all-reduce that stages has a result region too."""
        if not tensors or tensors[0].device.type != "cuda" or tensors[0].dtype not in _RING_DTYPES:
            return None
        scale = torch.tensor(1.0 / self._size, dtype=tensors[0].dtype).item() if op == "avg" else None
        return {"scale": scale, "results": split, "zero_copy": op == "sum" and _zero_copy()}

    def _split(self, tensors, kind, op) -> bool:
        """A staged CUDA all-reduce big enough to be split into one share per rank (below
        it, one more round costs more than every rank folding all)."""
        return (kind == "all_reduce" and self._size > 1 and op in ("sum", "avg")
                and all(t.device.type == "cuda" and t.dtype in _RING_DTYPES for t in tensors)
                and len({t.dtype for t in tensors}) == 1
                and max(t.numel() * t.element_size() for t in tensors) >= _split_bytes())

    def _all_reduce_list(self, tensors, opts, kind="all_reduce", root=0):
        op = self._op(getattr(opts, "reduceOp", ReduceOp.SUM), kind)
        for i, t in enumerate(tensors):
            self._accept(t, f"{kind} tensor {i}", reduce=True)
        sig = self._sig(tensors, op=op) if kind == "all_reduce" else self._sig(tensors, op=op, root=root)
        split = self._split(tensors, kind, op)
        put_options = self._put_options(tensors, op, split) if op in ("sum", "avg") else None
        recs, ex = self._step(kind, sig, tensors, put_options=put_options)
        seq = self._last[0]
        what = self._format_call(kind, sig)
        cuda = ex is not self._shm
        if (cuda and kind == "all_reduce" and op == "sum" and tensors[0].dtype in _RING_DTYPES
                and ex.in_place_ok(recs)):
            ex.all_reduce_in_place(tensors, recs, self._rank, self._order)
            self._sync_cuda(ex, recs)
            return _done(tensors)
        if split and not ex.zero_copy_in(recs):
            outs = [self._out(t) for t in tensors]
            ex.split_all_reduce([o for o, _ in outs], recs, self._rank, self._order,
                                lambda: self._wait_flag(FLAG_REDUCED, seq, what))
            for _, fin in outs:
                fin()
            self._sync_cuda(ex, recs)
            return _done(tensors)
        # Every rank folds all elements. A lent tensor (zero copy) is read by the peers until
        # the second round: the result waits in a copy until then.
        lent = cuda and ex.zero_copy_in(recs)
        pending = []
        for i, t in enumerate(tensors):
            if kind == "reduce" and self._rank != root:
                continue
            ins = ex.inputs(recs, i, t.dtype, t.numel(), op)
            if lent:
                tmp = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
                self._reduce_into(tmp, ins, t.numel(), kind, op, root)
                pending.append((t, tmp))
            else:
                out, fin = self._out(t)
                self._reduce_into(out, ins, t.numel(), kind, op, root)
                fin()
        self._sync_cuda(ex, recs)
        for t, tmp in pending:
            t.copy_(tmp.view(t.shape))
        return _done(tensors)

    def _sync_cuda(self, ex, recs):
        if ex is not self._shm:
            seq, rec = self._last
            ex.finish(recs, lambda: self._wait_flag(FLAG_DONE, seq, f"the end of {rec['desc']}"))

    def allreduce(self, tensors, opts=None):
        return self._all_reduce_list(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._all_reduce_list(tensors, opts)

    def reduce(self, tensors, opts=None):
        return self._all_reduce_list(tensors, opts, kind="reduce", root=getattr(opts, "rootRank", 0))

    def _reduce_scatter_flat(self, out, inp, opts, kind):
        op = self._op(getattr(opts, "reduceOp", ReduceOp.SUM), kind)
        self._accept(out, f"{kind} output", reduce=True)
        self._accept(inp, f"{kind} input", reduce=True)
        if inp.numel() != out.numel() * self._size or inp.dtype != out.dtype:
            raise EmulateError(f"{kind}: input {_describe(inp)} is not {self._size} x the "
                               f"output {_describe(out)}")
        recs, ex = self._step(kind, self._sig([inp], op=op), [inp],
                              put_options=self._put_options([inp], op) if op in ("sum", "avg") else None)
        ins = ex.inputs(recs, 0, inp.dtype, inp.numel(), op)
        o, fin = self._out(out)
        self._reduce_into(o, ins, inp.numel(), "reduce_scatter", op)
        fin()
        self._sync_cuda(ex, recs)

    def _reduce_scatter_base(self, out, inp, opts=None):
        self._reduce_scatter_flat(out, inp, opts, "reduce_scatter_tensor")
        return _done([out])

    def reduce_scatter(self, outs, in_lists, opts=None):
        for out, ins in zip(outs, in_lists):
            if len(ins) != self._size:
                raise EmulateError(f"reduce_scatter: {len(ins)} inputs for {self._size} ranks")
            for t in ins:
                if t.shape != out.shape or t.dtype != out.dtype:
                    raise EmulateError(f"reduce_scatter: input {_describe(t)} differs from "
                                       f"the output {_describe(out)} (NCCL needs equal blocks)")
            self._reduce_scatter_flat(out, torch.cat([t.reshape(-1) for t in ins]), opts,
                                      "reduce_scatter")
        return _done(outs)

    def reduce_scatter_tensor_coalesced(self, outs, ins, opts=None):
        for o, i in zip(outs, ins):
            self._reduce_scatter_flat(o, i, opts, "reduce_scatter_tensor")
        return _done(outs)

    # ---- data movement ---------------------------------------------------------------------
    def _gather_flat(self, out, inp, kind):
        self._accept(out, f"{kind} output")
        self._accept(inp, f"{kind} input")
        n = inp.numel()
        if out.numel() != n * self._size or out.dtype != inp.dtype:
            raise EmulateError(f"{kind}: output {_describe(out)} is not {self._size} x the "
                               f"input {_describe(inp)}")
        recs, ex = self._step(kind, self._sig([inp]), [inp])
        o, fin = self._out(out)
        for r, rec in enumerate(recs):
            o[r * n:(r + 1) * n].copy_(ex.view(rec["loc"], 0, inp.dtype, n))
        fin()
        self._sync_cuda(ex, recs)

    def _allgather_base(self, out, inp, opts=None):
        self._gather_flat(out, inp, "all_gather_into_tensor")
        return _done([out])

    def allgather_into_tensor_coalesced(self, outs, ins, opts=None):
        for o, i in zip(outs, ins):
            self._gather_flat(o, i, "all_gather_into_tensor")
        return _done(outs)

    def allgather(self, out_lists, ins, opts=None):
        for i, t in enumerate(ins):
            self._accept(t, f"all_gather input {i}")
            if len(out_lists[i]) != self._size:
                raise EmulateError(f"all_gather: {len(out_lists[i])} outputs for {self._size} ranks")
        recs, ex = self._step("all_gather", self._sig(ins), ins)
        for i, outs in enumerate(out_lists):
            for r, (o, rec) in enumerate(zip(outs, recs)):
                if o.numel() != ins[i].numel() or o.dtype != ins[i].dtype:
                    raise EmulateError(f"all_gather: output {r} {_describe(o)} does not fit "
                                       f"the input {_describe(ins[i])}")
                o.copy_(ex.view(rec["loc"], i, o.dtype, o.numel()).view(o.shape))
        self._sync_cuda(ex, recs)
        return _done(out_lists)

    def allgather_coalesced(self, out_lists, ins, opts=None):
        return self.allgather(out_lists, ins, opts)

    def broadcast(self, tensors, opts=None):
        root = getattr(opts, "rootRank", 0)
        for i, t in enumerate(tensors):
            self._accept(t, f"broadcast tensor {i}")
        recs, ex = self._step("broadcast", self._sig(tensors, root=root),
                              tensors if self._rank == root else [],
                              device=tensors[0].device if tensors else None)
        if self._rank != root:
            for i, t in enumerate(tensors):
                t.copy_(ex.view(recs[root]["loc"], i, t.dtype, t.numel()).view(t.shape))
        self._sync_cuda(ex, recs)
        return _done(tensors)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        self._accept(out, "all_to_all_single output")
        self._accept(inp, "all_to_all_single input")
        n = self._size
        rows_in = inp.shape[0] if inp.dim() else 1
        row = inp.numel() // rows_in if rows_in else 0
        in_splits = list(in_splits) or [rows_in // n] * n
        out_rows = out.shape[0] if out.dim() else 1
        out_splits = list(out_splits) or [out_rows // n] * n
        sig = {"dtypes": [str(inp.dtype).replace("torch.", "")], "row": list(inp.shape[1:])}
        recs, ex = self._step("all_to_all_single", sig, [inp], extra=in_splits)
        o, fin = self._out(out)
        pos = 0
        for j, rec in enumerate(recs):
            theirs = rec["extra"]
            if theirs[self._rank] != out_splits[j]:
                raise EmulateError(
                    f"all_to_all_single: {self._who(j)} sends {theirs[self._rank]} rows to "
                    f"{self._who(self._rank)}, which expects {out_splits[j]}")
            start = sum(theirs[:self._rank]) * row
            cnt = theirs[self._rank] * row
            src = ex.view(rec["loc"], 0, inp.dtype, sum(theirs) * row)
            o[pos:pos + cnt].copy_(src[start:start + cnt])
            pos += cnt
        fin()
        self._sync_cuda(ex, recs)
        return _done([out])

    def alltoall(self, outs, ins, opts=None):
        for i, t in enumerate(ins):
            self._accept(t, f"all_to_all input {i}")
        sig = {"dtypes": [str(t.dtype).replace("torch.", "") for t in ins]}
        recs, ex = self._step("all_to_all", sig, ins, extra=[list(t.shape) for t in ins])
        for j, (o, rec) in enumerate(zip(outs, recs)):
            shape = rec["extra"][self._rank]
            if list(o.shape) != shape:
                raise EmulateError(f"all_to_all: {self._who(j)} sends {shape} to "
                                   f"{self._who(self._rank)}, whose output {j} is {_describe(o)}")
            o.copy_(ex.view(rec["loc"], self._rank, o.dtype, o.numel()).view(o.shape))
        self._sync_cuda(ex, recs)
        return _done(outs)

    def gather(self, out_lists, ins, opts=None):
        root = getattr(opts, "rootRank", 0)
        recs, ex = self._step("gather", self._sig(ins, root=root), ins)
        if self._rank == root:
            for r, (o, rec) in enumerate(zip(out_lists[0], recs)):
                o.copy_(ex.view(rec["loc"], 0, o.dtype, o.numel()).view(o.shape))
        self._sync_cuda(ex, recs)
        return _done(out_lists)

    def scatter(self, outs, in_lists, opts=None):
        root = getattr(opts, "rootRank", 0)
        mine = in_lists[0] if self._rank == root else []
        recs, ex = self._step("scatter", self._sig(outs, root=root), mine, device=outs[0].device)
        o = outs[0]
        o.copy_(ex.view(recs[root]["loc"], self._rank, o.dtype, o.numel()).view(o.shape))
        self._sync_cuda(ex, recs)
        return _done(outs)

    def barrier(self, opts=None):
        self._step("barrier", {}, [])
        return _done([])

    # ---- point to point --------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        for i, t in enumerate(tensors):
            self._accept(t, f"send tensor {i}")
        k = (dst, tag)
        n = self._p2p_sent.get(k, 0)
        self._p2p_sent[k] = n + 1
        payload = {"shapes": [list(t.shape) for t in tensors],
                   "dtypes": [str(t.dtype) for t in tensors], "at": _call_site()}
        head = json.dumps(payload).encode()
        body = b"".join(t.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy().tobytes()
                        for t in tensors)
        self._store.set(f"tpcheck/p2p/{self._rank}>{dst}/{tag}/{n}",
                        len(head).to_bytes(8, "little") + head + body)
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        for i, t in enumerate(tensors):
            self._accept(t, f"recv tensor {i}")
        k = (src, tag)
        n = self._p2p_recv.get(k, 0)
        self._p2p_recv[k] = n + 1
        key = f"tpcheck/p2p/{src}>{self._rank}/{tag}/{n}"
        at = _call_site()

        def receive():
            self._wait([key], f"recv from {self._who(src)} (tag {tag}) at {at}")
            data = self._store.get(key)
            self._store.delete_key(key)
            hl = int.from_bytes(data[:8], "little")
            head = json.loads(data[8:8 + hl])
            shapes = [list(t.shape) for t in tensors]
            dtypes = [str(t.dtype) for t in tensors]
            if head["shapes"] != shapes or head["dtypes"] != dtypes:
                raise EmulateError(
                    f"send/recv mismatch: {self._who(src)} sent {head['dtypes']} "
                    f"{head['shapes']} at {head['at']}, {self._who(self._rank)} receives "
                    f"{dtypes} {shapes} at {at}")
            off = 8 + hl
            for t in tensors:
                nb = t.numel() * t.element_size()
                buf = torch.frombuffer(bytearray(data[off:off + nb]), dtype=torch.uint8) if nb else \
                    torch.empty(0, dtype=torch.uint8)
                t.copy_(buf.view(t.dtype).view(t.shape))
                off += nb

        return _LazyWork(receive, tensors)

    def recv_anysource(self, tensors, tag=0):
        raise EmulateError("recv from any source is not supported by the tpcheck backend")


def _create(opts, backend_options=None):
    """The backend's creator (extended API: gets the global ranks of the group)."""
    global_ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
    pg = TpcheckProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             global_ranks or None, str(getattr(opts, "group_id", "") or ""))
    mark_initialized(pg._global[opts.group_rank])
    return pg


def register() -> None:
    if "tpcheck" not in dist.Backend.backend_list:
        dist.Backend.register_backend("tpcheck", _create, extended_api=True,
                                      devices=["cpu", "cuda"])

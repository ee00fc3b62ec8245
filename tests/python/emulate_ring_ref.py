"""An independent numpy model of NCCL's ring collectives (one channel, Simple protocol), for
the emulate tests. Written from NCCL's published algorithm (src/device/
all_reduce.h runRing, reduce_scatter.h, reduce.h, src/enqueue.cc; docs/EMULATE.md), not
from tpcheck's C++: the ring is simulated step by step with messages, as the GPUs run it.

  all-reduce of `count` elements: loops of N*C elements (C = 2 MiB / element size); in the
  last, partial loop the chunk is alignUp(ceil(rem / N), 16 / element size). Reduce-scatter
  phase: at step s rank r sends chunk (r - 1 - s) mod N to r + 1, which stores
  round(received + own). All-gather phase: rank r sends chunk (r - s) mod N, kept as is.
  reduce-scatter: the same reduce phase over N equal blocks; rank r keeps block r.
  reduce (root): a chain root+1 -> root+2 -> ... -> root, each adding its own input.
  avg: NCCL's PreMulSum: every input times round(1/N) (rounded to the dtype), then summed.
  rank order (every tpcheck group's, docs/RUNNING.md): ranks 0, 1, ..., N-1 added in f32
  (f64 for f64 inputs), rounded once to the dtype at the end.
Rounding: f32/f16 through numpy's own types (correctly rounded); bf16 is held in float32
and rounded to nearest even on its 16 high bits after every step.
"""

import numpy as np

CHUNK_BYTES = 2 << 20


def bf16_round(x):
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


class Fmt:
    """Arithmetic in one of f32 / f16 / bf16 (values held as np.float32 for bf16)."""

    def __init__(self, name):
        self.name = name
        self.size = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2}[name]

    def rnd(self, x):
        if self.name == "f64":
            return np.asarray(x, np.float64)
        if self.name == "f32":
            return np.asarray(x, np.float32)
        if self.name == "f16":
            return np.asarray(np.asarray(x, np.float32), np.float16)
        return bf16_round(x)

    def op(self, name, a, b):
        if name in ("sum", "avg"):
            return self.rnd(a.astype(np.float64) + b.astype(np.float64))
        if name == "prod":
            return self.rnd(a.astype(np.float64) * b.astype(np.float64))
        if name == "max":
            return np.fmax(a, b)
        return np.fmin(a, b)


def _pre(fmt, op, xs):
    if op != "avg":
        return [fmt.rnd(x) for x in xs]
    s = fmt.rnd(np.float64(1.0) / len(xs))
    return [fmt.rnd(fmt.rnd(x).astype(np.float64) * np.float64(s)) for x in xs]


def _reduce_phase(fmt, op, acc, own, pieces):
    n = len(acc)
    for s in range(n - 1):
        msgs = []
        for r in range(n):
            k = (r - 1 - s) % n
            b, e = pieces[k]
            msgs.append((k, acc[r][b:e].copy()))
        for r, (k, m) in enumerate(msgs):
            to = (r + 1) % n
            b, e = pieces[k]
            acc[to][b:e] = fmt.op(op, m, own[to][b:e])


def _gather_phase(acc, pieces):
    n = len(acc)
    for s in range(n - 1):
        msgs = []
        for r in range(n):
            k = (r - s) % n
            b, e = pieces[k]
            msgs.append((k, acc[r][b:e].copy()))
        for r, (k, m) in enumerate(msgs):
            b, e = pieces[k]
            acc[(r + 1) % n][b:e] = m


def all_reduce(xs, fmt_name, op="sum", chunk_bytes=CHUNK_BYTES):
    """Every rank's result of the ring all-reduce of the flat arrays xs."""
    fmt = Fmt(fmt_name)
    n = len(xs)
    own = _pre(fmt, op, xs)
    acc = [o.copy() for o in own]
    count = own[0].size
    c = max(1, chunk_bytes // fmt.size)
    align = max(1, 16 // fmt.size)
    start = 0
    while start < count:
        rem = count - start
        chunk = c
        if rem < n * c:
            chunk = (-(-rem // n) + align - 1) // align * align
        pieces = [(start + min(k * chunk, rem), start + min((k + 1) * chunk, rem)) for k in range(n)]
        _reduce_phase(fmt, op, acc, own, pieces)
        _gather_phase(acc, pieces)
        start += n * c
    return acc


def reduce_scatter(xs, fmt_name, op="sum"):
    fmt = Fmt(fmt_name)
    n = len(xs)
    own = _pre(fmt, op, xs)
    acc = [o.copy() for o in own]
    blk = own[0].size // n
    _reduce_phase(fmt, op, acc, own, [(k * blk, (k + 1) * blk) for k in range(n)])
    return [acc[r][r * blk:(r + 1) * blk] for r in range(n)]


def reduce(xs, fmt_name, op, root):
    fmt = Fmt(fmt_name)
    n = len(xs)
    own = _pre(fmt, op, xs)
    acc = own[(root + 1) % n].copy()
    for s in range(2, n + 1):
        acc = fmt.op(op, acc, own[(root + s) % n])
    return acc


def rank_order(xs, fmt_name, op="sum"):
    """Ranks 0, 1, ..., N-1 accumulated in f32 (f64 for f64), one rounding to the dtype."""
    fmt = Fmt(fmt_name)
    acc_fmt = Fmt("f64" if fmt_name == "f64" else "f32")
    own = [acc_fmt.rnd(x) for x in _pre(fmt, op, xs)]
    acc = own[0].copy()
    for x in own[1:]:
        acc = acc_fmt.op(op, acc, x)
    return fmt.rnd(acc)


def rank_order_per_step(xs, fmt_name, op="sum"):
    """Ranks 0, 1, ..., N-1 rounded to the dtype after every addition (not tpcheck's rank
    order: the tests use it to show their inputs tell the two apart)."""
    fmt = Fmt(fmt_name)
    own = _pre(fmt, op, xs)
    acc = own[0].copy()
    for x in own[1:]:
        acc = fmt.op(op, acc, x)
    return acc

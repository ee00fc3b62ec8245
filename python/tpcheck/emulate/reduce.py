"""The reductions of the tpcheck backend: this rank's result from every rank's input, in the
order the group adds in (docs/EMULATE.md, "Numerics").

    nccl-ring   NCCL's Ring/Simple order: each chunk's sum starts at the rank after the one
                that finishes it and goes round the ring, rounded to the dtype after every
                step (the chunking: src/comm/ring_reference.h).
    rank        ranks 0, 1, ..., N-1, accumulated in f32 (f64 for f64 tensors) and rounded
                once to the dtype: the same rule as the C++ thread group and device group.

Float sums and averages run compiled code: on the CPU `_tpcheck.ring_reduce`, on a GPU the
device group's kernel (`_tpcheck.ring_fold_cuda`); AVG's inputs are scaled by 1/N rounded
to the dtype first (NCCL's PreMulSum). Max, min and product of floats on a GPU fold with one
torch op per step (torch_fold); integers with torch in any order (the bits do not depend on
it). Which kind of input each function takes: flat tensors, or for the kernel device
addresses (cuda_ipc.py passes addresses: a view per peer per call costs host time).
"""

from __future__ import annotations

import torch

from .. import _tpcheck
from .checks import FLOAT_DTYPES, dtype_label
from .protocol import NCCL_RING

KERNEL_DTYPES = {d: dtype_label(d) for d in FLOAT_DTYPES}  # torch dtype → "f32", ...
KERNEL_OPS = ("sum", "avg")
_SEGMENTS: dict = {}


def uses_kernel(dtype: torch.dtype, op: str) -> bool:
    """Whether a reduction of `dtype` with `op` runs the compiled fold (else torch_fold)."""
    return dtype in KERNEL_DTYPES and op in KERNEL_OPS


def premul(dtype: torch.dtype, n: int) -> float:
    """AVG's scale: 1/n rounded to the dtype (NCCL's PreMulSum)."""
    return torch.tensor(1.0 / n, dtype=dtype).item()


def integer_fold(out, inputs, kind: str, op: str, rank: int) -> None:
    """out = this rank's result over every rank's integer (or bool) input, flat tensors.
    Wrap-around arithmetic is associative, so any order gives NCCL's bits. bool: SUM and MAX
    are any, PRODUCT and MIN are all (AVG of bool is refused by checks.reduce_op)."""
    m = out.numel()
    lo = rank * m if kind == "reduce_scatter" else 0
    st = torch.stack([x[lo:lo + m] for x in inputs])
    if out.dtype == torch.bool:
        r = st.any(0) if op in ("sum", "max") else st.all(0)
    else:
        st = st.to(torch.int64)
        if op in ("sum", "avg"):
            r = st.sum(0)
            if op == "avg":
                r = torch.div(r, len(inputs), rounding_mode="trunc")  # NCCL's SumPostDiv
        elif op == "max":
            r = st.amax(0)
        elif op == "min":
            r = st.amin(0)
        else:
            r = st.prod(0)
    out.copy_(r.to(out.dtype))


def cpu_fold(out, inputs, kind: str, op: str, order: str, rank: int, root: int) -> None:
    """out (flat, CPU) = this rank's result of `kind` over `inputs` (every rank's, flat)."""
    if out.dtype in KERNEL_DTYPES:
        _tpcheck.ring_reduce(inputs, out, kind, op, order, rank, root)
    else:
        integer_fold(out, inputs, kind, op, rank)


def _ring_runs(m: int, n: int, dtype, kind: str, rank: int, root: int) -> list:
    """[(lo, hi, first rank)] of NCCL's ring order for this rank's m results."""
    if kind == "reduce_scatter":
        return [(0, m, (rank + 1) % n)]
    if kind == "reduce":
        return [(0, m, (root + 1) % n)]
    key = (m, n, dtype)
    segs = _SEGMENTS.get(key)
    if segs is None:
        segs = _SEGMENTS[key] = _tpcheck.ring_segments(m, n, KERNEL_DTYPES[dtype])
    return segs


def torch_fold(out, inputs, kind: str, op: str, order: str, rank: int, root: int) -> None:
    """The reductions the kernel does not do (max, min, product of floats; integers) with
    torch ops, flat tensors on any device: in the ring order one op per step, each rounding
    to the dtype; in rank order accumulated in f32 (f64) and rounded once. test_emulate_ring
    checks it against ring_reduce on the CPU."""
    if out.dtype not in KERNEL_DTYPES:
        integer_fold(out, inputs, kind, op, rank)
        return
    if op not in ("max", "min", "prod"):
        raise ValueError(f"torch_fold: op {op!r} of {out.dtype} is the kernel's (sum, avg)")
    fn = {"max": torch.fmax, "min": torch.fmin, "prod": torch.mul}[op]
    n, m = len(inputs), out.numel()
    shift = rank * m if kind == "reduce_scatter" else 0
    if order != NCCL_RING:
        acc_dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
        acc = inputs[0][shift:shift + m].to(acc_dtype)
        for x in inputs[1:]:
            acc = fn(acc, x[shift:shift + m].to(acc_dtype))
        out.copy_(acc)
        return
    for lo, hi, first in _ring_runs(m, n, out.dtype, kind, rank, root):
        acc = inputs[first][shift + lo:shift + hi]
        for s in range(1, n):
            acc = fn(acc, inputs[(first + s) % n][shift + lo:shift + hi])
        out[lo:hi].copy_(acc)


def kernel_start(kind: str, order: str, n: int, rank: int, root: int, m: int) -> tuple[int, int]:
    """(first rank, first input element) of the kernel's fold for this rank's m results:
    first = -1 is the all-reduce's per-chunk start."""
    if order != NCCL_RING:
        return 0, (rank * m if kind == "reduce_scatter" else 0)
    if kind == "reduce_scatter":
        return (rank + 1) % n, rank * m
    if kind == "reduce":
        return (root + 1) % n, 0
    return -1, 0


def kernel_fold(out: int, n_out: int, dtype, inputs: list[int], count: int, first: int,
                offset: int, order: str, stream, device: int, extra_outs=()) -> None:
    """out[j] (and each of extra_outs[j]) = the fold of inputs[*][offset + j], j < n_out, on
    `stream` of GPU `device` (addresses; `count`: the inputs' elements). first: the ring's
    first rank, -1 for the all-reduce's per-chunk start (unused in rank order)."""
    if n_out == 0:
        return
    _tpcheck.ring_fold_cuda(inputs, out, n_out, KERNEL_DTYPES[dtype], first, offset, count,
                            stream.cuda_stream, device, extra_outs=list(extra_outs), order=order)


def share(count: int, n: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s elements [lo, hi) of a split all-reduce: N near-equal runs, 256-element
    aligned (whole cache lines and vector loads for every dtype)."""
    q = (count + n - 1) // n
    q = (q + 255) // 256 * 256
    return min(rank * q, count), min((rank + 1) * q, count)

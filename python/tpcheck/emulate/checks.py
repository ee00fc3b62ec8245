"""What the tpcheck backend accepts, checked before anything is exchanged, and how a call is
named in records, messages and the trace.

A collective's signature (`signature`) is what every rank compares with every other rank's
at the same call: dtypes (tpcheck's names where tpcheck has one, "f32"; torch's otherwise,
"int64"), shapes, op, root, device. The same names appear in the ledger (ledger.py) and in
messages: "all_reduce(f32[4], op=sum)".
"""

from __future__ import annotations

import os
import sys

import torch
from torch.distributed import ReduceOp

from .._names import DTYPE_OF
from .protocol import EmulateError

# Reduced by the compiled ring model or the device group's kernel, in NCCL's order.
FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Reduced with torch ops: any order gives the same bits.
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)
# Moved, never reduced.
COPY_ONLY_DTYPES = (torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128,
                    torch.float8_e4m3fn, torch.float8_e5m2)

_OPS = ((ReduceOp.SUM, "sum"), (ReduceOp.AVG, "avg"), (ReduceOp.MAX, "max"),
        (ReduceOp.MIN, "min"), (ReduceOp.PRODUCT, "prod"))


def dtype_label(dtype: torch.dtype) -> str:
    """tpcheck's name of a dtype ("f32", "bf16", "f8e4m3"), torch's where tpcheck has none."""
    name = str(dtype).replace("torch.", "")
    return DTYPE_OF.get(name, name)


def describe(t: torch.Tensor) -> str:
    return f"{dtype_label(t.dtype)}{list(t.shape)} on {t.device}"


def accept(t, what: str, reduce: bool = False) -> None:
    """EmulateError naming `what` when the backend cannot take tensor t."""
    if not isinstance(t, torch.Tensor):
        raise EmulateError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise EmulateError(f"{what}: layout {t.layout} is not supported (strided only): "
                           f"{describe(t)}")
    if t.device.type not in ("cpu", "cuda"):
        raise EmulateError(f"{what}: device {t.device} is not supported (cpu, cuda): "
                           f"{describe(t)}")
    if reduce and t.dtype not in FLOAT_DTYPES and t.dtype not in INT_DTYPES:
        raise EmulateError(f"{what}: dtype {t.dtype} cannot be reduced by the tpcheck "
                           f"backend (float64/32/16, bfloat16, integers): {describe(t)}")
    if not reduce and t.dtype not in FLOAT_DTYPES + INT_DTYPES + COPY_ONLY_DTYPES:
        raise EmulateError(f"{what}: dtype {t.dtype} is not supported: {describe(t)}")


def accept_all(tensors, what: str, reduce: bool = False) -> None:
    for i, t in enumerate(tensors):
        accept(t, f"{what} {i}", reduce)


def reduce_op(opts, what: str, tensors=()) -> str:
    """The reduction's op name ("sum", "avg", "max", "min", "prod") from c10d's options;
    EmulateError for an op the backend does not have, or AVG of bool (NCCL refuses it too)."""
    op = getattr(opts, "reduceOp", ReduceOp.SUM)
    key = getattr(op, "op", op)
    name = next((v for k, v in _OPS if key == k), None)
    if name is None:
        raise EmulateError(f"{what}: reduce op {op} is not supported (SUM, AVG, MAX, MIN, "
                           f"PRODUCT)")
    if name == "avg" and any(getattr(t, "dtype", None) == torch.bool for t in tensors):
        raise EmulateError(f"{what}: AVG of a bool tensor has no meaning (NCCL refuses it); "
                           f"use SUM (any) or PRODUCT (all)")
    return name


def signature(tensors, **kw) -> dict:
    d = {"dtypes": [dtype_label(t.dtype) for t in tensors],
         "shapes": [list(t.shape) for t in tensors]}
    d.update(kw)
    return d


def format_call(kind: str, sig: dict) -> str:
    """ "all_reduce(f32[4], op=sum)": a call as messages name it."""
    args = ", ".join(f"{d}{s}" for d, s in zip(sig.get("dtypes", []), sig.get("shapes", [])))
    for k in ("op", "root"):
        if k in sig:
            args += f", {k}={sig[k]}"
    if sig.get("device") not in (None, "cpu"):
        args += f", on {sig['device']}"
    return f"{kind}({args})"


_SKIP_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
              os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def call_site() -> str:
    """The first frame outside torch and tpcheck: where the user called the collective."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP_DIRS) and not fn.startswith("<frozen"):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "?"


def flat_output(t: torch.Tensor):
    """A flat tensor to write t's result into, and a finisher that copies it back (a no-op
    for a contiguous t, whose flat view is t itself)."""
    if t.is_contiguous():
        return t.view(-1), _nothing
    tmp = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    return tmp, (lambda: t.copy_(tmp.view(t.shape)))


def _nothing() -> None:
    pass

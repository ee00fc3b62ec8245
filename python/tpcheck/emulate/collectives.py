"""Each collective of the tpcheck backend over the engine: argument checks, the step, this
rank's output, finish. The process group (group.py) maps c10d's calls onto these; every
function returns when the collective is complete on this rank.
"""

from __future__ import annotations

import torch

from .checks import accept, accept_all, describe, flat_output, signature
from .engine import CollectiveEngine
from .exchange import Intent
from .protocol import EmulateError


def all_reduce(eng: CollectiveEngine, tensors: list, op: str, kind: str = "all_reduce",
               root: int = 0) -> None:
    """Every tensor reduced over the ranks, in place (kind "reduce": on the root only)."""
    accept_all(tensors, f"{kind} tensor", reduce=True)
    sig = (signature(tensors, op=op) if kind == "all_reduce"
           else signature(tensors, op=op, root=root))
    call = eng.step(kind, sig, tensors, Intent(op, all_reduce=kind == "all_reduce"))
    call.exchange.reduce(call, tensors, [t.numel() for t in tensors], kind, op, root)
    eng.finish(call)


def reduce_scatter(eng: CollectiveEngine, out, inp, op: str, kind: str) -> None:
    """out = this rank's block of the reduction of every rank's flat inp (N blocks)."""
    accept(out, f"{kind} output", reduce=True)
    accept(inp, f"{kind} input", reduce=True)
    if inp.numel() != out.numel() * eng.size or inp.dtype != out.dtype:
        raise EmulateError(f"{kind}: input {describe(inp)} is not {eng.size} x the output "
                           f"{describe(out)}")
    call = eng.step(kind, signature([inp], op=op), [inp], Intent(op))
    call.exchange.reduce(call, [out], [inp.numel()], "reduce_scatter", op, 0)
    eng.finish(call)


def reduce_scatter_list(eng: CollectiveEngine, out, ins: list, op: str) -> None:
    """reduce_scatter with a list of N equal blocks per rank."""
    if len(ins) != eng.size:
        raise EmulateError(f"reduce_scatter: {len(ins)} inputs for {eng.size} ranks")
    for t in ins:
        if t.shape != out.shape or t.dtype != out.dtype:
            raise EmulateError(f"reduce_scatter: input {describe(t)} differs from the output "
                               f"{describe(out)} (NCCL needs equal blocks)")
    reduce_scatter(eng, out, torch.cat([t.reshape(-1) for t in ins]), op, "reduce_scatter")


def gather_into(eng: CollectiveEngine, out, inp, kind: str) -> None:
    """out = every rank's inp, concatenated in rank order (flat)."""
    accept(out, f"{kind} output")
    accept(inp, f"{kind} input")
    n = inp.numel()
    if out.numel() != n * eng.size or out.dtype != inp.dtype:
        raise EmulateError(f"{kind}: output {describe(out)} is not {eng.size} x the input "
                           f"{describe(inp)}")
    call = eng.step(kind, signature([inp]), [inp])
    o, fin = flat_output(out)
    for r in range(eng.size):
        o[r * n:(r + 1) * n].copy_(call.view(r, 0, inp.dtype, n))
    fin()
    eng.finish(call)


def all_gather(eng: CollectiveEngine, out_lists: list, ins: list) -> None:
    """out_lists[i][r] = rank r's ins[i]."""
    for i, t in enumerate(ins):
        accept(t, f"all_gather input {i}")
        if len(out_lists[i]) != eng.size:
            raise EmulateError(f"all_gather: {len(out_lists[i])} outputs for {eng.size} ranks")
    call = eng.step("all_gather", signature(ins), ins)
    for i, outs in enumerate(out_lists):
        for r, o in enumerate(outs):
            if o.numel() != ins[i].numel() or o.dtype != ins[i].dtype:
                raise EmulateError(f"all_gather: output {r} {describe(o)} does not fit the "
                                   f"input {describe(ins[i])}")
            o.copy_(call.view(r, i, o.dtype, o.numel()).view(o.shape))
    eng.finish(call)


def broadcast(eng: CollectiveEngine, tensors: list, root: int) -> None:
    accept_all(tensors, "broadcast tensor")
    call = eng.step("broadcast", signature(tensors, root=root),
                    tensors if eng.rank == root else [],
                    device=tensors[0].device if tensors else None)
    if eng.rank != root:
        for i, t in enumerate(tensors):
            t.copy_(call.view(root, i, t.dtype, t.numel()).view(t.shape))
    eng.finish(call)


def all_to_all_single(eng: CollectiveEngine, out, inp, out_splits: list, in_splits: list) -> None:
    """Rows of inp in in_splits[j]-row blocks to rank j; out receives out_splits[j] rows from
    rank j, in rank order (equal splits when the lists are empty)."""
    accept(out, "all_to_all_single output")
    accept(inp, "all_to_all_single input")
    n = eng.size
    rows_in = inp.shape[0] if inp.dim() else 1
    row = inp.numel() // rows_in if rows_in else 0
    in_splits = list(in_splits) or [rows_in // n] * n
    out_splits = list(out_splits) or [(out.shape[0] if out.dim() else 1) // n] * n
    sig = {"dtypes": signature([inp])["dtypes"], "row": list(inp.shape[1:])}
    call = eng.step("all_to_all_single", sig, [inp], extra=in_splits)
    o, fin = flat_output(out)
    pos = 0
    for j, rec in enumerate(call.recs):
        theirs = rec["extra"]
        if theirs[eng.rank] != out_splits[j]:
            raise EmulateError(f"all_to_all_single: {eng.who(j)} sends {theirs[eng.rank]} rows "
                               f"to {eng.who(eng.rank)}, which expects {out_splits[j]}")
        start, cnt = sum(theirs[:eng.rank]) * row, theirs[eng.rank] * row
        src = call.view(j, 0, inp.dtype, sum(theirs) * row)
        o[pos:pos + cnt].copy_(src[start:start + cnt])
        pos += cnt
    fin()
    eng.finish(call)


def all_to_all(eng: CollectiveEngine, outs: list, ins: list) -> None:
    """outs[j] = rank j's ins[this rank]."""
    accept_all(ins, "all_to_all input")
    sig = {"dtypes": signature(ins)["dtypes"]}
    call = eng.step("all_to_all", sig, ins, extra=[list(t.shape) for t in ins])
    for j, (o, rec) in enumerate(zip(outs, call.recs)):
        shape = rec["extra"][eng.rank]
        if list(o.shape) != shape:
            raise EmulateError(f"all_to_all: {eng.who(j)} sends {shape} to "
                               f"{eng.who(eng.rank)}, whose output {j} is {describe(o)}")
        o.copy_(call.view(j, eng.rank, o.dtype, o.numel()).view(o.shape))
    eng.finish(call)


def gather(eng: CollectiveEngine, out_lists: list, ins: list, root: int) -> None:
    """On the root, out_lists[0][r] = rank r's ins[0]."""
    call = eng.step("gather", signature(ins, root=root), ins)
    if eng.rank == root:
        for r, o in enumerate(out_lists[0]):
            o.copy_(call.view(r, 0, o.dtype, o.numel()).view(o.shape))
    eng.finish(call)


def scatter(eng: CollectiveEngine, out, in_lists: list, root: int) -> None:
    """out = the root's in_lists[0][this rank]."""
    call = eng.step("scatter", signature([out], root=root),
                    in_lists[0] if eng.rank == root else [], device=out.device)
    out.copy_(call.view(root, eng.rank, out.dtype, out.numel()).view(out.shape))
    eng.finish(call)


def barrier(eng: CollectiveEngine) -> None:
    eng.step("barrier", {}, [])

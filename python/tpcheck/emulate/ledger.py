"""`tpcheck emulate --trace DIR`: the launch's ledger, schema tpcheck.emulate/1, both halves.

Rank side (CommTrace): each group appends one JSON line per collective to
`DIR/comm.rank<r>.jsonl` (r: the rank's global rank), in call order:
    {"seq", "group" (global ranks), "kind", "sig" (dtypes in tpcheck's names, shapes, op,
     root, device), "bytes" (this rank's contribution), "order" (reductions only),
     "algorithm" ("ring/simple", "rank-order" or "copy"), "at" (the call site)}
Launcher side (write_ledger): when every rank has ended, `DIR/ledger.json`:
    {"schema": "tpcheck.emulate/1", "world_size", "comm_order",
     "ranks": [{"rank", "pid", "collectives": [the lines above], "gemms": a tpcheck.trace/1
                ledger of cublaslt.rank<r>.log or null, "gemms_error" when it failed}]}
and each rank's GEMMs also as `gemms.rank<r>.json`. `tpcheck diff A/ledger.json
B/ledger.json` reads it (src/cli/emulate_diff.cpp; test_emulate_diff.py writes it here and
reads it there).

Imports nothing heavy (no torch): the launcher writes the ledger.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from .. import _tpcheck
from .._names import SCHEMA_EMULATE
from .protocol import NCCL_RING, TRACE_ENV


def algorithm_of(sig: dict, order: str) -> str:
    """How a collective of signature `sig` combines the ranks' data under `order`."""
    if not sig.get("op"):
        return "copy"
    return "ring/simple" if order == NCCL_RING else "rank-order"


class CommTrace:
    """One rank's comm.rank<r>.jsonl, appended line by line (flushed at each line)."""

    def __init__(self, path: str):
        self._f = open(path, "a", buffering=1, encoding="utf-8")

    @classmethod
    def open_for(cls, global_rank: int) -> Optional["CommTrace"]:
        """The trace of this rank under --trace (TPCHECK_TRACE_DIR); None without it."""
        d = os.environ.get(TRACE_ENV)
        if not d:
            return None
        os.makedirs(d, exist_ok=True)
        return cls(os.path.join(d, f"comm.rank{global_rank}.jsonl"))

    def write(self, seq: int, group: list[int], kind: str, sig: dict, nbytes: int,
              order: str, at: str) -> None:
        self._f.write(json.dumps({
            "seq": seq, "group": group, "kind": kind, "sig": sig, "bytes": nbytes,
            "order": order if sig.get("op") else None, "algorithm": algorithm_of(sig, order),
            "at": at}) + "\n")


def _rank_record(d: str, r: int, pid: int) -> dict:
    rec: dict = {"rank": r, "pid": pid, "collectives": [], "gemms": None}
    comm = os.path.join(d, f"comm.rank{r}.jsonl")
    if os.path.exists(comm):
        with open(comm, encoding="utf-8") as f:
            rec["collectives"] = [json.loads(line) for line in f if line.strip()]
    log = os.path.join(d, f"cublaslt.rank{r}.log")
    if os.path.exists(log) and os.path.getsize(log) > 0:
        try:
            ledger = json.loads(_tpcheck.trace_ledger([log], pid, False))
            rec["gemms"] = ledger
            with open(os.path.join(d, f"gemms.rank{r}.json"), "w", encoding="utf-8") as f:
                json.dump(ledger, f, indent=1)
        except Exception as e:  # noqa: BLE001 - the ledger says what failed, diff refuses it
            rec["gemms_error"] = str(e)
    return rec


def write_ledger(d: str, pids: list[int], order: str) -> None:
    """DIR/ledger.json of a launch whose rank r ran as process pids[r]."""
    ranks = [_rank_record(d, r, pid) for r, pid in enumerate(pids)]
    with open(os.path.join(d, "ledger.json"), "w", encoding="utf-8") as f:
        json.dump({"schema": SCHEMA_EMULATE, "world_size": len(pids), "comm_order": order,
                   "ranks": ranks}, f, indent=1)

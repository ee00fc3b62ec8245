"""tests/python/test_emulate_diff.py — `tpcheck diff` of two `python -m tpcheck emulate
--trace DIR` ledgers (DIR/ledger.json, schema tpcheck.emulate/1).

End to end on the CPU: emulate_workers/trace_small.py at TP 1 and TP 2 with --trace, then
`tpcheck diff` of the two ledgers (a TP 1 run issues no collective: said in one line, and
TP 2's collectives grouped): the schema's round trip, Python writing (tpcheck.emulate's
ledger.py) and C++ reading (src/cli/emulate_diff.cpp), in tpcheck's names (schema, dtypes,
comm orders: tpcheck._names). There is no GPU GEMM on the CPU, so the GEMM half runs on
hand-made ledgers: each rank's `gemms` is what ledger.py's write_ledger stores (the
trace ledger `_tpcheck.trace_ledger` makes of the rank's cuBLASLt log), here of the real
logs in tests/data/cublaslt. Bad input: a ledger with no ranks, a rank whose log failed to
parse. Two launches (~15 s on the shared 2-core machine); the rest is a few `tpcheck` calls.
"""

import copy
import json
import os
import re
import subprocess
import sys

import pytest

from tpcheck import _tpcheck
from tpcheck._names import SCHEMA_EMULATE

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "cublaslt")
WORKER = os.path.join(HERE, "emulate_workers", "trace_small.py")


def tpcheck(cli, *args):
    return subprocess.run([cli, "diff", *map(str, args)], capture_output=True, text=True, timeout=60)


def gemms_of(log):
    """A rank's `gemms` entry as write_ledger writes it."""
    return json.loads(_tpcheck.trace_ledger([os.path.join(DATA, log)], 4242, False))


def emulate_ledger(ranks, order="nccl-ring"):
    """ranks: per rank, (gemms or None, collectives)."""
    return {"schema": SCHEMA_EMULATE, "world_size": len(ranks), "comm_order": order,
            "ranks": [{"rank": r, "pid": 1000 + r, "collectives": list(c), "gemms": g}
                      for r, (g, c) in enumerate(ranks)]}


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("emulate_diff")
    for n in (1, 2):
        p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--trace",
                            str(d / f"tp{n}"), "--", WORKER], capture_output=True, text=True,
                           timeout=240)
        assert p.returncode == 0 and "[rank0]: ALL OK" in p.stdout, p.stdout + p.stderr
    return d


def test_tp1_against_tp2_on_the_cpu(cli, runs):
    r = tpcheck(cli, runs / "tp1" / "ledger.json", runs / "tp2" / "ledger.json")
    assert r.returncode == 1, r.stdout + r.stderr  # TP 2 adds collectives
    out = r.stdout
    assert "A = " in out and "emulate ledger, 1 rank, comm order nccl-ring" in out
    assert "emulate ledger, 2 ranks" in out
    assert "every rank of B against A's single rank" in out
    assert "no GEMM recorded on either side" in out  # the CPU has no cuBLASLt
    assert "A issued none on any rank" in out
    # Both ranks call the same collectives: one block for the two.
    assert "B rank 0 against A rank 0; B rank 1 against A rank 0:" in out, out
    assert "0 → 3 collectives" in out
    assert re.search(r"1 × only in B: all_gather_into_tensor f32, 512 B per rank, copy over 2 ranks"
                     r"  \(first #1, at .*trace_small\.py:\d+\)", out), out
    assert "1 × only in B: all_reduce f32 op=sum, 512 B per rank, ring/simple (nccl-ring) over 2 ranks" in out
    assert "1 × only in B: reduce_scatter_tensor bf16 op=sum, 256 B per rank, ring/simple" in out


def test_the_ledger_speaks_tpchecks_names(runs):
    """What Python wrote is what the C++ reader and the run report name: the schema, the
    comm order and every dtype are tpcheck's own (include/tpcheck/names.h, src/core/dtype.cpp,
    src/comm/comm.cpp through tpcheck._names)."""
    from tpcheck._names import COMM_ORDERS, DTYPES, SCHEMA_EMULATE

    for n in (1, 2):
        ledger = json.loads((runs / f"tp{n}" / "ledger.json").read_text())
        assert ledger["schema"] == SCHEMA_EMULATE and ledger["comm_order"] in COMM_ORDERS
        assert ledger["world_size"] == n and [r["rank"] for r in ledger["ranks"]] == list(range(n))
        calls = [c for r in ledger["ranks"] for c in r["collectives"]]
        assert len(calls) == (0 if n == 1 else 6)
        assert {d for c in calls for d in c["sig"]["dtypes"]} <= set(DTYPES)
        assert {c["order"] for c in calls if c["sig"].get("op")} <= set(COMM_ORDERS)


def test_same_run_has_no_change(cli, runs):
    ledger = runs / "tp2" / "ledger.json"
    r = tpcheck(cli, ledger, ledger)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 → 3 collectives; 3 the same at the same position" in r.stdout
    assert r.stdout.rstrip().endswith("no change")


def test_collective_changes_are_named_per_rank(cli, runs, tmp_path):
    a = json.loads((runs / "tp2" / "ledger.json").read_text())
    b = copy.deepcopy(a)
    rank1 = b["ranks"][1]["collectives"]
    assert rank1[1]["kind"] == "all_reduce"
    rank1[1].update(order="rank", algorithm="rank-order")  # as --comm-order rank records it
    rank1.append(dict(rank1[0], bytes=1024))  # an extra collective at the end
    r = tpcheck(cli, write(tmp_path / "a.json", a), write(tmp_path / "b.json", b))
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "each rank of B against the same rank of A" in out
    assert "B rank 0 against A rank 0:\n  3 → 3 collectives; 3 the same" in out, out
    block = out.split("B rank 1 against A rank 1:\n", 1)[1]
    assert block.startswith("  3 → 4 collectives; 2 the same at the same position, 2 differ"), block
    assert ("    of the 1 aligned pairs that differ:\n"
            "      algorithm in 1: ring/simple (nccl-ring) → rank-order (rank) ×1\n"
            "    by signature:\n") in block, block
    assert re.search(r"1 × A: all_reduce f32 op=sum, 512 B per rank, ring/simple \(nccl-ring\) over 2 ranks\n"
                     r" +B: all_reduce f32 op=sum, 512 B per rank, rank-order \(rank\) over 2 ranks  \(first #2",
                     block), block
    assert "1 × only in B: all_gather_into_tensor f32, 1024 B per rank" in block


def test_gemm_sites_per_rank(cli, tmp_path):
    # TP 1: one rank, the unsharded fc1 GEMMs. TP 2: rank 0 ran its half with another
    # algorithm (the recorded TP 2 log); rank 1 is given the TP 1 log, so it must show no change.
    a = write(tmp_path / "tp1.json", emulate_ledger([(gemms_of("torch_bf16_tp1.log"), [])]))
    b = write(tmp_path / "tp2.json", emulate_ledger([(gemms_of("torch_bf16_tp2.log"), []),
                                                     (gemms_of("torch_bf16_tp1.log"), [])]))
    r = tpcheck(cli, a, b)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    rank0, rank1 = out.split("B rank 0 against A rank 0:\n", 1)[1].split("B rank 1 against A rank 0:\n", 1)
    assert "2 aligned calls differ, in 2 groups" in rank0
    assert re.search(r"A m=4096 n=1024 k=1024 +B m=2048 n=1024 k=1024\n"
                     r" +A: algoId=66 tile=256x128 stages=64xAUTO customOption=7 cluster=1x2x1  \(lines 20\)\n"
                     r" +B: algoId=66 tile=128x128 stages=64xAUTO customOption=1 cluster=2x1x1  \(lines 20\)",
                     rank0), rank0
    assert "every aligned call ran the same algorithm with the same compute type" in rank1
    assert "changed: B rank 0: 2 calls in 2 groups\n" in out, out
    assert "B rank 1: " not in out.split("changed:", 1)[1].split("\n", 1)[0]
    assert "== collectives ==\nnone on either side" in out

    # A single trace ledger (tpcheck.trace/1, e.g. `tpcheck trace` of the TP 1 program) on
    # one side: each rank of the emulate ledger is compared with it.
    t = write(tmp_path / "trace.json", gemms_of("torch_bf16_tp1.log"))
    r = tpcheck(cli, t, b)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "trace ledger, 1 process" in r.stdout
    assert "B rank 0 against A process 0 (pid 4242):" in r.stdout
    assert "changed: B rank 0: 2 calls in 2 groups\n" in r.stdout
    assert "it records GEMMs only, so the collectives are not compared" in r.stdout
    r = tpcheck(cli, t, a)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("no change"), r.stdout + r.stderr


def test_bad_ledgers_are_named(cli, tmp_path):
    good = write(tmp_path / "good.json", emulate_ledger([(None, [])]))
    empty = write(tmp_path / "empty.json", dict(emulate_ledger([]), world_size=0))
    r = tpcheck(cli, good, empty)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "empty.json': an emulate ledger (tpcheck.emulate/1) with no ranks" in r.stderr, r.stderr

    broken = emulate_ledger([(None, []), (None, [])])
    broken["ranks"][1]["gemms_error"] = "cannot read cublaslt.rank1.log"
    r = tpcheck(cli, good, write(tmp_path / "broken.json", broken))
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("broken.json': rank 1: its cuBLASLt log could not be parsed when the ledger was "
            "written (cannot read cublaslt.rank1.log)") in r.stderr, r.stderr

    bad_call = emulate_ledger([(gemms_of("torch_f32_tp1.log"), [])])
    del bad_call["ranks"][0]["gemms"]["processes"][0]["gemms"][1]["m"]
    r = tpcheck(cli, good, write(tmp_path / "bad_call.json", bad_call))
    assert r.returncode == 2 and "bad_call.json': rank 0: gemms: processes[0].gemms[1]: key 'm' missing" in r.stderr, r.stderr

    run_report = write(tmp_path / "run.json", {"schema": "tpcheck.run/1", "environment": {}, "cases": []})
    r = tpcheck(cli, good, run_report)
    assert r.returncode == 2 and "cannot compare a tpcheck.emulate/1" in r.stderr, r.stderr

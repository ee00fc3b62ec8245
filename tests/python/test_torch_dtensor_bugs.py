"""Bugs injected into PyTorch DTensor's own code, caught by compare_tp.

One `python -m tpcheck emulate -n N` launch per TP size (emulate_workers/dtensor_bugs.py)
runs, on CPU tensors, DTensor `parallelize_module` plans (ColwiseParallel / RowwiseParallel,
and the sequence-parallel LayerNorm -> Colwise(Shard(1)) -> Rowwise(Shard(1)) plan, the
layers of test_torch_compare.py) with the library monkeypatched to carry one bug at a
time: a dropped all-reduce, a gradient averaged instead of summed, a 1/N rescale (all
three in torch.distributed._functional_collectives, which DTensor's redistribute calls), a
wrong-group all-gather (the same module's all_gather_tensor), and a shard offset by one
(ColwiseParallel's partition of the weight). Each must fail compare_tp's `truth` policy
on every rank, naming the tensor the bug reaches first; the same patched library without a
bug must pass on held-out seeds (101-103; seeds 1-3 and 7 were looked at while writing).
TP 2 and 4 in the quick run; TPCHECK_TEST_LONG=1 adds TP 8 and seeds 101-130.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "emulate_workers", "dtensor_bugs.py")
LONG = os.environ.get("TPCHECK_TEST_LONG") == "1"
TP_SIZES = [2, 4, 8] if LONG else [2, 4]
SEEDS = list(range(101, 131)) if LONG else [101, 102, 103]
KINDS = ["dtensor", "dtensor-sp"]

# (layer, bug) -> (kind, name) of a tensor that must be among the failures: where the bug
# lands first. The plain colwise/rowwise plan has no all-gather, so no wrong-group bug.
FIRST_HIT = {
    ("dtensor", "dropped-allreduce"): ("output", "output"),
    ("dtensor", "grad-averaged"): ("input_gradient", "input"),
    ("dtensor", "rescale"): ("output", "output"),
    ("dtensor", "shard-offset"): ("parameter", "fc1.weight"),
    ("dtensor-sp", "dropped-allreduce"): ("output", "output"),
    ("dtensor-sp", "grad-averaged"): ("input_gradient", "input"),
    ("dtensor-sp", "rescale"): ("output", "output"),
    ("dtensor-sp", "shard-offset"): ("parameter", "fc1.weight"),
    ("dtensor-sp", "wrong-group-gather"): ("output", "output"),
}
BUGS = list(FIRST_HIT)


def _jobs() -> list[dict]:
    jobs = [dict(kind=k, bug="none", seed=s) for k in KINDS for s in SEEDS]
    return jobs + [dict(kind=k, bug=b, seed=7) for k, b in BUGS]


@pytest.fixture(scope="module", params=TP_SIZES, ids=lambda n: f"tp{n}")
def tp_results(request, tmp_path_factory):
    n = request.param
    d = tmp_path_factory.mktemp(f"dtensor_tp{n}")
    (d / "jobs.json").write_text(json.dumps(_jobs()))
    p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--",
                        sys.executable, WORKER, str(d / "jobs.json"), str(d)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    by_job: dict = {}
    for r in range(n):
        for res in json.loads((d / f"rank{r}.json").read_text()):
            by_job.setdefault((res["kind"], res["bug"], res["seed"]), []).append(res)
    assert all(len(v) == n for v in by_job.values())
    return n, by_job


def test_correct_dtensor_code_passes(tp_results):
    n, by_job = tp_results
    runs = {k: v for k, v in by_job.items() if k[1] == "none"}
    assert len(runs) == len(KINDS) * len(SEEDS)
    for key, rs in runs.items():
        for r in rs:
            assert "error" not in r, r.get("traceback")
            assert r["fired"] == 0, f"TP {n} {key}: the unpatched path changed a result"
            assert r["passed"], f"TP {n} {key}: false alarm {r['failing']} {r['reasons']}"


@pytest.mark.parametrize("kind,bug", BUGS, ids=[f"{k}-{b}" for k, b in BUGS])
def test_bug_in_dtensor_is_caught(tp_results, kind, bug):
    n, by_job = tp_results
    for rank, r in enumerate(by_job[(kind, bug, 7)]):
        assert "error" not in r, r.get("traceback")
        # the patched code ran (else "caught" would mean nothing)
        assert r["fired"] > 0, f"TP {n} rank {rank}: {bug} never reached {kind}'s code path"
        assert not r["passed"], f"TP {n} rank {rank}: {kind} with {bug} passed"
        assert list(FIRST_HIT[(kind, bug)]) in r["failing"], (
            f"TP {n} rank {rank}: {kind} with {bug} failed on {r['failing']}, "
            f"not on {FIRST_HIT[(kind, bug)]}")

"""tpcheck.torch.compare_tp on real tensor-parallel code over gloo on the CPU.

Spawned ranks (torch_tp_worker.py) run Megatron-style column/row parallel MLPs
(torch_tp_layers.py, with and without sequence parallel) and PyTorch DTensor
`parallelize_module` plans (colwise/rowwise, and sequence parallel with a LayerNorm) at TP
2 and 4: correct code must pass under `truth` on held-out seeds (the constants are the
suite's defaults, m = 4, f = 1; seeds 1–3 were looked at while writing this, the seeds
below were not), and every injected bug must be caught. One spawn per TP size carries all
scenarios. TPCHECK_TEST_LONG=1 adds 30 held-out seeds and TP 8.

The same spawn checks the split of the work: the unsharded run on rank 0, the truth's
probed and float64 runs on ranks 1 and 2, each once (counted per rank), every rank gets
the same report, a replica that differs on one rank is judged, and input that only some
ranks see as bad raises on every rank without a hang.
Bad input is also tested in this process on a one-rank gloo group, and the GEMM class from
a cuBLASLt trace with a fake trace (no GPU here).
"""

from __future__ import annotations

import copy
import os
import re
import socket
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_tp_worker as worker  # noqa: E402
from torch_tp_layers import MLP  # noqa: E402

import tpcheck  # noqa: E402
from tpcheck._names import REPORT_KIND_PARAMETER_GRADIENT  # noqa: E402
from tpcheck.torch import TruthRunError, compare_tp  # noqa: E402

LONG = os.environ.get("TPCHECK_TEST_LONG") == "1"
HELD_OUT_SEEDS = list(range(101, 131)) if LONG else [101, 102, 103]
KINDS = ["megatron", "megatron-sp", "dtensor", "dtensor-sp"]
# (layer kind, bug) pairs injected; the bug's code path must exist in that layer
BUGS = [("megatron", b) for b in ("dropped-allreduce", "grad-averaged", "rescale", "shard-offset")]
BUGS += [("megatron-sp", b) for b in ("dropped-allreduce", "grad-averaged", "rescale",
                                      "shard-offset", "wrong-group-gather")]
BUGS += [("dtensor", b) for b in ("dropped-allreduce", "rescale")]
TP_SIZES = [2, 4, 8] if LONG else [2, 4]


# input that only some ranks see as bad (the error each raises; "{r}": the rank that found it)
BAD_INPUTS = {
    "rank1-unknown-shards": r"shards names \['fc3.weight'\] match no parameter",
    "rank1-other-input-values": r"input 'input' on rank 1 differs from rank 0's \(\d+ of 512 elements",
    "rank1-other-input-shape": r"rank 1 was called with inputs \{'input': \[\[8, 2, 16\]",
    "rank1-uneven-shard": r"rank 1's sharded parameter 'fc1.weight' is \[\[\d+, 16\], 'float32'\], "
                          r"rank 0's \[\[\d+, 16\], 'float32'\]; .*uneven shards are not supported",
    "root-only-buffer-change": r"the unsharded module's buffer 'running_mean' changed in forward",
    "no-float64-kernel": r"the float64 run failed in module <_NoFloat64>: TypeError: "
                         r"fused_mlp\(\): incompatible function arguments",
}
BAD_ERROR_TYPES = {"no-float64-kernel": "TruthRunError"}  # the others: InputError
BAD_FOUND_ON = {"rank1-unknown-shards": 1, "rank1-other-input-values": 1,
                "rank1-other-input-shape": None, "rank1-uneven-shard": None,
                "root-only-buffer-change": 0,
                "no-float64-kernel": None}  # the float64 run's rank, or the probed run's own
# which ranks may run parts of the truth: rank 1's unsharded module differs from rank 0's
# (a parameter; its train/eval mode), or spread_truth=False
HELPERS = ["rank1-single-differs", "rank1-single-eval", "spread-off"]
AFTER_BAD_SEED = 199  # a correct run after the bad inputs: the group still works
# forward only (no grad_output, a non-scalar output): correct code, and bugs of the forward
FORWARD_ONLY = [("none", 101), ("dropped-allreduce", 7), ("rescale", 7), ("shard-offset", 7)]


def _jobs() -> list[dict]:
    jobs = [dict(kind=k, bug="none", seed=s) for k in KINDS for s in HELD_OUT_SEEDS]
    jobs += [dict(kind=k, bug=b, seed=7) for k, b in BUGS]
    jobs += [dict(kind="replica", bug=b, seed=7)
             for b in ("rank1-output-scaled", "rank1-output-one-ulp", "rank1-output-one-ulp-judge")]
    jobs += [dict(kind="megatron-fwd", bug=b, seed=s) for b, s in FORWARD_ONLY]
    jobs += [dict(kind="helpers", bug=b, seed=101) for b in HELPERS]
    jobs += [dict(kind="bad-input", bug=b, seed=0) for b in BAD_INPUTS]
    jobs += [dict(kind="megatron", bug="none", seed=AFTER_BAD_SEED)]
    return jobs


@pytest.fixture(scope="module", params=TP_SIZES, ids=lambda n: f"tp{n}")
def tp_results(request, tmp_path_factory):
    n = request.param
    ranks = worker.run_spawned(n, _jobs(), str(tmp_path_factory.mktemp(f"tp{n}")))
    return n, ranks


def _by_job(ranks):
    """{(kind, bug, seed): [rank results]}"""
    out: dict = {}
    for rank in ranks:
        for r in rank:
            out.setdefault((r["kind"], r["bug"], r["seed"]), []).append(r)
    return out


def test_correct_code_passes_under_truth_on_held_out_seeds(tp_results):
    n, ranks = tp_results
    results = {k: rs for k, rs in _by_job(ranks).items() if k[0] in KINDS}
    errors = [r for rs in results.values() for r in rs if "error" in r]
    assert not errors, errors[0].get("traceback", errors[0]["error"])
    false_alarms = [(k, r["failing"], r["reasons"])
                    for k, rs in results.items() if k[1] == "none" for r in rs if not r["passed"]]
    assert not false_alarms, f"TP {n}: false alarms {false_alarms[:3]}"
    assert ("megatron", "none", AFTER_BAD_SEED) in results  # ran (and passed) after bad input
    runs = [k for k in results if k[1] == "none" and k[2] != AFTER_BAD_SEED]
    ac_fail = sum(any(r["assert_close_fails"] for r in results[k]) for k in runs)
    te_fail = sum(any(r["te_rule_fails"] for r in results[k]) for k in runs)
    print(f"\nTP {n}: {len(runs)} correct runs pass under truth; torch.testing.assert_close "
          f"(defaults) fails {ac_fail} of them, the reference suite's rule (te) {te_fail}; "
          "assert_close failures by layer: "
          + str({kind: sum(any(r["assert_close_fails"] for r in results[k]) for k in runs if k[0] == kind)
                 for kind in KINDS}))


@pytest.mark.parametrize("kind,bug", BUGS, ids=[f"{k}-{b}" for k, b in BUGS])
def test_injected_bug_is_caught(tp_results, kind, bug):
    n, ranks = tp_results
    rs = _by_job(ranks)[(kind, bug, 7)]
    assert all("error" not in r for r in rs), rs[0].get("traceback")
    assert all(not r["passed"] for r in rs), f"TP {n}: {kind} with {bug} passed on some rank"


def test_each_part_of_the_judging_runs_once_and_every_rank_gets_the_same_report(tp_results):
    """The unsharded run happens once per group, on rank 0; the truth's probed run on rank 1
    and its float64 run on rank 2 (rank 0 at TP 2), each once; the verdicts reach every
    rank: the same report (but for its `rank`), the same assert_ok reason, and the judged
    tensors (raw) only on rank 0."""
    n, ranks = tp_results
    jobs = [k for k in _by_job(ranks) if k[0] in KINDS or k[0] in ("replica", "megatron-fwd")]
    assert len(jobs) == len(_jobs()) - len(BAD_INPUTS) - len(HELPERS)
    where = {"unsharded run": 0, "probed run": 1, "float64 run": 2 if n > 2 else 0}
    for key in jobs:
        rs = _by_job(ranks)[key]
        assert len(rs) == n and all("error" not in r for r in rs), rs[0].get("traceback")
        for part, rank in where.items():
            calls = [r["part_calls"][part] for r in rs]
            assert calls == [int(r == rank) for r in range(n)], f"TP {n} {key}: {part} per rank {calls}"
            assert rs[0]["report"]["work"][part]["rank"] == rank
        assert all(r["report"] == rs[0]["report"] for r in rs[1:]), f"TP {n} {key}: reports differ"
        assert all(r["assert_ok"] == rs[0]["assert_ok"] for r in rs[1:])
        assert (rs[0]["assert_ok"] is None) == rs[0]["passed"]
        assert rs[0]["raw_names"] and all(r["raw_names"] == [] for r in rs[1:])


@pytest.mark.parametrize("bug", HELPERS)
def test_a_rank_whose_unsharded_module_is_not_rank_0s_runs_no_part_of_the_truth(tp_results, bug):
    """The truth's runs go only to ranks whose unsharded module is rank 0's (parameters and
    buffers bit for bit, the same train/eval modes): rank 1's is not, so the probed run
    goes to the next rank that is, the report says why rank 1 ran nothing, and the verdict
    is the one rank 0's module gets. spread_truth=False keeps every part on rank 0."""
    n, ranks = tp_results
    rs = _by_job(ranks)[("helpers", bug, 101)]
    assert len(rs) == n and all("error" not in r for r in rs), rs[0].get("traceback")
    assert all(r["passed"] for r in rs), rs[0]["reasons"]
    helpers = [] if bug == "spread-off" else list(range(2, n))
    want = {"unsharded run": 0, "probed run": helpers[0] if helpers else 0,
            "float64 run": helpers[1] if len(helpers) > 1 else 0}
    work = rs[0]["report"]["work"]
    assert {part: w["rank"] for part, w in work.items()} == want
    for part, rank in want.items():
        assert [r["part_calls"][part] for r in rs] == [int(r == rank) for r in range(n)]
    notes = [m for m in rs[0]["report"]["notes"] if m.startswith("rank 1 ran no part")]
    why = {"rank1-single-differs": "parameters or buffers differ from rank 0's bit for bit",
           "rank1-single-eval": "train/eval modes differ from rank 0's"}.get(bug)
    assert (len(notes) == 1 and why in notes[0]) if why else not notes, notes


def test_a_replica_that_differs_on_one_rank_is_judged_on_every_rank(tp_results):
    """Rank 1's copy of the replicated output is 1 % off: rank 0's copy passes, and every
    rank's report carries the failing entry "output (rank 1's copy)"."""
    n, ranks = tp_results
    rs = _by_job(ranks)[("replica", "rank1-output-scaled", 7)]
    for r in rs:
        entries = {e["name"]: e for e in r["report"]["tensors"]}
        assert entries["output"]["verdicts"]["truth"]["passed"]
        copy_entry = entries["output (rank 1's copy)"]
        assert copy_entry["rank"] == 1 and copy_entry["copy_of"] == "output"
        assert not copy_entry["verdicts"]["truth"]["passed"]
        assert "output (rank 1's copy)" in r["failing"]
        assert not any(name.endswith(f"(rank {q}'s copy)") for name in entries for q in range(2, n))


def test_a_replica_one_ulp_off_fails_unless_replicas_judge(tp_results):
    """Rank 1's copy of the replicated output differs from rank 0's in one element by one
    ulp: within the truth's bound, but a replicated tensor is one tensor, so the copy fails
    its "replica" verdict (naming the element); with replicas="judge" only the policy's
    verdict counts and the run passes."""
    n, ranks = tp_results
    for r in _by_job(ranks)[("replica", "rank1-output-one-ulp", 7)]:
        entries = {e["name"]: e for e in r["report"]["tensors"]}
        copy_entry = entries["output (rank 1's copy)"]
        assert copy_entry["verdicts"]["truth"]["passed"]
        replica = copy_entry["verdicts"]["replica"]
        assert not replica["passed"] and "1 of 16384 elements" in replica["reason"], replica
        assert r["failing"] == ["output (rank 1's copy)"], r["failing"]
    for r in _by_job(ranks)[("replica", "rank1-output-one-ulp-judge", 7)]:
        entries = {e["name"]: e for e in r["report"]["tensors"]}
        assert "replica" not in entries["output (rank 1's copy)"]["verdicts"]
        assert r["passed"], r["failing"]


def test_forward_only_on_every_rank(tp_results):
    """No grad_output: every rank judges the outputs and the parameters' gather, says no
    backward ran, passes correct code and fails each forward bug."""
    n, ranks = tp_results
    for bug, seed in FORWARD_ONLY:
        rs = _by_job(ranks)[("megatron-fwd", bug, seed)]
        assert len(rs) == n and all("error" not in r for r in rs), rs[0].get("traceback")
        assert all(r["backward"] is False and r["kinds"] == ["output", "parameter"] for r in rs)
        assert all(r["passed"] == (bug == "none") for r in rs), (bug, [r["failing"] for r in rs])


@pytest.mark.parametrize("bug", list(BAD_INPUTS))
def test_bad_input_on_some_ranks_raises_on_every_rank(tp_results, bug):
    """Input bad on one rank only (or seen only where the unsharded module runs) raises the
    same error on every rank, naming the rank that found it on the others; nobody waits in a
    collective (the worker's group has a 2-minute timeout, and a later run still works)."""
    n, ranks = tp_results
    rs = _by_job(ranks)[("bad-input", bug, 0)]
    assert len(rs) == n
    for rank, r in enumerate(rs):
        assert "error" in r, f"TP {n}: rank {rank} did not raise for {bug}: {r}"
        assert r["error_type"] == BAD_ERROR_TYPES.get(bug, "InputError"), r["error"]
        assert re.search(BAD_INPUTS[bug], r["error"]), r["error"]
        found = BAD_FOUND_ON[bug]
        if found is not None and rank != found:
            assert f"(found on rank {found} of {n})" in r["error"], r["error"]


# --- bad input, one rank ----------------------------------------------------------------

@pytest.fixture(scope="module")
def one_rank_group():
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD


def _mlp(seed=0):
    torch.manual_seed(seed)
    return MLP(8, 16)


def test_one_rank_copy_passes_truth_and_bitwise(one_rank_group):
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    report.assert_ok()
    names = [e["name"] for e in report.entries if e["kind"] != "parameter"]
    assert names == ["output", "input", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, policy="bitwise").assert_ok()
    d = report.to_dict()
    assert d["schema"] == "tpcheck.compare_tp/1" and d["tensors"][-1]["verdicts"]["truth"]["passed"]
    assert "<table" in report.to_html()


def test_the_report_times_each_phase(one_rank_group):
    """report.seconds: the judging rank's phases, in order, summing to the total."""
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    phases = ["checks", "inputs and parameters", "sharded run and gathers", "unsharded run",
              "truth", "collecting", "judging"]
    assert list(report.seconds) == phases + ["total"]
    assert all(v >= 0 for v in report.seconds.values())
    assert sum(report.seconds[p] for p in phases) == pytest.approx(report.seconds["total"], abs=1e-3)
    assert report.to_dict()["seconds"] == report.seconds
    # the bitwise policy needs no truth: no truth phase
    again = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, policy="bitwise")
    assert "truth" not in again.seconds and "judging" in again.seconds


def test_a_parameter_shared_with_the_unsharded_module_keeps_its_own_gradient(one_rank_group):
    """A sharded module may hold one of single's Parameter objects (a replicated bias). Rank
    0 runs single after the shards with p.grad = None: the sharded gradient gathered before
    must stay the one the sharded run made, and single's the one its own run made."""
    single = _mlp()
    sharded = copy.deepcopy(single)
    sharded.fc2.bias = single.fc2.bias  # the same object in both modules
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    compare_tp(single, sharded, (x,), grad_output=dy).assert_ok()
    # the sharded run's output gradient halved: its bias gradient is half of single's
    def halve_output_gradient(module, inputs, output):
        output.register_hook(lambda g: g * 0.5)  # returns None: the output is kept

    sharded.fc2.register_forward_hook(halve_output_gradient)
    report = compare_tp(single, sharded, (x,), grad_output=dy)
    failed = {e["name"] for e in report.failures if e["kind"] == REPORT_KIND_PARAMETER_GRADIENT}
    assert "fc2.bias" in failed


def test_a_wrong_gradient_fails_with_its_name(one_rank_group):
    single, sharded = _mlp(), _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    sharded.fc2.bias.register_hook(lambda g: g * 0.5)  # a halved bias gradient
    report = compare_tp(single, sharded, (x,), grad_output=dy)
    with pytest.raises(tpcheck.CheckFailed, match=r"rank 0 of 1: gradient 'fc2.bias' fails truth"):
        report.assert_ok()
    assert report.failures[0]["name"] == "fc2.bias" and report.failures[0]["policy"] == "truth"
    assert isinstance(tpcheck.CheckFailed("x"), AssertionError)


def test_options_object_and_keywords(one_rank_group):
    """compare_tp's keywords are CompareOptions' fields; an options object works the same,
    keywords given with it override its fields; an unknown keyword names the fields."""
    from tpcheck.torch import CompareOptions
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    by_keywords = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, policy="bitwise")
    opts = CompareOptions(grad_output=dy, policy="te")
    by_object = compare_tp(single, copy.deepcopy(single), (x,), options=opts, policy="bitwise")
    assert by_object.to_dict()["tensors"] == by_keywords.to_dict()["tensors"]
    assert opts.policy == "te"  # the caller's object is left as it was
    with pytest.raises(tpcheck.InputError, match=r"unknown keywords \['grad_outputs'\].*'grad_output'"):
        compare_tp(single, copy.deepcopy(single), (x,), grad_outputs=dy)
    # the te / allclose tolerances: a 1e-3 change fails rtol 1e-4 and passes rtol 1e-2
    scaled = copy.deepcopy(single)
    scaled.fc2.register_forward_hook(lambda mod, inp, out: out * 1.001)
    tight = compare_tp(single, scaled, (x,), grad_output=dy, policy="allclose", rtol=1e-4, atol=0)
    loose = compare_tp(single, scaled, (x,), grad_output=dy, policy="allclose", rtol=1e-2, atol=0)
    assert "output" in {f["name"] for f in tight.failures} and loose.passed
    with pytest.raises(tpcheck.InputError, match=r"replicas='exact'; expected one of \['identical', 'judge'\]"):
        compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, replicas="exact")


# --- forward only, casts, modules that cannot be copied (one rank) ----------------------

def test_forward_only_judges_outputs_and_parameters(one_rank_group):
    """No grad_output and a non-scalar output, or backward=False: the outputs and the
    parameters' gather are judged, the report says no backward ran; a bug is still caught."""
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    for report in (compare_tp(single, copy.deepcopy(single), (x,)),
                   compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, backward=False)):
        report.assert_ok()
        assert report.backward is False and report.to_dict()["backward"] is False
        assert {e["kind"] for e in report.entries} == {"output", "parameter"}
        assert any("no backward ran" in n for n in report.notes), report.notes
    scaled = copy.deepcopy(single)
    scaled.fc2.register_forward_hook(lambda mod, inp, out: out * 1.001)
    bad = compare_tp(single, scaled, (x,))
    assert [f["name"] for f in bad.failures] == ["output"]
    with pytest.raises(tpcheck.InputError, match=r"backward=True, but no grad_output .*pass grad_output="):
        compare_tp(single, copy.deepcopy(single), (x,), backward=True)
    # a scalar output runs backward without grad_output
    summed = compare_tp(torch.nn.Sequential(single, _Sum()), torch.nn.Sequential(copy.deepcopy(single), _Sum()), (x,))
    assert summed.backward and any(e["kind"] == REPORT_KIND_PARAMETER_GRADIENT for e in summed.entries)


class _Sum(torch.nn.Module):
    def forward(self, y):
        return y.sum()


class _CastingMLP(torch.nn.Module):
    """An MLP whose norm computes in float32 and whose fc2 input makes a bf16 round trip
    (what Llama-style code does on purpose): the truth lifts both, the runs keep them."""

    def __init__(self, h=8, f=16):
        super().__init__()
        self.mlp = MLP(h, f)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(h))

    def forward(self, x):
        h = x.to(torch.float32)
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        return self.mlp(h.to(torch.bfloat16).to(x.dtype))


def test_casts_below_float64_are_lifted_and_reported(one_rank_group):
    torch.manual_seed(21)
    single = _CastingMLP()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    report.assert_ok()
    lifted = {(r["op"], r["dtype"]) for r in report.truth_lifted}
    assert lifted == {("aten._to_copy", "float32"), ("aten._to_copy", "bfloat16")}
    assert any("kept float64 through" in n for n in report.notes)
    assert report.to_dict()["truth_lifted"] == report.truth_lifted
    broken = copy.deepcopy(single)
    broken.mlp.fc1.register_forward_hook(lambda mod, inp, out: out * 1.01)
    assert not compare_tp(single, broken, (x,), grad_output=dy).passed
    with pytest.raises(TruthRunError, match=r"aten\._to_copy produced a torch.float32 result"):
        compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, strict_truth=True)


def test_bf16_model_probe_counts_float32_ops_at_float32(one_rank_group):
    """In bf16 the norm's float32 region is probed at float32's rounding, and the report
    says how many results were (in float32 every op is one rounding: no such note)."""
    torch.manual_seed(21)
    single = _CastingMLP().to(torch.bfloat16)
    x, dy = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    report.assert_ok()
    note = [n for n in report.notes if n.startswith("the rounding probe counted")]
    assert len(note) == 1 and "in float32" in note[0] and "in bfloat16, the noise" in note[0]
    f32 = _CastingMLP()
    report = compare_tp(f32, copy.deepcopy(f32), (x.float(),), grad_output=dy.float())
    assert not any(n.startswith("the rounding probe counted") for n in report.notes)


class _HoldsGroup(torch.nn.Module):
    """A Megatron-style module: it keeps its process group (which cannot be deep-copied)."""

    def __init__(self, group):
        super().__init__()
        self.group = group
        self.mlp = MLP(8, 16)

    def forward(self, x):
        return self.mlp(x)


def test_a_module_holding_its_process_group_is_judged(one_rank_group):
    torch.manual_seed(22)
    single, sharded = _HoldsGroup(one_rank_group), _HoldsGroup(one_rank_group)
    sharded.load_state_dict(single.state_dict())
    with pytest.raises(TypeError, match="cannot pickle"):
        copy.deepcopy(single)
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    before = {k: v.clone() for k, v in single.state_dict().items()}
    compare_tp(single, sharded, (x,), grad_output=dy).assert_ok()
    assert all(torch.equal(before[k], v) for k, v in single.state_dict().items())


def test_unknown_policy(one_rank_group):
    with pytest.raises(tpcheck.InputError, match=r"unknown policy 'close'.*'truth'"):
        compare_tp(_mlp(), _mlp(), (torch.randn(4, 8),), policy="close")


def test_unmatched_shards_names_are_listed(one_rank_group):
    with pytest.raises(tpcheck.InputError, match=r"\['fc3.weight'\] match no parameter.*fc1.weight"):
        compare_tp(_mlp(), _mlp(), (torch.randn(4, 8),), shards={"fc3.weight": 0})


def test_gathered_shape_mismatch_names_both_shapes(one_rank_group):
    sharded = MLP(8, 16)
    sharded.fc1.weight = torch.nn.Parameter(torch.randn(8, 8))
    with pytest.raises(tpcheck.InputError, match=r"'fc1.weight'.*\(8, 8\).*\(16, 8\).*shards="):
        compare_tp(_mlp(), sharded, (torch.randn(4, 8),))


def test_inputs_on_different_devices(one_rank_group):
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a
    with pytest.raises(tpcheck.InputError, match=r"different devices.*cpu.*meta"):
        compare_tp(Two(), Two(), (torch.randn(2), torch.randn(2, device="meta")))


def test_buffers_changed_in_forward_are_refused(one_rank_group):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(8)
    with pytest.raises(tpcheck.InputError, match=r"buffer 'running_mean' changed in forward.*BatchNorm"):
        compare_tp(bn, copy.deepcopy(bn), (torch.randn(4, 8),), grad_output=torch.randn(4, 8))
    bn.eval()
    compare_tp(bn, copy.deepcopy(bn), (torch.randn(4, 8),), grad_output=torch.randn(4, 8)).assert_ok()


def test_megatron_partition_stride_reassembles_interleaved_shards(monkeypatch):
    """partition_stride s: the full tensor is cut into s·N pieces and rank r holds pieces
    r, N + r, ... (megatron.core's _initialize_affine_weight_cpu); the gather undoes it.
    Four ranks simulated in this process (all_gather returns every rank's shard)."""
    from tpcheck.judge import _gather as g
    n, stride = 4, 2
    full = torch.arange(16 * 3, dtype=torch.float32).reshape(16, 3)
    pieces = full.split(16 // (n * stride), dim=0)
    shards = [torch.cat(pieces[r::n], dim=0) for r in range(n)]

    def fake_all_gather(out, t, group=None):
        for r in range(n):
            out[r].copy_(shards[r])
    monkeypatch.setattr(g.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(g.dist, "get_world_size", lambda group=None: n)
    monkeypatch.setattr(g.dist, "all_gather", fake_all_gather)
    p = torch.nn.Parameter(shards[1].clone())
    p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, 0, stride
    spec = g.spec_of_parameter("w", p, {})
    assert (spec.dim, spec.stride, spec.source) == (0, 2, "Megatron attributes")
    assert torch.equal(g.gather(p, spec, None), full)


def test_without_a_process_group_compare_tp_runs_alone(monkeypatch):
    """torch.distributed not initialized: one process, no collectives, the same report."""
    from tpcheck.judge import _gather, _group
    monkeypatch.setattr(_group.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(_gather.dist, "is_initialized", lambda: False)
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    assert report.passed and (report.rank, report.tp_size) == (0, 1) and report.raw
    with pytest.raises(tpcheck.InputError, match=r"group= was given but torch.distributed is not initialized"):
        compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, group=object())


# --- the GEMM class from a cuBLASLt trace (no GPU here: a fake trace) ---------------------

def _call(compute="32F", a="f32", math_class=""):
    """One call as tpcheck.trace's ledger writes it (the fields the class is read from)."""
    return {"m": 8, "n": 4, "k": 16, "dtypes": [a, a, a], "math_class": math_class,
            "cublaslt": {"compute_type": compute}}


def test_class_of_a_traced_call():
    from tpcheck.judge._gemm import class_of_call
    assert class_of_call(_call("32F_FAST_TF32")) == "tf32"
    assert class_of_call(_call("32F")) == "fp32"
    assert class_of_call(_call("32F_PEDANTIC")) == "fp32"
    assert class_of_call(_call("32F", "bf16")) == "bf16"
    assert class_of_call(_call("32F", "f16")) == "fp16"
    assert class_of_call(_call("64F", "f64")) == "fp64"
    assert class_of_call(_call("32F_FAST_16BF")) == "bf16"
    assert class_of_call(_call("32F", "f8e4m3")) == "fp8"
    # the capability query's answer (what ran) wins over what the compute type allows
    assert class_of_call(_call("32F_FAST_TF32", math_class="fp32")) == "fp32"
    assert class_of_call(_call("32I", "i8")) == ""


def test_math_class_choice():
    from tpcheck.judge._gemm import choose_math
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_math(None, None, {"fp32", "tf32"}, cpu) == ("tf32", "trace")
    assert choose_math(None, None, {"fp32"}, cpu) == ("fp32", "trace")
    assert choose_math(None, None, {"bf16", "tf32"}, cpu) == ("bf16", "trace")
    assert choose_math("fp32", None, {"tf32"}, cpu) == ("fp32", "math argument")
    assert choose_math("tf32", 1e-3, {"fp32"}, cpu) == (None, "unit_roundoff argument")
    assert choose_math(None, None, None, cpu) == (None, "dtype")
    # no trace: torch's TF32 flag decides on CUDA (the flag object takes no monkeypatch:
    # set and restored by hand)
    flag = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert choose_math(None, None, None, cuda) == ("tf32", "torch.backends.cuda.matmul.allow_tf32")
        assert choose_math(None, None, set(), cuda) == ("tf32", "torch.backends.cuda.matmul.allow_tf32")
        assert choose_math(None, None, {"fp32"}, cuda) == ("fp32", "trace")
        torch.backends.cuda.matmul.allow_tf32 = False
        assert choose_math(None, None, None, cuda) == (None, "dtype")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flag


class _FakeTrace:
    """Stands in for tpcheck.trace: its ledger holds the calls given."""
    calls: list = []
    fail: Exception = None
    opened = 0

    def __init__(self, level=2, query=False, directory=None):
        self.query = query

    def __enter__(self):
        if _FakeTrace.fail is not None:
            raise _FakeTrace.fail
        _FakeTrace.opened += 1
        ledger = type("Ledger", (), {})()
        ledger.calls = list(_FakeTrace.calls)
        return ledger

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_trace(monkeypatch):
    from tpcheck import _trace
    monkeypatch.setattr(_trace, "loaded_cublaslt", lambda: ["/fake/libcublasLt.so.13"])
    monkeypatch.setattr(_trace, "trace", _FakeTrace)
    monkeypatch.delenv("CUBLASLT_LOG_LEVEL", raising=False)  # an outside trace would win
    _FakeTrace.calls, _FakeTrace.fail, _FakeTrace.opened = [], None, 0
    return _FakeTrace


@pytest.mark.parametrize("calls,math,u,source", [
    ([_call("32F_FAST_TF32"), _call("32F")], "tf32", 2.0 ** -11, "trace"),
    ([_call("32F")], "fp32", 2.0 ** -24, "trace"),
], ids=["tf32-seen", "fp32-only"])
def test_compare_tp_takes_u_from_the_traced_gemm_classes(one_rank_group, fake_trace, calls, math,
                                                        u, source):
    fake_trace.calls = calls
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, trace_gemms=True)
    assert fake_trace.opened == 2  # the sharded run and the unsharded one
    m = report.error_model
    assert (m["math"], m["math_source"], m["gemm_classes"]) == (math, source, sorted({
        "tf32" if c["cublaslt"]["compute_type"] == "32F_FAST_TF32" else "fp32" for c in calls}))
    assert m["gemm_calls_traced"] == 2 * len(calls)
    judged = [e for e in report.entries if e["kind"] != "parameter"]
    assert judged and all(e["truth_model"]["unit_roundoff"] == u for e in judged)
    # an explicit math wins over the trace
    r2 = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, trace_gemms=True, math="fp32")
    assert (r2.error_model["math"], r2.error_model["math_source"]) == ("fp32", "math argument")
    assert all(e["truth_model"]["unit_roundoff"] == 2.0 ** -24
               for e in r2.entries if e["kind"] != "parameter")


def test_compare_tp_without_a_usable_trace_falls_back(one_rank_group, fake_trace):
    single = _mlp()
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    # no GEMM recorded
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, trace_gemms=True)
    m = report.error_model
    assert (m["math"], m["math_source"], m["gemm_classes"]) == (None, "dtype", None)
    assert m["gemm_trace_note"] == "the trace recorded no cublasLtMatmul"
    # the trace cannot start (one already open): noted, the comparison goes on
    fake_trace.fail = RuntimeError("tpcheck.trace() blocks cannot be nested")
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, trace_gemms=True)
    assert report.passed and report.error_model["gemm_classes"] is None
    assert "could not start: RuntimeError: tpcheck.trace() blocks cannot be nested" in \
        report.error_model["gemm_trace_note"]
    # a process traced from outside (CUBLASLT_LOG_LEVEL set): its logger is left alone
    fake_trace.fail, fake_trace.opened = None, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUBLASLT_LOG_LEVEL", "2")
        report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy, trace_gemms=True)
    assert fake_trace.opened == 0 and "CUBLASLT_LOG_LEVEL is set" in report.error_model["gemm_trace_note"]
    # on the CPU nothing is traced unless asked
    fake_trace.fail, fake_trace.calls, fake_trace.opened = None, [_call("32F_FAST_TF32")], 0
    report = compare_tp(single, copy.deepcopy(single), (x,), grad_output=dy)
    assert fake_trace.opened == 0 and report.error_model["math"] is None
    assert report.error_model["gemm_trace_note"].startswith("not traced")


def test_a_later_call_reuses_the_first_calls_gemm_trace(one_rank_group, fake_trace, monkeypatch):
    """By default the GEMM classes are traced once per (module, call key): a later call with
    the same modules, input shapes and dtypes and matmul switches reuses them, and says so;
    another key (torch's TF32 switch flipped) traces again; trace_gemms=True every call."""
    from tpcheck.judge._call import Call
    monkeypatch.setattr(Call, "want_trace", property(lambda self: True))  # as on CUDA
    fake_trace.calls = [_call("32F_FAST_TF32")]
    single = _mlp()
    sharded = copy.deepcopy(single)
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    first = compare_tp(single, sharded, (x,), grad_output=dy)
    assert fake_trace.opened == 2 and first.error_model["gemm_trace_reused"] is False
    later = compare_tp(single, sharded, (x,), grad_output=dy)
    assert fake_trace.opened == 2 and later.error_model["gemm_trace_reused"] is True
    assert later.error_model["gemm_classes"] == first.error_model["gemm_classes"] == ["tf32"]
    assert later.error_model["math"] == "tf32"
    compare_tp(single, sharded, (torch.randn(6, 8),), grad_output=torch.randn(6, 8))
    assert fake_trace.opened == 4  # other shapes: another key
    flag = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not flag
        compare_tp(single, sharded, (x,), grad_output=dy)
        assert fake_trace.opened == 6
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flag
    every = compare_tp(single, sharded, (x,), grad_output=dy, trace_gemms=True)
    assert fake_trace.opened == 8 and every.error_model["gemm_trace_reused"] is False


def test_packed_tensors_come_back_bit_for_bit(one_rank_group):
    """compare_tp's collectives move many tensors as one byte buffer (_group.Layout): every
    dtype and shape (empty, 0-d) comes back with its bits, NaN payloads included, each at an
    aligned offset."""
    from tpcheck.judge._checks import same_bits
    from tpcheck.judge._group import Group, Layout
    shapes = [(3, 5), (), (0,), (7,), (2, 3, 4), (5,), (1,)]
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.bool, torch.int64,
              torch.float16, torch.complex64]
    g = torch.Generator().manual_seed(3)
    tensors = []
    for shape, dtype in zip(shapes, dtypes):
        t = torch.randn(shape, generator=g, dtype=torch.float64) * 1e3
        t = t > 0 if dtype == torch.bool else t.to(dtype)
        if dtype.is_floating_point and t.numel():
            t.view(-1)[0] = float("nan")
        tensors.append(t)
    layout = Layout.of(tensors)
    assert all(at % 16 == 0 for _, _, at in layout.entries)
    back = layout.unpack(layout.pack(tensors, torch.device("cpu")))
    assert all(same_bits(a, b) for a, b in zip(tensors, back))
    group = Group(None)
    (gathered,) = group.all_gather_packed(tensors, torch.device("cpu"))
    assert all(same_bits(a, b) for a, b in zip(tensors, gathered))
    assert all(same_bits(a, b) for a, b in zip(tensors, group.tensors_from_root(tensors, torch.device("cpu"))))

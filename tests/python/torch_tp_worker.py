"""The rank side of the compare_tp tests: one spawned process per rank over gloo runs a
list of scenarios (layer × injected bug × seed) and writes, per scenario, whether
compare_tp passed (and which tensors failed), whether torch.testing.assert_close with
its defaults passed the same sharded-vs-unsharded tensors (on rank 0, the one holding
them), how many times this rank computed the fp64 truth, and the rank's report. One
spawn carries many scenarios: starting a torch process costs seconds, a scenario
milliseconds. The "bad-input" scenarios come last: each makes compare_tp raise (on every
rank, the test checks), and the group must still work afterwards.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

# how many times compare_tp ran each part of its judging work in this rank's process
PART_CALLS = {"unsharded run": 0, "float64 run": 0, "probed run": 0}


def _count_part_calls() -> None:
    """Wraps the functions of compare_tp's judging work with counters (once per process)."""
    import tpcheck.judge._work as w
    for part, name in (("unsharded run", "_single_run"), ("float64 run", "exact_run"),
                       ("probed run", "probed_run")):
        real = getattr(w, name)

        def counted(*args, _real=real, _part=part, **kwargs):
            PART_CALLS[_part] += 1
            return _real(*args, **kwargs)
        setattr(w, name, counted)


def _te_rule_fails(report_tensors: dict) -> bool:
    """The reference suite's rule (tpcheck policy "te": the max-difference element, rel >
    rtol and abs > atol, f32 1e-3 / 5e-5) on any of the tensors."""
    import tpcheck
    return any(not tpcheck.compare(single.contiguous(), sharded.contiguous(), policy="te").passed
               for single, sharded in report_tensors.values())


def _assert_close_fails(report_tensors: dict) -> bool:
    for single, sharded in report_tensors.values():
        try:
            torch.testing.assert_close(sharded, single)
        except AssertionError:
            return True
    return False


class _SPModel(torch.nn.Module):
    """LayerNorm → fc1 → GELU → fc2 on [batch, seq, hidden] (DTensor sequence-parallel plan)."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, ffn)
        self.fc2 = torch.nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _dtensor_plan(sp: bool):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    if not sp:
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return {"norm": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1))}


def _inject_dtensor_bug(bug: str):
    """Monkeypatches torch's tensor-parallel styles to carry `bug`; returns an undo."""
    from torch.distributed.tensor.parallel import style
    undo = []
    if bug in ("dropped-allreduce", "rescale"):
        orig = style.RowwiseParallel._prepare_output_fn

        def patched(output_layouts, use_local_output, mod, outputs, device_mesh):
            # a Partial output: keep the rank's partial sum (dropped all-reduce), or reduce
            # and divide by N (rescale)
            if bug == "dropped-allreduce":
                return outputs.to_local()
            out = orig(output_layouts, use_local_output, mod, outputs, device_mesh)
            return out / device_mesh.size()
        style.RowwiseParallel._prepare_output_fn = staticmethod(patched)
        undo.append(lambda: setattr(style.RowwiseParallel, "_prepare_output_fn", staticmethod(orig)))
    return lambda: [u() for u in undo]


class _NoFloat64(torch.nn.Module):
    """A module whose kernel refuses float64 operands (as TE's or flash-attn's do)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if x.dtype == torch.float64:
            raise TypeError("fused_mlp(): incompatible function arguments (float64)")
        return self.inner(x)


def bad_input(bug: str, tp: int) -> None:
    """compare_tp called with input that only some ranks see as bad; it must raise (the
    caller records the error of every rank)."""
    import torch_tp_layers as L
    from tpcheck.torch import compare_tp
    torch.manual_seed(5)
    rank = dist.get_rank()
    single = L.MLP(16, 32)
    sharded = L.TPMLP(single)
    x, dy = torch.randn(8, 4, 16), torch.randn(8, 4, 16)
    kwargs: dict = {}
    if bug == "rank1-unknown-shards" and rank == 1:
        kwargs["shards"] = {"fc3.weight": 0}
    if bug == "rank1-other-input-values" and rank == 1:
        x = x + 1
    if bug == "rank1-other-input-shape" and rank == 1:
        x = torch.randn(8, 2, 16)
    if bug == "rank1-uneven-shard" and rank == 1:
        # one row more of fc1 here than on the other ranks (a split by torch.chunk of an
        # uneven length): one all-gather of every shard cannot take it
        w = sharded.fc1.weight
        sharded.fc1.weight = torch.nn.Parameter(torch.cat([w.detach(), w.detach()[:1]]))
        sharded.fc1.weight.tensor_model_parallel, sharded.fc1.weight.partition_dim = True, 0
    if bug == "no-float64-kernel":
        # a kernel without a float64 path: the truth's runs fail on the ranks that make them
        single, sharded = _NoFloat64(single), _NoFloat64(sharded)
    if bug == "root-only-buffer-change":
        # only rank 0 runs the unsharded module: its BatchNorm (training mode) updates its
        # running statistics there; the sharded twin is in eval()
        single = torch.nn.BatchNorm1d(16)
        sharded = copy.deepcopy(single).eval()
        x, dy = torch.randn(8, 16), torch.randn(8, 16)
    compare_tp(single, sharded, (x,), grad_output=dy, **kwargs)


def scenario(kind: str, bug: str, seed: int, tp: int, policy: str = "truth") -> dict:
    import torch_tp_layers as L
    from tpcheck.torch import compare_tp
    if kind == "bad-input":
        bad_input(bug, tp)
        return {"kind": kind, "bug": bug, "seed": seed, "tp": tp, "raised": False}
    hidden, ffn, seq, batch = 64, 256, 64, 4
    calls_before = dict(PART_CALLS)
    torch.manual_seed(seed)
    L.BUG = bug if kind.startswith("megatron") else "none"
    undo = lambda: None
    if kind.startswith("megatron") or kind == "replica":
        sp = kind == "megatron-sp"
        single = L.MLP(hidden, ffn)
        sharded = L.TPMLP(single, sequence_parallel=sp)
        if kind == "replica" and dist.get_rank() == 1 and bug == "rank1-output-scaled":
            # rank 1's copy of the replicated output is off by 1 %; rank 0's is right
            sharded.register_forward_hook(lambda mod, inp, out: out * 1.01)
        elif kind == "replica" and dist.get_rank() == 1:
            # rank 1's copy: one element one ulp up, far inside any rounding bound
            def one_ulp(mod, inp, out):
                bumped = out.clone()
                bumped.view(-1)[5] = torch.nextafter(out.view(-1)[5], torch.tensor(float("inf")))
                return out + (bumped - out).detach()
            sharded.register_forward_hook(one_ulp)
        x = torch.randn(seq, batch, hidden)
        dy = torch.randn(seq, batch, hidden)
        dims = {"input": 0} if sp else {}
        out_dims = {"output": 0} if sp else {}
    elif kind == "helpers":
        # the ranks that may run the truth's parts: rank 1's unsharded module is not rank
        # 0's (its sharded twin is built first, from the same weights as every rank's)
        single = L.MLP(hidden, ffn)
        sharded = L.TPMLP(single)
        if dist.get_rank() == 1 and bug == "rank1-single-differs":
            with torch.no_grad():
                single.fc1.bias.add_(1.0)
        if dist.get_rank() == 1 and bug == "rank1-single-eval":
            single.eval()  # MLP has no dropout: the same output, another mode
        x = torch.randn(seq, batch, hidden)
        dy = torch.randn(seq, batch, hidden)
        dims, out_dims = {}, {}
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        sp = kind == "dtensor-sp"
        single = _SPModel(hidden, ffn) if sp else L.MLP(hidden, ffn)
        with torch.no_grad():  # LayerNorm's default init hides its gradients' structure
            for p in single.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        mesh = init_device_mesh("cpu", (tp,))
        undo = _inject_dtensor_bug(bug)  # before parallelize_module: it binds the hooks
        sharded = parallelize_module(copy.deepcopy(single), mesh, _dtensor_plan(sp))
        x = torch.randn(batch, seq, hidden)
        dy = torch.randn(batch, seq, hidden)
        dims = {"input": 1} if sp else {}
        out_dims = {"output": 1} if sp else {}
    if kind.endswith("-fwd"):
        dy = None  # forward only: an inference TP check
    try:
        report = compare_tp(single, sharded, (x,), grad_output=dy, input_dims=dims,
                            output_dims=out_dims, policy=policy,
                            replicas="judge" if bug.endswith("-judge") else "identical",
                            spread_truth=bug != "spread-off")
    finally:
        undo()
        L.BUG = "none"
    pairs = {}
    # assert_close with defaults on the same tensors: rebuild them from the report's runs
    # (report.raw: filled on rank 0, which judged; empty on the others)
    for e in report.entries:
        if e["kind"] != "parameter" and e["name"] in report.raw:
            pairs[e["name"]] = report.raw[e["name"]]
    shared = report.to_dict()
    shared.pop("rank")  # the caller's rank: the one field that differs between ranks
    try:
        report.assert_ok()
        assert_ok = None
    except AssertionError as e:
        assert_ok = str(e).split(": ", 1)[1]  # the reason, without "compare_tp, rank r of N"
    return {"kind": kind, "bug": bug, "seed": seed, "tp": tp, "passed": report.passed,
            "failing": [e["name"] for e in report.failures],
            "reasons": [list(e["verdicts"].values())[0]["reason"] for e in report.failures][:3],
            "assert_close_fails": _assert_close_fails(pairs), "te_rule_fails": _te_rule_fails(pairs),
            "part_calls": {k: v - calls_before[k] for k, v in PART_CALLS.items()},
            "report": shared,
            "assert_ok": assert_ok, "raw_names": sorted(report.raw),
            "kinds": sorted({e["kind"] for e in report.entries}), "backward": report.backward}


def rank_main(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    # a rank left waiting in a collective fails the test in two minutes instead of hanging
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    _count_part_calls()
    results = []
    try:
        for job in jobs:
            try:
                results.append(scenario(**job, tp=world))
            except Exception as e:  # a scenario's error is its result, the others still run
                results.append({**job, "tp": world, "error": f"{type(e).__name__}: {e}",
                                "error_type": type(e).__name__,
                                "traceback": traceback.format_exc()})
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


def run_spawned(world: int, jobs: list, out_dir: str) -> list[list[dict]]:
    """Runs `jobs` on `world` gloo ranks; returns each rank's results."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    mp.spawn(rank_main, args=(world, port, jobs, out_dir), nprocs=world, join=True)
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out

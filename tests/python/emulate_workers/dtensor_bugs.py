"""Bugs injected into PyTorch DTensor itself, judged by compare_tp, under
`python -m tpcheck emulate -n N` (test_torch_dtensor_bugs.py launches it once per TP size).

  python dtensor_bugs.py JOBS.json OUTDIR
JOBS.json: a list of {"kind": "dtensor" | "dtensor-sp", "bug": ..., "seed": ...}. Every job
runs in turn in this one launch (starting N torch processes costs seconds, a job tens of
milliseconds); each rank writes OUTDIR/rank<r>.json: per job, whether compare_tp (policy
truth) passed, the failing tensors as [kind, name], and how many times the injected bug
fired (so a bug whose code path never ran cannot pass for "caught").

The bugs are monkeypatches of the library, where a real one would be:
  dropped-allreduce   torch.distributed._functional_collectives.all_reduce /
                      reduce_scatter_tensor return this rank's partial value unreduced
                      (forward; RowwiseParallel's Partial -> Replicate / Shard(1))
  grad-averaged       the same collectives average instead of sum in backward (the
                      column-parallel input gradient; the sequence-parallel reduce-scatter)
  rescale             their forward result divided by N
  wrong-group-gather  all_gather_tensor assembles the pieces of the wrong ranks (rotated by
                      one), forward and backward (the sequence-parallel all-gather)
  shard-offset        ColwiseParallel's partition of the weight and bias takes each rank's
                      rows one row further on (DTensor.from_local of the wrong slice)
The collective bugs act only inside the sharded module's forward (its forward pre-hook to
its forward hook) and backward (while autograd runs a node): compare_tp's own gathering
(full_tensor of the parameters and gradients) goes through the same functions and must
stay correct, or the test would judge a broken gatherer instead of the layer.
"""

import copy
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import torch_tp_layers as L  # noqa: E402
from torch_tp_worker import _SPModel, _dtensor_plan  # noqa: E402  (the layers test_torch_compare judges)

import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from torch.distributed.tensor.parallel import style  # noqa: E402

HIDDEN, FFN, SEQ, BATCH = 64, 256, 64, 4

BUG = "none"
IN_FORWARD = False   # set by hooks on the sharded module
FIRED = 0            # how many times the bug changed a result in the current job


def _phase():
    if torch._C._current_autograd_node() is not None:
        return "backward"
    return "forward" if IN_FORWARD else None


def _fire():
    global FIRED
    FIRED += 1


_orig_all_reduce = funcol.all_reduce
_orig_reduce_scatter = funcol.reduce_scatter_tensor
_orig_all_gather = funcol.all_gather_tensor
_orig_partition = style.ColwiseParallel._partition_linear_fn


def _group_size(group):
    mesh, dim = group  # DTensor passes (mesh, mesh_dim)
    return mesh.size(dim)


def all_reduce(t, reduceOp, group, tag=""):
    phase = _phase()
    if phase == "forward" and BUG == "dropped-allreduce":
        _fire()
        return t.clone()
    if phase == "backward" and BUG == "grad-averaged" and reduceOp == "sum":
        _fire()
        reduceOp = "avg"
    out = _orig_all_reduce(t, reduceOp, group, tag)
    if phase == "forward" and BUG == "rescale":
        _fire()
        out = out / _group_size(group)
    return out


def reduce_scatter_tensor(t, reduceOp, scatter_dim, group, tag=""):
    phase = _phase()
    if phase == "forward" and BUG == "dropped-allreduce":
        _fire()  # this rank's own partial, not summed over the ranks
        mesh, dim = group
        return t.chunk(_group_size(group), scatter_dim)[mesh.get_local_rank(dim)].clone()
    if phase == "backward" and BUG == "grad-averaged" and reduceOp == "sum":
        _fire()
        reduceOp = "avg"
    out = _orig_reduce_scatter(t, reduceOp, scatter_dim, group, tag)
    if phase == "forward" and BUG == "rescale":
        _fire()
        out = out / _group_size(group)
    return out


def all_gather_tensor(t, gather_dim, group, tag=""):
    out = _orig_all_gather(t, gather_dim, group, tag)
    if _phase() is not None and BUG == "wrong-group-gather":
        _fire()
        pieces = out.chunk(_group_size(group), gather_dim)
        out = torch.cat(pieces[1:] + pieces[:1], gather_dim)
    return out


def partition_linear(self, name, module, device_mesh):
    if BUG != "shard-offset":
        return _orig_partition(self, name, module, device_mesh)
    n, r = device_mesh.size(), device_mesh.get_local_rank()
    for p_name, param in list(module.named_parameters()):
        rows = param.shape[0] // n
        idx = torch.arange(r * rows + 1, r * rows + 1 + rows) % param.shape[0]
        local = param.detach().index_select(0, idx)
        _fire()
        module.register_parameter(p_name, torch.nn.Parameter(
            DTensor.from_local(local, device_mesh, [Shard(0)], run_check=False),
            requires_grad=param.requires_grad))


funcol.all_reduce = all_reduce
funcol.reduce_scatter_tensor = reduce_scatter_tensor
funcol.all_gather_tensor = all_gather_tensor
style.ColwiseParallel._partition_linear_fn = partition_linear


def job(kind, bug, seed, mesh):
    global BUG, FIRED, IN_FORWARD
    from torch.distributed.tensor.parallel import parallelize_module
    from tpcheck.torch import compare_tp
    sp = kind == "dtensor-sp"
    torch.manual_seed(seed)
    single = _SPModel(HIDDEN, FFN) if sp else L.MLP(HIDDEN, FFN)
    with torch.no_grad():  # as test_torch_compare: LayerNorm's default init hides its gradients
        for p in single.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    dy = torch.randn(BATCH, SEQ, HIDDEN)
    BUG, FIRED, IN_FORWARD = bug, 0, False
    try:
        sharded = parallelize_module(copy.deepcopy(single), mesh, _dtensor_plan(sp))

        def enter(*_):
            global IN_FORWARD
            IN_FORWARD = True

        def leave(*_):
            global IN_FORWARD
            IN_FORWARD = False
        sharded.register_forward_pre_hook(enter)
        sharded.register_forward_hook(leave)
        report = compare_tp(single, sharded, (x,), grad_output=dy, policy="truth",
                            input_dims={"input": 1} if sp else {},
                            output_dims={"output": 1} if sp else {})
    finally:
        BUG, IN_FORWARD = "none", False
    return {"kind": kind, "bug": bug, "seed": seed, "passed": report.passed, "fired": FIRED,
            "failing": [[e["kind"], e["name"]] for e in report.failures],
            "reasons": [list(e["verdicts"].values())[0]["reason"] for e in report.failures][:3]}


def main():
    jobs_path, out_dir = sys.argv[1], sys.argv[2]
    with open(jobs_path) as f:
        jobs = json.load(f)
    dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = []
    try:
        for j in jobs:
            try:
                results.append(job(**j, mesh=mesh))
            except Exception as e:  # a job's error is its result; the others still run
                results.append({**j, "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()})
    finally:
        with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()

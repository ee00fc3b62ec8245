"""TransformerEngine stand-ins (te_standins.py) sharded at TP N, judged by compare_tp under
`truth` with tpcheck's layer as their float64 reference (judge/_te_reference.py). Run by
test_te_reference.py under `python -m tpcheck emulate -n N -- te_standins_tp.py OUT.json`;
rank 0 writes, per case, whether compare_tp passed and the failing tensors.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import te_standins as S  # noqa: E402
from tpcheck.judge import register_reference  # noqa: E402
from tpcheck.judge._te_reference import te_module_reference  # noqa: E402
from tpcheck.torch import compare_tp  # noqa: E402

dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
R, N = dist.get_rank(), dist.get_world_size()
for cls in (S.Linear, S.LayerNormMLP):
    register_reference(cls, te_module_reference)

CASES = [
    ("LayerNormMLP gelu LayerNorm", lambda **k: S.LayerNormMLP(32, 64, **k), {}),
    ("LayerNormMLP swiglu RMSNorm",
     lambda **k: S.LayerNormMLP(32, 64, normalization="RMSNorm", activation="swiglu", **k), {}),
    ("Linear row", lambda **k: S.Linear(64, 32, parallel_mode="row", **k), {"input": -1}),
]


def case(name, make, input_dims, bug, seed):
    torch.manual_seed(seed)
    single = make()
    with torch.no_grad():
        for p in single.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    extra = {"set_parallel_mode": True} if "MLP" in name else {}
    sharded = make(tp_group=dist.group.WORLD, tp_size=N, **extra)
    S.shard_like_te(single, sharded, R, N)
    hidden = 64 if "Linear" in name else 32
    x = torch.randn(8, 2, hidden)
    dy = torch.randn(8, 2, 32)
    S.BUG = bug
    try:
        report = compare_tp(single, sharded, (x,), grad_output=dy, input_dims=input_dims)
    finally:
        S.BUG = "none"
    return {"case": name, "bug": bug, "seed": seed, "passed": report.passed,
            "failing": [e["name"] for e in report.failures],
            "k": report.error_model.get("reduction_length"),
            "references": report.truth_references}


def delayed_scaling_step(module, group, reduce):
    """What TE's delayed scaling leaves after a step, on a stand-in: the module's forward
    state (input, weight, output amaxes; history length 4) with this rank's amaxes
    max-reduced over `group` (reduce=True) or left alone, rolled into the history, and the
    scales computed from the history's maximum (E4M3's 448, margin 0)."""
    from types import SimpleNamespace
    if not hasattr(module, "fp8_meta"):
        module.fp8_meta = {"scaling_fwd": SimpleNamespace(amax_history=torch.zeros(4, 3),
                                                          scale=torch.ones(3)),
                           "recipe": SimpleNamespace(reduce_amax=reduce)}
    state = module.fp8_meta["scaling_fwd"]
    amax = torch.stack([torch.rand(()) + 1.0 + 0.5 * R, module.weight.abs().max().detach(),
                        torch.rand(()) + 2.0])
    if reduce:
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    state.amax_history.copy_(torch.roll(state.amax_history, -1, 0))
    state.amax_history[-1] = amax
    state.scale.copy_(448.0 / state.amax_history.max(0).values)


def state_case(bug, seed):
    """compare_tp on a row-parallel Linear whose FP8 state two steps left: every rank's
    the same after reduced amaxes; each its own when they were not reduced."""
    torch.manual_seed(seed)
    single = S.Linear(64, 32, parallel_mode="row")
    with torch.no_grad():
        for p in single.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    sharded = S.Linear(64, 32, parallel_mode="row", tp_group=dist.group.WORLD, tp_size=N)
    S.shard_like_te(single, sharded, R, N)
    torch.manual_seed(seed + 1)  # the same activations' amaxes on every rank
    for _ in range(2):
        delayed_scaling_step(sharded, dist.group.WORLD, reduce=bug == "none")
    x, dy = torch.randn(8, 2, 64), torch.randn(8, 2, 32)
    report = compare_tp(single, sharded, (x,), grad_output=dy, input_dims={"input": -1})
    return {"case": "Linear row, FP8 state", "bug": bug, "seed": seed, "passed": report.passed,
            "failing": [e["name"] for e in report.failures],
            "state": [e["name"] for e in report.entries if e["kind"] == "replicated_state"],
            "reasons": [e["reason"] for e in report.failures], "notes": report.notes,
            "references": report.truth_references}


results = []
for seed in (101, 102):
    results.append(state_case("none", seed))
results.append(state_case("amax-not-reduced", 7))
for name, make, dims in CASES:
    for seed in (101, 102):
        results.append(case(name, make, dims, "none", seed))
    results.append(case(name, make, dims, "drop-reduction", 7))
if R == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
print("DONE")

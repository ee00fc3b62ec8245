"""compare_tp on TransformerEngine's own modules at TP N on one GPU, judged by the float64
truth with tpcheck's layer standing in for the TE module (judge/_te_reference.py; issue 43
item 2). tests/gpu/run.sh's `te` stage runs it (part `compare`):

  python3 -m tpcheck emulate -n N -- tests/gpu/te_compare_tp.py OUT.json

Per case, on every rank as a TE user shards it: the unsharded module (tp_size 1) and the
sharded one (tp_group = the launch's group, tp_size N, parallel_mode / set_parallel_mode),
the sharded parameters sliced from the unsharded ones the way TE lays them out (dim-0/1
slices; gated fc1's rank r holds [a_r; b_r]); input [64, 2, hidden] (under sequence
parallel each rank takes its tokens: LayerNormLinear, LayerNorm, RMSNorm, LayerNormMLP), a
random loss gradient; compare_tp under `truth` and `te`, first call and a second call timed (each call's
phases kept). First, the replicated FP8 state (issue 43 item 5): Linear column, Linear row
and LayerNormMLP after two delayed-scaling steps under TE's autocast, then compare_tp
outside it; with the amaxes reduced over the TP group the state is every rank's and the
call passes, with `reduce_amax=False` or the amaxes reduced over a one-rank group it fails
on the state alone. One bug:
LayerNormMLP's forward all-reduce of fc2 skipped (TE's `allreduce` in
module/layernorm_mlp.py returning this rank's partial sum), which must fail under `truth`.
Rank 0 writes OUT.json and prints a table; exit status 1 when a correct case fails under
`truth`, the bug passes, or a case raises.
"""

import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
R, N = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
DEV = torch.device("cuda", torch.cuda.current_device())

import transformer_engine.pytorch as te  # noqa: E402
from te_sharding import shard_from, sp, tp_kwargs  # noqa: E402  (beside this file)
import transformer_engine.pytorch.module.layernorm_mlp as te_mlp  # noqa: E402
from tpcheck.torch import compare_tp  # noqa: E402

H, F = 256, 1024
CASES = [
    # name, constructor of (tp kwargs) -> module, hidden in, hidden out, input/output dims
    ("LayerNormMLP gelu LayerNorm", lambda dt, **k: te.LayerNormMLP(H, F, params_dtype=dt, device="cuda", **k),
     "mlp", {}, {}),
    ("LayerNormMLP swiglu RMSNorm", lambda dt, **k: te.LayerNormMLP(
        H, F, normalization="RMSNorm", activation="swiglu", params_dtype=dt, device="cuda", **k),
     "mlp", {}, {}),
    ("Linear column", lambda dt, **k: te.Linear(H, 2 * H, params_dtype=dt, device="cuda", **k),
     "column", {}, {"output": -1}),
    ("Linear row", lambda dt, **k: te.Linear(2 * H, H, params_dtype=dt, device="cuda", **k),
     "row", {"input": -1}, {}),
    ("LayerNormLinear column", lambda dt, **k: te.LayerNormLinear(
        H, 2 * H, params_dtype=dt, device="cuda", **k), "column", {}, {"output": -1}),
    ("LayerNormLinear column, sequence parallel", lambda dt, **k: te.LayerNormLinear(
        H, 2 * H, params_dtype=dt, device="cuda", **sp(k)), "column", {"input": 0}, {"output": -1}),
    ("LayerNorm, sequence parallel", lambda dt, **k: te.LayerNorm(
        H, params_dtype=dt, device="cuda", **k), "norm", {"input": 0}, {"output": 0}),
    ("RMSNorm zero-centred gamma, sequence parallel", lambda dt, **k: te.RMSNorm(
        H, zero_centered_gamma=True, params_dtype=dt, device="cuda", **k), "norm",
     {"input": 0}, {"output": 0}),
    ("LayerNormMLP gelu LayerNorm, sequence parallel", lambda dt, **k: te.LayerNormMLP(
        H, F, params_dtype=dt, device="cuda", **sp(k)), "mlp", {"input": 0}, {"output": 0}),
    ("MultiheadAttention LayerNorm GQA causal", lambda dt, **k: te.MultiheadAttention(
        H, 8, num_gqa_groups=4, input_layernorm=True, attention_dropout=0.0, params_dtype=dt,
        device="cuda", **k), "mha", {}, {}),
    ("TransformerLayer LayerNorm gelu GQA", lambda dt, **k: te.TransformerLayer(
        H, F, 8, num_gqa_groups=4, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dt,
        device="cuda", **k), "mha", {}, {}),
]


def case(name, make, kind, in_dims, out_dims, dtype, bug):
    torch.manual_seed(11)
    single = make(dtype)
    with torch.no_grad():
        for p in single.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.05))
    sharded = make(dtype, **tp_kwargs(kind, dist.group.WORLD, N))
    shard_from(single, sharded, R, N)
    hidden_in = 2 * H if kind == "row" else H
    hidden_out = 2 * H if kind == "column" else H
    g = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(64, 2, hidden_in, device=DEV, generator=g).to(dtype)
    dy = torch.randn(64, 2, hidden_out, device=DEV, generator=g).to(dtype)
    original = te_mlp.allreduce
    if bug:
        te_mlp.allreduce = lambda inp, grp=None, async_op=False: (
            (inp, None) if not async_op else original(inp, grp, async_op))
    out = {"case": name, "dtype": str(dtype).replace("torch.", ""), "bug": bug}
    try:
        for policy in ("truth", "te"):
            times, phases = [], []
            for _ in range(2):
                t = time.perf_counter()
                report = compare_tp(single, sharded, (x,), grad_output=dy, input_dims=in_dims,
                                    output_dims=out_dims, policy=policy)
                times.append(round(time.perf_counter() - t, 3))
                phases.append(report.seconds)
            out[policy] = {"passed": report.passed, "failing": [e["name"] for e in report.failures][:6],
                           "reasons": [list(e["verdicts"].values())[0]["reason"][:300]
                                       for e in report.failures][:2],
                           "seconds": times, "phases": phases, "error_model": report.error_model,
                           "references": report.truth_references}
    except Exception as e:  # noqa: BLE001 - the case's error is its row
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    finally:
        te_mlp.allreduce = original
    return out


def first_plain_step(module):
    """Seconds of one unquantized forward + backward of `module` alone (its kernels' first
    use in this process when it is the first), kept apart from compare_tp's own time."""
    x = torch.randn(64, 2, module.weight.shape[1] if hasattr(module, "weight") else H,
                    device=DEV, requires_grad=True)
    t = time.perf_counter()
    module(x).sum().backward()
    torch.cuda.synchronize()
    module.zero_grad(set_to_none=True)
    return round(time.perf_counter() - t, 3)


def fp8_state_case(name, make, kind, in_dims, out_dims, bug):
    """Two training steps of the sharded module under FP8 delayed scaling (TE's autocast
    with the amaxes reduced over the TP group, as run_numerics.py does), then compare_tp
    outside it: the state the steps left (amax histories, scales) must be the same on every
    rank. The bugs: DelayedScaling(reduce_amax=False); the amaxes reduced over a group of
    one rank (an fp8 group that is not the TP group)."""
    from transformer_engine.common.recipe import DelayedScaling
    torch.manual_seed(11)
    single = make(torch.float32)
    with torch.no_grad():
        for p in single.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.05))
    sharded = make(torch.float32, **tp_kwargs(kind, dist.group.WORLD, N))
    shard_from(single, sharded, R, N)
    own = [dist.new_group([r]) for r in range(N)][R]   # every rank makes every group
    recipe = DelayedScaling(amax_history_len=4, reduce_amax=bug != "reduce_amax=False")
    group = own if bug == "fp8 group of one rank" else dist.group.WORLD
    hidden_in = 2 * H if kind == "row" else H
    hidden_out = 2 * H if kind == "column" else H
    g = torch.Generator(device="cuda").manual_seed(12)
    out = {"case": f"{name}, FP8 state after 2 delayed-scaling steps", "dtype": "float32",
           "bug": bug or False}
    try:
        for _ in range(2):
            x = torch.randn(64, 2, hidden_in, device=DEV, generator=g)
            dy = torch.randn(64, 2, hidden_out, device=DEV, generator=g)
            x_local = x.chunk(N, -1)[R] if kind == "row" else x
            dy_local = dy.chunk(N, -1)[R] if kind == "column" else dy
            with te.autocast(enabled=True, recipe=recipe, amax_reduction_group=group):
                y = sharded(x_local)
            y.backward(dy_local)
        if not bug:   # TE's own first unquantized fwd+bwd in this process, for the timings
            out["te_first_fwd_bwd_s"] = first_plain_step(single)
        t = time.perf_counter()
        report = compare_tp(single, sharded, (x,), grad_output=dy, input_dims=in_dims,
                            output_dims=out_dims)
        state = [e for e in report.entries if e["kind"] == "replicated_state"]
        out["truth"] = {"passed": report.passed,
                        "failing": [e["name"] for e in report.failures][:6],
                        "reasons": [e["reason"][:300] for e in report.failures][:2],
                        "state_entries": len(state), "seconds": [round(time.perf_counter() - t, 3)],
                        "phases": [report.seconds],
                        "state_only": all(e["kind"] == "replicated_state" for e in report.failures)}
        out["te"] = {"passed": None, "failing": []}
    except Exception as e:  # noqa: BLE001 - the case's error is its row
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


results = []
for name, make, kind, in_dims, out_dims in CASES[:4]:
    for bug in ("", "reduce_amax=False", "fp8 group of one rank"):
        results.append(fp8_state_case(name, make, kind, in_dims, out_dims, bug))
for dtype in (torch.float32, torch.bfloat16):
    for name, make, kind, in_dims, out_dims in CASES:
        results.append(case(name, make, kind, in_dims, out_dims, dtype, False))
    results.append(case(CASES[0][0], CASES[0][1], "mlp", {}, {}, dtype, True))

ok = True
if R == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
    print(f"| TE module, TP {N} | dtype | bug | truth | te | compare_tp s, truth (first, second) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            ok = False
            print(f"| {r['case']} | {r['dtype']} | {r['bug']} | ERROR {r['error'][:200]} | | |")
            continue
        want = not r["bug"]
        ok &= r["truth"]["passed"] == want
        if "state_entries" in r["truth"]:   # an FP8-state case fails on the state alone
            ok &= r["truth"]["state_entries"] > 0 and r["truth"]["state_only"]
        fmt = lambda v: ("-" if v["passed"] is None else "pass" if v["passed"]
                         else f"FAIL {v['failing'][:3]}")
        print(f"| {r['case']} | {r['dtype']} | {r['bug']} | {fmt(r['truth'])} | {fmt(r['te'])} "
              f"| {', '.join(str(v) for v in r['truth']['seconds'])} |")
    first = results[0]
    if "truth" in first:
        print(f"the process's first compare_tp ({first['case']}): {first['truth']['seconds'][0]} s, "
              f"phases {first['truth']['phases'][0]}; TE's own first unquantized fwd+bwd of the "
              f"unsharded module just before it: {first.get('te_first_fwd_bwd_s')} s")
    print("te_compare_tp: every expectation under truth holds" if ok else
          "te_compare_tp: EXPECTATIONS NOT MET")
sys.exit(0 if ok else 1)

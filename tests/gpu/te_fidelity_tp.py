"""tpcheck's sharded layers against TransformerEngine's sharded modules at TP N on one GPU:
the fidelity table of tests/gpu/te_modules.py, at TP N. tests/gpu/run.sh's `te` stage runs
it (part `fidelity`):

  python3 -m tpcheck emulate -n N -- tests/gpu/te_fidelity_tp.py OUT.json

Per configuration, on every rank as a TE user shards it: TE's unsharded module and its
sharded twin (tp_group = the launch's group, tp_size N, parallel_mode / set_parallel_mode,
sequence parallel where named), the sharded parameters sliced from the unsharded ones as TE
lays them out; the same full input [tokens / 2, 2, hidden] and output gradient on every
rank. CASES run unquantized in float32 (TF32 GEMMs) and bf16; RECIPE_CASES run one step
of the quantized recipes TE runs on Hopper (float32 parameters, every Linear GEMM
quantized; `te.autocast` with the launch's group as the amax reduction group). Each
rank runs its shard forward and backward; its outputs, input gradient and parameter
gradients are gathered to full tensors (compare_tp's gathers: TE's partition attributes,
gated fc1 with stride 2, sequence-parallel parameters' gradients all-reduced). Rank 0 then
runs, on the same full parameters, input and gradient:
  - tpcheck's layer sharded at TP N as the suite runs it (`tpcheck.layer_run(tp_size=N)`:
    N thread ranks on this GPU over the device group, NCCL's ring order; same dtype, TF32
    GEMMs for float32; `recipe=` the same recipe, as `tpcheck run --recipe` quantizes);
  - the float64 truth of TE's unsharded module (the module truth, with its probe).
Per tensor: bitwise equality of TE's and tpcheck's, and the truth policy both ways
(tp_size N; TF32's u for unquantized float32, the dtype's for the recipes, whose
quantization error is in each run's own error: docs/QUANTIZATION.md). Rank 0 writes OUT.json and prints a table; exit status 1 when a tensor fails
either way or a configuration raises.
"""

import dataclasses
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
R, N = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
DEV = torch.device("cuda", torch.cuda.current_device())

import transformer_engine.pytorch as te  # noqa: E402
from te_sharding import shard_from, sp, tp_kwargs  # noqa: E402  (beside this file)
import tpcheck  # noqa: E402
from tpcheck.judge import module_truth  # noqa: E402
from tpcheck.judge._gather import ShardSpec, gather, spec_of_parameter  # noqa: E402
from tpcheck.judge._te_mapping import te_layer_spec  # noqa: E402
from tpcheck.judge._te_reference import te_gather_strides  # noqa: E402

H, F = 64, 128
# name, constructor (dtype, **tp keywords), kind, input dim and output dim of the shards
CASES = [
    ("Linear column", lambda dt, **k: te.Linear(H, 2 * H, params_dtype=dt, device="cuda", **k),
     "column", None, -1),
    ("Linear row", lambda dt, **k: te.Linear(2 * H, H, params_dtype=dt, device="cuda", **k),
     "row", -1, None),
    ("LayerNormLinear column, sequence parallel", lambda dt, **k: te.LayerNormLinear(
        H, 2 * H, params_dtype=dt, device="cuda", **sp(k)), "column", 0, -1),
    ("LayerNormMLP gelu LayerNorm", lambda dt, **k: te.LayerNormMLP(
        H, F, params_dtype=dt, device="cuda", **k), "mlp", None, None),
    ("LayerNormMLP swiglu RMSNorm, sequence parallel", lambda dt, **k: te.LayerNormMLP(
        H, F, normalization="RMSNorm", activation="swiglu", params_dtype=dt, device="cuda",
        **sp(k)), "mlp", 0, 0),
    ("MultiheadAttention LayerNorm GQA causal", lambda dt, **k: te.MultiheadAttention(
        H, 8, num_gqa_groups=4, input_layernorm=True, attention_dropout=0.0, params_dtype=dt,
        device="cuda", **k), "mha", None, None),
    ("TransformerLayer LayerNorm gelu GQA", lambda dt, **k: te.TransformerLayer(
        H, F, 8, num_gqa_groups=4, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dt,
        device="cuda", **k), "mha", None, None),
]
# One step of each quantized recipe TE runs on Hopper: (recipe, name, constructor, kind,
# input dim and output dim of the shards, tokens, input features). FP8 GEMMs need multiples of 16 in every
# shard; block scaling quantizes in blocks of 128 along the features and, for the weight
# gradient, the tokens, so its shards and token count are multiples of 128.
RECIPE_CASES = [
    (r, name, make, kind, in_dim, out_dim, 64, 2 * H if kind == "row" else H)
    for r in ("fp8", "fp8_cs")
    for name, make, kind, in_dim, out_dim in CASES[:4]  # Linear column and row, LNLinear SP, LNMLP
] + [
    ("fp8_block_scaling", "Linear column", lambda dt, **k: te.Linear(
        128, 128 * N, params_dtype=dt, device="cuda", **k), "column", None, -1, 128, 128),
    ("fp8_block_scaling", "LayerNormMLP gelu LayerNorm", lambda dt, **k: te.LayerNormMLP(
        128, 128 * N, params_dtype=dt, device="cuda", **k), "mlp", None, None, 128, 128),
]


def te_recipe(name):
    """TE's recipe object of tpcheck's recipe name (TE's defaults: the HYBRID format)."""
    from transformer_engine.common import recipe as r
    return {"fp8": r.DelayedScaling, "fp8_cs": r.Float8CurrentScaling,
            "fp8_block_scaling": r.Float8BlockScaling}[name]()


def gathered_gradients(single, sharded):
    """Every parameter gradient of the sharded module as a full tensor, as compare_tp
    gathers it."""
    strides = te_gather_strides(sharded)
    out = {}
    for name, p in sharded.named_parameters():
        g = p.grad.detach()
        if getattr(p, "sequence_parallel", False):  # partial sums, reduced by the framework
            g = g.clone()
            dist.all_reduce(g)
        if p.shape == single.get_parameter(name).shape:
            spec = ShardSpec(None)
        else:
            spec = dataclasses.replace(spec_of_parameter(name, p, {}), stride=strides.get(name, 1))
        out[name] = gather(g, spec, dist.group.WORLD)
    return out


def case(name, make, kind, in_dim, out_dim, dtype, recipe=None, tokens=64, hidden_in=None):
    torch.manual_seed(21)
    single = make(dtype)
    with torch.no_grad():
        for p in single.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.1))
    sharded = make(dtype, **tp_kwargs(kind, dist.group.WORLD, N))
    shard_from(single, sharded, R, N)
    hidden_in = hidden_in or (2 * H if kind == "row" else H)
    g = torch.Generator(device="cuda").manual_seed(22)
    x = torch.randn(tokens // 2, 2, hidden_in, device=DEV, generator=g).to(dtype)
    with torch.no_grad():
        hidden_out = single(x.clone())
        hidden_out = (hidden_out[0] if isinstance(hidden_out, tuple) else hidden_out).shape[-1]
    dy = torch.randn(tokens // 2, 2, hidden_out, device=DEV, generator=g).to(dtype)

    x_local = (x.chunk(N, in_dim)[R] if in_dim is not None else x).clone().requires_grad_()
    with te.autocast(enabled=recipe is not None,
                     recipe=te_recipe(recipe) if recipe is not None else None,
                     amax_reduction_group=dist.group.WORLD if recipe is not None else None):
        y = sharded(x_local)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(dy.chunk(N, out_dim)[R] if out_dim is not None else dy)
    te_full = {"output": gather(y.detach(), ShardSpec(out_dim), dist.group.WORLD),
               "input": gather(x_local.grad.detach(), ShardSpec(in_dim), dist.group.WORLD),
               **gathered_gradients(single, sharded)}
    if R != 0:
        return None

    spec = te_layer_spec(sharded)
    state = {k: v.detach() for k, v in single.state_dict().items() if not k.endswith("_extra_state")}
    run = tpcheck.layer_run(spec.kind, spec.options, spec.to_tpcheck(state), x, grad_output=dy,
                            dtype=dtype, device="cuda", tf32=True, tp_size=N, recipe=recipe)
    ours = spec.to_te({"output": run.output, **run.input_grads, **run.grads})
    truth = module_truth(single, x.detach(), grad_output=dy.detach())
    math = "tf32" if dtype == torch.float32 and recipe is None else None
    tensors = {}
    for k, t_te in te_full.items():
        mine = torch.as_tensor(ours[k]).to(device=t_te.device, dtype=t_te.dtype)
        t = truth.truth_for(k, tp_size=N)
        a = tpcheck.compare(mine, t_te, t, policy="truth", math=math, name=k)
        b = tpcheck.compare(t_te, mine, t, policy="truth", math=math, name=k)
        tensors[k] = {"bitwise_equal": bool(torch.equal(t_te, mine)), "te_within_tpcheck": a.passed,
                      "tpcheck_within_te": b.passed,
                      "reasons": [v.reason for v in (a, b) if not v.passed]}
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "tp": N,
            "recipe": recipe or "none", "tpcheck_layer": spec.kind, "tpcheck_options": spec.options, "tensors": tensors,
            "ok": all(v["te_within_tpcheck"] and v["tpcheck_within_te"] for v in tensors.values())}


results = []
for dtype in (torch.float32, torch.bfloat16):
    for name, make, kind, in_dim, out_dim in CASES:
        try:
            r = case(name, make, kind, in_dim, out_dim, dtype)
        except Exception as e:  # noqa: BLE001 - the configuration's error is its row
            r = {"name": name, "dtype": str(dtype).replace("torch.", ""), "tp": N, "ok": False,
                 "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        if r is not None:
            results.append(r)
for recipe, name, make, kind, in_dim, out_dim, tokens, hidden_in in RECIPE_CASES:
    try:
        r = case(name, make, kind, in_dim, out_dim, torch.float32, recipe, tokens, hidden_in)
    except Exception as e:  # noqa: BLE001 - the configuration's error is its row
        r = {"name": name, "dtype": "float32", "recipe": recipe, "tp": N, "ok": False,
             "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    if r is not None:
        results.append(r)

ok = True
if R == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
    print(f"| TE module, TP {N} | dtype | recipe | tensors | bitwise equal | truth policy both ways |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ok &= r["ok"]
        if "error" in r:
            print(f"| {r['name']} | {r['dtype']} | {r.get('recipe', 'none')} | ERROR {r['error'][:300]} | | |")
            continue
        n = len(r["tensors"])
        both = [k for k, v in r["tensors"].items() if v["te_within_tpcheck"] and v["tpcheck_within_te"]]
        bad = sorted(set(r["tensors"]) - set(both))
        print(f"| {r['name']} | {r['dtype']} | {r['recipe']} | {n} | "
              f"{sum(v['bitwise_equal'] for v in r['tensors'].values())} | {len(both)}/{n}"
              f"{' FAIL ' + str(bad[:4]) if bad else ''} |")
    print(f"te_fidelity_tp: TP {N}, {sum(r['ok'] for r in results)} of {len(results)} "
          "configurations pass the truth policy both ways")
ok_all = [ok]
dist.broadcast_object_list(ok_all, src=0)
dist.destroy_process_group()
sys.exit(0 if ok_all[0] else 1)

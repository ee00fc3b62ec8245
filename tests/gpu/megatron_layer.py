"""Real TP libraries on the GPU under `tpcheck emulate`, judged by compare_tp (issue 42
item 5, the GPU part; tests/gpu/run.sh's `models` stage runs it).

  python3 tests/gpu/megatron_layer.py [--out DIR] [--tp 2 4 8] [--parts megatron hf]
                                      [--policies te truth] [--device cuda] [--small]

Two parts, each one `python -m tpcheck emulate -n N` launch per TP size:

* megatron: Megatron-core's GPT `TransformerLayer` built from `get_gpt_layer_local_spec()`
  (ColumnParallelLinear QKV, DotProductAttention, RowParallelLinear projection, the
  column/row-parallel MLP, torch LayerNorms), sharded the way Megatron's users shard it
  (`parallel_state.initialize_model_parallel(tensor_model_parallel_size=N)`,
  `model_parallel_cuda_manual_seed`, CPU initialization of the full weights then each
  rank's slice, `.cuda()`), against the same class built on a one-rank TP group through
  `pg_collection` (every rank's own group; compare_tp uses rank 0's). Float32 and bf16
  (`params_dtype`, `bf16=True`); grouped-query attention (16 heads, 8 query groups).
  Correct code on seeds 101-103 must pass; one dropped reduction (the MLP's fc2 output:
  Megatron's all-reduce returns this rank's partial sum) must fail on `output.0`. No
  sequence parallel: the local spec's torch LayerNorm refuses it ("sequence parallel not
  supported by torch LayerNorm"; Apex's norm would take it, and the machine has no Apex);
  the job's "sp" variant and the bug's reduce-scatter half are kept for a spec that does.
* hf: the Hugging Face models of tests/python/test_hf_models.py (hf_workers/), loaded with
  `from_pretrained(tp_plan=...)` onto the GPU, in bf16 and in float32 with TF32 matmuls:
  correct code on seeds 101-103 and the four bugs of hf_workers/hf_tp.py.

Each job is judged under every policy of --policies; the per-tensor verdicts of
torch.testing.assert_close (defaults) and of the `te` rule are recorded next to the
policy's for the HF jobs (rank 0). Prints one table row per (part, TP, dtype, policy) —
correct runs passing, bugs caught (the run fails once the bug fired) and how many of those
on the bug's own tensor or a rank's copy of it, errors, compare_tp's seconds (the first
call on each job's modules / their median; for Megatron also the median of LATER_CALLS
more calls on the same modules, against one unsharded forward+backward plus one truth with
its probe) — and writes DIR/summary.json and DIR/<part>_tp<N>/rank<r>.json. Exit status 0
when every expectation under `truth` holds (correct code passes, each bug is caught or
refused), 1 otherwise; `te` is reported, not required (its false alarms are a figure).

megatron-core (0.19.2, a py3.12 wheel whose only compiled file is a dataset helper) is put
on PYTHONPATH by run.sh from a carried .whl/ folder:
  here:  pip download --no-deps --only-binary=:all: --python-version 3.12 \\
             megatron-core==0.19.2 -d .whl
  there: pip install --no-deps --target DIR .whl/megatron_core-*.whl

--device cpu runs both parts on CPU tensors (development only: Megatron allocates its
attention buffer and keeps its dropout RNG on CUDA, so two stand-ins replace those there;
--small for small Megatron shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HF_WORKERS = os.path.join(ROOT, "tests", "python", "hf_workers")
SEEDS = [101, 102, 103]
LATER_CALLS = 3   # more compare_tp calls on a correct Megatron job's modules, timed
BUG_SEED = 7
HF_BUGS = {"dropped-reduction": ("output", "output.logits"),
           "shard-offset": ("parameter", "model.layers.0.self_attn.q_proj.weight"),
           "grad-averaged": ("gradient", "model.embed_tokens.weight")}
HF_RAISES = {"o-proj-colwise": "Sharding propagation failed for aten.mm"}
MEGATRON_BUGS = {"dropped-reduction": ("output", "output.0")}

# --- rank side: Megatron's layer ------------------------------------------------------------

SIZES = {"full": dict(hidden=512, heads=16, groups=8, ffn=2048, seq=256, batch=2),
         "small": dict(hidden=64, heads=8, groups=8, ffn=256, seq=32, batch=2)}
FIRED = 0
DROP = False   # True while the sharded layer's fc2 runs with the bug


def _cpu_stand_ins():
    """CPU tensors only (development): Megatron's attention buffer and RNG tracker are CUDA's."""
    import contextlib
    import math
    import torch
    from megatron.core import parallel_state, tensor_parallel, utils

    class CPUBuffer(utils.GlobalMemoryBuffer):
        def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
            return torch.empty(math.prod(tensor_shape), dtype=dtype).view(*tensor_shape)

    class NoTracker:
        def fork(self, name=None):
            return contextlib.nullcontext()

    parallel_state._GLOBAL_MEMORY_BUFFER = CPUBuffer()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: NoTracker()


def _install_bug():
    """The dropped reduction: Megatron's own all-reduce / reduce-scatter of a row-parallel
    output returns this rank's partial value while DROP is set (the fc2 forward)."""
    import torch
    from megatron.core.tensor_parallel import layers

    orig_reduce = layers.reduce_from_tensor_model_parallel_region
    orig_scatter = layers.reduce_scatter_to_sequence_parallel_region

    def reduce_from(input_, group=None, *a, **k):
        global FIRED
        if DROP:
            FIRED += 1
            return input_.clone()
        return orig_reduce(input_, group, *a, **k)

    def reduce_scatter(input_, group=None, *a, **k):
        global FIRED
        if DROP:
            FIRED += 1
            n, r = group.size(), group.rank()
            return input_.chunk(n, 0)[r].clone()
        return orig_scatter(input_, group, *a, **k)

    layers.reduce_from_tensor_model_parallel_region = reduce_from
    layers.reduce_scatter_to_sequence_parallel_region = reduce_scatter
    return torch


def _config(size: dict, tp: int, sp: bool, dtype: str):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(
        num_layers=1, hidden_size=size["hidden"], num_attention_heads=size["heads"],
        num_query_groups=size["groups"], ffn_hidden_size=size["ffn"],
        tensor_model_parallel_size=tp, sequence_parallel=sp and tp > 1,
        use_cpu_initialization=True, perform_initialization=True,
        params_dtype=getattr(torch, dtype), bf16=dtype == "bfloat16",
        hidden_dropout=0.0, attention_dropout=0.0,
        bias_dropout_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False)


def megatron_job(j: dict, groups: dict, device) -> list[dict]:
    global FIRED, DROP
    import torch
    import torch.distributed as dist
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from tpcheck.torch import compare_tp

    size = SIZES[j["size"]]
    n, sp = dist.get_world_size(), j["variant"] == "sp"
    spec = get_gpt_layer_local_spec()
    # The same CPU generator state before each build: both draw the same full weights
    # (Megatron's CPU initialization makes the full matrix, then keeps this rank's slice).
    torch.manual_seed(j["seed"])
    single = build_module(spec, config=_config(size, 1, False, j["dtype"]), layer_number=1,
                          pg_collection=groups["single"])
    torch.manual_seed(j["seed"])
    sharded = build_module(spec, config=_config(size, n, sp, j["dtype"]), layer_number=1,
                           pg_collection=groups["sharded"])
    single, sharded = single.to(device), sharded.to(device)
    if j["dtype"] == "bfloat16":
        # What Megatron's training loop does for bf16 (Float16Module: module.bfloat16()):
        # the local spec's torch LayerNorm keeps float32 parameters otherwise, which CUDA's
        # layer_norm refuses beside a bf16 input.
        single, sharded = single.bfloat16(), sharded.bfloat16()
    with torch.no_grad():  # LayerNorm's 1 and 0 and zero biases would hide their gradients
        g = torch.Generator().manual_seed(j["seed"] + 1)
        rank = dist.get_rank()
        for (_, p), (_, q) in zip(single.named_parameters(), sharded.named_parameters()):
            if p.dim() == 1:
                d = (torch.randn(p.shape, generator=g) * 0.1).to(device, p.dtype)
                p.add_(d)
                q.add_(d.chunk(n)[rank] if getattr(q, "tensor_model_parallel", False) else d)
    FIRED = 0
    if j["bug"] == "dropped-reduction":
        fc2 = sharded.mlp.linear_fc2

        def on(*_):
            global DROP
            DROP = True

        def off(*_):
            global DROP
            DROP = False
        fc2.register_forward_pre_hook(on)
        fc2.register_forward_hook(off)
    s, b, h = size["seq"], size["batch"], size["hidden"]
    g = torch.Generator().manual_seed(j["seed"])
    dtype = getattr(torch, j["dtype"])
    x = torch.randn(s, b, h, generator=g).to(device, dtype)
    dy = torch.randn(s, b, h, generator=g).to(device, dtype)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None].to(device)
    dims = {"input_dims": {"input.0": 0}, "output_dims": {"output.0": 0}} if sp else {}
    results = []
    for policy in j["policies"]:
        head = {k: j[k] for k in ("variant", "dtype", "seed", "bug")} | {"policy": policy}
        t = time.perf_counter()
        try:
            report = compare_tp(single, sharded, (x,), {"attention_mask": mask},
                                grad_output=(dy, None), policy=policy, **dims)
        except Exception as e:
            results.append({**head, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()})
            continue
        finally:
            DROP = False
        results.append({**head, "passed": report.passed, "fired": FIRED,
                        "failing": [[e["kind"], e["name"]] for e in report.failures],
                        "reasons": [list(e["verdicts"].values())[0]["reason"]
                                    for e in report.failures][:3],
                        "seconds": report.seconds,
                        "compare_seconds": round(time.perf_counter() - t, 3)})
    truth_row = next((r for r in results if r["policy"] == "truth" and "error" not in r), None)
    if j["bug"] == "none" and truth_row is not None:
        # later calls on the same module (issue 42's figure), each from a barrier
        later = []
        for _ in range(LATER_CALLS):
            dist.barrier()
            t = time.perf_counter()
            report = compare_tp(single, sharded, (x,), {"attention_mask": mask},
                                grad_output=(dy, None), policy="truth", **dims)
            later.append(round(time.perf_counter() - t, 4))
        truth_row.update(later_seconds=later, later_phases=report.seconds,
                         later_work=report.work)
    if dist.get_rank() == 0 and j["bug"] == "none":
        results[-1]["reference_seconds"] = _reference_seconds(single, x, mask, dy, device)
    return results


def _reference_seconds(single, x, mask, dy, device) -> dict:
    """Rank 0: what compare_tp's later calls are held to (issue 42): one forward+backward of
    the unsharded layer and one float64 truth with its probe, in this process, after the
    compare_tp calls above (so as warm as their later calls)."""
    import torch
    from tpcheck.torch import truth

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    xs = x.detach().clone().requires_grad_(True)
    sync()
    t = time.perf_counter()
    out = single(xs, attention_mask=mask)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dy)
    sync()
    fwd_bwd = time.perf_counter() - t
    for p in single.parameters():
        p.grad = None
    t = time.perf_counter()
    truth(single, x, attention_mask=mask, grad_output=(dy, None))
    sync()
    return {"fwd_bwd": round(fwd_bwd, 4), "truth_with_probe": round(time.perf_counter() - t, 4)}


def rank_main(jobs_path: str, out_dir: str, device_name: str) -> None:
    import warnings
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|absl).*")
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
    rank, n = dist.get_rank(), dist.get_world_size()
    if device_name == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.process_groups_config import ProcessGroupCollection
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=n)
    if device_name == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        _cpu_stand_ins()
    _install_bug()
    own = None
    for r in range(n):  # every rank takes part in creating every group
        grp = dist.new_group([r])
        if r == rank:
            own = grp
    one = ProcessGroupCollection()
    one.tp, one.pp, one.cp = own, own, own
    groups = {"single": one, "sharded": ProcessGroupCollection.use_mpu_process_groups()}
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    try:
        for j in jobs:
            try:
                results += megatron_job(j, groups, device)
            except Exception as e:
                results += [{**{k: j[k] for k in ("variant", "dtype", "seed", "bug")}, "policy": p,
                             "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()} for p in j["policies"]]
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    print("ALL OK", flush=True)


# --- the driver -------------------------------------------------------------------------------

def _launch(n: int, cmd: list[str], log: str) -> tuple[int, float]:
    t = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--"] + cmd,
                           stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    return p.returncode, time.perf_counter() - t


def _read(d: str, n: int) -> list[list[dict]]:
    out = []
    for r in range(n):
        path = os.path.join(d, f"rank{r}.json")
        out.append(json.load(open(path)) if os.path.exists(path) else [])
    return out


def _judge_rows(part: str, n: int, ranks: list[list[dict]], key, bugs: dict,
                raises: dict) -> list[dict]:
    """One row per (dtype label, policy): what passed, what was caught, what went wrong."""
    rows: dict = {}
    for rank, results in enumerate(ranks):
        for r in results:
            label, policy = key(r), r["policy"]
            row = rows.setdefault((label, policy), {
                "part": part, "tp": n, "dtype": label, "policy": policy, "correct": 0,
                "correct_passed": 0, "bugs": 0, "bugs_caught": 0, "bugs_on_tensor": 0,
                "errors": [], "misses": [],
                "seconds": [], "reference": [], "later": []})
            if rank == 0 and "compare_seconds" in r:
                row["seconds"].append(r["compare_seconds"])
            if rank == 0 and "later_seconds" in r:
                row["later"] += r["later_seconds"]
                row["later_phases"], row["later_work"] = r["later_phases"], r["later_work"]
            if rank == 0 and "reference_seconds" in r:
                row["reference"].append(sum(r["reference_seconds"].values()))
            bug = r["bug"]
            if bug in ("none", "local-colwise"):
                row["correct"] += 1
                if r.get("passed"):
                    row["correct_passed"] += 1
                else:
                    row["misses"].append(f"rank {rank} {bug} seed {r['seed']}: "
                                         f"{r.get('error') or r.get('failing', [])[:4]}")
                continue
            row["bugs"] += 1
            if bug in raises:
                ok = on_tensor = raises[bug] in r.get("error", "")
            else:
                # Caught: the run fails once the bug fired (correct code's runs, the same
                # models and seeds, are the control: a failure there is a false alarm and
                # counts against the policy). On its tensor: also where the bug shows first,
                # or on a rank's own copy of it (compare_tp's "replica" verdict).
                kind, name = bugs[bug]
                ok = "error" not in r and not r["passed"] and r["fired"] > 0
                on_tensor = ok and any(f[0] == kind and (f[1] == name or f[1].startswith(name + " (rank "))
                                       for f in r["failing"])
            row["bugs_caught"] += int(ok)
            row["bugs_on_tensor"] += int(on_tensor)
            if not ok:
                row["misses"].append(
                    f"rank {rank} {bug}: {r.get('error') or r.get('failing', [])[:4]}")
    for row in rows.values():
        row["errors"] = [m for m in row["misses"] if "Error" in m]
    return list(rows.values())


def driver(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    rows = []
    if "hf" in args.parts:
        sys.path.insert(0, HF_WORKERS)
        from tiny_models import save_tiny
        dirs = {(f, s): save_tiny(f, s, os.path.join(out, "hf_models", f"{f}-{s}"))
                for f in ("llama", "qwen2") for s in SEEDS + [BUG_SEED]}
        jobs = []
        for dtype, tf32 in (("bfloat16", False), ("float32", True)):
            common = dict(policies=args.policies, figures=True, dtype=dtype, tf32=tf32,
                          device=args.device)
            jobs += [dict(family=f, path=dirs[(f, s)], seed=s, bug="none", **common)
                     for f in ("llama", "qwen2") for s in SEEDS]
            jobs += [dict(family=f, path=dirs[(f, BUG_SEED)], seed=BUG_SEED, bug=b, **common)
                     for f in ("llama", "qwen2")
                     for b in list(HF_BUGS) + list(HF_RAISES) + ["local-colwise"]]
        for n in args.tp:
            d = os.path.join(out, f"hf_tp{n}")
            os.makedirs(d, exist_ok=True)
            json.dump(jobs, open(os.path.join(d, "jobs.json"), "w"))
            rc, wall = _launch(n, [sys.executable, os.path.join(HF_WORKERS, "hf_tp.py"),
                                   os.path.join(d, "jobs.json"), d], os.path.join(d, "launch.log"))
            ranks = _read(d, n)
            new = _judge_rows("hf", n, ranks, lambda r: "bf16" if r["dtype"] == "bfloat16"
                              else "f32+tf32" if r["tf32"] else "f32", HF_BUGS, HF_RAISES)
            for row in new:
                row["launch_rc"], row["launch_s"] = rc, round(wall, 1)
            rows += new
    if "megatron" in args.parts:
        size = "small" if args.small else "full"
        jobs = [dict(variant=v, dtype=dt, seed=s, bug="none", size=size, policies=args.policies)
                for v in ("tp",) for dt in ("float32", "bfloat16") for s in SEEDS]
        jobs += [dict(variant=v, dtype=dt, seed=BUG_SEED, bug=b, size=size, policies=args.policies)
                 for v in ("tp",) for dt in ("float32", "bfloat16") for b in MEGATRON_BUGS]
        for n in args.tp:
            d = os.path.join(out, f"megatron_tp{n}")
            os.makedirs(d, exist_ok=True)
            json.dump(jobs, open(os.path.join(d, "jobs.json"), "w"))
            rc, wall = _launch(n, [sys.executable, os.path.abspath(__file__), "--rank-side",
                                   os.path.join(d, "jobs.json"), d, "--device", args.device],
                               os.path.join(d, "launch.log"))
            new = _judge_rows("megatron", n, _read(d, n),
                              lambda r: f"{r['variant']} {r['dtype']}", MEGATRON_BUGS, {})
            for row in new:
                row["launch_rc"], row["launch_s"] = rc, round(wall, 1)
            rows += new
    json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
    print("| part | TP | dtype | policy | correct passing | bugs caught (on their tensor) "
          "| compare_tp s (first / median) | later, same module s (median) "
          "| fwd+bwd + truth s (median) | launch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for r in rows:
        s = r["seconds"]
        secs = f"{s[0]:.2f} / {statistics.median(s):.2f}" if s else "-"
        ref = statistics.median(r["reference"]) if r.get("reference") else None
        later = statistics.median(r["later"]) if r.get("later") else None
        print(f"| {r['part']} | {r['tp']} | {r['dtype']} | {r['policy']} "
              f"| {r['correct_passed']}/{r['correct']} | {r['bugs_caught']}/{r['bugs']} "
              f"({r['bugs_on_tensor']}) | {secs} "
              f"| {f'{later:.3f}' if later is not None else '-'}"
              f"{f' ({later / ref:.2f}x)' if later is not None and ref else ''} "
              f"| {f'{ref:.3f}' if ref else '-'} | rc {r['launch_rc']}, {r['launch_s']} s |")
        if r["policy"].startswith("truth") and (r["correct_passed"] < r["correct"]
                                                 or r["bugs_caught"] < r["bugs"]):
            ok = False
        if r["launch_rc"] != 0:
            ok = False
    for r in rows:
        if r.get("later"):
            print(f"{r['part']} TP {r['tp']} {r['dtype']}: a later call by phase on rank 0 "
                  f"{r['later_phases']}; its work {r['later_work']}")
    for r in rows:
        for m in r["misses"][:4]:
            print(f"{r['part']} TP {r['tp']} {r['dtype']} {r['policy']}: {m[:400]}")
    short = [f"{r['part']} TP {r['tp']} {r['dtype']} {r['policy']}" for r in rows
             if r["policy"].startswith("truth")
             and (r["correct_passed"] < r["correct"] or r["bugs_caught"] < r["bugs"])]
    print("truth: every expectation holds" if ok and rows else
          f"truth: expectations not met in {len(short)} rows ({'; '.join(short[:4])})")
    return 0 if ok and rows else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank-side", nargs=2, metavar=("JOBS", "OUTDIR"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "models"))
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--parts", nargs="+", default=["megatron", "hf"], choices=["megatron", "hf"])
    ap.add_argument("--policies", nargs="+", default=["te", "truth"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="small Megatron shapes (CPU runs)")
    args = ap.parse_args()
    if args.rank_side:
        rank_main(*args.rank_side, args.device)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

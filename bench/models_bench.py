"""compare_tp on a Hugging Face Llama sharded by its own TP plan (issue 42's CPU figure),
and the per-tensor verdicts of assert_close, `te` and `truth` on the HF test models.

    python bench/models_bench.py [--tp 4] [--repeat 3] [--device cpu]     # the timing
    python bench/models_bench.py --figures [--tp 2 4] [--dtype bfloat16]  # docs/JUDGE.md's table

Timing: a tiny Llama (2 layers, hidden 256, intermediate 512, 8 heads, vocabulary 256;
batch 2 x 64 tokens, float32) saved with `save_pretrained` and loaded in every rank of one
`python -m tpcheck emulate -n N` launch with `from_pretrained(tp_plan="auto")`, against
`from_pretrained()` (tests/python/hf_workers/). In that one process, on rank 0 while the
other ranks wait in a barrier: one forward+backward of the unsharded model, and one of a
float64 copy (`copy.deepcopy(model).double()`; the model's own casts, RoPE's
inv_freq.float() and RMSNorm's .to(float32), still run in float32 there, so it is slightly
cheaper than a truth that lifts them) and `tpcheck.torch.truth` with its probe; then
compare_tp on every rank under `truth` (the unsharded run on rank 0, the truth's float64
and probed runs on ranks 1 and 2) and under `te` (no truth), and under `truth` with what
makes later calls cheaper switched off (VARIANTS: spread_truth=False runs all three on rank
0; trace_gemms=True traces the GEMMs on every call). Each figure: the first call of the
launch, and the median of the --repeat later ones; compare_tp from a barrier until every
rank has its report, with rank 0's `report.seconds` by phase and `report.work`. A variant
that raises is reported with its error.

--figures: the HF test models (llama, qwen2) at each TP size, correct code on seeds 101-103
and each bug at seed 7 (tests/python/hf_workers/hf_tp.py); on rank 0, for every judged
tensor, the verdicts of torch.testing.assert_close at its defaults and of the `te` rule on
the very tensors compare_tp judged, next to compare_tp's own (`truth`); printed as one
markdown table by tensor class.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HF_WORKERS = os.path.join(ROOT, "tests", "python", "hf_workers")
sys.path.insert(0, HF_WORKERS)

BENCH_CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=8, head_dim=32,
                    vocab_size=256, max_position_embeddings=128)
BATCH, SEQ = 2, 64
# compare_tp's calls, each timed: the defaults under both policies, then under `truth` the
# two things that make its later calls cheaper switched off, as the judge ran before them
VARIANTS = {
    "truth": {"policy": "truth"},
    "te": {"policy": "te"},
    "truth, spread_truth=False": {"policy": "truth", "spread_truth": False},
    "truth, trace_gemms=True": {"policy": "truth", "trace_gemms": True},
    "truth, both": {"policy": "truth", "spread_truth": False, "trace_gemms": True},
}


# --- rank side ---------------------------------------------------------------------------------

def _fwd_bwd(model, ids, dy):
    for p in model.parameters():
        p.grad = None
    out = model(input_ids=ids, use_cache=False).logits
    out.backward(dy.to(out.dtype))


def rank_main(path: str, out_json: str, repeat: int, device_name: str) -> None:
    import torch
    import torch.distributed as dist
    import transformers
    dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
    rank = dist.get_rank()
    if device_name == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = (torch.device("cuda", torch.cuda.current_device()) if device_name == "cuda"
              else torch.device("cpu"))
    from tpcheck.torch import compare_tp

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    single = transformers.LlamaForCausalLM.from_pretrained(path).to(device).train()
    sharded = transformers.LlamaForCausalLM.from_pretrained(path, tp_plan="auto").train()
    g = torch.Generator().manual_seed(101)
    ids = torch.randint(0, BENCH_CONFIG["vocab_size"], (BATCH, SEQ), generator=g).to(device)
    dy = torch.randn(BATCH, SEQ, BENCH_CONFIG["vocab_size"], generator=g).to(device)
    out: dict = {"reference": {}, "compare_tp": {}}
    dist.barrier()
    if rank == 0:  # the references, alone on the machine's cores
        f64 = copy.deepcopy(single).double()
        for name, model, dt in (("unsharded fwd+bwd", single, torch.float32),
                                ("float64 fwd+bwd", f64, torch.float64)):
            times = []
            for _ in range(repeat + 1):
                sync()
                t = time.perf_counter()
                _fwd_bwd(model, ids, dy.to(dt))
                sync()
                times.append(time.perf_counter() - t)
            out["reference"][name] = {"first": times[0], "median": statistics.median(times[1:])}
        del f64
    dist.barrier()
    if rank == 0:  # the truth alone: what compare_tp computes on rank 0
        from tpcheck.torch import truth
        times = []
        for _ in range(repeat + 1):
            t = time.perf_counter()
            try:
                truth(single, input_ids=ids, use_cache=False, grad_output={"logits": dy})
            except Exception as e:
                out["reference"]["truth() with probe"] = {
                    "error": f"{type(e).__name__}: {str(e)[:300]}"}
                break
            times.append(time.perf_counter() - t)
        else:
            out["reference"]["truth() with probe"] = {
                "first": times[0], "median": statistics.median(times[1:])}
    dist.barrier()
    for variant, options in VARIANTS.items():
        calls = []
        for _ in range(repeat + 1):
            dist.barrier()
            t = time.perf_counter()
            try:
                report = compare_tp(single, sharded, (), {"input_ids": ids, "use_cache": False},
                                    grad_output={"logits": dy}, **options)
            except Exception as e:
                out["compare_tp"][variant] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                break
            calls.append({"seconds": time.perf_counter() - t, "phases": report.seconds,
                          "work": report.work, "passed": report.passed})
        else:
            out["compare_tp"][variant] = {
                "first": calls[0], "median": statistics.median(c["seconds"] for c in calls[1:]),
                "later_phases": calls[-1]["phases"], "later_work": calls[-1]["work"],
                "passed": all(c["passed"] for c in calls)}
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()


# --- driver ------------------------------------------------------------------------------------

def _commit() -> str:
    try:
        short = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=ROOT).stdout.strip()
        return short + (" + uncommitted changes in the tree" if dirty else "")
    except OSError:
        return "unknown"


def _machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores, {cpu}"


def _emulate(n: int, cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--"] + cmd,
                          capture_output=True, text=True, timeout=1800)


def timing(args) -> int:
    import torch
    import transformers
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "llama")
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BENCH_CONFIG))
        model.save_pretrained(path)
        res_path = os.path.join(tmp, "result.json")
        for n in args.tp:
            t = time.perf_counter()
            p = _emulate(n, [sys.executable, os.path.abspath(__file__), "--rank-side", path,
                             res_path, "--repeat", str(args.repeat), "--device", args.device])
            wall = time.perf_counter() - t
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-3000:])
                return 1
            res = json.load(open(res_path))
            print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, {_machine()}, "
                  f"torch {torch.__version__}, transformers {transformers.__version__}, "
                  f"commit {_commit()}; Llama {BENCH_CONFIG['num_hidden_layers']} layers, hidden "
                  f"{BENCH_CONFIG['hidden_size']}, {BATCH} x {SEQ} tokens, {args.device}, TP {n} "
                  f"under tpcheck emulate (launch {wall:.1f} s); first call / median of "
                  f"{args.repeat} later calls:\n")
            print("| what | first | later (median) | × unsharded fwd+bwd | × f64 fwd+bwd |")
            print("|---|---|---|---|---|")
            ref = res["reference"]
            one, f64 = ref["unsharded fwd+bwd"]["median"], ref["float64 fwd+bwd"]["median"]
            for name, r in ref.items():
                if "error" in r:
                    print(f"| {name} (rank 0 alone) | {r['error']} | | | |")
                    continue
                print(f"| {name} (rank 0 alone) | {r['first'] * 1e3:.1f} ms "
                      f"| {r['median'] * 1e3:.1f} ms "
                      f"| {r['median'] / one:.2f} | {r['median'] / f64:.2f} |")
            for variant, r in res["compare_tp"].items():
                if "error" in r:
                    print(f"| compare_tp, `{variant}` | {r['error']} | | | |")
                    continue
                print(f"| compare_tp, `{variant}` ({'passes' if r['passed'] else 'FAILS'}) "
                      f"| {r['first']['seconds'] * 1e3:.0f} ms | {r['median'] * 1e3:.0f} ms "
                      f"| {r['median'] / one:.1f} | {r['median'] / f64:.1f} |")
            truth_ref = ref.get("truth() with probe", {}).get("median")
            best = res["compare_tp"].get("truth", {}).get("median")
            if truth_ref and best:
                print(f"\nLater `truth` calls against one unsharded fwd+bwd + one truth with its "
                      f"probe ({(one + truth_ref) * 1e3:.1f} ms): {best / (one + truth_ref):.2f}x "
                      "(goal <= 1.5x)")
            for variant, r in res["compare_tp"].items():
                if "error" not in r:
                    print(f"\n`{variant}` by phase on rank 0, first call: {r['first']['phases']}; "
                          f"a later call: {r['later_phases']}; its work: {r['later_work']}")
            print()
    return 0


# --- figures: assert_close / te / truth per tensor class ---------------------------------------

def tensor_class(family: str, name: str, kind: str) -> str:
    if kind == "output":
        return "output (logits)"
    if kind == "parameter":
        return "parameters gathered (bitwise)"
    leaf = name.split(" (rank")[0]
    copy_note = " (a rank's own copy)" if "(rank" in name else ""
    for key, cls in ((".mlp.down_proj.", "rowwise weight grads (o_proj, down_proj)"),
                     (".self_attn.o_proj.", "rowwise weight grads (o_proj, down_proj)"),
                     ("_proj.bias", "colwise bias grads (q/k/v)"),
                     ("_proj.weight", "colwise weight grads (q/k/v, gate/up)"),
                     ("lm_head.", "colwise weight grads (lm_head)"),
                     ("layernorm", "replicated: RMSNorm weight grads"),
                     ("model.norm.", "replicated: RMSNorm weight grads"),
                     ("embed_tokens", "replicated: embedding grad")):
        if key in leaf:
            return cls + copy_note
    return "other" + copy_note


def figures(args) -> int:
    from tiny_models import save_tiny
    seeds = [101, 102, 103]
    bugs = ["dropped-reduction", "shard-offset", "grad-averaged", "o-proj-colwise"]
    merged: dict = {}   # (tp, family, seed, bug) -> {tensor name: {kind, verdicts...}}
    runs: dict = {}     # (scenario, policy) -> {"runs", "failed", "errors"}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {(f, s): save_tiny(f, s, os.path.join(tmp, f"{f}-{s}"))
                for f in ("llama", "qwen2") for s in seeds + [7]}
        jobs = [dict(family=f, path=dirs[(f, s)], seed=s, bug="none", policies=args.policies,
                     figures=True, dtype=args.dtype) for f in ("llama", "qwen2") for s in seeds]
        jobs += [dict(family=f, path=dirs[(f, 7)], seed=7, bug=b, policies=args.policies,
                      figures=True, dtype=args.dtype) for f in ("llama", "qwen2") for b in bugs]
        for n in args.tp:
            d = os.path.join(tmp, f"tp{n}")
            os.makedirs(d)
            json.dump(jobs, open(os.path.join(d, "jobs.json"), "w"))
            p = _emulate(n, [sys.executable, os.path.join(HF_WORKERS, "hf_tp.py"),
                             os.path.join(d, "jobs.json"), d])
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-3000:])
                return 1
            for r in json.load(open(os.path.join(d, "rank0.json"))):
                scen = "correct code" if r["bug"] == "none" else r["bug"]
                run = runs.setdefault((scen, r["policy"]), {"judged": 0, "failed": 0, "raised": 0,
                                                            "errors": set()})
                if "error" in r:
                    run["raised"] += 1
                    run["errors"].add(r["error"].split("\n")[0][:110])
                    continue
                run["judged"] += 1
                run["failed"] += int(not r["passed"])
                tensors = merged.setdefault((n, r["family"], r["seed"], scen), {})
                for t in r.get("figures", []):
                    tensors.setdefault((t["kind"], t["name"]), {}).update(t)
    # (scenario, class) -> {verdict name: [failing, judged]}
    table: dict = {}
    for (_, family, _, scen), tensors in merged.items():
        for (_, name), t in tensors.items():
            cell = table.setdefault((scen, tensor_class(family, name, t["kind"])), {})
            for pol in ("assert_close", "te", "truth", "bitwise"):
                if pol in t:
                    c = cell.setdefault(pol, [0, 0])
                    c[0] += int(not t[pol])
                    c[1] += 1
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, {_machine()}, commit "
          f"{_commit()}; {args.dtype}; TP {', '.join(map(str, args.tp))}; llama and qwen2; "
          f"correct code seeds "
          f"{seeds[0]}-{seeds[-1]}, bugs seed 7. Tensors failing / judged:\n")
    print("| scenario | tensor class | `assert_close` defaults | `te` | `truth` |")
    print("|---|---|---|---|---|")

    def cell_text(c, pol):
        return f"{c[pol][0]}/{c[pol][1]}" if pol in c else "—"
    for scen in ["correct code"] + bugs:
        for (s, cls), c in sorted(table.items()):
            if s != scen:
                continue
            if "bitwise" in c:
                b = "bitwise " + cell_text(c, "bitwise")
                print(f"| {scen} | {cls} | {b} | {b} | {b} |")
            else:
                print(f"| {scen} | {cls} | {cell_text(c, 'assert_close')} | {cell_text(c, 'te')} "
                      f"| {cell_text(c, 'truth')} |")
    print("\nRuns failing (rank 0's report) / runs, and what was raised instead of a verdict:\n")
    for (scen, pol), r in sorted(runs.items()):
        print(f"- {scen}, `{pol}`: {r['failed']} of {r['judged']} judged runs failed"
              + (f"; {r['raised']} raised {sorted(r['errors'])}" if r["raised"] else ""))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank-side", nargs=2, metavar=("MODEL", "RESULT"), help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, nargs="+", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--figures", action="store_true")
    ap.add_argument("--policies", nargs="+", default=["truth", "te"],
                    help="--figures: compare_tp's policies")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="--figures: the models' dtype (from_pretrained(dtype=...))""")
    args = ap.parse_args()
    if args.rank_side:
        rank_main(*args.rank_side, args.repeat, args.device)
        return 0
    if args.figures:
        args.tp = args.tp or [2, 4]
        return figures(args)
    args.tp = args.tp or [4]
    return timing(args)


if __name__ == "__main__":
    sys.exit(main())

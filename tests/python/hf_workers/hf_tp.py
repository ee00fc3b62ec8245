"""Hugging Face transformers models sharded by their own TP plan, judged by compare_tp,
under `python -m tpcheck emulate -n N` (test_hf_models.py launches it once per TP size;
tests/gpu/megatron_layer.py on the GPU; bench/models_bench.py for the timings).

  python hf_tp.py JOBS.json OUTDIR

JOBS.json: a list of jobs, each {"family", "path", "seed", "bug", "policies"} and optional
"figures" (rank 0 also records, per tensor, the verdicts of torch.testing.assert_close at
its defaults and of the `te` rule on the same single/sharded tensors), "dtype"
("float32" or "bfloat16"), "tf32" (allow TF32 matmuls on CUDA) and "device" ("cpu" or
"cuda"). Every job runs in turn in this one launch (starting N processes that import torch
and transformers costs seconds; a job a fraction of one). Each rank writes
OUTDIR/rank<r>.json: per job and policy (the models are loaded once per job, judged
once per policy) whether compare_tp passed, the failing tensors as [kind, name],
their first reasons, how many times the bug's code ran ("fired": a bug whose code never
ran cannot count as caught), and the job's seconds.

Per job, as a user does it: the unsharded twin is `from_pretrained(path)`, the sharded
model `from_pretrained(path, tp_plan=...)` on the launch's process group (the emulate
launcher maps the library's NCCL group to tpcheck's backend), both in train() mode, called
as `model(input_ids=ids, use_cache=False)`; the loss gradient of the logits is drawn from
the job's seed (the same on every rank), so every parameter gradient is judged.

The bugs are each the smallest change of the model's TP plan or of the code that carries
it out, where a user's TP code would have it:
  dropped-reduction  the MLP's down_proj planned as RowwiseParallel with output_layouts
                     Partial() instead of Replicate(): each rank keeps its partial sum
  shard-offset       the loader's slice of every colwise (Shard(0)) weight taken one row
                     further on (the rows r*c+1 .. (r+1)*c+1 of the checkpoint, wrapping)
  o-proj-colwise     the attention output projection declared "colwise" instead of
                     "rowwise" in the plan
  grad-averaged      every colwise projection under a local-tensor colwise style whose
                     backward all-reduce of the input gradient averages (ReduceOp.AVG)
                     instead of summing; "local-colwise" is the same style summing (the
                     control: it must pass)
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tiny_models import BATCH, FAMILIES, SEQ  # noqa: E402

import transformers  # noqa: E402
from transformers.distributed import sharding_utils  # noqa: E402
from transformers.distributed import tensor_parallel as hf_tp  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402

FIRED = 0  # how many times the current job's bug changed something


def _fire() -> None:
    global FIRED
    FIRED += 1


# --- the bugs' code -----------------------------------------------------------------------

class _PartialOutputRowwise(hf_tp.RowwiseParallel):
    """RowwiseParallel(output_layouts=Partial()): the module's Partial output is already
    'in layout', so no all-reduce runs and to_local() hands on this rank's partial sum."""

    def transform_output_post_forward(self, module, output, mesh):
        _fire()
        return super().transform_output_post_forward(module, output, mesh)


class _AllReduceInBackward(torch.autograd.Function):
    """Identity forward; the input gradient's partial sums all-reduced in backward."""

    @staticmethod
    def forward(ctx, x, group, op):
        ctx.group, ctx.op = group, op
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if ctx.op == dist.ReduceOp.AVG:
            _fire()
        dist.all_reduce(grad, op=ctx.op, group=ctx.group)
        return grad, None, None


class _LocalColwise(hf_tp.ColwiseParallel):
    """A colwise style that runs the Linear on local tensors (no DTensor in the forward):
    the replicated input goes in as it is and its gradient, a partial sum on each rank, is
    all-reduced in backward with `op`; the output stays this rank's column shard."""

    def __init__(self, op):
        super().__init__(input_layouts=Replicate(), output_layouts=Shard(-1))
        self.op = op

    def should_use_local_tensors(self, module):
        return True

    def transform_inputs_pre_forward(self, module, args, kwargs, mesh):
        x = _AllReduceInBackward.apply(args[0], mesh.get_group(), self.op)
        return (x,) + tuple(args[1:]), kwargs


hf_tp.ParallelInterface.register(
    "tpcheck_rowwise_partial_output",
    _PartialOutputRowwise(input_layouts=Shard(-1), output_layouts=Partial()))
hf_tp.ParallelInterface.register("tpcheck_local_colwise", _LocalColwise(dist.ReduceOp.SUM))
hf_tp.ParallelInterface.register("tpcheck_local_colwise_avg", _LocalColwise(dist.ReduceOp.AVG))

_orig_shard_tensor = sharding_utils.DtensorShardOperation.shard_tensor
SHARD_OFFSET = False


def _shard_tensor(self, source, tensor_idx=None, device=None, dtype=None):
    """The loader's shard-on-read, with the bug: a colwise (Shard(0)) 2-D weight's rows
    taken one further on."""
    colwise = (self.param_ndim == 2 and len(self.placements) == 1
               and isinstance(self.placements[0], Shard) and self.placements[0].dim == 0)
    if not (SHARD_OFFSET and colwise and tensor_idx is None):
        return _orig_shard_tensor(self, source, tensor_idx=tensor_idx, device=device, dtype=dtype)
    full = source[...]
    n, r = self.device_mesh.size(), self.device_mesh.get_local_rank()
    rows = full.shape[0] // n
    idx = torch.arange(r * rows + 1, (r + 1) * rows + 1) % full.shape[0]
    _fire()
    return full.index_select(0, idx).to(device=device, dtype=dtype)


sharding_utils.DtensorShardOperation.shard_tensor = _shard_tensor


def plan_for(bug: str, plan: dict) -> dict:
    """The model's own TP plan with the job's bug in it (a copy)."""
    plan = dict(plan)
    if bug == "dropped-reduction":
        plan["model.layers.*.mlp.down_proj"] = "tpcheck_rowwise_partial_output"
    elif bug == "o-proj-colwise":
        plan["model.layers.*.self_attn.o_proj"] = "colwise"
    elif bug in ("grad-averaged", "local-colwise"):
        style = "tpcheck_local_colwise_avg" if bug == "grad-averaged" else "tpcheck_local_colwise"
        plan = {k: (style if v == "colwise" else v) for k, v in plan.items()}
    elif bug not in ("none", "shard-offset"):
        raise ValueError(f"unknown bug {bug!r}")
    return plan


# --- one job -------------------------------------------------------------------------------

def _load(job: dict, tp_plan=None):
    cls = getattr(transformers, FAMILIES[job["family"]][1])
    dtype = getattr(torch, job.get("dtype", "float32"))
    kwargs = {"dtype": dtype}
    if tp_plan is not None:
        kwargs["tp_plan"] = tp_plan
    model = cls.from_pretrained(job["path"], **kwargs)
    if tp_plan is None and job.get("device", "cpu") == "cuda":
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    return model.train()


def _figures(report, policy: str) -> list[dict]:
    """Rank 0: per judged tensor, compare_tp's verdict under the policy (with the
    "replica" verdict of a rank's copy that differs) and those of assert_close (its
    defaults for the dtype) and of the `te` rule on the same single/sharded tensors."""
    import tpcheck
    out = []
    verdict = {e["name"]: e for e in report.entries}
    for name, (s, p) in report.raw.items():
        e = verdict[name]
        try:
            torch.testing.assert_close(p, s)
            ac = True
        except AssertionError:
            ac = False
        te = tpcheck.compare(s.detach().contiguous(), p.detach().to(s.dtype).contiguous(),
                             policy="te", name=name)
        out.append({"name": name, "kind": e["kind"], "assert_close": ac, "te": bool(te.passed),
                    policy: all(v["passed"] for v in e["verdicts"].values())})
    for e in report.entries:
        if e["kind"] == "parameter":
            out.append({"name": e["name"], "kind": "parameter",
                        "bitwise": e["verdicts"]["bitwise"]["passed"]})
    return out


def job(j: dict) -> list[dict]:
    """The job's models loaded once, then judged under each of its policies."""
    global FIRED, SHARD_OFFSET
    from tpcheck.torch import compare_tp
    t0 = time.perf_counter()
    device = (torch.device("cuda", torch.cuda.current_device()) if j.get("device") == "cuda"
              else torch.device("cpu"))
    torch.backends.cuda.matmul.allow_tf32 = bool(j.get("tf32", False))
    single = _load(j)
    FIRED, SHARD_OFFSET = 0, j["bug"] == "shard-offset"
    try:
        plan = plan_for(j["bug"], single.tp_plan)
        sharded = _load(j, tp_plan=plan if j["bug"] not in ("none", "shard-offset") else "auto")
    finally:
        SHARD_OFFSET = False
    if j["bug"] == "o-proj-colwise":  # the plan's change reached the module
        w = sharded.model.layers[0].self_attn.o_proj.weight
        FIRED += int(tuple(w.placements) == (Shard(0),))
    load_seconds = round(time.perf_counter() - t0, 3)
    g = torch.Generator().manual_seed(j["seed"])
    vocab = single.config.vocab_size
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g).to(device)
    dy = torch.randn(BATCH, SEQ, vocab, generator=g).to(device)
    results = []
    for policy in j["policies"]:
        head = {**{k: j[k] for k in ("family", "seed", "bug")}, "policy": policy,
                "dtype": j.get("dtype", "float32"), "tf32": bool(j.get("tf32", False))}
        t1 = time.perf_counter()
        try:
            report = compare_tp(single, sharded, (), {"input_ids": ids, "use_cache": False},
                                grad_output={"logits": dy}, policy=policy)
        except Exception as e:  # this policy's error is its result; the next still runs
            results.append({**head, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()})
            continue
        out = {**head, "passed": report.passed, "fired": FIRED,
               "failing": [[e["kind"], e["name"]] for e in report.failures],
               "reasons": [list(e["verdicts"].values())[0]["reason"] for e in report.failures][:3],
               "tensors": len(report.entries), "seconds": report.seconds,
               "load_seconds": load_seconds, "compare_seconds": round(time.perf_counter() - t1, 3)}
        if j.get("figures") and dist.get_rank() == 0:
            out["figures"] = _figures(report, policy)
        results.append(out)
    return results


def main():
    jobs_path, out_dir = sys.argv[1], sys.argv[2]
    with open(jobs_path) as f:
        jobs = json.load(f)
    dist.init_process_group("nccl")  # the launcher maps it to its emulating backend
    if any(j.get("device") == "cuda" for j in jobs):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    results = []
    try:
        for j in jobs:
            try:
                results += job(j)
            except Exception as e:  # a job's error is its result; the others still run
                results += [{**{k: j[k] for k in ("family", "seed", "bug")}, "policy": p,
                             "dtype": j.get("dtype", "float32"), "tf32": bool(j.get("tf32", False)),
                             "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()} for p in j["policies"]]
    finally:
        with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()

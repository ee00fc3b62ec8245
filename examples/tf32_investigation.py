"""Why does my TP 4 layer fail the reference test under TF32? A script to copy.

    python -m tpcheck emulate -n 4 -- python examples/tf32_investigation.py      # one GPU
    torchrun --nproc-per-node 4 examples/tf32_investigation.py                   # four GPUs

A column -> GELU -> row parallel MLP (Megatron style) runs at TP 1 (the unsharded module,
on every rank) and at TP N (this rank's shard), float32 with
torch.backends.cuda.matmul.allow_tf32 = True. Sections:

 1. the worst element under the reference rule: torch.testing.assert_close's test
    |TP N - TP 1| <= atol + rtol * |TP 1| with the reference suite's float32 tolerances
    (rtol 1e-3, atol 1e-5; docs/JUDGE.md), over the output and every gradient;
 2. the GEMM sites whose numerical class changed between the TP 1 and TP N runs, from
    tpcheck.trace() around each run (cuBLASLt's own record of every matmul: shape,
    algorithm, compute type) and the traces' diff;
 3. counterfactuals: the same two runs again with TF32 off for one GEMM site at a time
    (each site that changed class) and for every GEMM, and the share of the worst
    tensor's max |TP N - TP 1| each removes;
 4. tpcheck's verdict: compare_tp under the truth policy (is the TP N run as close to
    the fp64 truth as the TP 1 run, up to TF32 rounding?).

TF32 and cuBLASLt exist only on a GPU. On the CPU the script still runs every section it
can (the trace is skipped, the counterfactuals must remove 0 %: there is no TF32 to turn
off) and says so; the exit status is compare_tp's verdict (0: passed).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tpcheck
from tpcheck.torch import compare_tp

# The GEMMs of one forward + backward, in the order they run (SiteLinear below): a trace's
# calls line up with these names when it holds exactly these six.
SITES = ["fc1.fwd", "fc2.fwd", "fc2.dgrad", "fc2.wgrad", "fc1.dgrad", "fc1.wgrad"]
TF32_OFF: set[str] = set()   # the counterfactual: sites whose GEMM runs without TF32


@contextmanager
def tf32_for(site: str):
    """TF32 as the user set it, except for the sites in TF32_OFF. PyTorch reads the flag
    when each matmul is dispatched, so it can change between two GEMMs."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = before and site not in TF32_OFF
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class SiteLinear(torch.autograd.Function):
    """y = x W^T + b with each of its three GEMMs (forward, input gradient, weight gradient)
    named, so TF32 can be turned off for one of them."""

    @staticmethod
    def forward(ctx, x, w, b, name):
        ctx.save_for_backward(x, w)
        ctx.name, ctx.has_bias = name, b is not None
        with tf32_for(f"{name}.fwd"):
            return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with tf32_for(f"{ctx.name}.dgrad"):
            dx = g @ w
        with tf32_for(f"{ctx.name}.wgrad"):
            dw = g.t() @ x
        return dx, dw, g.sum(0) if ctx.has_bias else None, None


class AllReduceBackward(torch.autograd.Function):   # Megatron's f
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class AllReduceForward(torch.autograd.Function):    # Megatron's g
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class MLP(torch.nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn)
        self.fc2 = torch.nn.Linear(ffn, hidden)

    def forward(self, x):
        h = F.gelu(SiteLinear.apply(x, self.fc1.weight, self.fc1.bias, "fc1"))
        return SiteLinear.apply(h, self.fc2.weight, self.fc2.bias, "fc2")


class TPMLP(torch.nn.Module):
    """This rank's shard of `single`: fc1 column parallel, fc2 row parallel."""

    def __init__(self, single: MLP):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.fc1, self.fc2 = torch.nn.Module(), torch.nn.Module()
        self.fc1.weight = torch.nn.Parameter(single.fc1.weight.detach().chunk(n, 0)[r].clone())
        self.fc1.bias = torch.nn.Parameter(single.fc1.bias.detach().chunk(n, 0)[r].clone())
        self.fc2.weight = torch.nn.Parameter(single.fc2.weight.detach().chunk(n, 1)[r].clone())
        self.fc2.bias = torch.nn.Parameter(single.fc2.bias.detach().clone())
        # how compare_tp reassembles the shards (Megatron's attributes)
        for p, dim in ((self.fc1.weight, 0), (self.fc1.bias, 0), (self.fc2.weight, 1)):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1

    def forward(self, x):
        h = F.gelu(SiteLinear.apply(AllReduceBackward.apply(x), self.fc1.weight, self.fc1.bias, "fc1"))
        return AllReduceForward.apply(SiteLinear.apply(h, self.fc2.weight, None, "fc2")) + self.fc2.bias


def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


def run(model, x, dy, sharded: bool) -> dict[str, torch.Tensor]:
    """forward + backward; the output and every gradient as full tensors."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(dy)
    out = {"output": y.detach(), "input": x.grad}
    for name, p in model.named_parameters():
        dim = getattr(p, "partition_dim", None) if sharded else None
        out[name] = gather(p.grad, dim) if dim is not None else p.grad
    return out


def traced_runs(single, tp, x, dy, trace: bool):
    """The TP 1 and TP N runs, each inside tpcheck.trace() when `trace`."""
    if not trace:
        return run(single, x, dy, False), run(tp, x, dy, True), None, None
    with tpcheck.trace() as t1:
        one = run(single, x, dy, False)
        torch.cuda.synchronize()
    with tpcheck.trace() as tn:
        many = run(tp, x, dy, True)
        torch.cuda.synchronize()
    return one, many, t1, tn


def worst_element(one, many, rtol, atol):
    """The element that fails assert_close(TP N, TP 1, rtol, atol) by the widest margin:
    largest |d| / (atol + rtol |TP 1|); > 1 fails."""
    best = None
    for name, s in one.items():
        d = (many[name] - s).abs()
        ratio = d / (atol + rtol * s.abs())
        i = int(ratio.argmax())
        r = float(ratio.flatten()[i])
        if best is None or r > best["ratio"]:
            idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), s.shape))
            best = {"name": name, "index": idx, "ratio": r, "tp1": float(s.flatten()[i]),
                    "tpn": float(many[name].flatten()[i]), "max_abs_diff": float(d.max())}
    return best


def gemm_class(call: dict) -> str:
    """A cuBLASLt call's numerical class: the decoded implementation when the trace has it
    (trace(query=True) with a CUDA build of tpcheck), else the compute type (32F_FAST_TF32
    is TF32, 32F full float32)."""
    return call.get("math_class") or call["cublaslt"].get("compute_type", "?")


def changed_sites(t1, tn) -> list[tuple[str, str, str, str]]:
    """(site, shapes, class at TP 1, class at TP N) for the calls, aligned by order, whose
    class differs."""
    a, b = t1.calls, tn.calls
    names = SITES if len(a) == len(b) == len(SITES) else [f"call #{i}" for i in range(len(a))]
    out = []
    for name, ca, cb in zip(names, a, b):
        if gemm_class(ca) != gemm_class(cb):
            shapes = f"m={ca['m']} n={ca['n']} k={ca['k']} -> m={cb['m']} n={cb['n']} k={cb['k']}"
            out.append((name, shapes, gemm_class(ca), gemm_class(cb)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--small", action="store_true", help="hidden 32, ffn 128, 64 tokens (the CPU test)")
    ap.add_argument("--rtol", type=float, default=1e-3, help="the reference suite's float32 rtol")
    ap.add_argument("--atol", type=float, default=1e-5, help="the reference suite's float32 atol")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.small:
        a.hidden, a.ffn, a.tokens = 32, 128, 64
    gpu = torch.cuda.is_available()
    # No backend named: torch's default (gloo for CPU tensors, NCCL for CUDA ones) under
    # torchrun; the emulating backend under `python -m tpcheck emulate`.
    dist.init_process_group()
    if gpu:
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    n, rank0 = dist.get_world_size(), dist.get_rank() == 0
    say = print if rank0 else (lambda *_, **__: None)
    torch.backends.cuda.matmul.allow_tf32 = True   # the setting under investigation

    torch.manual_seed(a.seed)  # the same weights and inputs on every rank
    single = MLP(a.hidden, a.ffn).to(device)
    tp = TPMLP(single)
    x = torch.randn(a.tokens, a.hidden, device=device)
    dy = torch.randn(a.tokens, a.hidden, device=device)
    if gpu:
        x @ x.t()   # loads cuBLASLt, so tpcheck.trace() finds it
    else:
        say("NOTE: TF32 needs a GPU (NVIDIA Ampere or newer); on the CPU every GEMM is float32, "
            "the trace is skipped and the counterfactuals must remove 0 %.")

    say(f"== 1. worst element under the reference rule (assert_close, rtol {a.rtol:g}, "
        f"atol {a.atol:g}), TP 1 vs TP {n}")
    one, many, t1, tn = traced_runs(single, tp, x, dy, trace=gpu)
    w = worst_element(one, many, a.rtol, a.atol)
    say(f"{w['name']}{list(w['index'])}: TP 1 {w['tp1']:.8g}, TP {n} {w['tpn']:.8g}, "
        f"|diff| / (atol + rtol |TP 1|) = {w['ratio']:.3g} -> "
        f"{'FAILS' if w['ratio'] > 1 else 'passes'} the rule; max |diff| of {w['name']}: "
        f"{w['max_abs_diff']:.3g}")

    say(f"== 2. GEMM sites whose numerical class changed between TP 1 and TP {n}")
    if t1 is None:
        changed = []
        say("skipped: tpcheck.trace() records cuBLASLt, which runs only on a GPU")
    else:
        say(t1.diff(tn, "TP 1", f"TP {n}"))
        changed = changed_sites(t1, tn)
        for site, shapes, c1, cn in changed:
            say(f"{site}: {shapes}: {c1} -> {cn}")
        if not changed:
            say("no GEMM changed class (the difference comes from the reduction order and "
                "the split of the sums, not from TF32 being used at one TP size only)")
    # every rank must try the same counterfactuals (they run collectives): rank 0's list
    sites = [[s for s, *_ in changed] if changed or t1 is not None else list(SITES)]
    dist.broadcast_object_list(sites, src=0)

    say(f"== 3. counterfactuals: share of max |TP {n} - TP 1| of {w['name']} removed")
    for off in [[s] for s in sites[0]] + [list(SITES)]:
        TF32_OFF.clear()
        TF32_OFF.update(off)
        o, m, _, _ = traced_runs(single, tp, x, dy, trace=False)
        TF32_OFF.clear()
        d_off = float((m[w["name"]] - o[w["name"]]).abs().max())
        removed = (1 - d_off / w["max_abs_diff"]) if w["max_abs_diff"] > 0 else 0.0
        label = "TF32 off for every GEMM" if len(off) > 1 else f"TF32 off for {off[0]} only"
        say(f"{label}: max |diff| {w['max_abs_diff']:.3g} -> {d_off:.3g}: {100 * removed:.0f} % removed")

    say(f"== 4. compare_tp verdict (policy truth, TF32 {'on' if gpu else 'n/a on the CPU'})")
    report = compare_tp(single, tp, (x,), grad_output=dy)
    for e in report.entries:
        (_, v), = e["verdicts"].items()
        say(f"{e['kind']:18} {e['name']:10} {v['status']:5} {v['reason'][:100]}")
    say(f"verdict: {'PASS' if report.passed else 'FAIL'} on rank 0")
    ok = torch.tensor([int(report.passed)], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    raise SystemExit(0 if int(ok) else 1)


if __name__ == "__main__":
    main()

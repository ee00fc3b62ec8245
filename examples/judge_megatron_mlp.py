"""Judge your own tensor-parallel layer with tpcheck: a script to copy.

    python -m tpcheck emulate -n 4 -- python examples/judge_megatron_mlp.py
    torchrun --nproc-per-node 4 examples/judge_megatron_mlp.py          # or real GPUs

Every rank builds the unsharded MLP from one seed, its own shard of it (Megatron style:
column-parallel fc1, row-parallel fc2, parameters tagged with tensor_model_parallel /
partition_dim), and asks tpcheck.torch.compare_tp whether the sharded run is as close to
the fp64 truth as the unsharded one, up to rounding. `--bug` drops the row-parallel
all-reduce to show what a failure looks like.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from tpcheck.torch import compare_tp


class AllReduceForward(torch.autograd.Function):
    """Row-parallel output: sum the ranks' partial products (backward: identity)."""
    drop = False

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        if not AllReduceForward.drop:
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class AllReduceBackward(torch.autograd.Function):
    """Column-parallel input: identity forward, sum the input gradients backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class MLP(torch.nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn)
        self.fc2 = torch.nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TPMLP(torch.nn.Module):
    def __init__(self, single: MLP):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.fc1, self.fc2 = torch.nn.Module(), torch.nn.Module()
        self.fc1.weight = torch.nn.Parameter(single.fc1.weight.detach().chunk(n, 0)[r].clone())
        self.fc1.bias = torch.nn.Parameter(single.fc1.bias.detach().chunk(n, 0)[r].clone())
        self.fc2.weight = torch.nn.Parameter(single.fc2.weight.detach().chunk(n, 1)[r].clone())
        self.fc2.bias = torch.nn.Parameter(single.fc2.bias.detach().clone())
        for p, dim in ((self.fc1.weight, 0), (self.fc1.bias, 0), (self.fc2.weight, 1)):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1

    def forward(self, x):
        x = AllReduceBackward.apply(x)
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.fc1.weight, self.fc1.bias))
        return AllReduceForward.apply(torch.nn.functional.linear(h, self.fc2.weight)) + self.fc2.bias


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bug", action="store_true", help="drop the row-parallel all-reduce")
    ap.add_argument("--repeat", type=int, default=1,
                    help="call compare_tp this many times and print each call's time "
                         "(the first includes one-time costs: probe factors, cuBLAS setup)")
    a = ap.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(a.seed)  # the same global inputs and weights on every rank
    single = MLP(a.hidden, a.ffn).to(device)
    sharded = TPMLP(single)
    x = torch.randn(a.tokens, a.hidden, device=device)
    dy = torch.randn(a.tokens, a.hidden, device=device)
    AllReduceForward.drop = a.bug
    times, phases = [], []
    for _ in range(max(1, a.repeat)):
        # timed from a common start until every rank has its report (rank 0 does the
        # unsharded run, the truth and the judging; the others wait for its verdicts)
        dist.barrier()
        start = time.perf_counter()
        report = compare_tp(single, sharded, (x,), grad_output=dy)
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        phases.append(report.seconds)
    if dist.get_rank() == 0:
        for e in report.entries:
            (policy, v), = e["verdicts"].items()
            print(f"{e['kind']:18} {e['name']:12} {v['status']:5} {v['reason'][:110]}")
        print(f"compare_tp: {times[0]:.2f} s (sharded on every rank; single, the fp64 truth "
              f"with its probe and the judging on rank 0; gathering; TP {dist.get_world_size()})")
        for i, t in enumerate(times[1:], start=2):
            print(f"compare_tp call {i}: {t:.2f} s")
        for i, p in enumerate(phases, start=1):  # where the time went, on the judging rank
            print(f"compare_tp call {i} phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in p.items()))
        print(f"error model: {report.error_model}")
    ok = report.passed
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

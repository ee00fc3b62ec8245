"""A tensor-parallel LayerNormMLP written in plain PyTorch, judged with tpcheck.

Megatron-style: fc1 is column parallel (each rank holds ffn/N rows of fc1_weight and
fc1_bias), fc2 row parallel (ffn/N columns of fc2_weight); the partial outputs are summed
with an all-reduce, then the replicated fc2_bias is added; in backward the input gradient
is all-reduced (Megatron's f / g functions). Every rank also runs the unsharded module
(same code, one rank) on the same input. tpcheck then judges each output and gradient:
sharded against single, both against tpcheck's fp64 truth of TransformerEngine's
LayerNormMLP computed from the same parameters (tpcheck.layer_truth, state_dict names).

    torchrun --nproc_per_node=2 examples/tp_layernorm_mlp.py               # CPU, gloo
    torchrun --nproc_per_node=2 examples/tp_layernorm_mlp.py --device cuda # one GPU per rank
    torchrun --nproc_per_node=2 examples/tp_layernorm_mlp.py --bug         # a TP bug, caught

Exit status 0 when every tensor passes, 1 otherwise (on rank 0).
"""

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tpcheck


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, bug):
        ctx.bug = bug
        return x

    @staticmethod
    def backward(ctx, dy):
        if not ctx.bug:  # --bug: the input gradient keeps only this rank's part
            dy = dy.clone()
            dist.all_reduce(dy)
        return dy, None


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, dy):
        return dy


def layernorm_mlp(x, p, tp, bug=False, eps=1e-5):
    """TransformerEngine's LayerNormMLP (LayerNorm, gelu (tanh form), biases) on this
    rank's shards `p`; tp=False: the unsharded module."""
    ln = F.layer_norm(x, x.shape[-1:], p["layer_norm_weight"], p["layer_norm_bias"], eps)
    if tp:
        ln = _CopyToParallel.apply(ln, bug)
    h = F.gelu(ln @ p["fc1_weight"].t() + p["fc1_bias"], approximate="tanh")
    y = h @ p["fc2_weight"].t()
    if tp:
        y = _ReduceFromParallel.apply(y)
    return y + p["fc2_bias"]


def shard(full, rank, world):
    """This rank's pieces: fc1 rows, fc2 columns; the rest replicated."""
    out = {}
    for name, t in full.items():
        if name in ("fc1_weight", "fc1_bias"):
            t = t.chunk(world, dim=0)[rank]
        elif name == "fc2_weight":
            t = t.chunk(world, dim=1)[rank]
        out[name] = t.clone().requires_grad_(True)
    return out


def gather(t, dim, world):
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tf32", action="store_true", help="cuda: let f32 GEMMs use TF32")
    ap.add_argument("--bug", action="store_true", help="drop the input-gradient all-reduce")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = getattr(torch, args.dtype)

    # The same parameters, input and output gradient on every rank (same seed).
    g = torch.Generator().manual_seed(0)
    h, f = args.hidden, args.ffn
    full = {
        "layer_norm_weight": 1 + 0.1 * torch.randn(h, generator=g),
        "layer_norm_bias": 0.1 * torch.randn(h, generator=g),
        "fc1_weight": 0.023 * torch.randn(f, h, generator=g),
        "fc1_bias": 0.023 * torch.randn(f, generator=g),
        "fc2_weight": 0.023 * torch.randn(h, f, generator=g),
        "fc2_bias": 0.023 * torch.randn(h, generator=g),
    }
    full = {k: v.to(device=device, dtype=dtype) for k, v in full.items()}
    x = torch.randn(args.tokens, h, generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(args.tokens, h, generator=g).to(device=device, dtype=dtype) / x.numel()

    # Single (unsharded) and sharded runs, forward and backward.
    results = {}
    for run, tp in (("single", False), ("sharded", True)):
        p = shard(full, rank, world) if tp else {k: v.clone().requires_grad_(True) for k, v in full.items()}
        xi = x.clone().requires_grad_(True)
        y = layernorm_mlp(xi, p, tp, bug=args.bug)
        y.backward(dy)
        grads = {k: v.grad for k, v in p.items()}
        if tp:  # reassemble the sharded gradients
            grads["fc1_weight"] = gather(grads["fc1_weight"], 0, world)
            grads["fc1_bias"] = gather(grads["fc1_bias"], 0, world)
            grads["fc2_weight"] = gather(grads["fc2_weight"], 1, world)
        results[run] = {"output": y.detach(), "input grad": xi.grad, **{f"{k} grad": v for k, v in grads.items()}}

    # The fp64 truth of TransformerEngine's LayerNormMLP with these parameters
    # (constructor keywords and state_dict names as TE has them).
    truth = tpcheck.layer_truth("LayerNormMLP",
                                {"hidden_size": h, "ffn_hidden_size": f, "activation": "gelu"},
                                full, x, grad_output=dy)
    want = {"output": truth.output, "input grad": truth.input_grads["input"],
            **{f"{k} grad": v for k, v in truth.grads.items()}}

    if rank == 0:
        # The error model: the storage dtype (and TF32 GEMM inputs), the longest reduction
        # (the wgrad GEMMs sum over the tokens, fc2 over ffn), the TP size.
        math = "tf32" if (args.device == "cuda" and args.tf32 and dtype == torch.float32) else None
        k = max(h, f, args.tokens)
        failed = 0
        for name in results["single"]:
            v = tpcheck.compare(results["single"][name], results["sharded"][name],
                                torch.from_dlpack(want[name]).to(device), math=math,
                                reduction_length=k, tp_size=world, name=name)
            failed += not v
            print(f"{'PASS' if v else 'FAIL'} {name:<24} {v.reason}")
        print(f"{len(results['single']) - failed} passed, {failed} failed")
    else:
        failed = 0
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

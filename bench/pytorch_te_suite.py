#!/usr/bin/env python3
"""The `te` suite in plain eager PyTorch: the baseline of tpcheck's suite wall-time benchmark.

What it is. A PyTorch implementation of the 118 cases `tpcheck run --suite te` runs (the
case matrix of src/suite/te_suite.cpp, the layers of docs/LAYERS.md), with the same sizes
(tpcheck's defaults: hidden 64, ffn 32, heads 4 raised to --tp, seq 16, batch 16) and the
same per-case flow as src/suite/runner.cpp and judge.cpp:
  * parameters, input and MSE target generated on the device (f64, then cast);
  * three runs: single (case dtype, unsharded), sharded (TP = N ranks, sequence parallel
    as the case says), truth (f64, unsharded), plus the truth run once more under a
    rounding probe (every f64 value an op produces multiplied by 1 + 2^-30·r, r uniform in
    [-1, 1): tpcheck's rounding probe, here a TorchDispatchMode), whose difference
    from the truth is the truth policy's cancellation floor;
  * forward, the reference loss MSE(gathered output, target) (a returned bias and a
    returned layernorm output stay outside the loss), backward by torch.autograd;
  * every output, the input gradient and every parameter gradient (main_grad, f32, for
    weights with fuse_wgrad_accumulation) compared sharded vs single and both vs truth,
    statistics on the device (one host transfer per case), judged by the te policy
    (rtol/atol table f32 1e-3/5e-5, f16 1e-3/1e-5, at the argmax of |sharded - single|),
    allclose, truth (m·sqrt(N)·single error + u·sqrt(K)·(|truth| + noise)) and bitwise,
    exactly as src/numerics/policy.cpp; the chosen policy (--policy, default truth) gives
    PASS/WARN/FAIL. One line per case and a summary, as tpcheck prints them.

How the layers are written: eager torch.nn.functional ops on per-rank tensors, Megatron-LM
style tensor parallelism (column-parallel input: copy to the TP region / all-gather under
sequence parallel; row-parallel output: all-reduce / reduce-scatter; the conjugate
collective in backward, as torch.autograd.Function), parameter gradients of replicated
parameters that see only a token slice (norms, row-parallel bias under SP) all-reduced
after backward, as Megatron's finalize_model_grads does. Attention is the unfused path of
TransformerEngine's UnfusedDotProductAttention (baddbmm with alpha = 1/sqrt(d), causal /
sliding-window mask, softmax in f32, bmm), the path tpcheck models; GQA by
repeat_interleave. Rounding points are PyTorch's own (bias in F.linear, residual adds in
the storage dtype), not TransformerEngine's fused kernels: the comparison is single vs
sharded within PyTorch. f32 GEMMs may use TF32 on CUDA (--tf32 on, tpcheck's default).
Options that change no number in eager PyTorch run as plain autograd: delay_wgrad_compute
(TE computes wgrad later; same numbers), save_original_input (memory only); checkpoint
uses torch.utils.checkpoint (non-reentrant).

Two ways to run the ranks:
  (1) emulated, one process, one device:  python bench/pytorch_te_suite.py --tp 4 --device cuda
      Every rank's shard is its own tensor; the layer code runs over the list of ranks,
      and a collective is a tensor operation over that list (all-reduce: stack + sum,
      all-gather: cat, reduce-scatter: sum + chunk).
  (2) distributed:  torchrun --nproc_per_node=N bench/pytorch_te_suite.py --distributed
      One rank per GPU (gloo on the CPU with --device cpu, for development), real
      torch.distributed collectives. The single, truth and probe runs and the comparison
      run on rank 0 only, after the sharded results are all-gathered to it (the same
      pattern as tpcheck's one-process NCCL mode); the other ranks wait in the next
      case's first collective. Running the unsharded twins on every rank, as
      TransformerEngine's run_numerics.py does, would cost the same wall time (the ranks
      run in parallel) and only duplicate work.

Options as tpcheck's: --filter, --policy, --seed, --quiet, --tf32, --hidden --ffn --heads
--seq --batch. Timing notes: the first op under the probe's TorchDispatchMode imports
PyTorch's Python dispatcher (seconds, once; the summary line gives it); on a CPU, run with
OMP_NUM_THREADS=1 (torchrun's default): the suite's ops are tiny. --sync-debug (cuda)
warns at every host-device synchronization; the one expected is the per-case transfer.
bench/suite_vs_pytorch.sh times this against tpcheck; tests/python/test_pytorch_te_suite.py
checks its f64 truth against tests/python/jax_layers.py.

Exit code: 0 when every case passes the chosen policy, 1 otherwise, 2 for bad options.
"""

import argparse
import contextlib
import io
import math
import os
import re
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# ---- the case matrix (src/suite/te_suite.cpp) ------------------------------------------


@dataclass
class Case:
    id: str
    module: str
    mode: str  # "column" | "row" | "" (Linear's parallel_mode)
    sp: bool
    variant: dict
    options: dict
    input_shape: tuple
    dtype: torch.dtype


def _label(options):
    if not options:
        return "default"
    parts = []
    for k, v in options.items():
        if isinstance(v, bool):
            s = "true" if v else "false"
        elif isinstance(v, (list, tuple)):
            s = "[" + ",".join(str(x) for x in v) + "]"
        else:
            s = str(v)
        parts.append(f"{k}={s}")
    return "+".join(parts)


def _variants(options_list):
    out = []
    for o in options_list:
        label = _label(o)
        for existing, _ in out:
            if existing == label:
                label += ".2"  # the reference repeats a variant; tpcheck keeps both
        out.append((label, o))
    return out


def resolve_sizes(tp, hidden, ffn, heads, seq, batch, notes):
    z = dict(hidden=hidden or 64, ffn=ffn or 32, heads=heads or 4, seq=seq or 16,
             batch=batch or 16)
    if heads is None and z["heads"] % tp != 0:
        notes.append(f"heads and num_gqa_groups raised from {z['heads']} to {tp} to fit tp={tp}")
        z["heads"] = tp
    for name in ("hidden", "ffn", "heads", "batch"):
        if z[name] <= 0 or z[name] % tp != 0:
            raise ValueError(f"--tp {tp} does not divide --{name} {z[name]}")
    if z["hidden"] % z["heads"] != 0:
        raise ValueError(f"--heads {z['heads']} does not divide --hidden {z['hidden']}")
    if z["seq"] <= 0:
        raise ValueError(f"--seq must be positive, got {z['seq']}")
    return z


def te_cases(tp, z, notes):
    cases = []

    def add(module, mode, sp, label, variant, options, shape):
        opts = {**options, **variant, "sequence_parallel": sp}
        dtype = torch.float16 if opts.get("params_dtype") == "f16" else torch.float32
        cid = f"{module}{'.' + mode if mode else ''}.sp{int(sp)}.{label}"
        cases.append(Case(cid, module, mode, sp, variant, opts, tuple(shape), dtype))

    H, FF, NH, S, B = z["hidden"], z["ffn"], z["heads"], z["seq"], z["batch"]
    for label, v in _variants([{}, {"bias": False}, {"init_method": "constant"},
                               {"fuse_wgrad_accumulation": True}, {"return_bias": True},
                               {"params_dtype": "f16"}, {"delay_wgrad_compute": True},
                               {"save_original_input": True}]):
        for mode in ("column", "row"):
            for sp in (False, True):
                tokens = tp * B if (sp and mode == "column") else B
                add("Linear", mode, sp, label, v,
                    {"in_features": H, "out_features": H, "parallel_mode": mode}, (tokens, H))
    for norm in ("LayerNorm", "RMSNorm"):
        for label, v in _variants([{"zero_centered_gamma": True}, {"params_dtype": "f16"}]):
            for sp in (False, True):
                add(norm, "", sp, label, v, {"hidden_size": H}, (tp * B if sp else B, H))
    for label, v in _variants([{}, {"bias": False}, {"init_method": "constant"},
                               {"fuse_wgrad_accumulation": True}, {"return_bias": True},
                               {"params_dtype": "f16"}, {"zero_centered_gamma": False},
                               {"return_layernorm_output": True},
                               {"delay_wgrad_compute": True}]):
        for sp in (False, True):
            add("LayerNormLinear", "column", sp, label, v,
                {"in_features": H, "out_features": H, "parallel_mode": "column"},
                (tp * S if sp else S, H))
    for label, v in _variants([{}, {"init_method": "constant"},
                               {"output_layer_init_method": "constant"},
                               {"normalization": "RMSNorm"}, {"zero_centered_gamma": True},
                               {"bias": False}, {"params_dtype": "f16"}, {"activation": "relu"},
                               {"fuse_wgrad_accumulation": True}, {"return_bias": True},
                               {"return_layernorm_output": True},
                               {"delay_wgrad_compute": True}, {"checkpoint": True}]):
        for sp in (False, True):
            add("LayerNormMLP", "", sp, label, v, {"hidden_size": H, "ffn_hidden_size": FF},
                (tp * S if sp else S, H))
    gqa = 4
    if NH % 4 != 0 or 4 % tp != 0:
        gqa = NH
        notes.append(f"num_gqa_groups variant uses {gqa} groups (4 does not fit heads={NH}, tp={tp})")
    for label, v in _variants([{}, {"num_gqa_groups": gqa}, {"init_method": "constant"},
                               {"output_layer_init_method": "constant"},
                               {"apply_residual_connection_post_layernorm": True},
                               {"output_layernorm": True}, {"parallel_attention_mlp": True},
                               {"window_size": [2, 2]}, {"normalization": "RMSNorm"},
                               {"zero_centered_gamma": True}, {"fuse_qkv_params": True},
                               {"fuse_qkv_params": True, "fuse_wgrad_accumulation": True},
                               {"qkv_weight_interleaved": False}, {"bias": False},
                               {"params_dtype": "f16"}, {"fuse_qkv_params": True},
                               {"activation": "relu"}]):
        for sp in (False, True):
            add("TransformerLayer", "", sp, label, v,
                {"hidden_size": H, "ffn_hidden_size": FF, "num_attention_heads": NH},
                (tp * S, B, H))
    return cases


# ---- shards (include/tpcheck/shard.h): a dim and blocks, each block split N ways -------


@dataclass(frozen=True)
class Shard:
    dim: object = None  # None: replicated
    blocks: tuple = ()  # sizes along dim (global); () = one block

    def take(self, full, rank, n):
        if self.dim is None or n == 1:
            return full
        blocks = self.blocks or (full.shape[self.dim],)
        return torch.cat([p.chunk(n, self.dim)[rank] for p in full.split(blocks, self.dim)],
                         self.dim)

    def assemble(self, shards):
        if self.dim is None or len(shards) == 1:
            return shards[0]
        if not self.blocks:
            return torch.cat(shards, self.dim)
        local = tuple(b // len(shards) for b in self.blocks)
        pieces = [s.split(local, self.dim) for s in shards]
        return torch.cat([torch.cat([p[b] for p in pieces], self.dim)
                          for b in range(len(local))], self.dim)


REPLICATED = Shard()
TOKENS = Shard(0)
FEATURES = Shard(-1)

# ---- groups: the ranks this process computes, and their collectives --------------------


class LocalGroup:
    """One rank (the single and truth runs): every collective is the identity."""

    world, ranks, rank0 = 1, [0], True

    def all_reduce(self, xs):
        return xs

    def all_gather(self, xs, dim):
        return xs

    def reduce_scatter(self, xs, dim):
        return xs

    def split(self, xs, dim):
        return xs

    def collect(self, xs, shard):
        return xs[0]


class EmulatedGroup:
    """N ranks in one process: a collective is a tensor operation over the ranks' list;
    each rank gets its own output tensor, as NCCL writes each rank's buffer."""

    rank0 = True

    def __init__(self, n):
        self.world, self.ranks = n, list(range(n))

    def all_reduce(self, xs):
        s = torch.stack(xs).sum(0)
        return [s] + [s.clone() for _ in xs[1:]]

    def all_gather(self, xs, dim):
        c = torch.cat(xs, dim)
        return [c] + [c.clone() for _ in xs[1:]]

    def reduce_scatter(self, xs, dim):
        return list(torch.stack(xs).sum(0).chunk(self.world, dim))

    def split(self, xs, dim):
        return [x.chunk(self.world, dim)[r] for r, x in enumerate(xs)]

    def collect(self, xs, shard):
        return shard.assemble(xs)


class DistributedGroup:
    """This process's one rank of a torch.distributed group (NCCL, or gloo on the CPU)."""

    def __init__(self):
        import torch.distributed as dist

        self.dist = dist
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.ranks, self.rank0 = [self.rank], self.rank == 0
        self.gloo = dist.get_backend() == "gloo"

    def _gather0(self, x):
        """[world, *x.shape]: every rank's x, stacked."""
        x = x.contiguous()
        out = torch.empty((self.world * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype,
                          device=x.device)  # gloo wants the concatenated shape
        self.dist.all_gather_into_tensor(out, x)
        return out.view((self.world,) + tuple(x.shape))

    def all_reduce(self, xs):
        y = xs[0].clone()
        self.dist.all_reduce(y)
        return [y]

    def all_gather(self, xs, dim):
        return [torch.cat(self._gather0(xs[0]).unbind(0), dim)]

    def reduce_scatter(self, xs, dim):
        x = xs[0].movedim(dim, 0).contiguous()
        if self.gloo:  # gloo has no reduce_scatter_tensor
            y = x.clone()
            self.dist.all_reduce(y)
            y = y.chunk(self.world, 0)[self.rank]
        else:
            y = torch.empty((x.shape[0] // self.world,) + tuple(x.shape[1:]), dtype=x.dtype,
                            device=x.device)
            self.dist.reduce_scatter_tensor(y, x)
        return [y.movedim(0, dim)]

    def split(self, xs, dim):
        return [xs[0].chunk(self.world, dim)[self.rank]]

    def collect(self, xs, shard):
        """The global tensor (on every rank; rank 0 uses it)."""
        if shard.dim is None:
            return xs[0]
        return shard.assemble(list(self._gather0(xs[0]).unbind(0)))


class _Collective(torch.autograd.Function):
    """A collective in forward and its conjugate in backward (Megatron's mappings)."""

    @staticmethod
    def forward(ctx, group, fwd, bwd, dim, *xs):
        ctx.group, ctx.bwd, ctx.dim = group, bwd, dim
        return tuple(_run(group, fwd, list(xs), dim))

    @staticmethod
    def backward(ctx, *gs):
        return (None, None, None, None) + tuple(_run(ctx.group, ctx.bwd, list(gs), ctx.dim))


def _run(group, kind, xs, dim):
    if kind == "identity":
        return [x.view_as(x) for x in xs]
    if kind == "all_reduce":
        return group.all_reduce(xs)
    if kind == "all_gather":
        return group.all_gather(xs, dim)
    if kind == "reduce_scatter":
        return group.reduce_scatter(xs, dim)
    return group.split(xs, dim)


def collective(group, fwd, bwd, xs, dim=0):
    if group.world == 1:
        return xs
    return list(_Collective.apply(group, fwd, bwd, dim, *xs))


def copy_to_tp(g, xs):  # column-parallel input without SP
    return collective(g, "identity", "all_reduce", xs)


def reduce_from_tp(g, xs):  # row-parallel output without SP
    return collective(g, "all_reduce", "identity", xs)


def gather_from_sp(g, xs):  # column-parallel input under SP: tokens gathered
    return collective(g, "all_gather", "reduce_scatter", xs, 0)


def reduce_scatter_to_sp(g, xs):  # row-parallel output under SP
    return collective(g, "reduce_scatter", "all_gather", xs, 0)


def gather_output(g, xs, shard):  # the loss's differentiable gather (run_numerics' _gather)
    if shard.dim is None:
        return xs
    return collective(g, "all_gather", "split", xs, shard.dim)


# ---- layers (docs/LAYERS.md), written over the list of ranks --------------------------

WEIGHT_STD, BIAS_STD, NORM_STD, CONSTANT = 0.023, 0.023, 0.1, 0.05


@dataclass
class ParamSpec:
    name: str
    shape: tuple
    fill: str  # "weight" | "constant" | "bias" | "gamma" | "gamma0" | "beta"
    shard: Shard = REPLICATED
    sp_grad: bool = False  # replicated, sees a token slice under SP: grad all-reduced
    main_grad: bool = False  # fuse_wgrad_accumulation: f32 main_grad


def _norm_specs(prefix, names, h, normalization, zcg, sp):
    specs = [ParamSpec(prefix + names[0], (h,), "gamma0" if zcg else "gamma", sp_grad=sp)]
    if normalization == "LayerNorm":
        specs.append(ParamSpec(prefix + names[1], (h,), "beta", sp_grad=sp))
    return specs


def _wfill(init):
    return "constant" if init == "constant" else "weight"


def param_specs(case):
    o, sp = case.options, case.sp
    fuse = o.get("fuse_wgrad_accumulation", False)
    bias = o.get("bias", True)
    m = case.module
    if m == "Linear":
        col = o["parallel_mode"] == "column"
        specs = [ParamSpec("weight", (o["out_features"], o["in_features"]),
                           _wfill(o.get("init_method")), Shard(0 if col else 1), main_grad=fuse)]
        if bias:
            specs.append(ParamSpec("bias", (o["out_features"],), "bias",
                                   Shard(0) if col else REPLICATED, sp_grad=sp and not col))
        return specs
    if m in ("LayerNorm", "RMSNorm"):
        return _norm_specs("", ("weight", "bias"), o["hidden_size"], m,
                           o.get("zero_centered_gamma", False), sp)
    if m == "LayerNormLinear":
        specs = _norm_specs("", ("layer_norm_weight", "layer_norm_bias"), o["in_features"],
                            o.get("normalization", "LayerNorm"),
                            o.get("zero_centered_gamma", False), sp)
        specs.append(ParamSpec("weight", (o["out_features"], o["in_features"]),
                               _wfill(o.get("init_method")), Shard(0), main_grad=fuse))
        if bias:
            specs.append(ParamSpec("bias", (o["out_features"],), "bias", Shard(0)))
        return specs
    if m == "LayerNormMLP":
        return _mlp_specs("", o, sp)
    specs = _attention_specs("self_attention.", o, sp)
    specs += _mlp_specs("layernorm_mlp.", o, sp)
    if o.get("output_layernorm", False):
        specs += _norm_specs("", ("layernorm.weight", "layernorm.bias"), o["hidden_size"],
                             o.get("normalization", "LayerNorm"),
                             o.get("zero_centered_gamma", False), sp)
    return specs


def _mlp_specs(p, o, sp):
    h, f = o["hidden_size"], o["ffn_hidden_size"]
    fuse, bias = o.get("fuse_wgrad_accumulation", False), o.get("bias", True)
    specs = _norm_specs(p, ("layer_norm_weight", "layer_norm_bias"), h,
                        o.get("normalization", "LayerNorm"), o.get("zero_centered_gamma", False),
                        sp)
    specs.append(ParamSpec(p + "fc1_weight", (f, h), _wfill(o.get("init_method")), Shard(0),
                           main_grad=fuse))
    if bias:
        specs.append(ParamSpec(p + "fc1_bias", (f,), "bias", Shard(0)))
    specs.append(ParamSpec(p + "fc2_weight", (h, f), _wfill(o.get("output_layer_init_method")),
                           Shard(1), main_grad=fuse))
    if bias:
        specs.append(ParamSpec(p + "fc2_bias", (h,), "bias", sp_grad=sp))
    return specs


def _heads(o):
    heads = o["num_attention_heads"]
    return heads, o.get("num_gqa_groups") or heads, o["hidden_size"] // heads


def _attention_specs(p, o, sp):
    H = o["hidden_size"]
    heads, g, d = _heads(o)
    fuse, bias = o.get("fuse_wgrad_accumulation", False), o.get("bias", True)
    wf = _wfill(o.get("init_method"))
    specs = []
    if not o.get("output_layernorm", False):  # the attention's input norm
        qkv = p + "layernorm_qkv."
        specs += _norm_specs(qkv, ("layer_norm_weight", "layer_norm_bias"), H,
                             o.get("normalization", "LayerNorm"),
                             o.get("zero_centered_gamma", False), sp)
    else:
        qkv = p + "qkv."
    if o.get("fuse_qkv_params", False):
        blocks = () if o.get("qkv_weight_interleaved", True) else (heads * d, g * d, g * d)
        specs.append(ParamSpec(qkv + "weight", ((heads + 2 * g) * d, H), wf, Shard(0, blocks),
                               main_grad=fuse))
        if bias:
            specs.append(ParamSpec(qkv + "bias", ((heads + 2 * g) * d,), "bias", Shard(0, blocks)))
    else:
        for n, rows in (("query", heads * d), ("key", g * d), ("value", g * d)):
            specs.append(ParamSpec(qkv + n + "_weight", (rows, H), wf, Shard(0), main_grad=fuse))
        if bias:
            for n, rows in (("query", heads * d), ("key", g * d), ("value", g * d)):
                specs.append(ParamSpec(qkv + n + "_bias", (rows,), "bias", Shard(0)))
    specs.append(ParamSpec(p + "proj.weight", (H, heads * d),
                           _wfill(o.get("output_layer_init_method")), Shard(1), main_grad=fuse))
    if bias:
        specs.append(ParamSpec(p + "proj.bias", (H,), "bias", sp_grad=sp))
    return specs


def input_layout(case):
    if case.module == "Linear" and case.mode == "row":
        return FEATURES
    return TOKENS if case.sp else REPLICATED


def output_layouts(case):
    """{output name: Shard} of the sharded run."""
    o, m, sp = case.options, case.module, case.sp
    if m in ("LayerNorm", "RMSNorm", "TransformerLayer"):
        return {"output": input_layout(case)}
    if m == "LayerNormMLP" or (m == "Linear" and case.mode == "row"):
        out = {"output": TOKENS if sp else REPLICATED, "bias": REPLICATED}
    else:  # column-parallel Linear / LayerNormLinear
        out = {"output": FEATURES, "bias": Shard(0)}
    out["layernorm_output"] = TOKENS if sp else REPLICATED
    return out


def pmap(fn, *lists):
    return [fn(*args) for args in zip(*lists)]


def _opt(lst, r):
    return None if lst is None else lst[r]


class Run:
    """One run of a case on a group: its parameters (per-rank leaves) and the layers."""

    def __init__(self, case, group, P, sp):
        self.case, self.g, self.P, self.sp = case, group, P, sp
        self.o = case.options

    def norm(self, xs, prefix, weight="layer_norm_weight", bias="layer_norm_bias",
             normalization=None):
        o = self.o
        normalization = normalization or o.get("normalization", "LayerNorm")
        gs = self.P[prefix + weight]
        if o.get("zero_centered_gamma", False):
            gs = [gm + 1 for gm in gs]
        h = (xs[0].shape[-1],)
        if normalization == "LayerNorm":
            return pmap(lambda x, gm, b: F.layer_norm(x, h, gm, b, 1e-5), xs, gs,
                        self.P[prefix + bias])
        return pmap(lambda x, gm: F.rms_norm(x, h, gm, 1e-5), xs, gs)

    def column(self, xs, ws, bs):
        xs = gather_from_sp(self.g, xs) if self.sp else copy_to_tp(self.g, xs)
        if bs is None:
            return pmap(F.linear, xs, ws)
        return pmap(F.linear, xs, ws, bs)

    def row(self, xs, ws):
        ys = pmap(F.linear, xs, ws)
        return reduce_scatter_to_sp(self.g, ys) if self.sp else reduce_from_tp(self.g, ys)

    def linear(self, xs):
        o, P = self.o, self.P
        bias = P.get("bias")
        if o["parallel_mode"] == "column":
            add = bias if not o.get("return_bias") else None
            y = self.column(xs, P["weight"], add)
        else:
            y = self.row(xs, P["weight"])
            if bias is not None and not o.get("return_bias"):
                y = pmap(torch.add, y, bias)
        out = {"output": y}
        if bias is not None and o.get("return_bias"):
            out["bias"] = bias
        return out

    def mlp(self, xs, p, return_bias):
        """Returns (m without fc2 bias, fc2 bias or None, ln)."""
        o, P = self.o, self.P
        ln = self.norm(xs, p)
        h = self.column(ln, P[p + "fc1_weight"], P.get(p + "fc1_bias"))
        act = o.get("activation", "gelu")
        a = [F.gelu(t, approximate="tanh") if act == "gelu" else F.relu(t) for t in h]
        m = self.row(a, P[p + "fc2_weight"])
        return m, P.get(p + "fc2_bias"), ln

    def attention(self, xs):
        o, P, g = self.o, self.P, self.g
        p = "self_attention."
        heads, groups, d = _heads(o)
        hl, gl = heads // g.world, groups // g.world
        if not o.get("output_layernorm", False):
            qp = p + "layernorm_qkv."
            ln = self.norm(xs, qp)
            inp = ln
        else:
            qp, ln, inp = p + "qkv.", None, xs
        if o.get("fuse_qkv_params", False):
            ws, bs = P[qp + "weight"], P.get(qp + "bias")
        else:  # parameters_split: one GEMM over the concatenated local shards [q; k; v]
            ws = pmap(lambda a, b, c: torch.cat([a, b, c]), *(P[qp + n + "_weight"]
                                                              for n in ("query", "key", "value")))
            bs = None
            if o.get("bias", True):
                bs = pmap(lambda a, b, c: torch.cat([a, b, c]), *(P[qp + n + "_bias"]
                                                                  for n in ("query", "key", "value")))
        qkv = self.column(inp, ws, bs)
        interleaved = o.get("fuse_qkv_params", False) and o.get("qkv_weight_interleaved", True)
        mask = self.mask
        outs = []
        for t in qkv:
            s, b = t.shape[0], t.shape[1]
            if interleaved:  # rows [group][heads/groups query heads, key, value][d]
                t = t.view(s, b, gl, heads // groups + 2, d)
                q = t[:, :, :, : heads // groups].reshape(s, b, hl, d)
                k, v = t[:, :, :, -2], t[:, :, :, -1]
            else:
                q, k, v = t.split([hl * d, gl * d, gl * d], dim=-1)
                q, k, v = q.view(s, b, hl, d), k.view(s, b, gl, d), v.view(s, b, gl, d)
            outs.append(core_attention(q, k, v, mask))
        a = self.row(outs, P[p + "proj.weight"])
        return a, P.get(p + "proj.bias"), ln

    def transformer_layer(self, xs):
        o = self.o
        s = xs[0].shape[0] * (self.g.world if self.sp else 1)
        self.mask = attention_mask(s, o.get("window_size"), xs[0].device)
        a, ab, ln_a = self.attention(xs)
        a_full = a if ab is None else pmap(torch.add, a, ab)
        if o.get("parallel_attention_mlp", False):
            m, mb, _ = self.mlp(xs, "layernorm_mlp.", False)
            m_full = m if mb is None else pmap(torch.add, m, mb)
            y = pmap(lambda x, a_, m_: x + (a_ + m_), xs, a_full, m_full)
        else:
            post = o.get("apply_residual_connection_post_layernorm", False)
            r1 = ln_a if (post and ln_a is not None) else xs
            h = pmap(torch.add, a_full, r1)
            m, mb, ln_m = self.mlp(h, "layernorm_mlp.", True)
            m_full = m if mb is None else pmap(torch.add, m, mb)
            y = pmap(torch.add, m_full, ln_m if post else h)
        if o.get("output_layernorm", False):
            y = self.norm(y, "layernorm.", "weight", "bias")
        return {"output": y}

    def forward(self, xs):
        m, o = self.case.module, self.o
        if m == "Linear":
            return self.linear(xs)
        if m in ("LayerNorm", "RMSNorm"):
            return {"output": self.norm(xs, "", "weight", "bias", normalization=m)}
        if m == "LayerNormLinear":
            ln = self.norm(xs, "")
            out = self.linear(ln)
            if o.get("return_layernorm_output"):
                out["layernorm_output"] = ln
            return out
        if m == "LayerNormMLP":
            def mlp(*x):
                mo, mb, ln = self.mlp(list(x), "", o.get("return_bias", False))
                if mb is not None and not o.get("return_bias"):
                    mo = pmap(torch.add, mo, mb)
                return tuple(mo) + tuple(ln)
            if o.get("checkpoint", False):
                res = torch.utils.checkpoint.checkpoint(mlp, *xs, use_reentrant=False)
            else:
                res = mlp(*xs)
            n = len(xs)
            out = {"output": list(res[:n])}
            if o.get("return_bias") and "fc2_bias" in self.P:
                out["bias"] = self.P["fc2_bias"]
            if o.get("return_layernorm_output"):
                out["layernorm_output"] = list(res[n:])
            return out
        return self.transformer_layer(xs)


def attention_mask(s, window, device):
    """[s, s] bool, True where key j is visible to query i: causal, and with a window
    (left, right) normalized as check_set_window_size does for causal: (l, r) -> (l, 0)."""
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    ok = j <= i
    if window is not None and window[0] >= 0:
        ok = ok & (j >= i - window[0])
    return ok


def core_attention(q, k, v, mask):
    """TransformerEngine's UnfusedDotProductAttention: q [s, b, h, d], k, v [s, b, g, d]
    -> [s, b, h·d]."""
    s, b, h, d = q.shape
    if k.shape[2] != h:
        k = k.repeat_interleave(h // k.shape[2], dim=2)
        v = v.repeat_interleave(h // v.shape[2], dim=2)
    q = q.permute(1, 2, 0, 3).reshape(b * h, s, d)
    k = k.permute(1, 2, 0, 3).reshape(b * h, s, d)
    v = v.permute(1, 2, 0, 3).reshape(b * h, s, d)
    scores = torch.baddbmm(torch.empty(b * h, s, s, dtype=q.dtype, device=q.device), q,
                           k.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))
    scores = scores.masked_fill(~mask, float("-inf"))
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    probs = torch.softmax(scores, dim=-1, dtype=compute).to(q.dtype)
    ctx = torch.bmm(probs, v)  # [b·h, s, d]
    return ctx.view(b, h, s, d).permute(2, 0, 1, 3).reshape(s, b, h * d)


# ---- one run: leaves, forward, loss, backward, results gathered -----------------------


def run_case_on(case, group, full, dtype, sp, probe=None):
    """Runs `case` on `group` (sp: sequence parallel on or off); returns {(kind, name):
    global tensor} of every compared tensor (meaningful on rank 0). `probe`: the active
    RoundingProbe, checked to have seen the backward's ops too."""
    n = group.world
    P, leaves = {}, []
    for spec in full["specs"]:
        shards = [spec.shard.take(full["params"][spec.name], r, n).to(dtype, copy=True)
                  .requires_grad_() for r in group.ranks]
        P[spec.name] = shards
        leaves.append((spec, shards))
    lay_in = input_layout(case) if n > 1 else REPLICATED
    xs = [lay_in.take(full["input"], r, n).to(dtype, copy=True).requires_grad_()
          for r in group.ranks]
    run = Run(case, group, P, sp)
    out = run.forward(xs)
    layouts = output_layouts(case) if n > 1 else {}
    y_global = gather_output(group, out["output"], layouts.get("output", REPLICATED))
    target = full["target"].to(dtype)
    losses = [F.mse_loss(y, target) for y in y_global]
    seen = probe.count if probe is not None else 0
    # Autograd runs a CUDA backward on a device thread; under the probe it runs on this
    # thread, where the dispatch mode surely is.
    with torch.autograd.set_multithreading_enabled(probe is None):
        torch.autograd.backward(losses)
    if probe is not None and probe.count == seen:
        raise RuntimeError("the rounding probe saw no backward op; the truth floor would "
                           "miss the backward's rounding")

    # Keyed (kind, name): a returned "bias" output and a "bias" parameter are two tensors.
    results = {("output", "output"): y_global[0].detach()}
    for name in ("bias", "layernorm_output"):
        if name in out:
            results[("output", name)] = group.collect([t.detach() for t in out[name]],
                                                      layouts.get(name, REPLICATED))
    results[("input_gradient", "input")] = group.collect([x.grad for x in xs], lay_in)
    for spec, shards in leaves:
        grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in shards]
        if spec.sp_grad and sp:  # Megatron's all-reduce of sequence-parallel param grads
            grads = group.all_reduce(grads)
        if spec.main_grad:  # fuse_wgrad_accumulation: accumulated into f32 main_grad
            wide = torch.float64 if dtype == torch.float64 else torch.float32
            grads = [torch.zeros(gr.shape, dtype=wide, device=gr.device).add_(gr)
                     for gr in grads]
        results[("gradient", spec.name)] = group.collect(grads,
                                                         spec.shard if n > 1 else REPLICATED)
    return results


class RoundingProbe(TorchDispatchMode):
    """tpcheck's rounding probe: every f64 value an op computes is multiplied by
    (1 + u·r), r uniform in [-1, 1); views, copies and in-place ops are left alone."""

    _SKIP = {"clone", "_to_copy", "copy", "cat", "stack", "split", "split_with_sizes",
             "chunk", "empty", "empty_like", "zeros", "zeros_like", "ones_like", "full",
             "_unsafe_view", "unbind", "detach", "lift_fresh", "new_empty", "new_zeros",
             "arange", "masked_fill", "repeat_interleave", "index", "le", "ge", "bitwise_and",
             "bitwise_not", "logical_and", "view", "rand"}

    def __init__(self, u, generator):
        super().__init__()
        self.u, self.gen, self.count = u, generator, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or func._schema.is_mutable or name in self._SKIP:
            return out
        if isinstance(out, torch.Tensor):
            return self._perturb(out)
        if isinstance(out, (tuple, list)):
            return type(out)(self._perturb(t) if isinstance(t, torch.Tensor) else t for t in out)
        return out

    def _perturb(self, t):
        if t.dtype != torch.float64 or t.numel() == 0:
            return t
        self.count += 1
        r = torch.rand(t.shape, dtype=t.dtype, device=t.device, generator=self.gen)
        return t * (1.0 + self.u * (2.0 * r - 1.0))


# ---- comparison (src/numerics/compare.cpp, policy.cpp) --------------------------------

TOLERANCE = {torch.float32: (1e-3, 5e-5), torch.float16: (1e-3, 1e-5),
             torch.bfloat16: (1.6e-2, 1e-5)}
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11,
                 torch.bfloat16: 2.0**-8}
INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}
STATS = ("argmax", "max_diff", "sharded_value", "single_value", "sq_diff", "sq_single",
         "over_allclose", "bits_differ", "sharded_nan", "sharded_inf", "single_nan",
         "single_inf", "sharded_nonzero", "single_nonzero", "truth_nonfinite", "sq_truth",
         "truth_max", "single_err_max", "single_err_sq", "sharded_err_max", "sharded_err_sq",
         "noise_sq", "noise_max", "sum_truth", "sum_truth_diff", "sum_truth_single_err",
         "sum_t2_d2", "sum_t3_d", "sum_t4")
PROBE_U = 2.0**-30


def tensor_stats(sharded, single, truth, probed):
    """The statistics of one compared tensor, as one f64 vector on the device."""
    rtol, atol = TOLERANCE.get(single.dtype, (0.0, 0.0))
    a, b = sharded.reshape(-1), single.reshape(-1)
    d = (a - b).abs()  # in the tensors' dtype, as the reference suite takes it
    i = torch.argmax(d).view(1)  # first maximum, NaN first; indexed by index_select (a
    # 0-d tensor index would be read on the host: a sync)
    a64, b64, t64 = a.double(), b.double(), truth.reshape(-1).double()
    at = lambda x: x.index_select(0, i).squeeze(0)  # noqa: E731
    exact = (a64 - b64).abs()
    es1, es2 = b64 - t64, a64 - t64
    noise = (probed.reshape(-1).double() - t64) / PROBE_U
    iv = INT_VIEW[single.dtype]
    f = lambda x: x.double()  # noqa: E731
    dd, t2 = a64 - b64, t64 * t64  # the scale test's sums (compare_sums.h)
    return torch.stack([
        f(i.squeeze(0)), f(at(d)), at(a64), at(b64), (exact * exact).sum(), (b64 * b64).sum(),
        f((~(exact <= atol + rtol * b64.abs())).sum()), f((a.view(iv) != b.view(iv)).sum()),
        f(a.isnan().sum()), f(a.isinf().sum()), f(b.isnan().sum()), f(b.isinf().sum()),
        f(torch.count_nonzero(a)), f(torch.count_nonzero(b)), f((~t64.isfinite()).sum()),
        (t64 * t64).sum(), t64.abs().max(), es1.abs().max(), (es1 * es1).sum(),
        es2.abs().max(), (es2 * es2).sum(), (noise * noise).sum(), noise.abs().max(),
        t64.sum(), (t64 * dd).sum(), (t64 * es1).sum(), (t2 * dd * dd).sum(),
        (t2 * t64 * dd).sum(), (t2 * t2).sum()])


def g3(v):
    return f"{v:.3g}"


def verdicts(st, numel, dtype, truth_params):
    """{policy: (status, reason)} for one tensor's statistics `st` (a dict)."""
    has_tol = dtype in TOLERANCE
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    rel = st["max_diff"] / max(abs(st["single_value"]), 1e-5)
    st["rel_at_max"] = rel
    st["norm_rel"] = (math.sqrt(st["sq_diff"]) / math.sqrt(st["sq_single"]) if st["sq_single"] > 0
                      else (0.0 if st["sq_diff"] == 0 else math.inf))
    at = f"index {int(st['argmax'])}"
    nonfinite = st["sharded_nan"] + st["sharded_inf"] + st["single_nan"] + st["single_inf"]
    if nonfinite > 0 or st["truth_nonfinite"] > 0:
        v = ("fail", "non-finite values never pass")
        return {p: v for p in ("te", "allclose", "truth", "bitwise")}
    if st["sharded_nonzero"] == 0 and st["single_nonzero"] != 0:
        v = ("fail", "sharded is all zeros but single is not")
        return {p: v for p in ("te", "allclose", "truth", "bitwise")}
    if st["sharded_nonzero"] == 0 and st["single_nonzero"] == 0:
        v = ("warning", f"both sharded and single are all zeros ({numel} elements)")
        return {p: v for p in ("te", "allclose", "truth", "bitwise")}
    out = {}
    if not has_tol:
        out["te"] = out["allclose"] = ("fail", "no reference tolerance for this dtype")
    else:
        fig = (f"at {at} ({g3(st['sharded_value'])} vs {g3(st['single_value'])}): rel. error "
               f"{g3(rel)} rtol {g3(rtol)}, abs. error {g3(st['max_diff'])} atol {g3(atol)}")
        te_fail = rel > rtol and st["max_diff"] > atol
        out["te"] = ("fail" if te_fail else "pass", "max abs diff " + fig)
        over = int(st["over_allclose"])
        out["allclose"] = ("fail" if over else "pass",
                           f"{over} of {numel} elements violate |sharded - single| <= "
                           f"{g3(atol)} + {g3(rtol)}·|single|")
    u, k, n = truth_params
    scale = u * math.sqrt(k)
    mult = 4.0 * math.sqrt(n)
    noise_rms = math.sqrt(st["noise_sq"] / numel)
    truth_rms = math.sqrt(st["sq_truth"] / numel)
    single_rms, sharded_rms = (math.sqrt(st["single_err_sq"] / numel),
                               math.sqrt(st["sharded_err_sq"] / numel))
    lim_max = mult * st["single_err_max"] + scale * (st["truth_max"] + st["noise_max"])
    lim_rms = mult * single_rms + scale * (truth_rms + noise_rms)
    ok = st["sharded_err_max"] <= lim_max and sharded_rms <= lim_rms
    reason = (f"against truth: sharded max error {g3(st['sharded_err_max'])} vs single "
              f"{g3(st['single_err_max'])} (limit {g3(lim_max)}), RMS error "
              f"{g3(sharded_rms)} vs single {g3(single_rms)} (limit {g3(lim_rms)})")
    if ok and st["sq_truth"] > 0:
        # The scale test (policy.cpp, TruthPolicyParams defaults: z 20, min shift 0.1, min
        # variation 0.1, single's own shift under 0.5).
        stt = st["sq_truth"]
        shift = st["sum_truth_diff"] / stt
        resid = st["sum_t2_d2"] - 2 * shift * st["sum_t3_d"] + shift * shift * st["sum_t4"]
        sigma = math.sqrt(max(resid, 0.0)) / stt
        z = abs(shift) / sigma if sigma > 0 else (math.inf if shift != 0 else 0.0)
        beta1 = st["sum_truth_single_err"] / stt
        variation = max(0.0, 1 - st["sum_truth"] ** 2 / (numel * stt))
        floor = max(0.1, mult * abs(beta1))
        if variation >= 0.1 and abs(beta1) < 0.5 and abs(shift) > floor and z > 20:
            ok = False
            reason = f"sharded is single rescaled along the truth: shift {g3(shift)} ({g3(z)} σ); " + reason
    out["truth"] = ("pass" if ok else "fail", reason)
    bits = int(st["bits_differ"])
    out["bitwise"] = ("pass" if bits == 0 else "fail", f"{bits} of {numel} elements differ in bits")
    return out


RANK = {"pass": 0, "warning": 1, "fail": 2}
POLICIES = ("te", "allclose", "truth", "bitwise")


def judge_and_print(case, compared, stats, truth_params, policy):
    """Prints the case's line (tpcheck's console format); returns True when it passes."""
    rows = stats.tolist()  # the case's one device-to-host transfer
    tensors = []
    for (name, kind, index, numel, dtype), row in zip(compared, rows):
        st = dict(zip(STATS, row))
        tensors.append((name, kind, index, st, verdicts(st, numel, dtype, truth_params)))
    case_v = {}
    for p in POLICIES:
        v = ("pass", "every tensor passes")
        for name, _, _, _, tv in tensors:
            if RANK[tv[p][0]] > RANK[v[0]]:
                v = (tv[p][0], f"{name}: {tv[p][1]}")
        case_v[p] = v
    worst = None
    for t in tensors:
        if t[4][policy][0] == "fail":
            worst = t
            break
        if worst is None or t[3]["norm_rel"] > worst[3]["norm_rel"]:
            worst = t
    word = {"pass": "PASS", "warning": "WARN", "fail": "FAIL"}[case_v[policy][0]]
    allv = "".join(f" {p}={case_v[p][0]}" for p in POLICIES)
    w = f"{worst[0]} (max |diff| {g3(worst[3]['max_diff'])}, norm-wise {g3(worst[3]['norm_rel'])})"
    lines = [f"{word} {case.id:<60} |{allv} | worst: {w}"]
    if case_v[policy][0] == "fail":
        lines.append(f"     why: {case_v[policy][1]}")
    for name, kind, index, st, tv in tensors:
        if tv["te"][0] == "fail" and st["sharded_nonzero"] != 0 and case.dtype in TOLERANCE:
            label = str(index) if kind == "gradient" else ("input" if kind == "input_gradient"
                                                           else "outputs")
            rtol, atol = TOLERANCE[case.dtype]
            lines.append(f"     NUMERICAL CHECK FAILED: {label} not close enough at index "
                         f"{int(st['argmax'])} with {st['sharded_value']!r} vs "
                         f"{st['single_value']!r} | rel. error = {st['rel_at_max']!r} (tol = "
                         f"{rtol!r}) | abs. error = {st['max_diff']!r} (tol = {atol!r})  [{name}]")
    print("\n".join(lines), flush=True)
    return case_v[policy][0] != "fail"


def reduction_length(case):
    """K of the truth policy: the longest GEMM reduction of the single and sharded runs
    (wgrad: the token count; fwd / dgrad: the feature sizes; attention: seq and head dim)."""
    tokens = math.prod(case.input_shape[:-1])
    o = case.options
    sizes = [tokens] + [o[k] for k in ("in_features", "out_features", "hidden_size",
                                       "ffn_hidden_size") if k in o]
    return max(sizes)


# ---- the suite ------------------------------------------------------------------------


def generate(case, device, seed):
    """Every full (global) tensor of the case, f64, on the device, from one generator."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, dtype=torch.float64, device=device, generator=gen) * std + mean

    specs = param_specs(case)
    params = {}
    for s in specs:
        if s.fill == "constant":
            params[s.name] = torch.full(s.shape, CONSTANT, dtype=torch.float64, device=device)
        elif s.fill in ("weight", "bias"):
            params[s.name] = normal(s.shape, WEIGHT_STD if s.fill == "weight" else BIAS_STD)
        elif s.fill == "gamma":
            params[s.name] = normal(s.shape, NORM_STD, 1.0)
        else:  # gamma0 (zero-centered), beta
            params[s.name] = normal(s.shape, NORM_STD)
    x = normal(case.input_shape, 1.0)
    out_shape = list(case.input_shape)
    if case.module == "Linear":
        out_shape[-1] = case.options["out_features"]
    target = normal(tuple(out_shape), 1.0)
    return {"specs": specs, "params": params, "input": x, "target": target}


def run_suite_case(case, group, local, device, args):
    full = generate(case, device, args.seed)
    sharded = run_case_on(case, group, full, case.dtype, case.sp)
    if not group.rank0:
        return True
    single = run_case_on(case, local, full, case.dtype, False)
    truth = run_case_on(case, local, full, torch.float64, False)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 1)
    probe = RoundingProbe(PROBE_U, gen)
    with probe:
        probed = run_case_on(case, local, full, torch.float64, False, probe)

    compared, rows = [], []
    index = {s.name: i for i, s in enumerate(full["specs"])}
    for key in single:  # outputs, the input gradient, then the parameters in order
        kind, name = key
        compared.append((name, kind, index[name] if kind == "gradient" else -1,
                         single[key].numel(), single[key].dtype))
        rows.append(tensor_stats(sharded[key], single[key], truth[key], probed[key]))
    u = UNIT_ROUNDOFF[case.dtype]
    if case.dtype == torch.float32 and device.type == "cuda" and args.tf32 == "on":
        u = max(u, 2.0**-11)  # TF32 inputs: 10 mantissa bits
    truth_params = (u, reduction_length(case), group.world)
    return judge_and_print(case, compared, torch.stack(rows), truth_params, args.policy)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=None, help="TP size (emulated; default 2; "
                    "--distributed: the world size)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda when available")
    ap.add_argument("--distributed", action="store_true",
                    help="one rank per process (torchrun), NCCL on cuda, gloo on cpu")
    ap.add_argument("--tf32", choices=["on", "off"], default="on")
    ap.add_argument("--filter", default=None, help="regex over case ids")
    ap.add_argument("--policy", choices=POLICIES, default="truth")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quiet", action="store_true", help="print only failing cases")
    ap.add_argument("--sync-debug", action="store_true",
                    help="cuda: warn at every host-device sync (expected: one per case, the "
                    "statistics' transfer)")
    for s in ("hidden", "ffn", "heads", "seq", "batch"):
        ap.add_argument(f"--{s}", type=int, default=None)
    args = ap.parse_args(argv)

    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"

    if args.distributed:
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device_type == "cuda":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                device_id=device if device_type == "cuda" else None)
        group = DistributedGroup()
        if args.tp is not None and args.tp != group.world:
            print(f"error: --tp {args.tp} but the world size is {group.world}", file=sys.stderr)
            return 2
        tp, how = group.world, f"{'nccl' if device_type == 'cuda' else 'gloo'}, one rank per process"
    else:
        device = torch.device(device_type)
        tp = args.tp or 2
        if tp < 1:
            print(f"error: --tp must be at least 1, got {tp}", file=sys.stderr)
            return 2
        group, how = EmulatedGroup(tp), "emulated in one process"
    local = LocalGroup()

    notes = []
    try:
        z = resolve_sizes(tp, args.hidden, args.ffn, args.heads, args.seq, args.batch, notes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cases = te_cases(tp, z, notes)
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.id)]
    if group.rank0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"pytorch_te_suite: suite te | {len(cases)} cases | device {device.type} ({name}) "
              f"| tp {tp} ({how}) | seed {args.seed} | tf32 {args.tf32} | policy {args.policy} "
              f"| torch {torch.__version__}", flush=True)
        for n in notes:
            print(f"note: {n}", flush=True)
    # The first op under any TorchDispatchMode imports PyTorch's Python dispatcher (~900
    # modules, seconds); done here once so the figure can be read apart. It stays inside
    # the process's wall time, which is what the benchmark measures.
    warm = time.perf_counter()
    with RoundingProbe(PROBE_U, None):
        torch.ones(1, dtype=torch.float64, device=device) * 2
    warm = time.perf_counter() - warm
    if args.sync_debug and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    start = time.perf_counter()
    passed = failed = 0
    for case in cases:
        if args.quiet:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                ok = run_suite_case(case, group, local, device, args)
            if not ok:
                print(buf.getvalue(), end="", flush=True)
        else:
            ok = run_suite_case(case, group, local, device, args)
        if group.rank0:
            passed, failed = passed + ok, failed + (not ok)
    if group.rank0:
        print(f"{passed} passed, {failed} failed ({time.perf_counter() - start:.2f} s in the "
              f"case loop, {warm:.2f} s dispatch-mode warm-up)", flush=True)
    if args.distributed:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""How a TransformerEngine user shards a module at TP N, shared by the GPU scripts that run
TE's modules sharded (te_compare_tp.py, te_fidelity_tp.py). No TE import: the functions
read TE's attributes only."""

import torch

GATED = ("swiglu", "geglu")  # activations whose fc1 holds [a; b]


def tp_kwargs(kind, group, n):
    """The constructor keywords of the sharded twin: kind "column" / "row" (a Linear's
    parallel_mode), "mlp" / "mha" (set_parallel_mode), "norm" (a standalone norm, sharded by
    its tokens alone: sequence_parallel)."""
    if kind == "norm":
        return {"sequence_parallel": True}
    k = {"tp_group": group, "tp_size": n}
    if kind in ("mlp", "mha"):
        k["set_parallel_mode"] = True
    else:
        k["parallel_mode"] = kind
    return k


def sp(k):
    """Sequence parallel on the sharded twin: `k` its TP keywords (empty for the unsharded
    module, which is built without)."""
    return {**k, "sequence_parallel": True} if k else k


def shard_from(single, sharded, rank, n):
    """The sharded parameters sliced from the unsharded ones the way TE lays them out:
    dim-0/1 slices by partition_dim; a gated fc1's rank r holds [a_r; b_r]; parameters of
    the full shape (replicated, or marked partitioned but not split) copied whole."""
    with torch.no_grad():
        for name, p in sharded.named_parameters():
            full = single.get_parameter(name)
            owner = single.get_submodule(name.rpartition(".")[0])
            if not getattr(p, "tensor_model_parallel", False) or p.shape == full.shape:
                p.copy_(full)
            elif name.rpartition(".")[2].startswith("fc1") and getattr(owner, "activation", "") in GATED:
                a, b = full.chunk(2, dim=0)
                p.copy_(torch.cat([a.chunk(n, 0)[rank], b.chunk(n, 0)[rank]], 0))
            else:
                p.copy_(full.chunk(n, dim=p.partition_dim)[rank])

"""tpcheck.torch.compare_tp: judge a rank's tensor-parallel module against its unsharded
twin and the fp64 truth, the way the suite judges tpcheck's own layers.

    from tpcheck.torch.compare import compare_tp
    report = compare_tp(mlp, tp_mlp, (x,), grad_output=dy)   # on every rank
    report.assert_ok()

On every rank: the unsharded module and this rank's sharded module run forward and
backward on the same global inputs; the sharded outputs, input gradients and parameter
gradients are gathered into full tensors (DTensor placements, Megatron's
tensor_model_parallel / partition_dim / partition_stride attributes, or the `shards` map);
tpcheck.torch.truth gives the fp64 truth and its rounding noise; and tpcheck.compare
judges every tensor with the chosen policy. docs/JUDGE.md is the manual.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from ._judge_gather import ShardSpec, gather, is_dtensor, local_chunk, spec_of_parameter
from ._judge_names import flat_named_tensors, input_names
from ._judge_report import TPReport
from .truth import TorchTruth, truth as torch_truth

__all__ = ["compare_tp", "TPReport"]


def _policies() -> list[str]:
    import tpcheck
    return tpcheck.policies()


def _check_one_device(args: tuple, kwargs: dict) -> torch.device:
    """The inputs' one device; an error naming an input on each device if not one."""
    where: dict[str, str] = {}
    for name, t in flat_named_tensors((args, kwargs), input_names(args, kwargs)).items():
        where.setdefault(str(t.device), f"input {name!r}")
    devices = sorted(where)
    if len(devices) > 1:
        raise ValueError("compare_tp: the inputs are on different devices ("
                         + "; ".join(f"{where[d]} on {d}" for d in devices)
                         + "); expected every input on one device")
    return torch.device(devices[0]) if devices else torch.device("cpu")


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: b.detach().clone() for k, b in module.named_buffers()}


def _check_buffers_unchanged(which: str, module: torch.nn.Module, before: dict) -> None:
    for k, b in module.named_buffers():
        old = before.get(k)
        if old is not None and (old.shape != b.shape or not torch.equal(old, b.detach())):
            raise ValueError(
                f"compare_tp: the {which} module's buffer {k!r} changed in forward (BatchNorm-"
                "style running statistics); its runs would not be repeatable and the truth run "
                "would update it again. Put the module in eval() or use "
                "track_running_stats=False")


def _leaf_inputs(args: tuple, kwargs: dict, dims: Mapping[str, Optional[int]], group,
                 names: dict) -> tuple:
    """Fresh leaf copies of the inputs (floating ones requiring grad), chunked by `dims`."""
    by_id = {id(t): n for n, t in names.items()}

    def leaf(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        y = local_chunk(x.detach(), dims.get(by_id.get(id(x), ""), None), group).clone()
        return y.requires_grad_(True) if y.is_floating_point() else y
    return tree_map(leaf, args), tree_map(leaf, kwargs)


def _waited(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a functional collective's AsyncCollectiveTensor (DTensor's
    use_local_output results), whose own data pointer is null."""
    return t.trigger_wait() if hasattr(t, "trigger_wait") else t


def _run(module, args, kwargs, grad_output, out_dims, group, sharded: bool):
    """forward + backward of one module; returns (outputs by name, full for sharded,
    the leaf inputs)."""
    out = module(*args, **kwargs)
    named = flat_named_tensors(out, "output")
    full: dict[str, torch.Tensor] = {}
    pairs = []
    grads = flat_named_tensors(grad_output, "output") if grad_output is not None else {}
    for k, t in named.items():
        if sharded and is_dtensor(t):
            t = t.full_tensor()          # autograd-aware: backward slices the global grad
            g = grads.get(k)
        elif sharded and out_dims.get(k) is not None:
            g = local_chunk(grads[k], out_dims[k], group) if k in grads else None
            full[k] = gather(t, ShardSpec(out_dims[k]), group)
            if g is not None and t.requires_grad:
                pairs.append((t, g.to(t.dtype)))
            continue
        else:
            g = grads.get(k)
        full[k] = _waited(t.detach())
        if g is not None and t.requires_grad:
            if tuple(g.shape) != tuple(t.shape):
                raise ValueError(f"compare_tp: grad_output {k!r} has shape {tuple(g.shape)}, the "
                                 f"{'sharded' if sharded else 'unsharded'} output "
                                 f"{tuple(t.shape)}; pass output_dims for outputs that stay sharded")
            pairs.append((t, g.to(t.dtype)))
    if grad_output is None and len(named) == 1 and next(iter(named.values())).numel() == 1:
        pairs.append((next(iter(named.values())), None))
    if pairs:
        torch.autograd.backward([p[0] for p in pairs],
                                [p[1] for p in pairs] if pairs[0][1] is not None else None)
    return full


def compare_tp(single: torch.nn.Module, sharded: torch.nn.Module, args: Any = (),
               kwargs: Optional[Mapping[str, Any]] = None, *, grad_output: Any = None,
               shards: Optional[Mapping[str, Optional[int]]] = None,
               input_dims: Optional[Mapping[str, Optional[int]]] = None,
               output_dims: Optional[Mapping[str, Optional[int]]] = None,
               policy: str = "truth", group=None, unit_roundoff: Optional[float] = None,
               math: Optional[str] = None, reduction_length: Optional[int] = None,
               tp_size: Optional[int] = None, multiplier: float = 4.0, floor_factor: float = 1.0,
               probe: bool = True, truth: Optional[TorchTruth] = None,
               check_parameters: bool = True) -> TPReport:
    """Judges this rank's `sharded` module against `single` (and the fp64 truth).

    args / kwargs: the global inputs (a tuple, or one tensor); the unsharded module gets
    them whole, the sharded one the same, except the inputs named in `input_dims`
    ({"input": 1} under sequence parallel: this rank's chunk along dim 1).
    grad_output: the global loss gradient of the output (tensor or tuple/dict like the
    output); sharded outputs that are DTensors are gathered with full_tensor(), plain
    outputs named in `output_dims` ({"output": -1}: a column-parallel output kept
    sharded; {"output": 1}: a sequence-parallel one) with an all-gather and get their rank's
    chunk of grad_output. Other outputs are taken as replicated.
    shards: {sharded parameter name: dim or None} for parameters that are neither DTensors
    nor carry Megatron's attributes; names not among the sharded module's parameters are an
    error listing them. Megatron parameters with `sequence_parallel=True` have their
    gradient all-reduced first (as Megatron does before the optimizer step).
    policy: "truth" (default), "te", "allclose", "bitwise"; group: the TP process group
    (default: WORLD). Error model (truth): u from single's dtype and `math` (default "tf32"
    when the device is CUDA, the dtype float32 and torch allows TF32 matmuls), K the longest
    GEMM reduction of the truth run, N the group size; `unit_roundoff`, `reduction_length`,
    `tp_size`, `multiplier`, `floor_factor` override. `truth`: a precomputed
    tpcheck.torch.truth result (else computed here, with the probe unless probe=False).
    check_parameters: the gathered sharded parameters must equal single's bit for bit
    (reported as kind "parameter"; a shard taken from the wrong offset shows here).

    Returns a TPReport (per-tensor entries in the suite's JSON style; .passed, .assert_ok(),
    .to_json()). Bad input raises before anything is judged: an unknown policy, gathered
    shapes that differ from single's, inputs on different devices, buffers changed in
    forward, names in `shards` that match no parameter.
    """
    if policy not in _policies():
        raise ValueError(f"compare_tp: unknown policy {policy!r}; expected one of {_policies()}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    args, kwargs = tuple(args), dict(kwargs or {})
    shards, input_dims, output_dims = dict(shards or {}), dict(input_dims or {}), dict(output_dims or {})
    group = group if group is not None else dist.group.WORLD
    n = tp_size if tp_size is not None else dist.get_world_size(group)
    device = _check_one_device(args, kwargs)

    single_names = dict(single.named_parameters())
    sharded_params = dict(sharded.named_parameters())
    unknown = sorted(set(shards) - set(sharded_params))
    if unknown:
        raise ValueError(f"compare_tp: shards names {unknown} match no parameter of the sharded "
                         f"module; its parameters are {sorted(sharded_params)}")
    extra = sorted(set(sharded_params) - set(single_names))
    if extra:
        raise ValueError(f"compare_tp: the sharded module's parameters {extra} have no "
                         f"namesake in the unsharded module ({sorted(single_names)})")
    specs = {k: spec_of_parameter(k, p, shards) for k, p in sharded_params.items()}
    gathered_params = {k: gather(p, specs[k], group) for k, p in sharded_params.items()}
    for k, g in gathered_params.items():
        if tuple(g.shape) != tuple(single_names[k].shape):
            raise ValueError(f"compare_tp: parameter {k!r} gathered from the shards ({specs[k].source}) "
                             f"has shape {tuple(g.shape)}, the unsharded module's {tuple(single_names[k].shape)}"
                             f"{'; say how it is split: shards={' + repr(k) + ': dim}' if specs[k].dim is None and not specs[k].dtensor else ''}")

    names = flat_named_tensors((args, kwargs), input_names(args, kwargs))
    unknown_in = sorted(set(input_dims) - set(names))
    if unknown_in:
        raise ValueError(f"compare_tp: input_dims names {unknown_in}; the inputs are {sorted(names)}")

    # The two runs, buffers watched.
    single_before, sharded_before = _buffers(single), _buffers(sharded)
    for m in (single, sharded):
        for p in m.parameters():
            p.grad = None
    s_args, s_kwargs = _leaf_inputs(args, kwargs, {}, group, names)
    single_out = _run(single, s_args, s_kwargs, grad_output, {}, group, sharded=False)
    _check_buffers_unchanged("unsharded", single, single_before)
    p_args, p_kwargs = _leaf_inputs(args, kwargs, input_dims, group, names)
    sharded_out = _run(sharded, p_args, p_kwargs, grad_output, output_dims, group, sharded=True)
    _check_buffers_unchanged("sharded", sharded, sharded_before)

    tensors: dict[str, tuple[str, torch.Tensor, torch.Tensor]] = {}
    for k, v in single_out.items():
        if k not in sharded_out:
            raise ValueError(f"compare_tp: the sharded module returned no {k!r}")
        if tuple(sharded_out[k].shape) != tuple(v.shape):
            raise ValueError(f"compare_tp: output {k!r} gathered from the shards has shape "
                             f"{tuple(sharded_out[k].shape)}, the unsharded output {tuple(v.shape)}"
                             "; pass output_dims={" + repr(k) + ": dim} for an output that stays sharded")
        tensors[k] = ("output", v, sharded_out[k])
    s_inputs = flat_named_tensors((s_args, s_kwargs), input_names(args, kwargs))
    p_inputs = flat_named_tensors((p_args, p_kwargs), input_names(args, kwargs))
    for k, t in s_inputs.items():
        if t.grad is None:
            continue
        g = p_inputs[k].grad
        g = torch.zeros_like(p_inputs[k]) if g is None else g
        full = gather(g, ShardSpec(input_dims.get(k)), group)
        tensors[k] = ("input_gradient", t.grad, full)
    for k, p in single_names.items():
        if not p.requires_grad or k not in sharded_params:
            continue
        sp = sharded_params[k]
        g = sp.grad if sp.grad is not None else torch.zeros_like(sp)
        if getattr(sp, "sequence_parallel", False) and not is_dtensor(g):
            g = g.clone()
            dist.all_reduce(g, group=group)
        full = gather(g, specs[k], group)
        tensors[k] = ("parameter_gradient", p.grad if p.grad is not None else torch.zeros_like(p), full)

    if policy == "truth" and truth is None:
        truth = torch_truth(single, *args, grad_output=grad_output, probe=probe, **kwargs)
    math_class = math
    if math_class is None and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        math_class = "tf32"
    k_len = reduction_length if reduction_length is not None else max(1, truth.reduction_length if truth else 1)

    report = TPReport(policy=policy, rank=dist.get_rank(group), tp_size=n,
                      error_model={"multiplier": multiplier, "floor_factor": floor_factor,
                                   "reduction_length": k_len, "tp_size": n, "math": math_class})
    if check_parameters:
        for k, g in gathered_params.items():
            report.add_parameter_check(k, single_names[k].detach(), g, specs[k].source)
    truth_tensors = truth.tensors() if truth is not None else {}
    noise_tensors = truth.noise.tensors() if truth is not None and truth.noise is not None else {}
    for k, (kind, s, p) in tensors.items():
        t = truth_tensors.get(k, (None, None))[1]
        nz = noise_tensors.get(k, (None, None))[1]
        report.judge(k, kind, s, p, t, nz, unit_roundoff=unit_roundoff, math=math_class,
                     reduction_length=k_len, tp_size=n, multiplier=multiplier, floor_factor=floor_factor)
    return report

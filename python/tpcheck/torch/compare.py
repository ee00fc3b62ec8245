"""tpcheck.torch.compare_tp: judge a rank's tensor-parallel module against its unsharded
twin and the fp64 truth, the way the suite judges tpcheck's own layers.

    from tpcheck.torch.compare import compare_tp
    report = compare_tp(mlp, tp_mlp, (x,), grad_output=dy)   # on every rank
    report.assert_ok()

On every rank: this rank's sharded module runs forward and backward on the global inputs
and its outputs, input gradients and parameter gradients are gathered into full tensors
(DTensor placements, Megatron's tensor_model_parallel / partition_dim / partition_stride
attributes, or the `shards` map). Once per group, on the group's rank 0 (the judging
rank): the unsharded module runs on the same inputs, tpcheck.torch.truth gives the fp64
truth and its rounding noise, and tpcheck.compare judges every tensor with the chosen
policy; the verdicts go back to every rank, so every rank's report is the same. The other
ranks never hold the truth. docs/JUDGE.md is the manual.

Errors stay collective: every check a rank makes on its own is followed by an exchange of
"ok or which error" before the next collective, so bad input raises the same error on
every rank instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from ._judge_gather import ShardSpec, gather, is_dtensor, local_chunk, spec_of_parameter
from ._judge_gemm import GemmTrace, choose_math
from ._judge_names import flat_named_tensors, input_names
from ._judge_report import TPReport
from .truth import TorchTruth, truth as torch_truth

__all__ = ["compare_tp", "TPReport"]


class _Clock:
    """Wall seconds of compare_tp's phases, for the report's `seconds` (host time: a phase
    that ends in a collective or a verdict read back includes its GPU work)."""

    def __init__(self):
        self._start = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 4)
        self._last = now

    def done(self) -> dict[str, float]:
        return dict(self.seconds, total=round(self._last - self._start, 4))


def _policies() -> list[str]:
    import tpcheck
    return tpcheck.policies()


class _Group:
    """compare_tp's view of the process group: size, this rank, the judging rank (group
    rank 0) and the collectives it uses. Without torch.distributed initialized: one rank
    and no collectives (compare_tp in a single process)."""

    def __init__(self, group):
        if not (dist.is_available() and dist.is_initialized()):
            if group is not None:
                raise ValueError("compare_tp: group= was given but torch.distributed is not "
                                 "initialized; expected an initialized process group, or no "
                                 "group for a single process")
            self.group, self.size, self.rank, self.root = None, 1, 0, 0
            return
        self.group = group if group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        # broadcast / gather_object name the source by its global rank
        self.root = dist.get_global_rank(self.group, 0)

    @property
    def judging(self) -> bool:
        return self.rank == 0

    def all_objects(self, obj: Any) -> list:
        if self.size == 1:
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def objects_to_root(self, obj: Any) -> Optional[list]:
        """Every rank's `obj` on the judging rank (None elsewhere)."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size if self.judging else None
        dist.gather_object(obj, out, dst=self.root, group=self.group)
        return out

    def object_from_root(self, obj: Any) -> Any:
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.root, group=self.group)
        return box[0]

    def tensor_from_root(self, t: torch.Tensor) -> torch.Tensor:
        """The judging rank's copy of `t` (same shape and dtype on every rank)."""
        t = t.detach().contiguous()
        if self.size == 1 or self.judging:
            if self.size > 1:
                dist.broadcast(t, src=self.root, group=self.group)
            return t
        buf = torch.empty_like(t)
        dist.broadcast(buf, src=self.root, group=self.group)
        return buf


# --- errors that every rank raises --------------------------------------------------------

def _portable(e: Optional[BaseException]) -> Optional[tuple[str, str, str]]:
    """An exception as plain strings (its class may not pickle): (module, class, message)."""
    return None if e is None else (type(e).__module__, type(e).__qualname__, str(e))


def _rebuilt(p: tuple[str, str, str], rank: int, size: int) -> BaseException:
    """Rank `rank`'s exception, raised again on a rank that did not see it: the same class
    (ValueError, TruthRunError, ...) and message, naming the rank where it was found."""
    module, name, message = p
    message = f"{message} (found on rank {rank} of {size})"
    try:
        cls: Any = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(message)
    except Exception:  # a class that cannot be found or built from a message
        pass
    return RuntimeError(f"{name}: {message}")


def _raise_first(g: _Group, own: Optional[BaseException], errors: list) -> None:
    """Raises this rank's own error, else the first rank's that failed (if any did)."""
    if own is not None:
        raise own
    for r, e in enumerate(errors):
        if e is not None:
            raise _rebuilt(e, r, g.size)


def _agree(g: _Group, own: Optional[BaseException]) -> None:
    """Every rank learns whether any rank failed so far; if one did, all raise. Called
    after each step whose checks a rank makes on its own, before the next collective."""
    _raise_first(g, own, g.all_objects(_portable(own)))


# --- checks --------------------------------------------------------------------------------

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


def _describe(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype).replace("torch.", "")]


def _call_signature(single: torch.nn.Module, sharded: torch.nn.Module, names: dict,
                    grad_output: Any, options: dict) -> dict[str, Any]:
    """What must be the same on every rank for the ranks to make the same collectives and
    the judging rank's unsharded run to stand for every rank's."""
    return {
        "inputs": {k: _describe(t) for k, t in names.items()},
        "grad_output": ({k: _describe(t) for k, t in flat_named_tensors(grad_output, "output").items()}
                        if grad_output is not None else None),
        "unsharded parameters": {k: _describe(p) + [p.requires_grad]
                                 for k, p in single.named_parameters()},
        "sharded parameter names": [k for k, _ in sharded.named_parameters()],
        **options,
    }


def _check_same_call(signatures: list[dict]) -> None:
    """ValueError naming the first rank whose call differs from rank 0's, and how."""
    for r, sig in enumerate(signatures[1:], start=1):
        for key, ours in signatures[0].items():
            if sig.get(key) != ours:
                raise ValueError(f"compare_tp: rank {r} was called with {key} {sig.get(key)}, rank 0 "
                                 f"with {ours}; expected the same call on every rank (the same "
                                 "global inputs, modules and options)")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaNs with the same payload are equal; -0.0 is not 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def _first_difference(ref: torch.Tensor, t: torch.Tensor) -> str:
    """How two same-shaped tensors differ bitwise: the count and the first index."""
    def as_bytes(x: torch.Tensor) -> torch.Tensor:
        return x.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, x.element_size())
    ne = (as_bytes(ref) != as_bytes(t)).any(dim=1)
    n = int(ne.sum())
    if not n:
        return "no element differs"
    first = ne.nonzero()[0, 0].cpu()
    where = [int(i) for i in torch.unravel_index(first, t.shape)] if t.dim() else []
    return f"{n} of {t.numel()} elements differ, the first at {where}"


def _is_replica(t: Any, dim: Optional[int]) -> bool:
    """True when this rank's full tensor is its own copy (no collective made it, so ranks'
    copies may differ): a replicated plain tensor, or a DTensor replicated on every mesh
    dim."""
    if is_dtensor(t):
        from torch.distributed.tensor import Replicate
        return all(isinstance(p, Replicate) for p in t.placements)
    return dim is None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor's local tensor (the whole tensor); a plain tensor itself."""
    return t.to_local() if is_dtensor(t) else t


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
    """forward + backward of one module; returns (outputs by name, full for sharded; the
    names of outputs that are this rank's own copy, see _is_replica)."""
    out = module(*args, **kwargs)
    named = flat_named_tensors(out, "output")
    full: dict[str, torch.Tensor] = {}
    replicas: set[str] = set()
    pairs = []
    grads = flat_named_tensors(grad_output, "output") if grad_output is not None else {}
    for k, t in named.items():
        if sharded and is_dtensor(t):
            if _is_replica(t, None):
                replicas.add(k)
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
            replicas.add(k)
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
    return full, replicas


def compare_tp(single: torch.nn.Module, sharded: torch.nn.Module, args: Any = (),
               kwargs: Optional[Mapping[str, Any]] = None, *, grad_output: Any = None,
               shards: Optional[Mapping[str, Optional[int]]] = None,
               input_dims: Optional[Mapping[str, Optional[int]]] = None,
               output_dims: Optional[Mapping[str, Optional[int]]] = None,
               policy: str = "truth", group=None, unit_roundoff: Optional[float] = None,
               math: Optional[str] = None, reduction_length: Optional[int] = None,
               tp_size: Optional[int] = None, multiplier: float = 4.0, floor_factor: float = 1.0,
               probe: bool = True, truth: Optional[TorchTruth] = None,
               check_parameters: bool = True, trace_gemms: Optional[bool] = None) -> TPReport:
    """Judges this rank's `sharded` module against `single` (and the fp64 truth); called
    on every rank of the group with the same arguments.

    args / kwargs: the global inputs (a tuple, or one tensor), the same on every rank; the
    unsharded module gets them whole, the sharded one the same, except the inputs named in
    `input_dims` ({"input": 1} under sequence parallel: this rank's chunk along dim 1).
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
    (default: WORLD; without torch.distributed initialized, one process judges alone).

    Where the work happens: every rank runs its sharded module and gathers; the group's
    rank 0 alone runs `single`, the truth and the judging (its `single`, `truth` and
    inputs are the ones used; the inputs and grad_output must be bitwise the same on every
    rank, else an error), and sends the verdicts to every rank: every rank gets the same
    report (`rank` is the caller's) and `assert_ok()` raises the same reason on each.
    `report.raw` is filled on rank 0 only. A replicated tensor (a row-parallel output, a
    replicated bias gradient) is every rank's own copy: copies that differ bitwise from
    rank 0's are judged too, as entries "<name> (rank r's copy)".

    Error model (truth): u from single's dtype and the GEMM math class: `math` if given,
    else the coarsest class of the GEMMs cuBLASLt ran in the single and sharded runs
    (`trace_gemms`: None traces when the inputs are on CUDA, True always tries, False
    never; a TF32 GEMM on float32 gives u = 2^-11), else "tf32" when the device is CUDA
    and torch allows TF32 matmuls; `error_model` in the report says which classes were
    seen and where `math` came from. K the longest GEMM reduction of the truth run, N the
    group size; `unit_roundoff`, `reduction_length`, `tp_size`, `multiplier`,
    `floor_factor` override. `truth`: a precomputed tpcheck.torch.truth result (used on
    rank 0; else computed there, with the probe unless probe=False).
    check_parameters: the gathered sharded parameters must equal single's bit for bit
    (reported as kind "parameter"; a shard taken from the wrong offset shows here).

    Returns a TPReport (per-tensor entries in the suite's JSON style; .passed, .assert_ok(),
    .to_json()). Bad input raises on every rank (the rank that found it named on the
    others) before anything is judged: an unknown policy, gathered shapes that differ from
    single's, inputs on different devices, buffers changed in forward, names in `shards`
    that match no parameter, ranks called with different inputs or options.
    """
    clock = _Clock()
    g = _Group(group)
    group = g.group
    if isinstance(args, torch.Tensor):
        args = (args,)
    args, kwargs = tuple(args), dict(kwargs or {})
    shards, input_dims, output_dims = dict(shards or {}), dict(input_dims or {}), dict(output_dims or {})
    n = tp_size if tp_size is not None else g.size

    # 1. Checks each rank makes on its own call; then every rank learns of any failure and
    # that all ranks were called alike (same shapes, names and options).
    err, signature = None, None
    try:
        if policy not in _policies():
            raise ValueError(f"compare_tp: unknown policy {policy!r}; expected one of {_policies()}")
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
        names = flat_named_tensors((args, kwargs), input_names(args, kwargs))
        unknown_in = sorted(set(input_dims) - set(names))
        if unknown_in:
            raise ValueError(f"compare_tp: input_dims names {unknown_in}; the inputs are {sorted(names)}")
        signature = _call_signature(single, sharded, names, grad_output, {
            "policy": policy, "shards": shards, "input_dims": input_dims,
            "output_dims": output_dims, "device type": device.type})
    except Exception as e:
        err = e
    exchanged = g.all_objects((_portable(err), signature))
    _raise_first(g, err, [e for e, _ in exchanged])
    _check_same_call([s for _, s in exchanged])
    clock.lap("checks")

    # 2. Collectives over the arguments: the inputs must be rank 0's bit for bit (its
    # unsharded run stands for every rank's); the parameters gathered into full tensors.
    # Every rank makes every collective; a failed check is kept until the exchange.
    err = None
    go_names = flat_named_tensors(grad_output, "output") if grad_output is not None else {}
    for what, tensors in (("input", names), ("grad_output", go_names)):
        for k, t in tensors.items():
            ref = g.tensor_from_root(t)
            if err is None and not _same_bits(ref, t):
                err = ValueError(f"compare_tp: {what} {k!r} on rank {g.rank} differs from rank 0's "
                                 f"({_first_difference(ref, t)}); expected the same global {what} on "
                                 "every rank (seed the generator alike on every rank)")
            del ref
    gathered_params: dict[str, torch.Tensor] = {}
    for k, p in sharded_params.items():
        try:
            full = gather(p, specs[k], group)
        except Exception as e:
            err = err or e
            continue
        if tuple(full.shape) != tuple(single_names[k].shape):
            err = err or ValueError(
                f"compare_tp: parameter {k!r} gathered from the shards ({specs[k].source}) "
                f"has shape {tuple(full.shape)}, the unsharded module's {tuple(single_names[k].shape)}"
                f"{'; say how it is split: shards={' + repr(k) + ': dim}' if specs[k].dim is None and not specs[k].dtensor else ''}")
        if g.judging:  # the others need the gathers only as collectives
            gathered_params[k] = full
    _agree(g, err)
    clock.lap("inputs and parameters")

    # 3. Every rank: the sharded run, traced, and the gathers of its outputs and gradients.
    # An error is kept (not raised) so that this rank still answers step 4's gather.
    want_trace = trace_gemms if trace_gemms is not None else device.type == "cuda"
    sharded_full: dict[str, tuple[str, torch.Tensor]] = {}  # name -> (kind, full tensor)
    copies: dict[str, torch.Tensor] = {}   # replicas that differ from rank 0's (not on 0)
    trace_summary = None
    err = None
    try:
        sharded_before = _buffers(sharded)
        for p in sharded.parameters():
            p.grad = None
        p_args, p_kwargs = _leaf_inputs(args, kwargs, input_dims, group, names)
        with GemmTrace(want_trace, device) as tr:
            outs, replicas = _run(sharded, p_args, p_kwargs, grad_output, output_dims, group,
                                  sharded=True)
        trace_summary = tr.summary()
        _check_buffers_unchanged("sharded", sharded, sharded_before)
        for k, t in outs.items():
            sharded_full[k] = ("output", t)
        p_inputs = flat_named_tensors((p_args, p_kwargs), input_names(args, kwargs))
        for k, t in p_inputs.items():
            if not t.requires_grad:
                continue
            gi = t.grad if t.grad is not None else torch.zeros_like(t)
            sharded_full[k] = ("input_gradient", gather(gi, ShardSpec(input_dims.get(k)), group))
            if input_dims.get(k) is None:
                replicas.add(k)
        for k, p in single_names.items():
            if not p.requires_grad or k not in sharded_params:
                continue
            sp = sharded_params[k]
            gp = sp.grad if sp.grad is not None else torch.zeros_like(sp)
            if getattr(sp, "sequence_parallel", False) and not is_dtensor(gp) and g.size > 1:
                gp = gp.clone()
                dist.all_reduce(gp, group=group)
            if _is_replica(gp, specs[k].dim):
                replicas.add(k)
            sharded_full[k] = ("parameter_gradient", gather(gp, specs[k], group))
        # Replicated tensors are each rank's own copy: the ones that differ from rank 0's
        # go to rank 0 to be judged too (one tensor at a time; usually none differs).
        replica_params = [k for k, p in sharded_params.items() if _is_replica(p, specs[k].dim)]
        for key, t in ([(("t", k), v[1]) for k, v in sharded_full.items() if k in replicas]
                       + [(("p", k), _local(sharded_params[k])) for k in replica_params]):
            ref = g.tensor_from_root(t)
            if not g.judging and not _same_bits(ref, t):
                copies[f"{key[0]}:{key[1]}"] = t.detach().cpu()
            del ref
    except Exception as e:
        err = e
    if not g.judging:
        sharded_full.clear()   # rank 0 has every gathered tensor; free this rank's
    clock.lap("sharded run and gathers")

    # 4. Rank 0 collects every rank's errors, traces and differing copies, judges, and
    # sends the outcome (the report's shared part, or the first error) to every rank.
    payloads = g.objects_to_root({"error": _portable(err), "trace": trace_summary, "copies": copies})
    outcome = None
    report = None
    if g.judging:
        errors = [p["error"] for p in payloads]
        first = next((r for r, e in enumerate(errors) if e is not None), None)
        if first is not None:
            outcome = ("error", first, errors[first])
        else:
            try:
                clock.lap("collecting")
                report = _judge(g, single, args, kwargs, names, grad_output, policy, n, device,
                                want_trace, single_names, specs, gathered_params, sharded_full,
                                payloads, check_parameters, truth, probe, math, unit_roundoff,
                                reduction_length, multiplier, floor_factor, clock)
                report.seconds = clock.done()
                outcome = ("report", report.shared())
            except Exception as e:
                err = e
                outcome = ("error", 0, _portable(e))
    outcome = g.object_from_root(outcome)
    if outcome[0] == "error":
        _raise_first(g, err, [outcome[2] if r == outcome[1] else None for r in range(g.size)])
    return report if report is not None else TPReport.from_shared(outcome[1], g.rank)


def _judge(g: _Group, single, args, kwargs, names, grad_output, policy, n, device, want_trace,
           single_names, specs, gathered_params, sharded_full, payloads, check_parameters,
           truth, probe, math, unit_roundoff, reduction_length, multiplier,
           floor_factor, clock) -> TPReport:
    """Rank 0's part: the unsharded run, the truth, and every verdict."""
    single_before = _buffers(single)
    for p in single.parameters():
        p.grad = None
    s_args, s_kwargs = _leaf_inputs(args, kwargs, {}, g.group, names)
    with GemmTrace(want_trace, device) as tr:
        single_out, _ = _run(single, s_args, s_kwargs, grad_output, {}, g.group, sharded=False)
    _check_buffers_unchanged("unsharded", single, single_before)
    clock.lap("unsharded run")

    tensors: dict[str, tuple[str, torch.Tensor, torch.Tensor]] = {}
    for k, v in single_out.items():
        if k not in sharded_full:
            raise ValueError(f"compare_tp: the sharded module returned no {k!r}")
        got = sharded_full[k][1]
        if tuple(got.shape) != tuple(v.shape):
            raise ValueError(f"compare_tp: output {k!r} gathered from the shards has shape "
                             f"{tuple(got.shape)}, the unsharded output {tuple(v.shape)}"
                             "; pass output_dims={" + repr(k) + ": dim} for an output that stays sharded")
        tensors[k] = ("output", v, got)
    s_inputs = flat_named_tensors((s_args, s_kwargs), input_names(args, kwargs))
    for k, t in s_inputs.items():
        if t.grad is not None and k in sharded_full:
            tensors[k] = ("input_gradient", t.grad, sharded_full[k][1])
    for k, p in single_names.items():
        if k in sharded_full and sharded_full[k][0] == "parameter_gradient":
            tensors[k] = ("parameter_gradient", p.grad if p.grad is not None else torch.zeros_like(p),
                          sharded_full[k][1])

    if policy == "truth" and truth is None:
        truth = torch_truth(single, *args, grad_output=grad_output, probe=probe, **kwargs)
        clock.lap("truth")
    traces = [tr.summary()] + [p["trace"] for p in payloads if p["trace"] is not None]
    traced_calls = sum(t["calls"] for t in traces)
    classes = sorted({c for t in traces for c in t["classes"]})
    math_class, math_source = choose_math(math, unit_roundoff, set(classes) if traced_calls else None,
                                          device)
    k_len = reduction_length if reduction_length is not None else max(1, truth.reduction_length if truth else 1)
    report = TPReport(policy=policy, rank=g.rank, tp_size=n,
                      error_model={"multiplier": multiplier, "floor_factor": floor_factor,
                                   "reduction_length": k_len, "tp_size": n, "math": math_class,
                                   "math_source": math_source,
                                   "gemm_classes": classes if traced_calls else None,
                                   "gemm_calls_traced": traced_calls,
                                   "gemm_trace_note": None if traced_calls else tr.summary()["why_not"]})
    # other ranks' replicas that differ from rank 0's: {name: [(rank, tensor)]}
    copies: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for r, p in enumerate(payloads):
        for key, t in p["copies"].items():
            copies.setdefault(key, []).append((r, t.to(device)))
    if check_parameters:
        for k, full in gathered_params.items():
            report.add_parameter_check(k, single_names[k].detach(), full, specs[k].source)
            for r, t in copies.get(f"p:{k}", []):
                report.add_parameter_check(f"{k} (rank {r}'s copy)", single_names[k].detach(), t,
                                           specs[k].source, extra={"rank": r, "copy_of": k})
    truth_tensors = truth.tensors() if truth is not None else {}
    noise_tensors = truth.noise.tensors() if truth is not None and truth.noise is not None else {}
    model = dict(unit_roundoff=unit_roundoff, math=math_class, reduction_length=k_len, tp_size=n,
                 multiplier=multiplier, floor_factor=floor_factor)
    for k, (kind, s, p) in tensors.items():
        t = truth_tensors.get(k, (None, None))[1]
        nz = noise_tensors.get(k, (None, None))[1]
        report.judge(k, kind, s, p, t, nz, **model)
        for r, c in copies.get(f"t:{k}", []):
            report.judge(f"{k} (rank {r}'s copy)", kind, s, c, t, nz,
                         extra={"rank": r, "copy_of": k}, **model)
    clock.lap("judging")
    return report

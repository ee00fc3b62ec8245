"""compare_tp: judge a rank's tensor-parallel module against its unsharded twin and the
fp64 truth, the way the suite judges tpcheck's own layers.

    report = compare_tp(mlp, tp_mlp, (x,), grad_output=dy)   # on every rank
    report.assert_ok()

On every rank: this rank's sharded module runs forward and backward on the global inputs
and its outputs, input gradients and parameter gradients are gathered into full tensors
(DTensor placements, Megatron's tensor_model_parallel / partition_dim / partition_stride
attributes, or the `shards` map), many tensors to a collective (_group's packed
collectives). Once per group (_work): the unsharded module runs on the same inputs on
rank 0, and the module truth's float64 and probed runs, which give the fp64 truth and its
rounding noise, run beside it on ranks 1 and 2 and go to rank 0. There (the judging rank,
_judging) tpcheck.compare judges every tensor with the chosen policy; the verdicts go back
to every rank, so every rank's report is the same. docs/JUDGE.md is the manual.

The phases, each a function over the call's state (_call.Call): _check_call,
_check_inputs, _gather_parameters (then the plan of the judging work, _work.plan_of),
_sharded_run (_call.forward_backward, _gather_gradients, _collect_differing_replicas),
then _finish with _work.run_parts, _work.share and _judging.judge_on_root. Errors stay
collective (_group.Group.agree).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from .._errors import InputError
from .._names import REPORT_KIND_INPUT_GRADIENT, REPORT_KIND_OUTPUT, REPORT_KIND_PARAMETER_GRADIENT
from ._call import REPLICA_MODES, WHO, Call, Clock, CompareOptions, forward_backward, options_from
from ._checks import (buffers, call_signature, check_buffers_unchanged, check_same_call,
                      first_difference, same_bits)
from ._gather import (ShardSpec, gather_all, is_dtensor, is_replica, local_chunk,
                      local_tensor, spec_of_parameter)
from ._gemm import GemmTrace
from ._group import Group, portable
from ._judging import judge_on_root
from ._naming import named_inputs, named_tensors
from ._replicated_state import quantized_region_open, replicated_state
from ._work import helper_view, plan_of, run_parts, share
from ._report import TPReport
from ._runs import input_gradients, leaf_inputs, one_device
from ._te_reference import te_gather_strides
from ._verdict import policies

__all__ = ["compare_tp", "CompareOptions"]


# --- 1. the call -------------------------------------------------------------------------

def _local_checks(c: Call) -> dict[str, Any]:
    """Checks a rank makes on its own call; returns the call's signature."""
    o = c.opts
    if o.policy not in policies():
        raise InputError(f"{WHO}: unknown policy {o.policy!r}; expected one of {policies()}")
    if o.replicas not in REPLICA_MODES:
        raise InputError(f"{WHO}: replicas={o.replicas!r}; expected one of {list(REPLICA_MODES)}")
    if quantized_region_open():
        raise InputError(f"{WHO}: called inside TransformerEngine's fp8_autocast; call it "
                         "outside: the unsharded twin runs on rank 0 alone, so the amax "
                         "reduction at the region's end would not match across ranks. "
                         "compare_tp judges the modules unquantized, and checks the FP8 state "
                         "(amax histories, scales) that your quantized steps left")
    c.device = one_device(WHO, c.args, c.kwargs)
    c.state = replicated_state(c.sharded)
    c.single_params = dict(c.single.named_parameters())
    c.sharded_params = dict(c.sharded.named_parameters())
    unknown = sorted(set(o.shards) - set(c.sharded_params))
    if unknown:
        raise InputError(f"{WHO}: shards names {unknown} match no parameter of the sharded "
                         f"module; its parameters are {sorted(c.sharded_params)}")
    extra = sorted(set(c.sharded_params) - set(c.single_params))
    if extra:
        raise InputError(f"{WHO}: the sharded module's parameters {extra} have no namesake "
                         f"in the unsharded module ({sorted(c.single_params)}); expected the "
                         "same parameter names in both")
    c.specs = {k: spec_of_parameter(k, p, o.shards) for k, p in c.sharded_params.items()}
    for k, stride in te_gather_strides(c.sharded).items():
        if k in c.specs and c.specs[k].dim is not None:
            c.specs[k] = dataclasses.replace(c.specs[k], stride=stride,
                                             source="TE's attributes and layout")
    c.inputs = named_inputs(c.args, c.kwargs)
    unknown = sorted(set(o.input_dims) - set(c.inputs))
    if unknown:
        raise InputError(f"{WHO}: input_dims names {unknown}; the inputs are {sorted(c.inputs)}")
    return call_signature(c.single, c.sharded, c.inputs, o.grad_output, {
        "policy": o.policy, "shards": o.shards, "input_dims": o.input_dims,
        "output_dims": o.output_dims, "backward": o.backward, "replicas": o.replicas,
        "device type": c.device.type,
        "replicated state": {k: (tuple(t.shape), str(t.dtype)) for k, t in c.state.items()}})


def _check_call(c: Call) -> None:
    """Every rank learns of any rank's failed checks, and that all were called alike."""
    err, signature = None, None
    try:
        signature = _local_checks(c)
    except Exception as e:  # noqa: BLE001 - raised on every rank below
        err = e
    exchanged = c.g.all_objects((portable(err), signature))
    c.g.raise_first(err, [e for e, _ in exchanged])
    check_same_call([s for _, s in exchanged])


# --- 2. inputs and parameters ------------------------------------------------------------

def _spreading(c: Call) -> bool:
    """Whether ranks other than 0 may run parts of the truth (_work): then every rank
    compares its unsharded module with rank 0's. The same answer on every rank."""
    return c.opts.policy == "truth" and c.opts.spread_truth and c.g.size > 1


def _check_inputs(c: Call) -> tuple[Optional[BaseException], bool]:
    """One broadcast of rank 0's inputs, grad_output, replicated quantizer state and (when
    spreading) its unsharded module's parameters and buffers. The inputs and grad_output
    must be rank 0's bit for bit (its unsharded run stands for every rank's); the state is
    kept on rank 0 and, where it differs, sent there later. Returns (the first failure,
    whether this rank's unsharded module is rank 0's bit for bit)."""
    go = named_tensors(c.opts.grad_output, "output") if c.opts.grad_output is not None else {}
    checked = [("input", k, t) for k, t in c.inputs.items()]
    checked += [("grad_output", k, t) for k, t in go.items()]
    state = list(c.state.items())
    single = (list(c.single.named_parameters()) + list(c.single.named_buffers())
              if _spreading(c) else [])
    tensors = [t for _, _, t in checked] + [t for _, t in state] + [t for _, t in single]
    refs = c.g.tensors_from_root(tensors, c.device)
    err = None
    for (what, k, t), ref in zip(checked, refs):
        if err is None and not same_bits(ref, t):
            err = InputError(f"{WHO}: {what} {k!r} on rank {c.g.rank} differs from rank "
                             f"0's ({first_difference(ref, t)}); expected the same global "
                             f"{what} on every rank (seed the generator alike on every rank)")
    refs = refs[len(checked):]
    for (name, t), ref in zip(state, refs):
        if c.g.judging:
            c.state[name] = t.detach().clone()
        elif not same_bits(ref, t):
            c.copies[f"s:{name}"] = t.detach().cpu()
    same_single = all(same_bits(ref, t) for (_, t), ref in zip(single, refs[len(state):]))
    return err, same_single


def _gather_parameters(c: Call, err: Optional[BaseException]) -> Optional[BaseException]:
    """Every sharded parameter gathered into a full tensor (kept on the judging rank) and
    its shape checked against the unsharded one's; the first failure is returned."""
    names = list(c.sharded_params)
    try:
        fulls = gather_all([(c.sharded_params[k], c.specs[k]) for k in names], c.g, c.device)
    except Exception as e:  # noqa: BLE001 - exchanged with the other ranks
        return err or e
    for k, full in zip(names, fulls):
        spec, want = c.specs[k], tuple(c.single_params[k].shape)
        if tuple(full.shape) != want and err is None:
            hint = (f"; say how it is split: shards={{{k!r}: dim}}"
                    if spec.dim is None and not spec.dtensor else "")
            err = InputError(f"{WHO}: parameter {k!r} gathered from the shards ({spec.source}) "
                             f"has shape {tuple(full.shape)}, the unsharded module's {want}{hint}")
        if c.g.judging:  # the others need the gathers only as collectives
            c.gathered_params[k] = full
    return err


# --- 3. the sharded run ------------------------------------------------------------------

def _gather_gradients(c: Call, p_args: tuple, p_kwargs: dict) -> None:
    """The input and parameter gradients of the sharded run, gathered into full tensors."""
    items: dict[str, tuple[str, torch.Tensor, ShardSpec]] = {}
    for k, gi in input_gradients(p_args, p_kwargs).items():
        dim = c.opts.input_dims.get(k)
        items[k] = (REPORT_KIND_INPUT_GRADIENT, gi, ShardSpec(dim))
        if dim is None:
            c.replicas.add(k)
    for k, p in c.single_params.items():
        if not p.requires_grad or k not in c.sharded_params:
            continue
        sp = c.sharded_params[k]
        gp = sp.grad if sp.grad is not None else torch.zeros_like(sp)
        if getattr(sp, "sequence_parallel", False) and not is_dtensor(gp) and c.g.size > 1:
            gp = gp.clone()  # Megatron all-reduces these before the optimizer step
            dist.all_reduce(gp, group=c.g.group)
        if is_replica(gp, c.specs[k].dim):
            c.replicas.add(k)
        items[k] = (REPORT_KIND_PARAMETER_GRADIENT, gp, c.specs[k])
    fulls = gather_all([(t, spec) for _, t, spec in items.values()], c.g, c.device)
    for (k, (kind, _, _)), full in zip(items.items(), fulls):
        c.sharded_full[k] = (kind, full)


def _collect_differing_replicas(c: Call) -> None:
    """Replicated tensors are each rank's own copy: those that differ from rank 0's go to
    rank 0 to be judged too (compared after one broadcast of rank 0's; usually none
    differs)."""
    items = [(f"t:{k}", v[1]) for k, v in c.sharded_full.items() if k in c.replicas]
    items += [(f"p:{k}", local_tensor(p)) for k, p in c.sharded_params.items()
              if is_replica(p, c.specs[k].dim)]
    refs = c.g.tensors_from_root([t for _, t in items], c.device)
    for (key, t), ref in zip(items, refs):
        if not c.g.judging and not same_bits(ref, t):
            c.copies[key] = t.detach().cpu()


def _run_sharded_module(c: Call) -> tuple[tuple, dict]:
    """forward + backward of the sharded module on this rank's inputs (traced)."""
    before = buffers(c.sharded)
    for p in c.sharded.parameters():
        p.grad = None
    dims = c.opts.input_dims
    p_args, p_kwargs = leaf_inputs(
        c.args, c.kwargs, lambda name, t: local_chunk(t, dims.get(name), c.g.group).clone())
    with GemmTrace(c.want_trace, c.device, c.trace_reuse(c.sharded)) as tr:
        outs, replicas, c.backward = forward_backward(c, c.sharded, p_args, p_kwargs, True)
    c.trace_summary = tr.summary()
    check_buffers_unchanged("sharded", c.sharded, before)
    c.sharded_full.update({k: (REPORT_KIND_OUTPUT, t) for k, t in outs.items()})
    c.replicas |= replicas
    return p_args, p_kwargs


def _outputs_alike(c: Call, outputs: list[dict]) -> None:
    """Every rank's outputs must have rank 0's names, shapes and dtypes (their replicas are
    compared in one packed broadcast)."""
    for r, theirs in enumerate(outputs[1:], start=1):
        if theirs != outputs[0]:
            raise InputError(f"{WHO}: the sharded module's outputs on rank {r} are {theirs}, "
                             f"on rank 0 {outputs[0]}; expected the same outputs on every "
                             "rank (gathered to their global shapes)")


def _sharded_run(c: Call) -> Optional[BaseException]:
    """Every rank: the sharded run, then (when every rank's run succeeded) the gathers of
    its outputs and gradients. A gather's error is returned, for the judging rank."""
    err = None
    try:
        p_args, p_kwargs = _run_sharded_module(c)
    except Exception as e:  # noqa: BLE001 - raised on every rank below
        err = e
    outputs = {k: (list(t.shape), str(t.dtype)) for k, (_, t) in c.sharded_full.items()}
    exchanged = c.g.all_objects((portable(err), c.backward, outputs))
    c.g.raise_first(err, [e for e, _, _ in exchanged])
    _outputs_alike(c, [o for _, _, o in exchanged])
    ran = [r for r, (_, backward, _) in enumerate(exchanged) if backward]
    if 0 < len(ran) < c.g.size:
        raise InputError(f"{WHO}: backward ran on ranks {ran} only (a scalar output on some "
                         "ranks); pass grad_output= or backward=False")
    try:
        if c.backward:
            _gather_gradients(c, p_args, p_kwargs)
        _collect_differing_replicas(c)
    except Exception as e:  # noqa: BLE001 - sent to the judging rank
        err = e
    if not c.g.judging:
        c.sharded_full.clear()  # rank 0 has every gathered tensor; free this rank's
    return err


# --- 4. judging and the outcome ----------------------------------------------------------

def _finish(c: Call, err: Optional[BaseException]) -> TPReport:
    """Each rank runs its part of the judging work (_work) and sends it on; rank 0 collects
    every rank's errors, traces and differing copies and judges; the outcome (the report's
    shared part, or the first error) goes to every rank."""
    work = run_parts(c)
    share(c, work)
    payloads = c.g.objects_to_root({"error": portable(err), "trace": c.trace_summary,
                                    "copies": c.copies})
    report, outcome = None, None
    if c.g.judging:
        report, outcome, judge_err = judge_on_root(c, payloads, work)
        err = err or judge_err
    outcome = c.g.object_from_root(outcome)
    if outcome[0] == "error":
        own = err if err is not None else work.own_error
        c.g.raise_first(own, [outcome[2] if r == outcome[1] else None for r in range(c.g.size)])
    return report if report is not None else TPReport.from_shared(outcome[1], c.g.rank)


def compare_tp(single: torch.nn.Module, sharded: torch.nn.Module, args: Any = (),
               kwargs: Optional[Mapping[str, Any]] = None, *,
               options: Optional[CompareOptions] = None, **keywords: Any) -> TPReport:
    """Judges this rank's `sharded` module against `single` (and the fp64 truth); called
    on every rank of the group with the same arguments.

    args / kwargs: the global inputs (a tuple, or one tensor), the same on every rank; the
    unsharded module gets them whole, the sharded one the same, except the inputs named in
    `input_dims` ({"input": 1} under sequence parallel: this rank's chunk along dim 1).
    The options are keywords (or a CompareOptions as `options=`, keywords overriding it):

    grad_output: the global loss gradient of the output (tensor or tuple/dict like the
    output); sharded outputs that are DTensors are gathered with full_tensor(), plain
    outputs named in `output_dims` ({"output": -1}: a column-parallel output kept sharded;
    {"output": 1}: a sequence-parallel one) with an all-gather and get their rank's chunk of
    grad_output. Other outputs are taken as replicated.
    backward: None (default) runs backward when grad_output is given or the output is a
    scalar; False never (forward only: outputs and the parameters' gather are judged, and
    the report says no backward ran); True insists (an error without a gradient to start).
    shards: {sharded parameter name: dim or None} for parameters that are neither DTensors
    nor carry Megatron's attributes; names not among the sharded module's parameters are an
    error listing them. Megatron parameters with `sequence_parallel=True` have their
    gradient all-reduced first (as Megatron does before the optimizer step).
    policy: "truth" (default), "te", "allclose", "bitwise"; rtol / atol: the te and
    allclose tolerances (default: the reference suite's table by single's dtype); group:
    the TP process group (default: WORLD; without torch.distributed initialized, one process
    judges alone).

    Where the work happens: every rank runs its sharded module and gathers; the group's
    rank 0 runs `single` and judges (its `single`, `truth` and inputs are the ones used;
    the inputs and grad_output must be bitwise the same on every rank, else an error),
    while the truth's float64 and probed runs go to ranks 2 and 1 where their `single`
    is rank 0's bit for bit and in the same train/eval modes (spread_truth=False: rank 0
    runs them too; `report.work` says where each ran). The verdicts go to every rank:
    every rank gets the same report (`rank` is the caller's) and `assert_ok()` raises the
    same reason on each. `report.raw` is filled on rank 0 only. A replicated tensor (a row-parallel output, a
    replicated bias gradient) is every rank's own copy: copies that differ bitwise from
    rank 0's are judged too, as entries "<name> (rank r's copy)". replicas: "identical"
    (default) fails such a copy with a verdict of its own ("replica"), whatever the
    policy says of its error: a collective's result, and the same computation on the
    same inputs, are bitwise the same on every rank, and a reduction left out or made over
    part of the group leaves each rank its own (in bf16 often within the policy's bound);
    "judge" gives copies the policy's verdict only, for code whose replicated tensors come
    from kernels that are not deterministic.

    Error model (truth): u from single's dtype and the GEMM math class: `math` if given,
    else the coarsest class of the GEMMs cuBLASLt ran in the single and sharded runs
    (`trace_gemms`: None traces when the inputs are on CUDA, True always tries, False
    never; a TF32 GEMM on float32 gives u = 2^-11), else "tf32" when the device is CUDA
    and torch allows TF32 matmuls; `error_model` in the report says which classes were
    seen and where `math` came from; by default a module's run is traced once per call key
    (the same module, input shapes and dtypes, parameter dtypes and torch's matmul
    switches), later calls reusing its classes (`gemm_trace_reused`); trace_gemms=True
    traces every call. K the longest GEMM reduction of the truth run, N the
    group size; `unit_roundoff`, `reduction_length`, `tp_size`, `multiplier`,
    `floor_factor` override. `truth`: a precomputed module truth (used on rank 0; else
    computed there, with the probe unless probe=False).
    check_parameters: the gathered sharded parameters must equal single's bit for bit
    (reported as kind "parameter"; a shard taken from the wrong offset shows here).

    Returns a TPReport (per-tensor entries in the suite's JSON style; .passed, .failures,
    .assert_ok(), .to_json()). Bad input raises tpcheck.InputError on every rank (the rank
    that found it named on the others) before anything is judged: an unknown policy,
    gathered shapes that differ from single's, inputs on different devices, buffers changed
    in forward, names in `shards` that match no parameter, ranks called with different
    inputs or options.
    """
    opts = options_from(options, keywords)
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    c = Call(single, sharded, args, dict(kwargs or {}), opts, Group(opts.group), Clock())
    _check_call(c)
    c.clock.lap("checks")
    err, same_single = _check_inputs(c)
    views = c.g.agree(_gather_parameters(c, err), helper_view(c, same_single))
    c.plan = plan_of(c, views)
    c.clock.lap("inputs and parameters")
    err = _sharded_run(c)
    c.clock.lap("sharded run and gathers")
    return _finish(c, err)

"""The TorchDispatchMode under which tpcheck.torch.truth runs a module in float64.

One mode does four things for every aten op the module's forward and backward call:

- keeps the run float64: a cast to a narrower floating type in the module's code (a dtype
  argument, an FP8 cast) is lifted to float64 and recorded (_lifting); with strict=True it
  is refused by name instead. An op that still yields a narrower result, or fails on
  float64 operands, has no float64 path: an error naming it, the module that called it and
  the fix (a registered reference, _references) — a "truth" that silently ran part of the
  layer in float32 would judge against a rounded answer;
- refuses random ops (dropout, bernoulli, rand...) by name unless a fixed seed was given;
- records the longest GEMM reduction (mm, addmm, bmm, baddbmm, convolution): the K of the
  truth policy's floor u·sqrt(K)·|truth|;
- with a probe, multiplies every op's floating result by one rounding, 1 + u·s·r
  (_probe), as the suite's rounding probe does for its own layers' stores; s scales the
  rounding to the op's nominal dtype, the one it has in the real run (_nominal: 2⁻¹⁶ for
  an f32 op of a bf16 model, 1 for an op in the model's own dtype).

Which results the probe perturbs: those of ops that compute. Views and data movement
(reshape, transpose, cat, copies, indexing) store nothing new — perturbing them would count
one value's rounding twice — and an output that shares storage with an input of a
non-mutating op is a view too. A GEMM's internal accumulation is not perturbed, only its
stored result: the same as the suite's probe (docs/POLICIES.md).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .._errors import RunError
from ._lifting import Lifts, ModuleStack, code_location, lift_arguments
from ._nominal import Nominal, coarsest
from ._probe import probe_factors

# Ops whose results are copies or rearrangements of their inputs' values (no rounding).
_DATA_MOVEMENT = {
    "clone", "copy", "copy_", "_to_copy", "to", "contiguous", "cat", "stack", "index",
    "index_select", "gather", "scatter", "select_scatter", "slice_scatter",
    "diagonal_scatter", "as_strided_scatter", "index_put", "index_put_", "masked_fill",
    "masked_fill_", "where", "repeat", "flip", "roll", "constant_pad_nd", "_unsafe_view",
    "detach", "lift_fresh", "lift_fresh_copy", "zeros_like", "ones_like", "empty_like",
    "full_like", "new_zeros", "new_ones", "new_empty", "new_empty_strided", "new_full",
    "zero_", "fill_", "fill", "empty", "empty_strided", "zeros", "ones", "full", "embedding",
    "_reshape_alias", "view_copy", "permute_copy", "t_copy", "transpose_copy", "expand_copy",
    "split_with_sizes_copy", "unbind_copy", "split_copy", "slice_copy", "select_copy",
    "alias_copy", "squeeze_copy", "unsqueeze_copy", "_unsafe_index", "narrow_copy",
    "scalar_tensor", "arange", "_local_scalar_dense", "sort", "topk", "max", "min", "amax",
    "amin", "relu", "threshold_backward", "abs", "neg", "sign", "maximum", "minimum",
    "clamp", "clamp_min", "clamp_max", "_unsafe_index_put", "native_dropout_backward",
}

# GEMM-like ops and how to read their reduction length K from the inputs.
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "convolution",
          "convolution_backward", "_scaled_dot_product_flash_attention_for_cpu",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_cudnn_attention"}


class TruthRunError(RunError):
    """The module cannot be run as an fp64 truth: the message names the op, the module
    that called it and what to do."""


def _op_name(func: Any) -> str:
    """aten.mm.default → 'mm' (the name the op sets above use)."""
    return str(getattr(func, "overloadpacket", func)).split(".")[-1]


def _qualified(func: Any) -> str:
    """aten.mm.default → 'aten.mm' (the name errors show: custom ops keep their namespace)."""
    return str(getattr(func, "overloadpacket", func))


def _gemm_reduction_length(name: str, args: tuple) -> int:
    """K of one GEMM call from its operands' shapes (0 when it cannot be read)."""
    def shape(i: int) -> Optional[tuple]:
        a = args[i] if i < len(args) else None
        return tuple(a.shape) if isinstance(a, torch.Tensor) else None
    if name in ("mm", "bmm", "matmul"):
        s = shape(0)
        return s[-1] if s else 0
    if name in ("addmm", "baddbmm", "addbmm"):
        s = shape(1)
        return s[-1] if s else 0
    if name == "convolution":  # input, weight, ...: Cin/groups · prod(kernel)
        w = shape(1)
        return int(torch.Size(w[1:]).numel()) if w else 0
    if name == "convolution_backward":  # grad_out, input, weight: the weight gradient
        g, w = shape(0), shape(2)       # sums over batch·spatial positions
        k_w = int(g[0] * torch.Size(g[2:]).numel()) if g else 0
        k_x = int(w[0] * torch.Size(w[2:]).numel()) if w else 0
        return max(k_w, k_x)
    if name.startswith("_scaled_dot_product"):  # q, k, v: head dim and key length
        q, k = shape(0), shape(1)
        return max(q[-1] if q else 0, k[-2] if k else 0)
    return 0


FIX = ("it needs a float64 reference: tpcheck.judge.register_reference(target, fn) with "
        "the op, autograd.Function or module type as target (docs/JUDGE.md, \"Kernels "
        "without float64\"), or judge with policy='te'")


def _draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether an op draws random numbers: tagged nondeterministic_seeded, unless its
    dropout probability is 0 (attention kernels take one and draw nothing then; a dropout
    with p = 0 or train=False leaves its input as it is)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    schema = func._schema.arguments
    given = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
             for i, a in enumerate(schema)}
    if "dropout_p" in given:
        return given["dropout_p"] != 0
    if _op_name(func) == "native_dropout":
        return given.get("p") != 0 and given.get("train") is not False
    return True


class F64TruthMode(TorchDispatchMode):
    """Runs ops as they are, keeping the run float64; records K; optionally probes.

    probe_u: None for the plain truth run, else the probe's relative size (2^-30).
    rng_seed: None refuses random ops; an int allows them (the caller seeds the generator).
    strict: refuse every narrower floating result (a cast, FP8) instead of lifting it to
    float64 (_lifting). modules: names the running module in lifts and errors.
    nominal: the probed run's nominal dtypes (_nominal; its leaves tagged by the caller);
    None probes every op as one rounding of the run's dtype.
    """

    def __init__(self, *, probe_u: Optional[float] = None, probe_seed: int = 1234,
                 rng_seed: Optional[int] = None, strict: bool = True,
                 modules: Optional[ModuleStack] = None, nominal: Optional[Nominal] = None):
        super().__init__()
        self.probe_u = probe_u
        self.nominal = nominal if probe_u is not None else None
        self.probed: dict[str, int] = {}  # nominal dtype → op results the probe perturbed
        self.probe_seed = int(probe_seed)
        self.rng_seed = rng_seed
        self.strict = strict
        self.modules = modules
        self.lifts = Lifts(modules)
        self.counter = 0            # probe stream positions used so far
        self.reduction_length = 0   # the longest GEMM reduction seen
        self.gemm_calls = 0

    def _where(self) -> str:
        module = self.modules.current() if self.modules is not None else ""
        return f"in module {module} ({code_location()})" if module else f"({code_location()})"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        if self.rng_seed is None and _draws_random(func, args, kwargs):
            raise TruthRunError(
                f"tpcheck.torch.truth: the module calls the random op {_qualified(func)} (dropout, "
                "bernoulli, rand...) " + self._where() + "; its truth would draw different "
                "numbers than the runs it judges. Put the module in eval() / set the "
                "probability to 0, or pass rng_seed=<int> to draw from a fixed seed")
        asked: list = []
        if not self.strict and not func.is_view:
            args, kwargs, asked = lift_arguments(func, _qualified(func), args, kwargs,
                                                 self.lifts, self.nominal)
        nominal = self.nominal.result(func, args, kwargs, coarsest(asked)) \
            if self.nominal is not None else None
        if name in _GEMMS:
            self.gemm_calls += 1
            self.reduction_length = max(self.reduction_length, _gemm_reduction_length(name, args))
        out = self._run(func, args, kwargs)
        flat_out, _ = tree_flatten(out)
        if any(isinstance(a, torch.Tensor) for a in tree_flatten((args, kwargs))[0]):
            self._check_float64(func, flat_out)  # factories (ones, zeros) are exact
        if nominal is not None:
            for t in flat_out:
                self.nominal.tag(t, nominal)
        if self.probe_u is not None and name not in _DATA_MOVEMENT and not func.is_view:
            self._perturb(func, args, kwargs, flat_out, nominal)
        return out

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError, TypeError) as e:
            dtypes = sorted({str(a.dtype).replace("torch.", "") for a in tree_flatten((args, kwargs))[0]
                             if isinstance(a, torch.Tensor)})
            raise TruthRunError(f"tpcheck.torch.truth: {_qualified(func)} failed in the float64 run "
                                f"(operand dtypes {dtypes}) {self._where()}: {e}; {FIX}") from e

    def _check_float64(self, func: Any, flat_out: list) -> None:
        """Every floating result is float64; else the op is named (what it produced, where,
        and what to do)."""
        for t in flat_out:
            if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()) \
                    or t.dtype == torch.float64:
                continue
            kind = "an FP8 cast" if "float8" in str(t.dtype) else f"a {t.dtype} result"
            if self.strict:
                raise TruthRunError(
                    f"tpcheck.torch.truth: {_qualified(func)} produced {kind} ({t.dtype}, shape "
                    f"{tuple(t.shape)}) in the float64 run {self._where()}; strict=True refuses "
                    "every cast below float64 (strict=False keeps float64 through them, "
                    "docs/JUDGE.md)")
            raise TruthRunError(
                f"tpcheck.torch.truth: {_qualified(func)} produced {kind} ({t.dtype}, shape "
                f"{tuple(t.shape)}) from float64 operands {self._where()}: the op has no float64 "
                f"path; {FIX}")

    def _perturb(self, func: Any, args: tuple, kwargs: dict, flat_out: list,
                 nominal: Optional[torch.dtype]) -> None:
        mutable = func._schema.is_mutable
        input_storages = set()
        if not mutable:
            for a in tree_flatten((args, kwargs))[0]:
                if isinstance(a, torch.Tensor):
                    input_storages.add(a.untyped_storage().data_ptr())
        scale = self.nominal.scale(nominal) if nominal is not None else 1.0
        for t in flat_out:
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float64 or t.numel() == 0:
                continue
            if not mutable and t.untyped_storage().data_ptr() in input_storages:
                continue  # an alias of an input: nothing new was stored
            factors = probe_factors(self.probe_u, self.probe_seed, self.counter + 1, t.numel(),
                                    t.device).reshape(t.shape)
            if scale != 1.0:  # 1 + s·(factor − 1): s a power of two, exact but the last add
                factors = (factors - 1.0).mul_(scale).add_(1.0)
            self.counter += t.numel()
            key = str(nominal).replace("torch.", "") if nominal is not None else "uniform"
            self.probed[key] = self.probed.get(key, 0) + 1
            with torch.no_grad():
                t.mul_(factors)

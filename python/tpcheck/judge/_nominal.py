"""Nominal dtypes: the dtype each float64 tensor of a truth run has in the real run, so that
the rounding probe perturbs each op by the rounding that op really makes.

In the truth run every floating tensor is float64; the real (single) run computes most ops
in the module's dtype (bf16, say) but some in float32 on purpose: RMSNorm's
`.to(torch.float32)` region, a softmax with `dtype=torch.float32`, RoPE's `inv_freq.float()`.
The probe multiplies each op's result by 1 + u_p·s·r, s = min(1, u(nominal) / u(run dtype)):
an f32 op of a bf16 model counts as 2⁻¹⁶ of a bf16 rounding instead of a whole one, and
`noise` stays in units of the run dtype's u (the u the truth policy multiplies it by).

The rule (`Nominal.result`), applied to every op of the probed run:

- leaves: parameters, buffers, floating inputs and grad_output keep their original dtype
  when converted to float64; a narrower tensor input widened by a lift keeps its own;
- an op whose dtype argument was lifted (a cast `.float()`, `.to(torch.bfloat16)`, softmax
  or sum with `dtype=`, a factory's dtype) gives that dtype;
- an op that writes one of its arguments (in-place, out=) keeps that argument's dtype;
- any other op gives the *coarsest* (largest u) nominal dtype of its floating tensor
  inputs, counting 0-dim tensors only when no input has dimensions (torch's rule);
- a factory without a dtype argument gives the real run's default dtype; a tensor the run
  knows nothing of counts as the run dtype.

Why the coarsest input, not torch's type promotion (the widest): the module's code reads
dtypes off its tensors, and in the truth run they are all float64, so the casts that *end*
an f32 region are invisible (`hidden_states.to(input_dtype)`, `softmax(...).to(q.dtype)`,
`cos.to(x.dtype)` are no-ops on float64). Under promotion an f32 region would spread to
every later op (the next `weight * x` would be f32) and the floor would lose the model's
real bf16 roundings. The coarsest input is bf16 there, as in the real run.

What it cannot see, each erring towards a larger floor (the run dtype's u, as the uniform
probe had) unless noted:
- ops the real code runs wider than the coarsest input: a real `f32 + bf16` mix that torch
  promotes to f32, and the backward of an f32 region (its incoming gradient is nominally
  the run dtype, the autograd cast into f32 being invisible too): counted coarse;
- branches on a tensor's dtype (`if x.dtype == torch.bfloat16: x = x.float()`) take the
  float64 branch in the truth run, so a cast they would make is never seen: coarse;
- kernels that accumulate wider than their output (a bf16 GEMM or norm accumulating in
  f32) round once at their output's dtype, as the probe models; statistics outputs
  (layer norm's mean and rstd, f32 in the real run) count at their input's dtype;
- autocast: it leaves float64 tensors alone, so ops it would run in bf16 stay nominally
  at their inputs' dtype (f32 for an f32 model): the run dtype, as a uniform probe has it;
- the rounding of an invisible cast itself (f32 → bf16 at a region's end) is not
  perturbed; the op after it is, at bf16 (this one errs towards a smaller floor).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Nominal", "unit_roundoff", "coarsest"]


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon: 2⁻²⁴ float32, 2⁻⁸ bfloat16, 2⁻¹¹ float16, 2⁻⁵³ float64."""
    return torch.finfo(dtype).eps / 2


def coarsest(dtypes: Any) -> Optional[torch.dtype]:
    """The dtype of largest unit roundoff among `dtypes` (None when there is none)."""
    found = [d for d in dtypes if d is not None]
    return max(found, key=unit_roundoff) if found else None


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


class Nominal:
    """The nominal dtype of the tensors of one probed truth run, kept per storage (views
    share their base's), and the probe's scale for an op's result."""

    def __init__(self, real_default: torch.dtype):
        self.real_default = real_default           # torch's default dtype outside the run
        self.run_dtype: Optional[torch.dtype] = None  # the coarsest leaf: the noise's unit
        self._by_storage: dict[tuple, torch.dtype] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> Optional[tuple]:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        return (t.device.type, t.device.index, ptr) if ptr else None

    def tag(self, t: Any, dtype: torch.dtype) -> Any:
        """Record `dtype` as t's nominal dtype (floating tensors only); returns t."""
        if _floating(t):
            key = self._key(t)
            if key is not None:
                self._by_storage[key] = dtype
        return t

    def leaf(self, t: Any, dtype: torch.dtype) -> Any:
        """A parameter, buffer or input made float64 from `dtype`: tagged, and counted in
        the run dtype."""
        if _floating(t):
            self.tag(t, dtype)
            self.run_dtype = coarsest([self.run_dtype, dtype])
        return t

    def of(self, t: torch.Tensor) -> torch.dtype:
        """t's nominal dtype; the run dtype for a tensor the run has not seen."""
        key = self._key(t)
        found = self._by_storage.get(key) if key is not None else None
        return found if found is not None else (self.run_dtype or torch.float64)

    def result(self, func: Any, args: tuple, kwargs: dict,
               asked: Optional[torch.dtype]) -> torch.dtype:
        """The nominal dtype of an op's floating results (module docstring); `asked` is the
        narrower dtype argument the lift replaced, if any."""
        schema = func._schema.arguments
        for i, a in enumerate(schema):
            if a.alias_info is not None and a.alias_info.is_write:
                written = args[i] if i < len(args) else kwargs.get(a.name)
                if _floating(written):
                    return self.of(written)
        if asked is not None:
            return asked
        inputs = [x for x in tree_flatten((args, kwargs))[0] if _floating(x)]
        if not inputs:
            return self.real_default if kwargs.get("dtype") is None else \
                (self.run_dtype or torch.float64)
        shaped = [x for x in inputs if x.dim() > 0]
        return coarsest(self.of(x) for x in (shaped or inputs))

    def scale(self, dtype: torch.dtype) -> float:
        """The probe's factor for a result of nominal `dtype`: u(dtype) / u(run dtype),
        at most 1 (a step coarser than the run dtype, an FP8 cast in a bf16 model, counts
        as one rounding of the run dtype, as the uniform probe counted every op)."""
        run = self.run_dtype or torch.float64
        return min(1.0, unit_roundoff(dtype) / unit_roundoff(run))

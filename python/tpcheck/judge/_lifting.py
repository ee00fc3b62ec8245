"""What the module truth lifts to float64, and where in the module it happened.

The truth is the exact value of the math the module means. A module that casts to a lower
precision on purpose (RoPE's `inv_freq.float()`, an RMSNorm computing in
`hidden_states.to(torch.float32)`, a softmax with `dtype=torch.float32`, an FP8 cast)
would make a float64 run compute part of the layer rounded; in the truth run those casts
keep float64 instead:

- every dtype argument of an op that names a floating type narrower than float64
  (`_to_copy`'s dtype: `.float()`, `.to(dtype)`, `.half()`; the `dtype=` of sum, mean,
  softmax and log_softmax (whose decomposition casts first), factories' dtype, matmul-like
  ops' output dtype) becomes float64;
- a floating tensor input narrower than float64 that the op does not write (a constant
  from outside the parameters and buffers, a tensor attribute) is widened exactly;
- tensors made with torch's default dtype (`torch.tensor([0.5])`, `torch.zeros(n)`) are
  float64 (the run sets the default dtype).

Autocast does not touch float64 tensors, so its regions run in float64 unchanged. Each
lift is recorded once per (op, dtype, kind, place): `Lifts.records()`. The single and
sharded runs are not touched: their real roundings are what the truth policy judges.

`ModuleStack` names the module running at any moment (its qualified name in the truth's
module), for the lift records and for errors.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import torch
import torch.nn.modules.module as nn_module

__all__ = ["Lifts", "ModuleStack", "lift_arguments", "is_narrow_float", "code_location"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TPCHECK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_narrow_float(dtype: Any) -> bool:
    """A real floating dtype narrower than float64 (float32, bfloat16, float16, FP8...)."""
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype != torch.float64


def code_location() -> str:
    """The innermost frame outside torch and tpcheck: 'file.py:123 in forward' (the
    module's code, as far as the Python stack shows it); "(no Python frame: autograd's
    backward)" when there is none."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_TORCH_DIR) or path.startswith(_TPCHECK_DIR)):
            return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "(no Python frame: autograd's backward)"


class ModuleStack:
    """The qualified names of the modules running now, innermost last, kept by global
    forward hooks while `with stack:` is open. An exception leaves the stack as it was
    when raised (post-hooks do not run then), so the innermost entry names the module
    that failed."""

    def __init__(self, root: torch.nn.Module):
        self._names = {id(m): (n or f"<{type(root).__name__}>") for n, m in root.named_modules()}
        self.stack: list[str] = []
        self._handles: list = []

    def name(self, module: torch.nn.Module) -> str:
        return self._names.get(id(module), f"<{type(module).__name__}>")

    def current(self) -> str:
        return self.stack[-1] if self.stack else "(outside any module)"

    def _push(self, module: torch.nn.Module, _args: Any) -> None:
        self.stack.append(self.name(module))

    def _pop(self, _module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if self.stack:
            self.stack.pop()

    def __enter__(self) -> "ModuleStack":
        self.stack.clear()
        self._handles = [nn_module.register_module_forward_pre_hook(self._push),
                         nn_module.register_module_forward_hook(self._pop)]
        return self

    def __exit__(self, *exc: Any) -> bool:
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


class Lifts:
    """The lifts of one truth run: {(op, dtype, kind, where): record with its count}."""

    def __init__(self, modules: Optional[ModuleStack] = None):
        self.modules = modules
        self._records: dict[tuple, dict[str, Any]] = {}

    def add(self, op: str, dtype: torch.dtype, kind: str) -> None:
        module = self.modules.current() if self.modules is not None else ""
        key = (op, str(dtype), kind, module, code_location())
        rec = self._records.get(key)
        if rec is None:
            self._records[key] = {"op": op, "dtype": str(dtype).replace("torch.", ""),
                                  "kind": kind, "module": module, "where": key[4], "count": 1}
        else:
            rec["count"] += 1

    def records(self) -> list[dict[str, Any]]:
        """One dict per distinct lift: op, dtype (the narrower one asked for), kind ("cast":
        a dtype argument; "input": a narrower tensor input widened), module, where, count."""
        return [dict(r) for r in self._records.values()]


def _widened(value: Any, op: str, written: bool, lifts: Lifts, asked: list,
             nominal: Any) -> Any:
    """A dtype argument or tensor input, lifted to float64 when narrower (module docstring);
    a lifted dtype argument is appended to `asked`, a widened input keeps its dtype as its
    nominal one (_nominal)."""
    if is_narrow_float(value):
        lifts.add(op, value, "cast")
        asked.append(value)
        return torch.float64
    if isinstance(value, torch.Tensor) and not written and is_narrow_float(value.dtype):
        lifts.add(op, value.dtype, "input")
        wide = value.to(torch.float64)
        return nominal.tag(wide, value.dtype) if nominal is not None else wide
    if isinstance(value, (list, tuple)) and value and \
            all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_widened(v, op, written, lifts, asked, nominal) for v in value)
    return value


def lift_arguments(func: Any, op: str, args: tuple, kwargs: dict, lifts: Lifts,
                   nominal: Any = None) -> tuple[tuple, dict, list]:
    """The op's arguments with narrower dtypes and (unwritten) tensor inputs in float64,
    and the narrower dtype arguments it lifted (the op's nominal dtype, _nominal)."""
    schema = func._schema.arguments

    def written(i: int) -> bool:  # the schema marks the arguments an op writes
        return i < len(schema) and schema[i].alias_info is not None and \
            schema[i].alias_info.is_write
    by_name = {a.name: i for i, a in enumerate(schema)}
    asked: list = []
    new_args = tuple(_widened(a, op, written(i), lifts, asked, nominal)
                     for i, a in enumerate(args))
    new_kwargs = {k: _widened(v, op, written(by_name.get(k, len(schema))), lifts, asked, nominal)
                  for k, v in kwargs.items()}
    return new_args, new_kwargs, asked

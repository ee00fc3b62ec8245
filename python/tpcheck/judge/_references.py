"""Float64 references for kernels that have no float64 path (fused norms, flash attention,
Triton or Liger kernels, TransformerEngine's modules): `register_reference(target, fn)`.

The target is one of
- a torch.library custom op (`torch.ops.ns.name`, one of its overloads, the object
  `torch.library.custom_op` returns, or "ns::name"): `fn(*args, **kwargs)` is called in
  place of the op, with its arguments;
- an `autograd.Function` subclass: `fn(*args, **kwargs)` in place of `Cls.apply(...)`;
- an `nn.Module` subclass: `fn(module, *args, **kwargs)` in place of `module(...)`'s
  forward, for every module of that type (or a subclass of it) in the truth's module.

`fn` computes in float64 with differentiable torch ops, so autograd derives its backward.
The references stand in only inside the truth's runs (`References`); the single and sharded
runs call the kernels. Shipped: apex's FusedLayerNorm / FusedRMSNorm (and their Mixed
variants) and flash-attn's FlashAttnFunc (what `flash_attn_func` applies), used when the
module's code has imported those packages; a reference registered for the same target
wins.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from .._errors import InputError
from ._reference_kernels import shipped_references

__all__ = ["register_reference", "unregister_reference", "References"]

_OP, _FUNCTION, _MODULE = "op", "autograd.Function", "module"

# (kind, key) → fn; key: "ns::name" for ops, the class for functions and modules
_REGISTRY: dict[tuple[str, Any], Callable] = {}
_MISSING = object()


def _op_key(target: Any) -> Optional[str]:
    """"ns::name" of a custom op given as a packet, an overload, a custom_op object or a
    string; None for anything else."""
    if isinstance(target, str):
        return target if "::" in target else None
    for attr in ("_qualified_op_name", "_qualname"):
        name = getattr(target, attr, None)
        if isinstance(name, str):
            return name
    schema = getattr(target, "_schema", None)
    return getattr(schema, "name", None) if isinstance(target, torch._ops.OpOverload) else None


def _key(target: Any) -> tuple[str, Any]:
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return _FUNCTION, target
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        return _MODULE, target
    name = _op_key(target)
    if name is None:
        raise InputError(f"register_reference: target {target!r}; expected a torch.library "
                         "custom op (torch.ops.ns.name, its overload, or 'ns::name'), an "
                         "autograd.Function subclass or an nn.Module subclass")
    return _OP, name


def register_reference(target: Any, fn: Callable) -> None:
    """Registers `fn` as the float64 reference of `target` for every later truth run (the
    module docstring says what target and fn are). Registering a target again replaces
    its reference."""
    if not callable(fn):
        raise InputError(f"register_reference: fn is a {type(fn).__name__}; expected a "
                         "callable computing the target in float64")
    _REGISTRY[_key(target)] = fn


def unregister_reference(target: Any) -> None:
    """Removes the reference registered for `target` (no error when there is none)."""
    _REGISTRY.pop(_key(target), None)


def _table() -> dict[tuple[str, Any], Callable]:
    """The shipped references of the packages imported now, then the registered ones."""
    table = {_key(t): fn for t, fn in shipped_references(sys.modules)}
    table.update(_REGISTRY)
    return table


def _describe(kind: str, key: Any) -> str:
    return key if kind == _OP else f"{key.__module__}.{key.__qualname__}"


class _OpReferences(TorchFunctionMode):
    """Above autograd: a call of a custom op with a reference calls the reference."""

    def __init__(self, ops: dict[str, Callable], count: Callable[[str, str], None]):
        super().__init__()
        self.ops = ops
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_key(func) if isinstance(func, (torch._ops.OpOverload,
                                                  torch._ops.OpOverloadPacket)) else None
        fn = self.ops.get(name) if name is not None else None
        if fn is None:
            return func(*args, **kwargs)
        self.count(_OP, name)
        return fn(*args, **kwargs)


class References:
    """`with References(root):` the references stand in for their targets in `root`'s run;
    everything patched is put back on exit. `used()`: which stood in, how often."""

    def __init__(self, root: torch.nn.Module):
        self.root = root
        self._calls: dict[tuple[str, str], int] = {}
        self._undo: list[Callable[[], None]] = []

    def _count(self, kind: str, name: str) -> None:
        self._calls[(kind, name)] = self._calls.get((kind, name), 0) + 1

    def used(self) -> list[dict[str, Any]]:
        return [{"target": n, "kind": k, "calls": c} for (k, n), c in self._calls.items()]

    def __enter__(self) -> "References":
        table = _table()
        self._undo = []
        self._patch_modules({k: f for (kind, k), f in table.items() if kind == _MODULE})
        for (kind, cls), fn in table.items():
            if kind == _FUNCTION:
                self._patch_function(cls, fn)
        ops = {k: f for (kind, k), f in table.items() if kind == _OP}
        if ops:
            mode = _OpReferences(ops, self._count)
            mode.__enter__()
            self._undo.append(lambda: mode.__exit__(None, None, None))
        return self

    def __exit__(self, *exc: Any) -> bool:
        while self._undo:
            self._undo.pop()()
        return False

    def _patch_modules(self, types: dict[type, Callable]) -> None:
        if not types:
            return
        for _, m in self.root.named_modules():
            cls = next((c for c in type(m).__mro__ if c in types), None)
            if cls is not None:
                self._patch_module(m, types[cls], _describe(_MODULE, cls))

    def _patch_module(self, m: torch.nn.Module, fn: Callable, name: str) -> None:
        before = m.__dict__.get("forward", _MISSING)

        def forward(*args: Any, **kwargs: Any) -> Any:
            self._count(_MODULE, name)
            return fn(m, *args, **kwargs)
        object.__setattr__(m, "forward", forward)
        self._undo.append(lambda: (object.__delattr__(m, "forward") if before is _MISSING
                                   else object.__setattr__(m, "forward", before)))

    def _patch_function(self, cls: type, fn: Callable) -> None:
        before = cls.__dict__.get("apply", _MISSING)
        name = _describe(_FUNCTION, cls)

        def apply(*args: Any, **kwargs: Any) -> Any:
            self._count(_FUNCTION, name)
            return fn(*args, **kwargs)
        cls.apply = staticmethod(apply)
        self._undo.append(lambda: (delattr(cls, "apply") if before is _MISSING
                                   else setattr(cls, "apply", before)))

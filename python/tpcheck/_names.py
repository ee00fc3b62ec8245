"""Names the C++ program and this package both write or read, taken from the compiled
module so that each has one definition (include/tpcheck/names.h, src/core/dtype.cpp,
src/comm/comm.cpp).

    REPORT_KIND_OUTPUT, REPORT_KIND_PARAMETER_GRADIENT, REPORT_KIND_INPUT_GRADIENT
        a compared tensor's `kind` in every report ("output", "gradient", "input_gradient")
    SCHEMA_RUN, SCHEMA_EXPLAIN, SCHEMA_TRACE, SCHEMA_EMULATE, SCHEMA_COMPARE_TP
        the `schema` of each report and ledger
    DTYPES          tpcheck's dtype names ("f64", "f32", "f16", "bf16", "f8e4m3", ...)
    DTYPE_OF        the array libraries' names → tpcheck's ("float32" → "f32", "half" → "f16")
    COMM_ORDERS     the orders a group may add in ("nccl-ring", "rank"; docs/RUNNING.md),
                    each also by name: COMM_ORDER_NCCL_RING, COMM_ORDER_RANK
    PROBE_U         the rounding probe's relative perturbation (2⁻³⁰)
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Optional

from . import _tpcheck
from ._errors import InputError

_shared = _tpcheck.shared_names()

REPORT_KIND_OUTPUT: str = _shared["report_kinds"]["output"]
REPORT_KIND_PARAMETER_GRADIENT: str = _shared["report_kinds"]["parameter_gradient"]
REPORT_KIND_INPUT_GRADIENT: str = _shared["report_kinds"]["input_gradient"]
REPORT_KINDS: tuple[str, ...] = (REPORT_KIND_OUTPUT, REPORT_KIND_PARAMETER_GRADIENT,
                                 REPORT_KIND_INPUT_GRADIENT)

SCHEMA_RUN: str = _shared["schemas"]["run"]
SCHEMA_EXPLAIN: str = _shared["schemas"]["explain"]
SCHEMA_TRACE: str = _shared["schemas"]["trace"]
SCHEMA_EMULATE: str = _shared["schemas"]["emulate"]
SCHEMA_COMPARE_TP: str = _shared["schemas"]["compare_tp"]

DTYPES: tuple[str, ...] = tuple(_shared["dtypes"])
COMM_ORDERS: tuple[str, ...] = tuple(_shared["comm_orders"])
COMM_ORDER_NCCL_RING: str = _shared["comm_order_names"]["nccl_ring"]
COMM_ORDER_RANK: str = _shared["comm_order_names"]["rank"]
PROBE_U: float = _shared["probe_u"]

# The names PyTorch, numpy, JAX and ml_dtypes give the same formats (and the C names).
_LIBRARY_NAMES = {
    "f64": ("float64", "double"),
    "f32": ("float32", "float"),
    "f16": ("float16", "half"),
    "bf16": ("bfloat16",),
    "f8e4m3": ("float8_e4m3fn", "e4m3"),
    "f8e5m2": ("float8_e5m2", "e5m2"),
    "f4e2m1": ("float4_e2m1fn", "float4_e2m1fn_x2"),
    "f8e8m0": ("float8_e8m0fnu",),
}
assert set(_LIBRARY_NAMES) == set(DTYPES), "a dtype of include/tpcheck/dtype.h has no names here"
DTYPE_OF: Mapping[str, str] = MappingProxyType(
    {alias: name for name in DTYPES for alias in (name, *_LIBRARY_NAMES[name])})


def dtype_name(dtype: Any) -> str:
    """tpcheck's name of a dtype: 'f32' for torch.float32, np.float32, jnp.float32,
    'float32' or 'f32'. InputError naming the dtype otherwise."""
    name = str(getattr(dtype, "name", dtype)).replace("torch.", "")
    key = DTYPE_OF.get(name)
    if key is None:
        raise InputError(f"dtype {dtype!r}: expected one of {sorted(DTYPE_OF)}")
    return key


def array_dtype_name(x: Any) -> Optional[str]:
    """tpcheck's name of an array's dtype; None when the array has none tpcheck knows (the
    compiled side then names the unsupported dtype)."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    try:
        return dtype_name(dt)
    except InputError:
        return None


def check_comm_order(order: str, where: str) -> str:
    """`order` when it is one of COMM_ORDERS; InputError naming `where` otherwise."""
    if order not in COMM_ORDERS:
        raise InputError(f"{where}={order!r}: expected one of {', '.join(COMM_ORDERS)}")
    return order

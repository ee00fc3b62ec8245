"""tpcheck.torch — PyTorch programs under tpcheck.

The torch.distributed backend `tpcheck` (one process per rank, NCCL's ring numerics) is
tpcheck.emulate's: `python -m tpcheck emulate -n N -- CMD ...` launches an unchanged
torchrun-style program on it, and `tpcheck.emulate.register_backend()` registers it for
plain torchrun (docs/EMULATE.md); importing tpcheck.torch no longer registers it. The
emulate names this module had (EmulateError, TpcheckProcessGroup, comm_order, register)
still work for one release, with a DeprecationWarning.

It also judges any nn.Module (docs/JUDGE.md): `truth(module, *args, ...)` is its fp64
twin with the rounding-noise probe, and `compare_tp(single, sharded, args, ...)`, called on
every rank, gathers the sharded outputs and gradients and judges each against single and
the truth.
"""

from ..judge import CompareOptions, TPReport, TruthRunError, compare_tp
from ..judge import ModuleTruth as TorchTruth  # the module truth's result, by its old name
from ..judge import module_truth as truth

__all__ = ["truth", "TorchTruth",
           "TruthRunError", "compare_tp", "CompareOptions", "TPReport"]

# The emulate names this module had: tpcheck.emulate's now, forwarded for one release.
_MOVED_TO_EMULATE = {"EmulateError": "EmulateError", "TpcheckProcessGroup": "TpcheckProcessGroup",
                     "comm_order": "comm_order", "register": "register_backend"}


def __getattr__(name):
    new = _MOVED_TO_EMULATE.get(name)
    if new is None:
        raise AttributeError(f"module 'tpcheck.torch' has no attribute {name!r}")
    import warnings

    from .. import emulate

    warnings.warn(f"tpcheck.torch.{name} is tpcheck.emulate.{new} now; the old name goes in "
                  f"the next release", DeprecationWarning, stacklevel=2)
    return getattr(emulate, new)

"""tpcheck.torch — PyTorch programs under tpcheck.

`import tpcheck.torch` registers the torch.distributed backend `tpcheck`: one process per
rank, CPU tensors exchanged through shared memory, CUDA tensors of ranks sharing a GPU
through CUDA IPC, reductions in NCCL's Ring/Simple order with its per-step rounding (the
compiled ring model, `_tpcheck.ring_reduce`) or in rank order (TPCHECK_COMM_ORDER=rank).
`python -m tpcheck emulate -n N -- CMD ...` launches an unchanged torchrun-style program
on it; docs/EMULATE.md has what is mapped and what is not.

It also judges any nn.Module (docs/JUDGE.md): `truth(module, *args, ...)` is its fp64
twin with the rounding-noise probe, and `compare_tp(single, sharded, args, ...)`, called on
every rank, gathers the sharded outputs and gradients and judges each against single and
the truth.
"""

from ._backend import EmulateError, TpcheckProcessGroup, comm_order, register
from ..judge import CompareOptions, TPReport, TruthRunError, compare_tp
from ..judge import ModuleTruth as TorchTruth  # the module truth's result, by its old name
from ..judge import module_truth as truth

register()

__all__ = ["EmulateError", "TpcheckProcessGroup", "comm_order", "truth", "TorchTruth",
           "TruthRunError", "compare_tp", "CompareOptions", "TPReport"]

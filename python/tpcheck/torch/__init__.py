"""tpcheck.torch — PyTorch programs under tpcheck (issue 32).

`import tpcheck.torch` registers the torch.distributed backend `tpcheck`: one process per
rank, CPU tensors exchanged through shared memory, CUDA tensors of ranks sharing a GPU
through CUDA IPC, reductions in NCCL's Ring/Simple order with its per-step rounding (the
compiled ring model, `_tpcheck.ring_reduce`) or in rank order (TPCHECK_COMM_ORDER=rank).
`python -m tpcheck emulate -n N -- CMD ...` launches an unchanged torchrun-style program
on it; docs/EMULATE.md has what is mapped and what is not.
"""

from ._backend import EmulateError, TpcheckProcessGroup, comm_order, register

register()

__all__ = ["EmulateError", "TpcheckProcessGroup", "comm_order"]

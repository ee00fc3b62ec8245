"""tpcheck.emulate — a torch.distributed program at TP N on one GPU or the CPU
(docs/EMULATE.md).

    python -m tpcheck emulate -n 4 -- train_tp.py       # the launcher (launcher.py)

    import tpcheck.emulate                                # without the launcher
    tpcheck.emulate.register_backend()
    torch.distributed.init_process_group("tpcheck")

The `tpcheck` backend runs one process per rank; its collectives follow NCCL's Ring/Simple
numerics (or rank order) bit for bit. Registering it is this explicit call: the launcher's
start-up hook makes it in every rank, and nothing registers it as a side effect of an
import.

The package, from the launcher down:
    launcher      `python -m tpcheck emulate`: options, torchrun's environment, the ranks'
                  supervision and exit status
    memory, mps   before the start: whether N ranks fit; whether they run under MPS
    ledger        --trace: comm.rank<r>.jsonl (rank side) and ledger.json (tpcheck.emulate/1)
    protocol      the launcher <-> rank protocol: environment, job files, events, init
                  marks, EmulateError
    _hook/        sitecustomize.py: maps init_process_group("nccl") onto the backend and
                  a rank's GPU indices onto the GPUs present (device_count, set_device,
                  device_id=), registers the backend
    group         TpcheckProcessGroup: c10d's calls onto the collectives
    collectives   each collective over the engine
    engine        one step per collective: the exchange, the records, mismatch checks
    records       the per-call records in shared memory; watch: waits that never hang
    exchange      the Exchange interface; shm (CPU) and cuda_ipc (CUDA, with
                  cuda_memory) implement it
    reduce        the reductions (the compiled ring model and device kernel, torch ops)
    checks        what the backend accepts, signatures, call sites
    p2p, work     send/recv through the store; Work objects
Nothing here imports torch at import time except through `TpcheckProcessGroup`.
"""

from __future__ import annotations

from .protocol import EmulateError, comm_order

BACKEND = "tpcheck"

__all__ = ["BACKEND", "EmulateError", "TpcheckProcessGroup", "comm_order", "register_backend"]


def register_backend() -> None:
    """Registers the `tpcheck` torch.distributed backend (CPU and CUDA tensors); a no-op
    when it is registered already. Needs torch."""
    import torch.distributed as dist

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def _create(opts, backend_options=None):
    from .group import create

    return create(opts, backend_options)


def __getattr__(name: str):
    if name == "TpcheckProcessGroup":  # imports torch.distributed: only when asked for
        from .group import TpcheckProcessGroup

        return TpcheckProcessGroup
    raise AttributeError(f"module 'tpcheck.emulate' has no attribute {name!r}")

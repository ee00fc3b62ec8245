"""The NCCL id of a torchrun launch, shared through torch.distributed's store.

torchrun's own store already listens on MASTER_PORT, so the C++ side's TCP rendezvous
(connect_nccl_process_group) cannot use it; instead rank 0 makes the id
(ncclGetUniqueId), puts it in the process group's store, every rank reads it and hands it
to the C++ side (set_process_nccl_id) before the run.
"""

from __future__ import annotations

import os

from . import _tpcheck

_launches = 0  # ids shared so far by this process: each run joins a fresh communicator


def _torchrun() -> bool:
    # torchrun sets these for every worker; mpirun's OMPI_* launches keep their TCP path.
    return bool(os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("TORCHELASTIC_RESTART_COUNT")) \
        and "RANK" in os.environ and "WORLD_SIZE" in os.environ \
        and "OMPI_COMM_WORLD_RANK" not in os.environ


def share_nccl_id_if_torchrun(timeout_s: float = 300.0) -> bool:
    """Under torchrun with CUDA: shares a fresh NCCL id between the ranks (an id serves one
    communicator, and every run joins its own; all ranks must call this the same number
    of times, as they run the same script). Returns True when an id was set. Uses the
    default process group when one exists (the caller's), else makes one with the gloo
    backend (only its store is used)."""
    global _launches
    if not _torchrun() or not _tpcheck.built_with_cuda():
        return False
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    store = dist.distributed_c10d._get_default_store()
    key = f"tpcheck/nccl_id/{_launches}"
    _launches += 1
    if dist.get_rank() == 0:
        store.set(key, _tpcheck.make_nccl_id())
    nccl_id = bytes(store.get(key))  # waits for rank 0 (the store's timeout)
    _tpcheck.set_process_nccl_id(nccl_id)
    return True

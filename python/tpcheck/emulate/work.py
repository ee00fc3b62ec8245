"""The Work objects the process group returns: collectives complete before they return
(async_op only changes the return value), except an irecv, whose receive runs in wait() so
that isend/irecv pairs in any order cannot deadlock."""

from __future__ import annotations

import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future


def completed(result=None) -> dist.Work:
    """A Work that is already done, with `result` as its future's value."""
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class LazyWork(dist.Work):
    """Work whose fn() runs at the first wait() (or get_future())."""

    def __init__(self, fn, tensors):
        super().__init__()
        self._fn, self._tensors = fn, tensors

    def wait(self, timeout=None):
        if self._fn is not None:
            fn, self._fn = self._fn, None
            fn()
        return True

    def is_completed(self):
        return self._fn is None

    def is_success(self):
        return self._fn is None

    def get_future(self):
        self.wait()
        fut = Future()
        fut.set_result(self._tensors)
        return fut

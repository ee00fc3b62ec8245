"""Faults for test_emulate.py: python faults.py MODE PIDDIR. Rank 1 misbehaves at the second
collective; the others are blocked in it. Every rank writes its pid to PIDDIR first, and
the faulty rank prints `FAULT <unix time>` just before the fault."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

mode, piddir = sys.argv[1], sys.argv[2]
dist.init_process_group("nccl")
r = dist.get_rank()
with open(os.path.join(piddir, f"pid{r}"), "w") as f:
    f.write(str(os.getpid()))
t = torch.ones(4)
dist.all_reduce(t)


def fault():
    print(f"FAULT {time.time()}", flush=True)


if r == 1:
    if mode == "raise":
        fault()
        raise RuntimeError("injected failure in rank 1")
    if mode == "exit":
        fault()
        sys.exit(3)
    if mode == "exit0":
        fault()
        sys.exit(0)
    if mode == "kill":
        fault()
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "kind":
        fault()
        dist.all_gather_into_tensor(torch.empty(8), t)
    if mode == "size":
        fault()
        dist.all_reduce(torch.ones(5))
dist.all_reduce(t)  # the others wait here
dist.destroy_process_group()

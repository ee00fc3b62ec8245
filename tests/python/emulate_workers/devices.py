"""What a rank of `python -m tpcheck emulate -n N` sees of the GPUs and of the backend per
device type, written the way TransformerEngine's run_numerics.py is (CPU tensors: the CI
machine has no GPU).

  python devices.py [--fail-rank R]

EXPECT_DEVICE_COUNT: what torch.cuda.device_count() must answer (the launch sets
TPCHECK_EMULATE_PHYSICAL_GPUS to stand in for the GPUs present, or none). Checks:
  * torch.cuda.device_count(), and `assert LOCAL_WORLD_SIZE <= device_count()` when it is
    non-zero (run_numerics.py's first line);
  * init_process_group("nccl", device_id=cuda:LOCAL_RANK) (only without stand-in GPUs:
    torch checks device_id against the real ones) and new_group(backend="nccl"), also with
    device_id=cuda:LOCAL_RANK (mapped to cuda:(r mod G); torch asks the new group's backend
    for that device whether it can split);
  * the group answers _get_backend for cpu and cuda, and its device types;
  * _coalescing_manager(group, device=cuda) around all_gather_into_tensor,
    reduce_scatter_tensor and all_reduce, synchronous and async (TE's FP8 block-scaling
    gather), and around an isend/irecv pair;
  * --fail-rank R: rank R's check fails, the flags are max-reduced and every rank asserts,
    as run_numerics.py's _check_outputs does.
Prints `OK <what>` per check and `ALL OK`.
"""

import os
import sys

import torch
import torch.distributed as dist

R, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
LOCAL_RANK, LOCAL_SIZE = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
CUDA = torch.device("cuda")


def ok(what):
    print(f"OK {what}", flush=True)


count = torch.cuda.device_count()
assert count == int(os.environ["EXPECT_DEVICE_COUNT"]), f"device_count() = {count}"
if count:
    assert LOCAL_SIZE <= torch.cuda.device_count()
ok(f"device_count {count}")

stand_in = bool(os.environ.get("TPCHECK_EMULATE_PHYSICAL_GPUS"))
if stand_in:
    dist.init_process_group(backend="nccl", rank=R, world_size=N, init_method="env://")
else:
    dist.init_process_group(backend="nccl", rank=R, world_size=N, init_method="env://",
                            device_id=torch.device(f"cuda:{LOCAL_RANK}"))
world = dist.new_group(backend="nccl")
ok("init_process_group and new_group")
if stand_in:
    sub = dist.new_group(backend="nccl", device_id=torch.device("cuda", LOCAL_RANK))
    ok("new_group with device_id")
else:
    sub = world

for g in (dist.group.WORLD, world, sub):
    assert g._get_backend(torch.device("cpu")).supports_splitting is False
    assert g._get_backend(torch.device("cuda", LOCAL_RANK)) is not None
    assert g._get_backend(CUDA).supports_coalescing is False
    assert {d.type for d in g._device_types} == {"cpu", "cuda"}
    try:
        g._get_backend(torch.device("meta"))
        raise AssertionError("_get_backend(meta) answered")
    except RuntimeError as e:
        assert "device type 'meta'" in str(e), e
assert dist.Backend.backend_capability["tpcheck"] == ["cpu", "cuda"]
ok("_get_backend cpu and cuda")

# TE's blockwise FP8 all-gather: every collective of the manager is recorded and run at its end.
for async_ops in (False, True):
    for group in (world, sub):
        a = torch.full((3,), float(R + 1))
        ag = torch.empty(3 * N)
        rs_in = torch.arange(2 * N, dtype=torch.float32) + R
        rs = torch.empty(2)
        with dist._coalescing_manager(group=group, device=CUDA, async_ops=async_ops) as cm:
            dist.all_gather_into_tensor(ag, a, group=group)
            dist.all_gather_into_tensor(ag, a, group=group)
        if async_ops:
            cm.wait()
        assert torch.equal(ag, torch.cat([torch.full((3,), float(r + 1)) for r in range(N)])), ag
        with dist._coalescing_manager(group=group, device=CUDA, async_ops=async_ops) as cm:
            dist.reduce_scatter_tensor(rs, rs_in, group=group)
        if async_ops:
            cm.wait()
        want = (torch.arange(2 * N, dtype=torch.float32) * N + sum(range(N)))[2 * R:2 * R + 2]
        assert torch.equal(rs, want), (rs, want)
        x, y = torch.full((5,), float(R)), torch.full((2,), 1.0)
        with dist._coalescing_manager(group=group, device=CUDA, async_ops=async_ops) as cm:
            dist.all_reduce(x, group=group)
            dist.all_reduce(y, group=group)
        if async_ops:
            cm.wait()
        assert torch.equal(x, torch.full((5,), float(sum(range(N))))) and torch.equal(y, torch.full((2,), float(N)))
ok("_coalescing_manager device=cuda")

# Point to point inside a manager: the manager's Work receives.
got = torch.zeros(4)
with dist._coalescing_manager(group=world, device=CUDA, async_ops=True) as cm:
    dist.isend(torch.full((4,), float(R)), dst=(R + 1) % N, group=world)
    dist.irecv(got, src=(R - 1) % N, group=world)
cm.wait()
assert torch.equal(got, torch.full((4,), float((R - 1) % N))), got
ok("_coalescing_manager isend/irecv")

if "--fail-rank" in sys.argv:
    bad = int(sys.argv[sys.argv.index("--fail-rank") + 1])
    failed = torch.tensor([0], dtype=torch.uint8)
    if R == bad:
        print("NUMERICAL CHECK FAILED: outputs not close enough", file=sys.stderr, flush=True)
    failed[0] = int(R == bad)
    dist.all_reduce(failed, dist.ReduceOp.MAX, world)
    assert not bool(failed.item())

dist.barrier()
dist.destroy_process_group()
print("ALL OK", flush=True)

"""Every collective of the `tpcheck` backend (CPU tensors, or CUDA ones with --cuda)
against a plain reference computed here (every rank's input is known to every rank: it is
a function of the rank). Run by test_emulate.py under
`python -m tpcheck emulate -n N [--comm-order ...]`; prints `OK <name>` per check and
`ALL OK` at the end. Written as a user would: init with "nccl".
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import emulate_ring_ref as ref  # noqa: E402

dist.init_process_group("nccl")
R, N = dist.get_rank(), dist.get_world_size()
# --cuda: the same checks on CUDA tensors (ranks sharing the GPU through CUDA IPC).
if "--cuda" in sys.argv:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    DEV = torch.device("cuda", torch.cuda.current_device())
else:
    DEV = torch.device("cpu")


def D(t):
    return t.to(DEV)


ORDER = os.environ["TPCHECK_COMM_ORDER"]
FMT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
       "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}


def data(rank, count, dtype, salt=0, positive=False):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    x = torch.randn(count, generator=g) * 10.0 ** torch.randint(-2, 3, (count,), generator=g)
    if positive:
        x = 1 + 0.1 * torch.tanh(x)
    return x.to(dtype)


def bits(t):
    t = t.contiguous().view(-1)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def np32(t):
    return t.float().numpy() if t.dtype != torch.float64 else t.numpy()


def expect_equal(name, got, want):
    got = got.cpu()
    if not torch.equal(bits(got), bits(want.to(got.dtype).reshape(got.shape))):
        d = (got.double() - want.double().reshape(got.shape)).abs()
        raise AssertionError(f"{name}: bits differ at {int((d != 0).sum())} elements, max {d.max()}")
    print(f"OK {name}", flush=True)


def ring_all_reduce(xs, dtype, op, group_size=None):
    fmt = FMT[dtype]
    if ORDER == "rank":
        out = ref.rank_order([np32(x) for x in xs], fmt, op)
    else:
        out = ref.all_reduce([np32(x) for x in xs], fmt, op)[0]
    return torch.from_numpy(np.asarray(out)).to(dtype)


# all_reduce: every op, float dtypes, in the order of the launch; a size crossing 2 MiB
# chunks for bf16 (loop of N x 1M elements) is too slow for CI, chunking is covered by
# test_emulate_ring.py; here: sizes with a partial loop and uneven chunks.
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for op in OPS:
        count = 1037
        xs = [data(r, count, dtype, salt=3, positive=op == "prod") for r in range(N)]
        t = D(xs[R].clone().reshape(17, 61))
        dist.all_reduce(t, op=OPS[op])
        expect_equal(f"all_reduce {op} {FMT[dtype]}", t, ring_all_reduce(xs, dtype, op))

# --cuda: a large all-reduce (split: every rank folds 1/N, emulate/cuda_ipc.py) that crosses
# the 2 MiB chunks of the ring (bf16: loops of N x 1M elements, then a partial loop), against
# the compiled host model of the CPU path (too large for the Python reference above).
if DEV.type == "cuda":
    from tpcheck import _tpcheck

    for dtype, op in ((torch.bfloat16, "sum"), (torch.float32, "avg")):
        count = 2 * N * (1 << 20) + 12345
        xs = [data(r, count, dtype, salt=12) for r in range(N)]
        want = torch.empty(count, dtype=dtype)
        _tpcheck.ring_reduce(xs, want, "all_reduce", op, ORDER, R)
        t = D(xs[R].clone())
        dist.all_reduce(t, op=OPS[op])
        expect_equal(f"all_reduce {op} {FMT[dtype]} large", t, want)

# integers: any order gives the same bits
xs = [torch.arange(10, dtype=torch.int64) * (r + 1) for r in range(N)]
t = D(xs[R].clone())
dist.all_reduce(t)
expect_equal("all_reduce sum int64", t, sum(xs))
t = D(xs[R].clone())
dist.all_reduce(t, op=dist.ReduceOp.MAX)
expect_equal("all_reduce max int64", t, xs[-1])

# async_op and Work.wait(); non-contiguous tensor
xs = [data(r, 64, torch.float32, salt=4) for r in range(N)]
base = D(xs[R].clone().reshape(8, 8))
t = base.t()  # non-contiguous
w = dist.all_reduce(t, async_op=True)
w.wait()
want = ring_all_reduce([x.reshape(8, 8).t().contiguous().reshape(-1) for x in xs], torch.float32, "sum")
expect_equal("all_reduce async non-contiguous", t.contiguous(), want)

# all_gather / all_gather_into_tensor
xs = [data(r, 12, torch.bfloat16, salt=5) for r in range(N)]
outs = [torch.empty(12, dtype=torch.bfloat16, device=DEV) for _ in range(N)]
dist.all_gather(outs, D(xs[R]))
expect_equal("all_gather", torch.cat(outs), torch.cat(xs))
out = torch.empty(N * 12, dtype=torch.bfloat16, device=DEV)
dist.all_gather_into_tensor(out, D(xs[R]))
expect_equal("all_gather_into_tensor", out, torch.cat(xs))

# reduce_scatter / reduce_scatter_tensor
xs = [data(r, N * 40, torch.bfloat16, salt=6) for r in range(N)]
if ORDER == "rank":
    want = torch.from_numpy(ref.rank_order([np32(x) for x in xs], "bf16"))[R * 40:(R + 1) * 40]
else:
    want = torch.from_numpy(ref.reduce_scatter([np32(x) for x in xs], "bf16")[R])
out = torch.empty(40, dtype=torch.bfloat16, device=DEV)
dist.reduce_scatter_tensor(out, D(xs[R]))
expect_equal("reduce_scatter_tensor", out, want)
out = torch.empty(40, dtype=torch.bfloat16, device=DEV)
dist.reduce_scatter(out, list(D(xs[R]).chunk(N)))
expect_equal("reduce_scatter", out, want)

# broadcast, reduce
t = D(data(R, 9, torch.float16, salt=7))
dist.broadcast(t, src=N - 1)
expect_equal("broadcast", t, data(N - 1, 9, torch.float16, salt=7))
xs = [data(r, 33, torch.float32, salt=8) for r in range(N)]
t = D(xs[R].clone())
dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
if R == 1:
    if ORDER == "rank":
        want = torch.from_numpy(ref.rank_order([np32(x) for x in xs], "f32"))
    else:
        want = torch.from_numpy(ref.reduce([np32(x) for x in xs], "f32", "sum", 1))
    expect_equal("reduce", t, want)
else:
    print("OK reduce", flush=True)

# all_to_all_single with uneven splits: rank r sends (r + j + 1) rows to rank j
def rows(src, dst):
    return src + dst + 1


inp = D(torch.cat([torch.full((rows(R, j), 3), 100.0 * R + j) for j in range(N)]))
out = torch.empty(sum(rows(j, R) for j in range(N)), 3, device=DEV)
dist.all_to_all_single(out, inp, output_split_sizes=[rows(j, R) for j in range(N)],
                       input_split_sizes=[rows(R, j) for j in range(N)])
expect_equal("all_to_all_single", out, torch.cat([torch.full((rows(j, R), 3), 100.0 * j + R) for j in range(N)]))
outs = [torch.empty(2, device=DEV) for _ in range(N)]
dist.all_to_all(outs, [D(torch.full((2,), 10.0 * R + j)) for j in range(N)])
expect_equal("all_to_all", torch.cat([o.cpu() for o in outs]), torch.cat([torch.full((2,), 10.0 * j + R) for j in range(N)]))

# barrier, send/recv around the ring (isend/irecv: no deadlock), gather/scatter
dist.barrier()
print("OK barrier", flush=True)
nxt, prv = (R + 1) % N, (R - 1) % N
sendt = D(torch.full((4,), float(R), dtype=torch.bfloat16))
recvt = torch.empty(4, dtype=torch.bfloat16, device=DEV)
rq = dist.irecv(recvt, src=prv)
sq = dist.isend(sendt, dst=nxt)
rq.wait()
sq.wait()
expect_equal("isend/irecv", recvt, torch.full((4,), float(prv)))
recvt = torch.empty(4, dtype=torch.bfloat16, device=DEV)
for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, sendt, nxt), dist.P2POp(dist.irecv, recvt, prv)]):
    w.wait()
expect_equal("batch_isend_irecv", recvt, torch.full((4,), float(prv)))
if R == 0:
    dist.send(D(torch.arange(5.0)), dst=N - 1)
elif R == N - 1:
    t = torch.empty(5, device=DEV)
    dist.recv(t, src=0)
    expect_equal("send/recv", t, torch.arange(5.0))
g = [torch.empty(2, device=DEV) for _ in range(N)] if R == 0 else None
dist.gather(D(torch.full((2,), float(R))), g, dst=0)
if R == 0:
    expect_equal("gather", torch.cat([x.cpu() for x in g]), torch.cat([torch.full((2,), float(j)) for j in range(N)]))
t = torch.empty(3, device=DEV)
dist.scatter(t, [D(torch.full((3,), float(j))) for j in range(N)] if R == 0 else None, src=0)
expect_equal("scatter", t, torch.full((3,), float(R)))

# coalesced forms
xs = [data(r, 20, torch.float32, salt=9) for r in range(N)]
ys = [data(r, 7, torch.float32, salt=10) for r in range(N)]
a, b = D(xs[R].clone()), D(ys[R].clone())
with dist._coalescing_manager(async_ops=True) as cm:
    dist.all_reduce(a)
    dist.all_reduce(b)
cm.wait()
expect_equal("coalesced all_reduce [0]", a, ring_all_reduce(xs, torch.float32, "sum"))
expect_equal("coalesced all_reduce [1]", b, ring_all_reduce(ys, torch.float32, "sum"))
o1, o2 = torch.empty(N * 20, device=DEV), torch.empty(N * 7, device=DEV)
with dist._coalescing_manager():
    dist.all_gather_into_tensor(o1, D(xs[R]))
    dist.all_gather_into_tensor(o2, D(ys[R]))
expect_equal("coalesced all_gather_into_tensor", torch.cat([o1.cpu(), o2.cpu()]), torch.cat([torch.cat(xs), torch.cat(ys)]))
# with the tensors' device named (TransformerEngine's FP8 block-scaling gather): c10d starts
# and ends coalescing on the group's backend for that device
o1, o2, rs = torch.empty(N * 20, device=DEV), torch.empty(N * 7, device=DEV), torch.empty(5, device=DEV)
zs = [data(r, 5 * N, torch.float32, salt=12) for r in range(N)]
with dist._coalescing_manager(device=torch.device(DEV), async_ops=True) as cm:
    dist.all_gather_into_tensor(o1, D(xs[R]))
    dist.all_gather_into_tensor(o2, D(ys[R]))
cm.wait()
expect_equal("coalesced all_gather_into_tensor, device named", torch.cat([o1.cpu(), o2.cpu()]), torch.cat([torch.cat(xs), torch.cat(ys)]))
with dist._coalescing_manager(device=torch.device(DEV)):
    dist.reduce_scatter_tensor(rs, D(zs[R]))
if ORDER == "rank":
    want = torch.from_numpy(ref.rank_order([np32(x) for x in zs], "f32"))[R * 5:(R + 1) * 5]
else:
    want = torch.from_numpy(ref.reduce_scatter([np32(x) for x in zs], "f32")[R])
expect_equal("coalesced reduce_scatter_tensor, device named", rs, want)
a = D(xs[R].clone())
with dist._coalescing_manager(device=torch.device(DEV)):
    dist.all_reduce(a)
expect_equal("coalesced all_reduce, device named", a, ring_all_reduce(xs, torch.float32, "sum"))

# functional collectives (DTensor's)
xs = [data(r, 8 * N, torch.bfloat16, salt=11) for r in range(N)]
y = funcol.all_reduce(D(xs[R]), "sum", dist.group.WORLD)
expect_equal("funcol.all_reduce", funcol.wait_tensor(y), ring_all_reduce(xs, torch.bfloat16, "sum"))
y = funcol.all_gather_tensor(D(xs[R].reshape(N, 8)), 0, dist.group.WORLD)
expect_equal("funcol.all_gather_tensor", funcol.wait_tensor(y), torch.cat(xs))
y = funcol.reduce_scatter_tensor(D(xs[R]), "sum", 0, dist.group.WORLD)
if ORDER == "rank":
    want = torch.from_numpy(ref.rank_order([np32(x) for x in xs], "bf16"))[R * 8:(R + 1) * 8]
else:
    want = torch.from_numpy(ref.reduce_scatter([np32(x) for x in xs], "bf16")[R])
expect_equal("funcol.reduce_scatter_tensor", funcol.wait_tensor(y), want)
y = funcol.all_to_all_single(D(torch.arange(N, dtype=torch.float32) + 10 * R), None, None, dist.group.WORLD)
expect_equal("funcol.all_to_all_single", funcol.wait_tensor(y), torch.arange(N, dtype=torch.float32) * 10 + R)

# subgroups: TP groups of 2 inside DP (when N is even)
if N % 2 == 0:
    tp_groups = [dist.new_group([2 * i, 2 * i + 1]) for i in range(N // 2)]
    mine = tp_groups[R // 2]
    peers = [2 * (R // 2), 2 * (R // 2) + 1]
    xs = {r: data(r, 50, torch.bfloat16, salt=12) for r in peers}
    t = D(xs[R].clone())
    dist.all_reduce(t, group=mine)
    expect_equal("new_group all_reduce", t, ring_all_reduce([xs[p] for p in peers], torch.bfloat16, "sum"))
    out = torch.empty(100, dtype=torch.bfloat16, device=DEV)
    dist.all_gather_into_tensor(out, D(xs[R]), group=mine)
    expect_equal("new_group all_gather", out, torch.cat([xs[p] for p in peers]))

# DDP (its bucketed gradient all-reduce and its parameter broadcast)
torch.manual_seed(0)
lin = torch.nn.Linear(6, 3).to(DEV)
ddp = torch.nn.parallel.DistributedDataParallel(lin)
xs = [data(r, 24, torch.float32, salt=13).reshape(4, 6) for r in range(N)]
ddp(D(xs[R])).sum().backward()
want = torch.zeros(3, 6)
for r in range(N):
    ref_lin = torch.nn.Linear(6, 3)
    ref_lin.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    ref_lin(xs[r]).sum().backward()
    want += ref_lin.weight.grad / N
torch.testing.assert_close(lin.weight.grad.cpu(), want, rtol=1e-5, atol=1e-6)
g0 = lin.weight.grad.clone()
dist.broadcast(g0, 0)
assert torch.equal(g0, lin.weight.grad), "DDP gradients differ between ranks"
print("OK DDP", flush=True)

# tensors the backend cannot handle: an error naming them (every rank, before any exchange)
REFUSED = {"sparse": (torch.zeros(4).to_sparse(), dist.ReduceOp.SUM, "sparse"),
           "fp8": (D(torch.zeros(4, dtype=torch.float8_e4m3fn)), dist.ReduceOp.SUM, "float8_e4m3fn"),
           "bool avg": (D(torch.ones(4, dtype=torch.bool)), dist.ReduceOp.AVG, "AVG of a bool")}
for name, (bad, op, says) in REFUSED.items():
    try:
        dist.all_reduce(bad, op=op)
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        assert says in msg, msg
        print(f"OK refuses {name}: {msg.splitlines()[0][:100]}", flush=True)
    else:
        raise AssertionError(f"all_reduce of a {name} tensor did not fail")

dist.barrier()
dist.destroy_process_group()
print("ALL OK", flush=True)

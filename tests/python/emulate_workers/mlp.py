"""A Megatron-style column -> gelu -> row parallel MLP and attention block (QKV column
parallel by heads, output projection row parallel), with and without sequence parallel,
and PyTorch DTensor's parallelize_module (ColwiseParallel / RowwiseParallel), under
`python -m tpcheck emulate -n N`. Written the way a user writes it: init_process_group
("nccl", device_id=cuda:LOCAL_RANK), torch.cuda.set_device(LOCAL_RANK), dist.get_rank()
(on a machine without GPUs the launcher's hook drops device_id and makes set_device a
no-op).

  python mlp.py OUTDIR [--dtensor]
At TP 1 (one rank) it saves the unsharded results to OUTDIR/tp1.pt; at TP N it compares
its gathered outputs and gradients with them (f32: the sums differ in order, so within
2e-5 relative), and checks the row-parallel output bit for bit against the ring model
applied to the partial products (every rank recomputes every rank's partial product).
Prints `OK <what>` per check and `ALL OK`.
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import emulate_ring_ref as ref  # noqa: E402
import torch_tp_layers as L  # noqa: E402  (Megatron's mappings: their one definition; BUG stays "none")

OUT = sys.argv[1]
DTENSOR = "--dtensor" in sys.argv
SEQ, BATCH, HIDDEN, FFN = 16, 2, 32, 128

dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
R, N = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
W1 = torch.randn(FFN, HIDDEN) / HIDDEN ** 0.5
B1 = torch.randn(FFN) * 0.1
W2 = torch.randn(HIDDEN, FFN) / FFN ** 0.5
B2 = torch.randn(HIDDEN) * 0.1
X = torch.randn(SEQ, BATCH, HIDDEN)
DY = torch.randn(SEQ, BATCH, HIDDEN)
HEADS = 8
WQ, WK, WV, WO = (torch.randn(HIDDEN, HIDDEN) / HIDDEN ** 0.5 for _ in range(4))
BO = torch.randn(HIDDEN) * 0.1


def shard(t, dim):
    return t.chunk(N, dim)[R].clone()


def megatron_mlp(sp: bool):
    w1 = shard(W1, 0).requires_grad_()
    b1 = shard(B1, 0).requires_grad_()
    w2 = shard(W2, 1).requires_grad_()
    b2 = B2.clone().requires_grad_()
    x = (shard(X, 0) if sp else X.clone()).requires_grad_()
    h = L.GatherFromSequence.apply(x) if sp else L.CopyToRegion.apply(x)
    a = F.gelu(F.linear(h, w1, b1), approximate="tanh")
    partial = F.linear(a, w2)
    y = (L.ReduceScatterToSequence.apply(partial) if sp else L.ReduceFromRegion.apply(partial)) + b2
    y.backward(shard(DY, 0) if sp else DY)
    return y, x.grad, w1.grad, b1.grad, w2.grad, b2.grad, a.detach()


def attention(x, wq, wk, wv, wo, heads):
    s, b, _ = x.shape
    d = HIDDEN // HEADS

    def split(t):  # [s, b, heads * d] -> [b, heads, s, d]
        return t.view(s, b, heads, d).permute(1, 2, 0, 3)

    q, k, v = split(F.linear(x, wq)), split(F.linear(x, wk)), split(F.linear(x, wv))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(a.permute(2, 0, 1, 3).reshape(s, b, heads * d), wo)


def megatron_attention(sp: bool):
    wq, wk, wv = (shard(w, 0).requires_grad_() for w in (WQ, WK, WV))  # heads of this rank
    wo = shard(WO, 1).requires_grad_()
    x = (shard(X, 0) if sp else X.clone()).requires_grad_()
    h = L.GatherFromSequence.apply(x) if sp else L.CopyToRegion.apply(x)
    partial = attention(h, wq, wk, wv, wo, HEADS // N)
    y = (L.ReduceScatterToSequence.apply(partial) if sp else L.ReduceFromRegion.apply(partial)) + BO
    y.backward(shard(DY, 0) if sp else DY)
    return y, x.grad, wq.grad, wk.grad, wo.grad


def single_attention():
    wq, wk, wv, wo = (t.clone().requires_grad_() for t in (WQ, WK, WV, WO))
    x = X.clone().requires_grad_()
    y = attention(x, wq, wk, wv, wo, HEADS) + BO
    y.backward(DY)
    return {"attn_y": y.detach(), "attn_dx": x.grad, "attn_dwq": wq.grad, "attn_dwk": wk.grad,
            "attn_dwo": wo.grad}


def gather(t, dim):
    parts = [torch.empty_like(t) for _ in range(N)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


def single():
    w1, b1, w2, b2 = (t.clone().requires_grad_() for t in (W1, B1, W2, B2))
    x = X.clone().requires_grad_()
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
    y.backward(DY)
    return {"y": y.detach(), "dx": x.grad, "dw1": w1.grad, "db1": b1.grad, "dw2": w2.grad, "db2": b2.grad}


def close(name, got, want, rtol=2e-5, atol=2e-6):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    print(f"OK {name}", flush=True)


if N == 1:
    torch.save({**single(), **single_attention()}, os.path.join(OUT, "tp1.pt"))
    print("ALL OK", flush=True)
    dist.destroy_process_group()
    sys.exit(0)

tp1 = torch.load(os.path.join(OUT, "tp1.pt"))
for sp in (False, True):
    tag = f"megatron TP {N}{' SP' if sp else ''}"
    y, dx, dw1, db1, dw2, db2, a = megatron_mlp(sp)
    if sp:
        y, dx = gather(y, 0), gather(dx, 0)
        dist.all_reduce(db2)  # Megatron all-reduces the grads of sequence-parallel params
    got = {"y": y.detach(), "dx": dx, "dw1": gather(dw1, 0), "db1": gather(db1, 0),
           "dw2": gather(dw2, 1), "db2": db2}
    for k in got:
        close(f"{tag} {k} vs TP 1", got[k], tp1[k])
    if not sp:
        # Bits: the row-parallel all-reduce of every rank's partial product, by the ring model.
        acts = gather(a.contiguous(), a.dim() - 1)  # every rank's activation shard
        partials = [F.linear(acts.chunk(N, -1)[r].contiguous(), W2.chunk(N, 1)[r].contiguous())
                    for r in range(N)]
        if os.environ.get("TPCHECK_COMM_ORDER") == "rank":
            s = ref.rank_order([p.reshape(-1).numpy() for p in partials], "f32")
        else:
            s = ref.all_reduce([p.reshape(-1).numpy() for p in partials], "f32")[0]
        want = torch.from_numpy(np.asarray(s)).reshape(y.shape) + B2
        assert torch.equal(y.detach(), want), f"{tag}: forward output is not the ring's bits"
        print(f"OK {tag} forward bits = ring model", flush=True)
    # every rank holds the same replicated results, bit for bit
    for k in ("y", "db2"):
        ref0 = got[k].clone()
        dist.broadcast(ref0, 0)
        assert torch.equal(ref0, got[k]), f"{tag} {k}: ranks differ"
    print(f"OK {tag} ranks agree", flush=True)

for sp in (False, True):
    tag = f"megatron attention TP {N}{' SP' if sp else ''}"
    y, dx, dwq, dwk, dwo = megatron_attention(sp)
    if sp:
        y, dx = gather(y, 0), gather(dx, 0)
    got = {"attn_y": y.detach(), "attn_dx": dx, "attn_dwq": gather(dwq, 0),
           "attn_dwk": gather(dwk, 0), "attn_dwo": gather(dwo, 1)}
    for k in got:
        close(f"{tag} {k[5:]} vs TP 1", got[k], tp1[k])

if DTENSOR:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(HIDDEN, FFN)
            self.fc2 = torch.nn.Linear(FFN, HIDDEN)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    m = MLP()
    with torch.no_grad():
        m.fc1.weight.copy_(W1), m.fc1.bias.copy_(B1), m.fc2.weight.copy_(W2), m.fc2.bias.copy_(B2)
    mesh = init_device_mesh("cpu", (N,))
    parallelize_module(m, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = X.clone().requires_grad_()
    y = m(x)
    y.backward(DY)
    tag = f"DTensor TP {N}"
    close(f"{tag} y vs TP 1", y.detach(), tp1["y"])
    close(f"{tag} dx vs TP 1", x.grad, tp1["dx"])
    close(f"{tag} dw1 vs TP 1", m.fc1.weight.grad.full_tensor(), tp1["dw1"])
    close(f"{tag} dw2 vs TP 1", m.fc2.weight.grad.full_tensor(), tp1["dw2"])
    close(f"{tag} db2 vs TP 1", m.fc2.bias.grad.full_tensor(), tp1["db2"])

dist.barrier()
dist.destroy_process_group()
print("ALL OK", flush=True)

"""bench/emulate_bench.py — the performance goals of `tpcheck emulate`, in one run, side by
side, on one GPU (figures in bench/RESULTS.md):

    PYTHONPATH=build/python python bench/emulate_bench.py [--tp 2 4 8] [--quick]
        [--mps | --no-mps] [--parts mlp coll launch]

Every launch is the launcher's default (MPS when several ranks share a GPU and
nvidia-cuda-mps-control is there), or with --mps / --no-mps as given; the table says which
mode ran (the launcher's first line). Prints a markdown table (date, GPU, commit) to append
to bench/RESULTS.md:
  1. MLP step (column -> gelu -> row, hidden 4096, ffn 16384, 4096 tokens, bf16, fwd+bwd):
     TP 1 (one rank under `emulate -n 1`, the same process image), TP N under `emulate` on
     the tpcheck backend, with and without sequence parallel, and the same under gloo
     (`init_process_group("gloo")`, which the launcher leaves alone) as the anchor.
     Goal: TP 8 <= 2x TP 1, SP <= 2.5x.
  2. all_reduce / reduce_scatter_tensor / all_gather_into_tensor of 64 MiB bf16 per rank at
     TP N on one GPU against the memory-bound ideal: every rank's input read once and
     output written once, at the device copy bandwidth measured in the same run
     (a 64 MiB copy_, read + write bytes / time). Goal: >= 50 %. With a breakdown: each
     collective's per-call cost on 1024 elements, the reduction kernel alone moving the
     same bytes, and the host's time to issue the 64 MiB calls next to their synchronized
     time (TPCHECK_BENCH_PROFILE=FILE: rank 0's Python profile of the small and the large
     calls).
  3. launch overhead: `emulate -n 8 -- python -c "import torch.distributed"` against
     `torchrun --nproc-per-node 8` of the same (a file). Goal: within 1.2x.
The worker half of this file runs inside the launched ranks (`--worker ...`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


# ---- worker (inside a rank) --------------------------------------------------------------------
def seconds_per_call(fn, iters, warmup=1, group=True):
    """Wall seconds per call of fn over `iters` calls after `warmup`, the GPU synchronized
    at both ends; with `group`, every rank starts and ends together (a barrier each side)."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if group:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    if group:
        dist.barrier()
    return (time.perf_counter() - t0) / iters


def worker(argv):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True, choices=["mlp", "coll"])
    p.add_argument("--backend", default="nccl")
    p.add_argument("--sp", action="store_true")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--mib", type=int, default=64)
    a = p.parse_args(argv)
    dist.init_process_group(a.backend)
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dev = torch.device("cuda", torch.cuda.current_device())
    r, n = dist.get_rank(), dist.get_world_size()
    res = {}
    if a.worker == "mlp":
        H, FF, T = a.hidden, a.ffn, a.tokens
        w1 = (torch.randn(FF // n, H, device=dev) / H ** 0.5).bfloat16().requires_grad_()
        w2 = (torch.randn(H, FF // n, device=dev) / FF ** 0.5).bfloat16().requires_grad_()
        x = torch.randn(T // n if a.sp else T, H, device=dev).bfloat16().requires_grad_()
        dy = torch.randn_like(x)

        def step():
            if n > 1 and a.sp:
                full = torch.empty(T, H, device=dev, dtype=x.dtype)
                dist.all_gather_into_tensor(full, x.detach())
                xf = full.requires_grad_()
            else:
                xf = x
            h = F.gelu(F.linear(xf, w1), approximate="tanh")
            y = F.linear(h, w2)
            if n > 1:
                if a.sp:
                    out = torch.empty(T // n, H, device=dev, dtype=y.dtype)
                    dist.reduce_scatter_tensor(out, y.detach())
                else:
                    dist.all_reduce(y.detach())
            gy = torch.empty(T, H, device=dev, dtype=dy.dtype) if (n > 1 and a.sp) else dy
            if n > 1 and a.sp:
                dist.all_gather_into_tensor(gy, dy)
            y.backward(gy)
            if n > 1:
                if a.sp:
                    g = torch.empty(T // n, H, device=dev, dtype=xf.grad.dtype)
                    dist.reduce_scatter_tensor(g, xf.grad)
                else:
                    dist.all_reduce(xf.grad)

        res["step_ms"] = seconds_per_call(step, a.iters, warmup=2) * 1e3
    else:
        count = a.mib * (1 << 20) // 2
        src = torch.randn(count, device=dev).bfloat16()
        dst = torch.empty_like(src)
        # The copy bandwidth of the GPU alone: rank 0 copies while the others wait (ranks
        # that copy at once under MPS share the bandwidth and would halve the figure).
        dist.barrier()
        copy_s = float("nan")
        if r == 0:
            copy_s = seconds_per_call(lambda: dst.copy_(src), 4 * a.iters, warmup=3, group=False)
        dist.barrier()
        res["copy_GBps"] = 2 * src.numel() * 2 / copy_s / 1e9  # read + write
        out_ag = torch.empty(count * n, device=dev, dtype=src.dtype)
        out_rs = torch.empty(count // n, device=dev, dtype=src.dtype)
        colls = {
            "all_reduce": (lambda: dist.all_reduce(src), 2 * count * 2),
            "reduce_scatter_tensor": (lambda: dist.reduce_scatter_tensor(out_rs, src), count * 2 + count * 2 // n),
            "all_gather_into_tensor": (lambda: dist.all_gather_into_tensor(out_ag, src), count * 2 + n * count * 2),
        }
        for name, (fn, bytes_per_rank) in colls.items():
            t = seconds_per_call(fn, a.iters)
            # All n ranks share one GPU: the ideal moves every rank's bytes at the copy rate.
            ideal = n * bytes_per_rank / (res["copy_GBps"] * 1e9)
            res[name] = {"ms": t * 1e3, "ideal_ms": ideal * 1e3, "fraction": ideal / t}
        res["breakdown"] = breakdown(a, dev, src, copy_s)
        res["breakdown"].update(host_side(a, colls))
    if r == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


def breakdown(a, dev, src, copy_s):
    """Where a 64 MiB collective's time goes: the same call on 1024 elements (what a call
    costs whatever its size: the records' rounds, event waits, launches), and the reduction
    kernel alone moving every rank's bytes (all 8 ranks' kernels as one, on rank 0, the
    others waiting). Times in ms."""
    import torch
    import torch.distributed as dist

    from tpcheck import _tpcheck

    r, n = dist.get_rank(), dist.get_world_size()
    small = src[:1024].clone()
    small_ag = torch.empty(1024 * n, device=dev, dtype=src.dtype)
    small_rs = torch.empty(1024 // n, device=dev, dtype=src.dtype)
    out = {"copy_ms": copy_s * 1e3}
    for name, fn in (("all_reduce", lambda: dist.all_reduce(small)),
                     ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(small_rs, small)),
                     ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(small_ag, small))):
        out[f"{name} 1024 elements"] = seconds_per_call(fn, 100, warmup=5) * 1e3
        # TPCHECK_BENCH_PROFILE=FILE: rank 0's Python profile of 100 more calls, appended
        profile_to = os.environ.get("TPCHECK_BENCH_PROFILE")
        if profile_to:
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            if r == 0:
                prof.enable()
            for _ in range(100):
                fn()
            torch.cuda.synchronize()
            if r == 0:
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                with open(profile_to, "a") as f:
                    f.write(f"==== {name}, 1024 elements, TP {n}, 100 calls\n{text.getvalue()}\n")
            dist.barrier()
    if r == 0:
        count = src.numel()
        ins = [src] + [torch.randn(count, device=dev).bfloat16() for _ in range(n - 1)]
        outs = [torch.empty_like(src) for _ in range(n)]
        stream = torch.cuda.current_stream().cuda_stream
        kernels = {
            # every rank's in-place all-reduce share together: read N inputs, write N outputs
            "all_reduce kernel": lambda: _tpcheck.ring_fold_cuda(
                [x.data_ptr() for x in ins], outs[0].data_ptr(), count, "bf16", -1, 0, count,
                stream, dev.index, extra_outs=[o.data_ptr() for o in outs[1:]]),
            # every rank's reduce-scatter block together: read N inputs, write one
            "reduce_scatter kernel": lambda: _tpcheck.ring_fold_cuda(
                [x.data_ptr() for x in ins], outs[0].data_ptr(), count, "bf16", 1, 0, count,
                stream, dev.index),
        }
        saved = os.environ.get("TPCHECK_REDUCE_VECTOR")
        for vector in ("1", "0"):  # the vector path (default), and one element per thread
            os.environ["TPCHECK_REDUCE_VECTOR"] = vector
            for name, fn in kernels.items():
                out[name + (" (scalar)" if vector == "0" else "")] = \
                    seconds_per_call(fn, a.iters, group=False) * 1e3
        if saved is None:
            del os.environ["TPCHECK_REDUCE_VECTOR"]
        else:
            os.environ["TPCHECK_REDUCE_VECTOR"] = saved
        del ins, outs
    dist.barrier()
    return out


def host_side(a, colls):
    """Whether the 64 MiB calls are host-bound: the host's time to issue `iters` calls
    (from a common start until this rank's last call returns, no synchronization in
    between) next to the synchronized time per call; and, with TPCHECK_BENCH_PROFILE, rank
    0's profile of those calls (a CUDA call that blocks shows as its own time there)."""
    import torch
    import torch.distributed as dist

    out = {}
    profile_to = os.environ.get("TPCHECK_BENCH_PROFILE")
    for name, (fn, _) in colls.items():
        fn()
        torch.cuda.synchronize()
        dist.barrier()
        prof = None
        if profile_to and dist.get_rank() == 0:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            fn()
        issued = time.perf_counter() - t0
        torch.cuda.synchronize()
        done = time.perf_counter() - t0
        if prof is not None:
            import io
            import pstats

            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            with open(profile_to, "a") as f:
                f.write(f"==== {name}, 64 MiB, TP {dist.get_world_size()}, {a.iters} calls\n"
                        f"{text.getvalue()}\n")
        out[f"{name} 64 MiB issued"] = issued / a.iters * 1e3
        out[f"{name} 64 MiB done"] = done / a.iters * 1e3
        dist.barrier()
    return out


# ---- driver ------------------------------------------------------------------------------------
MPS = []  # the launcher's MPS flag: none (its default), --mps or --no-mps
MODE = []  # the launcher's first line (which MPS mode ran and why), per distinct line


def launch(n, args, env=None):
    cmd = [sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), *MPS, "--", sys.executable,
           HERE, *args]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    first = (p.stderr.splitlines() or [""])[0]
    if first.startswith("tpcheck emulate: ") and first not in MODE:
        MODE.append(first)
    for line in p.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1]), wall
    raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def driver(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--quick", action="store_true", help="small MLP, 3 iterations (a smoke test)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--mps", dest="flag", action="store_const", const="--mps",
                      help="launch with `tpcheck emulate --mps` (MPS even where no GPU is shared)")
    mode.add_argument("--no-mps", dest="flag", action="store_const", const="--no-mps",
                      help="launch with `tpcheck emulate --no-mps` (ranks take turns on the GPU)")
    p.add_argument("--parts", nargs="+", default=["mlp", "coll", "launch"],
                   choices=["mlp", "coll", "launch"], help="what to measure (default: all)")
    a = p.parse_args(argv)
    if a.flag:
        MPS.append(a.flag)
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    # TPCHECK_COMMIT: the commit when the tree is a copy without its history (the GPU machine).
    commit = os.environ.get("TPCHECK_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(HERE)).stdout.strip()
    size = ["--hidden", "512", "--ffn", "2048", "--tokens", "512", "--iters", "3"] if a.quick else []
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"## tpcheck emulate {a.flag or '(default launch)'} ({now:%Y-%m-%dT%H:%MZ}, {gpu}, "
          f"commit {commit})\n")
    if "mlp" in a.parts:
        mlp(a, size)
    if "coll" in a.parts:
        collectives(a)
    if "launch" in a.parts:
        launch_overhead()
    print("\nlaunch mode: " + " / ".join(m.replace("tpcheck emulate: ", "") for m in MODE))


def mlp(a, size):
    base, _ = launch(1, ["--worker", "mlp", *size])
    print("| MLP step (bf16 fwd+bwd) | TP | tpcheck ms | x TP 1 | gloo ms | gloo x TP 1 |")
    print("|---|---|---|---|---|---|")
    print(f"| TP 1 | 1 | {base['step_ms']:.2f} | 1.00 | | |")
    for n in a.tp:
        for sp in (False, True):
            extra = ["--sp"] if sp else []
            ours, _ = launch(n, ["--worker", "mlp", *size, *extra])
            gloo, _ = launch(n, ["--worker", "mlp", "--backend", "gloo", *size, *extra])
            print(f"| {'SP' if sp else 'TP'} | {n} | {ours['step_ms']:.2f} | "
                  f"{ours['step_ms'] / base['step_ms']:.2f} | {gloo['step_ms']:.2f} | "
                  f"{gloo['step_ms'] / base['step_ms']:.2f} |")


def collectives(a):
    print("\n| collective, 64 MiB bf16 per rank | TP | ms | ideal ms | fraction of ideal |")
    print("|---|---|---|---|---|")
    for n in a.tp:
        res, _ = launch(n, ["--worker", "coll", "--iters", "3" if a.quick else "10"])
        for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"):
            c = res[name]
            print(f"| {name} | {n} | {c['ms']:.2f} | {c['ideal_ms']:.2f} | {c['fraction']:.2f} |")
        print(f"| (copy bandwidth {res['copy_GBps']:.0f} GB/s, read + write) | {n} | | | |")
        print(f"\nTP {n} breakdown (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in res["breakdown"].items()))


def launch_overhead():
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write("import torch.distributed\n")
        script = f.name
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", "8", *MPS, "--", sys.executable,
                    "-c", "import torch.distributed"], capture_output=True)
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
                    script], capture_output=True)
    theirs = time.perf_counter() - t0
    os.unlink(script)
    print(f"\nlaunch of 8 ranks importing torch.distributed: emulate {ours:.2f} s, torchrun "
          f"{theirs:.2f} s ({ours / theirs:.2f}x)")


if __name__ == "__main__":
    if any(x.startswith("--worker") for x in sys.argv[1:]):
        worker(sys.argv[1:])
    else:
        driver(sys.argv[1:])

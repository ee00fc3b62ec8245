"""tpcheck.compare against torch.testing.assert_close on the same tensors (issue 15).

Both judge a 1 GiB f32 `sharded` tensor against a 1 GiB f32 `single` one (sharded =
single · (1 + 1e-7·noise), so every element differs a little and both pass); tpcheck
computes more (the reference's argmax, the values there, the norm-wise difference, the
allclose count, the bit-difference count, NaN/Inf counts) in one pass; torch computes
isclose and its mismatch statistics. With --truth, tpcheck also judges both against a
2 GiB f64 truth (the "truth" policy); torch has no counterpart.

The memory bandwidth is measured in the same run, on the same device: a read-only pass
(torch.sum over a 1 GiB f32 tensor) and a copy (1 GiB read + 1 GiB written). compare's
figure is the bytes it must read (2 GiB, + 2 GiB with --truth) over its time.

    python bench/compare_bench.py --device cpu       # records the CPU row
    python bench/compare_bench.py --device cuda      # the GPU machine (PyTorch there)

Each figure is the median of --repeat timed runs after one warm-up (CUDA: synchronized).
"""

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time

import torch

import tpcheck


def timed(fn, device, repeat):
    def once():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()  # warm-up (allocations, lazy init)
    return statistics.median(once() for _ in range(repeat))


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gib", type=float, default=1.0, help="size of each f32 tensor")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--truth", action="store_true", help="also time the truth policy (f64 truth)")
    args = ap.parse_args()

    dev = args.device
    n = int(args.gib * (1 << 30)) // 4
    g = torch.Generator(device=dev).manual_seed(0)
    single = torch.randn(n, generator=g, device=dev, dtype=torch.float32)
    sharded = single * (1 + 1e-7 * torch.randn(n, generator=g, device=dev, dtype=torch.float32))
    rtol, atol = 1e-5, 1e-6
    gib = n * 4 / (1 << 30)

    read_s = timed(lambda: single.sum(), dev, args.repeat)
    scratch = torch.empty_like(single)
    copy_s = timed(lambda: scratch.copy_(single), dev, args.repeat)
    del scratch
    read_bw = n * 4 / read_s / 1e9
    copy_bw = 2 * n * 4 / copy_s / 1e9

    torch_s = timed(lambda: torch.testing.assert_close(sharded, single, rtol=rtol, atol=atol),
                    dev, args.repeat)
    v = tpcheck.compare(single, sharded, policy="allclose", rtol=rtol, atol=atol)
    assert v, v.reason
    tp_s = timed(lambda: tpcheck.compare(single, sharded, policy="allclose", rtol=rtol, atol=atol),
                 dev, args.repeat)
    rows = [("torch.testing.assert_close", torch_s, 2 * n * 4),
            ("tpcheck.compare (allclose, full statistics)", tp_s, 2 * n * 4)]
    if args.truth:
        truth = single.double()
        truth_s = timed(lambda: tpcheck.compare(single, sharded, truth, reduction_length=1), dev,
                        args.repeat)
        rows.append(("tpcheck.compare (truth policy, + f64 truth)", truth_s, 2 * n * 4 + n * 8))

    if dev == "cuda":
        machine = torch.cuda.get_device_name()
    else:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    print(f"{when}, {dev}: {machine}, torch {torch.__version__}, commit {commit()}, "
          f"load {os.getloadavg()[0]:.1f}, {gib:.2f} GiB per f32 tensor, median of {args.repeat}")
    print(f"bandwidth measured now: read {read_bw:.1f} GB/s (sum), copy {copy_bw:.1f} GB/s (read + written)")
    print("| what | time | bytes read / time | of the read bandwidth | vs torch |")
    print("|---|---|---|---|---|")
    for name, s, nbytes in rows:
        bw = nbytes / s / 1e9
        print(f"| {name} | {s * 1e3:.1f} ms | {bw:.1f} GB/s | {100 * bw / read_bw:.0f}% | "
              f"{torch_s / s:.2f}× |")


if __name__ == "__main__":
    main()

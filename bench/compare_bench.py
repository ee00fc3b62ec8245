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

With --compare-tp it times tpcheck.torch.compare_tp instead (issue 33: goal <= 5 s at TP 8
on one H200): for each --tp size, `python -m tpcheck emulate -n N -- python
examples/judge_megatron_mlp.py` on the column -> GELU -> row parallel MLP (default hidden
4096, ffn 16384, 4096 tokens on CUDA, every rank on the one GPU; hidden 64, ffn 256, 64
tokens on the CPU), --repeat calls per launch, each from a common start until every rank
has its report. The first call of a launch includes one-time costs (probe factors, cuBLAS
setup); the table shows it and the median of the others.

    python bench/compare_bench.py --compare-tp --device cuda --repeat 3
    python bench/compare_bench.py --compare-tp --device cpu --tp 2 4    # small, to try it
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


def compare_tp_bench(args):
    """compare_tp under `tpcheck emulate` at each TP size: one launch each, its calls timed
    by examples/judge_megatron_mlp.py (the lines "compare_tp: X s" / "compare_tp call i: X s")."""
    import re
    import sys
    cuda = args.device == "cuda"
    hidden = args.hidden or (4096 if cuda else 64)
    ffn = args.ffn or (16384 if cuda else 256)
    tokens = args.tokens or (4096 if cuda else 64)
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "examples", "judge_megatron_mlp.py")
    env = dict(os.environ)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the example takes the GPU when it sees one
    rows = []
    for n in args.tp:
        mps = ["--mps"] if args.mps else []
        cmd = [sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), *mps, "--", sys.executable, example,
               "--hidden", str(hidden), "--ffn", str(ffn), "--tokens", str(tokens),
               "--repeat", str(args.repeat)]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        launch_s = time.perf_counter() - t0
        times = [float(x) for x in re.findall(r"compare_tp(?: call \d+)?: ([0-9.]+) s", run.stdout)]
        model = re.search(r"error model: (.*)", run.stdout)
        if run.returncode != 0 or not times:
            raise SystemExit(f"TP {n}: the launch failed (exit {run.returncode}); expected the "
                             f"example's 'compare_tp: X s' line. Output tail:\n"
                             f"{(run.stdout + run.stderr)[-3000:]}")
        if model:  # the part that says where u came from
            import ast
            m = ast.literal_eval(model.group(1))
            model_text = (f"math {m.get('math')} from {m.get('math_source')}, "
                          f"GEMM classes {m.get('gemm_classes')}")
        else:
            model_text = "?"
        rows.append((n, times, launch_s, model_text))
    dev = torch.cuda.get_device_name() if cuda else f"CPU, {os.cpu_count()} cores"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    print(f"{when}, compare_tp under tpcheck emulate on {dev}, torch {torch.__version__}, "
          f"commit {commit()}, load {os.getloadavg()[0]:.1f}; MLP hidden {hidden}, ffn {ffn}, "
          f"{tokens} tokens, float32, {args.repeat} call(s) per launch")
    print("| TP | first call | median of the later calls | whole launch | u (rank 0's error model) |")
    print("|---|---|---|---|---|")
    for n, times, launch_s, model in rows:
        later = f"{statistics.median(times[1:]):.2f} s" if len(times) > 1 else "–"
        print(f"| {n} | {times[0]:.2f} s | {later} | {launch_s:.1f} s | {model} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gib", type=float, default=1.0, help="size of each f32 tensor")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--truth", action="store_true", help="also time the truth policy (f64 truth)")
    ap.add_argument("--compare-tp", action="store_true",
                    help="time tpcheck.torch.compare_tp under tpcheck emulate instead")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="TP sizes (--compare-tp)")
    ap.add_argument("--hidden", type=int, default=0, help="MLP hidden size (--compare-tp)")
    ap.add_argument("--ffn", type=int, default=0, help="MLP ffn size (--compare-tp)")
    ap.add_argument("--tokens", type=int, default=0, help="tokens (--compare-tp)")
    ap.add_argument("--mps", action="store_true", help="launch with `tpcheck emulate --mps` (--compare-tp)")
    args = ap.parse_args()
    if args.compare_tp:
        compare_tp_bench(args)
        return

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
        truth_s = timed(lambda: tpcheck.compare(single, sharded, truth, reduction_length=1,
                                                tp_size=1), dev, args.repeat)
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

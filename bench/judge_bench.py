#!/usr/bin/env python3
"""What tpcheck.torch.truth costs next to the computation it checks: the MLP of the
emulate benchmark (hidden 4096, ffn 16384, 4096 tokens; Linear → GELU → Linear, bf16),
measured in one process on one device:

  * f64 fwd+bwd   a float64 copy of the module, forward and backward once (the reference
                  an expert would write by hand: `copy.deepcopy(m).double()`);
  * truth         tpcheck.torch.truth(m, x, grad_output=dy, probe=False): the same under
                  the dispatch mode that refuses non-f64 results (its overhead alone);
  * truth+probe   probe=True: a second f64 run with every op's output perturbed (the
                  noise floor), the issue's goal being at most 3x the f64 fwd+bwd.

    python3 bench/judge_bench.py [--device cuda] [--hidden 4096 --ffn 16384 --tokens 4096]

Each figure is the median of --iters runs after one warm-up (the probe's factor cache
filled). Prints a markdown table with date, device, torch version.
"""
import argparse
import copy
import datetime
import statistics
import time

import torch

from tpcheck.torch import truth


def timed(fn, iters, sync):
    fn()  # warm-up: kernels loaded, caches filled
    out = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(a.hidden, a.ffn), torch.nn.GELU(),
                            torch.nn.Linear(a.ffn, a.hidden)).to(dev, torch.bfloat16)
    x = torch.randn(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16)

    def f64_fwd_bwd():
        m64 = copy.deepcopy(m).double()
        x64 = x.double().requires_grad_()
        m64(x64).backward(dy.double())

    t_ref = timed(f64_fwd_bwd, a.iters, sync)
    t_truth = timed(lambda: truth(m, x, grad_output=dy, probe=False), a.iters, sync)
    t_probe = timed(lambda: truth(m, x, grad_output=dy, probe=True), a.iters, sync)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"## tpcheck.torch.truth ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, "
          f"{name}, torch {torch.__version__}; hidden {a.hidden}, ffn {a.ffn}, tokens "
          f"{a.tokens}, median of {a.iters})\n")
    print("| what | ms | x f64 fwd+bwd |\n|---|---|---|")
    for what, t in (("f64 fwd+bwd (deepcopy + .double())", t_ref), ("truth, probe=False", t_truth),
                    ("truth, probe=True", t_probe)):
        print(f"| {what} | {1e3 * t:.1f} | {t / t_ref:.2f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""write_results.py — turns one run of the benchmarks into rows of bench/RESULTS.md.

Called by scripts/bench.sh with the Google Benchmark JSON files of every bench program
and the suite's timings. Appends one block of table rows (creating the file with its
header when missing); everything already in the file is kept, so RESULTS.md is a
history. Each row: date (UTC), machine, commit, load average (start -> end), benchmark,
figure, reference figure, ratio.

Reference figures are measured in the same run: the GEMM rates are compared with the
OpenBLAS sgemm benchmark at the same thread count (the faster of its two runs, which
bracket the layer runs), the non-GEMM time at hidden 1024 with the same at hidden 512,
the suite with its 60 s goal.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

HEADER = """# Benchmark results

Rows are appended by `scripts/bench.sh` (Release build, every `bench/*_bench.cpp` plus
the `te` suite at TP 4). The reading notes above the table are written by hand; the
table is the record. "load" is the 1/5/15-minute load average at the start and end of
the run: above the core count the machine was shared and the figures are pessimistic.

| date (UTC) | machine | commit | load (start -> end) | benchmark | figure | reference | ratio |
|---|---|---|---|---|---|---|---|
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, type=Path)
    p.add_argument("--date", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--load", required=True)
    p.add_argument("--suite-times", type=Path)
    p.add_argument("--suite-summary", default="")
    p.add_argument("--full-suite-times", type=Path)
    p.add_argument("--full-suite-summary", default="")
    p.add_argument("bench_json", nargs="*", type=Path)
    return p.parse_args()


def load_runs(paths):
    """Every benchmark run as (family, numeric args, record), in file order."""
    runs = []
    for path in paths:
        for b in json.loads(path.read_text())["benchmarks"]:
            if b.get("error_occurred"):
                print(f"warning: {b['name']}: {b.get('error_message')}", file=sys.stderr)
                continue
            parts = b["name"].split("/")
            args = tuple(int(x) for x in parts[1:] if re.fullmatch(r"\d+", x))
            runs.append((parts[0], args, b))
    return runs


def ms(b):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale


def gflops(rate):
    return f"{rate / 1e9:.1f} GFLOP/s"


def main():
    a = parse_args()
    runs = load_runs(a.bench_json)
    rows = []

    def row(benchmark, figure, reference="—", ratio="—"):
        rows.append(f"| {a.date} | {a.machine} | {a.commit} | {a.load} | {benchmark} | "
                    f"{figure} | {reference} | {ratio} |")

    # The reference: the faster of the sgemm runs per (shape, threads).
    sgemm = {}
    for family, args, b in runs:
        if family == "BM_OpenblasSgemm":
            sgemm.setdefault(args, []).append(b["rate"])
    for args, rates in sgemm.items():
        m, n, k, t = args
        row(f"OpenBLAS sgemm {m}×{n}×{k} (A·Bᵀ), {t} thread(s)",
            gflops(max(rates)) + (f" (runs: {', '.join(gflops(r) for r in rates)})"
                                  if len(rates) > 1 else ""))

    def reference_rate(threads, shape=(2048, 4096, 1024)):
        rates = sgemm.get(shape + (threads,))
        return max(rates) if rates else None

    layers = {}
    for family, args, b in runs:
        if family == "BM_BackendGemm":
            # Compared with the sgemm run right after it (same shape and threads), not the
            # faster bracketing one: a wrapper overhead is a small difference, and the load
            # on a shared machine changes between the start and the end of the program.
            m, n, k, t = args
            rates = sgemm.get((m, n, k, t))
            ref = rates[-1] if rates else None
            row(f"Backend::gemm fp32 {m}×{n}×{k} (copies + store included), {t} thread(s)",
                gflops(b["rate"]), f"adjacent sgemm run {gflops(ref)}" if ref else "—",
                f"{100 * b['rate'] / ref:.0f}%" if ref else "—")
        elif family == "BM_TransformerLayer":
            hidden, ffn, heads, seq, batch, t = args
            layers[(hidden, t)] = b
            name = f"TransformerLayer fwd+bwd h{hidden} ffn{ffn} heads{heads} s{seq} b{batch}, {t} thread(s)"
            row(name + ": time per iteration",
                f"{ms(b):.2f} ms mean, {b['t_min_ms']:.2f} ms fastest (ledger GEMMs {b['gemm_flops'] / 1e9:.3f} GFLOP, of "
                f"which attention's products {b['attn_flops'] / 1e9:.3f} GFLOP)")
            ref = reference_rate(t)
            for counter, what in (("gemm_rate", "GEMM rate inside Backend::gemm"),
                                  ("gemm_rate_wall", "GEMM FLOPs / whole iteration time")):
                row(f"{name}: {what}", gflops(b[counter]),
                    f"sgemm 2048×4096×1024 {gflops(ref)}" if ref else "—",
                    f"{100 * b[counter] / ref:.0f}%" if ref else "—")
            split = ", ".join(f"{op} {b['t_' + op + '_ms']:.2f}"
                              for op in ("gemm", "attn", "act", "bias", "norm", "elem", "other"))
            row(f"{name}: time split (ms)", split)

    # Non-GEMM scaling with the hidden size at the same tokens (and head dim). Thread CPU
    # time of the calling thread: the non-GEMM ops run there alone, so other processes on
    # the cores do not inflate it (wall-time factors are given for comparison).
    ops = ("attn", "act", "bias", "norm", "elem")
    for (hidden, t), big in sorted(layers.items()):
        small = layers.get((hidden // 2, t))
        if hidden < 1024 or small is None:
            continue
        # Per op: time factor (work factor, from the elements handed to the op).
        per_op = ", ".join(f"{op} ×{big['cpu_' + op + '_ms'] / small['cpu_' + op + '_ms']:.2f} "
                           f"(elements ×{big['n_' + op] / small['n_' + op]:.2f})"
                           for op in ops if small["cpu_" + op + "_ms"] > 0 and small["n_" + op] > 0)
        wall = big["t_nongemm_min_ms"] / small["t_nongemm_min_ms"]
        row(f"non-GEMM CPU time (thread CPU, fastest iteration), hidden {hidden} vs "
            f"{hidden // 2} (same tokens and head dim), {t} thread(s)",
            f"{big['cpu_nongemm_min_ms']:.1f} ms", f"{small['cpu_nongemm_min_ms']:.1f} ms",
            f"×{big['cpu_nongemm_min_ms'] / small['cpu_nongemm_min_ms']:.2f} (linear ×2, "
            f"quadratic ×4; per op: {per_op}; wall time ×{wall:.2f})")

    suites = [(a.suite_times, a.suite_summary,
               "`tpcheck run --suite te --tp 4 --quiet` (te suite, 118 cases × single/sharded/truth), wall"),
              (a.full_suite_times, a.full_suite_summary,
               "`tpcheck run --suite full --tp 4 --quiet` (full suite × single/sharded/truth), wall")]
    for times_path, summary, name in suites:
        if not times_path or not times_path.exists():
            continue
        runs_ = [line.split() for line in times_path.read_text().splitlines() if line]
        times = [float(t) for t, rc in runs_ if int(rc) in (0, 1)]
        broken = [rc for _, rc in runs_ if int(rc) not in (0, 1)]
        if broken:
            row(name, f"not timed: {len(broken)} of {len(runs_)} runs ended with exit status "
                f"{', '.join(broken)} (not a verdict: a crash or an error)", "goal 60 s")
        if times:
            best = min(times)
            row(name, f"{best:.2f} s (median {statistics.median(times):.2f} s of {len(times)}; "
                f"\"{summary}\")", "goal 60 s", f"{100 * best / 60:.0f}% of the goal")

    if not a.results.exists():
        a.results.write_text(HEADER)
    with a.results.open("a") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

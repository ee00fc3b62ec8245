#!/usr/bin/env python3
"""Runs a suite once per mutation and prints, per TP size, how many cases each policy
fails: the mutation tables of the README and docs/POLICIES.md.

Usage: scripts/mutation_table.py [build/tpcheck] [--suite te|full] [--mutations a,b]
                                 [--recipe R] [--steps N] [--jobs J] [TP ...]
The suite is always passed to `tpcheck run` explicitly (default: te, the reference's
matrix the README's first table is about); `--suite full` gives the full suite's table.
A mutation that `tpcheck mutations` lists as "(needs --recipe R --steps N)" is left out
unless --recipe R is given (docs/QUANTIZATION.md's table: --recipe fp8 --steps 1 and 2).
--jobs J runs J suite runs at once (each run's ranks are threads of one process; on the GPU
machine the runs share the GPU); the table is the same, in the same order.
"""
import argparse
import concurrent.futures
import json
import re
import subprocess
import tempfile

POLICIES = ["te", "allclose", "truth", "bitwise"]
NEEDS_RE = re.compile(r" \(needs --recipe (\S+) --steps (\d+)\)$")


def failures(tpcheck, suite, tp, mutation, extra=()):
    """Failing cases per policy and the case count; (None, message) when the run wrote no
    report (an error: the table shows its last line instead of counts)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run = subprocess.run([tpcheck, "run", "--suite", suite, "--tp", str(tp), "--mutate",
                              mutation, "--quiet", "--json", f.name, *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             check=False)
        try:
            report = json.load(open(f.name))
        except json.JSONDecodeError:
            # The message, not the "(at file:line)" line tpcheck prints after it.
            lines = [l.strip() for l in run.stderr.splitlines()
                     if l.strip() and not l.strip().startswith("(at ")]
            last = (lines or ["no output"])[-1]
            return None, f"error (rc {run.returncode}): {last[:160]}"
    cases = report["cases"]
    return {p: sum(c["verdicts"][p]["status"] == "fail" for c in cases) for p in POLICIES}, len(cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tpcheck", nargs="?", default="build/tpcheck")
    ap.add_argument("tps", nargs="*", type=int)
    ap.add_argument("--suite", default="te", choices=["te", "full"])
    ap.add_argument("--mutations", default="all", help="comma list, or 'all'")
    ap.add_argument("--recipe", default=None, help="passed to tpcheck run")
    ap.add_argument("--steps", type=int, default=None, help="passed to tpcheck run")
    ap.add_argument("--jobs", type=int, default=1, help="suite runs at once")
    args = ap.parse_intermixed_args()  # TP sizes may follow the options
    tps = args.tps or [2, 4, 8]
    extra = (["--recipe", args.recipe] if args.recipe else []) + (
        ["--steps", str(args.steps)] if args.steps else [])
    listing = subprocess.run([args.tpcheck, "mutations"], capture_output=True, text=True, check=True)
    mutations = []
    for line in listing.stdout.splitlines():
        name, description = line.split()[0], line.split(None, 1)[1]
        needs = NEEDS_RE.search(description)
        if needs and needs.group(1) != args.recipe:
            continue  # refused without its recipe
        mutations.append((name, NEEDS_RE.sub("", description)))
    if args.mutations != "all":
        wanted = args.mutations.split(",")
        mutations = [m for m in mutations if m[0] in wanted]
    print(f"suite {args.suite}" + (f", {' '.join(extra)}" if extra else ""))
    header = "| mutation | what it breaks | " + " | ".join(f"TP {tp}: te / allclose / truth" for tp in tps) + " |"
    print(header)
    print("|" + "---|" * (2 + len(tps)))
    rows = [("none", "no bug: false alarms")] + mutations
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = {(name, tp): pool.submit(failures, args.tpcheck, args.suite, tp, name, extra)
                for name, _ in rows for tp in tps}
        for name, description in rows:
            cells = []
            for tp in tps:
                counts, total = runs[(name, tp)].result()
                if counts is None:
                    cells.append(total.replace("|", "/"))
                    continue
                cells.append(" / ".join(str(counts[p]) for p in ["te", "allclose", "truth"]) + f" of {total}")
            print(f"| `{name}` | {description} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

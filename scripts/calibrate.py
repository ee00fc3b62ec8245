#!/usr/bin/env python3
"""Measures the policies at scale: false alarms and detection over a grid of suite runs.

Every grid point is one `tpcheck run --json` of a whole suite (or of --filter):
suite x seed x TP size x --cpu-gemm class x size set x mutation ("none" measures false
alarms). The suite is always passed explicitly: --suites te (the default) is the grid
the figures in docs/POLICIES.md were first measured on; --suites te,full adds the `full`
suite. The mutations of paths only the full suite reaches (FULL_ONLY) run on it alone
(the te suite cannot see them; tests/suite/mutation_test.cpp shows that).
The runs go to --jobs worker processes; the results are aggregated per policy into a
markdown file (--out) and one summary line on stdout.

Policies reported: `truth`, `te` at the reference's atol 1e-5 and at the loosened 5e-5
(the program's default table), `allclose`. `te` at 1e-5 is recomputed from each tensor's
statistics in the JSON report (judged at the argmax element: fails iff rel > rtol and
abs > atol), so one run per grid point serves both te columns.

Needs only the built program and python3's standard library, so a bigger machine can
run the full grid from a plain build:

    scripts/calibrate.py --tpcheck build/tpcheck --jobs 32 --out calibration.md
    scripts/calibrate.py --sample --jobs 2 --out /tmp/sample.md --check   # CI (ctest)

--check exits 1 unless `truth` has no false alarm and catches every mutation in every
run of the grid (the property docs/POLICIES.md claims). Seeds: the grid uses 2001..,
the sample 3001..; both are disjoint from the calibration seeds 1-20 that set the truth
policy's constants and from the no-false-alarm test's seeds (docs/POLICIES.md).
"""
import argparse
import collections
import concurrent.futures
import datetime
import json
import os
import random
import platform
import subprocess
import sys
import tempfile
import time

SIZE_SETS = {
    # the reference suite's sizes (heads raised to the TP size above 4)
    "default": [],
    "large": ["--hidden", "256", "--ffn", "1024", "--heads", "8", "--seq", "32", "--batch", "8"],
    # no power of two: head dim 15, ffn/8 = 9, batch 24, seq 12 per rank
    "odd": ["--hidden", "120", "--ffn", "72", "--heads", "8", "--seq", "12", "--batch", "24"],
}
POLICIES = ["truth", "te@1e-5", "te@5e-5", "allclose"]
# The grid's GEMM-class axis on each backend. On the CPU the class is chosen by
# --cpu-gemm (the model of the GPU's choices); on the GPU cuBLASLt chooses, within what
# --tf32 and --gemm-impl allow: fp32 = CUBLAS_COMPUTE_32F (no TF32), tf32 = TF32 tensor
# cores only, auto = cuBLASLt's own per-shape choice among TF32 HMMA and FP32 FMA (what
# --cpu-gemm auto models). f16/bf16 GEMMs are tensor-core products under all three.
GEMM_FLAGS = {
    "cpu": {g: ["--cpu-gemm", g] for g in ("fp32", "tf32", "auto")},
    "cuda": {"fp32": ["--tf32", "off"],
             "tf32": ["--tf32", "on", "--gemm-impl", "tensor-core"],
             "auto": ["--tf32", "on", "--gemm-impl", "any"]},
}
FULL_ONLY = {"gated-fc1-one-block", "qkv-one-block", "gqa-wrong-group", "window-offset"}
TE_ATOL_REFERENCE = 1e-5


def gpu_description():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()
        if not out:
            return "no GPU"
        name, driver = out[0].rsplit(", ", 1)
        return f"{len(out)} × {name}, driver {driver}"
    except (OSError, subprocess.CalledProcessError):
        return "no nvidia-smi"


def machine_description():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + (" (with local changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tensor_fails_te(t, atol):
    """The reference rule at one tensor with `atol` (rtol from the report's table)."""
    s = t["statistics"]
    if s.get("sharded_nonfinite", 0) or s.get("single_nonfinite", 0):
        return True
    tol = s.get("tolerance")
    if tol is None:
        return True
    rel, diff = s["rel_at_max"], s["max_abs_diff"]
    if isinstance(rel, str) or isinstance(diff, str):  # "nan" / "inf"
        return True
    return rel > tol["rtol"] and diff > min(atol, tol["atol"])


def case_verdicts(case):
    """Pass/fail (True = fail) of one case under every reported policy."""
    v = case["verdicts"]
    te5 = v["te"]["status"] == "fail"
    return {
        "truth": v["truth"]["status"] == "fail",
        "te@5e-5": te5,
        # atol 1e-5 is stricter than 5e-5: whatever fails there fails here too
        "te@1e-5": te5 or any(tensor_fails_te(t, TE_ATOL_REFERENCE) for t in case["tensors"]),
        "allclose": v["allclose"]["status"] == "fail",
    }


def truth_failure_detail(case):
    for t in case["tensors"]:
        if t["verdicts"]["truth"]["status"] == "fail":
            return f'{case["id"]} {t["name"]}: {t["verdicts"]["truth"]["reason"]}'
    return case["id"]


def run_point(tpcheck, point, extra, backend, deadline=None):
    if deadline is not None and time.monotonic() > deadline:
        return {"point": point, "skipped": True}
    seed, tp, gemm, size, mutation, suite = point
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.json")
        # The backend is always explicit: on a machine with a GPU `run` would otherwise
        # choose the GPU.
        cmd = [tpcheck, "run", "--backend", backend, "--suite", suite, "--tp", str(tp),
               "--seed", str(seed)] + GEMM_FLAGS[backend][gemm] + [
               "--mutate", mutation, "--quiet", "--json", path] + SIZE_SETS[size] + extra
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if proc.returncode not in (0, 1) or not os.path.exists(path):
            return {"point": point, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}",
                    "command": " ".join(cmd)}
        with open(path) as f:
            report = json.load(f)
    failed = {p: [] for p in POLICIES}
    truth_details = []
    for case in report["cases"]:
        for p, fail in case_verdicts(case).items():
            if fail:
                failed[p].append(case["id"])
        if case["verdicts"]["truth"]["status"] == "fail" and mutation == "none":
            truth_details.append(truth_failure_detail(case))
    return {"point": point, "backend": backend, "cases": len(report["cases"]), "failed": failed,
            "truth_details": truth_details, "seconds": seconds,
            "version": report["environment"].get("tpcheck_version", "?")}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tpcheck", default="build/tpcheck", help="the built program")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    ap.add_argument("--out", required=True, help="markdown file to write")
    ap.add_argument("--sample", action="store_true",
                    help="a small grid for CI: a few runs per mutation (well under 5 min on 2 cores)")
    ap.add_argument("--seeds", type=int, default=7, help="seeds per grid cell (full grid)")
    ap.add_argument("--first-seed", type=int, default=None)
    ap.add_argument("--tp", default="2,4,8")
    ap.add_argument("--suites", default="te", help="comma list of te, full (grid only)")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                    help="cpu (the grid of docs/POLICIES.md) or cuda (the same grid with "
                         "cuBLASLt choosing the GEMMs; --cpu-gemm names then map to --tf32 / "
                         "--gemm-impl, see GEMM_FLAGS)")
    ap.add_argument("--cpu-gemm", default="fp32,tf32,auto",
                    help="the GEMM-class axis: fp32, tf32, auto")
    ap.add_argument("--sizes", default="default,large,odd", help=f"of {','.join(SIZE_SETS)}")
    ap.add_argument("--mutations", default="all", help="comma list, or 'all' (from tpcheck mutations)")
    ap.add_argument("--mutation-seeds", type=int, default=None,
                    help="seeds per cell for the mutation runs (default: as --seeds)")
    ap.add_argument("--filter", default=None, help="passed to tpcheck run (case id regex)")
    ap.add_argument("--results", default=None,
                    help="JSON-lines file: each finished run is appended; runs already there "
                         "are not run again (resume, or merge runs made on several machines)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds: start no new run after this long (the table covers what ran)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless truth has 0 false alarms and catches every mutation run")
    return ap.parse_args()


def build_grid(args, mutations):
    tps = [int(x) for x in args.tp.split(",")]
    gemms = args.cpu_gemm.split(",")
    sizes = args.sizes.split(",")
    for s in sizes:
        if s not in SIZE_SETS:
            sys.exit(f"calibrate: unknown size set '{s}'; expected one of {', '.join(SIZE_SETS)}")
    if args.sample:
        # Every TP size and GEMM class without a mutation (default sizes, plus the odd set
        # once); each mutation once, its (TP, GEMM class) rotating through the grid.
        # The full suite: TP 2 and 4 without a mutation (fp32, and tf32 at TP 2), and each
        # full-only mutation there.
        first = args.first_seed or 3001
        grid = [(first, tp, g, "default", "none", "te") for tp in (2, 4, 8)
                for g in ("fp32", "tf32", "auto")]
        grid.append((first, 4, "auto", "odd", "none", "te"))
        grid += [(first, 2, "fp32", "default", "none", "full"),
                 (first, 4, "fp32", "default", "none", "full"),
                 (first, 2, "tf32", "default", "none", "full")]
        cells = [(tp, g) for g in ("fp32", "tf32", "auto") for tp in (2, 4)]
        for i, m in enumerate(mutations):
            tp, g = cells[i % len(cells)]
            grid.append((first + 1 + i, tp, g, "default", m, "full" if m in FULL_ONLY else "te"))
        return grid
    first = args.first_seed or 2001
    mseeds = args.mutation_seeds or args.seeds
    grid = []
    for suite in args.suites.split(","):
        if suite not in ("te", "full"):
            sys.exit(f"calibrate: unknown suite '{suite}'; expected te or full")
        for size in sizes:
            for gemm in gemms:
                for tp in tps:
                    for k in range(args.seeds):
                        grid.append((first + k, tp, gemm, size, "none", suite))
                    for m in mutations:
                        if suite == "te" and m in FULL_ONLY:
                            continue  # te never reaches the path (its blind spot)
                        for k in range(mseeds):
                            grid.append((first + k, tp, gemm, size, m, suite))
    return grid


def pct(a, b):
    return f"{100.0 * a / b:.1f} %" if b else "-"


def write_markdown(args, results, errors, mutations, descriptions, wall):
    ok = [r for r in results if "error" not in r]
    clean = [r for r in ok if r["point"][4] == "none"]
    lines = []
    add = lines.append
    add(f"# Policy calibration: {'sample' if args.sample else 'grid'}\n")
    add(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    add(f"- machine: {machine_description()}"
        + (f"; {gpu_description()}" if args.backend == "cuda" else ""))
    add(f"- commit: {git_commit()}; tpcheck {ok[0]['version'] if ok else '?'}")
    add(f"- command: `{' '.join(sys.argv)}`")
    add(f"- backend: {args.backend}; GEMM-class axis: " + "; ".join(
        f"{g} = `{' '.join(f)}`" for g, f in GEMM_FLAGS[args.backend].items()))
    add(f"- suite runs: {len(ok)} ({len(clean)} without a mutation), {len(errors)} errors; "
        f"wall time {wall:.0f} s with {args.jobs} jobs")
    add(f"- size sets: " + "; ".join(f"{k}: `{' '.join(v) or '(reference sizes)'}`"
                                      for k, v in SIZE_SETS.items()))
    add("")
    add("## False alarms (no mutation)\n")
    add("Suite runs with at least one failing case / runs (failing cases in total).\n")
    add("| suite | size set | cpu-gemm | TP | " + " | ".join(POLICIES) + " |")
    add("|---|---|---|---|" + "---|" * len(POLICIES))
    groups = collections.defaultdict(list)
    for r in clean:
        seed, tp, gemm, size, _, suite = r["point"]
        groups[(suite, size, gemm, tp)].append(r)
    for key in sorted(groups, key=lambda k: (k[0], list(SIZE_SETS).index(k[1]), k[2], k[3])):
        rs = groups[key]
        cells = [f"{sum(bool(r['failed'][p]) for r in rs)} / {len(rs)} "
                 f"({sum(len(r['failed'][p]) for r in rs)})" for p in POLICIES]
        add(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
    cells = [f"**{sum(bool(r['failed'][p]) for r in clean)} / {len(clean)}** "
             f"({sum(len(r['failed'][p]) for r in clean)})" for p in POLICIES]
    add("| all | | | | " + " | ".join(cells) + " |")
    details = [(r["point"], d) for r in clean for d in r["truth_details"]]
    if details:
        add("\n`truth` false alarms:\n")
        for point, d in details:
            add(f"- {point[5]} seed {point[0]} TP {point[1]} {point[2]} {point[3]}: {d}")
    add("\n## Detection (per mutation)\n")
    add("Suite runs in which the policy fails at least one case / runs; in brackets the "
        "fewest cases it failed in one run.\n")
    add("| mutation | suite | " + " | ".join(POLICIES) + " |")
    add("|---|---|" + "---|" * len(POLICIES))
    misses = []
    for m in mutations:
        for suite in ("te", "full"):
            rs = [r for r in ok if r["point"][4] == m and r["point"][5] == suite]
            if not rs:
                continue
            cells = []
            for p in POLICIES:
                caught = sum(bool(r["failed"][p]) for r in rs)
                fewest = min(len(r["failed"][p]) for r in rs)
                cells.append(f"{caught} / {len(rs)} ({fewest})")
            add(f"| `{m}` | {suite} | " + " | ".join(cells) + " |")
            misses += [(m, r["point"]) for r in rs if not r["failed"]["truth"]]
    add("\n`truth`: fewest cases failed in one run, per mutation and TP size (all seeds, "
        "GEMM classes, size sets and suites); the mutation test's minimums derive from these.\n")
    tps = sorted({r["point"][1] for r in ok if r["point"][4] != "none"})
    add("| mutation | " + " | ".join(f"TP {tp}" for tp in tps) + " |")
    add("|---|" + "---|" * len(tps))
    for m in mutations:
        row = []
        for tp in tps:
            rs = [r for r in ok if r["point"][4] == m and r["point"][1] == tp]
            row.append(str(min(len(r["failed"]["truth"]) for r in rs)) if rs else "-")
        add(f"| `{m}` | " + " | ".join(row) + " |")
    if misses:
        add("\n`truth` misses:\n")
        for m, point in misses:
            add(f"- `{m}`: {point[5]} seed {point[0]} TP {point[1]} {point[2]} {point[3]}")
    if errors:
        add("\n## Errors\n")
        for e in errors:
            add(f"- {e['point']}: {e['error']} (`{e['command']}`)")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return details, misses


def main():
    args = parse_args()
    if not os.access(args.tpcheck, os.X_OK):
        sys.exit(f"calibrate: --tpcheck {args.tpcheck} is not an executable (build it first)")
    listing = subprocess.run([args.tpcheck, "mutations"], capture_output=True, text=True, check=True)
    # The grid runs without a recipe, at one step: the mutations of one recipe's code
    # ("(needs --recipe R --steps N)": FP8 delayed scaling's amax bugs) are left out; their
    # detection is tests/suite/steps_test.cpp's and docs/QUANTIZATION.md's table.
    descriptions = {l.split()[0]: l.split(None, 1)[1] for l in listing.stdout.splitlines()
                    if l.strip() and "(needs --recipe " not in l}
    mutations = list(descriptions) if args.mutations == "all" else args.mutations.split(",")
    for m in mutations:
        if m not in descriptions:
            sys.exit(f"calibrate: unknown mutation '{m}'; expected one of {', '.join(descriptions)}")
    grid = build_grid(args, mutations)
    # A fixed shuffle, so a run stopped by --deadline still covers every cell of the grid.
    random.Random(0).shuffle(grid)
    extra = ["--filter", args.filter] if args.filter else []
    start = time.monotonic()
    deadline = start + args.deadline if args.deadline else None
    results, done = [], set()
    if args.results and os.path.exists(args.results):
        with open(args.results) as f:
            for line in f:
                r = json.loads(line)
                r["point"] = tuple(r["point"])
                if len(r["point"]) == 5:  # written before points named their suite: te
                    r["point"] += ("te",)
                if r.get("backend", "cpu") != args.backend:
                    continue
                if "error" not in r and r["point"] in set(grid) and r["point"] not in done:
                    results.append(r)
                    done.add(r["point"])
    todo = [p for p in grid if p not in done]
    sink = open(args.results, "a") if args.results else None
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_point, args.tpcheck, p, extra, args.backend, deadline)
                   for p in todo]
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            r = fut.result()
            if r.get("skipped"):
                continue
            results.append(r)
            if sink:
                sink.write(json.dumps(r) + "\n")
                sink.flush()
            if sys.stderr.isatty():
                print(f"\rcalibrate: {i}/{len(todo)} runs", end="", file=sys.stderr)
    if sink:
        sink.close()
    if sys.stderr.isatty():
        print(file=sys.stderr)
    wall = time.monotonic() - start
    errors = [r for r in results if "error" in r]
    details, misses = write_markdown(args, results, errors, mutations, descriptions, wall)

    ok = [r for r in results if "error" not in r]
    clean = [r for r in ok if r["point"][4] == "none"]
    mutated = [r for r in ok if r["point"][4] != "none"]
    fa = {p: sum(bool(r["failed"][p]) for r in clean) for p in POLICIES}
    caught = sum(bool(r["failed"]["truth"]) for r in mutated)
    print(f"calibrate: {len(ok)} runs ({len(errors)} errors) in {wall:.0f} s; false alarms (runs): "
          + ", ".join(f"{p} {fa[p]}/{len(clean)}" for p in POLICIES)
          + f"; truth caught {caught}/{len(mutated)} mutation runs; written to {args.out}")
    if args.check and (errors or fa["truth"] or misses):
        for point, d in details:
            print(f"truth false alarm: {point[5]} seed {point[0]} TP {point[1]} {point[2]} {point[3]}: {d}")
        for m, point in misses:
            print(f"truth missed {m}: {point[5]} seed {point[0]} TP {point[1]} {point[2]} {point[3]}")
        for e in errors:
            print(f"error: {e['point']}: {e['error']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

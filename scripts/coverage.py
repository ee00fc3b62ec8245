#!/usr/bin/env python3
"""Measured coverage of the sharded code: runs the `full` suite at TP 2 in a coverage
build and reports line and branch coverage of src/layers/ (the layers and tp_ops.cpp, the
communication steps) and of the CPU collectives (src/comm/thread_group.cpp, comm.cpp).

    cmake -S . -B build -G Ninja -DTPCHECK_COVERAGE_PROGRAM=ON   # scripts/test.sh's tree
    cmake --build build --target tpcheck_coverage
    scripts/coverage.py --build build [--out coverage.md]
    scripts/coverage.py --build build --check             # ctest coverage_baseline
    scripts/coverage.py --build build --update-baseline   # after a deliberate change

(A tree of its own with -DTPCHECK_COVERAGE=ON instruments tpcheck itself the same way.)

After the suite, every mutation runs once over MUTATION_CASES (a few full-suite cases
that reach every mutation's path), so the mutations' code is measured too — FP8 delayed
scaling's own (listed "(needs --recipe fp8 --steps 2)") over RECIPE_MUTATION_CASES with
that recipe and steps — and the te suite's Linear, LayerNormLinear and LayerNormMLP cases
under --recipe fp8_cs (the quantized path of Linear).
Branches are gcov's, without exception-only branches (--exclude-throw-branches) and
unreachable ones (--exclude-unreachable-branches), and without the lines holding the
error checks (TPCHECK_CHECK / TPCHECK_CHECK_INPUT: bad input, exercised by tests/layers
and tests/python/test_cli.py; the suite runs only valid configurations). The figure
with every line counted is reported too.
docs/COVERAGE.md explains every branch the suite leaves untaken.

The baseline (tests/coverage/baseline.txt) names each reached branch of src/layers by
file, the line's text, which occurrence of that text in the file, and the branch's index
on the line — not by line number, so edits elsewhere in a file do not disturb it.
--check fails (exit 1) when a baseline branch is no longer reached.
Needs gcovr (Debian package gcovr; scripts/setup.sh installs it).
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "tests", "coverage", "baseline.txt")
LAYERS = "src/layers/"
COLLECTIVES = ("src/comm/thread_group.cpp", "src/comm/comm.cpp")
EXCLUDE_LINES = r".*TPCHECK_CHECK.*"
# Full-suite cases (ids are the same at every TP) that together reach every mutation's
# path: gated fc1, parallel residual with bias; fused QKV blocks with 2·TP groups; a
# sliding window with the sequential residual and bias; row-parallel Linear.
MUTATION_CASES = "|".join([
    r"^TransformerLayer\.sp[01]\.f32\.activation=geglu\+groups=tp\+mask=no_mask\+residual=parallel",
    r"^TransformerLayer\.sp[01]\.bf16\.activation=geglu\+qkv=fused_blocks\+groups=2tp",
    r"^TransformerLayer\.sp[01]\.f32\.activation=swiglu\+mask=window2_3\+residual=post_ln$",
    r"^Linear\.row\.",
])
# The te suite's Linear cases under sequence parallel: a column-parallel input and a
# row-parallel output gradient, each gathered in FP8 under delayed scaling; one with an
# f32 main_grad (the SGD step between the steps zeroes it), one in f16 (its gradient is
# widened for the step); and a LayerNorm, which keeps no delayed-scaling state.
RECIPE_MUTATION_CASES = (r"^Linear\.(column|row)\.sp1\.(default|fuse_wgrad_accumulation=true)$"
                         r"|^Linear\.column\.sp1\.params_dtype=f16$"
                         r"|^LayerNorm\.sp1\.zero_centered_gamma=true$")


def run_suite(build, program, tp):
    for dirpath, _, files in os.walk(build):  # counters from earlier runs
        for f in files:
            if f.endswith(".gcda"):
                os.remove(os.path.join(dirpath, f))
    cmd = [program, "run", "--suite", "full", "--tp", str(tp), "--quiet"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"coverage: `{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-2000:]}")
    summary = proc.stdout.strip().splitlines()[-1]
    # The quantized path of Linear (src/layers/linear.cpp: linear_gemm) under a recipe:
    # fp8_cs at its reference sizes, every layer with a Linear but TransformerLayer (the
    # same Linear code, at many times the cost).
    rcmd = cmd[:2] + ["--suite", "te", "--tp", str(tp), "--quiet", "--recipe", "fp8_cs",
                      "--filter", r"^(Linear|LayerNormLinear|LayerNormMLP)\."]
    r = subprocess.run(rcmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"coverage: `{' '.join(rcmd)}` exited {r.returncode}:\n{r.stdout[-2000:]}"
                 f"{r.stderr[-2000:]}")
    listing = subprocess.run([cmd[0], "mutations"], capture_output=True, text=True, check=True)
    for line in [l for l in listing.stdout.splitlines() if l.strip()]:
        name = line.split()[0]
        needs = re.search(r"\(needs --recipe (\S+) --steps (\d+)\)$", line)
        if needs:
            # A recipe's own bug (FP8 delayed scaling): its recipe, enough steps, and the
            # te suite's sequence-parallel Linear cases (the FP8 all-gather).
            mcmd = cmd[:2] + ["--suite", "te", "--tp", str(tp), "--quiet", "--mutate", name,
                              "--recipe", needs.group(1), "--steps", needs.group(2),
                              "--filter", RECIPE_MUTATION_CASES]
        else:
            mcmd = cmd[:2] + ["--suite", "full", "--tp", str(tp), "--quiet", "--mutate", name,
                              "--filter", MUTATION_CASES]
        m = subprocess.run(mcmd, capture_output=True, text=True)
        if m.returncode not in (0, 1):  # 1: the mutation was caught, as it should be
            sys.exit(f"coverage: `{' '.join(mcmd)}` exited {m.returncode}: {m.stderr[-1000:]}")
    return time.monotonic() - start, summary


def gcovr_json(build, exclude=True):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cov.json")
        cmd = ["gcovr", "--root", ROOT, "--object-directory", build, "--filter", "src/layers/",
               "--filter", "src/comm/", "--exclude-throw-branches",
               "--exclude-unreachable-branches", "--json", out]
        if exclude:
            cmd += ["--exclude-lines-by-pattern", EXCLUDE_LINES]
        # gcovr reads --filter relative to the working directory: run it from the root
        # (ctest starts this script in the build tree).
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        with open(out) as f:
            return json.load(f)


def branch_records(report):
    """Per file: a list of (key, reached, line number, line text) for every branch."""
    out = {}
    for entry in report["files"]:
        path = entry["file"]
        with open(os.path.join(ROOT, path)) as f:
            text = f.read().splitlines()
        seen = collections.Counter()
        records = []
        for line in sorted(entry["lines"], key=lambda l: l["line_number"]):
            if line.get("gcovr/noncode") or not line["branches"]:
                continue
            n = line["line_number"]
            src = " ".join(text[n - 1].split())
            occurrence = seen[src]
            seen[src] += 1
            for b, branch in enumerate(line["branches"]):
                key = f"{path}|{src}|{occurrence}#{b}"
                records.append((key, branch["count"] > 0, n, src))
        # the same text twice in a file: keep occurrences counted over branch lines only
        out[path] = records
    return out


def line_counts(report):
    out = {}
    for entry in report["files"]:
        lines = [l for l in entry["lines"] if not l.get("gcovr/noncode")]
        out[entry["file"]] = (sum(l["count"] > 0 for l in lines), len(lines))
    return out


def summarize(paths, lines, branches):
    lc = sum(lines[p][0] for p in paths if p in lines)
    lt = sum(lines[p][1] for p in paths if p in lines)
    bc = sum(sum(r[1] for r in branches.get(p, [])) for p in paths)
    bt = sum(len(branches.get(p, [])) for p in paths)
    return lc, lt, bc, bt


def pct(a, b):
    return f"{100.0 * a / b:.1f} %" if b else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build",
                    help="a build dir with -DTPCHECK_COVERAGE=ON or -DTPCHECK_COVERAGE_PROGRAM=ON")
    ap.add_argument("--program", default=None,
                    help="the instrumented program (default: BUILD/tpcheck_coverage if built, "
                         "else BUILD/tpcheck)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", default=None, help="markdown report to write")
    ap.add_argument("--check", action="store_true", help="fail when a baseline branch is lost")
    ap.add_argument("--update-baseline", action="store_true", help=f"rewrite {BASELINE}")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    program = args.program
    if program is None:
        program = os.path.join(build, "tpcheck_coverage")
        if not os.access(program, os.X_OK):
            program = os.path.join(build, "tpcheck")
    if not os.access(program, os.X_OK):
        sys.exit(f"coverage: {program} not built (cmake --build {args.build} --target "
                 "tpcheck_coverage, or tpcheck_cli in a -DTPCHECK_COVERAGE=ON tree)")

    seconds, summary = run_suite(build, program, args.tp)
    report = gcovr_json(build)
    lines, branches = line_counts(report), branch_records(report)
    layer_files = sorted(p for p in lines if p.startswith(LAYERS))
    if not layer_files:
        sys.exit("coverage: no coverage data for src/layers (configure with -DTPCHECK_COVERAGE=ON)")

    md = [f"# Coverage of the sharded code: `tpcheck run --suite full --tp {args.tp}`\n",
          f"Suite: {summary}; then each mutation over a few cases; {seconds:.0f} s in all. "
          "Branches without exception-only and unreachable ones and without the error checks "
          "(TPCHECK_CHECK lines).\n",
          "| file | lines | branches taken |", "|---|---|---|"]
    for p in layer_files + [c for c in COLLECTIVES if c in lines]:
        lc, lt, bc, bt = summarize([p], lines, branches)
        md.append(f"| `{p}` | {lc}/{lt} ({pct(lc, lt)}) | {bc}/{bt} ({pct(bc, bt)}) |")
    lc, lt, bc, bt = summarize(layer_files, lines, branches)
    md.append(f"| **src/layers/** | **{lc}/{lt} ({pct(lc, lt)})** | **{bc}/{bt} ({pct(bc, bt)})** |")
    raw = gcovr_json(build, exclude=False)
    rlines, rbranches = line_counts(raw), branch_records(raw)
    rlc, rlt, rbc, rbt = summarize(layer_files, rlines, rbranches)
    md.append(f"\nEvery line counted (error checks included): lines "
              f"{rlc}/{rlt} ({pct(rlc, rlt)}), branches {rbc}/{rbt} ({pct(rbc, rbt)}).")
    md.append("\n## Untaken branches of src/layers/\n")
    for p in layer_files:
        for key, reached, n, src in branches[p]:
            if not reached:
                md.append(f"- `{p}:{n}` branch {key.rsplit('#', 1)[1]}: `{src}`")
    text = "\n".join(md) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"coverage: src/layers lines {lc}/{lt} ({pct(lc, lt)}), branches {bc}/{bt} ({pct(bc, bt)}) "
          f"[every line counted: lines {pct(rlc, rlt)}, branches {pct(rbc, rbt)}]; "
          f"suite {summary}, with the mutation runs {seconds:.0f} s")

    reached = sorted(k for p in layer_files for k, r, _, _ in branches[p] if r)
    if args.update_baseline:
        with open(BASELINE, "w") as f:
            f.write("# Branches of src/layers reached by `tpcheck run --suite full --tp 2` and the\n"
                    "# mutation and fp8_cs recipe runs of scripts/coverage.py\n"
                    "# (scripts/coverage.py --update-baseline; file|line text|occurrence#branch)\n")
            f.write("\n".join(reached) + "\n")
        print(f"coverage: {len(reached)} reached branches written to {BASELINE}")
    if args.check:
        with open(BASELINE) as f:
            baseline = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
        now = set(reached)
        lost = [k for k in baseline if k not in now]
        gained = len(now - set(baseline))
        if gained:
            print(f"coverage: {gained} branches reached that the baseline does not list "
                  "(scripts/coverage.py --update-baseline records them)")
        if lost:
            print(f"coverage: {len(lost)} branches the suite used to reach are no longer reached "
                  "(or their line changed; rerun with --update-baseline if that is deliberate):")
            for k in lost:
                print("  " + k)
            return 1
        print(f"coverage: all {len(baseline)} baseline branches still reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())

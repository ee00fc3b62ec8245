#!/usr/bin/env python3
"""Calibrates and measures the truth policy's scale test from `tpcheck run --json` reports.

The scale test (include/tpcheck/numerics.h, TruthPolicyParams) fails a tensor whose
difference from single has a component along the truth of more than `min_shift`, standing
more than `z` standard errors out, when the truth varies (variation >= `min_variation`).
It tests only tensors single resolves (|single's own shift| < 0.5). This script
re-decides that test from the statistics every report carries
(`truth.scale_shift`, `scale_shift_sigma`, `variation`), so one set of runs serves every
candidate threshold:

  scale_calibration.py calibrate --seeds 1234,1001 REPORT.json ...
      the no-bug runs of those seeds: per recipe and TP the largest |shift| and z of a
      tensor that varies, the tensors closest to failing, and the false alarms at a grid
      of thresholds;
  scale_calibration.py condense REPORT.json OUT.json
      keeps what the other two read (for carrying hundreds of reports off a machine);
  scale_calibration.py measure [--z Z --min-shift S --min-variation V] REPORT.json ...
      per recipe, TP and mutation, the cases failed by truth without the scale test, with
      it (at the given thresholds), and by te; no-bug runs of any seed count as false
      alarms.

A case fails truth "without the scale test" when a tensor's truth verdict failed on the
magnitude bounds (its reason is not the scale test's); the scale test adds the tensors the
thresholds flag. Reports come from the same binary; environment.recipe / tp / seed /
mutation / steps name the run.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import sys

SCALE_REASON = "sharded is single rescaled along the truth"


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        env = r["environment"]
        runs.append({
            "path": p, "recipe": env.get("recipe", "none"), "tp": env["tp"], "seed": env["seed"],
            "mutation": env.get("mutation", "none"), "steps": env.get("steps", 1),
            "cases": r["cases"],
        })
    return runs


def z_of(truth):
    shift, sigma = truth["scale_shift"], truth["scale_shift_sigma"]
    if sigma is None or shift is None:
        return 0.0
    if sigma > 0:
        return abs(shift) / sigma
    return math.inf if shift != 0 else 0.0


MAX_SINGLE = 0.5  # TruthPolicyParams::scale_max_single


def tested(truth, min_variation):
    """Whether the scale test judges this tensor: a truth that varies and single resolves."""
    return (bool(truth.get("rms")) and truth["variation"] >= min_variation
            and abs(truth["single_scale_error"]) < MAX_SINGLE)


def shift_floor(truth, min_shift, multiplier, tp):
    return max(min_shift, multiplier * math.sqrt(tp) * abs(truth["single_scale_error"]))


def scale_flags(truth, z, min_shift, min_variation, multiplier, tp):
    return (z > 0 and tested(truth, min_variation)
            and abs(truth["scale_shift"]) > shift_floor(truth, min_shift, multiplier, tp)
            and z_of(truth) > z)


def magnitude_failed(tensor):
    v = tensor["verdicts"].get("truth")
    return v is not None and v["status"] == "fail" and not v["reason"].startswith(SCALE_REASON)


def case_fails(case, tp, z, min_shift, min_variation, multiplier):
    for t in case["tensors"]:
        if magnitude_failed(t):
            return True
        truth = t["statistics"].get("truth")
        if truth is not None and scale_flags(truth, z, min_shift, min_variation, multiplier, tp):
            return True
    return False


def case_fails_te(case):
    return any(t["verdicts"].get("te", {}).get("status") == "fail" for t in case["tensors"])


def label(run):
    steps = f" --steps {run['steps']}" if run["steps"] != 1 else ""
    return f"{run['recipe']}{steps}"


def calibrate(args):
    seeds = {int(s) for s in args.seeds.split(",")}
    runs = [r for r in load(args.reports) if r["mutation"] == "none" and r["seed"] in seeds]
    if not runs:
        sys.exit("no no-bug runs of seeds %s among the reports" % sorted(seeds))
    print(f"no-bug runs of seeds {sorted(seeds)}: {len(runs)}\n")
    print("| recipe | TP | runs | tensors tested | largest |shift| (z) | largest z (|shift|) |")
    print("|---|---|---|---|---|---|")
    rows = collections.defaultdict(list)
    for r in runs:
        rows[(label(r), r["tp"])].append(r)
    near = []
    for (rec, tp), rs in sorted(rows.items()):
        n_tested, big_shift, big_z = 0, (0.0, 0.0), (0.0, 0.0)
        for r in rs:
            for c in r["cases"]:
                for t in c["tensors"]:
                    truth = t["statistics"].get("truth")
                    if truth is None or not tested(truth, args.min_variation):
                        continue
                    n_tested += 1
                    s, z = abs(truth["scale_shift"]), z_of(truth)
                    b = abs(truth["single_scale_error"])
                    floor = shift_floor(truth, args.min_shift, args.multiplier, tp)
                    big_shift = max(big_shift, (s, z))
                    big_z = max(big_z, (z, s))
                    near.append((min(s / floor, z / args.z), s, z, b, truth["variation"],
                                 rec, tp, r["seed"], c["id"], t["name"]))
        print(f"| {rec} | {tp} | {len(rs)} | {n_tested} | {big_shift[0]:.3g} ({big_shift[1]:.3g}) "
              f"| {big_z[0]:.3g} ({big_z[1]:.3g}) |")
    near.sort(reverse=True)
    print(f"\nclosest to failing at z {args.z}, min shift {args.min_shift} "
          "(min(|shift|/its floor, z/z_min) largest first; the floor is max(min shift, "
          "m·sqrt(TP)·|single's own shift|)):")
    for n in near[:args.top]:
        print("  %.3g  shift %.3g  z %.3g  single's %.3g  variation %.3g  %s tp %d seed %d  %s  %s" % n)
    print("\nfalse alarms (cases) over all these runs at a grid of thresholds:")
    grid_z = [5, 10, 20, 40]
    grid_s = [0.02, 0.05, 0.1, 0.15]
    print("| min shift \\ z | " + " | ".join(str(z) for z in grid_z) + " |")
    print("|---|" + "---|" * len(grid_z))
    for s in grid_s:
        cells = []
        for z in grid_z:
            n = sum(case_fails(c, r["tp"], z, s, args.min_variation, args.multiplier)
                    for r in runs for c in r["cases"])
            cells.append(str(n))
        print(f"| {s} | " + " | ".join(cells) + " |")


def measure(args):
    runs = load(args.reports)
    table = collections.defaultdict(dict)
    for r in runs:
        key = (label(r), r["mutation"])
        without = sum(case_fails(c, r["tp"], 0, 0, 0, 0) for c in r["cases"])
        with_scale = sum(case_fails(c, r["tp"], args.z, args.min_shift, args.min_variation,
                                    args.multiplier) for c in r["cases"])
        te = sum(case_fails_te(c) for c in r["cases"])
        cell = table[key].setdefault(r["tp"], [0, 0, 0, 0, []])
        cell[0] += without
        cell[1] += with_scale
        cell[2] += te
        cell[3] += len(r["cases"])
        cell[4].append(r["seed"])
    tps = sorted({r["tp"] for r in runs})
    print(f"cases failed: truth without the scale test / with it (z {args.z}, min shift "
          f"{args.min_shift}, min variation {args.min_variation}) / te, of the cases run\n")
    print("| recipe | mutation | " + " | ".join(f"TP {tp}" for tp in tps) + " |")
    print("|---|---|" + "---|" * len(tps))
    for (rec, mut), cells in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1] != "none", kv[0][1])):
        out = []
        for tp in tps:
            if tp not in cells:
                out.append("")
                continue
            w, s, te, n, seeds = cells[tp]
            mark = "**" if (mut == "none" and s > 0) or (mut != "none" and s == 0) else ""
            seeds_note = f" (seeds {','.join(map(str, sorted(set(seeds))))})" if mut == "none" else ""
            out.append(f"{mark}{w} / {s} / {te}{mark} of {n}{seeds_note}")
        print(f"| {rec} | {mut} | " + " | ".join(out) + " |")


def condense(args):
    with open(args.report) as f:
        r = json.load(f)
    keep = ("rms", "scale_shift", "scale_shift_sigma", "single_scale_error", "variation",
            "single_error_offset_share")
    cases = []
    for c in r["cases"]:
        tensors = []
        # --steps N: one entry per step, each with its tensors; a case fails when a step does.
        steps = c["steps"] if "steps" in c else [{"step": 1, "tensors": c["tensors"]}]
        for t in (dict(t, name=f"step {st['step']}: {t['name']}") if len(steps) > 1 else t
                  for st in steps for t in st["tensors"]):
            truth = t["statistics"].get("truth")
            verdicts = {p: {"status": v["status"], "reason": v["reason"][:len(SCALE_REASON)]}
                        for p, v in t["verdicts"].items() if p in ("truth", "te")}
            tensors.append({"name": t["name"], "verdicts": verdicts,
                            "statistics": {"truth": {k: truth.get(k) for k in keep}} if truth else {}})
        cases.append({"id": c["id"], "tensors": tensors})
    with open(args.out, "w") as f:
        json.dump({"environment": r["environment"], "cases": cases}, f, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("calibrate", "measure"):
        p = sub.add_parser(name)
        p.add_argument("reports", nargs="+")
        p.add_argument("--z", type=float, default=20.0)
        p.add_argument("--min-shift", type=float, default=0.1)
        p.add_argument("--min-variation", type=float, default=0.1)
        p.add_argument("--multiplier", type=float, default=4.0,
                       help="the truth policy's m: the floor on the shift is m·sqrt(TP)·|single's own shift|")
        if name == "calibrate":
            p.add_argument("--seeds", required=True, help="comma-separated calibration seeds")
            p.add_argument("--top", type=int, default=15)
    p = sub.add_parser("condense")
    p.add_argument("report")
    p.add_argument("out")
    args = ap.parse_args()
    {"calibrate": calibrate, "measure": measure, "condense": condense}[args.command](args)


if __name__ == "__main__":
    main()

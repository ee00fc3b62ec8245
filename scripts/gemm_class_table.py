#!/usr/bin/env python3
"""The table of GEMM algorithm / numerical-class differences between the single and the
sharded run, from one or more `tpcheck run --json` reports (schema tpcheck.run/1).

    scripts/gemm_class_table.py te_cuda_tp2.json te_cuda_tp4.json te_cuda_tp8.json

For each report: how many (case, site) pairs differ in algorithm and how many in
numerical class, then one row per site that changes class (both records: algorithm, tile,
split-K, numerical implementation), then the sites whose algorithm differs most often.
Markdown on stdout, standard library only.
"""
import collections
import json
import sys


def describe(g):
    lt = g.get("cublaslt")
    if not lt:
        return f'{g["math_class"]} ({g.get("implementation", "")})'
    return (f'algo {lt["algo_id"]} {lt["tile"]} stages {lt["stages"]} split-K {lt["split_k"]}, '
            f'{lt["numerical_impl"]}')


def shape(g):
    return f'm={g["m"]} n={g["n"]} k={g["k"]}' + (f' batch={g["batch"]}' if g.get("batch", 1) > 1 else "")


def table(path):
    with open(path) as f:
        report = json.load(f)
    cases = report["cases"]
    settings = report.get("settings", {})
    algo, klass = [], []
    for c in cases:
        for d in c.get("gemm_class_diffs", []):
            (klass if d["class_differs"] else algo).append((c, d))
    tp = cases[0]["tp"] if cases else "?"
    sizes = ", ".join(f"{k} {v}" for k, v in settings.get("sizes", {}).items())
    print(f"### {path}: TP {tp}{', ' + sizes if sizes else ''}\n")
    print(f"{len(cases)} cases; {len(algo) + len(klass)} (case, site) pairs differ in algorithm "
          f"or configuration, **{len(klass)} in numerical class**.\n")
    if klass:
        print("| case | site | dtypes | single | sharded |")
        print("|---|---|---|---|---|")
        for c, d in klass:
            s, h = d["single"], d["sharded"]
            print(f'| {c["id"]} | {d["site"]} | {"/".join(s["dtypes"])} | {shape(s)}: {describe(s)} '
                  f'| {shape(h)}: {describe(h)} |')
        print()
    by_site = collections.Counter(d["site"] for _, d in algo)
    if by_site:
        print("Algorithm-only differences by site: " +
              ", ".join(f"`{s}` {n}" for s, n in by_site.most_common()) + "\n")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for p in argv[1:]:
        table(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel times by kernel name (tests/gpu/run.sh kernels).

Input: the CSV that `ncu --csv --page raw --metrics gpu__time_duration.sum` writes (one row
per kernel launch, a units row after the header). Output: a markdown table, one row per
kernel name (template arguments cut at 80 characters): launches, total and mean time,
share of the window, largest first; then the window's total.

    kernel_summary.py ncu.csv [title]
"""
import csv
import sys
from collections import defaultdict


def main() -> int:
    path = sys.argv[1]
    title = sys.argv[2] if len(sys.argv) > 2 else path
    with open(path, newline="") as f:
        # ncu prints its own lines (==PROF== ...) before the CSV: start at the header.
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        print(f"{title}: no kernels captured")
        return 1
    header = rows[0]
    name_col = header.index("Kernel Name")
    time_col = header.index("gpu__time_duration.sum")
    unit = rows[1][time_col] if len(rows) > 1 else "ns"
    scale = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "nsecond": 1e-6, "ms": 1.0,
             "msecond": 1.0}.get(unit, 1e-6)
    totals = defaultdict(float)
    counts = defaultdict(int)
    for row in rows[2:]:
        if len(row) <= max(name_col, time_col) or not row[time_col]:
            continue
        name = row[name_col]
        name = name if len(name) <= 80 else name[:77] + "..."
        totals[name] += float(row[time_col].replace(",", "")) * scale
        counts[name] += 1
    window = sum(totals.values())
    print(f"### {title}: {sum(counts.values())} kernels, {window:.3f} ms of kernel time\n")
    print("| kernel | launches | total ms | mean ms | share |")
    print("|---|---|---|---|---|")
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| `{name}` | {counts[name]} | {t:.3f} | {t / counts[name]:.4f} | "
              f"{100 * t / window:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

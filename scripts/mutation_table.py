#!/usr/bin/env python3
"""Runs the suite once per mutation and prints, per TP size, how many cases each policy
fails: the README's mutation table. Usage: scripts/mutation_table.py [build/tpcheck] [TP ...]
"""
import json
import subprocess
import sys
import tempfile

POLICIES = ["te", "allclose", "truth", "bitwise"]


def failures(tpcheck, tp, mutation):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([tpcheck, "run", "--tp", str(tp), "--mutate", mutation, "--quiet",
                        "--json", f.name], stdout=subprocess.DEVNULL, check=False)
        report = json.load(open(f.name))
    cases = report["cases"]
    return {p: sum(c["verdicts"][p]["status"] == "fail" for c in cases) for p in POLICIES}, len(cases)


def main():
    tpcheck = sys.argv[1] if len(sys.argv) > 1 else "build/tpcheck"
    tps = [int(x) for x in sys.argv[2:]] or [2, 4, 8]
    listing = subprocess.run([tpcheck, "mutations"], capture_output=True, text=True, check=True)
    mutations = [(line.split()[0], line.split(None, 1)[1]) for line in listing.stdout.splitlines()]
    header = "| mutation | what it breaks | " + " | ".join(f"TP {tp}: te / allclose / truth" for tp in tps) + " |"
    print(header)
    print("|" + "---|" * (2 + len(tps)))
    for name, description in [("none", "no bug: false alarms")] + mutations:
        cells = []
        for tp in tps:
            counts, total = failures(tpcheck, tp, name)
            cells.append(" / ".join(str(counts[p]) for p in ["te", "allclose", "truth"]) + f" of {total}")
        print(f"| `{name}` | {description} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

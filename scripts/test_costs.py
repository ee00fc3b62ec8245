#!/usr/bin/env python3
"""Measures what each ctest entry costs in CPU seconds (user + system of the entry and its
children), so the test command's budget is planned from figures that do not depend on what
else the machine is doing, and writes them where tests/CMakeLists.txt reads them (ctest's
COST property: the costly entries start first under `ctest -j`).

    scripts/test_costs.py --build build [-R REGEX] [-j 2] [--write tests/costs.txt]

Runs the entries as ctest would (its command, working directory and environment, read
from `ctest --show-only=json-v1`), `-j` at a time, and prints one line per entry: CPU
seconds, wall seconds, exit status. Long runs (TPCHECK_TEST_LONG=1) are measured the same
way when that variable is set. Needs only python3's standard library.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time


def entries(build, regex):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                         text=True, check=True)
    tests = json.loads(out.stdout)["tests"]
    for t in tests:
        if regex and not re.search(regex, t["name"]):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(os.environ)
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env[k] = v
        yield t["name"], t["command"], props.get("WORKING_DIRECTORY", build), env


def run_one(name, command, cwd, env):
    # Each entry in a child process of its own, timed by wait4's resource usage.
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    return name, usage.ru_utime + usage.ru_stime, wall, proc.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("-R", dest="regex", default=None, help="only entries matching")
    ap.add_argument("-j", dest="jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--write", default=None,
                    help="write 'name cpu_seconds' lines (tests/costs.txt) for COST")
    args = ap.parse_args()
    todo = list(entries(os.path.abspath(args.build), args.regex))
    if not todo:
        sys.exit(f"test_costs: no ctest entry matches {args.regex!r} in {args.build}")
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name, cpu, wall, rc in pool.map(lambda e: run_one(*e), todo):
            print(f"{cpu:8.1f} cpu-s {wall:8.1f} wall-s  rc {rc:3d}  {name}", flush=True)
            results.append((name, cpu, wall, rc))
    total = sum(r[1] for r in results)
    print(f"total {total:.0f} cpu-s over {len(results)} entries "
          f"({total / max(args.jobs, 1) / 60:.1f} min at -j{args.jobs} if perfectly packed)")
    if args.write:
        with open(args.write, "w") as f:
            f.write("# ctest entry, CPU seconds measured by scripts/test_costs.py "
                    f"({time.strftime('%Y-%m-%d', time.gmtime())}); tests/CMakeLists.txt "
                    "sets each as its COST\n")
            for name, cpu, _, _ in sorted(results, key=lambda r: -r[1]):
                f.write(f"{name} {cpu:.0f}\n")
    return 1 if any(r[3] not in (0,) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

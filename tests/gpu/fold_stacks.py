#!/usr/bin/env python3
"""Folds the thread stacks tests/gpu/sample_stacks.sh collected (cuda-gdb's
`thread apply all bt`) into the functions busy threads were in.

A thread is idle when its innermost tpcheck-side frame is a wait for other threads
(condition variables, futexes, joins, the thread pool's park); every other stack is a
sample of work. Prints, over the busy stacks, each function's inclusive share (the stack
holds it) and its exclusive share (the innermost named frame), highest first.
"""
import collections
import re
import sys

FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(.*)$")
IDLE = ("pthread_cond_wait", "pthread_cond_timedwait", "__futex_abstimed_wait",
        "futex_wait", "pthread_join", "std::condition_variable::wait", "epoll_wait",
        "poll", "nanosleep", "clock_nanosleep", "accept", "select", "blas_thread_server",
        "sched_yield")


def short(text):
    """The function's name in a frame's text, without its template arguments: everything
    before the argument list, the first " (" outside angle brackets."""
    name, depth = [], 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0 and text[i - 1] == " ":
            break
        elif depth == 0:
            name.append(ch)
    return "".join(name).strip()


def stacks(path):
    cur = None
    for line in open(path, errors="replace"):
        if line.startswith("Thread "):
            if cur:
                yield cur
            cur = []
        m = FRAME.match(line)
        if m and cur is not None and not m.group(2).startswith("??"):
            cur.append(short(m.group(2)))
    if cur:
        yield cur


def main(paths):
    inclusive, exclusive = collections.Counter(), collections.Counter()
    busy = total = 0
    for p in paths:
        for st in stacks(p):
            total += 1
            if not st or any(any(i in f for i in IDLE) for f in st[:4]):
                continue
            busy += 1
            exclusive[st[0]] += 1
            for f in set(st):
                inclusive[f] += 1
    print(f"{len(paths)} samples, {total} thread stacks, {busy} busy")
    if not busy:
        return
    print("\ninclusive (share of busy stacks holding the function):")
    for f, n in inclusive.most_common(45):
        print(f"  {100 * n / busy:5.1f}%  {f[:150]}")
    print("\nexclusive (innermost frame):")
    for f, n in exclusive.most_common(25):
        print(f"  {100 * n / busy:5.1f}%  {f[:150]}")


if __name__ == "__main__":
    main(sys.argv[1:])

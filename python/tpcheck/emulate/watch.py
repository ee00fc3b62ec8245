"""Waiting for the other ranks without ever hanging: every wait of a group polls its condition
and, every 0.2 s, the launcher's events file (protocol.read_events): a peer that exited or
was killed ends the wait with an EmulateError naming it; so does the group's timeout, naming
the ranks still missing, and a store that went away.
"""

from __future__ import annotations

import datetime
import time
from typing import Callable, Iterable

import torch.distributed as dist

from .protocol import EmulateError, read_events

EVENTS_EVERY_S = 0.2


class Watch:
    """The waits of one group: rank `rank` of `global_ranks`, timeout per wait."""

    def __init__(self, store, global_ranks: list[int], rank: int, timeout: datetime.timedelta):
        self._store = store
        self._global = global_ranks
        self._rank = rank
        self.timeout = timeout

    def who(self, r: int) -> str:
        """Group rank r in messages: its global rank, and its place in a subgroup."""
        g = self._global[r]
        return f"rank {g}" if g == r else f"rank {g} (rank {r} of group {self._global})"

    def who_of(self, ranks: Iterable[int]) -> str:
        return ", ".join(self.who(r) for r in ranks)

    def check_events(self, waiting_for: str) -> None:
        """EmulateError when a peer of this group has ended (the launcher's events)."""
        me = self._global[self._rank]
        for ev in read_events():
            if ev.get("rank") in self._global and ev.get("rank") != me:
                raise EmulateError(f"rank {ev['rank']} {ev['what']} while rank {me} waits in "
                                   f"{waiting_for}")

    def _check(self, keys: list[str], what: str) -> bool:
        try:
            return self._store.check(keys)
        except (dist.DistError, RuntimeError) as e:
            # The store is gone (the launcher's, or rank 0's without it): say which rank
            # ended (the launcher's events come within its 20 ms poll) if one did.
            for _ in range(50):
                self.check_events(what)
                time.sleep(0.02)
            raise EmulateError(f"lost the rendezvous store while rank "
                               f"{self._global[self._rank]} waits in {what}: {e}") from e

    def wait_keys(self, keys: list[str], what: str,
                  timeout: datetime.timedelta | None = None) -> None:
        """Until every key exists in the store (polled: a timed-out store.wait logs a C++
        warning each time)."""
        self.poll(lambda: self._check(keys, what), what,
                  lambda: ", ".join(k for k in keys if not self._store.check([k])), timeout)

    def poll(self, done: Callable[[], bool], what: str, missing: Callable[[], str],
             timeout: datetime.timedelta | None = None) -> None:
        """Calls done() until it returns true, watching the launcher's events meanwhile; after
        the timeout, an error naming missing()'s answer. It spins for the first 0.1 ms (a
        peer's record usually arrives within it), then sleeps a little between polls, and
        1 ms once a peer is 10 ms late."""
        timeout = timeout or self.timeout
        start = time.monotonic()
        deadline = start + timeout.total_seconds()
        next_events = start + EVENTS_EVERY_S
        while not done():
            now = time.monotonic()
            if now > next_events:
                self.check_events(what)
                next_events = now + EVENTS_EVERY_S
            if now > deadline:
                raise EmulateError(f"timeout ({timeout}) in {what}: no record from {missing()}")
            late = now - start
            if late > 0.01:
                time.sleep(0.001)
            elif late > 1e-4:
                time.sleep(2e-5)

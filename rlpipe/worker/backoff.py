"""Crash loops broken (issue 49): an env that faults again and again right after its rebuild
backs off before the next one, exponentially, capped.

An env type that crashes on every step made 16,392 crash/rebuild pairs in 20 s with 16 envs,
and grew the lifecycle db by about 1 MB/s. Here an env's faults (crash, contract violation,
hang) count as a streak while each comes within `STREAK_RESET_S` of the last; from the
`BACKOFF_AFTER`th fault of a streak on, the env is parked for `BACKOFF_BASE_S`, doubled at
each further fault up to `BACKOFF_CAP_S`, before its rebuild. A parked env is not stepped: its
slot reports a cut step (truncated, no episode), records no fault and writes no row, and is
rebuilt at the first step after its time is up. So an env in a crash loop faults at most once
per `BACKOFF_CAP_S` after its first dozen faults: 60 faults an hour.
"""

from __future__ import annotations

import time

import numpy as np

BACKOFF_AFTER = 3  # faults in a row rebuilt at once (a one-off crash costs nothing)
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
STREAK_RESET_S = 2 * BACKOFF_CAP_S  # a fault this long after the last starts a new streak


class BackingOff(Exception):
    """Raised by a parked env's `step`: the env table's `recover` rebuilds it once its time is
    up and records nothing before."""


class Parked:
    """What stands in an env's slot while it backs off (the C step loop and `step_one` call
    its `step`, which raises BackingOff, and cut the step)."""

    def step(self, env_id, action):
        raise BackingOff(env_id)

    def close(self, env_id=None) -> None:
        pass


PARKED = Parked()


class FaultBackoff:
    """Per env: the fault streak and when a parked env may be rebuilt."""

    def __init__(self, n: int, clock=time.monotonic):
        self.clock = clock  # seconds; a test gives twin tables one clock so they back off alike
        self.streak = np.zeros(n, dtype=np.int64)
        self.last_fault = np.full(n, -np.inf)
        self.until = np.zeros(n)  # monotonic time a parked env is rebuilt at
        self.parked_total = 0  # how many times an env was parked, over the table's life

    def fault(self, i: int, now: float | None = None) -> float:
        """Env i faulted: the seconds to wait before its rebuild (0: rebuild now)."""
        now = self.clock() if now is None else now
        if now - self.last_fault[i] > STREAK_RESET_S:
            self.streak[i] = 0
        self.last_fault[i] = now
        self.streak[i] += 1
        over = int(self.streak[i]) - BACKOFF_AFTER
        if over < 0:
            return 0.0
        delay = min(BACKOFF_BASE_S * 2.0**over, BACKOFF_CAP_S)
        self.until[i] = now + delay
        self.parked_total += 1
        return delay

    def due(self, i: int, now: float | None = None) -> bool:
        return (self.clock() if now is None else now) >= self.until[i]

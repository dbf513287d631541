"""The step deadline and the stall budget of each env type, from its measured step time
(issue 49).

Two figures per type, both from the longest step this worker has seen of that type once the
type has made `WARMUP_STEPS` steps here (first steps load, compile, warm caches; until then both
are `worker.step_timeout_s`):

- the **stall budget**, `STALL_FACTOR` times that longest step, at least `STALL_FLOOR_S`: a step
  still running past it is detached from its slice (rlpipe/worker/relief.py), so the slice's
  other envs go on stepping while it runs on. A detached step that comes back costs its env one
  cut episode, and its time joins the type's figures, so a type that got slower stalls once.
- the **deadline**, `FACTOR` times that longest step, at least `FLOOR_S` (autoresets and rare
  slow steps are not measured, and must not be cut), at most `worker.step_timeout_s`: a step
  past it is cut and its env rebuilt.

A CartPole step takes microseconds and its longest seen a few milliseconds: a hung CartPole env
is detached from its slice after 0.25 s and cut after 5 s, not 30.
"""

from __future__ import annotations

import numpy as np

from rlpipe.shm.layout import H_SLICE_LO, H_SLICE_SERIAL

FACTOR = 100.0
FLOOR_S = 5.0
STALL_FACTOR = 10.0
STALL_FLOOR_S = 0.25
WARMUP_STEPS = 50
# How often the watcher looks at the step in progress: half the shortest stall budget of the
# worker's types, so a stall is seen between its budget and 1.5 times it, but never more often
# than every POLL_S. Each look takes the GIL from the stepping thread: at 20 looks a second in
# each of 20 CartPole workers (a fixed 50 ms) the workers stepped 2-3 % fewer env steps than at
# one look a second, about what such runs vary (docs/benchmarks.md, "The deficit, bisected").
POLL_S = 0.05


class TypeDeadlines:
    def __init__(self, type_index: np.ndarray, n_types: int, cap_s: float, views):
        self.type_index = type_index.astype(np.int64)
        self.cap_s = cap_s
        self.views = views  # the worker's header: which env a serial is (H_SLICE_LO, H_SLICE_SERIAL)
        self.max_ms = np.zeros(n_types)
        self.seen = np.zeros(n_types, dtype=np.int64)
        self.limit_s = np.full(n_types, cap_s)
        self.stall_s = np.full(n_types, cap_s)
        # once every type of this worker is warm, a slice none of whose steps is its type's
        # longest changes nothing: one comparison a slice instead of the figures' ufunc.at and
        # derivation (15 us a slice of 70, a few % of a CartPole slice's steps)
        self.present = np.bincount(self.type_index, minlength=n_types) > 0
        self.warm = False
        self.env_max_ms = self.max_ms[self.type_index]  # per env, its type's longest step
        self.poll = cap_s / 8

    def poll_s(self) -> float:
        """The watcher's sleep between looks (asked at each look): see POLL_S. Until the types
        are warm their budgets are the cap, and so the watcher looks every eighth of it, as the
        plain deadline does."""
        return self.poll

    def observe(self, lo: int, hi: int, step_ms: np.ndarray) -> None:
        """After a slice: its envs' step times (ms) into their types' figures."""
        if self.warm and not (step_ms > self.env_max_ms[lo:hi]).any():
            return
        types = self.type_index[lo:hi]
        np.maximum.at(self.max_ms, types, step_ms)
        np.add.at(self.seen, types, 1)
        self._derive()

    def observe_stall(self, i: int, seconds: float) -> None:
        """Env i's detached step came back after `seconds`: a step its type can take."""
        t = self.type_index[i]
        self.max_ms[t] = max(self.max_ms[t], seconds * 1e3)
        self._derive()

    def _derive(self) -> None:
        longest_s = self.max_ms / 1e3
        warm = self.seen >= WARMUP_STEPS
        self.warm = bool((warm | ~self.present).all())
        self.env_max_ms = self.max_ms[self.type_index]
        self.limit_s = np.where(warm, np.clip(FACTOR * longest_s, FLOOR_S, self.cap_s), self.cap_s)
        self.stall_s = np.where(
            warm, np.minimum(np.maximum(STALL_FACTOR * longest_s, STALL_FLOOR_S), self.limit_s), self.cap_s
        )
        self.poll = float(min(self.cap_s / 8, max(POLL_S, self.stall_s[self.present].min() / 2)))

    def env_of(self, serial: int) -> int:
        """The env (row) of the main loop's step with this serial, -1 if none."""
        i = self.views.load(H_SLICE_LO) + serial - self.views.load(H_SLICE_SERIAL) - 1
        return i if 0 <= i < len(self.type_index) else -1

    def limit_of(self, serial: int) -> float:
        """The deadline of the step with this serial (the watcher thread asks)."""
        i = self.env_of(serial)
        return float(self.limit_s[self.type_index[i]]) if i >= 0 else self.cap_s

    def stall_of(self, serial: int) -> float:
        """The stall budget of the step with this serial."""
        i = self.env_of(serial)
        return float(self.stall_s[self.type_index[i]]) if i >= 0 else self.cap_s

    def limit_of_env(self, i: int) -> float:
        return float(self.limit_s[self.type_index[i]])

"""The step deadline of each env type, from its measured step time (issue 49).

One env blocking in `step` holds the rest of its slice (the inline step loop steps the slice on
one thread) until its deadline cuts it; with only `worker.step_timeout_s` (30 s by default) a
hung env froze its 15 neighbours for 30 s. Each type's deadline is instead `FACTOR` times the
longest step this worker has seen of that type, at least `FLOOR_S` (autoresets and rare slow
steps are not measured, and must not be cut), at most `worker.step_timeout_s`, which also holds
until the type has made `WARMUP_STEPS` steps here (first steps load, compile, warm caches). A
CartPole step takes microseconds: its hung env holds its neighbours `FLOOR_S`, not 30 s. The
pool of threads (`worker.threads` > 1) lets the other envs of the slice step meanwhile.
"""

from __future__ import annotations

import numpy as np

from rlpipe.shm.layout import H_SLICE_LO, H_SLICE_SERIAL

FACTOR = 100.0
FLOOR_S = 5.0
WARMUP_STEPS = 50


class TypeDeadlines:
    def __init__(self, type_index: np.ndarray, n_types: int, cap_s: float, views):
        self.type_index = type_index.astype(np.int64)
        self.cap_s = cap_s
        self.views = views  # the worker's header: which env a serial is (H_SLICE_LO, H_SLICE_SERIAL)
        self.max_ms = np.zeros(n_types)
        self.seen = np.zeros(n_types, dtype=np.int64)
        self.limit_s = np.full(n_types, cap_s)

    @property
    def poll_s(self) -> float:
        """How often the deadline's watcher looks: an eighth of the shortest deadline there can be."""
        return min(self.cap_s, FLOOR_S) / 8

    def observe(self, lo: int, hi: int, step_ms: np.ndarray) -> None:
        """After a slice: its envs' step times (ms) into their types' figures."""
        types = self.type_index[lo:hi]
        np.maximum.at(self.max_ms, types, step_ms)
        np.add.at(self.seen, types, 1)
        measured = np.clip(FACTOR * self.max_ms / 1e3, FLOOR_S, self.cap_s)
        self.limit_s = np.where(self.seen >= WARMUP_STEPS, measured, self.cap_s)

    def limit_of(self, serial: int) -> float:
        """The deadline of the step with this serial (the watcher thread asks)."""
        i = self.views.load(H_SLICE_LO) + serial - self.views.load(H_SLICE_SERIAL) - 1
        return float(self.limit_s[self.type_index[i]]) if 0 <= i < len(self.type_index) else self.cap_s

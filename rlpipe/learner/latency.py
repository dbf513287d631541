"""Env step() latencies per env type between two charts (ms; the workers time each call and
report it with the slice's results)."""

from __future__ import annotations

import numpy as np


class StepLatencies:
    """A round's rows are kept as they come and split by type only when charted: a round
    mixes every type, and splitting it there (a sort and a mask per type, ~140 us at 7,000
    rows of 12 types) held the GIL on the serving thread every round, where the PPO update's
    thread waits for it; once per chart it is the same work for many rounds."""

    def __init__(self, type_names: list[str]):
        self.names = list(type_names)
        # a type index in one byte where it fits: kept rows cost 5 bytes, not 12, and a stable
        # sort of small integers is a radix sort (the split at chart time)
        self.type_dtype = np.uint8 if len(self.names) <= 256 else np.int32
        self.types: list[np.ndarray] = []
        self.step_ms: list[np.ndarray] = []

    def add(self, types: np.ndarray, step_ms: np.ndarray) -> None:
        """One round's latencies; `types`: its rows' type indices (`step_ms` kept, not copied:
        the caller passes an array of its own, as boolean-indexed rows are)."""
        self.types.append(types.astype(self.type_dtype))
        self.step_ms.append(step_ms)

    def percentiles(self) -> dict[str, tuple[float, float]]:
        """(p50, p99) of each type's latencies since the last call, in ms."""
        if not self.types:
            return {}
        types, step_ms = np.concatenate(self.types), np.concatenate(self.step_ms)
        self.types.clear()
        self.step_ms.clear()
        order = np.argsort(types, kind="stable")
        bounds = np.searchsorted(types[order], np.arange(len(self.names) + 1, dtype=np.int64))
        out = {}
        for t, name in enumerate(self.names):
            part = step_ms[order[bounds[t] : bounds[t + 1]]]
            if len(part):
                p50, p99 = np.percentile(part, (50, 99))
                out[name] = (float(p50), float(p99))
        return out

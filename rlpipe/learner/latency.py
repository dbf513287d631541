"""Env step() latencies per env type between two charts (ms; the workers time each call and
report it with the slice's results)."""

from __future__ import annotations

import numpy as np


class StepLatencies:
    def __init__(self, type_names: list[str]):
        self.names = list(type_names)
        self.recent: dict[str, list[np.ndarray]] = {n: [] for n in self.names}

    def add(self, types: np.ndarray, step_ms: np.ndarray) -> None:
        """One slice's latencies; `types`: its envs' type indices."""
        first = types[0]
        if (types == first).all():  # the common case: a slice of one type
            self.recent[self.names[first]].append(step_ms)
            return
        for t in np.unique(types):
            self.recent[self.names[t]].append(step_ms[types == t])

    def percentiles(self) -> dict[str, tuple[float, float]]:
        """(p50, p99) of each type's latencies since the last call, in ms."""
        out = {}
        for name, parts in self.recent.items():
            if parts:
                p50, p99 = np.percentile(np.concatenate(parts), (50, 99))
                out[name] = (float(p50), float(p99))
                parts.clear()
        return out

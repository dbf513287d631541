"""The one reader of TensorBoard event files (the health report and the benchmarks use it).

Imports TensorBoard's event accumulator only when called, so importing this module stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Series:
    """One scalar tag: its points sorted by step."""

    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray

    @property
    def first(self) -> float:
        return float(self.values[0])

    @property
    def last(self) -> float:
        return float(self.values[-1])


def read_scalars(tb_dir: str | Path) -> dict[str, Series]:
    """Every scalar tag of the event files directly in `tb_dir` (all files, in order, every
    point: no sampling), each sorted by step (stable: a resumed run's repeated steps keep
    their order)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    out: dict[str, Series] = {}
    for tag in acc.Tags().get("scalars", []):
        events = acc.Scalars(tag)
        if not events:
            continue
        steps = np.array([e.step for e in events], dtype=np.int64)
        values = np.array([e.value for e in events], dtype=np.float64)
        wall = np.array([e.wall_time for e in events], dtype=np.float64)
        order = np.argsort(steps, kind="stable")
        out[tag] = Series(steps[order], values[order], wall[order])
    return out

"""Cold/hot start: which worker groups are awake, and when the next ones wake.

The first `hot` groups start awake. Once every env of the most recently woken group has
made `wake_after_steps` steps, the next `batch` dormant groups wake; the batch then grows by
`wake_growth` (rounded up), so a long ramp can start gently and finish fast.
"""

from __future__ import annotations

import math

from rlpipe.config import GroupsSpec


class WakeSchedule:
    def __init__(self, n_groups: int, spec: GroupsSpec):
        self.n_groups = n_groups
        self.spec = spec
        self.awake = [g < spec.hot for g in range(n_groups)]
        self.dormant = self.awake.count(False)
        self.last_woken = list(range(min(spec.hot, n_groups)))
        self.batch = float(spec.wake_batch)
        self.wakes = 0

    @property
    def all_awake(self) -> bool:
        return self.dormant == 0

    def due(self, min_steps: dict[int, int]) -> list[int]:
        """Groups to wake now, given each group's fewest steps per env (`min_steps`)."""
        if self.all_awake:
            return []
        if any(min_steps.get(g, 0) < self.spec.wake_after_steps for g in self.last_woken):
            return []
        dormant = [g for g in range(self.n_groups) if not self.awake[g]]
        woken = dormant[: math.ceil(self.batch)]
        for g in woken:
            self.awake[g] = True
        self.dormant -= len(woken)
        self.last_woken = woken
        self.batch *= self.spec.wake_growth
        self.wakes += 1
        return woken

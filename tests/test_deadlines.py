"""Each type's stall budget and deadline from its longest step (rlpipe/worker/deadlines.py):
the figures follow the longest step seen once a type is warm, including after the per-slice
shortcut that skips slices with no new longest step."""

from __future__ import annotations

import numpy as np

from rlpipe.worker.deadlines import FLOOR_S, POLL_S, STALL_FACTOR, STALL_FLOOR_S, WARMUP_STEPS, TypeDeadlines


class Header:
    def load(self, key):
        return 0


def test_figures_follow_each_types_longest_step_after_the_warm_shortcut():
    types = np.array([0, 1, 0, 1, 0, 1])  # a worker of two types (a third, absent here, never warms)
    d = TypeDeadlines(types, 3, 30.0, Header())
    steps = np.array([1.0, 40.0, 1.0, 40.0, 1.0, 40.0])  # ms
    for _ in range(WARMUP_STEPS // 3):
        d.observe(0, 6, steps)
        assert not d.warm and (d.limit_s == 30.0).all()  # before WARMUP_STEPS: the cap
        assert d.poll_s() == 30.0 / 8  # the watcher looks as the plain deadline does
    d.observe(0, 6, steps)
    assert d.warm  # the absent type does not hold the others cold
    assert d.poll_s() == STALL_FLOOR_S / 2  # half the shortest stall budget: seen within 1.5 x it
    assert d.stall_s[0] == STALL_FLOOR_S and d.limit_s[0] == FLOOR_S
    assert np.isclose(d.stall_s[1], STALL_FACTOR * 0.040)
    d.observe(2, 4, np.array([0.5, 39.0]))  # no new longest: figures unchanged
    assert d.max_ms[0] == 1.0 and d.max_ms[1] == 40.0
    d.observe(2, 4, np.array([1.0, 90.0]))  # type 1's longest grows: the figures follow
    assert d.max_ms[1] == 90.0 and np.isclose(d.stall_s[1], STALL_FACTOR * 0.090)
    assert d.max_ms[0] == 1.0 and d.stall_s[0] == STALL_FLOOR_S
    d.observe_stall(0, 0.2)  # a detached step of 0.2 s that came back
    assert d.max_ms[0] == 200.0 and np.isclose(d.stall_s[0], STALL_FACTOR * 0.2)
    d.observe(0, 2, np.array([150.0, 10.0]))  # under the new longest: skipped, still exact
    assert d.max_ms[0] == 200.0
    assert d.poll_s() == min(d.stall_s[:2]) / 2 > POLL_S


def test_the_watcher_never_looks_more_often_than_poll_s():
    d = TypeDeadlines(np.zeros(4, dtype=np.int64), 1, 30.0, Header())
    d.max_ms[0], d.seen[0] = 0.001, WARMUP_STEPS  # a step of a microsecond
    d.observe(0, 4, np.full(4, 0.001))
    assert d.stall_s[0] == STALL_FLOOR_S and d.poll_s() == max(POLL_S, STALL_FLOOR_S / 2)

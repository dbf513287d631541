"""The worker's loop (rlpipe/worker/process.py `Worker.loop`) on stand-ins for its doorbell and
step: a group still building its envs builds one between any two actions, so a driver that
always has actions waiting for the slices already up cannot starve the build. Before, it built
only when no action waited: in a 10-minute day4 soak (7,000 envs, chaos) replacement workers
stuck at 151-301 of their 350 envs for 300 s were replaced again as stalled, and the run ended
with 4,270 of 7,000 envs active."""

from __future__ import annotations

import os
from types import SimpleNamespace

from rlpipe.shm.doorbell import STOP_SLICE
from rlpipe.worker.process import Worker


class BusyDriver:
    """A doorbell that always holds an action for slice 0 (the built one), then the stop."""

    def __init__(self, actions: int):
        self.left = actions

    def take(self, timeout_ms: int):
        self.left -= 1
        return (0, 1) if self.left >= 0 else (STOP_SLICE, 0)


def _worker(n: int, actions: int) -> SimpleNamespace:
    w = SimpleNamespace(
        doorbell=BusyDriver(actions),
        views=SimpleNamespace(load=lambda word: 1),  # its generation, the current one
        stopping=[],
        n=n,
        built=1,
        generation=1,
        spec=SimpleNamespace(driver_pid=os.getpid(), worker=SimpleNamespace(doorbell_timeout_s=0.1)),
        stepped=0,
        beat=lambda: None,
        upkeep=lambda: True,
    )

    def build_next_env():
        w.built += 1

    def step_slice(s, seq):
        w.stepped += 1
        return True

    w.build_next_env, w.step_slice = build_next_env, step_slice
    return w


def test_a_busy_driver_cannot_starve_the_build():
    w = _worker(n=50, actions=100)
    Worker.loop(w)
    assert w.stepped == 100  # every action served
    assert w.built == 50  # and every env built meanwhile: one between two actions

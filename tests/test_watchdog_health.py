"""The watchdog's TensorBoard health/ figures: oldest beats of the last scan, workers being
replaced, worker restarts from the lifecycle log."""

from __future__ import annotations

import time

from rlpipe.config import HeartbeatSpec
from rlpipe.lifecycle import LifecycleWriter
from rlpipe.shm.layout import H_OS_BEAT_NS, H_READY
from rlpipe.supervisor.watchdog import Watchdog


class _Views:
    def __init__(self, os_beat_ns: int):
        self.values = {H_READY: 1, H_OS_BEAT_NS: os_beat_ns}

    def load(self, offset: int) -> int:
        return self.values[offset]


class _Handle:
    def __init__(self, worker_id: int, os_age_s: float):
        self.worker_id = worker_id
        self.generation = 1
        self.awake = True
        self.views = _Views(time.monotonic_ns() - int(os_age_s * 1e9))
        self.spawned_at = time.monotonic() - 100.0
        self.spawned_wall = time.time() - 100.0

    def alive(self) -> bool:
        return True


class _Redis:
    """Redis beats 3 s and 7 s old."""

    def __init__(self):
        self.keys = []

    def pipeline(self, transaction=False):
        return self

    def hget(self, key, field):
        self.keys.append(key)

    def execute(self):
        return [str(time.time() - age) for age in (3.0, 7.0)][: len(self.keys)]


def test_health_scalars_after_a_scan(short_tmp):
    spec = HeartbeatSpec(
        signal_interval_s=1,
        redis_interval_s=1,
        scan_interval_s=0.01,
        timeout_s=30,
        term_grace_s=2,
        startup_timeout_s=60,
    )
    with LifecycleWriter(short_tmp / "lifecycle.sqlite", f"ipc://{short_tmp}/lc.sock", "test") as lifecycle:
        lifecycle.record("worker_restart", worker_id=0, generation=1, detail={"reason": "exited"})
        lifecycle.flush()
        dog = Watchdog(spec, "test", _Redis(), lifecycle)
        dog.next_scan = 0.0
        dog.redis_epoch = time.time() - 100.0  # Redis has been up longer than the beats' ages
        dog.scan([_Handle(0, 0.5), _Handle(1, 2.5)], time.monotonic())
        out = dog.health_scalars()
    assert 2.4 < out["health/os_beat_age_max_s"] < 5
    assert 6.9 < out["health/redis_beat_age_max_s"] < 10
    assert out["health/workers_being_replaced"] == 0 and out["health/worker_restarts"] == 1

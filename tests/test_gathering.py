"""The driver's rule for when the ready slices are served (rlpipe/supervisor/gathering.py)."""

from __future__ import annotations

import numpy as np

from rlpipe.supervisor.gathering import BUSY_PER_CPU, MAX_WAIT_S, busy_workers, serve_now


def test_busy_workers_counts_workers_with_an_awake_slice_not_yet_rung():
    # 4 workers x 3 slices; worker 3's group is dormant
    slot_worker = np.repeat(np.arange(4), 3)
    awake = slot_worker < 3
    ready = np.zeros(12, dtype=bool)
    ready[[0, 1, 2]] = True  # worker 0: every slice rang (it waits on the driver)
    ready[[3, 4]] = True  # worker 1: one slice still in hand
    ready[9] = True  # worker 3 is dormant: a parked ring counts for nothing
    assert busy_workers(slot_worker, awake, ready) == (2, 3)
    assert busy_workers(slot_worker, awake, np.zeros(12, dtype=bool)) == (3, 3)
    assert busy_workers(slot_worker, awake, awake.copy()) == (0, 3)


def test_gathers_while_half_the_workers_and_two_per_cpu_step_a_slice():
    # 20 workers on 1 CPU: gather down to 10 busy
    assert not serve_now(busy=20, awake=20, worker_cpus=1, oldest_wait_s=0.0)
    assert not serve_now(busy=10, awake=20, worker_cpus=1, oldest_wait_s=0.0)
    assert serve_now(busy=9, awake=20, worker_cpus=1, oldest_wait_s=0.0)
    # 100 workers on 16 CPUs: half of them (50) outnumber two a CPU (32)
    assert not serve_now(busy=50, awake=100, worker_cpus=16, oldest_wait_s=0.0)
    assert serve_now(busy=49, awake=100, worker_cpus=16, oldest_wait_s=0.0)
    # 40 workers on 32 CPUs: two a CPU (64) is more than there are, so every ring is served
    assert serve_now(busy=40, awake=40, worker_cpus=32, oldest_wait_s=0.0)


def test_few_workers_serve_every_ring_at_once():
    for awake in range(1, 2 * BUSY_PER_CPU):
        assert serve_now(busy=awake, awake=awake, worker_cpus=2, oldest_wait_s=0.0)


def test_a_ready_slice_waits_at_most_max_wait():
    assert not serve_now(busy=20, awake=20, worker_cpus=1, oldest_wait_s=MAX_WAIT_S * 0.99)
    assert serve_now(busy=20, awake=20, worker_cpus=1, oldest_wait_s=MAX_WAIT_S)

"""The driver's rule for when the ready slices are served (rlpipe/supervisor/gathering.py)."""

from __future__ import annotations

import numpy as np

from rlpipe.supervisor.gathering import BUSY_PER_CPU, MAX_WAIT_S, busy_workers, rings_to_serve, serve_now


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


def test_rings_to_serve_counts_the_rings_of_the_workers_nearest_done():
    # 10 workers x 4 slices on 1 CPU: gather while 5 or more are busy (half of 10)
    slot_worker = np.repeat(np.arange(10), 4)
    awake = np.ones(40, dtype=bool)
    ready = np.zeros(40, dtype=bool)
    # nothing ready, all 10 busy: 6 workers must finish all 4 slices
    assert rings_to_serve(slot_worker, awake, ready, 1) == 6 * 4
    # workers 0-3 have 3 slices ready (1 in hand), worker 4 has 2: the 6 nearest need 1+1+1+1+2+4
    ready[[0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17]] = True
    assert rings_to_serve(slot_worker, awake, ready, 1) == 10
    # 4 busy: fewer than 5, so the next ring (or the ready ones now) makes a round due
    ready[:] = True
    ready[[3, 7, 11, 15]] = False
    assert rings_to_serve(slot_worker, awake, ready, 1) == 1


def test_rings_to_serve_agrees_with_serve_now_ring_by_ring():
    """Ringing slots in any order, a round is never due before the rings counted: the driver
    sleeping through them serves no later than it would have."""
    rng = np.random.default_rng(0)
    slot_worker = np.repeat(np.arange(12), 5)
    awake = slot_worker < 10  # two dormant groups: their rings count for nothing
    for _ in range(50):
        ready = np.zeros(60, dtype=bool)
        order = rng.permutation(np.flatnonzero(awake))
        need = rings_to_serve(slot_worker, awake, ready, 2)
        for rung, slot in enumerate(order, start=1):
            ready[slot] = True
            due = serve_now(*busy_workers(slot_worker, awake, ready), 2, 0.0)
            assert not due or rung >= need
            if due:
                break
            need = rung + rings_to_serve(slot_worker, awake, ready, 2)


def _reference_counts(slot_worker, awake, ready, worker_cpus):
    """busy_workers and rings_to_serve as first written, with np.unique (the rule itself)."""
    in_hand = slot_worker[awake & ~ready]
    _, slices_in_hand = np.unique(in_hand, return_counts=True)
    n_awake = len(np.unique(slot_worker[awake]))
    excess = len(slices_in_hand) - max(int(np.ceil(0.5 * n_awake)), BUSY_PER_CPU * worker_cpus)
    rings = 1 if excess < 0 else max(int(np.sort(slices_in_hand)[: excess + 1].sum()), 1)
    return (len(slices_in_hand), n_awake), rings


def test_the_counts_agree_with_the_rule_written_with_unique():
    """The driver's counts (bincount, an early return) give what np.unique gave, over layouts
    from one worker to 100, any awake and ready slots, on 1 to 16 CPUs."""
    rng = np.random.default_rng(7)
    for workers, slices in ((1, 2), (4, 25), (10, 10), (20, 5), (100, 1), (100, 2)):
        slot_worker = np.repeat(np.arange(workers), slices)
        n = len(slot_worker)
        for _ in range(100):
            awake = rng.random(n) < rng.choice([1.0, rng.random()])
            ready = rng.random(n) < rng.random()
            for cpus in (1, 2, 16):
                busy, rings = _reference_counts(slot_worker, awake, ready, cpus)
                assert busy_workers(slot_worker, awake, ready) == busy
                assert rings_to_serve(slot_worker, awake, ready, cpus) == rings

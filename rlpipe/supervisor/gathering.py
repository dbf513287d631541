"""When the training driver serves the ready slices: at once, or after gathering more of them.

An inference round costs a fixed part and a part per row. The fixed part is every present
type's tower called once, and torch's dispatch around it. On day4's twelve types the policy
alone took 2.6 ms for 70 rows (37 us a row) and 7.5 ms for 700 (10.7 us a row). Served the
moment one slice rang, day4's rounds held 70 rows at the median (one slice), and serving took
about 0.38 of a core. That was mostly the PPO update's core, since the driver is not pinned.
The update got 0.43 of its core, and trained samples/s followed (docs/benchmarks.md, "Rounds
gathered").

So the driver gathers. The ready slices wait while at least half the awake workers still have
a slice in hand: those keep their CPUs busy. A worker has `worker.slices` slices, so one whose
ring waits steps its others meanwhile. The ready slices are served as one round when fewer
workers than that are busy, or when the oldest of them has waited `MAX_WAIT_S`. The bound is
for a worker that falls silent holding its slices: it counts as busy until the watchdog
replaces it.

Gathering also needs at least `BUSY_PER_CPU` busy workers for each CPU the workers run on,
so that a CPU does not idle while the ready slices wait. Where there are not that many workers
(the quick start's one worker, or as many workers as CPUs), every ring is served at once, as
before. On the single-type CartPole and null rows of `benchmarks/driver_cost.py` gathering
changed nothing beyond the spread: one type's tower is a small fixed cost a round.
"""

from __future__ import annotations

import math

import numpy as np

BUSY_SHARE = 0.5  # gather while at least this share of the awake workers has a slice in hand
BUSY_PER_CPU = 2  # ... and at least this many busy workers per worker CPU
MAX_WAIT_S = 0.5  # the longest a ready slice waits for others


def busy_workers(slot_worker: np.ndarray, awake: np.ndarray, ready: np.ndarray) -> tuple[int, int]:
    """(workers with a slice in hand, workers with an awake slice), from per-slot arrays: each
    slot's worker id, whether its group is awake, whether its ring waits to be answered.
    Counted with bincount, not np.unique: the driver asks on every turn of its loop, and
    unique's sort cost 9-22 us a call at 2 to 200 slots, against 3 us."""
    return _workers(slot_worker[awake & ~ready]), _workers(slot_worker[awake])


def _workers(slot_worker: np.ndarray) -> int:
    """How many distinct workers these slots belong to (ids are small ints: the fleet's index)."""
    return int(np.count_nonzero(np.bincount(slot_worker)))


def keep_busy(awake: int, worker_cpus: int) -> int:
    """How many workers must still step a slice for the ready ones to wait."""
    return max(math.ceil(BUSY_SHARE * awake), BUSY_PER_CPU * worker_cpus)


def serve_now(busy: int, awake: int, worker_cpus: int, oldest_wait_s: float) -> bool:
    """Whether the ready slices are served now (there are some: the caller checks). `busy` and
    `awake`: `busy_workers`; `worker_cpus`: the CPUs the workers run on."""
    return busy < keep_busy(awake, worker_cpus) or oldest_wait_s >= MAX_WAIT_S


def rings_to_serve(slot_worker: np.ndarray, awake: np.ndarray, ready: np.ndarray, worker_cpus: int) -> int:
    """The fewest rings after which `serve_now` can say yes without the wait bound: 1 while
    fewer than `keep_busy` workers step a slice (or none is ready: a ring makes one so), else
    the rings of the workers nearest to done, as many of them as must stop being busy. Rings
    only make slots ready, so none before then can make a round due; the driver sleeps
    through them (rlpipe.native.bell, `min_rings`)."""
    awake_workers = _workers(slot_worker[awake])
    if awake_workers < keep_busy(awake_workers, worker_cpus):
        return 1  # too few workers to gather among (the quick start's one): every ring
    slices_in_hand = np.bincount(slot_worker[awake & ~ready])
    slices_in_hand = slices_in_hand[slices_in_hand > 0]
    excess = len(slices_in_hand) - keep_busy(awake_workers, worker_cpus)
    if excess < 0:
        return 1
    return max(int(np.sort(slices_in_hand)[: excess + 1].sum()), 1)

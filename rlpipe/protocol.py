"""What the driver, the learner and the workers agree on, in one place: how a worker's envs
split into slices and slices into slots, what the learner gets of a round, and the names of
the Redis keys and channels they share (the doorbells, words in shared memory, are
`rlpipe.shm.doorbell`'s). Every side imports these; none spells them out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def slice_bounds(n_envs: int, slices: int) -> list[tuple[int, int]]:
    """Split a worker's n envs into `slices` contiguous, near-equal, non-empty ranges."""
    slices = max(1, min(slices, n_envs))
    edges = [round(i * n_envs / slices) for i in range(slices + 1)]
    return [(edges[i], edges[i + 1]) for i in range(slices)]


def slot_count(env_count: int, group_size: int, slices: int) -> int:
    """The slices of every worker: groups of `group_size` envs (the last one the rest), each
    cut into `slices`. A slot is one of them; worker k's are numbered from the sum of the
    slices of the workers before it (the doorbell board's and the slot table's numbering)."""
    return sum(len(slice_bounds(min(group_size, env_count - lo), slices)) for lo in range(0, env_count, group_size))


def batch_rows(first_env: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slots of `counts` envs from `first_env` on, one after another as a round's batch:
    (each slot's first row in the batch, each row's env id)."""
    ends = np.cumsum(counts)
    starts = ends - counts
    return starts, np.repeat(first_env - starts, counts) + np.arange(int(ends[-1]) if len(ends) else 0)


def stepped_rows(seqs: np.ndarray, counts: np.ndarray, final: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A round's rows that follow a step (bool: their slot's seq > 0, not a (re)started worker's
    first obs), and those of them whose episode carries a final obs (`final`: the results' flag)."""
    stepped = np.repeat(seqs > 0, counts)
    return stepped, np.flatnonzero(final.astype(bool) & stepped)


@dataclass
class Round:
    """The ready slices of one round, in the order they rang, as rows of one batch: what the
    slice engine's `recv` hands its client (rlpipe.supervisor.slot_table) and the learner reads."""

    slots: np.ndarray  # int64 [k]: the ready slots
    seqs: np.ndarray  # int64 [k]: each slot's step (0: its worker's first obs, nothing stepped)
    starts: np.ndarray  # int64 [k]: each slot's first row in the batch
    counts: np.ndarray  # int64 [k]: each slot's rows (envs)
    rows: np.ndarray  # int64 [n]: each row's env id (0 .. env_count)
    types: np.ndarray  # int64 [n]: each row's env type index
    obs: dict  # obs key -> [n, ...]: what the board shows now (after the step, autoreset done)
    results: dict  # RESULT_FIELDS -> [n, ...]: the step that led there (rows of stepped slots)
    stepped: np.ndarray  # bool [n]: the row's slot stepped (seq > 0): its results are a step's
    final_rows: np.ndarray  # int64: batch rows whose episode a time limit ended (their final obs)
    final_obs: dict  # obs key -> [len(final_rows), ...]: the obs each of them ended on
    torn_retries: int
    # bool [k]: the slot's worker was replaced since the slot was last received (the engine's
    # recv sets it; its seq counts from the new generation's first obs)
    restarted: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.rows)


# --- Redis key names -------------------------------------------------------------------------


def run_key(run_id: str) -> str:
    """Hash: the run's state (written by the driver)."""
    return f"rlpipe:{run_id}:run"


def worker_key(run_id: str, worker_id: int) -> str:
    """Hash: a worker's Redis heartbeat (pid, generation, steps, RSS, time)."""
    return f"rlpipe:{run_id}:worker:{worker_id}"


def reward_stats_key(run_id: str, worker_id: int) -> str:
    """String: a worker's packed reward-normalization statistics."""
    return f"rlpipe:{run_id}:rnorm:{worker_id}"


def epsilon_channel(run_id: str, worker_id: int) -> str:
    """Pub/sub channel: the exploration rates of a worker's envs."""
    return f"rlpipe:{run_id}:eps:{worker_id}"

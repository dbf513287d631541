"""What one worker process is given: a WorkerSpec, pickled once at spawn (nothing crosses a
socket later), so it works under both the forkserver and spawn start methods.

It holds plain values only: the worker layer never imports the config schema (nor Hydra
through it). `rlpipe.supervisor.fleet.Fleet.worker_spec` is the one place a WorkerSpec is
built, from the run's RunSpec and mix plan, the run's services and the worker's own fields.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import EnvSpec
from rlpipe.spec import ObsKey


@dataclass(frozen=True)
class WorkerSpec:
    # -- this worker
    worker_id: int
    generation: int
    env_lo: int
    type_index: np.ndarray          # env type index of each of this worker's envs
    segment_name: str
    cgroup_paths: tuple[str, ...]   # cgroup.procs files of the group's dormant cgroup (empty: none)
    active_cgroup_paths: tuple[str, ...]   # ... and of the active one, for a wake that raced us
    # -- this run: its driver and services
    run_id: str
    driver_pid: int                 # a worker whose driver is gone stops
    doorbell_path: str              # the driver's doorbell socket (rlpipe.doorbell)
    lifecycle_endpoint: str
    redis_url: str                  # the live service (embedded, or redis.url)
    # -- this run: env types and board
    type_names: tuple[str, ...]
    type_nodes: tuple[dict, ...]    # config node per type (instantiated once per type here)
    type_specs: tuple[EnvSpec, ...]
    type_versions: tuple[str, ...]
    obs_keys: tuple[ObsKey, ...]
    cont_dim: int
    locked_board: bool              # buffer.sync=lock
    env_id_offset: int              # global id of local env 0 (a torchrun rank's offset; rlpipe.ranks)
    seed: int                       # run.seed
    # -- settings from conf/ (worker:, heartbeat:, scaling:, reward_norm:)
    slices: int
    threads: int
    step_timeout_s: float | None
    max_rss_mb: float | None
    cpu_affinity: tuple[int, ...] | None
    sched_fifo: int | None
    doorbell_timeout_s: float
    heartbeat_redis_interval_s: float
    heartbeat_signal_interval_s: float
    scaling_enabled: bool           # score envs, apply the learner's exploration rates
    scaling_window: int
    reward_norm_mode: str           # per_env | per_type | global | mean_std | off
    reward_norm_clip: float | None
    reward_norm_sync_every: int
    reward_norm_gamma: float        # learner.gamma: the return whose std scales rewards
    # -- what the driver reads back
    # The end obs of every ended episode in the final-obs rows, not only of time-limit
    # truncations (the learner bootstraps from those alone; rlpipe.vector hands every end obs
    # to its caller, as Gymnasium's same-step autoreset does).
    final_obs_all_ends: bool = False

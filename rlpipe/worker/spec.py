"""What one worker process is given: a WorkerSpec, pickled once at spawn (nothing crosses a
socket later), so it works under both the forkserver and spawn start methods.

It holds plain values only: the worker layer never imports the config schema (nor Hydra
through it). `rlpipe.supervisor.fleet.Fleet.worker_spec` is the one place a WorkerSpec is
built, from the run's RunSpec and mix plan, the run's services and the worker's own fields.

The conf/ sections a worker reads travel nested, under their conf/ names, as the plain twins
below: `spec.worker.step_timeout_s` is `worker.step_timeout_s`. A twin declares a subset of
its section's fields, with the same names, as the schema (rlpipe/config.py) resolved them;
`twin` fills one from its section, so no field is renamed or copied by hand. (The schema's own
dataclasses cannot travel: rlpipe.config sits above the worker layer and imports from it, see
docs/architecture.md "Package layers", so a worker unpickling them would depend on the layer
above it.)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from rlpipe.envs.contract import EnvSpec
from rlpipe.spec import ObsKey


def twin(cls, section, **derived):
    """A `cls` twin of a config section: each field from the same-named attribute of `section`
    (a dataclass of rlpipe.config), or from `derived` for a value the section does not hold."""
    return cls(**{f.name: derived[f.name] if f.name in derived else getattr(section, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class WorkerPoolSettings:
    """`worker:` (rlpipe.config.WorkerPoolSpec, `slices` and `cpu_affinity` resolved)."""

    slices: int
    threads: int
    step_timeout_s: float | None
    max_rss_mb: float | None
    crash_backoff: bool
    cpu_affinity: tuple[int, ...] | None
    sched_fifo: int | None
    doorbell_timeout_s: float


@dataclass(frozen=True)
class HeartbeatSettings:
    """`heartbeat:`, the two beats a worker sends (rlpipe.config.HeartbeatSpec)."""

    signal_interval_s: float
    redis_interval_s: float


@dataclass(frozen=True)
class ScalingSettings:
    """`scaling:`: score envs and apply the learner's exploration rates (rlpipe.config.ScalingSpec)."""

    enabled: bool
    window: int


@dataclass(frozen=True)
class RewardNormSettings:
    """`reward_norm:` (rlpipe.config.RewardNormSpec), with `gamma` from learner.gamma: the
    return whose std scales rewards."""

    mode: str  # per_env | per_type | global | mean_std | off
    clip: float | None
    sync_every: int
    gamma: float


@dataclass(frozen=True)
class WorkerSpec:
    # -- this worker
    worker_id: int
    generation: int
    env_lo: int
    type_index: np.ndarray  # env type index of each of this worker's envs
    segment_name: str
    cgroup_paths: tuple[str, ...]  # cgroup.procs files of the group's dormant cgroup (empty: none)
    active_cgroup_paths: tuple[str, ...]  # ... and of the active one, for a wake that raced us
    # -- this run: its driver and services
    run_id: str
    driver_pid: int  # a worker whose driver is gone stops
    doorbell_segment: str  # the driver's bell page (rlpipe.shm.doorbell)
    lifecycle_endpoint: str
    redis_url: str  # the live service (embedded, or redis.url)
    # -- this run: env types and board
    type_names: tuple[str, ...]
    type_nodes: tuple[dict, ...]  # config node per type (instantiated once per type here)
    type_specs: tuple[EnvSpec, ...]
    type_versions: tuple[str, ...]
    obs_keys: tuple[ObsKey, ...]
    cont_dim: int
    locked_board: bool  # buffer.sync=lock
    env_id_offset: int  # global id of local env 0 (a torchrun rank's offset; rlpipe.ranks)
    seed: int  # run.seed
    # -- settings from conf/, by section (built once a run: Fleet.start)
    worker: WorkerPoolSettings
    heartbeat: HeartbeatSettings
    scaling: ScalingSettings
    reward_norm: RewardNormSettings
    # -- what the driver reads back
    # The end obs of every ended episode in the final-obs rows, not only of time-limit
    # truncations (the learner bootstraps from those alone; rlpipe.vector hands every end obs
    # to its caller, as Gymnasium's same-step autoreset does).
    final_obs_all_ends: bool = False
    # This process's stdout and stderr go to this file, capped (rlpipe.outputlog); "": they
    # stay the driver's
    output_log: str = ""

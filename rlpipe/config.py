"""The run's settings: one typed declaration per setting, its default in `conf/`.

Hydra composes `conf/` over the schema below (registered as `rlpipe_schema`), so OmegaConf
checks each value's type as it composes. `run_spec(cfg)` turns the composed config into these
same dataclasses (`OmegaConf.to_object`): plain Python objects, so no hot loop touches
OmegaConf. Each dataclass checks its values in `__post_init__` (the check of a single value is
declared beside its field with `setting(...)`; checks across fields follow it) and raises
ConfigError with one paragraph naming the key and what is allowed. Values derived from
several keys (the env types and their names, the obs keys, and the process layout:
`groups.size`, `worker.slices` and `worker.cpu_affinity` resolved from `auto` by
rlpipe/process_layout.py into `spec.layout`) are computed there once.

Defaults live in `conf/` only: a field's default is MISSING, so a key that no YAML file sets
is an error when the spec is built instead of silently taking a second, Python-side default.
The exceptions are keys that only some files set: `env_mix.id` and `env_mix.name` (only
env_mix=gym names an id, and a type after it) and the dtype of a buffer key added on the
command line. tests/test_conf_keys.py checks this, and that every key in `conf/` is read by
some code.

The dataclasses are not frozen: OmegaConf makes a frozen dataclass's node read-only, and Hydra
could then not merge the YAML files and command-line overrides into the schema. Code treats
them as read-only after `run_spec`; `rlpipe.ranks.rank_spec` derives a rank's spec with
`dataclasses.replace` (which runs the replaced objects' checks again) and sets its
`env_id_offset`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from rlpipe import config_checks as checks, mix_learner, process_layout
from rlpipe.chaos_faults import ticked_faults
from rlpipe.config_checks import (
    count,
    fail,
    fifo,
    fraction_of_ranks,
    one_of,
    positive,
    positive_int,
    positive_int_or_null,
    positive_ints,
    positive_or_null,
    redis_url,
    run_checks,
    setting,
    step_size,
    unit_interval,
    unit_intervals,
)
from rlpipe.config_compat import fill_newer_settings
from rlpipe.spec import BOARD_SIZINGS, OBS_DTYPES, OBS_KEYS, ConfigError, EnvTypeSpec, ObsKey  # noqa: F401 (re-exported)
from rlpipe.worker.rewardnorm import MODES as REWARD_NORM_MODES


def conf_dir() -> Path:
    """`conf/` at the repository root (checkout) or shipped inside the package (install)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"rlpipe: no conf/config.yaml next to {here}")


class _Section:
    """A group of conf/ (`learner:`, `groups:`...): its fields' checks run on construction."""

    _key = ""  # the group's key in conf/ (a class attribute, not a setting)

    def __post_init__(self) -> None:
        run_checks(self, f"{self._key}." if self._key else "")


@dataclass
class BufferKeySpec:
    shape: list[int] = MISSING
    dtype: str = "float32"  # the default of an entry added on the command line


@dataclass
class BufferSpec(_Section):
    """The board: obs keys (checked with the whole spec, which derives `obs_keys`: the configured
    keys; under sizing=auto the run's plan grows them to the mix, rlpipe/envs/sizing.py) and sync."""

    _key = "buffer"
    sync: str = setting(one_of("seqlock", "lock"))  # seqlock | lock (mutex per env, ablation)
    sizing: str = setting(one_of(*BOARD_SIZINGS))  # auto: keys grown to the mix at plan time | fixed
    keys: dict[str, BufferKeySpec] = MISSING


@dataclass
class EnvMixSpec:
    """Env types and their weights (checked with the whole spec, which derives `env_types`)."""

    types: dict[str, Any] = MISSING  # each type's env config node, passed to its constructor
    weights: dict[str, float] = MISSING
    id: Optional[str] = None  # env_mix=gym: the Gymnasium id to run (no other mix has one)
    name: Optional[str] = None  # env_mix=gym: the type's name (null: after the id)


@dataclass
class GroupsSpec(_Section):
    _key = "groups"
    size: Any = setting(checks.group_size)  # auto | envs per worker process; RunSpec resolves auto
    hot: int = setting(positive_int)  # groups active from the start
    wake_after_steps: int = setting(positive_int)  # steps each env of the last woken group makes first
    wake_batch: int = setting(positive_int)  # groups woken at once
    wake_growth: float = setting(positive)  # the batch is multiplied by this after each wake
    cgroup: str = setting(one_of("auto", "v2", "v1", "none"))
    dormant_cpu_pct: float = setting(positive)
    dormant_mem_mb: int = setting(positive_int)
    active_mem_mb: Any = setting(checks.active_mem_mb)  # auto | MiB for the awake workers and the probe

    def __post_init__(self) -> None:
        super().__post_init__()
        self.size_setting = self.size  # as configured: RunSpec writes the resolved size over `size`
        if self.wake_growth < 1:
            fail("groups.wake_growth", self.wake_growth, "allowed is a number >= 1 (the wake batch never shrinks)")
        if self.dormant_cpu_pct > 100:
            fail("groups.dormant_cpu_pct", self.dormant_cpu_pct, "allowed is a percentage in (0, 100]")


@dataclass
class WorkerPoolSpec(_Section):
    """`worker:`, how every worker process runs (WorkerSpec is one worker's own spec)."""

    _key = "worker"
    slices: Any = MISSING  # auto | N; RunSpec resolves auto (it needs env_count, groups.size)
    threads: int = setting(positive_int)
    start_method: str = setting(one_of("forkserver", "spawn"))
    doorbell_timeout_s: float = setting(positive)
    step_timeout_s: Optional[float] = setting(positive_or_null)
    max_rss_mb: Optional[float] = setting(positive_or_null)
    crash_backoff: bool = MISSING  # an env faulting 3 times in a row waits before its rebuild (rlpipe.worker.backoff)
    # null | auto | learner_core | [cpu, ...]; becomes None or the workers' CPUs (learner_core:
    # theirs once every env stepped, spec.layout)
    cpu_affinity: Any = MISSING
    sched_fifo: Optional[int] = setting(fifo)

    def __post_init__(self) -> None:
        super().__post_init__()
        # as configured (RunSpec writes the resolved values over `slices` and `cpu_affinity`,
        # and resolves again from these in a dataclasses.replace: rlpipe.dist.rank_spec)
        self.slices_setting = self.slices
        self.affinity_setting = checks.affinity(self.cpu_affinity)


@dataclass
class LearnerSpec(_Section):
    _key = "learner"
    mode: str = setting(one_of("ppo", "random"))  # ppo: policy acts and trains | random: uniform actions
    device: str = setting(checks.learner_device)
    torch_threads: int = setting(positive_int)
    update_in: str = setting(one_of("auto", "process", "thread"))  # where PPO updates run (learner/update_process.py)
    hidden: list[int] = setting(positive_ints("a non-empty list of positive ints"))
    cnn_channels: list[int] = setting(positive_ints("a list of three positive ints", 3))
    cnn_out: int = setting(positive_int)
    backlog: str = setting(one_of("hold", "drop", "sync"))  # what the learner does while an update lags behind
    # auto | a number: rollout_len and update_envs follow the mix (rlpipe/mix_learner.py
    # resolves auto from type_rollout_len and update_envs_per_type below)
    rollout_len: Any = setting(checks.positive_int_or_auto)
    update_envs: Any = setting(checks.positive_int_or_auto)
    type_rollout_len: int = setting(positive_int)  # a type's rollout where its env node asks for none
    update_envs_per_type: int = setting(positive_int)
    learning_rate: float = setting(positive)
    anneal_lr: bool = MISSING
    gamma: float = setting(unit_interval)
    gae_lambda: float = setting(unit_interval)
    clip_coef: float = setting(positive)
    clip_vloss: bool = MISSING
    ent_coef: float = setting(checks.at_least_zero)
    vf_coef: float = setting(positive)
    max_grad_norm: float = setting(positive)
    epochs: int = setting(positive_int)
    minibatch_size: int = setting(positive_int)
    value_norm: str = setting(one_of("popart", "none"))
    popart_beta: float = setting(step_size)  # PopArt's per-sample step size of the value statistics
    log_std_init: float = setting(checks.log_std)  # the Gaussian head's log std at the start
    value_init_std: float = setting(positive)  # the critic's output layer's init scale (orthogonal gain)
    adv_std_floor: float = setting(checks.at_least_zero)  # adv_norm=per_type divides by no less (return units)
    type_settings: str = setting(one_of("per_type", "shared"))  # shared: env nodes' `learner:` ignored
    adv_norm: str = setting(one_of("per_type", "batch", "none"))
    checkpoint_interval_s: float = setting(positive)
    keep_checkpoints: int = setting(positive_int)
    export: bool = MISSING  # write export/policy.pt at the end
    loss_std_at: list[float] = setting(unit_intervals)
    loss_std_window: int = setting(positive_int)

    def __post_init__(self) -> None:
        super().__post_init__()
        # tuples: the policy's shape is compared and saved by value (checkpoint compat)
        self.hidden, self.cnn_channels = tuple(self.hidden), tuple(self.cnn_channels)
        self.loss_std_at = tuple(self.loss_std_at)


# The learner settings an env type may set for itself (`learner:` in its env node, e.g.
# conf/env/lunar_lander.yaml): the discount and GAE's lambda (a type's horizon), the entropy
# bonus (how much it explores), PopArt's step size (how fast its value scale follows its
# returns), the Gaussian head's initial log std (how widely a continuous type explores before
# it has learned anything), the init scale of its value output and the floor under its
# advantages' std (before a sparse-reward type's first reward its advantages are its critic's
# starting guesses differenced; scaled to unit size they would train its head on noise). Each
# row of a batch is trained with its type's values (rlpipe/learner/type_settings.py); a key a
# type leaves out is the learner's. Everything else is one value for the whole update: the
# clip, the optimizer and its schedule, epochs, minibatches, gradient clipping and the
# value-loss weight (with PopArt every type's value loss is in its own normalized scale).
TYPE_LEARNER_KEYS = (
    *("gamma", "gae_lambda", "ent_coef", "popart_beta"),
    *("log_std_init", "value_init_std", "adv_std_floor"),
)
# What a type may ask of the whole update: the run takes the most any type of the mix asks for
# (learner.rollout_len=auto, rlpipe/mix_learner.py), a number in the config overrules them.
TYPE_RUN_KEYS = ("rollout_len",)


def type_learner_checks() -> dict[str, checks.Check]:
    """Each per-type key's check: the one declared on its LearnerSpec field (a type's
    rollout is a number: `auto` is the learner's)."""
    declared = {f.name: f.metadata.get("check") for f in dataclasses.fields(LearnerSpec)}
    return {**{name: declared[name] for name in TYPE_LEARNER_KEYS}, **dict.fromkeys(TYPE_RUN_KEYS, positive_int)}


@dataclass
class ScalingSpec(_Section):
    _key = "scaling"
    enabled: bool = MISSING
    window: int = setting(positive_int)
    min_weight: float = setting(unit_interval)
    publish_interval_s: float = setting(positive)
    eps_max: float = setting(unit_interval)
    eps_min: float = setting(unit_interval)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 2:
            fail("scaling.window", self.window, "allowed is an integer >= 2 (a std needs two rewards)")


@dataclass
class RewardNormSpec(_Section):
    _key = "reward_norm"
    mode: str = setting(one_of(*REWARD_NORM_MODES))  # rlpipe.worker.rewardnorm; gamma is learner.gamma
    clip: Optional[float] = setting(positive_or_null)
    sync_every: int = setting(positive_int)


@dataclass
class RedisSpec(_Section):
    _key = "redis"
    url: Optional[str] = setting(redis_url)  # null: the driver starts an embedded redis-server
    start_wait_s: float = setting(positive)  # an external url that does not answer: how long the start waits


@dataclass
class HeartbeatSpec(_Section):
    _key = "heartbeat"
    signal_interval_s: float = setting(positive)
    redis_interval_s: float = setting(positive)
    scan_interval_s: float = setting(positive)
    timeout_s: float = setting(positive)
    term_grace_s: float = setting(positive)
    startup_timeout_s: float = setting(positive)

    def __post_init__(self) -> None:
        super().__post_init__()
        slowest = max(self.signal_interval_s, self.redis_interval_s)
        if self.timeout_s <= slowest:
            fail(
                "heartbeat.timeout_s",
                self.timeout_s,
                f"allowed is more than the slowest beat interval ({slowest} s), or every worker would look dead",
            )


@dataclass
class ChaosSpec(_Section):
    """`chaos:`, one setting per fault of rlpipe.chaos_faults (null: off); what each does is
    its fault class's docstring."""

    _key = "chaos"
    kill_worker_every_s: Optional[float] = setting(positive_or_null)
    stop_worker_every_s: Optional[float] = setting(positive_or_null)
    kill_redis_at_s: Optional[float] = setting(positive_or_null)
    pause_redis_at_s: Optional[float] = setting(positive_or_null)
    freeze_driver_at_s: Optional[float] = setting(positive_or_null)

    @property
    def enabled(self) -> bool:
        """Whether the chaos runner has a fault to inject (the driver's loop freezes itself)."""
        return bool(ticked_faults(self))


@dataclass
class RunControlSpec(_Section):
    """`run:`, what the job does and when it stops (RunSpec is the whole run)."""

    _key = "run"
    mode: str = setting(one_of("train", "validate"))  # validate: day0, check every env type, no learner
    # true | false | auto (Any: a str field would turn YAML's true into "True"; checked here)
    resume: Any = setting(checks.resume_mode)
    stall_timeout_s: Optional[float] = setting(positive_or_null)  # the driver's stall detector (null: off)
    # the driver's C heap (rlpipe.heap): blocks this large get their own mapping; malloc arenas
    # at most; free memory a heap's top keeps; malloc_trim after each PPO update in the driver's
    # thread (the update process keeps its own heap: heap.keep_freed_blocks) (null: glibc's default)
    mmap_threshold_mb: Optional[float] = setting(positive_or_null)
    malloc_arena_max: Optional[int] = setting(positive_int_or_null)
    trim_threshold_mb: Optional[float] = setting(positive_or_null)
    trim_after_update: bool = MISSING
    duration_s: Optional[float] = setting(positive_or_null)
    total_env_steps: Optional[int] = setting(positive_int_or_null)
    seed: int = setting(checks.seed)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.duration_s is None and self.total_env_steps is None:
            fail(
                "run.duration_s",
                None,
                "allowed is a positive number, or null only when "
                "run.total_env_steps is set (with both null the run never stops)",
            )


@dataclass
class LoggingSpec(_Section):
    _key = "logging"
    progress_interval_s: float = setting(positive)
    aggregate_interval_s: float = setting(positive)
    random_return_episodes: int = setting(count)  # random-action episodes per type (0: none)
    random_return_budget_s: float = setting(positive)  # ... and the most seconds spent on one type
    initial_policy_episodes: int = setting(count)  # the untrained policy's episodes per type (0: none)
    resources_interval_s: float = setting(positive)  # the least seconds between two resource samples
    health_interval_s: float = setting(positive)  # the seconds between two charts of them (and of health/)
    long_run_min_s: float = setting(positive)  # a loop this long gets the long-run verdict
    project_to_s: Optional[float] = setting(positive_or_null)  # the verdict's horizon (null: run.duration_s)


@dataclass
class EvalSpec(_Section):
    """`eval:`, evaluation during training (rlpipe/supervisor/evaluation.py): every
    `interval_s` a child at nice 19 plays `episodes` deterministic episodes of each env type on
    envs of its own, with the policy's weights of that moment."""

    _key = "eval"
    interval_s: Optional[float] = setting(positive_or_null)  # null: no evaluation during training
    episodes: int = setting(positive_int)  # deterministic episodes per type and round
    budget_s: float = setting(positive)  # the most seconds a round spends on one type
    max_steps: int = setting(positive_int)  # an episode still running after this many steps is cut


@dataclass
class DistSpec(_Section):
    """Multi-rank training under torchrun (rlpipe.ranks); ignored in a single process."""

    _key = "dist"
    sync_frac: float = setting(fraction_of_ranks)  # an update round starts once this fraction has its rollout
    backend: str = setting(one_of("auto", "gloo", "nccl"))
    timeout_s: float = setting(positive)  # a collective waiting longer fails the job


@dataclass
class RunSpec(_Section):
    """Everything a run needs. Derived on construction, beside the fields:
    `env_types` (EnvTypeSpec per weighted type of env_mix; the type running env_mix.id named
    after it; a node's `learner:` checked and kept apart as the type's `learner`), `obs_keys`
    (ObsKey per buffer key, in board order, before sizing=auto grows them) and `layout`
    (rlpipe.process_layout.Layout: workers, groups, slices and CPUs, `auto` resolved for this
    machine), written back as ints into `groups.size` and `worker.slices`, the workers' CPUs
    into `worker.cpu_affinity` and the update thread's into `learner_cpu`; the learner's `auto`
    rollout_len and update_envs resolved from the mix (`learner_from` says how)."""

    env_mix: EnvMixSpec = MISSING
    buffer: BufferSpec = MISSING
    groups: GroupsSpec = MISSING
    worker: WorkerPoolSpec = MISSING
    learner: LearnerSpec = MISSING
    scaling: ScalingSpec = MISSING
    reward_norm: RewardNormSpec = MISSING
    redis: RedisSpec = MISSING
    heartbeat: HeartbeatSpec = MISSING
    chaos: ChaosSpec = MISSING
    run: RunControlSpec = MISSING
    logging: LoggingSpec = MISSING
    eval: EvalSpec = MISSING
    dist: DistSpec = MISSING
    env_count: int = setting(positive_int)
    stage: Optional[str] = MISSING
    # Not a setting: the first global env id of this rank (rlpipe.ranks.rank_spec sets it).
    env_id_offset = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        checks.redis_faults_need_the_embedded_server(self.chaos, self.redis.url)
        self.env_types = checks.named_after_id(
            checks.env_types(self.env_mix.types, self.env_mix.weights, type_learner_checks()),
            self.env_mix.id,
            self.env_mix.name,
        )
        if self.env_count < len(self.env_types):
            fail("env_count", self.env_count, f"allowed is at least one env per type ({len(self.env_types)} types)")
        # learner settings that follow the mix: auto becomes a number here, and how it was chosen
        # is kept for the log and summary.json (a replace() sees the numbers: "set")
        self.learner_from = mix_learner.resolve(self.learner, self.env_types, self.env_count)
        self.obs_keys = checks.obs_keys(self.buffer.keys)
        # from the settings as configured, so a replace() with another env_count (a torchrun
        # rank's share) resolves auto again
        self.layout = process_layout.resolve(
            self.env_count,
            self.groups.size_setting,
            self.worker.slices_setting,
            self.worker.affinity_setting,
            self.learner.mode,
            self.learner.device,
        )
        checks.slices(self.worker.slices_setting, self.layout.group_size)
        self.groups.size, self.worker.slices = self.layout.group_size, self.layout.slices
        # learner_core: the workers' CPUs and the one kept for the PPO update thread
        self.worker.cpu_affinity, self.learner_cpu = self.layout.worker_cpus, self.layout.learner_cpu


def register_schema() -> None:
    ConfigStore.instance().store(name="rlpipe_schema", node=RunSpec)


mix_learner.register_alone(conf_dir)  # before any config resolves: an env_mix file's `${alone:...}`


def run_spec(cfg: DictConfig) -> RunSpec:
    """The composed config as a checked RunSpec (raises ConfigError, or OmegaConf's error for a
    wrong type). A config read back from a file (a run's .hydra/config.yaml) is typed first
    (a run's from before buffer.sizing gets `fixed`, the board it ran on)."""
    if OmegaConf.get_type(cfg) is not RunSpec:
        cfg = OmegaConf.merge(OmegaConf.structured(RunSpec), cfg)
        if OmegaConf.is_missing(cfg.buffer, "sizing"):
            # saved before buffer.sizing existed: every board then was used as written
            cfg.buffer.sizing = "fixed"
        register_schema()  # conf/config.yaml's defaults name it; a process that composed nothing yet has not
        fill_newer_settings(cfg, conf_dir())
    return OmegaConf.to_object(cfg)

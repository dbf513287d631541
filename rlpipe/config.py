"""Structured-config schema, validation with clear errors, and the plain values the engine runs on.

Hydra composes `conf/`; the schema below (registered as `rlpipe_schema`) makes OmegaConf
check types at composition. `validate()` then checks what types cannot say (ranges, shapes,
weights) and raises ConfigError with one paragraph naming the key and what is allowed.
`to_plain()` copies every value the engine needs into frozen dataclasses once, so no hot
loop ever touches OmegaConf.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from rlpipe.spec import OBS_DTYPES, OBS_KEYS, ConfigError, EnvTypeSpec, ObsKey  # noqa: F401 (re-exported)
from rlpipe.worker.rewardnorm import MODES as REWARD_NORM_MODES

log = logging.getLogger("rlpipe.config")


def conf_dir() -> Path:
    """`conf/` at the repository root (checkout) or shipped inside the package (install)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"rlpipe: no conf/config.yaml next to {here}")


# --- schema (types only; ranges are checked in validate()) ---------------------------------

@dataclass
class ObsKeySchema:
    shape: list[int] = MISSING
    dtype: str = "float32"


@dataclass
class BufferSchema:
    sync: str = "seqlock"
    keys: dict[str, ObsKeySchema] = field(default_factory=dict)


@dataclass
class EnvMixSchema:
    types: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    id: Optional[str] = None        # env_mix=gym: the Gymnasium id to run


@dataclass
class GroupsSchema:
    size: int = 70
    hot: int = 1
    wake_after_steps: int = 1000
    wake_batch: int = 1
    wake_growth: float = 1.0
    cgroup: str = "auto"
    dormant_cpu_pct: float = 1.0
    dormant_mem_mb: int = 512


@dataclass
class WorkerSchema:
    slices: Any = "auto"
    threads: int = 1
    start_method: str = "forkserver"
    doorbell_timeout_s: float = 1.0
    step_timeout_s: Optional[float] = 30.0
    max_rss_mb: Optional[float] = None
    cpu_affinity: Any = None
    sched_fifo: Optional[int] = None


@dataclass
class LearnerSchema:
    mode: str = "ppo"
    device: str = "cpu"
    torch_threads: int = 1
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    cnn_channels: list[int] = field(default_factory=lambda: [32, 64, 64])
    cnn_out: int = 256
    backlog: str = "hold"
    rollout_len: int = 32
    update_envs: int = 64
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    epochs: int = 4
    minibatch_size: int = 512
    value_norm: str = "popart"
    popart_beta: float = 3.0e-4
    adv_norm: str = "per_type"
    checkpoint_interval_s: float = 300.0
    keep_checkpoints: int = 3
    export: bool = False
    loss_std_at: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    loss_std_window: int = 20


@dataclass
class ScalingSchema:
    enabled: bool = False
    window: int = 100
    min_weight: float = 0.3
    publish_interval_s: float = 5.0
    eps_max: float = 0.1
    eps_min: float = 0.0


@dataclass
class RewardNormSchema:
    mode: str = "off"
    clip: Optional[float] = 10.0
    sync_every: int = 1000


@dataclass
class RedisSchema:
    url: Optional[str] = None


@dataclass
class HeartbeatSchema:
    signal_interval_s: float = 1.0
    redis_interval_s: float = 10.0
    scan_interval_s: float = 30.0
    timeout_s: float = 90.0
    term_grace_s: float = 5.0
    startup_timeout_s: float = 300.0


@dataclass
class ChaosSchema:
    kill_worker_every_s: Optional[float] = None
    stop_worker_every_s: Optional[float] = None
    kill_redis_at_s: Optional[float] = None


@dataclass
class RunSchema:
    mode: str = "train"
    resume: bool = False
    duration_s: Optional[float] = 300.0
    total_env_steps: Optional[int] = None
    seed: int = 1


@dataclass
class DistSchema:
    sync_frac: float = 0.6
    backend: str = "auto"
    timeout_s: float = 300.0


@dataclass
class LoggingSchema:
    progress_interval_s: float = 10.0
    aggregate_interval_s: float = 60.0
    random_return_episodes: int = 20
    random_return_budget_s: float = 30.0


@dataclass
class RlpipeSchema:
    env_mix: EnvMixSchema = MISSING
    buffer: BufferSchema = MISSING
    groups: GroupsSchema = MISSING
    worker: WorkerSchema = MISSING
    learner: LearnerSchema = MISSING
    scaling: ScalingSchema = MISSING
    reward_norm: RewardNormSchema = MISSING
    redis: RedisSchema = MISSING
    heartbeat: HeartbeatSchema = MISSING
    chaos: ChaosSchema = MISSING
    run: RunSchema = MISSING
    logging: LoggingSchema = MISSING
    dist: DistSchema = MISSING
    env_count: int = 64
    stage: Optional[str] = None


def register_schema() -> None:
    ConfigStore.instance().store(name="rlpipe_schema", node=RlpipeSchema)


# --- plain values (ObsKey and EnvTypeSpec are in rlpipe/spec.py) ----------------------------

@dataclass(frozen=True)
class LearnerSpec:
    mode: str               # "ppo": policy acts and trains | "random": uniform actions, no training
    device: str
    torch_threads: int
    hidden: tuple[int, ...]
    cnn_channels: tuple[int, int, int]
    cnn_out: int
    backlog: str            # hold | drop: what the learner does while an update lags behind
    rollout_len: int
    update_envs: int
    learning_rate: float
    anneal_lr: bool
    gamma: float
    gae_lambda: float
    clip_coef: float
    clip_vloss: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    epochs: int
    minibatch_size: int
    value_norm: str         # popart | none
    popart_beta: float      # PopArt's per-sample step size of the value statistics
    adv_norm: str           # per_type | batch | none
    checkpoint_interval_s: float
    keep_checkpoints: int
    export: bool            # write export/policy.pt (weights + what they expect) at the end
    loss_std_at: tuple[float, ...]
    loss_std_window: int


@dataclass(frozen=True)
class ScalingSpec:
    enabled: bool
    window: int
    min_weight: float
    publish_interval_s: float
    eps_max: float
    eps_min: float


@dataclass(frozen=True)
class RewardNormSpec:
    mode: str                # per_env | per_type | global | mean_std | off (rlpipe.worker.rewardnorm)
    clip: Optional[float]
    sync_every: int
    gamma: float             # the learner's discount: the return whose std scales rewards


@dataclass(frozen=True)
class GroupsSpec:
    hot: int                 # groups active from the start
    wake_after_steps: int    # steps each env of the last woken group makes before the next wake
    wake_batch: int          # groups woken at once
    wake_growth: float       # the batch is multiplied by this after each wake
    cgroup: str              # auto | v2 | v1 | none
    dormant_cpu_pct: float
    dormant_mem_mb: int


@dataclass(frozen=True)
class HeartbeatSpec:
    signal_interval_s: float
    redis_interval_s: float
    scan_interval_s: float
    timeout_s: float
    term_grace_s: float
    startup_timeout_s: float


@dataclass(frozen=True)
class ChaosSpec:
    kill_worker_every_s: Optional[float]
    stop_worker_every_s: Optional[float]
    kill_redis_at_s: Optional[float]
    seed: int

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.kill_worker_every_s, self.stop_worker_every_s,
                                           self.kill_redis_at_s))


@dataclass(frozen=True)
class DistSpec:
    """Multi-rank training under torchrun (rlpipe.dist); ignored in a single process."""
    sync_frac: float = 0.6      # an update round starts once this fraction of ranks has its rollout
    backend: str = "auto"       # auto (nccl on cuda, else gloo) | gloo | nccl
    timeout_s: float = 300.0    # a collective waiting longer fails the job (a peer rank is gone)


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs, as plain Python values."""
    env_count: int
    stage: Optional[str]
    mode: str                       # "train" | "validate" (day0: check every env type, no learner)
    env_types: tuple[EnvTypeSpec, ...]
    obs_keys: tuple[ObsKey, ...]
    board_sync: str
    group_size: int
    groups: "GroupsSpec"
    worker_slices: int
    worker_threads: int
    start_method: str
    doorbell_timeout_s: float
    step_timeout_s: Optional[float]
    max_rss_mb: Optional[float]
    cpu_affinity: Optional[tuple[int, ...]]       # None, or the CPUs each worker may use
    sched_fifo: Optional[int]
    learner: LearnerSpec
    scaling: ScalingSpec
    reward_norm: RewardNormSpec
    resume: bool
    redis_url: Optional[str]
    heartbeat: "HeartbeatSpec"
    chaos: ChaosSpec
    duration_s: Optional[float]
    total_env_steps: Optional[int]
    seed: int
    progress_interval_s: float
    aggregate_interval_s: float
    random_return_episodes: int     # random-action episodes per type behind the "learned" verdicts (0: none)
    random_return_budget_s: float   # ... and the most seconds spent on one type
    dist: DistSpec = DistSpec()     # torchrun ranks: preemption, backend, collective timeout
    env_id_offset: int = 0          # first global env id of this rank (rlpipe.dist.rank_spec)


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"Invalid config value {key}={value!r}: {allowed}. "
                      f"Fix it in conf/ or on the command line (e.g. `{key}=...`).")


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(key, value, "allowed is a positive integer")
    return value


def _step_size(key: str, value: Any) -> float:
    """A step size in (0, 1]: 0 would freeze what it moves."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        _fail(key, value, "allowed is a number in (0, 1]")
    return float(value)


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(key, value, "allowed is an integer >= 0")
    return value


def _positive_number(key: str, value: Any, allow_none: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        _fail(key, value, "allowed is a positive number" + (" or null" if allow_none else ""))
    return float(value)


def _unit_interval(key: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        _fail(key, value, "allowed is a number in [0, 1]")
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(key, value, "allowed are " + ", ".join(choices))
    return value


def _obs_keys(buffer: DictConfig) -> tuple[ObsKey, ...]:
    keys = []
    keys_node = buffer["keys"]  # not buffer.keys: that is DictConfig.keys()
    if not keys_node:
        _fail("buffer.keys", {}, "allowed is a mapping of at least one of " + ", ".join(OBS_KEYS))
    for name, spec in keys_node.items():
        _choice("buffer.keys", name, OBS_KEYS)
        shape = OmegaConf.to_container(spec.shape) if spec.shape is not None else None
        if not isinstance(shape, list) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            _fail(f"buffer.keys.{name}.shape", shape, "allowed is a non-empty list of positive ints")
        if name == "rgb" and len(shape) != 3:
            _fail(f"buffer.keys.{name}.shape", shape, "allowed is [height, width, channels]")
        if name != "rgb" and len(shape) != 1:
            _fail(f"buffer.keys.{name}.shape", shape, "allowed is a one-element list [length]")
        _choice(f"buffer.keys.{name}.dtype", spec.dtype, OBS_DTYPES)
        keys.append(ObsKey(name, tuple(shape), spec.dtype))
    order = {k: i for i, k in enumerate(OBS_KEYS)}
    return tuple(sorted(keys, key=lambda k: order[k.name]))


def _env_types(mix: DictConfig) -> tuple[EnvTypeSpec, ...]:
    """The mix's types. A node without `_target_` for a type the mix does not weigh is a
    stage's parameter override for a type that is not in this mix (e.g. +stage=day5 tuning
    `faulty` under env_mix=cartpole): it is left out, said once in the log."""
    if not mix.types:
        _fail("env_mix.types", {}, "allowed is at least one env type (conf/env/<type>.yaml)")
    specs, unused = [], []
    for name, node in mix.types.items():
        if isinstance(node, DictConfig) and "_target_" not in node and name not in mix.weights:
            unused.append(name)
            continue
        if not isinstance(node, DictConfig) or "_target_" not in node:
            _fail(f"env_mix.types.{name}", node, "allowed is an env config node with _target_")
        if name not in mix.weights:
            _fail(f"env_mix.weights.{name}", None, "every type in env_mix.types needs a weight")
        weight = _positive_number(f"env_mix.weights.{name}", mix.weights[name])
        specs.append(EnvTypeSpec(name, weight, OmegaConf.to_container(node, resolve=True)))
    for name in mix.weights:
        if name not in mix.types or name in unused:
            _fail(f"env_mix.weights.{name}", mix.weights[name],
                  "allowed are weights for the types in env_mix.types: " + ", ".join(mix.types))
    if unused:
        log.info("env_mix: overrides for types not in this mix left out: %s", ", ".join(unused))
    return tuple(specs)


def _cnn_channels(value) -> tuple[int, int, int]:
    channels = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    if not isinstance(channels, list) or len(channels) != 3 or not all(
            isinstance(c, int) and c > 0 for c in channels):
        _fail("learner.cnn_channels", channels, "allowed is a list of three positive ints")
    return tuple(channels)


def _scaling(c: DictConfig) -> ScalingSpec:
    spec = ScalingSpec(enabled=bool(c.enabled), window=_positive_int("scaling.window", c.window),
                       min_weight=_unit_interval("scaling.min_weight", c.min_weight),
                       publish_interval_s=_positive_number("scaling.publish_interval_s",
                                                           c.publish_interval_s),
                       eps_max=_unit_interval("scaling.eps_max", c.eps_max),
                       eps_min=_unit_interval("scaling.eps_min", c.eps_min))
    if spec.window < 2:
        _fail("scaling.window", spec.window, "allowed is an integer >= 2 (a std needs two rewards)")
    return spec


def _reward_norm(c: DictConfig, gamma: float) -> RewardNormSpec:
    return RewardNormSpec(mode=_choice("reward_norm.mode", c.mode, REWARD_NORM_MODES),
                          clip=_positive_number("reward_norm.clip", c.clip, allow_none=True),
                          sync_every=_positive_int("reward_norm.sync_every", c.sync_every),
                          gamma=gamma)


def _groups(g: DictConfig) -> GroupsSpec:
    growth = _positive_number("groups.wake_growth", g.wake_growth)
    if growth < 1:
        _fail("groups.wake_growth", growth, "allowed is a number >= 1 (the wake batch never shrinks)")
    pct = _positive_number("groups.dormant_cpu_pct", g.dormant_cpu_pct)
    if pct > 100:
        _fail("groups.dormant_cpu_pct", pct, "allowed is a percentage in (0, 100]")
    return GroupsSpec(hot=_positive_int("groups.hot", g.hot),
                      wake_after_steps=_positive_int("groups.wake_after_steps", g.wake_after_steps),
                      wake_batch=_positive_int("groups.wake_batch", g.wake_batch),
                      wake_growth=growth,
                      cgroup=_choice("groups.cgroup", g.cgroup, ("auto", "v2", "v1", "none")),
                      dormant_cpu_pct=pct,
                      dormant_mem_mb=_positive_int("groups.dormant_mem_mb", g.dormant_mem_mb))


def _heartbeat(h: DictConfig) -> HeartbeatSpec:
    spec = HeartbeatSpec(*(_positive_number(f"heartbeat.{k}", h[k]) for k in (
        "signal_interval_s", "redis_interval_s", "scan_interval_s", "timeout_s", "term_grace_s",
        "startup_timeout_s")))
    slowest = max(spec.signal_interval_s, spec.redis_interval_s)
    if spec.timeout_s <= slowest:
        _fail("heartbeat.timeout_s", spec.timeout_s, f"allowed is more than the slowest beat interval "
              f"({slowest} s), or every worker would look dead")
    return spec


def _slices(value: Any, env_count: int, group_size: int) -> int:
    """worker.slices; `auto` double-buffers (2 slices) only while there are fewer workers than
    twice the CPUs we may use. With more, other workers fill a core while one waits for its
    actions, and one slice a worker halves the doorbells and per-slice work (engine_sps.py:
    7,000 CartPole envs in 100 workers on 2 cores ran ~10% faster with 1 slice than with 2)."""
    if value == "auto":
        workers = -(-env_count // group_size)
        return min(group_size, env_count, 2 if workers < 2 * len(os.sched_getaffinity(0)) else 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= group_size:
        _fail("worker.slices", value, f"allowed is auto, or a positive integer at most groups.size ({group_size})")
    return value


def _affinity(value: Any) -> Optional[tuple[int, ...]]:
    if value is None:
        return None
    if value == "auto":
        return tuple(sorted(os.sched_getaffinity(0)))
    cpus = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    available = sorted(os.sched_getaffinity(0))
    if not isinstance(cpus, list) or not cpus or not all(isinstance(c, int) and c in available for c in cpus):
        _fail("worker.cpu_affinity", cpus, f"allowed is null, auto, or a list of CPUs among {available}")
    return tuple(cpus)


def _fifo(value: Any) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or not 1 <= value <= 99:
        _fail("worker.sched_fifo", value, "allowed is null (off) or a SCHED_FIFO priority in 1..99")
    return value


def _dist(d: DictConfig) -> DistSpec:
    frac = d.sync_frac
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
        _fail("dist.sync_frac", frac, "allowed is a number in (0, 1]: the fraction of ranks whose "
              "rollouts start an update round (1: every rank waits for the slowest)")
    return DistSpec(sync_frac=float(frac), backend=_choice("dist.backend", d.backend, ("auto", "gloo", "nccl")),
                    timeout_s=_positive_number("dist.timeout_s", d.timeout_s))


def to_plain(cfg: DictConfig) -> RunSpec:
    """Validate the composed config and copy it into plain values (raises ConfigError)."""
    env_count = _positive_int("env_count", cfg.env_count)
    env_types = _env_types(cfg.env_mix)
    if env_count < len(env_types):
        _fail("env_count", env_count, f"allowed is at least one env per type ({len(env_types)} types)")
    lc = cfg.learner
    hidden = OmegaConf.to_container(lc.hidden)
    if not hidden or not all(isinstance(h, int) and h > 0 for h in hidden):
        _fail("learner.hidden", hidden, "allowed is a non-empty list of positive ints")
    learner = LearnerSpec(
        mode=_choice("learner.mode", lc.mode, ("ppo", "random")),
        device=_choice("learner.device", lc.device, ("cpu", "cuda", "auto")),
        torch_threads=_positive_int("learner.torch_threads", lc.torch_threads),
        hidden=tuple(hidden),
        cnn_channels=_cnn_channels(lc.cnn_channels),
        cnn_out=_positive_int("learner.cnn_out", lc.cnn_out),
        backlog=_choice("learner.backlog", lc.backlog, ("hold", "drop")),
        rollout_len=_positive_int("learner.rollout_len", lc.rollout_len),
        update_envs=_positive_int("learner.update_envs", lc.update_envs),
        learning_rate=_positive_number("learner.learning_rate", lc.learning_rate),
        anneal_lr=bool(lc.anneal_lr),
        gamma=_unit_interval("learner.gamma", lc.gamma),
        gae_lambda=_unit_interval("learner.gae_lambda", lc.gae_lambda),
        clip_coef=_positive_number("learner.clip_coef", lc.clip_coef),
        clip_vloss=bool(lc.clip_vloss),
        ent_coef=float(lc.ent_coef),
        vf_coef=_positive_number("learner.vf_coef", lc.vf_coef),
        max_grad_norm=_positive_number("learner.max_grad_norm", lc.max_grad_norm),
        epochs=_positive_int("learner.epochs", lc.epochs),
        minibatch_size=_positive_int("learner.minibatch_size", lc.minibatch_size),
        value_norm=_choice("learner.value_norm", lc.value_norm, ("popart", "none")),
        popart_beta=_step_size("learner.popart_beta", lc.popart_beta),
        adv_norm=_choice("learner.adv_norm", lc.adv_norm, ("per_type", "batch", "none")),
        checkpoint_interval_s=_positive_number("learner.checkpoint_interval_s", lc.checkpoint_interval_s),
        keep_checkpoints=_positive_int("learner.keep_checkpoints", lc.keep_checkpoints),
        export=bool(lc.export),
        loss_std_at=tuple(_unit_interval("learner.loss_std_at", f) for f in lc.loss_std_at),
        loss_std_window=_positive_int("learner.loss_std_window", lc.loss_std_window),
    )
    if learner.ent_coef < 0:
        _fail("learner.ent_coef", learner.ent_coef, "allowed is a number >= 0")
    group_size = _positive_int("groups.size", cfg.groups.size)
    slices = _slices(cfg.worker.slices, env_count, group_size)
    url = cfg.redis.url
    if url is not None and not str(url).startswith(("redis://", "rediss://", "unix://")):
        _fail("redis.url", url, "allowed is null (embedded) or a redis://, rediss:// or unix:// url")
    duration = _positive_number("run.duration_s", cfg.run.duration_s, allow_none=True)
    total = cfg.run.total_env_steps
    if total is not None:
        _positive_int("run.total_env_steps", total)
    if duration is None and total is None:
        _fail("run.duration_s", None, "allowed is a positive number, or null only when "
              "run.total_env_steps is set (with both null the run never stops)")
    return RunSpec(
        env_count=env_count,
        stage=cfg.stage,
        mode=_choice("run.mode", cfg.run.mode, ("train", "validate")),
        env_types=env_types,
        obs_keys=_obs_keys(cfg.buffer),
        board_sync=_choice("buffer.sync", cfg.buffer.sync, ("seqlock", "lock")),
        group_size=group_size,
        groups=_groups(cfg.groups),
        worker_slices=slices,
        worker_threads=_positive_int("worker.threads", cfg.worker.threads),
        start_method=_choice("worker.start_method", cfg.worker.start_method, ("forkserver", "spawn")),
        doorbell_timeout_s=_positive_number("worker.doorbell_timeout_s", cfg.worker.doorbell_timeout_s),
        step_timeout_s=_positive_number("worker.step_timeout_s", cfg.worker.step_timeout_s, allow_none=True),
        max_rss_mb=_positive_number("worker.max_rss_mb", cfg.worker.max_rss_mb, allow_none=True),
        cpu_affinity=_affinity(cfg.worker.cpu_affinity),
        sched_fifo=_fifo(cfg.worker.sched_fifo),
        learner=learner,
        scaling=_scaling(cfg.scaling),
        reward_norm=_reward_norm(cfg.reward_norm, learner.gamma),
        resume=bool(cfg.run.resume),
        redis_url=url,
        heartbeat=_heartbeat(cfg.heartbeat),
        chaos=ChaosSpec(
            kill_worker_every_s=_positive_number("chaos.kill_worker_every_s",
                                                 cfg.chaos.kill_worker_every_s, allow_none=True),
            stop_worker_every_s=_positive_number("chaos.stop_worker_every_s",
                                                 cfg.chaos.stop_worker_every_s, allow_none=True),
            kill_redis_at_s=_positive_number("chaos.kill_redis_at_s", cfg.chaos.kill_redis_at_s,
                                             allow_none=True),
            seed=int(cfg.run.seed)),
        duration_s=duration,
        total_env_steps=total,
        seed=int(cfg.run.seed),
        progress_interval_s=_positive_number("logging.progress_interval_s",
                                             cfg.logging.progress_interval_s),
        aggregate_interval_s=_positive_number("logging.aggregate_interval_s",
                                              cfg.logging.aggregate_interval_s),
        random_return_episodes=_count("logging.random_return_episodes", cfg.logging.random_return_episodes),
        random_return_budget_s=_positive_number("logging.random_return_budget_s",
                                                cfg.logging.random_return_budget_s),
        dist=_dist(cfg.dist),
    )

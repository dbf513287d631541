"""The value checks behind `rlpipe.config`: one-paragraph ConfigErrors naming the key, and the
derived values that need more than one key (env types, obs keys); the process layout
(groups, slices, CPUs) is resolved by rlpipe.process_layout.

A check is a function `(key, value) -> None` that raises ConfigError; `setting(check)` puts
one next to a schema field, so each setting's type and what it allows are declared together.
Every function here takes plain Python values (what `OmegaConf.to_object` hands the schema's
`__post_init__`), never OmegaConf nodes.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import field, fields, replace
from typing import Any, Callable, Optional

from omegaconf import MISSING

from rlpipe.process_layout import AUTO, LEARNER_CORE
from rlpipe.spec import OBS_DTYPES, OBS_KEYS, ConfigError, EnvTypeSpec, ObsKey

log = logging.getLogger("rlpipe.config")
Check = Callable[[str, Any], None]


def setting(check: Check):
    """A schema field with no default (conf/ holds it) and the check its value must pass."""
    return field(default=MISSING, metadata={"check": check})


def run_checks(section: Any, prefix: str) -> None:
    """Each field's own check, in field order; `prefix` is the section's key in conf/."""
    for f in fields(section):
        check = f.metadata.get("check")
        if check is not None:
            check(f"{prefix}{f.name}", getattr(section, f.name))


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(
        f"Invalid config value {key}={value!r}: {allowed}. Fix it in conf/ or on the command line (e.g. `{key}=...`)."
    )


def positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(key, value, "allowed is a positive integer")


def positive_int_or_auto(key: str, value: Any) -> None:
    """learner.rollout_len and update_envs: auto (from the mix) or a number."""
    if value != AUTO and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        fail(key, value, "allowed is auto (derived from the mix: rlpipe/mix_learner.py) or a positive integer")


def positive_int_or_null(key: str, value: Any) -> None:
    if value is not None:
        positive_int(key, value)


def step_size(key: str, value: Any) -> None:
    """A step size in (0, 1]: 0 would freeze what it moves."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        fail(key, value, "allowed is a number in (0, 1]")


SEED_LIMIT = 2**32  # numpy RandomState's bound (Gymnasium takes more); derived seeds stay far inside 64 bits


def seed(key: str, value: Any) -> None:
    """run.seed: numpy and Gymnasium refuse a negative seed (a numpy traceback in the first
    worker before this check)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        fail(key, value, f"allowed is an integer from 0 to {SEED_LIMIT - 1}")


def count(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(key, value, "allowed is an integer >= 0")


def _positive(key: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        fail(key, value, "allowed is a positive number" + (" or null" if allow_none else ""))


def positive(key: str, value: Any) -> None:
    _positive(key, value, allow_none=False)


def positive_or_null(key: str, value: Any) -> None:
    _positive(key, value, allow_none=True)


def _number(value: Any) -> bool:
    """A YAML number (an env node's values are not typed by the schema: a bool is no number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def unit_interval(key: str, value: Any) -> None:
    if not _number(value) or not 0.0 <= value <= 1.0:
        fail(key, value, "allowed is a number in [0, 1]")


def unit_intervals(key: str, values: Any) -> None:
    for value in values:
        unit_interval(key, value)


def at_least_zero(key: str, value: Any) -> None:
    if not _number(value) or not math.isfinite(value) or value < 0:
        fail(key, value, "allowed is a number >= 0")


# A Gaussian head's log std: from e^-5 (0.007 of the [-1, 1] action range, all but deterministic)
# to e^2 (7.4: past it the clipped actions are a coin flip between the bounds already).
LOG_STD_RANGE = (-5.0, 2.0)


def log_std(key: str, value: Any) -> None:
    lo, hi = LOG_STD_RANGE
    if not _number(value) or not lo <= value <= hi:
        fail(key, value, f"allowed is a log std in [{lo:g}, {hi:g}]")


def one_of(*choices: str) -> Check:
    def check(key: str, value: Any) -> None:
        if value not in choices:
            fail(key, value, "allowed are " + ", ".join(choices))

    return check


def learner_device(key: str, value: Any) -> None:
    """cpu, cuda or auto; cuda only where torch sees a CUDA device, so a machine without one
    stops here, before Redis or a worker starts, and not at the learner's first tensor."""
    one_of("cpu", "cuda", "auto")(key, value)
    if value != "cuda":
        return
    import torch  # only for this question: the other checks stay free of it

    if not torch.cuda.is_available():
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        fail(
            key,
            value,
            f"this machine has no CUDA device torch {torch.__version__} ({build}) can use; allowed here "
            f"are cpu, or auto (cuda where torch sees a GPU, cpu otherwise: the log says which)",
        )


def positive_ints(what: str, length: Optional[int] = None) -> Check:
    """A list of positive ints (of `length` items when given); `what` says so in the error."""

    def check(key: str, value: Any) -> None:
        if (
            not isinstance(value, (list, tuple))
            or not value
            or (length is not None and len(value) != length)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            fail(key, value, f"allowed is {what}")

    return check


def redis_url(key: str, value: Any) -> None:
    if value is not None and not str(value).startswith(("redis://", "rediss://", "unix://")):
        fail(key, value, "allowed is null (embedded) or a redis://, rediss:// or unix:// url")


def redis_faults_need_the_embedded_server(chaos: Any, url: Optional[str]) -> None:
    """The Redis faults (chaos.kill_redis_at_s, pause_redis_at_s) signal the redis-server the
    driver started: with redis.url naming another server there is none to signal, and the
    fault would wait for one the whole run."""
    for name in ("kill_redis_at_s", "pause_redis_at_s"):
        if url is not None and getattr(chaos, name) is not None:
            fail(
                f"chaos.{name}",
                getattr(chaos, name),
                f"allowed is null while redis.url={url!r} names an external server (the Redis "
                "faults act on the embedded redis-server the driver starts with redis.url=null)",
            )


def resume_mode(key: str, value: Any) -> None:
    """run.resume: true, false or auto (bools as YAML and Hydra's overrides parse them)."""
    if value is not True and value is not False and value != "auto":
        fail(
            key,
            value,
            "allowed are true (continue from the newest readable checkpoint of the run "
            "dir, an error when there is none), false (start fresh) and auto (continue when there is "
            "a readable checkpoint, start fresh when there is none: for a supervisor that restarts "
            "the same command line)",
        )


def fifo(key: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or not 1 <= value <= 99):
        fail(key, value, "allowed is null (off) or a SCHED_FIFO priority in 1..99")


def fraction_of_ranks(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        fail(
            key,
            value,
            "allowed is a number in (0, 1]: the fraction of ranks whose "
            "rollouts start an update round (1: every rank waits for the slowest)",
        )


# --- derived values ----------------------------------------------------------------------------


def obs_keys(keys: dict) -> tuple[ObsKey, ...]:
    """buffer.keys as ObsKeys in the board's order (rgb, state, vector)."""
    if not keys:
        fail("buffer.keys", {}, "allowed is a mapping of at least one of " + ", ".join(OBS_KEYS))
    found = []
    for name, spec in keys.items():
        one_of(*OBS_KEYS)("buffer.keys", name)
        shape = list(spec.shape) if isinstance(spec.shape, (list, tuple)) else spec.shape
        positive_ints("a non-empty list of positive ints")(f"buffer.keys.{name}.shape", shape)
        if name == "rgb" and len(shape) != 3:
            fail(f"buffer.keys.{name}.shape", shape, "allowed is [height, width, channels]")
        if name != "rgb" and len(shape) != 1:
            fail(f"buffer.keys.{name}.shape", shape, "allowed is a one-element list [length]")
        one_of(*OBS_DTYPES)(f"buffer.keys.{name}.dtype", spec.dtype)
        found.append(ObsKey(name, tuple(shape), spec.dtype))
    order = {k: i for i, k in enumerate(OBS_KEYS)}
    return tuple(sorted(found, key=lambda k: order[k.name]))


def env_types(types: dict, weights: dict, learner_checks: dict[str, Check]) -> tuple[EnvTypeSpec, ...]:
    """The mix's types. A node without `_target_` for a type the mix does not weigh is a
    stage's parameter override for a type that is not in this mix (e.g. +stage=day5 tuning
    `faulty` under env_mix=cartpole): it is left out, said once in the log. A node's
    `learner:` goes to the spec's `learner`, each key checked by `learner_checks` (the
    check of the learner setting it overrides: one declaration of what a value may be)."""
    if not types:
        fail("env_mix.types", {}, "allowed is at least one env type (conf/env/<type>.yaml)")
    specs, unused = [], []
    for name, node in types.items():
        if isinstance(node, dict) and "_target_" not in node and name not in weights:
            unused.append(name)
            continue
        if not isinstance(node, dict) or "_target_" not in node:
            fail(f"env_mix.types.{name}", node, "allowed is an env config node with _target_")
        if name not in weights:
            fail(f"env_mix.weights.{name}", None, "every type in env_mix.types needs a weight")
        positive(f"env_mix.weights.{name}", weights[name])
        node = dict(node)
        overrides = type_learner(f"env_mix.types.{name}.learner", node.pop("learner", {}), learner_checks)
        specs.append(EnvTypeSpec(name, float(weights[name]), node, learner=overrides))
    for name in weights:
        if name not in types or name in unused:
            fail(
                f"env_mix.weights.{name}",
                weights[name],
                "allowed are weights for the types in env_mix.types: " + ", ".join(types),
            )
    if unused:
        log.info("env_mix: overrides for types not in this mix left out: %s", ", ".join(unused))
    return tuple(specs)


def type_learner(key: str, overrides: Any, checks: dict[str, Check]) -> dict:
    """An env node's `learner:` (null or {}: none), each key one of `checks`' and its value
    passing that check."""
    allowed = ", ".join(checks)
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        fail(key, overrides, f"allowed is a mapping of per-type learner settings ({allowed})")
    for name, value in overrides.items():
        if name not in checks:
            fail(
                f"{key}.{name}",
                value,
                f"allowed are the learner settings a type may set for itself: {allowed} "
                "(the PPO clip, optimizer, epochs and minibatches are shared by every type: set them "
                "under learner:)",
            )
        checks[name](f"{key}.{name}", value)
    return dict(overrides)


# A type's name is a TensorBoard tag part (charts/episodic_return/<type>), a key of summary.json
# and of the hparams, a file name (eval/<type>.mp4), a markdown table cell and an item of
# `rlpipe.eval --types a,b`. Letters, digits and `_ - .` are safe in all of them (TensorBoard
# keeps them as they are); `/` would nest a tag and a path, `,` split --types, `|` a table row.
TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
TYPE_NAME_ALLOWED = "a name of 1 to 64 letters, digits, '_', '-' and '.' that starts with a letter"


def id_type_name(gym_id: str) -> str:
    """The type name a Gymnasium id gives: the id without the module that registers it
    (`flappy_bird_gymnasium:FlappyBird-v0` -> `FlappyBird-v0`) and without its namespace
    (`ALE/Pong-v5` -> `Pong-v5`: a `/` would nest TensorBoard tags and file paths)."""
    return gym_id.rpartition(":")[2].rpartition("/")[2]


def named_after_id(
    types: tuple[EnvTypeSpec, ...], gym_id: Optional[str], name: Optional[str]
) -> tuple[EnvTypeSpec, ...]:
    """The mix's types, the one running env_mix.id (its node's `id` is that id: env_mix=gym's
    `gym`) renamed after the id, or to env_mix.name when given, so that the charts, summaries
    and reports of two ids differ. Its key under env_mix.types stays where it is configured."""
    running = [t for t in types if gym_id is not None and t.node.get("id") == gym_id]
    if not running:
        if name is not None:
            fail(
                "env_mix.name",
                name,
                "allowed only with a Gymnasium id to name (env_mix=gym "
                "env_mix.id=<Id>); it names the type that runs that id, null keeps the id's name",
            )
        return types
    if len(running) > 1:
        fail(
            "env_mix.id",
            gym_id,
            "allowed is an id that one type of the mix runs; here "
            + ", ".join(t.name for t in running)
            + " all run it, and each needs a name of its own",
        )
    if name is not None:
        if not isinstance(name, str) or not TYPE_NAME.fullmatch(name):
            fail(
                "env_mix.name",
                name,
                f"allowed is {TYPE_NAME_ALLOWED} (it names the type in "
                "TensorBoard tags, summary.json keys and file names), or null for the id's name",
            )
        key, value, new = "env_mix.name", name, name
    else:
        key, value, new = "env_mix.id", gym_id, id_type_name(gym_id)
        if not TYPE_NAME.fullmatch(new):
            fail(
                key,
                gym_id,
                f"allowed is an id whose name ({new!r}, the part after ':' and "
                f"'/') is {TYPE_NAME_ALLOWED}; or name the type yourself with env_mix.name=<name>",
            )
    others = [t.name for t in types if t is not running[0]]
    if new in others:
        fail(
            key,
            value,
            f"allowed is a type name ({new!r} here) that no other type of the mix has ("
            + ", ".join(others)
            + "); name the type with env_mix.name=<name>",
        )
    return tuple(replace(t, name=new, conf_key=t.name) if t is running[0] else t for t in types)


def group_size(key: str, value: Any) -> None:
    """groups.size: auto (rlpipe.process_layout's rule) or envs per worker process."""
    if value != AUTO:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            fail(
                key,
                value,
                "allowed is auto (chosen from the usable CPUs and env_count), or a "
                "positive integer (envs per worker process)",
            )


def active_mem_mb(key: str, value: Any) -> None:
    """groups.active_mem_mb: auto (from the machine's available memory) or MiB."""
    if value != AUTO and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        fail(
            key,
            value,
            "allowed is auto (3/4 of the memory available at start) or a positive integer "
            "(MiB for every process that runs env code together: the awake workers and the random-return probe)",
        )


def slices(value: Any, group_size: int) -> None:
    """worker.slices: auto (rlpipe.process_layout's rule) or a count the group can hold."""
    if value != AUTO and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= group_size):
        fail("worker.slices", value, f"allowed is auto, or a positive integer at most groups.size ({group_size})")


def affinity(value: Any) -> Optional[tuple[int, ...]] | str:
    """worker.cpu_affinity as a setting: null, auto and learner_core (resolved with the
    learner's settings by rlpipe.process_layout.resolve), or a tuple of CPUs we may use."""
    if value is None or value in (AUTO, LEARNER_CORE):
        return value
    available = sorted(os.sched_getaffinity(0))
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(c, int) and c in available for c in value)
    ):
        fail(
            "worker.cpu_affinity", value, f"allowed is null, auto, {LEARNER_CORE}, or a list of CPUs among {available}"
        )
    return tuple(value)

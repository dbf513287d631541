"""The value checks behind `rlpipe.config`: one-paragraph ConfigErrors naming the key, and the
derived values that need more than one key (env types, obs keys, slices, CPUs).

A check is a function `(key, value) -> None` that raises ConfigError; `setting(check)` puts
one next to a schema field, so each setting's type and what it allows are declared together.
Every function here takes plain Python values (what `OmegaConf.to_object` hands the schema's
`__post_init__`), never OmegaConf nodes.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import field, fields
from typing import Any, Callable, Optional

from omegaconf import MISSING

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
    raise ConfigError(f"Invalid config value {key}={value!r}: {allowed}. "
                      f"Fix it in conf/ or on the command line (e.g. `{key}=...`).")


def positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(key, value, "allowed is a positive integer")


def positive_int_or_null(key: str, value: Any) -> None:
    if value is not None:
        positive_int(key, value)


def step_size(key: str, value: Any) -> None:
    """A step size in (0, 1]: 0 would freeze what it moves."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        fail(key, value, "allowed is a number in (0, 1]")


def count(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(key, value, "allowed is an integer >= 0")


def _positive(key: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        fail(key, value, "allowed is a positive number" + (" or null" if allow_none else ""))


def positive(key: str, value: Any) -> None:
    _positive(key, value, allow_none=False)


def positive_or_null(key: str, value: Any) -> None:
    _positive(key, value, allow_none=True)


def unit_interval(key: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        fail(key, value, "allowed is a number in [0, 1]")


def unit_intervals(key: str, values: Any) -> None:
    for value in values:
        unit_interval(key, value)


def at_least_zero(key: str, value: Any) -> None:
    if value < 0:
        fail(key, value, "allowed is a number >= 0")


def one_of(*choices: str) -> Check:
    def check(key: str, value: Any) -> None:
        if value not in choices:
            fail(key, value, "allowed are " + ", ".join(choices))
    return check


def positive_ints(what: str, length: Optional[int] = None) -> Check:
    """A list of positive ints (of `length` items when given); `what` says so in the error."""
    def check(key: str, value: Any) -> None:
        if not isinstance(value, (list, tuple)) or not value or (length is not None and len(value) != length) \
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            fail(key, value, f"allowed is {what}")
    return check


def redis_url(key: str, value: Any) -> None:
    if value is not None and not str(value).startswith(("redis://", "rediss://", "unix://")):
        fail(key, value, "allowed is null (embedded) or a redis://, rediss:// or unix:// url")


def resume_mode(key: str, value: Any) -> None:
    """run.resume: true, false or auto (bools as YAML and Hydra's overrides parse them)."""
    if value is not True and value is not False and value != "auto":
        fail(key, value, "allowed are true (continue from the newest readable checkpoint of the run "
             "dir, an error when there is none), false (start fresh) and auto (continue when there is "
             "a readable checkpoint, start fresh when there is none: for a supervisor that restarts "
             "the same command line)")


def fifo(key: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or not 1 <= value <= 99):
        fail(key, value, "allowed is null (off) or a SCHED_FIFO priority in 1..99")


def fraction_of_ranks(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        fail(key, value, "allowed is a number in (0, 1]: the fraction of ranks whose "
             "rollouts start an update round (1: every rank waits for the slowest)")


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


def env_types(types: dict, weights: dict) -> tuple[EnvTypeSpec, ...]:
    """The mix's types. A node without `_target_` for a type the mix does not weigh is a
    stage's parameter override for a type that is not in this mix (e.g. +stage=day5 tuning
    `faulty` under env_mix=cartpole): it is left out, said once in the log."""
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
        specs.append(EnvTypeSpec(name, float(weights[name]), node))
    for name in weights:
        if name not in types or name in unused:
            fail(f"env_mix.weights.{name}", weights[name],
                 "allowed are weights for the types in env_mix.types: " + ", ".join(types))
    if unused:
        log.info("env_mix: overrides for types not in this mix left out: %s", ", ".join(unused))
    return tuple(specs)


def slices(value: Any, env_count: int, group_size: int) -> int:
    """worker.slices; `auto` double-buffers (2 slices) only while there are fewer workers than
    twice the CPUs we may use. With more, other workers fill a core while one waits for its
    actions, and one slice a worker halves the doorbells and per-slice work (benchmarks/
    engine_sps.py: many CartPole workers on few cores ran faster with 1 slice than with 2)."""
    if value == "auto":
        workers = -(-env_count // group_size)
        return min(group_size, env_count, 2 if workers < 2 * len(os.sched_getaffinity(0)) else 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= group_size:
        fail("worker.slices", value, f"allowed is auto, or a positive integer at most groups.size ({group_size})")
    return value


def affinity(value: Any) -> Optional[tuple[int, ...]] | str:
    """worker.cpu_affinity: null, every CPU we may use (auto), learner_core (resolved with the
    learner's settings by `learner_core`), or a list of CPUs."""
    if value is None or value == LEARNER_CORE:
        return value
    if value == "auto":
        return tuple(sorted(os.sched_getaffinity(0)))
    available = sorted(os.sched_getaffinity(0))
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(c, int) and c in available
                                                                    for c in value):
        fail("worker.cpu_affinity", value,
             f"allowed is null, auto, {LEARNER_CORE}, or a list of CPUs among {available}")
    return tuple(value)


LEARNER_CORE = "learner_core"


def learner_core(value, mode: str, device: str) -> tuple[Optional[tuple[int, ...]], Optional[int]]:
    """(the workers' CPUs, the CPU kept for the PPO update thread). worker.cpu_affinity=
    learner_core keeps the first usable CPU for the update and gives the workers the rest,
    when PPO trains here (not on CUDA) and there are two CPUs or more; otherwise the workers
    get every CPU and the update is not pinned. Under CFS the update thread is one of a
    hundred runnable worker processes and gets a hundredth of the machine; on a core of its
    own it keeps up with the workers (docs/benchmarks.md, engine_sps)."""
    if value != LEARNER_CORE:
        return value, None
    cpus = sorted(os.sched_getaffinity(0))
    if mode != "ppo" or device == "cuda" or len(cpus) < 2:
        return None, None
    return tuple(cpus[1:]), cpus[0]

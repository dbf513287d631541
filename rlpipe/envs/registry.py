"""Env types of a run: factories (one per type), specs, and the env-id -> type assignment."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
from hydra.utils import instantiate

from rlpipe.envs.contract import CONTINUOUS, DISCRETE, EnvSpec, check_fits
from rlpipe.envs.sizing import fit_board
from rlpipe.proctree import children_killed_after
from rlpipe.spec import BOARD_SIZINGS, ConfigError, EnvTypeSpec, ObsKey

log = logging.getLogger("rlpipe.envs")


def make_factory(node: dict) -> functools.partial:
    """One partial per type (`_partial_: true`); the worker calls it per env id."""
    factory = instantiate(node)
    if not isinstance(factory, functools.partial):
        raise ValueError(f"env config {node.get('_target_')} must set _partial_: true")
    return factory


def describe(node: dict) -> EnvSpec:
    """What a type produces and accepts. A type may build an env to find out (a Gymnasium id
    does), in this process (the driver's): what that env started is killed after (issue 49)."""
    factory = make_factory(node)
    with children_killed_after():
        return factory.func.describe(**factory.keywords)


def preload_modules(env_types: tuple[EnvTypeSpec, ...]) -> list[str]:
    """Modules a worker of this mix imports: the types' own modules plus what each type says it
    needs (`preload(**params)`, e.g. a Gymnasium id's entry point). The forkserver imports them
    once, so 100 workers share those pages instead of importing them 100 times."""
    modules = set()
    for t in env_types:
        factory = make_factory(t.node)
        modules.add(factory.func.__module__)
        hook = getattr(factory.func, "preload", None)
        if hook is not None:
            modules.update(hook(**factory.keywords))
    return sorted(modules)


@dataclass(frozen=True)
class ActionSpace:
    """The run's unified action spec: one discrete head, one continuous head."""

    discrete_n: int  # largest discrete action count in the mix (0: no discrete type)
    cont_dim: int  # largest continuous dim in the mix (0: no continuous type)


@dataclass(frozen=True)
class MixPlan:
    names: tuple[str, ...]  # type index -> name
    specs: tuple[EnvSpec, ...]
    env_type: np.ndarray  # env id -> type index (int16)
    actions: ActionSpace
    obs_keys: tuple[ObsKey, ...]  # the board: the buffer's keys that some type of the mix
    # produces, sized from the mix under buffer.sizing=auto

    def counts(self) -> dict[str, int]:
        return {name: int((self.env_type == i).sum()) for i, name in enumerate(self.names)}


def assign_types(weights: list[float], env_count: int) -> np.ndarray:
    """Largest-remainder counts by weight, interleaved so every worker group gets a mix."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * env_count
    counts = np.floor(exact).astype(np.int64)
    counts = np.maximum(counts, 1)
    while counts.sum() > env_count:
        counts[np.argmax(counts)] -= 1
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    i = 0
    while counts.sum() < env_count:
        counts[order[i % len(order)]] += 1
        i += 1
    # Spread each type evenly along the id range: type t's k-th env sits at (k + 0.5) / n_t.
    keys = np.concatenate([(np.arange(n) + 0.5) / n for n in counts])
    types = np.concatenate([np.full(n, t, dtype=np.int16) for t, n in enumerate(counts)])
    return types[np.argsort(keys, kind="stable")]


def plan_mix(
    env_types: tuple[EnvTypeSpec, ...], env_count: int, board_keys: tuple[ObsKey, ...], sizing: str
) -> MixPlan:
    """Describe each type once, size the board from the descriptions (`sizing`, buffer.sizing:
    auto grows it to the mix, rlpipe/envs/sizing.py; fixed keeps it) and check every type fits."""
    if sizing not in BOARD_SIZINGS:
        raise ValueError(f"sizing {sizing!r} is not one of {', '.join(BOARD_SIZINGS)}")
    specs = []
    for t in env_types:
        try:
            specs.append(describe(t.node))
        except ConfigError:
            raise
        except Exception as exc:  # unknown ids, unsupported spaces, bad parameters
            raise ConfigError(
                f"env type '{t.name}' ({t.conf_path}, _target_ {t.node.get('_target_')}) cannot be built: {exc}"
            ) from exc
    if sizing == "auto":
        board_keys = fit_board(board_keys, specs)
    for t, spec in zip(env_types, specs):
        check_fits(t.name, spec, board_keys)
    # A buffer key no type of this mix produces would only carry zeros through the board, the
    # rollouts and the policy: it is left out of the run.
    used = tuple(k for k in board_keys if any(k.name in s.obs for s in specs))
    unused = [k.name for k in board_keys if k not in used]
    if unused:
        log.info("buffer keys no env type of the mix produces, left out: %s", ", ".join(unused))
    disc = max((s.action_n for s in specs if s.action_kind == DISCRETE), default=0)
    cont = max((s.action_n for s in specs if s.action_kind == CONTINUOUS), default=0)
    return MixPlan(
        tuple(t.name for t in env_types),
        tuple(specs),
        assign_types([t.weight for t in env_types], env_count),
        ActionSpace(disc, cont),
        used,
    )

"""The environment contract every env type keeps (docs/architecture.md), and its checker.

An env type is a class implementing EnvInterface plus a classmethod `describe(**params)`
that returns its EnvSpec without building an env (the learner sizes the policy from it).
The worker calls the type's factory once per env id and holds `env_id -> env` itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from rlpipe.spec import ConfigError, ObsKey

DISCRETE, CONTINUOUS = "discrete", "continuous"


@dataclass(frozen=True)
class EnvSpec:
    """What one env type produces and accepts."""

    obs: dict  # key -> (shape tuple, dtype str); keys among rgb/state/vector
    action_kind: str  # "discrete" | "continuous"
    action_n: int  # discrete: number of actions; continuous: number of dims


class ContractViolation(Exception):
    """An env returned something outside the contract; the worker quarantines and rebuilds it."""


class EnvInterface(ABC):
    @classmethod
    @abstractmethod
    def describe(cls, **params) -> EnvSpec: ...

    @abstractmethod
    def reset(self, env_id: int) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def step(self, env_id: int, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        """One step. Discrete types get an integer in [0, action_n) (a Python int or an int64
        scalar array: read it with int(action)); continuous ones a float32 array of `action_n`
        entries in [-1, 1], which the env maps onto its own bounds."""

    @abstractmethod
    def close(self, env_id: int) -> None: ...

    @classmethod
    def declared_fault_rates(cls, **params) -> tuple[float, float]:
        """(per reset, per step) probability that this type raises or breaks the contract on
        purpose (the chaos emulators); day0 validation tolerates faults up to these rates and
        fails a type on any fault it does not declare."""
        return 0.0, 0.0


def check_fits(type_name: str, spec: EnvSpec, board_keys: tuple[ObsKey, ...]) -> None:
    """Raise ConfigError if the type produces a key the board lacks or that does not fit it."""
    by_name = {k.name: k for k in board_keys}
    for key, (shape, _dtype) in spec.obs.items():
        if key not in by_name:
            raise ConfigError(
                f"env type '{type_name}' produces obs key '{key}' but buffer.keys has "
                f"only {', '.join(by_name)}; pick a buffer with '{key}' (e.g. buffer=small)"
            )
        board = by_name[key]
        if key == "rgb":
            if tuple(shape) != board.shape:
                raise ConfigError(
                    f"env type '{type_name}' renders rgb {list(shape)} but buffer.keys.rgb.shape is {list(board.shape)}"
                )
        elif int(np.prod(shape)) > int(np.prod(board.shape)):
            raise ConfigError(
                f"env type '{type_name}' produces {key} of {int(np.prod(shape))} values "
                f"but buffer.keys.{key}.shape holds {int(np.prod(board.shape))}; let the board "
                f"grow to fit (buffer=auto), give buffer.keys.{key}.shape at least "
                f"{int(np.prod(shape))} values, or set env_mix.types.{type_name} to produce fewer"
            )


def check_obs(spec: EnvSpec, obs: object) -> None:
    """Contract check of one observation (keys, shapes, dtypes, finiteness)."""
    if not isinstance(obs, dict) or set(obs) != set(spec.obs):
        keys = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
        raise ContractViolation(f"obs keys {keys} != declared {sorted(spec.obs)}")
    for key, (shape, dtype) in spec.obs.items():
        value = obs[key]
        if not isinstance(value, np.ndarray) or value.shape != tuple(shape) or value.dtype != dtype:
            got = (value.shape, str(value.dtype)) if isinstance(value, np.ndarray) else type(value).__name__
            raise ContractViolation(f"obs[{key!r}] is {got}, declared {(tuple(shape), dtype)}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise ContractViolation(f"obs[{key!r}] holds NaN or inf")


def check_step(spec: EnvSpec, result: object) -> tuple[dict, float, bool, bool]:
    if not isinstance(result, tuple) or len(result) != 5:
        raise ContractViolation("step must return (obs, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, _info = result
    check_obs(spec, obs)
    if not isinstance(reward, (float, np.floating)) or not np.isfinite(reward):
        raise ContractViolation(f"reward {reward!r} is not a finite float")
    if not isinstance(terminated, (bool, np.bool_)) or not isinstance(truncated, (bool, np.bool_)):
        raise ContractViolation("terminated and truncated must be bools")
    return obs, float(reward), bool(terminated), bool(truncated)

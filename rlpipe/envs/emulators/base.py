"""What the four emulators share: parameter checks, the Emulator base class (parameters in a
frozen dataclass without defaults, so missing or bad ones fail at plan time)."""

from __future__ import annotations

import numpy as np

from rlpipe.envs.contract import EnvInterface, EnvSpec


def check_rate(name: str, value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}={value!r}: allowed is a probability in [0, 1]")
    return float(value)


def check_nonneg(name: str, value: float) -> float:
    if float(value) < 0:
        raise ValueError(f"{name}={value!r}: allowed is a number >= 0")
    return float(value)


def check_posint(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ValueError(f"{name}={value!r}: allowed is a positive integer")
    return int(value)


class Emulator(EnvInterface):
    """Parameters live in a frozen dataclass `Params` whose fields have no defaults (the type's
    conf/env node sets each): unknown, missing or bad ones are errors at plan time, through
    describe."""

    Params: type

    def __init__(self, env_id: int, seed: int, **params):
        self.p = self.Params(**params)
        self.env_id = env_id
        self.rng = np.random.default_rng(seed)

    @classmethod
    def describe(cls, **params) -> EnvSpec:
        return cls._spec(cls.Params(**params))

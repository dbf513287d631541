"""Plain value types that the engine's lower layers (envs, shm, worker) share with the config.

They live here, not in `rlpipe/config.py`, so that those layers never import the config
schema (and with it OmegaConf's structured configs): `rlpipe/config.py` builds these values
from the composed config and re-exports them for the code above.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OBS_KEYS = ("rgb", "state", "vector")
OBS_DTYPES = ("uint8", "float32")
BOARD_SIZINGS = ("auto", "fixed")  # buffer.sizing: grown to the mix (rlpipe/envs/sizing.py) | as configured


class ConfigError(ValueError):
    """A config value the engine cannot run with; the message is for the user, as is."""

    what = "config error"


@dataclass(frozen=True)
class ObsKey:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class EnvTypeSpec:
    name: str  # in charts, summary.json, reports (env_mix=gym: after its id, or env_mix.name)
    weight: float
    node: dict  # the type's config node, _target_/_partial_ included (for instantiate)
    conf_key: str = ""  # its key under env_mix.types where that is not `name` (env_mix=gym's `gym`)
    # The node's `learner:` overrides (checked; keys among rlpipe.config.TYPE_LEARNER_KEYS),
    # taken out of `node`: they are the learner's settings for this type, not constructor
    # parameters. A key left out takes the learner's value (conf/learner/).
    learner: dict = field(default_factory=dict)

    @property
    def conf_path(self) -> str:
        """Where the type is configured, for messages that tell the user what to change."""
        return f"env_mix.types.{self.conf_key or self.name}"

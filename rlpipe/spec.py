"""Plain value types that the engine's lower layers (envs, shm, worker) share with the config.

They live here, not in `rlpipe/config.py`, so that those layers never import the config
schema (and with it OmegaConf's structured configs): `rlpipe/config.py` builds these values
from the composed config and re-exports them for the code above.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OBS_KEYS = ("rgb", "state", "vector")
OBS_DTYPES = ("uint8", "float32")


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
    name: str
    weight: float
    node: dict          # the type's config node, _target_/_partial_ included (for instantiate)

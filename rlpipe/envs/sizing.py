"""The board sized from the mix (`buffer=auto`, the default where no stage picks a buffer).

A user running one env of their own (`env_mix=gym env_mix.id=<Id>`) should not have to learn
what the board is first. Under `buffer.sizing=auto` each buffer key is grown, from the types'
EnvSpecs (`describe()`, before anything is allocated), to what the mix produces:

- `state` / `vector`: the longest any type produces, never shorter than the configured length.
  The configured lengths (conf/buffer/auto.yaml: buffer=small's) are a floor so that every mix
  that fitted the old default board keeps that board exactly: the policy's input width, the
  memory figures and the benchmarks do not move.
- `rgb`: the types' own shape when every type producing rgb agrees on one (image types resize
  to the configured shape, so they agree on it unless one is told otherwise), else the
  configured one (then check_fits names the type that does not match).

Under `buffer.sizing=fixed` (every named buffer: small, seed, lowdim, state_only) the board is
what the config says, and a type too big for it is an error.
"""

from __future__ import annotations

import numpy as np

from rlpipe.envs.contract import EnvSpec
from rlpipe.spec import ObsKey


def fit_board(board_keys: tuple[ObsKey, ...], specs: tuple[EnvSpec, ...] | list[EnvSpec]) -> tuple[ObsKey, ...]:
    """The configured keys, each grown to what the types in `specs` produce (see the module)."""
    fitted = []
    for key in board_keys:
        produced = [tuple(s.obs[key.name][0]) for s in specs if key.name in s.obs]
        if key.name == "rgb":
            shape = produced[0] if len(set(produced)) == 1 else key.shape
        else:
            shape = (max([int(np.prod(key.shape))] + [int(np.prod(p)) for p in produced]),)
        fitted.append(ObsKey(key.name, tuple(shape), key.dtype))
    return tuple(fitted)

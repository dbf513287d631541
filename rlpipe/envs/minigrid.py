"""MiniGrid (conf/env/minigrid.yaml): the agent's 7x7-tile egocentric view, as rgb or as the
symbolic grid MiniGrid itself observes. `view` picks one:

- `rgb`: the view rendered (tile_size px a tile: 63x63 at 9) and resized (nearest) to the
  board's rgb shape, for the shared CNN. 12,288 bytes a row at 64x64x3.
- `symbolic`: MiniGrid's own observation, per tile its object, colour and state as small
  integers (7 x 7 x 3 = 147 numbers), flattened as float32 onto `symbolic_key` (`state` or
  `vector`) for the type's own MLP input layer: exact, and 588 bytes a row. buffer=auto grows
  that key to 147 (rlpipe/envs/sizing.py); a fixed board must have a row that long.

What symbolic costs and saves at day4's size (+stage=day4 buffer=auto, 7,000 envs, 840 of
them minigrid; bytes per row x envs from the plan): the `vector` row grows from 64 to 588 B
for every env, so the worker segments grow 11.8 MB (368.8 -> 380.6 MB: two 640 B slots and a
final-obs row per env), the learner's batch buffer and the workers' staging 7.3 MB, and the
vector rollouts 16.1 MB (1,820 producing envs x T 16 x 588 B); the rgb rollouts shrink by
165 MB (323.4 -> 158.3 MB: 805 rgb envs instead of 1,645), and the CNN sees 805 rows a round
instead of 1,645. That is why +stage=day4 picks symbolic and buffer=auto; a fixed board
(buffer=small: vector 16, buffer=seed: 64) needs view=rgb.

Both are GymnasiumEnv (rlpipe/envs/classic.py) with MiniGrid's wrappers. The agent's direction
and the mission text are left out of both (the view is already egocentric; a DoorKey mission
is always the same sentence).
"""

from __future__ import annotations

from rlpipe.envs.classic import OBS_KEYS_FLAT, GymnasiumEnv
from rlpipe.envs.contract import EnvSpec

VIEWS = ("rgb", "symbolic")
IMAGE_ONLY = "minigrid.wrappers.ImgObsWrapper"  # the view's grid alone, no mission/direction
FLATTEN = "gymnasium.wrappers.FlattenObservation"  # 7x7x3 -> 147 (a 7x7 grid is no image to ObsMap)


def gym_params(view: str, tile_size: int, rgb_shape, symbolic_key: str) -> dict:
    """GymnasiumEnv's obs parameters (wrappers, rgb_shape, obs_key) for a view."""
    if view == "rgb":
        return {
            "wrappers": [
                {"path": "minigrid.wrappers.RGBImgPartialObsWrapper", "kwargs": {"tile_size": tile_size}},
                IMAGE_ONLY,
            ],
            "rgb_shape": rgb_shape,
            "obs_key": None,
        }
    if view == "symbolic":
        if symbolic_key not in OBS_KEYS_FLAT:
            raise ValueError(f"symbolic_key {symbolic_key!r} is not one of {', '.join(OBS_KEYS_FLAT)}")
        return {"wrappers": [IMAGE_ONLY, FLATTEN], "rgb_shape": None, "obs_key": symbolic_key}
    raise ValueError(f"view {view!r} is not one of {', '.join(VIEWS)}")


class MiniGridEnv(GymnasiumEnv):
    def __init__(self, id: str, env_id: int, seed: int, view: str, tile_size: int, rgb_shape, symbolic_key: str):
        super().__init__(id, env_id, seed, **gym_params(view, tile_size, rgb_shape, symbolic_key))

    @classmethod
    def describe(cls, id: str, view: str, tile_size: int, rgb_shape, symbolic_key: str) -> EnvSpec:
        return super().describe(id, **gym_params(view, tile_size, rgb_shape, symbolic_key))

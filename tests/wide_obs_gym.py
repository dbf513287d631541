"""A third-party Gymnasium env for the tests, registered on import (no network, no package):
its obs is wider than the default board's state (buffer=small's 32 floats), as a user's own
env often is (flappy_bird_gymnasium:FlappyBird-v0 has 180).

A run reaches it as `env_mix=gym env_mix.id=wide_obs_gym:WideObs-v0` with this directory on
PYTHONPATH: Gymnasium's `module:Id` syntax imports this module in the driver and in every
worker, which registers the id there.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

OBS_DIM = 48  # wider than the default board's 32, so the board must grow
CUE = OBS_DIM - 1  # the entry that says which action pays: past the first 32 on purpose
EPISODE_STEPS = 20


class WideObs(gym.Env):
    """Each step shows OBS_DIM random floats; action 1 pays 1 when obs[CUE] > 0, action 0 when
    it is not. A policy that reads the whole obs scores EPISODE_STEPS, random actions half."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.standard_normal(OBS_DIM).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        reward = float(int(action) == int(self.obs[CUE] > 0))
        self.t += 1
        self.obs = self.np_random.standard_normal(OBS_DIM).astype(np.float32)
        return self.obs, reward, False, self.t >= EPISODE_STEPS, {}


if "WideObs-v0" not in gym.registry:
    gym.register("WideObs-v0", entry_point=f"{__name__}:WideObs")

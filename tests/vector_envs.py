"""Gymnasium envs that break on purpose, for tests/test_vector.py: registered on import, reached
as `vector_envs:Breaking-v0` (Gymnasium's `module:Id` imports this module in the caller and in
every worker). Each episode counts its steps; at the configured step it raises, returns NaN,
or blocks for good (0: never)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class Breaking(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, crash_at: int = 0, nan_at: int = 0, hang_at: int = 0, episode_steps: int = 50):
        self.crash_at, self.nan_at, self.hang_at = crash_at, nan_at, hang_at
        self.episode_steps = episode_steps
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.crash_at:
            raise RuntimeError("Breaking env: crash on purpose")
        if self.t == self.hang_at:
            time.sleep(10_000)  # a hang: only the step deadline gets it back
        obs = np.full(3, float(self.t), np.float32)
        if self.t == self.nan_at:
            obs[0] = np.nan
        return obs, 1.0, False, self.t >= self.episode_steps, {}


gym.register("Breaking-v0", entry_point=Breaking)

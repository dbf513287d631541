"""A Gymnasium env whose step costs next to nothing, for the benchmarks that measure the
driver rather than the envs (benchmarks/driver_cost.py), registered on import.

A run reaches it as `env_mix=gym env_mix.id=null_env:Null-v0` with benchmarks/ on PYTHONPATH
(Gymnasium's `module:Id` imports this module in the driver and in every worker). Its obs is a
constant of CartPole's shape, every action pays 1, and an episode lasts 200 steps: the
learner's work per step is CartPole's, the env's is a counter.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 200


class Null(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.obs = np.zeros(4, dtype=np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        return self.obs, 1.0, False, self.t >= EPISODE_STEPS, {}


if "Null-v0" not in gym.registry:
    gym.register("Null-v0", entry_point=Null, disable_env_checker=True)

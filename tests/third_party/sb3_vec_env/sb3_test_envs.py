"""The test envs of SB3's tests/test_vec_envs.py, moved out of the test module so that rlpipe's
workers can import them by a Gymnasium `module:Id` without importing SB3, pytest and torch
(upstream defines them in the test module and hands DummyVecEnv/SubprocVecEnv thunks).
`CustomGymEnv` and `StepEnv` are upstream's code unchanged (MIT licence: LICENSE here);
the ids below and `SeededStepEnv` are rlpipe's."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CustomGymEnv(gym.Env):
    def __init__(self, space, render_mode: str = "rgb_array"):
        """
        Custom gym environment for testing purposes
        """
        self.action_space = space
        self.observation_space = space
        self.current_step = 0
        self.ep_length = 4
        self.render_mode = render_mode
        self.current_options: dict | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.seed(seed)
        self.current_step = 0
        self.current_options = options
        self._choose_next_state()
        return self.state, {}

    def step(self, action):
        reward = float(np.random.rand())
        self._choose_next_state()
        self.current_step += 1
        terminated = False
        truncated = self.current_step >= self.ep_length
        return self.state, reward, terminated, truncated, {}

    def _choose_next_state(self):
        self.state = self.observation_space.sample()

    def render(self):
        if self.render_mode == "rgb_array":
            return np.zeros((4, 4, 3))

    def seed(self, seed=None):
        if seed is not None:
            np.random.seed(seed)
            self.observation_space.seed(seed)

    @staticmethod
    def custom_method(dim_0=1, dim_1=1):
        """
        Dummy method to test call to custom method
        from VecEnv

        :param dim_0: (int)
        :param dim_1: (int)
        :return: (np.ndarray)
        """
        return np.ones((dim_0, dim_1))


class StepEnv(gym.Env):
    def __init__(self, max_steps):
        """Gym environment for testing that terminal observation is inserted
        correctly."""
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(np.array([0]), np.array([999]), dtype="int")
        self.max_steps = max_steps
        self.current_step = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.current_step = 0
        return np.array([self.current_step], dtype="int"), {}

    def step(self, action):
        prev_step = self.current_step
        self.current_step += 1
        terminated = False
        truncated = self.current_step >= self.max_steps
        return np.array([prev_step], dtype="int"), 0.0, terminated, truncated, {}


# rlpipe: every env of an rlpipe vector is built from one config, so upstream's per-env
# `functools.partial(StepEnv, i + 5)` is one env whose episode length comes from its first
# reset's seed (rlpipe seeds env i with seed + i: with seed 0, env i runs i + 5 steps).
class SeededStepEnv(StepEnv):
    def __init__(self, base_steps: int = 5):
        super().__init__(base_steps)
        self.base_steps = base_steps

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.max_steps = self.base_steps + seed
        return super().reset(seed=seed, options=options)


def _custom_box_env():
    return CustomGymEnv(spaces.Box(low=np.zeros(2), high=np.ones(2)))


def _custom_continuous_env():  # upstream's SPACES["continuous"]
    return CustomGymEnv(spaces.Box(low=np.zeros(2, dtype=np.float32), high=np.ones(2, dtype=np.float32)))


gym.register("CustomBox-v0", entry_point=_custom_box_env)
gym.register("CustomContinuous-v0", entry_point=_custom_continuous_env)
gym.register("SeededStep-v0", entry_point=SeededStepEnv)
CUSTOM_BOX = "sb3_test_envs:CustomBox-v0"
CUSTOM_CONTINUOUS = "sb3_test_envs:CustomContinuous-v0"
SEEDED_STEP = "sb3_test_envs:SeededStep-v0"

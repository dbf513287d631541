"""Gymnasium environments through the contract: spaces mapped onto obs keys and action heads.

Box obs of rank 1 -> `state` (or `vector` via obs_key), rank 3 uint8 -> `rgb`;
Discrete actions -> the discrete head; Box actions -> the continuous head, where the policy's
[-1, 1] output is mapped linearly onto the space's bounds.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlpipe.envs.contract import CONTINUOUS, DISCRETE, EnvInterface, EnvSpec


def _spaces(env_id_str: str, make_kwargs: dict):
    env = gym.make(env_id_str, **make_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _obs_key(space, obs_key: str | None) -> str:
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"observation space {space} is not a Box")
    if len(space.shape) == 3 and space.dtype == np.uint8:
        return "rgb"
    if len(space.shape) == 1:
        return obs_key or "state"
    raise ValueError(f"observation space {space} is neither a vector nor an HxWxC uint8 image")


class GymnasiumEnv(EnvInterface):
    def __init__(self, id: str, env_id: int, seed: int, obs_key: str | None = None,
                 make_kwargs: dict | None = None):
        self.gym_id = id
        self.env = gym.make(id, **(make_kwargs or {}))
        self._key = _obs_key(self.env.observation_space, obs_key)
        self._dtype = np.uint8 if self._key == "rgb" else np.float32
        space = self.env.action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        if not self._discrete:
            self._low = space.low.astype(np.float32)
            self._half = ((space.high - space.low) / 2).astype(np.float32)
        self._seed = seed
        self._first_reset = True

    @classmethod
    def describe(cls, id: str, obs_key: str | None = None, make_kwargs: dict | None = None) -> EnvSpec:
        obs_space, act_space = _spaces(id, make_kwargs or {})
        key = _obs_key(obs_space, obs_key)
        dtype = "uint8" if key == "rgb" else "float32"
        if isinstance(act_space, gym.spaces.Discrete):
            return EnvSpec({key: (tuple(obs_space.shape), dtype)}, DISCRETE, int(act_space.n))
        if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            return EnvSpec({key: (tuple(obs_space.shape), dtype)}, CONTINUOUS, int(act_space.shape[0]))
        raise ValueError(f"action space {act_space} is neither Discrete nor a 1-D Box")

    def _obs(self, raw) -> dict[str, np.ndarray]:
        return {self._key: np.asarray(raw, dtype=self._dtype)}

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        # Seed once per env id; later resets continue that env's own random stream.
        seed = self._seed if self._first_reset else None
        self._first_reset = False
        obs, _info = self.env.reset(seed=seed)
        return self._obs(obs)

    def step(self, env_id: int, action: np.ndarray):
        if self._discrete:
            act = int(action)
        else:
            act = self._low + (np.clip(action, -1.0, 1.0) + 1.0) * self._half
        obs, reward, terminated, truncated, info = self.env.step(act)
        return self._obs(obs), float(reward), bool(terminated), bool(truncated), info

    def close(self, env_id: int) -> None:
        self.env.close()

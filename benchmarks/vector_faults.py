"""The faulty CartPole of benchmarks/vector_sps.py's survival table, registered on import as
`vector_faults:FaultyCartPole-v0` (Gymnasium's `module:Id`; the benchmark puts this directory
on sys.path, which rlpipe's workers and AsyncVectorEnv's children inherit).

Each env raises once every `raise_every` of its own steps (from a random offset, so a vector's
envs do not all raise on the same step); the first env of the whole vector to make
`hang_at` steps blocks for good (it claims `hang_file` with O_EXCL: one hang per trial)."""

from __future__ import annotations

import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FaultyCartPole(CartPoleEnv):
    def __init__(self, raise_every: int = 10_000, hang_at: int = 0, hang_file: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.raise_every, self.hang_at, self.hang_file = raise_every, hang_at, hang_file
        self.steps = 0
        self.offset = None

    def reset(self, *, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        if self.offset is None:
            self.offset = int(self.np_random.integers(self.raise_every)) if self.raise_every else 0
        return out

    def step(self, action):
        self.steps += 1
        if self.raise_every and (self.steps + self.offset) % self.raise_every == 0:
            raise RuntimeError("FaultyCartPole: the env's periodic crash")
        if self.hang_at and self.steps == self.hang_at and self.hang_file:
            try:
                os.close(os.open(self.hang_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # another env already hangs
            else:
                while True:  # blocks forever, as a socket that never answers
                    time.sleep(3600)
        return super().step(action)


gym.register("FaultyCartPole-v0", entry_point=FaultyCartPole, max_episode_steps=500)

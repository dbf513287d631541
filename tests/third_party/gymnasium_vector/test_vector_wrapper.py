"""Vendored from Gymnasium tests/vector/test_vector_wrapper.py (commit 3f0476a8cc22, MIT
licence: LICENSE here): Gymnasium's vector wrappers over rlpipe.vector. What is rlpipe's is
marked `# rlpipe:`."""

from __future__ import annotations

from typing import Any

import numpy as np

import gymnasium as gym
from gymnasium.core import ObsType
from gymnasium.vector import VectorWrapper
from rlpipe_vectoriser import make_rlpipe_vector


class DummyVectorWrapper(VectorWrapper):
    """Dummy Vector wrapper that contains a counter function to logging the number of times that reset is called."""

    def __init__(self, env):
        """Initialises the wrapper with the environment creating a counter variable."""
        super().__init__(env)

        self.counter = 0

    def reset(
        self,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[ObsType, dict[str, Any]]:
        """Updates the ``counter`` each time at ``reset`` is called."""
        self.counter += 1

        return super().reset(seed=seed, options=options)


def test_vector_env_wrapper_inheritance():
    """Test vector environment wrapper inheritance."""
    env = make_rlpipe_vector("FrozenLake-v1", 1)
    wrapped = DummyVectorWrapper(env)
    wrapped.reset()
    assert wrapped.counter == 1

    env.close()


def test_vector_env_metadata():
    """Test if `metadata` property for VectorWrapper correctly forwards to the vector env it is wrapping."""
    env = make_rlpipe_vector("CartPole-v1", 3)
    wrapped = DummyVectorWrapper(env)        # rlpipe: upstream wraps a second vector

    assert env.metadata == wrapped.metadata
    env.metadata = {"render_modes": ["rgb_array"]}
    assert env.metadata == wrapped.metadata  # rlpipe: the same vector, so the change shows through

    env.close()


# rlpipe: not upstream's: Gymnasium's own vector wrappers over rlpipe.vector (they read
# metadata["autoreset_mode"]); RecordEpisodeStatistics' returns equal what the workers counted.
def test_gymnasium_vector_wrappers_over_rlpipe():
    env = gym.wrappers.vector.RecordEpisodeStatistics(make_rlpipe_vector("CartPole-v1", 4))
    env = gym.wrappers.vector.ClipReward(env, min_reward=0.0, max_reward=0.5)
    env.reset(seed=0)
    for _ in range(150):
        _, rewards, *_ = env.step(env.action_space.sample())
        assert np.all(rewards == 0.5)
    stats = env.env
    assert len(stats.return_queue) > 0
    assert list(stats.return_queue) == list(stats.env.return_queue)[-len(stats.return_queue):]
    env.close()

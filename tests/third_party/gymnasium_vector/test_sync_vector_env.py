"""Vendored from Gymnasium tests/vector/test_sync_vector_env.py (commit 3f0476a8cc22, MIT
licence: LICENSE here), adapted to rlpipe.vector as README.md says. What is rlpipe's is
marked `# rlpipe:`."""

import numpy as np
import pytest

from gymnasium.spaces import Box, Discrete, MultiDiscrete
from gymnasium.vector import AutoresetMode
from rlpipe_vectoriser import make_rlpipe_vector


def test_create_sync_vector_env():
    """Tests creating the sync vector environment."""
    env = make_rlpipe_vector("FrozenLake-v1", 8)
    env.close()

    assert env.num_envs == 8


def test_metadata_sync_vector_env():
    """Tests that the vector env's metadata doesn't mutate the sub-environment's (class-level) metadata."""
    # rlpipe: one mode (SAME_STEP); upstream builds one vector per mode
    envs_2 = make_rlpipe_vector("CartPole-v1", 1)

    assert envs_2.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert "autoreset_mode" not in type(envs_2).__mro__[1].metadata   # rlpipe: the base class's

    envs_2.close()


def test_reset_sync_vector_env():
    """Tests sync vector `reset` function."""
    env = make_rlpipe_vector("CartPole-v1", 8)
    observations, infos = env.reset()
    env.close()

    assert isinstance(env.observation_space, Box)
    assert isinstance(observations, np.ndarray)
    assert observations.dtype == env.observation_space.dtype
    assert observations.shape == (8,) + env.single_observation_space.shape
    assert observations.shape == env.observation_space.shape

    del observations


@pytest.mark.parametrize("use_single_action_space", [True, False])
def test_step_sync_vector_env(use_single_action_space):
    """Test sync vector `steps` function."""
    env = make_rlpipe_vector("FrozenLake-v1", 8)
    env.reset()

    assert isinstance(env.single_action_space, Discrete)
    assert isinstance(env.action_space, MultiDiscrete)

    if use_single_action_space:
        actions = [env.single_action_space.sample() for _ in range(8)]
    else:
        actions = env.action_space.sample()
    observations, rewards, terminations, truncations, _ = env.step(actions)

    env.close()

    # rlpipe: FrozenLake's Discrete(16) obs come back in rlpipe's contract form, one-hot
    # float32 (rlpipe/vector/spaces.py), so its batch is a Box where upstream's is MultiDiscrete
    assert isinstance(env.observation_space, Box)
    assert isinstance(observations, np.ndarray)
    assert observations.dtype == env.observation_space.dtype
    assert observations.shape == (8,) + env.single_observation_space.shape
    assert observations.shape == env.observation_space.shape

    assert isinstance(rewards, np.ndarray)
    assert isinstance(rewards[0], (float, np.floating))
    assert rewards.ndim == 1
    assert rewards.size == 8

    assert isinstance(terminations, np.ndarray)
    assert terminations.dtype == np.bool_
    assert terminations.ndim == 1
    assert terminations.size == 8

    assert isinstance(truncations, np.ndarray)
    assert truncations.dtype == np.bool_
    assert truncations.ndim == 1
    assert truncations.size == 8

"""Vendored from Gymnasium tests/vector/test_vector_env.py (commit 3f0476a8cc22, MIT licence:
LICENSE here), adapted to rlpipe.vector as README.md says. Upstream's docstrings and asserts
kept; what is rlpipe's is marked `# rlpipe:`."""

from __future__ import annotations

import numpy as np
import pytest

from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.vector_env import AutoresetMode
from rlpipe_vectoriser import make_rlpipe_vector

import gymnasium as gym


def make_env(env_name, seed, **kwargs):       # upstream's tests/vector/testing_utils.py
    """Creates an environment."""

    def _make():
        env = gym.make(env_name, disable_env_checker=True, **kwargs)
        env.action_space.seed(seed)
        env.reset(seed=seed)
        return env

    return _make


# rlpipe: upstream compares AsyncVectorEnv (shared memory on and off) with SyncVectorEnv under
# both autoreset modes; here rlpipe.vector against SyncVectorEnv in rlpipe's mode, SAME_STEP.
@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.SAME_STEP])
def test_vector_env_equal(autoreset_mode):
    """Test that vector environment are equal for both async and sync variants."""
    env_fns = [make_env("CartPole-v1", i) for i in range(4)]
    num_steps = 100

    async_env = make_rlpipe_vector("CartPole-v1", 4)
    sync_env = SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)

    assert async_env.num_envs == sync_env.num_envs
    assert async_env.observation_space == sync_env.observation_space
    assert async_env.single_observation_space == sync_env.single_observation_space
    assert async_env.action_space == sync_env.action_space
    assert async_env.single_action_space == sync_env.single_action_space
    assert async_env.metadata["autoreset_mode"] == autoreset_mode   # rlpipe: the mode it implements

    async_observations, async_infos = async_env.reset(seed=0)
    sync_observations, sync_infos = sync_env.reset(seed=0)
    assert np.all(async_observations == sync_observations)
    assert data_equivalence(async_infos, sync_infos)

    for _ in range(num_steps):
        actions = async_env.action_space.sample()
        assert actions in sync_env.action_space

        (
            async_observations,
            async_rewards,
            async_terminations,
            async_truncations,
            async_infos,
        ) = async_env.step(actions)
        (
            sync_observations,
            sync_rewards,
            sync_terminations,
            sync_truncations,
            sync_infos,
        ) = sync_env.step(actions)

        assert np.all(async_observations == sync_observations)
        assert np.all(async_rewards == sync_rewards)
        assert np.all(async_terminations == sync_terminations)
        assert np.all(async_truncations == sync_truncations)
        assert data_equivalence(async_infos, sync_infos)

    async_env.close()
    sync_env.close()


def test_random_seeding_basics():
    seed = 42
    vector_env = make_rlpipe_vector("CartPole-v1", 4)
    vector_env.reset(seed=seed)
    assert vector_env.np_random_seed == tuple(
        seed + i for i in range(vector_env.num_envs)
    )
    # resetting with seed=None means seed remains the same
    vector_env.reset(seed=None)
    assert vector_env.np_random_seed == tuple(
        seed + i for i in range(vector_env.num_envs)
    )
    vector_env.close()          # rlpipe: upstream leaves its vectors to the garbage collector


def test_action_count_compatibility():
    """Test that the number of actions is compatible with the number of environments."""
    num_envs = 4
    # rlpipe: upstream disables autoreset here (irrelevant to the checks below)
    envs = make_rlpipe_vector("CartPole-v1", num_envs)

    # Reset the environment
    envs.reset()

    # Test correct number of actions (should work)
    correct_actions = envs.action_space.sample()
    assert len(correct_actions) == num_envs

    # Test with actions that match the number of environments
    obs, rewards, terminations, truncations, infos = envs.step(correct_actions)
    assert len(obs) == num_envs
    assert len(rewards) == num_envs
    assert len(terminations) == num_envs
    assert len(truncations) == num_envs

    # Test with too few actions (should raise error)
    with pytest.raises(ValueError):
        envs.step(correct_actions[: num_envs - 1])

    # Test with too many actions (should raise error)
    with pytest.raises(ValueError):
        envs.step(np.concatenate([correct_actions, correct_actions[:1]]))

    # Test with scalar action (should raise error for vector env)
    with pytest.raises(TypeError):
        envs.step(0)

    envs.close()

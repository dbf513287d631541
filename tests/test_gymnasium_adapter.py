"""The Gymnasium adapter's bare step (rlpipe/envs/classic.py): where gym.make's chain is its own
TimeLimit and OrderEnforcing only, the adapter steps the bare env and keeps both wrappers' rules
itself. What a worker sees must be what the wrapped env gives, step for step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlpipe.envs.classic import GymnasiumEnv, bare_step
from rlpipe.native.gymstep import DiscreteBoxStep


def _lockstep(env: GymnasiumEnv, ref, actions, convert) -> dict:
    """Step the adapter and the wrapped reference with the same actions, resetting both at each
    end; every obs, reward and flag equal. Returns the count of each kind of end."""
    ends = {"terminated": 0, "truncated": 0}
    obs = env.reset(0)
    ref_obs, _ = ref.reset(seed=7)
    np.testing.assert_array_equal(obs["state"], ref_obs.astype(np.float32))
    for a in actions:
        obs, reward, term, trunc, _ = env.step(0, a)
        ref_obs, ref_reward, ref_term, ref_trunc, _ = ref.step(convert(a))
        np.testing.assert_array_equal(obs["state"], np.asarray(ref_obs, np.float32).reshape(-1))
        assert (reward, term, trunc) == (float(ref_reward), ref_term, ref_trunc)
        assert type(term) is bool and type(trunc) is bool and type(reward) is float
        if term or trunc:
            ends["terminated" if term else "truncated"] += 1
            obs = env.reset(0)
            ref_obs, _ = ref.reset()
            np.testing.assert_array_equal(obs["state"], np.asarray(ref_obs, np.float32))
    return ends


@pytest.mark.parametrize("as_numpy", [False, True], ids=["python-int", "int64"])
def test_a_discrete_type_steps_as_the_wrapped_env_with_its_time_limit(as_numpy):
    """CartPole with a 25-step limit: truncations and terminations both happen, at the same
    steps as gym.make's env, whether the action is a Python int (the worker's) or an int64."""
    env = GymnasiumEnv("CartPole-v1", env_id=0, seed=7, make_kwargs={"max_episode_steps": 25})
    ref = gym.make("CartPole-v1", max_episode_steps=25, disable_env_checker=True)
    assert bare_step(env.env)[1] == 25
    rng = np.random.default_rng(0)
    actions = [np.int64(a) if as_numpy else int(a) for a in rng.integers(0, 2, 2000)]
    ends = _lockstep(env, ref, actions, np.int64)
    assert isinstance(env.step, DiscreteBoxStep)  # stepped in C from the first reset on
    assert ends["terminated"] > 10 and ends["truncated"] > 10


def test_a_continuous_type_steps_as_the_wrapped_env():
    """Pendulum (its registered 200-step limit, never terminated) through the general step."""
    env = GymnasiumEnv("Pendulum-v1", env_id=0, seed=7)
    ref = gym.make("Pendulum-v1", disable_env_checker=True)
    rng = np.random.default_rng(1)
    actions = [rng.uniform(-1, 1, 1).astype(np.float32) for _ in range(450)]
    ends = _lockstep(env, ref, actions, lambda a: (a * 2.0).astype(np.float32))
    assert "step" not in vars(env) and ends == {"terminated": 0, "truncated": 2}


def test_a_users_wrapper_keeps_the_whole_chain():
    """A wrapper of the user's could change anything, so the chain is stepped as it is."""
    env = GymnasiumEnv(
        "CartPole-v1",
        env_id=0,
        seed=7,
        make_kwargs={"max_episode_steps": 25},
        wrappers=["gymnasium.wrappers.RecordEpisodeStatistics"],
    )
    assert bare_step(env.env) == (None, float("inf"))
    ref = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=25, disable_env_checker=True))
    ends = _lockstep(env, ref, [int(a) for a in np.random.default_rng(2).integers(0, 2, 600)], np.int64)
    assert "step" not in vars(env) and ends["truncated"] > 0
    assert bare_step(gym.make("CartPole-v1")) == (None, float("inf"))  # the env checker stays too


def test_a_step_before_the_first_reset_is_refused_as_gymnasium_refuses_it():
    env = GymnasiumEnv("CartPole-v1", env_id=0, seed=7)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(0, 1)

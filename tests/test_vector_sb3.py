"""rlpipe.vector.sb3.RlpipeVecEnv over rlpipe's real workers: step for step what SB3's own
DummyVecEnv returns, the fault path (info["rlpipe_fault"], a truncation with a
terminal_observation) through VecNormalize and VecMonitor, and what get_attr / env_method /
set_attr answer across processes. SB3's own VecEnv tests: tests/third_party/sb3_vec_env/."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize  # noqa: E402

from rlpipe.vector.sb3 import RlpipeVecEnv, WorkerSideError  # noqa: E402

BREAKING = "vector_envs:Breaking-v0"


def test_steps_as_dummy_vec_env_step_for_step():
    """Seeded CartPole with a 30-step limit (terminations and truncations): obs, rewards, dones,
    terminal_observation and TimeLimit.truncated equal DummyVecEnv's at every step."""
    n, seed = 4, 11
    ours = RlpipeVecEnv("CartPole-v1", n, overrides=["+env_mix.types.gym.make_kwargs.max_episode_steps=30"])
    ref = DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=30) for _ in range(n)])
    try:
        ours.seed(seed)
        ref.seed(seed)
        np.testing.assert_array_equal(ours.reset(), ref.reset())
        rng = np.random.default_rng(0)
        ends = {"terminated": 0, "truncated": 0}
        for t in range(120):
            a = rng.integers(0, 2, n)
            o1, r1, d1, i1 = ours.step(a)
            o2, r2, d2, i2 = ref.step(a)
            np.testing.assert_array_equal(o1, o2, err_msg=f"step {t}")
            np.testing.assert_array_equal(r1, r2)
            assert r1.dtype == r2.dtype and d1.dtype == d2.dtype
            np.testing.assert_array_equal(d1, d2)
            for j in range(n):
                assert i1[j].keys() == i2[j].keys()
                if d2[j]:
                    np.testing.assert_array_equal(i1[j]["terminal_observation"], i2[j]["terminal_observation"])
                    assert i1[j]["TimeLimit.truncated"] == i2[j]["TimeLimit.truncated"]
                    ends["truncated" if i2[j]["TimeLimit.truncated"] else "terminated"] += 1
                else:
                    assert "terminal_observation" not in i1[j]
        assert ends["terminated"] > 5 and ends["truncated"] > 0, ends
    finally:
        ours.close()
        ref.close()


def test_a_crash_is_a_truncation_with_a_fault_info_and_the_last_obs_through_vecnormalize_and_vecmonitor():
    """Envs that crash at the 4th step of every episode (tests/vector_envs.py), under SB3's
    VecNormalize and VecMonitor: the step is done and TimeLimit.truncated (PPO bootstraps it),
    carries info["rlpipe_fault"] and, as terminal_observation, the env's last obs (the step
    before the crash); VecMonitor closes the episode; the rebuilt envs step on."""
    n = 2
    raw = RlpipeVecEnv(BREAKING, n, seed=0, overrides=["+env_mix.types.gym.make_kwargs.crash_at=4"])
    norm = VecNormalize(raw, norm_obs=False, norm_reward=False)  # values unchanged: comparable below
    env = VecMonitor(norm)
    try:
        obs = env.reset()
        np.testing.assert_array_equal(obs, np.zeros((n, 3), np.float32))
        faults = []
        for t in range(1, 10):
            obs, rew, done, infos = env.step(np.zeros(n, np.int64))
            if t % 4 == 0:
                assert done.all() and not rew.any()
                for info in infos:
                    assert info["TimeLimit.truncated"] is True
                    fault = info["rlpipe_fault"]
                    assert fault["kind"] == "crash" and fault["error_type"] == "RuntimeError"
                    assert fault["fingerprint"] and "crash on purpose" in fault["message"]
                    np.testing.assert_array_equal(info["terminal_observation"], np.full(3, 3.0, np.float32))
                    assert info["episode"]["l"] == 4  # VecMonitor's count: the cut step ends it
                np.testing.assert_array_equal(obs, np.zeros((n, 3), np.float32))  # the rebuilt envs' reset
                faults.append(t)
            else:
                assert not done.any() and all("rlpipe_fault" not in i for i in infos)
                np.testing.assert_array_equal(obs, np.full((n, 3), float(t % 4), np.float32))
        assert faults == [4, 8]
        assert raw.vector.fault_count == 2 * n
    finally:
        env.close()


def test_what_crosses_processes_is_answered_and_the_rest_is_a_clear_error():
    env = RlpipeVecEnv("CartPole-v1", 3, seed=5)
    try:
        ref = gym.make("CartPole-v1")
        assert env.get_attr("observation_space") == [ref.observation_space] * 3
        assert env.get_attr("action_space", indices=[0, 2]) == [ref.action_space] * 2
        assert env.get_attr("render_mode") == [None] * 3 and env.render_mode is None
        assert env.get_attr("metadata")[0]["render_modes"] == ref.metadata["render_modes"]
        assert env.get_attr("spec")[0].id == "CartPole-v1"
        assert env.get_attr("np_random_seed") == [5, 6, 7]
        assert env.env_method("get_wrapper_attr", "action_space", indices=1) == [ref.action_space]
        assert env.env_is_wrapped(gym.wrappers.TimeLimit) == [True] * 3  # gym.make's, as DummyVecEnv's
        assert env.env_is_wrapped(Monitor) == [False] * 3
        assert env.has_attr("render_mode") and not env.has_attr("steps_beyond_terminated")
        with pytest.raises(WorkerSideError, match=r"get_attr\('steps_beyond_terminated'\).*worker processes"):
            env.get_attr("steps_beyond_terminated")
        with pytest.raises(WorkerSideError, match=r"set_attr\('gravity'\).*make_kwargs\.gravity"):
            env.set_attr("gravity", 20.0)
        with pytest.raises(WorkerSideError, match=r"env_method\('close'\).*render, get_wrapper_attr"):
            env.env_method("close")
        env.set_options({"low": 0})
        with pytest.raises(ValueError, match="takes no options"):
            env.reset()
        env.reset()  # refused options are dropped: the next reset is a plain one
        with pytest.warns(UserWarning, match="render mode is None"):
            assert env.get_images() == [None] * 3
        with pytest.raises(RuntimeError, match="step_wait"):
            env.step_wait()
    finally:
        env.close()

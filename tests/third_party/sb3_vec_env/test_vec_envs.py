"""Vendored from Stable-Baselines3 tests/test_vec_envs.py (DLR-RM/stable-baselines3 at commit
e05d2dbe6eda0acd0ef2e316e3e4065677add3eb, MIT licence: LICENSE here), run against
rlpipe.vector.sb3.RlpipeVecEnv as README.md here says. Upstream's docstrings and asserts are
kept; what is rlpipe's is marked `# rlpipe:`. The tests left out, and why: README.md."""

import gymnasium as gym
import numpy as np
import pytest

from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

from rlpipe.vector.sb3 import RlpipeVecEnv  # rlpipe: the VecEnv under test
from sb3_test_envs import CUSTOM_BOX, CUSTOM_CONTINUOUS, SEEDED_STEP  # rlpipe: upstream's envs, by id

N_ENVS = 3
# rlpipe: upstream's VEC_ENV_CLASSES = [DummyVecEnv, SubprocVecEnv] take per-env thunks; the
# adapter takes an env id and a count (its envs are built in rlpipe's workers).
VEC_ENV_CLASSES = [RlpipeVecEnv]
VEC_ENV_WRAPPERS = [None, VecNormalize, VecFrameStack]


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES)
@pytest.mark.parametrize("vec_env_wrapper", VEC_ENV_WRAPPERS)
def test_vecenv_terminal_obs(vec_env_class, vec_env_wrapper):
    """Test that 'terminal_observation' gets added to info dict upon
    termination."""
    step_nums = [i + 5 for i in range(N_ENVS)]
    # rlpipe: one id for every env; env i runs 5 + its seed (0 + i) steps (sb3_test_envs.py)
    vec_env = vec_env_class(SEEDED_STEP, N_ENVS, seed=0)

    if vec_env_wrapper is not None:
        if vec_env_wrapper == VecFrameStack:
            vec_env = vec_env_wrapper(vec_env, n_stack=2)
        else:
            vec_env = vec_env_wrapper(vec_env)

    zero_acts = np.zeros((N_ENVS,), dtype="int")
    prev_obs_b = vec_env.reset()
    for step_num in range(1, max(step_nums) + 1):
        obs_b, _, done_b, info_b = vec_env.step(zero_acts)
        assert len(obs_b) == N_ENVS
        assert len(done_b) == N_ENVS
        assert len(info_b) == N_ENVS
        env_iter = zip(prev_obs_b, obs_b, done_b, info_b, step_nums, strict=True)
        for prev_obs, obs, done, info, final_step_num in env_iter:
            assert done == (step_num == final_step_num)
            if not done:
                assert "terminal_observation" not in info
            else:
                terminal_obs = info["terminal_observation"]

                # do some rough ordering checks that should work for all
                # wrappers, including VecNormalize
                assert np.all(prev_obs < terminal_obs)
                assert np.all(obs < prev_obs)

                if not isinstance(vec_env, VecNormalize):
                    # more precise tests that we can't do with VecNormalize
                    # (which changes observation values)
                    assert np.all(prev_obs + 1 == terminal_obs)
                    assert np.all(obs == 0)

        prev_obs_b = obs_b

    vec_env.close()


# rlpipe: only upstream's "continuous" space (a Box as obs and action); its discrete,
# multidiscrete and multibinary spaces are README.md's "left out".
SPACES = {"continuous": gym.spaces.Box(low=np.zeros(2, dtype=np.float32), high=np.ones(2, dtype=np.float32))}
SPACE_IDS = {"continuous": CUSTOM_CONTINUOUS}  # rlpipe: the registered CustomGymEnv of each space


def check_vecenv_spaces(vec_env_class, space, obs_assert):
    """Helper method to check observation spaces in vectorized environments."""

    # rlpipe: the id of CustomGymEnv(space) instead of a thunk
    vec_env = vec_env_class(SPACE_IDS[next(k for k, s in SPACES.items() if s == space)], N_ENVS)
    obs = vec_env.reset()
    obs_assert(obs)

    dones = [False] * N_ENVS
    while not any(dones):
        actions = [vec_env.action_space.sample() for _ in range(N_ENVS)]
        obs, _rews, dones, _infos = vec_env.step(actions)
        obs_assert(obs)
    vec_env.close()


def check_vecenv_obs(obs, space):
    """Helper method to check observations from multiple environments each belong to
    the appropriate observation space."""
    assert obs.shape[0] == N_ENVS
    for value in obs:
        assert space.contains(value)


@pytest.mark.parametrize("vec_env_class,space", [(c, s) for c in VEC_ENV_CLASSES for s in SPACES.values()])
def test_vecenv_single_space(vec_env_class, space):
    def obs_assert(obs):
        return check_vecenv_obs(obs, space)

    check_vecenv_spaces(vec_env_class, space, obs_assert)


class CustomWrapperA(VecNormalize):
    def __init__(self, venv):
        VecNormalize.__init__(self, venv)
        self.var_a = "a"


class CustomWrapperB(VecNormalize):
    def __init__(self, venv):
        VecNormalize.__init__(self, venv)
        self.var_b = "b"

    def func_b(self):
        return self.var_b

    def name_test(self):
        return self.__class__


class CustomWrapperBB(CustomWrapperB):
    def __init__(self, venv):
        CustomWrapperB.__init__(self, venv)
        self.var_bb = "bb"


def test_vecenv_wrapper_getattr():
    vec_env = RlpipeVecEnv(CUSTOM_BOX, N_ENVS)  # rlpipe: upstream's DummyVecEnv of CustomGymEnv(Box(2))
    wrapped = CustomWrapperA(CustomWrapperBB(vec_env))
    assert wrapped.var_a == "a"
    assert wrapped.var_b == "b"
    assert wrapped.var_bb == "bb"
    assert wrapped.func_b() == "b"
    assert wrapped.name_test() == CustomWrapperBB

    double_wrapped = CustomWrapperA(CustomWrapperB(wrapped))
    _ = double_wrapped.var_a  # should not raise as it is directly defined here
    with pytest.raises(AttributeError):  # should raise due to ambiguity
        _ = double_wrapped.var_b
    with pytest.raises(AttributeError):  # should raise as does not exist
        _ = double_wrapped.nonexistent_attribute
    vec_env.close()  # rlpipe: its workers go (upstream's DummyVecEnv needs no close)


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES)
def test_vec_deterministic(vec_env_class):
    vec_env = vec_env_class(CUSTOM_BOX, N_ENVS)  # rlpipe: by id (upstream: a make_env thunk)
    vec_env.seed(3)
    obs = vec_env.reset()
    vec_env.seed(3)
    new_obs = vec_env.reset()
    assert np.allclose(new_obs, obs)
    # Test with VecNormalize (VecEnvWrapper should call self.venv.seed())
    vec_normalize = VecNormalize(vec_env)
    vec_normalize.seed(3)
    obs = vec_env.reset()
    vec_normalize.seed(3)
    new_obs = vec_env.reset()
    assert np.allclose(new_obs, obs)
    vec_normalize.close()
    # Similar test but with make_vec_env
    # rlpipe: make_vec_env("Pendulum-v1", n_envs, vec_env_cls, seed=0) builds, then seeds with
    # vec_env.seed(0); here the adapter is built by id and seeded the same way
    vec_env_1 = vec_env_class("Pendulum-v1", N_ENVS)
    vec_env_1.seed(0)
    vec_env_2 = vec_env_class("Pendulum-v1", N_ENVS)
    vec_env_2.seed(0)
    assert np.allclose(vec_env_1.reset(), vec_env_2.reset())
    random_actions = [vec_env_1.action_space.sample() for _ in range(N_ENVS)]
    assert np.allclose(vec_env_1.step(random_actions)[0], vec_env_2.step(random_actions)[0])
    vec_env_1.close()
    vec_env_2.close()


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES)
def test_vec_seeding(vec_env_class):
    # rlpipe: upstream's loop over SubprocVecEnv's start methods is SubprocVecEnv's own (rlpipe's
    # workers always start from its forkserver); one pass here
    n_envs = 3
    vec_env = vec_env_class(CUSTOM_BOX, n_envs)  # rlpipe: by id (upstream: [make_env] * n_envs)
    # Seed with no argument
    vec_env.seed()
    obs = vec_env.reset()
    _, rewards, _, _ = vec_env.step(np.array([vec_env.action_space.sample() for _ in range(n_envs)]))
    # Seed should be different per process
    assert not np.allclose(obs[0], obs[1])
    assert not np.allclose(rewards[0], rewards[1])
    assert not np.allclose(obs[1], obs[2])
    assert not np.allclose(rewards[1], rewards[2])

    vec_env.close()

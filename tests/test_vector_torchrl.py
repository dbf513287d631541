"""TorchRL over rlpipe.vector's real workers: TorchRL's own GymWrapper takes the vector as it
is (check_env_specs passes, a rollout equals the one of GymWrapper over Gymnasium's
SyncVectorEnv step for step, end obs included), a Collector (0.14's SyncDataCollector) steps it, and
rlpipe.vector.torchrl_env.make_env flags faults."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402
from torchrl.collectors import Collector  # noqa: E402  (0.14: what was SyncDataCollector)
from torchrl.envs import GymWrapper  # noqa: E402
from torchrl.envs.utils import check_env_specs  # noqa: E402

import rlpipe.vector as rv  # noqa: E402
from rlpipe.vector.torchrl_env import FAULT_KEY, make_env  # noqa: E402

LIMIT = ["+env_mix.types.gym.make_kwargs.max_episode_steps=30"]


def scripted_policy(actions: np.ndarray):
    """A policy playing actions[t] at its t-th call (one-hot, GymWrapper's default encoding)."""
    t = [0]

    def policy(td):
        a = torch.as_tensor(actions[t[0]])
        td.set("action", torch.nn.functional.one_hot(a, 2).to(torch.int64))
        t[0] += 1
        return td

    return policy


def test_gym_wrapper_takes_the_vector_as_sync_vector_env_step_for_step():
    n, seed, steps = 4, 3, 80
    ours = GymWrapper(rv.make("CartPole-v1", n, overrides=LIMIT))
    ref = GymWrapper(
        SyncVectorEnv(
            [lambda: gym.make("CartPole-v1", max_episode_steps=30) for _ in range(n)],
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
    )
    try:
        assert ours.batch_size == ref.batch_size == torch.Size([n])
        check_env_specs(ours, seed=seed)
        actions = np.random.default_rng(0).integers(0, 2, (steps, n))
        rollouts = []
        for env in (ours, ref):
            # reset(seed=...) reaches the vector's reset (TorchRL's set_seed is one, and then
            # rollout's own reset would go on from there: a new seed epoch in rlpipe's vector,
            # the envs' continued RNG in SyncVectorEnv)
            first = env.reset(seed=seed)
            rollouts.append(
                env.rollout(
                    steps, scripted_policy(actions), break_when_any_done=False, auto_reset=False, tensordict=first
                )
            )
        a, b = rollouts
        for key in (
            "observation",
            ("next", "observation"),
            ("next", "reward"),
            ("next", "terminated"),
            ("next", "truncated"),
        ):
            torch.testing.assert_close(a[key], b[key], msg=lambda m, key=key: f"{key}: {m}")
        assert a["next", "terminated"].sum() > 5 and a["next", "truncated"].any()
        # an ended step's next obs is the episode's end obs; the next step starts the new episode
        done = a["next", "done"].squeeze(-1)[:, :-1]
        end_obs, first_obs = a["next", "observation"][:, :-1][done], a["observation"][:, 1:][done]
        assert (first_obs.abs() <= 0.05).all()  # CartPole's reset draws from [-0.05, 0.05]
        assert (end_obs.abs() > 0.05).any(dim=-1).all()
    finally:
        ours.close()
        ref.close()
    assert ours.base_env._env.closed  # GymWrapper's close closes the vector and its workers


def test_a_collector_steps_it():
    env = make_env("CartPole-v1", 4, seed=0)
    try:
        collector = Collector(env, policy=None, frames_per_batch=64, total_frames=192)
        batches = list(collector)
        collector.shutdown()
        assert len(batches) == 3
        for batch in batches:
            assert batch.numel() == 64 and batch["next", "observation"].shape[-1] == 4
            assert not batch["next", FAULT_KEY].any()
        episodes_ended = sum(int(b["next", "done"].sum()) for b in batches)
        assert episodes_ended > 0
    finally:
        env.close()


def test_make_env_flags_faults_and_passes_check_env_specs():
    """Envs that crash at the 4th step of every episode (tests/vector_envs.py): those steps are
    truncations with "rlpipe_fault" set; the rebuilt envs start again from their reset obs."""
    env = make_env("vector_envs:Breaking-v0", 2, seed=0, overrides=["+env_mix.types.gym.make_kwargs.crash_at=4"])
    try:
        check_env_specs(env)
        td = env.rollout(9, break_when_any_done=False)
        fault = td["next", FAULT_KEY].squeeze(-1)
        trunc = td["next", "truncated"].squeeze(-1)
        expected = torch.zeros(2, 9, dtype=torch.bool)
        expected[:, [3, 7]] = True
        assert torch.equal(fault, expected) and torch.equal(trunc, expected)
        assert torch.equal(td["observation"][0, :, 0], torch.tensor([0.0, 1, 2, 3, 0, 1, 2, 3, 0]))
    finally:
        env.close()

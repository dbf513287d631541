"""Vendored from Stable-Baselines3 tests/test_vec_monitor.py (DLR-RM/stable-baselines3 at commit
e05d2dbe6eda0acd0ef2e316e3e4065677add3eb, MIT licence: LICENSE here), run against
rlpipe.vector.sb3.RlpipeVecEnv as README.md here says. What is rlpipe's is marked `# rlpipe:`;
the tests left out, and why: README.md."""

import csv  # rlpipe: the monitor file is read with csv (upstream: pandas, not installed here)
import json
import os
import uuid
import warnings

from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from rlpipe.vector.sb3 import RlpipeVecEnv  # rlpipe: the VecEnv under test


def test_vec_monitor(tmp_path):
    """
    Test the `VecMonitor` wrapper
    """
    env = RlpipeVecEnv("CartPole-v1", 1)  # rlpipe: upstream's DummyVecEnv([lambda: gym.make("CartPole-v1")])
    env.seed(0)
    monitor_file = os.path.join(str(tmp_path), f"stable_baselines-test-{uuid.uuid4()}.monitor.csv")
    monitor_env = VecMonitor(env, monitor_file)
    monitor_env.reset()
    total_steps = 1000
    ep_len, ep_reward = 0, 0
    for _ in range(total_steps):
        _, rewards, dones, infos = monitor_env.step([monitor_env.action_space.sample()])
        ep_len += 1
        ep_reward += rewards[0]
        if dones[0]:
            assert ep_reward == infos[0]["episode"]["r"]
            assert ep_len == infos[0]["episode"]["l"]
            ep_len, ep_reward = 0, 0

    monitor_env.close()

    with open(monitor_file) as file_handler:
        first_line = file_handler.readline()
        assert first_line.startswith("#")
        metadata = json.loads(first_line[1:])
        assert set(metadata.keys()) == {"t_start", "env_id"}, "Incorrect keys in monitor metadata"

        last_logline = next(csv.DictReader(file_handler))  # rlpipe: upstream's pandas.read_csv
        assert set(last_logline.keys()) == {"l", "t", "r"}, "Incorrect keys in monitor logline"
    os.remove(monitor_file)


def test_vec_monitor_ppo(recwarn):
    """
    Test the `VecMonitor` with PPO
    """
    warnings.filterwarnings(action="ignore", category=DeprecationWarning, module=r".*passive_env_checker")
    env = RlpipeVecEnv("CartPole-v1", 1)  # rlpipe: upstream's DummyVecEnv([lambda: gym.make("CartPole-v1")])
    env.seed(seed=0)
    monitor_env = VecMonitor(env)
    model = PPO("MlpPolicy", monitor_env, verbose=1, n_steps=64, device="cpu")
    model.learn(total_timesteps=250)

    # No warnings because using `VecMonitor`
    evaluate_policy(model, monitor_env)
    assert len(recwarn) == 0, f"{[str(warning) for warning in recwarn]}"
    monitor_env.close()  # rlpipe: its workers go (upstream's DummyVecEnv needs no close)

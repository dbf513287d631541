"""Stable-Baselines3's PPO to CartPole 475 on a VecEnv: rlpipe's adapter (rlpipe.vector.sb3),
SB3's DummyVecEnv or its SubprocVecEnv, with rl-zoo's CartPole-v1 settings. Used by
vector_sps.py's `--sb3-ppo` rows and by tests/test_vector_sb3_ppo.py (slow).

    python benchmarks/sb3_ppo.py [--backends sb3_rlpipe sb3_dummy sb3_subproc] [--seeds 1]
                                 [--max-steps 100000] [--torch-threads 0 1]

rl-zoo's hyperparams/ppo.yml, CartPole-v1: 8 envs, MlpPolicy, n_steps 32, batch_size 256,
gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range
lin_0.2, n_timesteps 1e5 (the linear schedules run to 0 over --max-steps, by default those
1e5, as rl-zoo's run over its n_timesteps). Episodes are counted by SB3's
VecMonitor over the VecEnv (`ep_info_buffer`, the last 100); PPO stops the first time their
mean reaches 475 (Gymnasium's reward_threshold), or at --max-steps. Seconds count from the
VecEnv's construction (its workers' start-up included) to that moment. --torch-threads runs
each with torch.set_num_threads(N) (0: torch's default, a thread per core): on a machine with
few cores, torch's threads and the VecEnv's processes (rlpipe's workers, SubprocVecEnv's)
contend for them. Needs rlpipe[sb3].
"""

from __future__ import annotations

import argparse
import json
import sys
import time

THRESHOLD = 475.0
WINDOW = 100
ZOO_TIMESTEPS = 100_000
N_ENVS = 8
BACKENDS = ("sb3_rlpipe", "sb3_dummy", "sb3_subproc")


def make_vec_env(backend: str, n: int, seed: int, env_id: str = "CartPole-v1", overrides=()):
    """The VecEnv of a backend, seeded as SB3's make_vec_env seeds (env i: seed + i);
    `overrides`: Hydra overrides for the rlpipe adapter's vector."""
    if backend == "sb3_rlpipe":
        from rlpipe.vector.sb3 import RlpipeVecEnv

        env = RlpipeVecEnv(env_id, n, overrides=list(overrides))
    else:
        import gymnasium as gym
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        def thunk():  # as benchmarks/baselines.py builds every backend's envs
            return gym.make(env_id, disable_env_checker=True)

        if backend == "sb3_dummy":
            env = DummyVecEnv([thunk] * n)
        elif backend == "sb3_subproc":
            # fork: 1,000 forkserver children would each import gymnasium anew
            env = SubprocVecEnv([thunk] * n, start_method="fork")
        else:
            raise SystemExit(f"unknown backend {backend!r}")
    env.seed(seed)
    return env


def linear(initial: float):
    """rl-zoo's `lin_<x>`: x times the progress remaining (1 at the start of learn(), 0 at its end)."""

    def schedule(progress_remaining: float) -> float:
        return initial * progress_remaining

    return schedule


def ppo_to_475(backend: str, seed: int, max_steps: int = ZOO_TIMESTEPS, torch_threads: int | None = None) -> dict:
    """PPO with rl-zoo's settings until the last 100 episodes average 475 (or max_steps);
    torch_threads: torch.set_num_threads for the run (None: torch's default, one per core)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecMonitor

    threads_before = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(torch_threads)
    t0 = time.perf_counter()
    env = VecMonitor(make_vec_env(backend, N_ENVS, seed))
    crossing: dict = {}

    class StopAt475(BaseCallback):
        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= WINDOW and sum(e["r"] for e in buf) / len(buf) >= THRESHOLD:
                crossing.update(steps=self.num_timesteps, seconds=round(time.perf_counter() - t0, 1))
                return False
            return True

    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    # SB3's default logger makes a /tmp/SB3-<time> folder per run even with nothing to write
    model.set_logger(Logger(folder=None, output_formats=[]))
    try:
        model.learn(total_timesteps=max_steps, callback=StopAt475())
        buf = [e["r"] for e in model.ep_info_buffer]
        faults = getattr(getattr(env.venv, "vector", None), "fault_count", None)
    finally:
        env.close()
        torch.set_num_threads(threads_before)
    return {
        "backend": backend,
        "seed": seed,
        "torch_threads": torch_threads or threads_before,
        "steps_to_475": crossing.get("steps"),
        "s_to_475": crossing.get("seconds"),
        "steps": model.num_timesteps,
        "last_100_mean": round(float(sum(buf)) / len(buf), 1) if buf else None,
        "faults": faults,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--max-steps", type=int, default=ZOO_TIMESTEPS)
    p.add_argument("--torch-threads", type=int, nargs="+", default=[0], help="0: torch's default")
    args = p.parse_args(argv)
    for threads in args.torch_threads:
        for seed in args.seeds:
            for backend in args.backends:
                print(json.dumps(ppo_to_475(backend, seed, args.max_steps, threads or None)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

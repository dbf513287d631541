"""What each layer of a worker's step costs, per CartPole env-step, in one process.

    python benchmarks/step_path.py [--envs 70] [--rounds 3000] [--json]

The layers, each timed over the same number of env-steps (the median of 5 repeats):

- `gym`: `gym.make("CartPole-v1")` stepped in a Python loop (TimeLimit, OrderEnforcing and
  the env), with autoreset;
- `adapter`: the same envs through rlpipe's GymnasiumEnv, the contract adapter;
- `table_python`: EnvTable.step_one + finish, the Python reference path (the pool path);
- `stepper_inline`: the worker's inline path, the C StepLoop with the step deadline armed;
- `stepper_pool`: the helper-thread pool of worker.threads=2 (CartPole holds the GIL, so
  this is the pool's hand-off cost, not a gain);
- `sync_vector_env`: Gymnasium's SyncVectorEnv over the same number of envs;
- `ppo_bookkeeping`: what a slice adds in PPO mode with `+stage=day4`'s scaling and per-env
  reward normalization, stepping aside: epsilon-greedy's executed action and behaviour
  log-prob, reward normalization, the stability tracker's update and scores (run it with
  PYTHONPATH set to another checkout to time that checkout's versions of them).

Caches are warm here (one slice, stepped over and over). In the engine, 100 workers share
2 cores, so every layer costs more; engine_sps.py measures that whole.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym
import numpy as np
from hydra import compose, initialize_config_dir

from rlpipe.config import conf_dir, register_schema, run_spec
from rlpipe.envs.registry import describe, make_factory
from rlpipe.spec import ObsKey
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.exploration import EpsilonGreedy
from rlpipe.worker.rewardnorm import RewardNormalizer
from rlpipe.worker.stability import StabilityTracker
from rlpipe.worker.stepper import Stepper

RESULT_FIELDS = (
    ("reward", np.float32),
    ("terminated", np.uint8),
    ("truncated", np.uint8),
    ("ep_return", np.float32),
    ("ep_len", np.int32),
)


def per_step_us(fn, steps: int) -> float:
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) / steps * 1e6


def day4_spec():
    """The run spec of `+stage=day4 env_mix=cartpole`: the cartpole node the envs are built from
    (conf/env/cartpole.yaml, as a run builds them) and day4's scaling and reward normalization."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return run_spec(compose(config_name="config", overrides=["+stage=day4", "env_mix=cartpole"]))


def make_table(n: int, node: dict) -> tuple[EnvTable, dict]:
    keys = (ObsKey("state", (8,), "float32"),)
    staging = [np.zeros((n, 8), np.float32)]
    table = EnvTable(0, np.zeros(n, np.int16), ("cartpole",), (describe(node),), [make_factory(node)], keys, staging, 0)
    for i in range(n):
        table.start(i)
    return table, {name: np.zeros(n, dtype) for name, dtype in RESULT_FIELDS}


def ppo_bookkeeping(n: int, rounds: int, rng: np.random.Generator, spec):
    """A loop of `rounds` slices' PPO-mode bookkeeping, as Worker.step_slice calls it, on
    CartPole-like data: exploration rates of up to 0.1, rewards of 1 with an episode end now
    and then, the tracker's window full."""
    explore = EpsilonGreedy(np.zeros(n, dtype=bool), np.full(n, 2), seed=1)
    explore.set_epsilon(rng.uniform(0.0, 0.1, n))
    rnorm = RewardNormalizer(
        n, spec.reward_norm.mode, spec.reward_norm.clip, spec.learner.gamma, np.zeros(n, dtype=np.int64)
    )
    tracker = StabilityTracker(n, window=spec.scaling.window)
    a = rng.integers(0, 2, n).astype(np.int32)
    a_cont = np.zeros((n, 1), np.float32)
    logp = rng.normal(-0.7, 0.1, n).astype(np.float32)
    reward = np.ones(n, np.float32)
    ep_len = np.where(rng.random(n) < 0.05, 40, 0).astype(np.int32)
    cut = np.zeros(n, dtype=bool)
    done = ep_len > 0
    for _ in range(tracker.window):
        tracker.update(0, n, reward, ep_len, cut)

    def loop():
        for _ in range(rounds):
            explore.apply(0, n, a, a_cont, logp, 1 - a, a_cont, logp - 0.1)
            rnorm.normalize(0, n, reward, done)
            tracker.update(0, n, reward, ep_len, cut)
            tracker.scores(0, n)

    return loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, default=70, help="envs in the slice (groups.size)")
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    args = ap.parse_args()
    n, rounds = args.envs, args.rounds
    steps = n * rounds
    rng = np.random.default_rng(0)
    disc = rng.integers(0, 2, n).astype(np.int32)
    cont = np.zeros((n, 1), np.float32)
    results = {}
    spec = day4_spec()
    node = spec.env_types[0].node

    envs = [gym.make("CartPole-v1", disable_env_checker=True) for _ in range(n)]
    for i, e in enumerate(envs):
        e.reset(seed=i)

    def gym_loop():
        for _ in range(rounds):
            for e, a in zip(envs, disc):
                _obs, _r, term, trunc, _info = e.step(a)
                if term or trunc:
                    e.reset()

    results["gym"] = per_step_us(gym_loop, steps)

    factory = make_factory(node)
    adapters = [factory(env_id=i, seed=i) for i in range(n)]
    for i, a in enumerate(adapters):
        a.reset(i)
    actions = disc.tolist()

    def adapter_loop():
        for _ in range(rounds):
            for i, (env, a) in enumerate(zip(adapters, actions)):
                _obs, _r, term, trunc, _info = env.step(i, a)
                if term or trunc:
                    env.reset(i)

    results["adapter"] = per_step_us(adapter_loop, steps)

    table, out = make_table(n, node)
    results["table_python"] = per_step_us(
        lambda: [table.step_range(0, n, disc, cont, out) for _ in range(rounds)], steps
    )
    for threads, name in ((1, "stepper_inline"), (2, "stepper_pool")):
        table, out = make_table(n, node)
        stepper = Stepper(table, threads, 30.0, out)
        results[name] = per_step_us(  # this iteration's stepper and table, bound now
            lambda stepper=stepper, table=table: [
                stepper.step(0, n, table.actions(0, n, disc, cont)) for _ in range(rounds)
            ],
            steps,
        )
        stepper.close()
        table.close_all()

    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    sync.reset(seed=0)
    results["sync_vector_env"] = per_step_us(lambda: [sync.step(disc) for _ in range(rounds)], steps)
    sync.close()

    results["ppo_bookkeeping"] = per_step_us(ppo_bookkeeping(n, rounds, rng, spec), steps)

    for name, us in results.items():
        print(f"{name:>16}: {us:6.2f} µs per env-step", flush=True)
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()

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
- `sync_vector_env`: Gymnasium's SyncVectorEnv over the same number of envs.

Caches are warm here (one slice, stepped over and over). In the engine, 100 workers share
2 cores, so every layer costs more; engine_sps.py measures that whole.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import gymnasium as gym
import numpy as np

from rlpipe.spec import ObsKey
from rlpipe.envs.classic import GymnasiumEnv
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.stepper import Stepper

RESULT_FIELDS = (("reward", np.float32), ("terminated", np.uint8), ("truncated", np.uint8),
                 ("ep_return", np.float32), ("ep_len", np.int32))


def per_step_us(fn, steps: int) -> float:
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) / steps * 1e6


def make_table(n: int) -> tuple[EnvTable, dict]:
    spec = GymnasiumEnv.describe("CartPole-v1")
    keys = (ObsKey("state", (8,), "float32"),)
    staging = [np.zeros((n, 8), np.float32)]
    table = EnvTable(0, np.zeros(n, np.int16), ("cartpole",), (spec,),
                     [functools.partial(GymnasiumEnv, id="CartPole-v1")], keys, staging, 0)
    for i in range(n):
        table.start(i)
    return table, {name: np.zeros(n, dtype) for name, dtype in RESULT_FIELDS}


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

    adapters = [GymnasiumEnv("CartPole-v1", env_id=i, seed=i) for i in range(n)]
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

    table, out = make_table(n)
    results["table_python"] = per_step_us(
        lambda: [table.step_range(0, n, disc, cont, out) for _ in range(rounds)], steps)
    for threads, name in ((1, "stepper_inline"), (2, "stepper_pool")):
        table, out = make_table(n)
        stepper = Stepper(table, threads, 30.0, out)
        results[name] = per_step_us(
            lambda: [stepper.step(0, n, table.actions(0, n, disc, cont)) for _ in range(rounds)], steps)
        stepper.close()
        table.close_all()

    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    sync.reset(seed=0)
    results["sync_vector_env"] = per_step_us(lambda: [sync.step(disc) for _ in range(rounds)], steps)
    sync.close()

    for name, us in results.items():
        print(f"{name:>16}: {us:6.2f} µs per env-step", flush=True)
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()

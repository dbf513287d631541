"""The learner's hot path per inference round, without a worker process: the slice engine's
in-process backend (rlpipe/supervisor/inprocess.py) hands the learner its rounds, and the
main thread's CPU time of each move is measured apart.

    python benchmarks/hot_path.py                                     # 7,000 CartPoles, PPO
    python benchmarks/hot_path.py --overrides +stage=day4 scaling=off # the day4 mix's rows

Per round (every env of the mix ready at once, as in a round of random actions where every
slice rang): `recv` (the round's arrays), `act` (the policy's forward on every row and its
samples), `observe` (episodes, the (time x env) rollouts, GAE of the blocks that completed).
The envs' own steps (`send`, in this process here) are left out: in a run they are the
workers'. Prints the median and p90 ms per round of each move and the median microseconds
per row; the figures are the main thread's CPU time (`time.thread_time`), so say what ran
beside them. No PPO update runs (the rollouts are dropped as they complete): this is the
serving thread's work only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from rlpipe.config import conf_dir, register_schema, run_spec  # noqa: E402
from rlpipe.learner.central import CentralLearner  # noqa: E402
from rlpipe.supervisor.inprocess import InProcessEngine  # noqa: E402

MOVES = ("recv", "act", "observe")


def measure(overrides: list[str], rounds: int, warmup: int = 3) -> dict:
    """{move: [thread CPU seconds per round]} and the rows per round."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        spec = run_spec(compose(config_name="config", overrides=overrides))
    torch.set_num_threads(spec.learner.torch_threads)
    engine = InProcessEngine(spec)
    learner = CentralLearner(spec, engine.describe())
    engine.start()
    times = {m: [] for m in MOVES}
    clock = time.thread_time
    try:
        for k in range(warmup + rounds):
            t0 = clock()
            rnd = engine.recv()
            t1 = clock()
            actions = learner.act(rnd)
            t2 = clock()
            engine.send(rnd.slots, actions)  # the envs' steps: a worker's work in a run
            t3 = clock()
            learner.observe(rnd)
            t4 = clock()
            learner.ready_blocks.clear()  # no update: the serving thread's work only
            learner.ready_types.clear()
            learner.ready_samples = 0
            if k >= warmup:
                times["recv"].append(t1 - t0)
                times["act"].append(t2 - t1)
                times["observe"].append(t4 - t3)
    finally:
        engine.close()
    return {"times": times, "rows": spec.env_count}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overrides", nargs="*", default=["env_mix=cartpole", "env_count=7000"])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    result = measure(args.overrides, args.rounds)
    rows = result["rows"]
    print(f"{' '.join(args.overrides)}: {rows} rows a round, {args.rounds} rounds")
    print(f"{'move':<8} {'median ms':>10} {'p90 ms':>8} {'us/row':>8}")
    total = 0.0
    for move, seconds in result["times"].items():
        med = statistics.median(seconds)
        p90 = sorted(seconds)[int(0.9 * (len(seconds) - 1))]
        total += med
        print(f"{move:<8} {1e3 * med:>10.2f} {1e3 * p90:>8.2f} {1e6 * med / rows:>8.3f}")
    print(f"{'total':<8} {1e3 * total:>10.2f} {'':>8} {1e6 * total / rows:>8.3f}")


if __name__ == "__main__":
    main()

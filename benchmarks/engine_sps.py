"""Env-steps/s of the full engine (random actions from the learner, no training) on CartPole,
beside Gymnasium's SyncVectorEnv stepping the same envs in one process.

    python benchmarks/engine_sps.py [--counts 1000 7000] [--seconds 60] [--json]

The engine figure is the median of its TensorBoard `charts/sps` samples (one per 2 s) taken
while every env was active (`envs/active` == env_count), so start-up does not dilute it. The
SyncVectorEnv figure is the median of 1-second windows, half of them taken just before the
engine run and half just after: on a shared machine whose speed drifts, both sides of the
ratio see the same drift (the halves are printed so the drift shows).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from rlpipe.telemetry.tb_events import read_scalars

REPO = Path(__file__).resolve().parent.parent


def engine_sps(n: int, seconds: float, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="rlb", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlpipe", f"hydra.run.dir={run_dir}", "env_mix=cartpole",
               f"env_count={n}", "learner.mode=random", f"run.duration_s={seconds}",
               "groups.hot=100000",      # every group hot: this measures stepping (startup.py: the ramp)
               "run.total_env_steps=null", *extra]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"engine run failed:\n{out.stderr[-3000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        scalars = read_scalars(run_dir / "tb")
        # Steady state: samples whose window had every env active, the first one dropped
        # (it may still straddle the ramp).
        active = dict(zip(scalars["envs/active"].steps.tolist(), scalars["envs/active"].values.tolist()))
        sps = scalars["charts/sps"]
        steady = [v for s, v in zip(sps.steps.tolist(), sps.values.tolist()) if active.get(s) == n][1:]
        return {"sps_median": statistics.median(steady) if steady else 0.0,
                "samples": len(steady), "summary_sps": summary["sps"],
                "all_envs_ready_s": summary["all_envs_ready_s"],
                "startup_first_step_s": summary["startup_first_step_s"],
                "peak_rss_mb": summary["peak_rss_mb"]}


def sync_vector_windows(n: int, seconds: float) -> list[float]:
    """Env-steps/s of SyncVectorEnv over CartPole, in 1-second windows."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    windows = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t, steps = time.perf_counter(), 0
        while time.perf_counter() - t < 1.0:
            envs.step(rng.integers(0, 2, n))
            steps += n
        windows.append(steps / (time.perf_counter() - t))
    envs.close()
    return windows


def sync_summary(before: list[float], after: list[float]) -> dict:
    return {"sps_median": statistics.median(before + after), "samples": len(before) + len(after),
            "median_before": statistics.median(before), "median_after": statistics.median(after)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1000, 7000])
    ap.add_argument("--seconds", type=float, default=60.0, help="engine run length per count")
    ap.add_argument("--sync-seconds", type=float, default=16.0, help="split before/after the engine")
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the engine")
    args = ap.parse_args()
    results = {}
    for n in args.counts:
        before = sync_vector_windows(n, args.sync_seconds / 2)
        eng = engine_sps(n, args.seconds, args.overrides)
        sync = sync_summary(before, sync_vector_windows(n, args.sync_seconds / 2))
        ratio = eng["sps_median"] / sync["sps_median"]
        results[str(n)] = {"engine": eng, "sync_vector_env": sync, "ratio": round(ratio, 3)}
        print(f"{n:>6} envs: engine {eng['sps_median']:>10,.0f} sps (median of {eng['samples']}, "
              f"all ready at {eng['all_envs_ready_s']} s) | SyncVectorEnv "
              f"{sync['sps_median']:>10,.0f} sps (before {sync['median_before']:,.0f}, after "
              f"{sync['median_after']:,.0f}) | ratio {ratio:.2f}x", flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()

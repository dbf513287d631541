"""Each env type's return under uniformly random actions: the floor a learning claim is measured
against ("learned" means clearly above it, and above the type's own first episodes).

One env per type plays whole episodes with the actions the learner's `mode=random` draws
(uniform over the type's valid discrete actions, uniform in [-1, 1] on its continuous dims:
`harness.random_action`), within a per-type time budget, through the env harness
(rlpipe/envs/harness.py) as the worker steps it. A step that hangs past `step_timeout_s`
(web_sim; SIGALRM, `harness.AlarmDeadline`), an env that raises or breaks the contract (faulty)
cuts the episode, which is left out as the worker's returns leave it out, and the env is rebuilt.

Runs in a child process of the driver at nice 19 (`start_random_returns`), so it takes only
spare CPU; it writes `random_returns.json` in the run directory after each type, and the
driver reads whatever is there when the run ends.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np

from rlpipe.envs import harness
from rlpipe.envs.registry import describe, make_factory
from rlpipe.files import atomic_write
from rlpipe.procs import exit_when_gone

RESULT_FILE = "random_returns.json"


def play_random(node: dict, episodes: int, budget_s: float, seed: int, step_timeout_s: float = 5.0) -> dict:
    """{"mean", "std", "episodes"} of `episodes` random-action episodes of one type (fewer if
    the budget runs out; mean None when not one episode finished)."""
    spec = describe(node)
    factory = make_factory(node)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    deadline = time.monotonic() + budget_s
    env, rebuilds = None, 0
    alarm = harness.AlarmDeadline(step_timeout_s)  # steps only: a build or reset is not cut
    try:
        while len(returns) < episodes and time.monotonic() < deadline:
            try:
                if env is None:
                    env = harness.build(factory, 0, seed + 7919 * rebuilds)
                harness.reset(spec, env, 0)
                total, done = 0.0, False
                while not done and time.monotonic() < deadline:
                    _obs, reward, terminated, truncated = harness.step(
                        spec, env, 0, harness.random_action(spec, rng), alarm
                    )
                    total += reward
                    done = terminated or truncated
                if done and math.isfinite(total):
                    returns.append(total)
            except harness.CUTS:  # a crash, a contract break or a hang cuts the episode; a fresh env goes on
                harness.close(env, 0)
                env, rebuilds = None, rebuilds + 1
    finally:
        alarm.close()
        harness.close(env, 0)
    arr = np.asarray(returns, dtype=np.float64)
    return {
        "mean": float(arr.mean()) if len(arr) else None,
        "std": float(arr.std()) if len(arr) > 1 else None,
        "episodes": int(len(arr)),
    }


def measure_all(
    nodes: dict[str, dict], out_dir: str, episodes: int, budget_s: float, seed: int, driver_pid: int
) -> None:
    """Child-process entry: every type in turn, the file rewritten (atomically) after each.
    A driver killed with -9 cannot stop it, so it exits once its driver is gone: else it would
    play on for minutes, write into the run dir beside the run a supervisor restarted there,
    and keep the dead run's forkserver and resource tracker alive (rlpipe.procs.exit_when_gone)."""
    exit_when_gone(driver_pid)
    try:
        os.nice(19)
    except OSError:
        pass
    results: dict[str, dict] = {}
    path = Path(out_dir) / RESULT_FILE
    for i, (name, node) in enumerate(nodes.items()):
        results[name] = play_random(node, episodes, budget_s, seed + 1000 * i)
        atomic_write(path, json.dumps(results, indent=1))


def read_results(run_dir: Path) -> dict[str, dict]:
    try:
        return json.loads((Path(run_dir) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _clearly_above(x: np.ndarray, mean: float, std: float | None, n: int) -> bool:
    """x's mean is above `mean` by more than three standard errors of the difference and by
    5 % of `mean`'s size."""
    se = math.sqrt(x.var(ddof=1) / len(x) + (std or 0.0) ** 2 / max(n, 1))
    gain = float(x.mean()) - mean
    return gain > 3 * se and gain > 0.05 * abs(mean)


def verdict(last_returns, first_returns, episodes: int, random: dict | None, window: int = 100) -> str:
    """ "learned" when the last `window` returns of a type are clearly above both its
    random-action return and its own first `window` returns of the run (the untrained
    policy is not uniform random: beating only random could be the initial policy's luck);
    "did not learn" otherwise; "unknown" without a random figure, or before the type has
    finished 2 x window episodes (the two windows would overlap, and in a short run the
    finished episodes are the short ones)."""
    if not random or random.get("mean") is None or episodes < 2 * window:
        return "unknown"
    last, first = np.asarray(last_returns, dtype=np.float64), np.asarray(first_returns, dtype=np.float64)
    above_random = _clearly_above(last, random["mean"], random.get("std"), random["episodes"])
    above_start = _clearly_above(last, float(first.mean()), float(first.std(ddof=1)), len(first))
    return "learned" if above_random and above_start else "did not learn"


def start(ctx, nodes: dict[str, dict], run_dir: Path, episodes: int, budget_s: float, seed: int):
    """The measuring child process (a daemon: a clean exit stops it; a killed driver's dies
    with it, see `measure_all`), or None when `episodes` is 0."""
    if episodes <= 0:
        return None
    proc = ctx.Process(
        target=measure_all,
        args=(nodes, str(run_dir), episodes, budget_s, seed, os.getpid()),
        name="rlpipe-random-returns",
        daemon=True,
    )
    proc.start()
    return proc


def stop(proc) -> None:
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()

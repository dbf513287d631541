"""Each env type's return under uniformly random actions: the floor a learning claim is measured
against ("learned" means clearly above it, and above the type's own first episodes).

One env per type plays whole episodes with the actions the learner's `mode=random` draws
(uniform over the type's valid discrete actions, uniform in [-1, 1] on its continuous dims),
within a per-type time budget. A step that hangs past `step_timeout_s` (web_sim) or an env
that raises (faulty) cuts the episode, which is left out, and the env is rebuilt.

Runs in a child process of the driver at nice 19 (`start_random_returns`), so it takes only
spare CPU; it writes `random_returns.json` in the run directory after each type, and the
driver reads whatever is there when the run ends.
"""
from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import numpy as np

from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import describe, make_factory
from rlpipe.files import atomic_write
from rlpipe.procs import exit_when_gone

RESULT_FILE = "random_returns.json"


class _StepTimeout(Exception):
    pass


def _on_alarm(_signum, _frame):
    raise _StepTimeout()


def play_random(node: dict, episodes: int, budget_s: float, seed: int,
                step_timeout_s: float = 5.0) -> dict:
    """{"mean", "std", "episodes"} of `episodes` random-action episodes of one type (fewer if
    the budget runs out; mean None when not one episode finished)."""
    spec = describe(node)
    factory = make_factory(node)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    deadline = time.monotonic() + budget_s
    env, rebuilds = None, 0
    alarm = hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    if alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    try:
        while len(returns) < episodes and time.monotonic() < deadline:
            try:
                if env is None:
                    env = factory(env_id=0, seed=seed + 7919 * rebuilds)
                env.reset(0)
                total, done = 0.0, False
                while not done and time.monotonic() < deadline:
                    if spec.action_kind == CONTINUOUS:
                        action = rng.uniform(-1.0, 1.0, spec.action_n).astype(np.float32)
                    else:
                        action = np.int64(rng.integers(spec.action_n))
                    if alarm:
                        signal.setitimer(signal.ITIMER_REAL, step_timeout_s)
                    _obs, reward, terminated, truncated, _info = env.step(0, action)
                    if alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    total += float(reward)
                    done = bool(terminated) or bool(truncated)
                if done and math.isfinite(total):
                    returns.append(total)
            except Exception:          # a crash or a hang cuts the episode; a fresh env goes on
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                _close(env)
                env, rebuilds = None, rebuilds + 1
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _close(env)
    arr = np.asarray(returns, dtype=np.float64)
    return {"mean": float(arr.mean()) if len(arr) else None,
            "std": float(arr.std()) if len(arr) > 1 else None, "episodes": int(len(arr))}


def _close(env) -> None:
    if env is not None:
        try:
            env.close(0)
        except Exception:
            pass


def measure_all(nodes: dict[str, dict], out_dir: str, episodes: int, budget_s: float, seed: int,
                driver_pid: int) -> None:
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
    """"learned" when the last `window` returns of a type are clearly above both its
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
    proc = ctx.Process(target=measure_all, args=(nodes, str(run_dir), episodes, budget_s, seed, os.getpid()),
                       name="rlpipe-random-returns", daemon=True)
    proc.start()
    return proc


def stop(proc) -> None:
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()

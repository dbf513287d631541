"""Each env type's return under uniformly random actions and under the run's untrained policy:
the two floors a learning claim is measured against ("learned" means clearly above both).

One env per type plays whole episodes with the actions the learner's `mode=random` draws
(uniform over the type's valid discrete actions, uniform in [-1, 1] on its continuous dims:
`harness.random_action`), within a per-type time budget, through the env harness
(rlpipe/envs/harness.py) as the worker steps it. A step that hangs past `step_timeout_s`
(web_sim; SIGALRM, `harness.AlarmDeadline`), an env that raises or breaks the contract (faulty)
cuts the episode, which is left out as the worker's returns leave it out, and the env is rebuilt.

The untrained policy (`rlpipe.learner.initial_return.InitialPolicy`: the learner's weights
before its first update, as the workers first act with them) then plays
`logging.initial_policy_episodes` whole episodes of each type, sampling its actions as training
does (`rlpipe.learner.play`), with no time budget (see `InitialPolicy.play`). That is the verdict's "own start", where none of its episodes was cut. The
run's first 100 finished episodes were that reference before. They are biased wherever
episode length depends on the outcome: the first episodes to finish are the short ones, and
a type that ends on success (bullet_reacher, web_sim) then starts from its untrained policy's
best episodes, while one that ends on failure (CartPole) starts from its worst. The first 100
stay in `summary.json` (`mean_return_first100`) and are the reference only where the untrained
policy has no whole sample: a type whose envs fault (faulty) or run past `max_steps`, a run
that ends before the probe reaches the type, a resumed run whose first start wrote none (a
resume keeps the file of its first start).

Runs in a child process of the driver under SCHED_IDLE (`rlpipe.procs.idle_priority`; at nice
`PROBE_NICE` where there is none), so it plays on the CPU time the run leaves; it writes
`random_returns.json` and `initial_policy_returns.json` in the run directory after each type,
and the driver reads whatever is there when the run ends.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlpipe.envs import harness
from rlpipe.envs.registry import describe, make_factory
from rlpipe.files import atomic_write
from rlpipe.outputlog import OutputLog
from rlpipe.procs import exit_when_gone, idle_priority
from rlpipe.proctree import ENV_OOM_SCORE_ADJ, become_subreaper, kill_descendants, set_oom_score_adj

if TYPE_CHECKING:  # the learner layer's: this module only calls its build() and play()
    from rlpipe.learner.initial_return import InitialPolicy

RESULT_FILE = "random_returns.json"
INITIAL_FILE = "initial_policy_returns.json"
OUTPUT_FILE = "random_return_probe.log"  # what its envs print, capped
# The nice where SCHED_IDLE is missing (not Linux). Nice 10, not 19: beside a day4 run at nice
# 19 (2026-12-02, before the PPO update had a process of its own) the probe got under 1 % of a
# core and took 21 minutes of a 30-minute run for 20 untrained episodes a type. On Linux it
# runs under SCHED_IDLE: at nice 10 beside day4 on 2 CPUs it took 0.18 of the PPO update's CPU
# (more than CFS's weights, 110 against 1,024, would give a busy thread), under SCHED_IDLE
# 0.12-0.16, in the moments the update waited for a batch, and in 180 s it measured as many
# types as before (docs/benchmarks.md, "The probe at SCHED_IDLE"). It is in the workers' memory
# cgroup only (CgroupDriver.memory_paths): in their cpu cgroup it took 0.25-0.29.
PROBE_NICE = 10


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
    nodes: dict[str, dict],
    out_dir: str,
    episodes: int,
    budget_s: float,
    seed: int,
    driver_pid: int,
    initial_pickle: bytes | None = None,
    cgroup_paths: tuple[str, ...] = (),
    keep_measured: bool = False,
) -> None:
    """Child-process entry: `measure` under SCHED_IDLE (else at nice `PROBE_NICE`). A driver
    killed with -9 cannot stop it, so it exits once its driver is gone: else it would play on
    for minutes, write into the run dir beside the run a supervisor restarted there, and keep
    the dead run's forkserver and resource tracker alive (rlpipe.procs.exit_when_gone).

    The untrained policy comes pickled, and `measure` unpickles it only after the random
    figures: that imports torch (seconds of a busy machine's idle CPU time), and a short run
    ended before its random floor was written while the child's arguments waited on the import."""
    exit_when_gone(driver_pid)
    # What its envs start dies with it, as with a worker (rlpipe.proctree): on its own end and
    # on the driver's SIGTERM (`stop`).
    become_subreaper()
    # a process group of its own: what its envs start, left behind if it is SIGKILLed, is then
    # in a group that is not the forkserver's, where the driver finds orphans (supervisor/orphans)
    os.setpgrp()
    signal.signal(signal.SIGTERM, _end_with_descendants)
    # Its envs' memory is limited as the workers' (rlpipe.supervisor.memory): the awake
    # workers' memory cgroup (not their CPU weight: SCHED_IDLE), and the OOM killer's first picks.
    for procs in cgroup_paths:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    set_oom_score_adj(ENV_OOM_SCORE_ADJ)
    # what its envs print goes to a capped file of its own, as a worker's (rlpipe.outputlog)
    output = OutputLog(str(Path(out_dir) / OUTPUT_FILE), f"random-return probe pid {os.getpid()}")
    threading.Thread(target=_check_every, args=(output, 0.5), name="output-cap", daemon=True).start()
    try:
        os.nice(PROBE_NICE)  # where SCHED_IDLE is refused or missing
    except OSError:
        pass
    idle_priority()
    try:
        measure(nodes, out_dir, episodes, budget_s, seed, initial_pickle, keep_measured)
    finally:
        kill_descendants()


def _check_every(output: OutputLog, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        output.check()


def _end_with_descendants(*_) -> None:
    kill_descendants()
    os._exit(0)


def measure(
    nodes: dict[str, dict],
    out_dir: str,
    episodes: int,
    budget_s: float,
    seed: int,
    initial_pickle: bytes | None,
    keep_measured: bool = False,
) -> None:
    """Every type's random return, then (given the pickled `InitialPolicy`) every type's
    untrained-policy return, each file rewritten (atomically) after each type. With
    `keep_measured` (a resumed run) the types the run dir's file already holds keep their
    figure: a short resumed start stopped before the probe came round to a type left it with
    none, and its `learned` verdict turned unknown."""
    kept = read_results(Path(out_dir)) if keep_measured else {}
    results: dict[str, dict] = {name: kept[name] for name in nodes if name in kept}
    for i, (name, node) in enumerate(nodes.items()):
        if name in results:
            continue
        results[name] = play_random(node, episodes, budget_s, seed + 1000 * i)
        atomic_write(Path(out_dir) / RESULT_FILE, json.dumps(results, indent=1))
    if initial_pickle is None:
        return
    # after every random figure: these take longer, and a short run needs the random floor most
    initial: InitialPolicy = pickle.loads(initial_pickle)
    policy = initial.build()
    starts: dict[str, dict] = {}
    for i, (name, node) in enumerate(nodes.items()):
        starts[name] = initial.play(policy, name, node, seed + 1000 * i + 500)
        atomic_write(Path(out_dir) / INITIAL_FILE, json.dumps(starts, indent=1))


def not_measured(run_dir: Path, names: list[str], logging_spec) -> dict[str, dict[str, str]]:
    """Why a type has no `random_return` or `initial_policy_return` in summary.json, per
    figure and type (`logging_spec`: the run's LoggingSpec): the summary says so rather than
    leave an empty entry to be read as "none measured, for no reason"."""
    randoms, starts = read_results(run_dir), read_results(run_dir, INITIAL_FILE)
    out: dict[str, dict[str, str]] = {"random_return": {}, "initial_policy_return": {}}
    for name in names:
        if randoms.get(name, {}).get("mean") is None:
            out["random_return"][name] = (
                "off (logging.random_return_episodes=0)"
                if not logging_spec.random_return_episodes
                else "the probe had not finished it when the run ended"
                if name not in randoms
                else "no episode finished within logging.random_return_budget_s"
            )
        if not whole_sample(starts.get(name)):
            out["initial_policy_return"][name] = (
                "off (logging.initial_policy_episodes=0, or logging.random_return_episodes=0)"
                if not logging_spec.initial_policy_episodes or not logging_spec.random_return_episodes
                else "the probe had not come to it when the run ended (it plays every type's random "
                "episodes first); a resumed run measures it only in its first start"
                if name not in starts
                else "its sample had a cut episode or fewer than 2 episodes"
            )
    return {figure: reasons for figure, reasons in out.items() if reasons}


def read_results(run_dir: Path, name: str = RESULT_FILE) -> dict[str, dict]:
    try:
        return json.loads((Path(run_dir) / name).read_text())
    except (OSError, ValueError):
        return {}


def _clearly_above(x: np.ndarray, mean: float, std: float | None, n: int) -> bool:
    """x's mean is above `mean` by more than three standard errors of the difference and by
    5 % of `mean`'s size."""
    se = math.sqrt(x.var(ddof=1) / len(x) + (std or 0.0) ** 2 / max(n, 1))
    gain = float(x.mean()) - mean
    return gain > 3 * se and gain > 0.05 * abs(mean)


def whole_sample(result: dict | None) -> bool:
    """Whether the untrained policy's figure can stand for it: two or more episodes, none cut
    (the finished ones of a sample with cuts are its short ones)."""
    return bool(result) and result.get("mean") is not None and result.get("episodes", 0) > 1 and not result.get("cut")


def verdict(
    last_returns, first_returns, episodes: int, random: dict | None, start: dict | None = None, window: int = 100
) -> str:
    """ "learned" when the last `window` returns of a type are clearly above both its
    random-action return and its own start: the untrained policy's return (`start`, measured
    by the probe, with no episode cut) or, where there is none, its first `window` returns of the run (the
    untrained policy is not uniform random: beating only random could be its luck);
    "did not learn" otherwise; "unknown" without a random figure, or before the type has
    finished 2 x window episodes (in a short run the finished episodes are the short ones)."""
    if not random or random.get("mean") is None or episodes < 2 * window:
        return "unknown"
    last = np.asarray(last_returns, dtype=np.float64)
    above_random = _clearly_above(last, random["mean"], random.get("std"), random["episodes"])
    if whole_sample(start):
        above_start = _clearly_above(last, start["mean"], start.get("std"), start["episodes"])
    else:
        first = np.asarray(first_returns, dtype=np.float64)
        above_start = _clearly_above(last, float(first.mean()), float(first.std(ddof=1)), len(first))
    return "learned" if above_random and above_start else "did not learn"


def start(
    ctx,
    nodes: dict[str, dict],
    run_dir: Path,
    episodes: int,
    budget_s: float,
    seed: int,
    initial: InitialPolicy | None = None,
    cgroup_paths: tuple[str, ...] = (),
    keep_measured: bool = False,
):
    """The measuring child process (a daemon: a clean exit stops it; a killed driver's dies
    with it, see `measure_all`), or None when `episodes` is 0."""
    if episodes <= 0:
        return None
    proc = ctx.Process(
        target=measure_all,
        args=(
            nodes,
            str(run_dir),
            episodes,
            budget_s,
            seed,
            os.getpid(),
            pickle.dumps(initial) if initial else None,
            tuple(cgroup_paths),
            keep_measured,
        ),
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

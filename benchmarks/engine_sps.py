"""Env-steps/s of the full engine on CartPole (random actions, and PPO training with
learner.backlog=hold and drop), beside Gymnasium's SyncVectorEnv and AsyncVectorEnv and
PufferLib's Multiprocessing on the same envs, all in one run.

    python benchmarks/engine_sps.py [--counts 1000 7000] [--ppo-counts 1000 7000]
                                    [--layouts auto 70] [--ppo-modes hold drop hold+null drop+null]
                                    [--seconds 60] [--no-puffer] [--json]
                                    [hydra overrides for the engine...]

With the PufferLib rows, run it with the bench venv's python (benchmarks/baselines.py says
how to make it): `PYTHONPATH=<checkout> /tmp/rlv-bench-venv/bin/python benchmarks/engine_sps.py`.

Stopped with SIGTERM or Ctrl-C, it stops the engine run in progress cleanly (the driver's own
stop) and removes that run's temporary directory.

Baselines are built exactly as the engine's adapter builds its envs
(rlpipe.envs.classic.make_gym: `gym.make("CartPole-v1", disable_env_checker=True)`, no
wrapper: conf/env/cartpole.yaml sets neither make_kwargs nor wrappers). The adapter then steps
the bare env and keeps gym.make's TimeLimit and OrderEnforcing rules itself
(rlpipe.envs.classic.bare_step); the baselines step through those two wrappers, as a user's
gym.make env does. So that the engine's side is not the only one spared them:

* `SyncVectorEnv`: all envs stepped in this one process.
* `SyncVectorEnv, bare envs`: the same over each env's `.unwrapped` (no TimeLimit, no
  OrderEnforcing: with random actions a CartPole episode ends long before 500 steps, so the
  envs step the same); the engine rows' notes give their ratio to it too (JSON
  `env_over_sync_bare`).
* `AsyncVectorEnv` (shared_memory=True, fork context): one process per env. Tried only at
  counts this machine can hold: per-env private memory is measured on a 16-env probe and the
  count is skipped (the reason printed) when it would need more than half of MemAvailable,
  more file descriptors than RLIMIT_NOFILE's hard limit, or more processes than RLIMIT_NPROC.
* PufferLib's `Multiprocessing` (`pufferlib-core`; on by default where it imports, `--no-puffer`
  leaves it out, and where it does not import one line says so and how to install it), each
  env the same CartPole in PufferLib's GymnasiumPufferEnv, one worker process per CPU (it
  refuses more than the physical cores; the most that divide the count), two rows:
  `zero-copy, batch = all envs` (recv returns every env, read in place) and `batch = half the
  envs (EnvPool-style)`: zero_copy off, so a recv returns the first half of the workers back
  while the other half steps (baselines.puffer_half_batch; one worker has no such row). Each
  half of its windows runs in a child process in a session of its own, killed whole when it
  ends, and which with its workers dies with this script even when it is SIGKILLed (PufferLib's
  workers outlive a parent that dies: baselines.run_in_own_session).

Each baseline figure is the median of 1-second windows of the same random-action loop (actions
drawn with numpy for the batch a step returns), half taken before the engine runs of that
count and half after (the machine is shared and its speed drifts: both sides of every ratio
see the drift; the halves are printed). A random-action engine row's notes also give its
ratio to PufferLib's better row of that count (JSON `env_over_puffer_best`).

Engine figures come from the run's own TensorBoard charts (one sample per 2 s): the windows
in which every env was active (`envs/active` == env_count), the first such one dropped.
`env_sps_median` is the median of their `charts/sps`; `env_sps_mean` and `trained_per_s` are
Σ env steps / Σ seconds and Σ trained samples / Σ seconds over the same windows, where a
trained sample is an env step that went into a finished PPO update (`learner/trained_samples`,
also summary.json `trained_samples`). Ratios use the median env-steps/s (random rows, as
before) and the mean rates (ppo rows, so env steps and trained samples share one clock).
A run in which no window had every env active is an error (exit 1, named), not a 0.

PPO rows: `+stage=day4 learner.mode=ppo env_mix=cartpole`, every group hot: the learner
settings of the stage that runs 7,000 envs (rollout_len 16, update_envs 512, minibatch 2048,
4 epochs: the quick start's tuning in the cartpole mix is set back to conf/learner/ppo.yaml's,
`stage_update`; gradient scaling and per-env reward normalization on; the same figures at 1,000 envs
so the two rows compare). `--ppo-modes` names each PPO row as BACKLOG[+AFFINITY]: `hold`
and `drop` run conf/'s `worker.cpu_affinity` (auto: learner_core where PPO trains on 2+ CPUs,
rlpipe/process_layout.py), `+null` with the workers on every CPU (the default before auto),
`+core` with `worker.cpu_affinity=learner_core`. Overrides given on the command line apply
to every engine run.

Process layouts (`--layouts`): each engine row runs once per layout. `auto` overrides nothing:
conf/'s `groups.size=auto worker.slices=auto` resolved for this machine (rlpipe/
process_layout.py; on 2 CPUs 7,000 envs are 4 groups of 1,750 in 5 slices of 350 with random
actions, and 10 of 700 in 10 slices under PPO, whose update keeps one CPU). `70` is the
layout before auto, the origin system's: groups of 70 envs, one worker process each, one
slice (100 processes at 7,000 envs). `GxS` is groups of G in S slices (`350x5`: 20 processes
at 7,000 envs, the same 70-env slices, doorbells and rollout blocks, so PPO batches are the
same size). Each row's notes print the layout the run resolved (summary.json `layout`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from rlpipe.procs import die_with_parent
from rlpipe.telemetry.tb_events import read_scalars

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # baselines, shared with vector_sps.py; argtypes

from argtypes import positive_float, positive_int  # noqa: E402
from baselines import (  # noqa: E402
    forks_die_with_their_parent,
    gym_thunk,
    make_puffer,
    puffer_half_batch,
    puffer_missing,
    puffer_workers,
    run_in_own_session,
)

REPO = HERE.parent
GYM_ID = "CartPole-v1"


# as GymnasiumEnv builds CartPole (rlpipe.envs.classic.make_gym with the cartpole conf), for
# every baseline: SyncVectorEnv, AsyncVectorEnv and, each in its GymnasiumPufferEnv, PufferLib
make_env = gym_thunk(GYM_ID)


class NotSteady(RuntimeError):
    """No TensorBoard window of the run had every env active."""


# --- the engine -------------------------------------------------------------------------------


def layout_overrides(layout: str) -> list[str]:
    """'auto' (conf/'s defaults), 'G' or 'GxS': groups of G envs (one worker process each), in
    S slices (auto slices for 'G')."""
    if layout == "auto":
        return []
    size, x, slices = layout.partition("x")
    if not size.isdigit() or (x and not slices.isdigit()):
        raise SystemExit(f"--layouts: {layout!r} is not auto, GROUP_SIZE or GROUP_SIZExSLICES (e.g. 70, 350x5)")
    return [f"groups.size={size}"] + ([f"worker.slices={slices}"] if slices else [])


def layout_name(layout: str) -> str:
    if layout == "auto":
        return "layout auto"
    size, _, slices = layout.partition("x")
    return f"groups of {size}" + (f" x {slices} slices" if slices else "")


def resolved_layout(summary: dict) -> str:
    """What the run ran, from summary.json `layout` (absent before auto existed)."""
    lay = summary.get("layout")
    if not lay:
        return "layout not reported"
    cpus = (
        "workers on every CPU"
        if lay["cpu_affinity"] == "null"
        else f"learner core {lay['learner_cpu']} by {lay.get('learner_core_by') or 'pinning'} from {lay['workers_pinned_s']} s"
        if lay["cpu_affinity"] == "learner_core"
        else f"workers on CPUs {lay['worker_cpus']}"
    )
    return f"ran {lay['workers']} x {lay['group_size']} in {lay['slices']} slices, {cpus}"


AFFINITIES = {"": [], "null": ["worker.cpu_affinity=null"], "core": ["worker.cpu_affinity=learner_core"]}


def mode_overrides(mode: str) -> list[str]:
    """'random', or BACKLOG[+AFFINITY]: PPO with that learner.backlog and conf/'s
    worker.cpu_affinity (auto), every CPU for the workers (+null) or learner_core (+core)."""
    if mode == "random":
        return ["learner.mode=random"]
    backlog, _, affinity = mode.partition("+")
    if backlog not in ("hold", "drop") or affinity not in AFFINITIES:
        raise SystemExit(f"--ppo-modes: {mode!r} is not hold or drop, optionally with +null or +core")
    return ["+stage=day4", "learner.mode=ppo", f"learner.backlog={backlog}", *stage_update(), *AFFINITIES[affinity]]


def stage_update() -> list[str]:
    """The PPO update of day4 itself on CartPole's envs: conf/env_mix/cartpole.yaml tunes the
    update to the quick start, and day4 resets only some of those keys; the others are set back
    to conf/learner/ppo.yaml's values, so these rows train as day4 does at 7,000 envs."""
    from omegaconf import OmegaConf

    conf = REPO / "conf"
    mix = OmegaConf.load(conf / "env_mix" / "cartpole.yaml").get("learner", {})
    stage = OmegaConf.load(conf / "stage" / "day4.yaml").learner
    defaults = OmegaConf.load(conf / "learner" / "ppo.yaml")
    return [f"learner.{key}={defaults[key]}" for key in mix if key not in stage]


def mode_name(mode: str) -> str:
    if mode == "random":
        return "engine random actions"
    backlog, _, affinity = mode.partition("+")
    return (
        f"engine PPO backlog={backlog}" + {"": "", "null": ", workers on every CPU", "core": ", learner core"}[affinity]
    )


ENGINE_STOP_S = 60.0  # a stopped engine run's clean teardown, before it is killed


def stop_on_sigterm() -> None:
    """SIGTERM ends this script as Ctrl-C does: through its `finally` blocks, so an engine run
    in progress is stopped cleanly (`run_engine`) and its temporary run dir removed. By default
    SIGTERM ended the script at once and left both behind."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def run_engine(cmd: list[str], out_dir: Path, during=None) -> subprocess.CompletedProcess:
    """`python -m rlpipe` to its end, its output in files of `out_dir`; `during(pid)`, if
    given, runs while it does (cpu_budget.py samples it). If this script is stopped meanwhile
    (SIGTERM, Ctrl-C) the run gets SIGTERM, the driver's clean stop (workers, Redis, segments,
    cgroups), and is waited for ENGINE_STOP_S before it is killed; and it gets SIGTERM from
    the kernel should this script die without a word (SIGKILL)."""
    with open(out_dir / "stdout", "w+") as stdout, open(out_dir / "stderr", "w+") as stderr:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=stdout, stderr=stderr, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM)
        )
        try:
            if during is not None:
                during(proc.pid)
            proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(ENGINE_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout.read(), stderr.read())


def engine_cmd(n: int, seconds: float, mode: str, extra: list[str], run_dir: Path) -> list[str]:
    """The engine run of one row: `n` CartPoles for `seconds` in `mode` (mode_overrides), every
    group hot; `extra`: the layout's overrides and the command line's."""
    return [
        sys.executable,
        "-m",
        "rlpipe",
        f"hydra.run.dir={run_dir}",
        "env_mix=cartpole",
        f"env_count={n}",
        *mode_overrides(mode),
        f"run.duration_s={seconds}",
        "groups.hot=100000",  # every group hot: this measures stepping (startup.py: the ramp)
        "run.total_env_steps=null",
        *extra,
    ]


def engine_run(n: int, seconds: float, mode: str, extra: list[str]) -> dict:
    """One engine run in `mode` (mode_overrides); `extra`: the layout's overrides and the
    command line's."""
    with tempfile.TemporaryDirectory(prefix="rlb", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        out = run_engine(engine_cmd(n, seconds, mode, extra, run_dir), Path(tmp))
        if out.returncode != 0:
            raise RuntimeError(f"engine run failed ({n} envs, {mode}):\n{out.stderr[-3000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        scalars = read_scalars(run_dir / "tb")
    sps_ev = scalars["charts/sps"]
    wall, env_steps, sps = sps_ev.wall_times.tolist(), sps_ev.steps.tolist(), sps_ev.values.tolist()
    # charts/sps starts at the run's first step (no 0 while nothing stepped); the other tags are
    # written from the first window on: their samples before it are left out, so sample i of
    # each is the same window
    active = scalars["envs/active"].values.tolist()[-len(sps) :]
    trained = (
        scalars["learner/trained_samples"].values.tolist()[-len(sps) :]
        if "learner/trained_samples" in scalars
        else [0.0] * len(sps)
    )
    if not (len(sps) == len(active) == len(trained)):
        raise RuntimeError(f"engine run ({n} envs, {mode}): TensorBoard charts of unequal length")
    # _log_charts writes these tags together, one sample per window (read_scalars keeps their
    # order: a stable sort by step): sample i covers (wall[i-1], wall[i]]. Steady = every env
    # active, the first such one dropped.
    steady = [i for i in range(1, len(sps)) if active[i] == n][1:]
    if not steady:
        raise NotSteady(
            f"engine {mode} at {n} envs: no TensorBoard window had all {n} envs active "
            f"(max active {max(active, default=0):.0f}, all_envs_ready_s "
            f"{summary['all_envs_ready_s']}, run {seconds} s): nothing to report"
        )
    secs = sum(wall[i] - wall[i - 1] for i in steady)
    steps = sum(env_steps[i] - env_steps[i - 1] for i in steady)
    done = sum(trained[i] - trained[i - 1] for i in steady)
    stepping_s = summary["env_steps"] / summary["sps"] if summary["sps"] else 0.0
    return {
        "mode": mode,
        "env_sps_median": statistics.median(sps[i] for i in steady),
        "env_sps_mean": steps / secs,
        "trained_per_s": done / secs,
        "windows": len(steady),
        "window_s": round(secs, 1),
        "summary_sps": summary["sps"],
        "summary_trained_samples": summary.get("trained_samples"),
        "summary_trained_per_s": (round(summary.get("trained_samples", 0) / stepping_s, 1) if stepping_s else None),
        "updates": summary["updates"],
        "all_envs_ready_s": summary["all_envs_ready_s"],
        "startup_first_step_s": summary["startup_first_step_s"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "layout": summary.get("layout"),
        "layout_note": resolved_layout(summary),
    }


# --- the baselines ----------------------------------------------------------------------------


def vector_windows(envs, batch: int, seconds: float) -> list[float]:
    """Env-steps/s of a vector env over CartPole, in 1-second windows; `batch`: the envs a step
    returns (and takes actions for): every env but in PufferLib's EnvPool-style row."""
    rng = np.random.default_rng(0)
    windows = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t, steps = time.perf_counter(), 0
        while time.perf_counter() - t < 1.0:
            envs.step(rng.integers(0, 2, batch))
            steps += batch
        windows.append(steps / (time.perf_counter() - t))
    return windows


def make_bare_env():
    """make_env's CartPole without gym.make's wrappers (the engine keeps their rules itself)."""
    return make_env().unwrapped


def sync_windows(n: int, seconds: float, bare: bool = False) -> list[float]:
    envs = gym.vector.SyncVectorEnv([make_bare_env if bare else make_env for _ in range(n)])
    try:
        envs.reset(seed=0)
        return vector_windows(envs, n, seconds)
    finally:
        envs.close()


def async_windows(n: int, seconds: float) -> list[float]:
    envs = gym.vector.AsyncVectorEnv([make_env for _ in range(n)], shared_memory=True, context="fork")
    ok = False
    try:
        envs.reset(seed=0)
        windows = vector_windows(envs, n, seconds)
        ok = True
        return windows
    finally:
        envs.close(terminate=not ok)


def _private_kb(pid: int) -> int:
    """Private (unshared) memory of a process, kB: what each more env process would add."""
    kb = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                kb += int(line.split()[1])
    return kb


def _mem_available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def async_probe(probe_envs: int = 16) -> dict:
    """Private memory per AsyncVectorEnv worker after stepping (16-env probe)."""
    envs = gym.vector.AsyncVectorEnv([make_env for _ in range(probe_envs)], shared_memory=True, context="fork")
    try:
        envs.reset(seed=0)
        vector_windows(envs, probe_envs, 1.0)
        per_env = max(_private_kb(p.pid) for p in envs.processes)
    finally:
        envs.close()
    return {"private_kb_per_env": per_env}


def async_reachable(n: int, probe: dict) -> str | None:
    """None if AsyncVectorEnv at n envs fits this machine, else the reason it does not."""
    need_kb = n * probe["private_kb_per_env"]
    avail_kb = _mem_available_kb()
    if need_kb > avail_kb // 2:
        return (
            f"{n} worker processes x {probe['private_kb_per_env'] / 1024:.1f} MiB private each "
            f"= {need_kb / 2**20:.1f} GiB, over half of MemAvailable ({avail_kb / 2**20:.1f} GiB; "
            "the machine is shared)"
        )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need_fds = 2 * n + 256  # a pipe end and a sentinel per worker
    if hard != resource.RLIM_INFINITY and need_fds > hard:
        return f"needs ~{need_fds} file descriptors, RLIMIT_NOFILE hard limit is {hard}"
    if soft != resource.RLIM_INFINITY and need_fds > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need_fds, hard))
    nproc, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if nproc != resource.RLIM_INFINITY and n + 512 > nproc:
        return f"needs {n} processes, RLIMIT_NPROC is {nproc}"
    return None


PUFFER_ROWS = {
    "puffer_all": "PufferLib Multiprocessing, zero-copy, batch = all envs",
    "puffer_half": "PufferLib Multiprocessing, batch = half the envs (EnvPool-style)",
}
PUFFER_SLACK_S = 120.0  # a child's import of torch and its build of 7,000 envs, on a loaded machine


class BaselineFailed(RuntimeError):
    """A baseline gave no windows (its child exited, raised or hung)."""


def puffer_plan(n: int, row: str) -> dict | str:
    """How PUFFER_ROWS[row] runs n envs, or why it cannot."""
    workers = puffer_workers(n)
    if row == "puffer_all":
        return {"workers": workers, "batch": n, "zero_copy": True}
    batch = puffer_half_batch(n, workers)
    if batch is None:
        return f"one PufferLib worker at {n} envs on this machine: no batch smaller than every env"
    return {"workers": workers, "batch": batch, "zero_copy": False}


def puffer_windows(n: int, plan: dict, seconds: float) -> list[float]:
    """PUFFER_ROWS' windows, in this process: the child puffer_windows_in_child starts."""
    forks_die_with_their_parent()  # PufferLib's workers die with this child, even SIGKILLed
    envs = make_puffer(make_env, n, batch_size=plan["batch"], zero_copy=plan["zero_copy"])
    try:
        envs.reset(seed=0)
        return vector_windows(envs, plan["batch"], seconds)
    finally:
        envs.close()


def puffer_windows_in_child(n: int, plan: dict, seconds: float) -> list[float]:
    """puffer_windows in a child of its own session; every process it started is gone after."""
    spec = json.dumps({"n": n, "plan": plan, "seconds": seconds})
    limit = seconds + PUFFER_SLACK_S
    returncode, stdout, stderr = run_in_own_session([sys.executable, __file__, "--puffer-child", spec], limit)
    if returncode is None:
        raise BaselineFailed(f"no result {limit:.0f} s after its start (killed)")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("[")]
    if returncode != 0 or not lines:
        last = stderr.strip().splitlines()[-1:] or [f"no windows printed (exit {returncode})"]
        raise BaselineFailed(f"exit {returncode}: {last[0][:200]}")
    return json.loads(lines[-1])


def puffer_rows_asked(flag: bool | None) -> str | None:
    """None if the PufferLib rows run, else why not (--puffer: on where it imports)."""
    if flag is False:
        return "not asked (--no-puffer)"
    missing = puffer_missing()
    if missing and flag:
        raise SystemExit(f"--puffer: {missing}")
    return missing


def halves(before: list[float], after: list[float]) -> dict:
    return {
        "env_sps_median": statistics.median(before + after),
        "windows": len(before) + len(after),
        "median_before": statistics.median(before),
        "median_after": statistics.median(after),
    }


# --- the table --------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def fmt(x, spec=",.0f", width=10) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"


PPO_MODES = ["hold", "drop", "hold+null", "drop+null"]


def main() -> int:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=positive_int, nargs="+", default=[1000, 7000])
    ap.add_argument(
        "--ppo-counts",
        type=int,
        nargs="*",
        default=None,
        help="counts that also get the PPO rows (default: all of --counts; none: empty)",
    )
    ap.add_argument(
        "--async-counts",
        type=int,
        nargs="*",
        default=None,
        help="counts at which to try AsyncVectorEnv (default: all of --counts)",
    )
    ap.add_argument("--seconds", type=positive_float, default=60.0, help="engine run length (random rows)")
    ap.add_argument(
        "--ppo-seconds", type=positive_float, default=None, help="engine run length (ppo rows; default --seconds)"
    )
    ap.add_argument("--sync-seconds", type=positive_float, default=16.0, help="split before/after the engine")
    ap.add_argument("--async-seconds", type=positive_float, default=8.0, help="split before/after the engine")
    ap.add_argument(
        "--puffer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="PufferLib Multiprocessing rows (default: where pufferlib imports)",
    )
    ap.add_argument(
        "--puffer-seconds", type=positive_float, default=16.0, help="per row, split before/after the engine"
    )
    ap.add_argument("--puffer-child", help=argparse.SUPPRESS)  # puffer_windows_in_child's child
    ap.add_argument(
        "--layouts",
        nargs="+",
        default=["auto", "70"],
        help="process layouts, auto (conf/'s, no override), GROUP_SIZE or GROUP_SIZExSLICES: "
        "each engine row runs once per layout",
    )
    ap.add_argument(
        "--ppo-modes",
        nargs="*",
        default=PPO_MODES,
        help="PPO rows, BACKLOG[+null|+core]: conf/'s cpu_affinity (auto), every CPU, learner_core",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the engine")
    args = ap.parse_args()
    if args.puffer_child:
        spec = json.loads(args.puffer_child)
        print(json.dumps(puffer_windows(spec["n"], spec["plan"], spec["seconds"])), flush=True)
        return 0
    ppo_counts = args.counts if args.ppo_counts is None else args.ppo_counts
    async_counts = args.counts if args.async_counts is None else args.async_counts
    ppo_seconds = args.ppo_seconds or args.seconds
    for layout in args.layouts:
        layout_overrides(layout)  # a malformed one fails before anything runs
    for mode in args.ppo_modes:
        mode_overrides(mode)
    results: dict = {"load_start": os.getloadavg(), "cpus": os.cpu_count(), "counts": {}}
    errors: list[str] = []
    puffer_skip = puffer_rows_asked(args.puffer)
    results["puffer"] = {"skipped": puffer_skip} if puffer_skip else {"rows": list(PUFFER_ROWS)}
    if puffer_skip and args.puffer is None:
        print(f"PufferLib rows: skipped ({puffer_skip})", flush=True)
    probe = async_probe() if async_counts else None
    if probe:
        results["async_probe"] = probe
    print(
        f"{'envs':>6}  {'what':<64} {'env steps/s':>11} {'trained/s':>10} {'vs Sync':>8} {'vs Async':>8}  notes",
        flush=True,
    )
    for n in args.counts:
        row: dict = {}
        results["counts"][str(n)] = row
        async_skip = async_reachable(n, probe) if n in async_counts else "not asked (--async-counts)"
        sync_b = sync_windows(n, args.sync_seconds / 2)
        bare_b = sync_windows(n, args.sync_seconds / 2, bare=True)
        async_b = async_windows(n, args.async_seconds / 2) if async_skip is None else None
        puffer_plans = {} if puffer_skip else {row: puffer_plan(n, row) for row in PUFFER_ROWS}
        puffer_b: dict = {}
        for key, plan in puffer_plans.items():
            if isinstance(plan, dict):
                try:
                    puffer_b[key] = puffer_windows_in_child(n, plan, args.puffer_seconds / 2)
                except BaselineFailed as exc:
                    puffer_plans[key] = f"FAILED before the engine: {exc}"
                    errors.append(f"{PUFFER_ROWS[key]} at {n} envs: {exc}")
        runs = {}
        for layout in args.layouts:
            for mode in ["random"] + (args.ppo_modes if n in ppo_counts else []):
                try:
                    runs[mode, layout] = engine_run(
                        n,
                        args.seconds if mode == "random" else ppo_seconds,
                        mode,
                        layout_overrides(layout) + args.overrides,
                    )
                except NotSteady as exc:
                    errors.append(f"{exc} ({layout_name(layout)})")
                    runs[mode, layout] = None
        puffer: dict = {}
        for key in reversed(list(puffer_b)):  # the mirror of the order before
            plan = puffer_plans[key]
            try:
                puffer[key] = {
                    **plan,
                    **halves(puffer_b[key], puffer_windows_in_child(n, plan, args.puffer_seconds / 2)),
                }
            except BaselineFailed as exc:
                puffer_plans[key] = f"FAILED after the engine: {exc}"
                errors.append(f"{PUFFER_ROWS[key]} at {n} envs: {exc}")
        async_a = async_windows(n, args.async_seconds / 2) if async_skip is None else None
        bare = halves(bare_b, sync_windows(n, args.sync_seconds / 2, bare=True))
        sync = halves(sync_b, sync_windows(n, args.sync_seconds / 2))
        asy = halves(async_b, async_a) if async_skip is None else None
        row["sync_vector_env"] = sync
        row["sync_vector_env_bare"] = bare
        b_sps = bare["env_sps_median"]
        row["async_vector_env"] = asy if asy else {"skipped": async_skip}
        s_sps = sync["env_sps_median"]
        a_sps = asy["env_sps_median"] if asy else None
        print(
            f"{n:>6}  {'SyncVectorEnv':<64} {fmt(s_sps, width=11)} {fmt(None)} {'1.00x':>8} "
            f"{fmt(ratio(s_sps, a_sps), '.2f', 7)}{'x' if a_sps else ' '}  before "
            f"{sync['median_before']:,.0f}, after {sync['median_after']:,.0f}",
            flush=True,
        )
        print(
            f"{n:>6}  {'SyncVectorEnv, bare envs (no TimeLimit, OrderEnforcing)':<64} {fmt(b_sps, width=11)} "
            f"{fmt(None)} {fmt(ratio(b_sps, s_sps), '.2f', 7)}x {'':>8}  before "
            f"{bare['median_before']:,.0f}, after {bare['median_after']:,.0f}",
            flush=True,
        )
        if asy:
            print(
                f"{n:>6}  {'AsyncVectorEnv (shared memory)':<64} {fmt(a_sps, width=11)} {fmt(None)} "
                f"{fmt(ratio(a_sps, s_sps), '.2f', 7)}x {'1.00x':>8}  before "
                f"{asy['median_before']:,.0f}, after {asy['median_after']:,.0f}",
                flush=True,
            )
        else:
            print(f"{n:>6}  {'AsyncVectorEnv (shared memory)':<64} {'skipped':>11}  {async_skip}", flush=True)
        for key, name in PUFFER_ROWS.items() if puffer_plans else ():
            if key not in puffer:
                row[key] = {"skipped": puffer_plans[key]}
                print(f"{n:>6}  {name:<64} {'skipped':>11}  {puffer_plans[key]}", flush=True)
                continue
            r = row[key] = puffer[key]
            p_sps = r["env_sps_median"]
            r["env_over_sync"], r["env_over_async"] = ratio(p_sps, s_sps), ratio(p_sps, a_sps)
            print(
                f"{n:>6}  {name:<64} {fmt(p_sps, width=11)} {fmt(None)} {fmt(r['env_over_sync'], '.2f', 7)}x "
                f"{fmt(r['env_over_async'], '.2f', 7)}{'x' if a_sps else ' '}  before "
                f"{r['median_before']:,.0f}, after {r['median_after']:,.0f}; {r['workers']} workers of "
                f"{n // r['workers']} envs, batch {r['batch']}",
                flush=True,
            )
        puffer_best = max((r["env_sps_median"] for r in puffer.values()), default=None)
        for (mode, layout), r in runs.items():
            name = f"{mode_name(mode)}, {layout_name(layout)}"
            key = f"engine_{mode}@{layout}"
            if r is None:
                print(f"{n:>6}  {name:<64} {'FAILED':>11}  no window with every env active", flush=True)
                row[key] = None
                continue
            env = r["env_sps_median"] if mode == "random" else r["env_sps_mean"]
            r["env_over_sync"] = ratio(env, s_sps)
            r["env_over_sync_bare"] = ratio(env, b_sps)
            r["env_over_async"] = ratio(env, a_sps)
            if mode == "random" and puffer_best:
                r["env_over_puffer_best"] = ratio(env, puffer_best)
            if mode != "random":
                r["trained_over_sync"] = ratio(r["trained_per_s"], s_sps)
                r["trained_over_env"] = ratio(r["trained_per_s"], r["env_sps_mean"])
            row[key] = r
            trained = None if mode == "random" else r["trained_per_s"]
            note = (
                f"median of {r['windows']} windows, {r['env_over_sync_bare']:.2f}x bare Sync"
                + (f", {r['env_over_puffer_best']:.2f}x PufferLib's best" if r.get("env_over_puffer_best") else "")
                if mode == "random"
                else f"mean over {r['windows']} windows ({r['window_s']} s), trained/Sync "
                f"{r['trained_over_sync']}x, {r['updates']} updates"
            )
            print(
                f"{n:>6}  {name:<64} {fmt(env, width=11)} {fmt(trained)} "
                f"{fmt(r['env_over_sync'], '.2f', 7)}x {fmt(r['env_over_async'], '.2f', 7)}"
                f"{'x' if a_sps else ' '}  {note}; all ready {r['all_envs_ready_s']} s; "
                f"{r['layout_note']}",
                flush=True,
            )
    results["load_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(results))
    for e in errors:
        print(f"ERROR: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

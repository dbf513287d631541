"""What the driver's main thread spends per env step (random actions) and per trained sample
(PPO backlog=hold), A/B against a git revision: the ceiling one Python thread puts on the engine.

    python benchmarks/driver_cost.py                                # 7,000 envs, CartPole and null
    python benchmarks/driver_cost.py --baseline-rev e1371b0         # ... beside that revision
    python benchmarks/driver_cost.py --envs 1000 --kinds null --modes random --seconds 30

Each run is `python -m rlpipe` as engine_sps.py runs it (every group hot, `learner.mode=random`,
or day4's PPO update with `learner.backlog=hold`), on CartPole (`cartpole`) or on a Gymnasium
env whose step is a counter (`null`: benchmarks/null_env.py, so the driver and not the workers
is the limit). While it runs, the driver's main thread's CPU time (utime + stime of its task in
/proc, the thread that serves inference; the PPO update thread, torch's pool threads and the
services' threads are tasks of their own and are counted apart, as `other threads`) is read
every 0.25 s. After it, the run's TensorBoard windows in which every env was active (the first
one dropped, as engine_sps.py) give the env steps and trained samples; the main thread's CPU
over those windows (interpolated at their edges) divided by them is the figure:

- `main_us_per_step`: main-thread CPU microseconds per env step;
- `main_us_per_trained`: per trained sample (hold rows);
- `serve_ceiling_sps`: 1e6 / main_us_per_step, the env steps/s one driver core could serve at
  that cost (its ceiling when the workers are free);
- `env_sps`, `trained_per_s`: the rates over the same windows, for scale.

With `--baseline-rev REV`, that revision is checked out into a temporary git worktree (its
Cython modules built there), and each row runs on it and on this tree in turn, A then B, so
machine drift hits both; the worktree is removed at the end. Figures are only as good as the
machine is quiet: say what ran beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from argtypes import git_revision, positive_float, positive_int  # noqa: E402
from engine_sps import mode_overrides  # noqa: E402

from rlpipe.telemetry.tb_events import read_scalars  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
KINDS = {
    "cartpole": ["env_mix=cartpole"],
    "null": ["env_mix=gym", "env_mix.id=null_env:Null-v0"],
}


def thread_cpu_s(pid: int, tid: int) -> float | None:
    """utime + stime of one task of `pid`, in seconds (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S  # fields 14 and 15 of stat(5)


def process_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S


class CpuSampler(threading.Thread):
    """(wall time, main thread's CPU s, whole process's CPU s) every `every_s`, until the
    process is gone or `stop` is set."""

    def __init__(self, pid: int, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            main, whole = thread_cpu_s(self.pid, self.pid), process_cpu_s(self.pid)
            if main is None or whole is None:
                return
            self.samples.append((time.time(), main, whole))
            self.stop.wait(self.every_s)


def one_run(checkout: Path, kind: str, mode: str, envs: int, seconds: float) -> dict:
    """One driver run of `kind` envs in `mode` from `checkout`; its main-thread cost."""
    with tempfile.TemporaryDirectory(prefix="rldc", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "rlpipe",
            f"hydra.run.dir={run_dir}",
            *KINDS[kind],
            f"env_count={envs}",
            *mode_overrides(mode),
            f"run.duration_s={seconds}",
            "groups.hot=100000",  # every group hot: the steady state is what is measured
            "run.total_env_steps=null",
            "logging.random_return_episodes=0",
            "logging.initial_policy_episodes=0",
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(HERE)])}
        proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = CpuSampler(proc.pid)
        sampler.start()
        out, err = proc.communicate()
        sampler.stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} {mode} at {envs} envs from {checkout} exited {proc.returncode}:\n{err[-3000:]}")
        scalars = read_scalars(run_dir / "tb")
        summary = json.loads((run_dir / "summary.json").read_text())
    sps = scalars["charts/sps"]
    wall, steps = sps.wall_times, sps.steps.astype(np.float64)
    # charts/sps starts at the run's first step; the other tags' samples before it are left out,
    # so sample i of each is the same window
    active = scalars["envs/active"].values[-len(wall) :]
    trained = (
        scalars["learner/trained_samples"].values[-len(wall) :]
        if "learner/trained_samples" in scalars
        else np.zeros(len(wall))
    )
    steady = [i for i in range(1, len(wall)) if active[i] == envs][1:]
    if not steady or len(sampler.samples) < 2:
        raise RuntimeError(f"{kind} {mode} at {envs} envs: no window with every env active")
    t, main, whole = (np.array(x) for x in zip(*sampler.samples))
    main_s = sum(np.interp(wall[i], t, main) - np.interp(wall[i - 1], t, main) for i in steady)
    whole_s = sum(np.interp(wall[i], t, whole) - np.interp(wall[i - 1], t, whole) for i in steady)
    secs = sum(wall[i] - wall[i - 1] for i in steady)
    n_steps = sum(steps[i] - steps[i - 1] for i in steady)
    n_trained = sum(trained[i] - trained[i - 1] for i in steady)
    per_step = 1e6 * main_s / n_steps
    return {
        "kind": kind,
        "mode": mode,
        "windows": len(steady),
        "window_s": round(secs, 1),
        "env_sps": round(n_steps / secs, 1),
        "trained_per_s": round(n_trained / secs, 1),
        "main_cpu_share": round(main_s / secs, 3),
        "other_threads_cpu_s": round(whole_s - main_s, 2),
        "main_us_per_step": round(per_step, 3),
        "main_us_per_trained": round(1e6 * main_s / n_trained, 3) if n_trained else None,
        "serve_ceiling_sps": round(1e6 / per_step),
        "updates": summary["updates"],
    }


def checkout_of(rev: str, into: Path) -> Path:
    """A worktree of `rev` with its Cython modules built in place."""
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(into), rev], cwd=REPO, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into, check=True, capture_output=True
    )
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=positive_int, default=7000)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--modes", nargs="+", default=["random", "hold"])
    ap.add_argument("--seconds", type=positive_float, default=45.0)
    ap.add_argument("--baseline-rev", type=git_revision, help="a git revision to run beside this tree, row by row")
    ap.add_argument("--rounds", type=positive_int, default=1, help="runs of each row (and side); medians are printed")
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    args = ap.parse_args()
    sides = {"this tree": REPO}
    tmp = None
    try:
        if args.baseline_rev:
            tmp = Path(tempfile.mkdtemp(prefix="rlpipe-rev-"))
            sides = {args.baseline_rev: checkout_of(args.baseline_rev, tmp / "tree"), "this tree": REPO}
        results: dict = {"envs": args.envs, "load_start": os.getloadavg(), "rows": []}
        print(
            f"{'side':<12} {'kind':<9} {'mode':<7} {'env steps/s':>12} {'trained/s':>10} "
            f"{'main us/step':>13} {'main us/trained':>16} {'1-core serve ceiling':>21}",
            flush=True,
        )
        for kind in args.kinds:
            for mode in args.modes:
                runs = {side: [] for side in sides}
                for _ in range(args.rounds):
                    for side, checkout in sides.items():
                        runs[side].append(one_run(checkout, kind, mode, args.envs, args.seconds))
                for side, rs in runs.items():
                    med = {
                        k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None
                        for k in ("env_sps", "trained_per_s", "main_us_per_step", "main_us_per_trained")
                    }
                    results["rows"].append({"side": side, "kind": kind, "mode": mode, "median": med, "runs": rs})
                    per_trained = f"{med['main_us_per_trained']:.3f}" if med["main_us_per_trained"] else "-"
                    print(
                        f"{side:<12} {kind:<9} {mode:<7} {med['env_sps']:>12,.0f} {med['trained_per_s']:>10,.0f} "
                        f"{med['main_us_per_step']:>13.3f} {per_trained:>16} {1e6 / med['main_us_per_step']:>21,.0f}",
                        flush=True,
                    )
        results["load_end"] = os.getloadavg()
        if args.json:
            print(json.dumps(results))
    finally:
        if tmp is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "tree")], cwd=REPO, check=False)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Time to CartPole 475: the quick start against Stable-Baselines3's PPO (rl-zoo settings),
back to back, seed by seed.

    python benchmarks/cartpole_bar.py --sb3-python /tmp/sb3-venv/bin/python
    python benchmarks/cartpole_bar.py --seeds 1 2 3 --variant before="learner.epochs=4 learner.rollout_len=32"
    python benchmarks/cartpole_bar.py --no-sb3 --variants-only --stop-at-475 --variant T8="learner.rollout_len=8"

475 is Gymnasium's `reward_threshold` for CartPole-v1: the mean return over 100 consecutive
episodes at which the task counts as solved. Per seed S, one run of each, in this order:

- `rlpipe` (and each `--variant LABEL="override ..."` after it): the quick start, `python -m
  rlpipe run.seed=S` on conf/'s defaults (64 CartPole envs, 500,000 env steps), the
  variant's overrides added. It runs in a child that wraps the learner's episode book-keeping
  (`CentralLearner._episodes`, after it has run): the first time the cartpole type's last 100
  episodes average 475 or more, the child prints the env steps counted so far and the wall
  clock. Nothing the run computes changes; the run goes on to its 500,000 steps, and its
  `summary.json` gives the final mean of the last 100 episodes (`--stop-at-475`: the run is
  SIGTERMed, a clean stop, at its crossing: for tuning). Only `hydra.run.dir` (a temporary
  directory, or under `--keep`) is added to the command; `--variants-only` leaves out the
  run on conf/'s own defaults.
- `sb3`: `PPO("MlpPolicy", make_vec_env("CartPole-v1", 8, seed=S), n_steps=32,
  batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3, seed=S,
  device="cpu")` (rl-zoo's CartPole settings, the learning rate constant), learning for up to
  500,000 steps with a callback that stops it once the last 100 episodes of its Monitor
  buffer (`ep_info_buffer`) average 475; steps are `num_timesteps` then.

Figures per run: `steps` to 475; `to_475_s`, seconds from the child's spawn (interpreter
start and imports included: the whole process) to that moment; `cpu_to_475_s`, the CPU
seconds of the child's whole process tree then (workers, forkserver and Redis included: the
figure a loaded machine disturbs least); `exit_s`, to the child's
exit (rlpipe: after its 500,000 steps and teardown; SB3: right after it stopped); `cpu_s`,
the CPU seconds of the child and every descendant it waited for; `final`, the last 100
episodes' mean at the end; `load1`, the load average when the run began. A run past
`--timeout` is stopped and counts as never reaching 475. Then the median per
label, and each label's median to_475_s over SB3's. Wall figures are only as good as the
machine is quiet: run it on an idle one, and compare the labels of one invocation.

Stable-Baselines3 is an optional extra of rlpipe (`rlpipe[sb3]`, in the `test` extra), so
`--sb3-python` defaults to this interpreter. docs/benchmarks.md's figures were measured before
that, with SB3 in a venv of its own, installed with --no-deps, that borrows rlpipe's venv for
torch, gymnasium, numpy and the rest:

    python3 -m venv /tmp/sb3-venv
    /tmp/sb3-venv/bin/pip install --no-deps stable-baselines3
    echo "import site; site.addsitedir('<repo>/.venv/lib/python3.11/site-packages')" \\
        > /tmp/sb3-venv/lib/python3.11/site-packages/zz_rlpipe.pth

and `--sb3-python /tmp/sb3-venv/bin/python` points the SB3 runs at it (the rlpipe runs use
`--rlpipe-python`, by default the interpreter running this script).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TYPE = "cartpole"
THRESHOLD = 475.0  # gymnasium.spec("CartPole-v1").reward_threshold
WINDOW = 100  # episodes behind the mean, rlpipe's and SB3's alike
MARK = "cartpole_bar: "  # the children's line with the crossing, as JSON
SB3_MAX_STEPS = 500_000


# --- the children ---------------------------------------------------------------------------


def crossed(returns, threshold: float) -> bool:
    """Whether a window of returns is full and its mean at or above the threshold."""
    return len(returns) >= WINDOW and sum(list(returns)[-WINDOW:]) / WINDOW >= threshold


def tree_cpu_s() -> float:
    """CPU seconds of this process and every live descendant (rlpipe's workers, forkserver,
    Redis, its random-return child)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:  # gone since the listing
            pass
    return total


def report_crossing(env_steps: int) -> None:
    now = time.time()
    print(MARK + json.dumps({"steps": int(env_steps), "unix": now, "cpu": round(tree_cpu_s(), 2)}), flush=True)


def child_rlpipe(threshold: float, overrides: list[str]) -> None:
    """`python -m rlpipe <overrides>` in this process, watching the cartpole type's last 100
    episodes from the learner's own deque (the one summary.json's mean_return_last100 reads)."""
    sys.path.insert(0, str(REPO))
    from rlpipe.learner.central import CentralLearner

    book_keep = CentralLearner._episodes
    seen = []

    def watched(self, rnd):
        book_keep(self, rnd)
        if not seen and crossed(self.counters.returns.get(TYPE, ()), threshold):
            seen.append(True)
            # env_steps still lacks this round's rows (counted after the episodes): add them
            report_crossing(self.counters.env_steps + int(rnd.stepped.sum()))

    CentralLearner._episodes = watched
    from rlpipe.app import main

    sys.argv = ["rlpipe", *overrides]
    main()


def child_sb3(threshold: float, seed: int) -> None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    class StopAt(BaseCallback):
        def _on_step(self) -> bool:
            if crossed([e["r"] for e in self.model.ep_info_buffer], threshold):
                report_crossing(self.num_timesteps)
                return False
            return True

        def _on_rollout_end(self) -> None:
            if self.num_timesteps % 20_000 < 256:  # a line every 20k steps in the run's log
                buf = [e["r"] for e in self.model.ep_info_buffer]
                print(
                    f"sb3: {self.num_timesteps} steps, last {len(buf)} episodes {sum(buf) / max(len(buf), 1):.1f}",
                    flush=True,
                )

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        learning_rate=1e-3,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    # SB3's default logger makes a /tmp/SB3-<time> folder per run even with nothing to write
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=SB3_MAX_STEPS, callback=StopAt())
    buf = [e["r"] for e in model.ep_info_buffer]
    print(MARK + json.dumps({"final": sum(buf) / len(buf) if buf else None}), flush=True)


# --- the parent -----------------------------------------------------------------------------


def read_marks(log: Path) -> dict:
    marks = {}
    for line in log.read_text().splitlines():
        if line.startswith(MARK):
            marks.update(json.loads(line[len(MARK) :]))
    return marks


def timed(cmd: list[str], log: Path, timeout: float, stop_at_crossing: bool = False) -> dict:
    """Run one child to its end (or, with stop_at_crossing, SIGTERM it once it has crossed);
    its crossing, wall and CPU figures (None where not reached)."""
    load1 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        stopped = timed_out = False
        try:
            while proc.poll() is None:
                if time.time() - t0 > timeout:  # a run that never gets there: "never", the rest go on
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
                    timed_out = True
                    break
                if stop_at_crossing and not stopped and "unix" in read_marks(log):
                    proc.send_signal(signal.SIGTERM)  # the driver's clean stop: summary.json written
                    stopped = True
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    exit_s = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not timed_out and proc.returncode not in ((0, 128 + signal.SIGTERM) if stopped else (0,)):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}; its output: {log}")
    marks = read_marks(log)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "steps": marks.get("steps"),
        "to_475_s": round(marks["unix"] - t0, 2) if "unix" in marks else None,
        "cpu_to_475_s": marks.get("cpu"),
        "exit_s": round(exit_s, 2),
        "cpu_s": round(cpu, 1),
        "final": marks.get("final"),
        "load1": round(load1, 2),
        "timed_out": timed_out,
    }


def run_rlpipe(
    python: str, seed: int, overrides: list[str], run_dir: Path, threshold: float, timeout: float, stop: bool = False
) -> dict:
    """One quick start (with `overrides`) in the watching child; `final` from its summary.json."""
    cmd = [python, __file__, "--child", "rlpipe", "--threshold", str(threshold), "--"]
    cmd += [f"hydra.run.dir={run_dir}", f"run.seed={seed}", *overrides]
    res = timed(cmd, run_dir.parent / f"{run_dir.name}.log", timeout, stop)
    if (run_dir / "summary.json").exists():  # not there after a timeout
        summary = json.loads((run_dir / "summary.json").read_text())
        res["final"] = summary["mean_return_last100"][TYPE]
        res["env_steps"] = summary["env_steps"]
    return res


def run_sb3(python: str, seed: int, log: Path, threshold: float, timeout: float) -> dict:
    cmd = [python, __file__, "--child", "sb3", "--threshold", str(threshold), "--seed", str(seed)]
    return timed(cmd, log, timeout)


def medians(rows: list[dict]) -> dict:
    def med(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    return {k: med(k) for k in ("steps", "to_475_s", "cpu_to_475_s", "exit_s", "cpu_s", "final")} | {
        "reached": sum(r["steps"] is not None for r in rows),
        "runs": len(rows),
    }


def fmt(v, spec="{:,.0f}") -> str:
    return "never" if v is None else spec.format(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=("rlpipe", "sb3"), help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='LABEL="OVERRIDE ..."',
        help="another rlpipe run per seed, the quick start with these overrides",
    )
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument("--variants-only", action="store_true", help="leave out the quick start on conf/'s defaults")
    ap.add_argument("--sb3-python", default=sys.executable)
    ap.add_argument("--rlpipe-python", default=sys.executable)
    ap.add_argument(
        "--stop-at-475",
        action="store_true",
        help="stop each rlpipe run once it crossed (tuning: its final mean is then the mean at the stop)",
    )
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--keep", help="keep every run's directory and log under this path")
    ap.add_argument("--json", action="store_true")
    args, rest = ap.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.child == "rlpipe":
        return child_rlpipe(args.threshold, rest)
    if args.child == "sb3":
        return child_sb3(args.threshold, args.seed)

    variants = [] if args.variants_only else [("rlpipe", [])]
    for v in args.variant:
        label, _, overrides = v.partition("=")
        variants.append((label, shlex.split(overrides)))
    labels = [label for label, _ in variants] + ([] if args.no_sb3 else ["sb3"])
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cpbar", dir="/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {label: [] for label in labels}
    try:
        for seed in args.seeds:
            for label, overrides in variants:
                res = run_rlpipe(
                    args.rlpipe_python,
                    seed,
                    overrides,
                    out / f"{label}-{seed}",
                    args.threshold,
                    args.timeout,
                    args.stop_at_475,
                )
                rows[label].append({"seed": seed} | res)
                print(f"  {label} seed {seed}: {res}", flush=True)
            if not args.no_sb3:
                res = run_sb3(args.sb3_python, seed, out / f"sb3-{seed}.log", args.threshold, args.timeout)
                rows["sb3"].append({"seed": seed} | res)
                print(f"  sb3 seed {seed}: {res}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    print(f"\nTime to a {WINDOW}-episode mean of {args.threshold:g} on CartPole-v1 (whole process, from spawn)\n")
    print("| run | seed | steps to 475 | s to 475 | CPU s to 475 | exit s | CPU s | final mean | load1 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label in labels:
        for r in rows[label]:
            print(
                f"| {label} | {r['seed']} | {fmt(r['steps'])} | {fmt(r['to_475_s'], '{:.1f}')} | "
                f"{fmt(r['cpu_to_475_s'], '{:.1f}')} | "
                f"{r['exit_s']:.1f} | {r['cpu_s']:.1f} | {fmt(r['final'], '{:.1f}')} | {r['load1']:.2f} |"
            )
    summary = {label: medians(rows[label]) for label in labels}
    print("\n| run | median steps to 475 | median s to 475 | median CPU s to 475 | reached | over SB3's s to 475 |")
    print("|---|---|---|---|---|---|")
    sb3_s = summary.get("sb3", {}).get("to_475_s")
    for label in labels:
        m = summary[label]
        ratio = f"{m['to_475_s'] / sb3_s:.2f}" if sb3_s and m["to_475_s"] is not None else "-"
        print(
            f"| {label} | {fmt(m['steps'])} | {fmt(m['to_475_s'], '{:.1f}')} | {fmt(m['cpu_to_475_s'], '{:.1f}')} | "
            f"{m['reached']}/{m['runs']} | {ratio} |"
        )
    if args.json:
        print(json.dumps({"runs": rows, "medians": summary, "threshold": args.threshold}))


if __name__ == "__main__":
    main()

"""Where the CPUs go per trained sample: one engine run of engine_sps.py's rows, its processes'
CPU time and each CPU's idle time read from /proc over a steady window.

    python benchmarks/cpu_budget.py                          # the `hold` row: 7,000 CartPoles
    python benchmarks/cpu_budget.py --mode drop --seconds 90
    python benchmarks/cpu_budget.py --json -- worker.cpu_affinity=null

The run is engine_sps.py's (`engine_cmd`: the same overrides, every group hot). After
`--warmup` seconds (start-up and the first updates done) the CPU time of every process of the
run's tree is read, and again `--window` seconds later; each process counts for its role:
`driver` (the run's main process, every thread), `update` (the PPO update process), `workers`
(`rlpipe: worker` processes), `other` (the forkserver, Redis, evaluation). Trained samples
over the same window come from the run's `learner/trained_samples` chart (the first and last
point inside it). Prints per role the CPUs it used and its microseconds per trained sample,
each CPU's idle share, and the ceiling those costs allow: the CPUs the run may use over the
summed microseconds, the trained samples/s the machine would reach with no CPU idle. With
`--mode random` the same per env step (charts/sps's env steps).

Timing: run it alone. Another job on the machine shows up as idle time the run did not get.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402
from engine_sps import engine_cmd, mode_overrides, run_engine, stop_on_sigterm  # noqa: E402

from rlpipe.telemetry.tb_events import read_scalars  # noqa: E402

ROLES = ("driver", "update", "workers", "other")


def role(proc: psutil.Process, driver_pid: int) -> str:
    if proc.pid == driver_pid:
        return "driver"
    name = " ".join(proc.cmdline())
    if "ppo update" in name:
        return "update"
    if "rlpipe: worker" in name:
        return "workers"
    return "other"


def cpu_by_role(driver_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) of every live process of the run's tree."""
    out = {}
    driver = psutil.Process(driver_pid)
    for proc in (driver, *driver.children(recursive=True)):
        try:
            t = proc.cpu_times()
            out[proc.pid] = (role(proc, driver_pid), t.user + t.system)
        except psutil.NoSuchProcess:
            continue
    return out


def budget(before: dict, after: dict, idle_before, idle_after, seconds: float, rate: float) -> dict:
    """Per role the CPUs used between two readings `seconds` apart (a process counts only if it
    lived through both) and its us per unit (a trained sample or an env step) at `rate` units
    per second; per CPU its idle share; the summed us and the units/s the CPUs could reach at
    that cost with none idle."""
    used = dict.fromkeys(ROLES, 0.0)
    for pid, (name, cpu) in after.items():
        if pid in before:
            used[name] += (cpu - before[pid][1]) / seconds
    idle = [(a.idle - b.idle) / max(sum(a) - sum(b), 1e-9) for b, a in zip(idle_before, idle_after)]
    us = {name: used[name] / rate * 1e6 for name in ROLES}
    cpus = len(os.sched_getaffinity(0))
    return {
        "per_s": rate,
        "cpus_used": used,
        "us_per_unit": us,
        "idle": idle,
        "us_total": sum(us.values()),
        "ceiling_per_s": cpus / sum(us.values()) * 1e6,
        "cpus": cpus,
    }


def window_units(scalars: dict, tag: str, t0: float, t1: float) -> tuple[float, float]:
    """(units counted, seconds) between the first and the last point of `tag` inside [t0, t1]."""
    series = scalars[tag]
    inside = [(w, s) for w, s in zip(series.wall_times.tolist(), series_values(series, tag)) if t0 <= w <= t1]
    if len(inside) < 2:
        raise SystemExit(f"cpu_budget: fewer than two points of {tag} in the window: lengthen --seconds")
    return inside[-1][1] - inside[0][1], inside[-1][0] - inside[0][0]


def series_values(series, tag: str) -> list[float]:
    # the trained samples chart holds the cumulative count; charts/sps's step axis is env steps
    return series.values.tolist() if tag == "learner/trained_samples" else series.steps.tolist()


def main() -> int:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=7000)
    ap.add_argument("--mode", default="hold", help="engine_sps.py's PPO mode (hold, drop, +null, +core) or random")
    ap.add_argument("--seconds", type=float, default=60.0, help="engine run length")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds before the window")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the engine")
    args = ap.parse_args()
    if args.warmup + args.window >= args.seconds:
        ap.error(
            f"--warmup {args.warmup:g} + --window {args.window:g} must end before the run does "
            f"(--seconds {args.seconds:g}): the window is read while the run goes on"
        )
    try:
        mode_overrides(args.mode)
    except SystemExit:
        ap.error(f"--mode: {args.mode!r} is not random, nor hold or drop (optionally with +null or +core)")
    readings = {}

    def sample(pid: int) -> None:
        time.sleep(args.warmup)
        readings["t0"], readings["cpu0"], readings["idle0"] = time.time(), cpu_by_role(pid), psutil.cpu_times(True)
        time.sleep(args.window)
        readings["t1"], readings["cpu1"], readings["idle1"] = time.time(), cpu_by_role(pid), psutil.cpu_times(True)

    with tempfile.TemporaryDirectory(prefix="rlb", dir="/tmp") as tmp:
        run_dir = Path(tmp) / "run"
        out = run_engine(engine_cmd(args.count, args.seconds, args.mode, args.overrides, run_dir), Path(tmp), sample)
        if out.returncode != 0:
            raise SystemExit(f"cpu_budget: the engine run failed:\n{out.stderr[-3000:]}")
        scalars = read_scalars(run_dir / "tb")
    tag = "charts/sps" if args.mode == "random" else "learner/trained_samples"
    units, secs = window_units(scalars, tag, readings["t0"], readings["t1"])
    # the processes' CPU over the readings' window, the rate over the chart's points inside it
    window = readings["t1"] - readings["t0"]
    result = budget(readings["cpu0"], readings["cpu1"], readings["idle0"], readings["idle1"], window, units / secs)
    unit = "env step" if args.mode == "random" else "trained sample"
    print(f"cpu budget: {args.count} CartPoles, {args.mode}, a {secs:.1f} s window after {args.warmup:.0f} s")
    print(f"  {result['per_s']:,.0f} {unit}s/s")
    if args.mode != "random":
        # the workers' cost per trained sample counts every step stepped for it: a step that
        # never reaches an update (dropped, or still in a rollout at the end) is paid all the same
        steps, step_secs = window_units(scalars, "charts/sps", readings["t0"], readings["t1"])
        result["env_steps_per_s"] = steps / step_secs
        print(f"  {steps / step_secs:,.0f} env steps/s ({steps / step_secs / result['per_s']:.3f} per trained sample)")
    for name in ROLES:
        print(f"  {name:8s} {result['cpus_used'][name]:.3f} CPU   {result['us_per_unit'][name]:6.2f} us per {unit}")
    print("  idle     " + ", ".join(f"CPU {i} {x:.1%}" for i, x in enumerate(result["idle"])))
    print(
        f"  {result['us_total']:.2f} us per {unit} in all: {result['cpus']} CPUs reach at most "
        f"{result['ceiling_per_s']:,.0f} {unit}s/s at that cost"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

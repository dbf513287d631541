"""Soak: one stage run for `--minutes`, judged by its own resource figures.

    python benchmarks/soak.py [--minutes 60] [--out DIR] [overrides...]

Runs `python -m rlpipe +stage=day4 chaos=on env_count=7000` (or the overrides given) for the
minutes asked, in DIR (default outputs/soak-<time>), and reads back what the run measured
itself: summary.json (exit state, active envs, faults, the `long_run` verdicts), the
lifecycle log (every chaos injection matched with its recovery) and TensorBoard's
`resources/*` series. Prints one row per figure (start, middle and end of the stepping
loop, the Theil-Sen slope per hour over its second half with the 95 % interval, the value
projected to six days, the verdict), then the soak's checks:

- exit 0, every env active at the end, every injected fault recovered;
- driver RSS, and its floor (the lowest RSS of each sample window, which the PPO update's
  transient batch does not move: the same figure made steadier): slope <= 1 % of its level per
  hour, or, where its noise is larger, the slope's 95 % interval inside +-3 %/h;
- the largest worker's RSS less what its envs leak on purpose (unity_sim emulates a leaky
  simulator, up to `leak_max_mb` per env until a rebuild: `workers/env_leak_mb_sum` shows it)
  and Redis's used memory: not growing (falling memory is no leak: chaos replaces the
  largest workers with fresh ones); the driver's fds and threads: flat (fewer would be a
  thread or a socket lost);
- the run dir projected to six days <= 2 GB.

Writes `soak.json` (the table, the checks, the summary's figures) and `soak.png` (the
figures over time) into DIR. Nothing here is timed: run it beside light work only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # argtypes

from argtypes import positive_float  # noqa: E402

from rlpipe.lifecycle.recovery import recovery_report  # noqa: E402
from rlpipe.supervisor.driver import TB_DETAIL_S, TB_INTERVAL_S, TB_LONG_INTERVAL_S  # noqa: E402
from rlpipe.telemetry.health.longrun import plot_resources  # noqa: E402
from rlpipe.telemetry.tb_events import read_scalars  # noqa: E402

DEFAULT = ["+stage=day4", "chaos=on", "env_count=7000"]
SIX_DAYS_S = 6 * 86400
RUN_DIR_BUDGET_MB = 2048.0  # the origin system wrote 87 MB of logs in six days
SHOWN = (
    "driver/rss_mb",
    "driver/rss_floor_mb",
    "driver/rss_anon_floor_mb",
    "driver/pss_mb",
    "driver/heap/in_use_mb",
    "driver/heap/free_kept_mb",
    "driver/heap/mmapped_mb",
    "driver/python/blocks",
    "tree/pss_mb",
    "forkserver/rss_mb",
    "update/rss_mb",  # the PPO update's process (learner.update_in), where the run has one
    "update/fds",
    "redis/rss_mb",
    "workers/rss_mb_max",
    "workers/rss_less_env_leak_mb_max",
    "workers/env_leak_mb_sum",
    "workers/rss_mb_sum",
    "workers/count",
    "driver/fds",
    "driver/threads",
    "workers/fds_max",
    "workers/threads_max",
    "redis/used_memory_mb",
    "redis/keys",
    "shm/run_mb",
    "lifecycle/rows",
    "run_dir/tb_mb",
    "run_dir/lifecycle_mb",
    "run_dir/checkpoints_mb",
    "run_dir/logs_mb",
    "run_dir/errors_mb",
    "run_dir/total_mb",
)


def run_stage(out: Path, minutes: float, overrides: list[str]) -> tuple[int, float]:
    duration_s = minutes * 60
    cmd = [
        sys.executable,
        "-m",
        "rlpipe",
        *overrides,
        f"run.duration_s={duration_s:g}",
        "run.total_env_steps=null",
        f"hydra.run.dir={out}",
        "logging.project_to_s=" + str(SIX_DAYS_S),
        f"logging.long_run_min_s={min(600.0, duration_s / 2):g}",
    ]
    print("soak:", " ".join(cmd[2:]), flush=True)
    t = time.monotonic()
    with open(out.parent / f"{out.name}.stdout.log", "w") as log:
        code = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return code, time.monotonic() - t


def at_fraction(series, start_wall: float, end_wall: float, f: float) -> float | None:
    """The series' value nearest to fraction f of the stepping loop (by wall time)."""
    if series is None or not len(series.values):
        return None
    target = start_wall + f * (end_wall - start_wall)
    i = int(abs(series.wall_times - target).argmin())
    return float(series.values[i])


def table(summary: dict, scalars: dict) -> list[dict]:
    start_wall = summary["started_at_unix"]
    end_wall = start_wall + summary["wall_s"]
    verdicts = summary.get("long_run") or {}
    rows = []
    for name in SHOWN:
        s = scalars.get(f"resources/{name}")
        v = verdicts.get(name, {})
        rows.append(
            {
                "figure": name,
                "start": at_fraction(s, start_wall, end_wall, 0.1),
                "middle": at_fraction(s, start_wall, end_wall, 0.5),
                "end": at_fraction(s, start_wall, end_wall, 1.0),
                "slope_per_h": v.get("slope_per_h"),
                "slope_pct_per_h": v.get("slope_pct_per_h"),
                "slope_ci_pct_per_h": v.get("slope_ci_pct_per_h"),
                "projected_6d": v.get("projected"),
                "verdict": v.get("verdict"),
            }
        )
    return rows


def checks(code: int, summary: dict, recovery: dict) -> list[tuple[str, bool, str]]:
    lr = summary.get("long_run") or {}

    def judged(name: str, passing: tuple[str, ...]) -> tuple[bool, str]:
        v = lr.get(name)
        if v is None:
            return False, "no verdict"
        return v["verdict"] in passing, f"{v['verdict']}, {v['slope_per_h']:+.4g}/h"

    out = [
        ("exit 0", code == 0, f"exit {code}"),
        (
            "every env active at the end",
            summary.get("active_envs_end") == summary.get("env_count"),
            f"{summary.get('active_envs_end')}/{summary.get('env_count')}",
        ),
        (
            "every injected fault recovered",
            recovery["unrecovered"] == 0,
            f"{recovery['recovered']}/{recovery['injected']} recovered",
        ),
    ]
    for name, what in (
        ("driver/rss_mb", "driver RSS"),
        ("driver/rss_floor_mb", "driver RSS floor"),
    ):
        rss = lr.get(name)
        if rss is None:
            out.append((f"{what} slope <= 1 %/h", False, "no verdict"))
            continue
        lo, hi = rss["slope_ci_pct_per_h"]
        ok = rss["slope_pct_per_h"] <= 1.0 or (-3.0 <= lo and hi <= 3.0)
        out.append(
            (
                f"{what} slope <= 1 %/h (or its 95 % interval inside +-3 %/h)",
                ok,
                f"{rss['slope_pct_per_h']:+.2f} %/h, interval [{lo:+.2f}, {hi:+.2f}]",
            )
        )
    for name in ("workers/rss_less_env_leak_mb_max", "redis/used_memory_mb"):
        # memory that falls is no leak (chaos replaces the largest workers with fresh ones)
        out.append((f"{name} does not grow", *judged(name, ("flat", "falls"))))
    for name in ("driver/fds", "driver/threads"):  # fewer would be a thread or a socket lost
        out.append((f"{name} flat", *judged(name, ("flat",))))
    disk = lr.get("run_dir/total_mb")
    evidence = f"{disk['projected']:,.0f} MB" if disk else "no verdict"
    if disk and summary.get("wall_s", 0.0) / 2 < TB_DETAIL_S:
        # the slope is of the run's second half: here all of it charted every TB_INTERVAL_S
        evidence += (
            f" (TensorBoard's periodic charts at their first {TB_DETAIL_S / 60:.0f} minutes' "
            f"{TB_INTERVAL_S:.0f} s cadence throughout the half measured; a six-day run writes "
            f"them every {TB_LONG_INTERVAL_S:.0f} s after that: a soak of "
            f"{2 * TB_DETAIL_S / 60:.0f}+ minutes measures that)"
        )
    out.append(
        ("run dir projected to six days <= 2 GB", disk is not None and disk["projected"] <= RUN_DIR_BUDGET_MB, evidence)
    )
    return out


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=positive_float, default=60.0)
    ap.add_argument("--out", type=Path, default=None, help="the run directory (default outputs/soak-<time>)")
    ap.add_argument("overrides", nargs="*", help=f"rlpipe overrides (default: {' '.join(DEFAULT)})")
    a = ap.parse_args()
    out = (a.out or REPO / "outputs" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    code, wall = run_stage(out, a.minutes, a.overrides or DEFAULT)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        print(f"soak: the run left no summary.json (exit {code}); see {out.parent / (out.name + '.stdout.log')}")
        return 1
    summary = json.loads(summary_path.read_text())
    scalars = read_scalars(out / "tb")
    recovery = recovery_report(out / "lifecycle.sqlite", summary)
    rows = table(summary, scalars)
    cols = (
        "figure",
        "start",
        "middle",
        "end",
        "slope_per_h",
        "slope_pct_per_h",
        "slope_ci_pct_per_h",
        "projected_6d",
        "verdict",
    )
    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(fmt(r[c]).ljust(w) for c, w in zip(cols, widths)))
    results = checks(code, summary, recovery)
    print()
    for what, ok, why in results:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {why}")
    f = summary["faults"]
    print(
        f"\n{summary['env_steps']:,} env steps, {summary['updates']} updates, {f['worker_restarts']} worker "
        f"restarts, {f['env_crashes']} env crashes, {f['env_rebuilds']} rebuilds; wall {wall:.0f} s"
    )
    plot = plot_resources(scalars, out / "soak.png")
    report = {
        "run_dir": str(out),
        "minutes": a.minutes,
        "overrides": a.overrides or DEFAULT,
        "exit": code,
        "table": rows,
        "checks": [{"check": w, "pass": ok, "evidence": e} for w, ok, e in results],
        "recovery": {
            k: recovery[k] for k in ("injected", "recovered", "unrecovered", "recover_s_p50", "recover_s_p99")
        },
        "summary": {
            k: summary.get(k)
            for k in (
                "env_steps",
                "sps",
                "updates",
                "trained_samples",
                "active_envs_end",
                "env_count",
                "faults",
                "peak_rss_mb",
                "long_run",
            )
        },
        "plot": str(plot) if plot else None,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"soak: {out / 'soak.json'}" + (f", {plot}" if plot else ""))
    return 0 if all(ok for _w, ok, _e in results) else 1


if __name__ == "__main__":
    sys.exit(main())

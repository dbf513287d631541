"""A crash-looping env type beside healthy ones: what it costs them, and how the lifecycle db grows.

    python benchmarks/crash_loop.py [--minutes 10] [--repeats 1] [--env-count 80] [--groups 2] [--out DIR]
                                    [--controls twin,none] [overrides...]

Runs rlpipe once per configuration and repeat, each for `--minutes`, the order turned around
at every repeat:

- **crash**: `env_mix=classic` (CartPole, Acrobot, Pendulum, MountainCarContinuous) and a fifth
  type, `hostile_gym:FourValues-v0` (tests/hostile_gym.py: Gymnasium's old 4-value `step`, so
  every step breaks the contract), one env in five of `--env-count`, spread through every
  worker and slice as any type is (`rlpipe/envs/registry.py`, `assign_types`);
- **twin**: the same run with the fifth type's twin that does not crash, `hostile_gym:Plain-v0`
  (the same env with a 5-value `step`): the same envs, rows and learner work;
- **none**: the run without a fifth type, with one env in five fewer: the healthy types alone
  (the learner has fewer rows to act on and train, and a parked env costs its worker less than
  a stepped one, so neither control alone is the crash run less its crash loop).

Prints, per run: the healthy types' env steps per second (the run's steps over its stepping
time, times the healthy types' share of the envs: every env of a slice makes one step, or one
cut, per turn, so the healthy types' share of the steps is their share of the envs), the
second half's median of TensorBoard's `charts/sps` scaled the same way, and the crash run's
ratio to each control; the lifecycle db's rows and bytes (db and WAL), sampled every 30 s, their
growth per hour over the run's second half (the crash loop's backoff caps each env at one
fault a minute only once its streak has grown: `rlpipe/worker/backoff.py`), and the bound
docs/running.md states ("Bounds under any failure rate": 120 rows an hour and about 0.5 MB a
day per env in a crash loop) for the crash run's looping envs, with the twin run's own rows (a
run with no fault writes few) added. Bytes a day: the rows' growth times the bytes a row of
the db at the end (its pages: the schema's and indexes' fixed pages included, so an
overestimate for a short run). `--report DIR` prints a finished benchmark's figures again.

Timed figures: say what else ran on the machine beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # argtypes

from argtypes import positive_float, positive_int  # noqa: E402

from rlpipe.telemetry.tb_events import read_scalars  # noqa: E402
from rlpipe.worker.backoff import BACKOFF_CAP_S  # noqa: E402

HOSTILE = "hostile"  # the fifth type's name in the mix
ROWS_PER_FAULT = 2  # a fault row and its env_rebuild row (rlpipe/worker/process.py, report_faults)
BOUND_ROWS_PER_ENV_HOUR = ROWS_PER_FAULT * 3600 / BACKOFF_CAP_S  # 120: docs/running.md
BOUND_BYTES_PER_ENV_DAY = 0.5e6  # docs/running.md: 120 rows an hour at about 180 bytes a row
SAMPLE_S = 30.0


def mix_overrides(env_id: str | None) -> list[str]:
    """The classic mix, and a fifth type of one Gymnasium id at the weight of each of the four."""
    over = ["env_mix=classic"]
    if env_id is not None:
        node = f"+env_mix.types.{HOSTILE}"
        over += [
            f"{node}._target_=rlpipe.envs.classic.GymnasiumEnv",
            f"{node}._partial_=true",
            f"{node}.id=hostile_gym:{env_id}",
            f"{node}.rgb_shape=null",
            f"{node}.make_kwargs={{}}",
            f"+env_mix.weights.{HOSTILE}=1.0",
        ]
    return over


def db_figures(db: Path) -> tuple[int, int]:
    """(rows, bytes) of a lifecycle db being written. The bytes are its pages (page_count x
    page_size, read through the WAL): what the db holds once checkpointed. The files' own sizes
    say little: the writer's WAL grows to SQLite's checkpoint size before the db file does."""
    if not db.exists():
        return 0, 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            rows = con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            pages = con.execute("PRAGMA page_count").fetchone()[0]
            return rows, pages * con.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.Error:
        return -1, 0


def run_one(
    label: str, env_id: str | None, env_count: int, groups: int, minutes: float, out: Path, extra: list[str]
) -> dict:
    run_dir = out / label
    overrides = [
        f"hydra.run.dir={run_dir}",
        f"env_count={env_count}",
        f"groups.size={-(-env_count // groups)}",  # the same number of workers in every configuration
        f"run.duration_s={minutes * 60}",
        "run.total_env_steps=null",
        *mix_overrides(env_id),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"{label}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlpipe", *overrides], cwd=REPO, stdout=log, stderr=log, env=env)
    samples = []  # (seconds since start, rows, bytes)
    while proc.poll() is None:
        time.sleep(SAMPLE_S if samples else 5.0)
        samples.append((time.monotonic() - t0, *db_figures(run_dir / "lifecycle.sqlite")))
    log.close()
    samples.append((time.monotonic() - t0, *db_figures(run_dir / "lifecycle.sqlite")))
    if proc.returncode != 0:
        raise SystemExit(f"{label}: rlpipe exited {proc.returncode}; see {out / f'{label}.log'}")
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["env_types"]
    healthy = sum(n for t, n in counts.items() if t != HOSTILE) / sum(counts.values())
    stepping_s = summary["wall_s"] - (summary.get("startup_first_step_s") or 0.0)
    sps = read_scalars(run_dir / "tb").get("charts/sps")
    half = [v for s, v in zip(sps.steps, sps.values) if s >= sps.steps[-1] / 2] if sps else []
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as con:
        kinds = dict(con.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall())
    return {
        "label": label,
        "run_dir": str(run_dir),
        "env_id": env_id,
        "env_types": counts,
        "layout": summary.get("layout"),
        "healthy_share": healthy,
        "env_steps": summary["env_steps"],
        "stepping_s": stepping_s,
        "healthy_sps": summary["env_steps"] * healthy / stepping_s,
        "healthy_sps_tb_second_half_median": statistics.median(half) * healthy if half else None,
        "types_without_episodes": summary.get("types_without_episodes"),
        "faults": summary["faults"],
        "lifecycle_kinds": kinds,
        "samples": samples,
    }


def db_growth(res: dict) -> dict:
    """The lifecycle db of one run: rows and bytes at the end, and their growth over the second
    half of the run (its samples), read again from the finished db."""
    rows, size = db_figures(Path(res["run_dir"]) / "lifecycle.sqlite")
    samples = [s for s in res["samples"] if s[1] >= 0]
    mid = [s for s in samples if s[0] >= samples[-1][0] / 2]
    (ta, ra, _), (tb, rb, _) = mid[0], mid[-1]
    rows_h = (rb - ra) * 3600 / max(tb - ta, 1e-9)
    return {
        "db_rows": rows,
        "db_bytes": size,
        "bytes_per_row": size / max(rows, 1),
        "second_half_s": tb - ta,
        "rows_per_hour_second_half": rows_h,
        "bytes_per_day_second_half": rows_h * 24 * size / max(rows, 1),
    }


def line(res: dict) -> str:
    return (
        f"{res['label']:>9}: healthy {res['healthy_sps']:,.0f} steps/s "
        f"(TB 2nd-half median {res['healthy_sps_tb_second_half_median'] or 0:,.0f}); "
        f"db {res['db_rows']:,} rows, {res['db_bytes'] / 1e6:.3f} MB at the end ({res['bytes_per_row']:.0f} bytes a row); "
        f"2nd half {res['rows_per_hour_second_half']:,.0f} rows/h, {res['bytes_per_day_second_half'] / 1e6:.2f} MB/day; "
        f"faults {res['faults']}"
    )


def report(runs: list[dict], names: list[str]) -> dict:
    """The ratios and the bound, printed; returned for the JSON."""
    mean = statistics.fmean
    of = {name: [r for r in runs if r["config"] == name] for name in names}
    crash = of["crash"]
    ratios = {}
    for name in names[1:]:
        ratios[name] = mean(r["healthy_sps"] for r in crash) / mean(r["healthy_sps"] for r in of[name])
        tb = [r["healthy_sps_tb_second_half_median"] for r in crash + of[name]]
        tb_ratio = mean(tb[: len(crash)]) / mean(tb[len(crash) :]) if all(tb) else float("nan")
        print(
            f"healthy steps/s, crash / {name}: {ratios[name]:.3f} (TB 2nd half: {tb_ratio:.3f}); "
            f"at least 90 %: {ratios[name] >= 0.90}"
        )
    looping = crash[0]["env_types"].get(HOSTILE, 0)
    base = of.get("twin") or of.get("none") or []
    base_rows_h = mean(r["rows_per_hour_second_half"] for r in base) if base else 0.0
    base_bytes_day = mean(r["bytes_per_day_second_half"] for r in base) if base else 0.0
    bound_rows_h = looping * BOUND_ROWS_PER_ENV_HOUR + base_rows_h
    bound_bytes_day = looping * BOUND_BYTES_PER_ENV_DAY + base_bytes_day
    crash_rows_h = mean(r["rows_per_hour_second_half"] for r in crash)
    crash_bytes_day = mean(r["bytes_per_day_second_half"] for r in crash)
    print(
        f"lifecycle db, crash run's second half: {crash_rows_h:,.0f} rows/h against a bound of {bound_rows_h:,.0f} "
        f"({looping} looping envs x {BOUND_ROWS_PER_ENV_HOUR:.0f} + the control's {base_rows_h:,.0f}); "
        f"{crash_bytes_day / 1e6:.2f} MB/day against {bound_bytes_day / 1e6:.2f} ({looping} x "
        f"{BOUND_BYTES_PER_ENV_DAY / 1e6:.1f} + the control's {base_bytes_day / 1e6:.2f}); "
        f"within: {crash_rows_h <= bound_rows_h and crash_bytes_day <= bound_bytes_day}"
    )
    return {"ratios": ratios, "bound_rows_per_hour": bound_rows_h, "bound_bytes_per_day": bound_bytes_day}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=positive_float, default=10.0)
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--env-count", type=positive_int, default=80)
    ap.add_argument("--groups", type=positive_int, default=2, help="worker processes (groups.size = envs / groups)")
    ap.add_argument("--controls", default="twin,none", help="comma-separated: twin, none")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None, help="print the figures of a finished benchmark's DIR again")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.report is not None:
        saved = json.loads((args.report / "crash_loop.json").read_text())
        runs = [{"run_dir": str(args.report / r["label"]), **r} for r in saved["runs"]]
        runs = [{**r, **db_growth(r)} for r in runs]
        for r in runs:
            print(line(r))
        report(runs, list(dict.fromkeys(r["config"] for r in runs)))
        return
    out = args.out or REPO / "outputs" / f"crash_loop-{time.strftime('%Y%m%d-%H%M%S')}"
    controls = {"twin": ("Plain-v0", args.env_count), "none": (None, args.env_count * 4 // 5)}
    configs = [("crash", "FourValues-v0", args.env_count)]
    configs += [(name, *controls[name]) for name in args.controls.split(",") if name]
    runs = []
    for r in range(args.repeats):
        # turned around at each repeat, so a drift in the machine's load falls on all alike
        for label, env_id, count in configs if r % 2 == 0 else configs[::-1]:
            res = run_one(f"{label}{r}", env_id, count, args.groups, args.minutes, out, args.overrides)
            res["config"] = label
            res.update(db_growth(res))
            runs.append(res)
            print(line(res), flush=True)
    figures = report(runs, [name for name, _, _ in configs])
    result = {"minutes": args.minutes, "controls": args.controls, "runs": runs, **figures}
    (out / "crash_loop.json").write_text(json.dumps(result, indent=1))
    print(f"written: {out / 'crash_loop.json'}")


if __name__ == "__main__":
    main()

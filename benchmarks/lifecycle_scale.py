"""The lifecycle log at six days' size: how big it gets and whether its readers still answer.

    python benchmarks/lifecycle_scale.py [--rows-per-hour 159000] [--create-share 0.85]
        [--group 700] [--hours 144] [--out DIR]

Writes a synthetic `lifecycle.sqlite` through the writer's own store (rlpipe.lifecycle.store:
its tables, its spans of env creates, the `events` view) holding `rows-per-hour x hours`
events: `create-share` of them env creates, a restarted worker's whole group of `group` env
ids at a time, the rest in the proportions a chaos run writes them (env crashes, rebuilds,
quarantines, worker kills and restarts, ...; 7,000 env ids). Then times what users and the
report run on it: the CLI's counts (`python -m rlpipe.lifecycle DIR`), one env's history
(`--env N`), the summary's fault counts, the health report's per-kind counts and the chaos
recovery match. Prints the db's size and each reader's median of three calls.

The defaults are the hour soak of 2026-12-07 (`benchmarks/soak.py --minutes 60`, day4 with
chaos, groups of 700: docs/benchmarks.md, "Hour seven"); pass the figures of your own soak.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from rlpipe.config import conf_dir  # noqa: E402
from rlpipe.lifecycle import fault_counts, kind_counts  # noqa: E402
from rlpipe.lifecycle.events import DB_NAME  # noqa: E402
from rlpipe.lifecycle.recovery import recovery_report  # noqa: E402
from rlpipe.lifecycle.store import EnvLayout, EventStore, open_store  # noqa: E402

# Share of each kind but env_create in a chaos run's steady state (a day4 soak's rows past its
# start-up); the creates come in whole groups (write_synthetic_db).
KIND_SHARES = {
    "env_rebuild": 0.35,
    "env_crash": 0.25,
    "env_quarantine": 0.12,
    "env_hang": 0.03,
    "worker_spawn": 0.01,
    "worker_ready": 0.01,
    "worker_restart": 0.01,
    "worker_kill": 0.005,
    "worker_term": 0.005,
    "chaos_inject": 0.01,
}
# the seed12 mix's twelve types, as conf/ declares them
ENV_TYPES = tuple(OmegaConf.load(conf_dir() / "env_mix" / "seed12.yaml").weights)
N_ENVS = 7000
VERSION = "0123456789abcdef"
# Between two creates of a restarted group: a worker builds one env between two doorbells, and
# the 40-minute soak of 2026-12-07 (31c3442) built a restarted group of 700 in 11-18 s.
CREATE_GAP_S = 0.02
COMMIT_ROWS, COMMIT_S = 500, 0.2  # the writer's batches (rlpipe.lifecycle.writer)


def _events(rows: int, hours: float, create_share: float, group: int, rng):
    """The run's events in time order, as the writer's row tuples."""
    import numpy as np

    t0, span_s = time.time() - hours * 3600, hours * 3600
    groups = max(1, N_ENVS // group)
    rebuilds = int(rows * create_share) // group
    others = rows - rebuilds * group
    kinds = list(KIND_SHARES)
    p = np.array([KIND_SHARES[k] for k in kinds])
    other_kind = rng.choice(len(kinds), others, p=p / p.sum())
    other_env = rng.integers(0, N_ENVS, others)
    other_ts = np.sort(rng.uniform(t0, t0 + span_s, others))
    rebuild_ts = np.sort(rng.uniform(t0, t0 + span_s, rebuilds))
    rebuild_worker = rng.integers(0, groups, rebuilds)
    generation = [1] * groups
    r = 0
    for i in range(others + 1):
        ts = other_ts[i] if i < others else np.inf
        while r < rebuilds and rebuild_ts[r] <= ts:  # a restarted worker builds its group
            w = int(rebuild_worker[r])
            generation[w] += 1
            for k in range(group):
                e = w * group + k
                yield (
                    float(rebuild_ts[r]) + k * CREATE_GAP_S,
                    "synthetic",
                    "env_create",
                    e,
                    ENV_TYPES[e % len(ENV_TYPES)],
                    VERSION,
                    w,
                    generation[w],
                    None,
                )
            r += 1
        if i == others:
            return
        k, e = kinds[other_kind[i]], int(other_env[i])
        on_env = k.startswith("env_")
        yield (
            float(ts),
            "synthetic",
            k,
            e if on_env else None,
            ENV_TYPES[e % len(ENV_TYPES)] if on_env else None,
            VERSION if on_env else None,
            min(e // group, groups - 1),
            generation[min(e // group, groups - 1)],
            '{"error_type": "RuntimeError", "stacktrace_hash": "9f2c1e"}' if k == "env_crash" else None,
        )


def write_synthetic_db(
    db: Path, rows: int, hours: float, create_share: float = 0.85, group: int = 700, seed: int = 0
) -> None:
    """`rows` events over `hours` written as the run's writer writes them: its store, the
    run's env layout declared, commits of at most COMMIT_ROWS rows or COMMIT_S seconds."""
    import numpy as np

    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")  # a benchmark's file: no need to survive a crash
    open_store(con)
    store = EventStore(con)
    store.declare_layout(
        "synthetic", EnvLayout(0, [ENV_TYPES[e % len(ENV_TYPES)] for e in range(N_ENVS)], [VERSION] * N_ENVS)
    )
    batch: list[tuple] = []
    for row in _events(rows, hours, create_share, group, np.random.default_rng(seed)):
        if batch and (len(batch) >= COMMIT_ROWS or row[0] - batch[0][0] >= COMMIT_S):
            store.write(batch)
            batch.clear()
        batch.append(row)
    if batch:
        store.write(batch)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-per-hour", type=float, default=159000.0)
    ap.add_argument("--create-share", type=float, default=0.85, help="the share of events that are env creates")
    ap.add_argument("--group", type=int, default=700, help="envs a restarted worker creates again")
    ap.add_argument("--hours", type=float, default=144.0)
    ap.add_argument("--out", type=Path, default=None, help="where the db goes (default: a temp dir, removed)")
    a = ap.parse_args()
    rows = int(a.rows_per_hour * a.hours)
    with tempfile.TemporaryDirectory(prefix="rlpipe_lcscale_") as tmp:
        run_dir = a.out or Path(tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        db = run_dir / DB_NAME
        t = time.perf_counter()
        write_synthetic_db(db, rows, hours=a.hours, create_share=a.create_share, group=a.group)
        build_s = time.perf_counter() - t
        size_mb = db.stat().st_size / 2**20

        def cli(*args: str) -> None:
            subprocess.run(
                [sys.executable, "-m", "rlpipe.lifecycle", str(run_dir), *args],
                cwd=REPO,
                check=True,
                capture_output=True,
            )

        figures = {
            "rows": rows,
            "db_mb": round(size_mb, 1),
            "build_s": round(build_s, 1),
            "cli_counts_s": timed(lambda: cli()),
            "cli_env_history_s": timed(lambda: cli("--env", "4321")),
            "fault_counts_s": timed(lambda: fault_counts(db)),
            "health_per_kind_s": timed(lambda: kind_counts(db)),  # the health report's
            "recovery_report_s": timed(lambda: recovery_report(db, {}), repeat=1),
        }
    print(
        f"lifecycle log of {rows:,} rows ({a.rows_per_hour:,.0f}/h for {a.hours:g} h): {size_mb:,.0f} MB "
        f"(written in {build_s:.0f} s)"
    )
    for key in ("cli_counts_s", "cli_env_history_s", "fault_counts_s", "health_per_kind_s", "recovery_report_s"):
        print(f"  {key:22s} {figures[key]:8.2f} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

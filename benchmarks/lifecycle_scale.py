"""The lifecycle log at six days' size: how big it gets and whether its readers still answer.

    python benchmarks/lifecycle_scale.py [--rows-per-hour 30685] [--hours 144] [--out DIR]

Writes a synthetic `lifecycle.sqlite` with the writer's own schema and indexes
(rlpipe.lifecycle.writer) holding `rows-per-hour x hours` rows in the proportions a chaos
run writes them (env crashes, rebuilds, quarantines, worker kills and restarts, ...; 7,000
env ids, 100 workers), then times what users and the report run on it: the CLI's counts
(`python -m rlpipe.lifecycle DIR`), one env's history (`--env N`), the summary's fault
counts, the health report's per-kind counts and the chaos recovery match. Prints the db's
size and each reader's median of three calls.

The default rate is the one `benchmarks/soak.py` measured at day4 with chaos on
(docs/benchmarks.md, "Endurance"); pass the rate of your own soak.
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
from rlpipe.lifecycle import fault_counts  # noqa: E402
from rlpipe.lifecycle.events import DB_NAME  # noqa: E402
from rlpipe.lifecycle.recovery import recovery_report  # noqa: E402
from rlpipe.lifecycle.writer import _INSERT, _SCHEMA  # noqa: E402

# Share of each kind in a chaos run's steady state (a day4 soak's rows past its start-up).
KIND_SHARES = {
    "env_rebuild": 0.35,
    "env_crash": 0.25,
    "env_create": 0.20,
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
N_ENVS, N_WORKERS, BATCH = 7000, 100, 50_000


def write_synthetic_db(db: Path, rows: int, hours: float, seed: int = 0) -> None:
    """`rows` events over `hours` in the writer's schema and indexes, in KIND_SHARES proportions."""
    import numpy as np

    rng = np.random.default_rng(seed)
    kinds = list(KIND_SHARES)
    p = np.array([KIND_SHARES[k] for k in kinds])
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(_SCHEMA)
    t0 = time.time() - hours * 3600
    for start in range(0, rows, BATCH):
        n = min(BATCH, rows - start)
        kind = rng.choice(len(kinds), n, p=p / p.sum())
        env = rng.integers(0, N_ENVS, n)
        ts = t0 + (start + np.arange(n)) * (hours * 3600 / rows)
        batch = []
        for i in range(n):
            k = kinds[kind[i]]
            on_env = k.startswith("env_")
            e = int(env[i])
            batch.append(
                (
                    float(ts[i]),
                    "synthetic",
                    k,
                    e if on_env else None,
                    ENV_TYPES[e % len(ENV_TYPES)] if on_env else None,
                    "0123456789abcdef" if on_env else None,
                    e * N_WORKERS // N_ENVS,
                    int(start + i) // 10_000,
                    '{"error_type": "RuntimeError", "stacktrace_hash": "9f2c1e"}' if k == "env_crash" else None,
                )
            )
        con.executemany(_INSERT, batch)
        con.commit()
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
    ap.add_argument("--rows-per-hour", type=float, default=30685.0)
    ap.add_argument("--hours", type=float, default=144.0)
    ap.add_argument("--out", type=Path, default=None, help="where the db goes (default: a temp dir, removed)")
    a = ap.parse_args()
    rows = int(a.rows_per_hour * a.hours)
    with tempfile.TemporaryDirectory(prefix="rlpipe_lcscale_") as tmp:
        run_dir = a.out or Path(tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        db = run_dir / DB_NAME
        t = time.perf_counter()
        write_synthetic_db(db, rows, hours=a.hours)
        build_s = time.perf_counter() - t
        size_mb = db.stat().st_size / 2**20

        def cli(*args: str) -> None:
            subprocess.run(
                [sys.executable, "-m", "rlpipe.lifecycle", str(run_dir), *args],
                cwd=REPO,
                check=True,
                capture_output=True,
            )

        def per_kind() -> None:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                con.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall()

        figures = {
            "rows": rows,
            "db_mb": round(size_mb, 1),
            "build_s": round(build_s, 1),
            "cli_counts_s": timed(lambda: cli()),
            "cli_env_history_s": timed(lambda: cli("--env", "4321")),
            "fault_counts_s": timed(lambda: fault_counts(db)),
            "health_per_kind_s": timed(per_kind),
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

"""`python -m rlpipe.lifecycle <run_dir> [--env N]`: counts by event kind and env type of a run's
lifecycle log, or the ordered history of one env."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

from rlpipe.lifecycle.events import DB_NAME
from rlpipe.lifecycle.readers import env_history, event_counts


def _table(header: tuple, rows: list[tuple], right: set[int] = frozenset()) -> str:
    cells = [tuple("-" if v is None else str(v) for v in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rlpipe.lifecycle", description="Summarise a run's env lifecycle log (lifecycle.sqlite)."
    )
    p.add_argument("run_dir", type=Path, help="the Hydra run directory (or the .sqlite file itself)")
    p.add_argument("--env", type=int, metavar="N", help="print the ordered history of env N")
    args = p.parse_args(argv)

    db_path = args.run_dir if args.run_dir.is_file() else args.run_dir / DB_NAME
    if not db_path.is_file():
        print(f"error: no lifecycle log: {db_path} does not exist", file=sys.stderr)
        return 2
    try:
        if args.env is None:
            counts = event_counts(db_path)
            rows = [
                (kind, env_type, n)
                for (kind, env_type), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
            ]
            rows.append(("total", None, sum(counts.values())))
            print(_table(("kind", "env_type", "count"), rows, right={2}))
        else:
            hist = env_history(db_path, args.env)
            if not hist:
                print(f"no events for env {args.env} in {db_path}")
                return 0
            rows = [
                (
                    datetime.fromtimestamp(r["ts"]).isoformat(sep=" ", timespec="milliseconds"),
                    r["kind"],
                    r["env_type"],
                    r["env_version"],
                    r["worker_id"],
                    r["generation"],
                    r["detail"],
                )
                for r in hist
            ]
            print(_table(("time", "kind", "env_type", "version", "worker", "gen", "detail"), rows, right={4, 5}))
    except sqlite3.DatabaseError as e:
        print(f"error: cannot read lifecycle log {db_path}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())

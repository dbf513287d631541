"""Readers of a run's lifecycle log. They open it read-only, so they are safe while a run writes."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from rlpipe.lifecycle.events import FAULT_KINDS
from rlpipe.lifecycle.store import count_kinds


def connect_ro(db_path: str | Path) -> sqlite3.Connection:
    """Read-only, so a reader can never create an empty db by mistake or block the writer."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"no lifecycle log at {path}")
    # A db at rest (no -wal beside it: the writer has closed) is opened immutable, so the
    # reader creates no -shm/-wal files of its own in the run directory.
    at_rest = not path.with_name(path.name + "-wal").exists()
    return sqlite3.connect(path.resolve().as_uri() + ("?mode=ro&immutable=1" if at_rest else "?mode=ro"), uri=True)


def fault_counts(db_path: str | Path) -> dict[str, int]:
    """The "faults" block of summary.json, counted from rows."""
    kinds = kind_counts(db_path, tuple(FAULT_KINDS.values()))
    return {key: kinds.get(kind, 0) for key, kind in FAULT_KINDS.items()}


def kind_counts(db_path: str | Path, kinds: tuple[str, ...] | None = None) -> dict[str, int]:
    """Events by kind (of `kinds`, or every kind present)."""
    with contextlib.closing(connect_ro(db_path)) as db:
        return count_kinds(db, kinds)


def event_counts(db_path: str | Path) -> dict[tuple[str, str | None], int]:
    """(kind, env_type) -> number of rows; env_type is None for worker/run-level events."""
    with contextlib.closing(connect_ro(db_path)) as db:
        rows = db.execute("SELECT kind, env_type, COUNT(*) FROM events GROUP BY kind, env_type").fetchall()
    return {(kind, env_type): n for kind, env_type, n in rows}


def env_history(db_path: str | Path, env_id: int) -> list[dict]:
    """Every row of one env, oldest first (ties in ts keep arrival order)."""
    with contextlib.closing(connect_ro(db_path)) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM events WHERE env_id = ? ORDER BY ts, id", (env_id,)).fetchall()
    return [dict(r) for r in rows]

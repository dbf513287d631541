"""How the lifecycle log is stored: its tables, the `events` view every reader queries, and
the packing of a worker's env creates into spans.

Why spans: a restarted worker builds all of its envs again, and every create is a row. With
groups of 700 envs, an hour of chaos wrote 135k `env_create` rows of its 159k (121 bytes each
with their indexes), and the log alone was on course for 2.6 GB in six days. Most of such a
row repeats what the run's plan already says (the env's type and version) or what its
neighbours say (run, worker, generation). So the creates of one worker generation, with
consecutive env ids, whose type and version are those the run declared for them
(`env_layout`, kept once per distinct layout: a resumed run with the same envs adds no
row), and that reach the writer in one commit within SPAN_S of the first, are
stored as one `env_create_spans` row. The `events` view gives each of them back as a row of
its own, with the span's first `ts`: every create still reads as a row, with the columns it
always had, and none reads as earlier than it happened by more than SPAN_S. Creates that do
not fit a span (no layout declared, another type than declared, a driver's own create) are
kept as plain rows.

Ids: one sequence over both tables. A span of n creates takes n consecutive ids, so `id`
stays unique in the view, and the largest one is the number of events written.

A log written before the spans (a run resumed in an older run dir) holds `events` as a
table: `open_store` renames it to `event_rows`, its indexes following, and lays the view
over it. No row is copied.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from dataclasses import dataclass
from typing import NamedTuple

log = logging.getLogger(__name__)

SPAN_S = 0.25  # the most a spanned create's ts (its span's first) is earlier than its own

_TABLES = """
CREATE TABLE IF NOT EXISTS event_rows (
    id INTEGER PRIMARY KEY, ts REAL, run_id TEXT, kind TEXT, env_id INTEGER, env_type TEXT,
    env_version TEXT, worker_id INTEGER, generation INTEGER, detail TEXT);
CREATE INDEX IF NOT EXISTS events_kind ON event_rows(kind);
CREATE INDEX IF NOT EXISTS events_env_id ON event_rows(env_id);
CREATE TABLE IF NOT EXISTS env_layout (
    layout INTEGER, env_id INTEGER, env_type TEXT, env_version TEXT,
    PRIMARY KEY (layout, env_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS env_create_spans (
    first_id INTEGER PRIMARY KEY, ts REAL, ts_last REAL, run_id TEXT, layout INTEGER,
    worker_id INTEGER, generation INTEGER, env_lo INTEGER, env_hi INTEGER);
CREATE VIEW IF NOT EXISTS events AS
    SELECT id, ts, run_id, kind, env_id, env_type, env_version, worker_id, generation, detail
    FROM event_rows
    UNION ALL
    SELECT s.first_id + l.env_id - s.env_lo, s.ts, s.run_id, 'env_create', l.env_id, l.env_type,
           l.env_version, s.worker_id, s.generation, NULL
    FROM env_create_spans AS s JOIN env_layout AS l
    ON l.layout = s.layout AND l.env_id BETWEEN s.env_lo AND s.env_hi;
"""
_INSERT_ROW = (
    "INSERT INTO event_rows (id, ts, run_id, kind, env_id, env_type, env_version, worker_id, generation, detail) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_SPAN = (
    "INSERT INTO env_create_spans (first_id, ts, ts_last, run_id, layout, worker_id, generation, env_lo, env_hi) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def open_store(db: sqlite3.Connection) -> None:
    """The tables and the view, made where missing; a log of the older layout (`events` a
    table) renamed under the view first, in the same transaction (no reader ever finds the
    log without its `events`)."""
    older = db.execute("SELECT type FROM sqlite_master WHERE name = 'events'").fetchone() == ("table",)
    rename = "ALTER TABLE events RENAME TO event_rows;" if older else ""
    db.executescript(f"BEGIN; {rename} {_TABLES} COMMIT;")
    if older:
        log.info("lifecycle db: its events table is now event_rows, read through the events view")


def _has_spans(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'env_create_spans'").fetchone() is not None


def last_event_id(db: sqlite3.Connection) -> int:
    """The largest id written, 0 for none: the number of events the log holds (ids are never
    reused). Reads an older log (no event_rows) too."""
    if not _has_spans(db):  # an older log: events is its table
        return db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
    (last_row,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM event_rows").fetchone()
    span = db.execute(
        "SELECT first_id + env_hi - env_lo FROM env_create_spans ORDER BY first_id DESC LIMIT 1"
    ).fetchone()
    return max(last_row, span[0] if span else 0)


def count_kinds(db: sqlite3.Connection, kinds: tuple[str, ...] | None = None) -> dict[str, int]:
    """Events by kind (of `kinds`, or all), as `SELECT kind, COUNT(*) FROM events GROUP BY kind`
    would count them, without expanding the spans through the view: a span counts
    env_hi - env_lo + 1 creates (each of its env ids is in the layout, `EventStore._spannable`).
    The kind index answers the rest, so the progress line can ask every few seconds."""
    where = f" WHERE kind IN ({', '.join('?' * len(kinds))})" if kinds is not None else ""
    args = tuple(kinds or ())
    if not _has_spans(db):  # an older log: events is its table
        return dict(db.execute(f"SELECT kind, COUNT(*) FROM events{where} GROUP BY kind", args).fetchall())
    counts = dict(db.execute(f"SELECT kind, COUNT(*) FROM event_rows{where} GROUP BY kind", args).fetchall())
    if kinds is None or "env_create" in kinds:
        (spanned,) = db.execute("SELECT COALESCE(SUM(env_hi - env_lo + 1), 0) FROM env_create_spans").fetchone()
        if spanned:
            counts["env_create"] = counts.get("env_create", 0) + spanned
    return counts


class EnvLayout(NamedTuple):
    """A run's envs as its plan made them: env id first_env_id + i is of type env_types[i]
    at version env_versions[i] (ids are global: a torchrun rank's start at its offset)."""

    first_env_id: int
    env_types: list[str]
    env_versions: list[str]

    def key(self) -> int:
        """Its rows' key in `env_layout`: 63 bits of a hash of what it says, so a run resumed
        with the same envs (a new run id each time) adds no row."""
        text = json.dumps([self.first_env_id, list(self.env_types), list(self.env_versions)])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


@dataclass
class _Span:
    ts: float
    ts_last: float
    run_id: str
    layout: int
    worker_id: int
    generation: int | None
    env_lo: int
    env_hi: int


class EventStore:
    """The writer thread's side of the storage: the layout a run declared, and a batch of
    rows (the writer's tuples, `events.COLUMNS` in order) written as plain rows and spans."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.next_id = last_event_id(db) + 1
        self.layout: dict[str, tuple[int, EnvLayout]] = {}  # run id -> its layout's key, the layout

    def declare_layout(self, run_id: str, layout: EnvLayout) -> None:
        """Run `run_id`'s envs are as `layout` says (its rows written once per distinct layout)."""
        key, first = layout.key(), layout.first_env_id
        self.db.executemany(
            "INSERT OR IGNORE INTO env_layout VALUES (?, ?, ?, ?)",
            [(key, first + i, t, v) for i, (t, v) in enumerate(zip(layout.env_types, layout.env_versions))],
        )
        self.layout[run_id] = (key, layout)

    def _spannable(self, row: tuple) -> bool:
        _ts, run_id, kind, env_id, env_type, env_version, worker_id, _gen, detail = row
        if kind != "env_create" or worker_id is None or env_id is None or detail is not None:
            return False
        _key, layout = self.layout.get(run_id, (None, None))
        if layout is None:
            return False
        i = env_id - layout.first_env_id
        return (
            0 <= i < len(layout.env_types) and layout.env_types[i] == env_type and layout.env_versions[i] == env_version
        )

    def pack(self, batch: list[tuple]) -> tuple[list[tuple], list[tuple], int]:
        """The batch as plain rows and spans, each with its ids (in the order of arrival, a span
        at its first create), and the next id after them."""
        items: list[tuple | _Span] = []
        open_spans: dict[tuple, _Span] = {}
        for row in batch:
            if not self._spannable(row):
                items.append(row)
                continue
            ts, run_id, _kind, env_id, _type, _version, worker_id, generation, _detail = row
            span = open_spans.get((run_id, worker_id, generation))
            if span is not None and env_id == span.env_hi + 1 and span.ts_last <= ts <= span.ts + SPAN_S:
                span.env_hi, span.ts_last = env_id, ts
            else:
                span = open_spans[(run_id, worker_id, generation)] = _Span(
                    ts, ts, run_id, self.layout[run_id][0], worker_id, generation, env_id, env_id
                )
                items.append(span)
        rows, spans, next_id = [], [], self.next_id
        for item in items:
            if isinstance(item, _Span):
                spans.append(
                    (
                        next_id,
                        item.ts,
                        item.ts_last,
                        item.run_id,
                        item.layout,
                        item.worker_id,
                        item.generation,
                        item.env_lo,
                        item.env_hi,
                    )
                )
                next_id += item.env_hi - item.env_lo + 1
            else:
                rows.append((next_id, *item))
                next_id += 1
        return rows, spans, next_id

    def write(self, batch: list[tuple]) -> None:
        """The batch packed and inserted in one transaction (the connection is in autocommit
        mode, `isolation_level=None`); the ids move on only once it is committed."""
        rows, spans, next_id = self.pack(batch)
        db = self.db
        db.execute("BEGIN")
        try:
            db.executemany(_INSERT_ROW, rows)
            db.executemany(_INSERT_SPAN, spans)
            db.execute("COMMIT")
        except BaseException:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # sqlite rolled back itself (a full disk does): the original error counts
            raise
        self.next_id = next_id

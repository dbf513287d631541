"""The lifecycle log's storage (rlpipe/lifecycle/store.py): a worker's creates packed into
spans and read back through the `events` view as the rows they were, ids one sequence, an
older log's table taken over in place. Real SQLite and the real writer thread."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from rlpipe.lifecycle import LifecycleWriter, env_history, event_counts, fault_counts, kind_counts
from rlpipe.lifecycle.events import COLUMNS
from rlpipe.lifecycle.store import SPAN_S, EnvLayout, EventStore, last_event_id, open_store

TYPES = ["cartpole", "pendulum", "acrobot"]
N_ENVS = 12
LAYOUT = EnvLayout(0, [TYPES[e % 3] for e in range(N_ENVS)], [f"v-{TYPES[e % 3]}" for e in range(N_ENVS)])


@pytest.fixture
def run_dir():
    d = Path(tempfile.mkdtemp(prefix="lcs-", dir="/tmp"))  # ipc paths must fit in sun_path
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _writer(run_dir: Path, run_id: str = "run-1", layout=LAYOUT) -> LifecycleWriter:
    w = LifecycleWriter(run_dir / "lifecycle.sqlite", f"ipc://{run_dir}/lc.sock", run_id=run_id, env_layout=layout)
    w.start()
    return w


def _create(w: LifecycleWriter, env_id: int, ts: float, worker_id=0, generation=1, **over) -> dict:
    fields = dict(
        env_id=env_id,
        env_type=LAYOUT.env_types[env_id],
        env_version=LAYOUT.env_versions[env_id],
        worker_id=worker_id,
        generation=generation,
        ts=ts,
    )
    fields.update(over)
    w.record("env_create", **fields)
    return {"kind": "env_create", "run_id": w.run_id, "detail": None, **fields}


def _events(db: Path) -> list[dict]:
    with sqlite3.connect(db) as con:
        con.row_factory = sqlite3.Row
        return [dict(r) for r in con.execute("SELECT * FROM events ORDER BY id")]


def _table_rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as con:
        return con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_a_workers_creates_are_spans_and_read_back_as_the_rows_they_were(run_dir):
    w = _writer(run_dir)
    sent = []
    # Worker 0 builds envs 0-5 within SPAN_S, a crash of another worker arriving in between.
    for e in range(6):
        sent.append(_create(w, e, ts=100.0 + e * 0.01))
        if e == 2:
            w.record("env_crash", env_id=9, env_type="pendulum", worker_id=1, generation=1, ts=100.02, detail="boom")
            sent.append(
                {"kind": "env_crash", "env_id": 9, "env_type": "pendulum", "env_version": None, "worker_id": 1}
                | {"generation": 1, "ts": 100.02, "detail": "boom", "run_id": "run-1"}
            )
    # What breaks a span: a gap in the ids, a new generation, a create past SPAN_S, a version
    # or type other than the layout's, a create with a detail, one the driver recorded.
    sent.append(_create(w, 7, ts=100.06))  # gap (6 missing)
    sent.append(_create(w, 8, ts=100.07, generation=2))  # new generation: its own span
    sent.append(_create(w, 9, ts=100.07 + SPAN_S + 0.01, generation=2))  # too late for that span
    sent.append(_create(w, 10, ts=100.5, env_version="v-other"))  # not the layout's: a plain row
    sent.append(_create(w, 11, ts=100.5, env_type="pendulum"))  # not the layout's type: a plain row
    sent.append(_create(w, 3, ts=100.6, detail="rebuilt by hand"))
    sent.append(_create(w, 4, ts=100.7, worker_id=None, generation=None))
    w.flush()
    w.stop()
    db = w.db_path

    got = _events(db)
    assert [r["id"] for r in got] == list(range(1, len(sent) + 1))  # one sequence, no hole
    by_key = {(r["kind"], r["env_id"], r["generation"], r["env_version"], r["detail"]): r for r in got}
    for s in sent:
        r = by_key[(s["kind"], s["env_id"], s["generation"], s["env_version"], s["detail"])]
        for col in COLUMNS:
            if col == "ts":
                assert s["ts"] - SPAN_S <= r["ts"] <= s["ts"], (s, r)  # a span's ts is its first create's
            else:
                assert r[col] == s[col], (col, s, r)
    # Spans: 0-5, 7, 8, 9 (4 spans for 9 creates); plain rows: the crash and the four misfits.
    assert _table_rows(db, "env_create_spans") == 4
    assert _table_rows(db, "event_rows") == 5
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT env_lo, env_hi, ts, ts_last FROM env_create_spans ORDER BY first_id").fetchall()[
            0
        ] == (0, 5, 100.0, 100.05)
        assert last_event_id(con) == len(sent)
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    # The readers count the spanned creates as rows.
    assert kind_counts(db) == {"env_create": len(sent) - 1, "env_crash": 1}
    assert event_counts(db) == Counter((s["kind"], s["env_type"]) for s in sent)
    assert fault_counts(db)["env_crashes"] == 1
    assert [h["kind"] for h in env_history(db, 9)] == ["env_crash", "env_create"]


def test_ids_go_on_from_both_tables_when_a_log_is_opened_again(run_dir):
    """A resumed run (a new run id, the same envs) numbers its events after every id of both
    tables, and adds no layout rows: a supervisor restarting a run for days adds none."""
    w = _writer(run_dir)
    for e in range(4):
        _create(w, e, ts=10.0 + e * 0.01)
    w.stop()
    w = _writer(run_dir, run_id="run-2")  # a resumed run: the same file, its own run id
    _create(w, 0, ts=20.0)
    w.record("worker_restart", worker_id=0, generation=1, ts=20.1)
    w.stop()
    got = _events(w.db_path)
    assert [r["id"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["run_id"] for r in got] == ["run-1"] * 4 + ["run-2"] * 2
    assert _table_rows(w.db_path, "env_layout") == N_ENVS  # the same envs: their layout written once


def test_a_log_of_the_older_layout_is_taken_over_without_a_copy(run_dir):
    """A run dir written before the spans holds `events` as a table with its two indexes; a
    resumed run renames it under the view and writes on: old rows read as before."""
    db = run_dir / "lifecycle.sqlite"
    with sqlite3.connect(db) as con:  # the schema of rlpipe before the spans (2026-12-07)
        con.executescript(
            """
            CREATE TABLE events (
                id INTEGER PRIMARY KEY, ts REAL, run_id TEXT, kind TEXT, env_id INTEGER, env_type TEXT,
                env_version TEXT, worker_id INTEGER, generation INTEGER, detail TEXT);
            CREATE INDEX events_kind ON events(kind);
            CREATE INDEX events_env_id ON events(env_id);
            """
        )
        con.executemany(
            "INSERT INTO events (ts, run_id, kind, env_id, env_type, env_version, worker_id, generation, detail) "
            "VALUES (?, 'old', ?, ?, 'cartpole', 'v0', 0, 1, NULL)",
            [(1.0 + i, "env_create" if i < 3 else "env_crash", i % 3) for i in range(5)],
        )
    before = _events(db)
    assert kind_counts(db) == {"env_create": 3, "env_crash": 2}  # an older log reads as it is
    w = _writer(run_dir)
    for e in range(3):
        _create(w, e, ts=50.0 + e * 0.01)
    w.stop()
    after = _events(db)
    assert after[:5] == before
    assert [r["id"] for r in after] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _table_rows(db, "env_create_spans") == 1
    with sqlite3.connect(db) as con:
        names = {n: t for n, t in con.execute("SELECT name, type FROM sqlite_master")}
        assert names["events"] == "view" and names["event_rows"] == "table"
        assert con.execute("SELECT tbl_name FROM sqlite_master WHERE name = 'events_kind'").fetchone() == (
            "event_rows",
        )
    assert kind_counts(db) == {"env_create": 6, "env_crash": 2}


def test_pack_keeps_order_and_a_span_per_worker_generation(tmp_path):
    """Two workers' creates interleaved in one batch make one span each, at their first create."""
    con = sqlite3.connect(tmp_path / "l.sqlite", isolation_level=None)
    open_store(con)
    store = EventStore(con)
    store.declare_layout("r", LAYOUT)

    def row(kind, env_id, worker_id, ts):
        return (ts, "r", kind, env_id, LAYOUT.env_types[env_id], LAYOUT.env_versions[env_id], worker_id, 1, None)

    batch = [
        row("env_create", 0, 0, 1.0),
        row("env_create", 6, 1, 1.0),
        row("env_crash", 6, 1, 1.01),
        row("env_create", 1, 0, 1.02),
        row("env_create", 7, 1, 1.03),
    ]
    rows, spans, next_id = store.pack(batch)
    assert [s[0] for s in spans] == [1, 3] and [s[7:] for s in spans] == [(0, 1), (6, 7)]
    assert [r[0] for r in rows] == [5] and rows[0][3] == "env_crash"
    assert next_id == 6
    con.close()


def test_a_ranks_layout_starts_at_its_env_id_offset(run_dir):
    """Under torchrun a rank's env ids are global (env_id_offset + i): its creates are spans
    against its own offset, and ids outside its layout stay plain rows."""
    layout = EnvLayout(100, LAYOUT.env_types, LAYOUT.env_versions)
    w = _writer(run_dir, layout=layout)
    for i in range(4):
        w.record(
            "env_create",
            env_id=100 + i,
            env_type=layout.env_types[i],
            env_version=layout.env_versions[i],
            worker_id=0,
            generation=1,
            ts=5.0 + i * 0.01,
        )
    w.record(
        "env_create",
        env_id=2,
        env_type=layout.env_types[2],
        env_version=layout.env_versions[2],
        worker_id=0,
        generation=1,
        ts=6.0,
    )
    w.stop()
    got = _events(w.db_path)
    assert [(r["env_id"], r["env_type"]) for r in got] == [(100 + i, layout.env_types[i]) for i in range(4)] + [
        (2, layout.env_types[2])
    ]
    assert _table_rows(w.db_path, "env_create_spans") == 1 and _table_rows(w.db_path, "event_rows") == 1

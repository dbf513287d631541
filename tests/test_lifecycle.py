"""The lifecycle log end to end: real SQLite, real ZMQ over ipc://, real worker processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import zmq

from rlpipe.lifecycle import EVENT_KINDS, LifecycleClient, LifecycleWriter, env_history, event_counts, fault_counts
from rlpipe.lifecycle.__main__ import cli

REPO = Path(__file__).resolve().parents[1]
PER_WORKER = 300


@pytest.fixture
def run_dir():
    # ipc paths must fit in sun_path (107 bytes); pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def writer(run_dir):
    w = LifecycleWriter(run_dir / "lifecycle.sqlite", f"ipc://{run_dir}/lc.sock", run_id="run-1")
    w.start()
    yield w
    w.stop()


def _worker(endpoint: str, worker_id: int, n: int) -> None:
    """A worker process: env ids worker_id*1000 + i, every 10th env crashes and is rebuilt."""
    client = LifecycleClient(endpoint, worker_id=worker_id, generation=1)
    client.event("worker_spawn", detail={"pid": os.getpid()})
    for i in range(n):
        env_id = worker_id * 1000 + i
        client.event("env_create", env_id=env_id, env_type="cartpole", env_version="abc123")
        if i % 10 == 0:
            client.event("env_crash", env_id=env_id, env_type="cartpole", detail="segfault in step")
            client.event("env_rebuild", env_id=env_id, env_type="cartpole")
    client.event("worker_exit")
    client.close()  # linger, so these last events still arrive after the process exits
    assert client.dropped == 0


def _rows(db_path: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(db_path) as db:
        return db.execute(sql, args).fetchall()


def _wait_rows(writer: LifecycleWriter, expected: int, timeout_s: float = 5.0) -> None:
    """Frames sent by an exited process may still be crossing the ipc socket; flush until in."""
    deadline = time.monotonic() + timeout_s
    while True:
        writer.flush()
        if writer.rows_written >= expected or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def test_events_from_processes_and_driver_land_in_db(run_dir, writer):
    spawn = mp.get_context("spawn")
    procs = [spawn.Process(target=_worker, args=(writer.endpoint, w, PER_WORKER)) for w in (1, 2)]
    for p in procs:
        p.start()
    writer.record("worker_restart", worker_id=1, generation=2, detail={"reason": "heartbeat"})
    writer.record("group_wake", env_type="cartpole")
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    per_worker = 2 + PER_WORKER + 2 * (PER_WORKER // 10)
    expected = 2 * per_worker + 2
    _wait_rows(writer, expected)
    db = writer.db_path
    assert _rows(db, "SELECT COUNT(*) FROM events") == [(expected,)]
    assert writer.rows_written == expected and writer.bad_messages == 0
    # Batched: far fewer transactions than rows.
    assert writer.batches < expected / 5
    assert _rows(
        db, "SELECT worker_id, COUNT(*) FROM events WHERE worker_id IS NOT NULL AND generation = 1 GROUP BY worker_id"
    ) == [(1, per_worker), (2, per_worker)]
    assert set(_rows(db, "SELECT DISTINCT run_id FROM events")) == {("run-1",)}
    (detail,) = _rows(db, "SELECT detail FROM events WHERE kind = 'worker_restart'")[0]
    assert json.loads(detail) == {"reason": "heartbeat"}
    pids = [json.loads(d)["pid"] for (d,) in _rows(db, "SELECT detail FROM events WHERE kind = 'worker_spawn'")]
    assert sorted(pids) == sorted(p.pid for p in procs)

    assert _rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert _rows(db, "PRAGMA journal_mode") == [("wal",)]
    # Both indices exist (history and per-kind counts do not scan the table).
    assert {"events_kind", "events_env_id"} <= {
        n for (n,) in _rows(db, "SELECT name FROM sqlite_master WHERE type = 'index'")
    }

    assert fault_counts(db) == {
        "env_crashes": 60,
        "env_hangs": 0,
        "env_rebuilds": 60,
        "quarantined": 0,
        "worker_restarts": 1,
    }


def test_fault_and_event_counts_and_history(run_dir, writer):
    for i in range(3):
        writer.record("env_crash", env_id=7, env_type="pong", ts=100.0 + i)
    for _ in range(2):
        writer.record("env_hang", env_id=8, env_type="pong")
    for _ in range(4):
        writer.record("env_rebuild", env_id=7, env_type="pong")
    writer.record("env_quarantine", env_id=7, env_type="pong", detail="3 crashes in 60 s")
    writer.record("worker_restart", worker_id=0, generation=1)
    writer.record("worker_restart", worker_id=0, generation=2)
    writer.record("env_create", env_id=7, env_type="pong", env_version="v1", ts=50.0)
    writer.record("chaos_inject", detail={"kill": "worker 0"})
    writer.flush()
    db = writer.db_path

    assert fault_counts(db) == {
        "env_crashes": 3,
        "env_hangs": 2,
        "env_rebuilds": 4,
        "quarantined": 1,
        "worker_restarts": 2,
    }
    counts = event_counts(db)
    assert counts[("env_crash", "pong")] == 3
    assert counts[("worker_restart", None)] == 2
    assert sum(counts.values()) == 14

    hist = env_history(db, 7)
    assert [h["kind"] for h in hist[:4]] == ["env_create", "env_crash", "env_crash", "env_crash"]
    assert [h["kind"] for h in hist].count("env_rebuild") == 4
    assert hist[-1]["detail"] == "3 crashes in 60 s"
    assert hist[0]["env_version"] == "v1" and hist[0]["run_id"] == "run-1"
    assert env_history(db, 12345) == []


def test_cli_counts_and_env_history(run_dir, writer, capsys):
    writer.record("env_create", env_id=3, env_type="cartpole", env_version="v9", ts=10.0)
    writer.record("env_create", env_id=4, env_type="pendulum", ts=10.0)
    writer.record("env_crash", env_id=3, env_type="cartpole", detail="boom", ts=11.0)
    writer.record("env_rebuild", env_id=3, env_type="cartpole", ts=12.0)
    writer.record("worker_spawn", worker_id=0, generation=1)
    writer.stop()  # the CLI reads a finished run

    assert cli([str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kind", "env_type", "count"]
    table = {tuple(line.split()[:2]): line.split()[2] for line in lines[1:-1]}
    assert table == {
        ("env_create", "cartpole"): "1",
        ("env_create", "pendulum"): "1",
        ("env_crash", "cartpole"): "1",
        ("env_rebuild", "cartpole"): "1",
        ("worker_spawn", "-"): "1",
    }
    assert lines[-1].split() == ["total", "-", "5"]
    # Aligned: the count column ends at the same place on every line.
    assert len({len(line) for line in lines}) == 1

    assert cli([str(run_dir), "--env", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines[1:]] == ["env_create", "env_crash", "env_rebuild"]
    assert "v9" in lines[1] and lines[2].rstrip().endswith("boom")

    # The real entry point, as a user types it.
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe.lifecycle", str(run_dir), "--env", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "env_rebuild" in out.stdout and "env_create" in out.stdout


def test_cli_missing_db_is_a_clear_error(run_dir, capsys):
    assert cli([str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(run_dir / "lifecycle.sqlite") in err
    assert not (run_dir / "lifecycle.sqlite").exists()  # reading never creates a db
    with pytest.raises(FileNotFoundError):
        fault_counts(run_dir / "lifecycle.sqlite")


def test_stop_is_idempotent_and_leaves_no_thread(run_dir):
    w = LifecycleWriter(run_dir / "lifecycle.sqlite", f"ipc://{run_dir}/lc.sock", run_id="r")
    w.record("env_create", env_id=1)  # queued before start: still written
    w.start()
    client = LifecycleClient(w.endpoint, worker_id=0)
    client.event("env_rebuild", env_id=1)
    client.close()
    client.close()
    t0 = time.monotonic()
    w.stop()
    w.stop()
    assert time.monotonic() - t0 < 3.0
    assert not any(t.name == "lifecycle-writer" for t in threading.enumerate())
    assert sorted(_rows(w.db_path, "SELECT kind FROM events")) == [("env_create",), ("env_rebuild",)]
    w.record("env_create", env_id=2)  # after stop: counted, not raised
    assert w.dropped == 1
    w.flush()  # nothing running: returns at once


def test_bad_input(run_dir, writer):
    with pytest.raises(ValueError, match="unknown lifecycle event kind"):
        writer.record("env_explode", env_id=1)
    with pytest.raises(TypeError):
        writer.record("env_create", envid=1)
    client = LifecycleClient(writer.endpoint)
    with pytest.raises(ValueError, match="unknown lifecycle event kind"):
        client.event("nope")
    client.close()
    with pytest.raises(ValueError, match="107"):
        LifecycleClient("ipc:///tmp/" + "x" * 120)
    with pytest.raises(ValueError, match="107"):
        LifecycleWriter(writer.db_path, "ipc:///tmp/" + "x" * 120, run_id="r")

    # A buggy sender must not take the log down: bad frames are skipped and counted.
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.connect(writer.endpoint)
    for frame in (
        b"not json",
        b"[1, 2]",
        b'{"kind": "bogus"}',
        b'{"kind": "env_rebuild", "x": 1}',
        b'{"kind": "env_rebuild", "env_id": 5}',
    ):
        raw.send(frame)
    raw.close(linger=1000)
    deadline = time.monotonic() + 5
    while writer.rows_written < 1 and time.monotonic() < deadline:
        writer.flush()
    assert writer.bad_messages == 4
    assert _rows(writer.db_path, "SELECT kind, env_id FROM events") == [("env_rebuild", 5)]


def test_client_never_blocks_when_writer_is_gone(run_dir):
    client = LifecycleClient(f"ipc://{run_dir}/nobody.sock", worker_id=3, hwm=10)
    t0 = time.monotonic()
    for i in range(100):
        client.event("env_create", env_id=i)
    assert time.monotonic() - t0 < 1.0
    assert client.dropped >= 80
    client.close()  # bounded by the 500 ms linger
    assert time.monotonic() - t0 < 2.0


def test_every_kind_is_accepted(run_dir, writer):
    for kind in sorted(EVENT_KINDS):
        writer.record(kind)
    writer.flush()
    assert {k for (k, _), n in event_counts(writer.db_path).items()} == EVENT_KINDS


def _synthetic_db(tmp_path, rows: int):
    from tests.conftest import load_benchmark

    db = tmp_path / "lifecycle.sqlite"
    load_benchmark("lifecycle_scale").write_synthetic_db(db, rows, hours=144)
    return db


def test_lifecycle_readers_use_the_indexes(tmp_path):
    """A six-day log is millions of events: one env's history must be an index look-up, and
    the per-kind counts (the progress line asks every few seconds) an index scan plus a sum
    over the spans, never the view's expansion of every spanned create."""
    from rlpipe.lifecycle.store import count_kinds

    db = _synthetic_db(tmp_path, 20_000)
    with sqlite3.connect(db) as con:
        plan = " ".join(
            r[-1] for r in con.execute("EXPLAIN QUERY PLAN SELECT * FROM events WHERE env_id = ? ORDER BY ts, id", (5,))
        )
        assert "USING INDEX events_env_id" in plan, plan
        statements: list[str] = []
        con.set_trace_callback(statements.append)
        counts = count_kinds(con, ("env_crash", "env_hang", "env_create"))
        con.set_trace_callback(None)
        plans = [" ".join(r[-1] for r in con.execute(f"EXPLAIN QUERY PLAN {q}")) for q in statements]
        assert any("USING COVERING INDEX events_kind" in p for p in plans), plans
        assert not any("CO-ROUTINE" in p or "SEARCH l " in p for p in plans), plans  # the view is not read
        assert counts == dict(
            con.execute(
                "SELECT kind, COUNT(*) FROM events WHERE kind IN ('env_crash', 'env_hang', 'env_create') GROUP BY kind"
            ).fetchall()
        )


@pytest.mark.slow
def test_the_cli_answers_on_six_days_of_chaos_rows(tmp_path):
    """Six days at the hour soak's rate (docs/benchmarks.md, "Hour seven"): the CLI's counts
    and one env's history come back complete (benchmarks/lifecycle_scale.py times them)."""
    rows = 159_000 * 144  # the hour soak's 159,000 events an hour (groups of 700), for six days
    _synthetic_db(tmp_path, rows)
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe.lifecycle", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert out.splitlines()[-1].split()[-1] == str(rows)
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe.lifecycle", str(tmp_path), "--env", "4321"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert len(out.splitlines()) > 1000  # ~3,100 rows of env 4321 (2,780 creates), oldest first

"""The env lifecycle log: one row per create, crash, rebuild, wake, worker restart, ... of a run.

Workers never touch SQLite. Each one holds a `LifecycleClient` (a ZMQ PUSH) and sends one
compact-JSON frame per event; the driver process runs the single `LifecycleWriter`, a thread
that drains a PULL socket plus an in-process queue (for the driver's own events) and writes
rows in batched transactions to `<run_dir>/lifecycle.sqlite` (WAL). One writer means no
lock contention between thousands of envs, and a worker can never be blocked by the log:
a full send queue drops the event and counts it.

Readers (`fault_counts`, `event_counts`, `env_history`, the CLI) open the file read-only,
so they are safe to use while a run is still writing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import queue
import sqlite3
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import zmq

log = logging.getLogger(__name__)

EVENT_KINDS = frozenset({
    "env_create", "env_reset_fail", "env_crash", "env_hang", "env_rebuild", "env_quarantine",
    "env_close", "group_wake", "group_hibernate", "worker_spawn", "worker_exit", "worker_term",
    "worker_kill", "worker_restart", "redis_restart", "chaos_inject", "worker_ready",
})

# summary.json "faults" key -> the event kind it counts.
FAULT_KINDS = {
    "env_crashes": "env_crash",
    "env_hangs": "env_hang",
    "env_rebuilds": "env_rebuild",
    "quarantined": "env_quarantine",
    "worker_restarts": "worker_restart",
}

DB_NAME = "lifecycle.sqlite"
IPC_PATH_MAX = 107          # sizeof(sockaddr_un.sun_path) - 1 on Linux

_COLUMNS = ("ts", "run_id", "kind", "env_id", "env_type", "env_version", "worker_id",
            "generation", "detail")
_FIELDS = frozenset(_COLUMNS) - {"run_id", "kind"}      # what an event may carry
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, ts REAL, run_id TEXT, kind TEXT, env_id INTEGER, env_type TEXT,
    env_version TEXT, worker_id INTEGER, generation INTEGER, detail TEXT);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind);
CREATE INDEX IF NOT EXISTS events_env_id ON events(env_id);
"""
_INSERT = f"INSERT INTO events ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"

_BATCH_ROWS = 500           # commit after this many rows ...
_BATCH_S = 0.2              # ... or this long after the first uncommitted one
_POLL_S = 0.1               # the writer thread wakes at least this often, so stop() is prompt
_DRAIN_S = 2.0              # stop() gives in-flight events this long to arrive
_QUIET_S = 0.1              # ... and stops earlier once the socket has been quiet this long
_CLIENT_HWM = 10000
_WRITER_RCVHWM = 100000     # frames of ~150 bytes: ~15 MB at most
_CLIENT_LINGER_MS = 500     # on close, give the last events (e.g. worker_exit) time to leave


def _check_kind(kind: str) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown lifecycle event kind {kind!r}; expected one of {sorted(EVENT_KINDS)}")


def _check_endpoint(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if len(path.encode()) > IPC_PATH_MAX:
            raise ValueError(f"ipc endpoint path is {len(path.encode())} bytes, over the OS limit of "
                             f"{IPC_PATH_MAX}: {path!r}; put the socket under a shorter directory")


def _detail_text(detail: Any) -> str | None:
    if detail is None or isinstance(detail, str):
        return detail
    return json.dumps(detail, separators=(",", ":"), default=str)


class _Flush:
    """A marker put on the writer's queue: everything before it gets committed, then `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()


class LifecycleWriter:
    """The one SQLite writer of a run: a thread that drains a ZMQ PULL socket bound at
    `endpoint` and the queue fed by `record()`, and writes rows in batched transactions.

    Counters (read them after `flush()`/`stop()`): `rows_written`, `batches` (commits that
    wrote rows), `bad_messages` (frames that were not a valid event; skipped, logged once),
    `dropped` (record() calls after stop()).
    """

    def __init__(self, db_path: str | Path, endpoint: str, run_id: str,
                 ctx: zmq.Context | None = None):
        _check_endpoint(endpoint)
        self.db_path = Path(db_path)
        self.endpoint = endpoint
        self.run_id = run_id
        self._ctx = ctx or zmq.Context.instance()
        self._queue: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self._db: sqlite3.Connection | None = None
        self._stopped = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()       # start/stop/record-after-stop bookkeeping
        self.rows_written = 0
        self.batches = 0
        self.bad_messages = 0
        self.dropped = 0

    # --- driver-side API ------------------------------------------------------------------

    def start(self) -> None:
        """Open the db and bind the socket here, so a bad path or a busy endpoint raises in
        the caller; from then on only the writer thread touches them."""
        with self._lock:
            if self._thread is not None or self._stopped:
                raise RuntimeError("LifecycleWriter can start only once (and not after stop())")
            db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA busy_timeout=5000")
                db.executescript(_SCHEMA)
                sock = self._ctx.socket(zmq.PULL)
                # A deep receive queue absorbs bursts (a whole group waking at once) that
                # would otherwise fill the workers' send queues and be dropped there.
                sock.setsockopt(zmq.RCVHWM, _WRITER_RCVHWM)
                try:
                    sock.bind(self.endpoint)
                except BaseException:
                    sock.close(linger=0)
                    raise
            except BaseException:
                db.close()
                raise
            self._db, self._sock = db, sock
            self._thread = threading.Thread(target=self._run, name="lifecycle-writer", daemon=True)
            self._thread.start()

    def record(self, kind: str, **fields: Any) -> None:
        """Thread-safe enqueue of one row from the driver process. Fields: env_id, env_type,
        env_version, worker_id, generation, detail (str or JSON-able dict), ts."""
        _check_kind(kind)
        unknown = set(fields) - _FIELDS
        if unknown:
            raise TypeError(f"record() got unknown lifecycle fields {sorted(unknown)}")
        fields.setdefault("ts", time.time())
        row = self._row(kind, fields)
        # Under the lock, so a row is either queued before stop() starts its final drain or
        # counted as dropped: a late event during shutdown must not crash the driver.
        with self._lock:
            if self._stopped:
                self.dropped += 1
            else:
                self._queue.put(row)

    def flush(self, timeout_s: float = 2.0) -> None:
        """Block until every row queued by record() and every frame already arrived at the
        socket is committed. A no-op when the writer is not running."""
        if self._thread is None or not self._thread.is_alive():
            self._raise_if_failed()
            return
        marker = _Flush()
        self._queue.put(marker)
        deadline = time.monotonic() + timeout_s
        # Wait in slices: a concurrent stop() may end the thread before it sees the marker,
        # and then its final commit has done the flush's job.
        while not marker.done.wait(0.05):
            if not self._thread.is_alive():
                break
            if time.monotonic() > deadline:
                self._raise_if_failed()
                raise TimeoutError(f"lifecycle writer did not commit within {timeout_s} s")
        self._raise_if_failed()

    def stop(self) -> None:
        """Drain what is still queued or in flight (bounded by ~2 s), commit, close socket
        and db. Safe to call more than once, and before start()."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(_DRAIN_S + 5.0)
            if self._thread.is_alive():
                log.error("lifecycle writer thread did not finish; %s may lack the last events",
                          self.db_path)

    def __enter__(self) -> "LifecycleWriter":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- writer thread --------------------------------------------------------------------

    def _row(self, kind: str, f: dict) -> tuple:
        return (float(f.get("ts") or time.time()), self.run_id, kind, f.get("env_id"),
                f.get("env_type"), f.get("env_version"), f.get("worker_id"),
                f.get("generation"), _detail_text(f.get("detail")))

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"lifecycle writer failed: {self._error!r}") from self._error

    def _decode(self, frame: bytes) -> tuple | None:
        """A frame from a client -> a row, or None (counted) if it is not a valid event: a
        bad frame is some worker's bug and must not take the log down for everyone."""
        try:
            msg = json.loads(frame)
            kind = msg.pop("kind")
            _check_kind(kind)
            if set(msg) - _FIELDS:
                raise ValueError(f"unknown fields {sorted(set(msg) - _FIELDS)}")
            return self._row(kind, msg)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if self.bad_messages == 0:
                log.warning("lifecycle: skipping malformed event %r (%s); further ones are only counted",
                            frame[:200], e)
            self.bad_messages += 1
            return None

    def _recv_ready(self, pending: list, limit: int) -> int:
        """Receive every frame already waiting (up to `limit`) without blocking."""
        n = 0
        while n < limit:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            row = self._decode(frame)
            if row is not None:
                pending.append(row)
        return n

    def _drain_queue(self, pending: list, markers: list) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Flush):
                markers.append(item)
            else:
                pending.append(item)

    def _commit(self, pending: list) -> None:
        if not pending:
            return
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(_INSERT, pending)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.rows_written += len(pending)
        self.batches += 1
        pending.clear()

    def _run(self) -> None:
        pending: list[tuple] = []
        markers: list[_Flush] = []
        first_pending_at: float | None = None      # monotonic time of the oldest uncommitted row
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                # Sleep no longer than the batch deadline of rows already waiting.
                wait_s = _POLL_S
                if first_pending_at is not None:
                    wait_s = max(0.0, min(wait_s, first_pending_at + _BATCH_S - time.monotonic()))
                if poller.poll(wait_s * 1000):
                    self._recv_ready(pending, _BATCH_ROWS)
                self._drain_queue(pending, markers)
                if markers:
                    # A flush covers what has reached the socket by now, not just the queue.
                    self._recv_ready(pending, sys.maxsize)
                now = time.monotonic()
                if pending and first_pending_at is None:
                    first_pending_at = now
                if markers or len(pending) >= _BATCH_ROWS or (
                        first_pending_at is not None and now - first_pending_at >= _BATCH_S):
                    self._commit(pending)
                    first_pending_at = None
                for m in markers:
                    m.done.set()
                markers.clear()

            # Stopping: take what is in flight until the socket goes quiet or time is up.
            deadline = time.monotonic() + _DRAIN_S
            while time.monotonic() < deadline:
                if not poller.poll(_QUIET_S * 1000):
                    break
                self._recv_ready(pending, sys.maxsize)
                if len(pending) >= _BATCH_ROWS:
                    self._commit(pending)
            self._drain_queue(pending, markers)
            self._commit(pending)
        except BaseException as e:      # disk full, db deleted, ...: keep the reason for flush()
            self._error = e
            log.exception("lifecycle writer failed; events after this point are lost")
        finally:
            for m in markers:
                m.done.set()
            self._sock.close(linger=0)
            self._db.close()


class LifecycleClient:
    """Used in worker processes: a ZMQ PUSH connected to the writer's endpoint.

    `event()` never blocks: when the send queue is full (writer gone or far behind) the
    event is dropped and counted in `dropped`. Safe to share between a worker's threads.
    """

    def __init__(self, endpoint: str, ctx: zmq.Context | None = None, worker_id: int | None = None,
                 generation: int | None = None, hwm: int = _CLIENT_HWM):
        _check_endpoint(endpoint)
        self.worker_id = None if worker_id is None else int(worker_id)
        self.generation = None if generation is None else int(generation)
        self.dropped = 0
        self._lock = threading.Lock()       # ZMQ sockets are not thread-safe
        self._sock: zmq.Socket | None = (ctx or zmq.Context.instance()).socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, _CLIENT_LINGER_MS)
        self._sock.connect(endpoint)

    def event(self, kind: str, env_id: int | None = None, env_type: str | None = None,
              env_version: str | None = None, detail: str | dict | None = None,
              ts: float | None = None) -> None:
        _check_kind(kind)
        msg: dict[str, Any] = {"kind": kind, "ts": time.time() if ts is None else ts}
        # Only non-null fields travel; the writer fills the rest with NULL.
        # int() so numpy integers from the engine serialise as numbers.
        for key, value in (("env_id", None if env_id is None else int(env_id)), ("env_type", env_type),
                           ("env_version", env_version), ("worker_id", self.worker_id),
                           ("generation", self.generation), ("detail", detail)):
            if value is not None:
                msg[key] = value
        frame = json.dumps(msg, separators=(",", ":"), default=str).encode()
        with self._lock:
            if self._sock is None:
                self.dropped += 1
                return
            try:
                self._sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += 1

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()          # keeps the socket's LINGER: last events still leave
                self._sock = None

    def __enter__(self) -> "LifecycleClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- readers -------------------------------------------------------------------------------

def _connect_ro(db_path: str | Path) -> sqlite3.Connection:
    """Read-only, so a reader can never create an empty db by mistake or block the writer."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"no lifecycle log at {path}")
    # A db at rest (no -wal beside it: the writer has closed) is opened immutable, so the
    # reader creates no -shm/-wal files of its own in the run directory.
    at_rest = not path.with_name(path.name + "-wal").exists()
    return sqlite3.connect(path.resolve().as_uri() + ("?mode=ro&immutable=1" if at_rest else "?mode=ro"),
                           uri=True)


def fault_counts(db_path: str | Path) -> dict[str, int]:
    """The "faults" block of summary.json, counted from rows."""
    with contextlib.closing(_connect_ro(db_path)) as db:
        kinds = dict(db.execute(
            f"SELECT kind, COUNT(*) FROM events WHERE kind IN ({', '.join('?' * len(FAULT_KINDS))}) "
            "GROUP BY kind", tuple(FAULT_KINDS.values())).fetchall())
    return {key: kinds.get(kind, 0) for key, kind in FAULT_KINDS.items()}


def event_counts(db_path: str | Path) -> dict[tuple[str, str | None], int]:
    """(kind, env_type) -> number of rows; env_type is None for worker/run-level events."""
    with contextlib.closing(_connect_ro(db_path)) as db:
        rows = db.execute("SELECT kind, env_type, COUNT(*) FROM events GROUP BY kind, env_type").fetchall()
    return {(kind, env_type): n for kind, env_type, n in rows}


def env_history(db_path: str | Path, env_id: int) -> list[dict]:
    """Every row of one env, oldest first (ties in ts keep arrival order)."""
    with contextlib.closing(_connect_ro(db_path)) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM events WHERE env_id = ? ORDER BY ts, id", (env_id,)).fetchall()
    return [dict(r) for r in rows]


# --- CLI -------------------------------------------------------------------------------------

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
        prog="python -m rlpipe.lifecycle",
        description="Summarise a run's env lifecycle log (lifecycle.sqlite).")
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
            rows = [(kind, env_type, n) for (kind, env_type), n in
                    sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
            rows.append(("total", None, sum(counts.values())))
            print(_table(("kind", "env_type", "count"), rows, right={2}))
        else:
            hist = env_history(db_path, args.env)
            if not hist:
                print(f"no events for env {args.env} in {db_path}")
                return 0
            rows = [(datetime.fromtimestamp(r["ts"]).isoformat(sep=" ", timespec="milliseconds"),
                     r["kind"], r["env_type"], r["env_version"], r["worker_id"], r["generation"],
                     r["detail"]) for r in hist]
            print(_table(("time", "kind", "env_type", "version", "worker", "gen", "detail"),
                         rows, right={4, 5}))
    except sqlite3.DatabaseError as e:
        print(f"error: cannot read lifecycle log {db_path}: {e}", file=sys.stderr)
        return 2
    return 0

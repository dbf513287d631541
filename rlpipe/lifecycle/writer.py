"""The one SQLite writer of a run's lifecycle log (see the package docstring for why one)."""

from __future__ import annotations

import errno
import json
import logging
import queue
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from rlpipe.lifecycle.events import COLUMNS, check_endpoint, check_kind
from rlpipe.lifecycle.store import EnvLayout, EventStore, open_store

log = logging.getLogger(__name__)

_FIELDS = frozenset(COLUMNS) - {"run_id", "kind"}  # what an event may carry
_SQLITE_FULL = 13  # sqlite3.Error.sqlite_errorcode of "database or disk is full"


def _disk_full(exc: BaseException | None) -> bool:
    """Whether a full file system is in `exc`'s chain (rlpipe.files.space_error's rule; this
    package imports nothing of rlpipe's base modules)."""
    while exc is not None:
        if getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL or getattr(exc, "errno", None) in (
            errno.ENOSPC,
            errno.EDQUOT,
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_BATCH_ROWS = 500  # commit after this many rows ...
_BATCH_S = 0.2  # ... or this long after the first uncommitted one
_POLL_S = 0.1  # the writer thread wakes at least this often, so stop() is prompt
_DRAIN_S = 2.0  # stop() gives in-flight events this long to arrive
_QUIET_S = 0.1  # ... and stops earlier once the socket has been quiet this long
_WRITER_RCVHWM = 100000  # frames of ~150 bytes: ~15 MB at most


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

    def __init__(
        self,
        db_path: str | Path,
        endpoint: str,
        run_id: str,
        ctx: zmq.Context | None = None,
        env_layout: EnvLayout | None = None,
    ):
        """`env_layout`: each env id's type and version as the run planned them; with it, a
        worker's creates are stored as spans (store.py)."""
        check_endpoint(endpoint)
        self.env_layout = env_layout
        self.db_path = Path(db_path)
        self.endpoint = endpoint
        self.run_id = run_id
        self._ctx = ctx or zmq.Context.instance()
        self._queue: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self._db: sqlite3.Connection | None = None
        self._store: EventStore | None = None
        self._stopped = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # start/stop/record-after-stop bookkeeping
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
                open_store(db)
                store = EventStore(db)
                if self.env_layout is not None:
                    db.execute("BEGIN")
                    store.declare_layout(self.run_id, self.env_layout)
                    db.execute("COMMIT")
                sock = self._ctx.socket(zmq.PULL)
                # A deep receive queue absorbs bursts (a whole group waking at once) that
                # would otherwise fill the workers' send queues and be dropped there.
                sock.setsockopt(zmq.RCVHWM, _WRITER_RCVHWM)
                try:
                    sock.bind(self.endpoint)
                except BaseException:
                    sock.close(linger=0)
                    raise
            except sqlite3.Error as exc:  # named: "database or disk is full" says not which
                db.close()
                raise RuntimeError(f"lifecycle db {self.db_path} ({exc})") from exc
            except BaseException:
                db.close()
                raise
            self._db, self._sock, self._store = db, sock, store
            self._thread = threading.Thread(target=self._run, name="lifecycle-writer", daemon=True)
            self._thread.start()

    def record(self, kind: str, **fields: Any) -> None:
        """Thread-safe enqueue of one row from the driver process. Fields: env_id, env_type,
        env_version, worker_id, generation, detail (str or JSON-able dict), ts."""
        check_kind(kind)
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
                log.error("lifecycle writer thread did not finish; %s may lack the last events", self.db_path)

    def __enter__(self) -> "LifecycleWriter":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- writer thread --------------------------------------------------------------------

    def _row(self, kind: str, f: dict) -> tuple:
        return (
            float(f.get("ts") or time.time()),
            self.run_id,
            kind,
            f.get("env_id"),
            f.get("env_type"),
            f.get("env_version"),
            f.get("worker_id"),
            f.get("generation"),
            _detail_text(f.get("detail")),
        )

    def check(self) -> None:
        """Raise what ended the writer thread, if something did (the driver asks once a
        second: a run whose record is lost stops, it never goes on silently)."""
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"lifecycle db {self.db_path} (its writer failed: {self._error!r})") from self._error

    def _decode(self, frame: bytes) -> tuple | None:
        """A frame from a client -> a row, or None (counted) if it is not a valid event: a
        bad frame is some worker's bug and must not take the log down for everyone."""
        try:
            msg = json.loads(frame)
            kind = msg.pop("kind")
            check_kind(kind)
            if set(msg) - _FIELDS:
                raise ValueError(f"unknown fields {sorted(set(msg) - _FIELDS)}")
            return self._row(kind, msg)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if self.bad_messages == 0:
                log.warning(
                    "lifecycle: skipping malformed event %r (%s); further ones are only counted", frame[:200], e
                )
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
        self._store.write(pending)
        self.rows_written += len(pending)
        self.batches += 1
        pending.clear()

    def _run(self) -> None:
        pending: list[tuple] = []
        markers: list[_Flush] = []
        first_pending_at: float | None = None  # monotonic time of the oldest uncommitted row
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
                if (
                    markers
                    or len(pending) >= _BATCH_ROWS
                    or (first_pending_at is not None and now - first_pending_at >= _BATCH_S)
                ):
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
        except BaseException as e:  # disk full, db deleted, ...: keep the reason for flush()
            self._error = e  # and for check(): the driver stops the run on it
            if _disk_full(e):
                log.error("lifecycle writer failed: %s is full (%s)", self.db_path, e)
            else:
                log.exception("lifecycle writer failed; events after this point are lost")
        finally:
            for m in markers:
                m.done.set()
            self._sock.close(linger=0)
            self._db.close()

"""The worker's end of the lifecycle log: a ZMQ PUSH that never blocks."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import zmq

from rlpipe.lifecycle.events import check_endpoint, check_kind

_CLIENT_HWM = 10000
_CLIENT_LINGER_MS = 500  # on close, give the last events (e.g. worker_exit) time to leave


class LifecycleClient:
    """Used in worker processes: a ZMQ PUSH connected to the writer's endpoint.

    `event()` never blocks: when the send queue is full (writer gone or far behind) the
    event is dropped and counted in `dropped`. Safe to share between a worker's threads.
    """

    def __init__(
        self,
        endpoint: str,
        ctx: zmq.Context | None = None,
        worker_id: int | None = None,
        generation: int | None = None,
        hwm: int = _CLIENT_HWM,
    ):
        check_endpoint(endpoint)
        self.worker_id = None if worker_id is None else int(worker_id)
        self.generation = None if generation is None else int(generation)
        self.dropped = 0
        self._lock = threading.Lock()  # ZMQ sockets are not thread-safe
        self._sock: zmq.Socket | None = (ctx or zmq.Context.instance()).socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, _CLIENT_LINGER_MS)
        self._sock.connect(endpoint)

    def event(
        self,
        kind: str,
        env_id: int | None = None,
        env_type: str | None = None,
        env_version: str | None = None,
        detail: str | dict | None = None,
        ts: float | None = None,
    ) -> None:
        check_kind(kind)
        msg: dict[str, Any] = {"kind": kind, "ts": time.time() if ts is None else ts}
        # Only non-null fields travel; the writer fills the rest with NULL.
        # int() so numpy integers from the engine serialise as numbers.
        for key, value in (
            ("env_id", None if env_id is None else int(env_id)),
            ("env_type", env_type),
            ("env_version", env_version),
            ("worker_id", self.worker_id),
            ("generation", self.generation),
            ("detail", detail),
        ):
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
                self._sock.close()  # keeps the socket's LINGER: last events still leave
                self._sock = None

    def __enter__(self) -> "LifecycleClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

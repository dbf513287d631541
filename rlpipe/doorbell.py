"""The doorbells between the driver and its workers: one AF_UNIX SOCK_SEQPACKET connection per
worker process, carrying the fixed frames of `rlpipe.protocol` (RING up, ACT down).

Why not ZMQ (which the lifecycle feed still uses): a ZMQ send hands the frame to the sender's
IO thread, which writes it to the socket, where the receiver's IO thread reads it and wakes the
receiving thread: four threads and three wakeups per doorbell, on a machine where a hundred
workers already share two cores. A SEQPACKET send is one system call that wakes the receiver
directly, keeps frame boundaries, and is reliable and ordered per connection.
`benchmarks/doorbell.py` runs the two transports in the same loop; what it measured is in
docs/benchmarks.md.

A worker connects at start and says HELLO (its id and generation) first, so the driver can
reach it (a STOP) before its first ring; a connection closes when either side's process
goes, which each side reads as the other gone.
"""

from __future__ import annotations

import select
import socket
from pathlib import Path

from rlpipe.protocol import ACT, HELLO_SLICE, RING, STOP_SLICE

SOCKET_NAME = "doorbell.sock"  # in the run's socket dir
FRAME_MAX = 64  # bigger than any frame: a short read would mean a foreign peer
SEND_TIMEOUT_S = 1.0  # a worker's ring waits this long for room (a drowning driver), then gives up


class DoorbellServer:
    """The driver's end: a listening socket and every worker's connection, in one epoll set."""

    def __init__(self, path: Path):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path.unlink(missing_ok=True)  # a killed driver's (a resumed run, a restarted rank)
        self.listener.bind(str(path))
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.epoll = select.epoll()
        self.epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.conns: dict[int, socket.socket] = {}

    def poll(self, timeout_ms: int) -> list[tuple[socket.socket, bytes]]:
        """Frames the workers sent, waiting up to `timeout_ms` for the first (new connections
        are taken in on the way; a closed one is dropped)."""
        frames: list[tuple[socket.socket, bytes]] = []
        for fd, _events in self.epoll.poll(timeout_ms / 1000.0):
            if fd == self.listener.fileno():
                self._accept()
                continue
            conn = self.conns.get(fd)
            while conn is not None:
                try:
                    data = conn.recv(FRAME_MAX)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # the worker process is gone
                    self._drop(fd)
                    break
                frames.append((conn, data))
        return frames

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            self.conns[conn.fileno()] = conn
            self.epoll.register(conn.fileno(), select.EPOLLIN)

    def _drop(self, fd: int) -> None:
        conn = self.conns.pop(fd)
        self.epoll.unregister(fd)
        conn.close()

    def close(self) -> None:
        for fd in list(self.conns):
            self._drop(fd)
        self.epoll.close()
        self.listener.close()
        self.path.unlink(missing_ok=True)


def send_act(conn: socket.socket | None, slice_index: int, seq: int) -> bool:
    """Ring a worker: the actions of step `seq` of a slice are written (STOP_SLICE: stop).
    False when it cannot take it now: not connected yet, gone, or its queue is full."""
    if conn is None:
        return False
    try:
        conn.send(ACT.pack(slice_index, seq))
        return True
    except OSError:  # BlockingIOError (full), BrokenPipeError, a closed socket
        return False


class DoorbellClient:
    """A worker's end: one connection to the driver."""

    def __init__(self, path: str, worker_id: int, generation: int):
        self.worker_id, self.generation = worker_id, generation
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self.sock.settimeout(SEND_TIMEOUT_S)
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.ring(HELLO_SLICE, 0)

    def ring(self, slice_index: int, seq: int) -> bool:
        """Tell the driver step `seq` of a slice is published; False if it could not be told
        (gone, or no room for SEND_TIMEOUT_S): the caller's loop checks on the driver."""
        try:
            self.sock.send(RING.pack(self.worker_id, slice_index, self.generation, seq))
            return True
        except OSError:  # TimeoutError, BrokenPipeError, ConnectionResetError
            return False

    def wait(self, timeout_ms: int) -> bool:
        """Whether a frame (or the driver's hang-up) is waiting, within `timeout_ms`."""
        return bool(self.poller.poll(timeout_ms))

    def recv(self) -> tuple[int, int]:
        """The next (slice, seq); (STOP_SLICE, 0) once the driver has hung up."""
        try:
            data = self.sock.recv(FRAME_MAX)
        except OSError:
            data = b""
        return ACT.unpack(data) if data else (STOP_SLICE, 0)

    def close(self) -> None:
        self.sock.close()

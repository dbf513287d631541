"""The driver/worker doorbells (rlpipe.doorbell): HELLO first, RING up and ACT down on one
connection per worker, and each side seeing the other hang up."""

from __future__ import annotations

import time

from rlpipe.doorbell import DoorbellClient, DoorbellServer, send_act
from rlpipe.protocol import HELLO_SLICE, RING, STOP_SLICE


def _frames(server: DoorbellServer, want: int, timeout_s: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += server.poll(100)
    return out


def test_hello_ring_and_act_round_trip(short_tmp):
    server = DoorbellServer(short_tmp / "d.sock")
    client = DoorbellClient(str(short_tmp / "d.sock"), worker_id=7, generation=3)
    try:
        [(conn, hello)] = _frames(server, 1)
        assert RING.unpack(hello) == (7, HELLO_SLICE, 3, 0)
        assert not client.wait(0)
        assert send_act(conn, 1, 5) and send_act(conn, 0, 6)
        assert client.wait(1000) and client.recv() == (1, 5)
        assert client.recv() == (0, 6)  # in order, frame by frame
        assert client.ring(1, 6)
        [(same, ring)] = _frames(server, 1)
        assert same is conn and RING.unpack(ring) == (7, 1, 3, 6)
    finally:
        client.close()
        server.close()
    assert not (short_tmp / "d.sock").exists()


def test_each_side_sees_the_other_hang_up(short_tmp):
    server = DoorbellServer(short_tmp / "d.sock")
    gone = DoorbellClient(str(short_tmp / "d.sock"), worker_id=1, generation=1)
    stays = DoorbellClient(str(short_tmp / "d.sock"), worker_id=2, generation=1)
    try:
        conns = {RING.unpack(f)[0]: c for c, f in _frames(server, 2)}
        gone.close()  # a worker process that died
        assert _frames(server, 1, timeout_s=0.5) == []  # no frame: its connection is dropped
        assert len(server.conns) == 1 and not send_act(conns[1], 0, 1)
        assert not send_act(None, 0, 1)  # a worker that never said HELLO
        server.close()  # the driver gone
        assert stays.wait(1000) and stays.recv() == (STOP_SLICE, 0)
        assert not stays.ring(0, 1)
    finally:
        stays.close()
        server.close()  # a second close does nothing


def test_many_workers_ring_at_once(short_tmp):
    """A round's worth of rings from many connections arrives in one pass (no shared queue
    that a hundred workers would overflow)."""
    server = DoorbellServer(short_tmp / "d.sock")
    clients = [DoorbellClient(str(short_tmp / "d.sock"), worker_id=k, generation=1) for k in range(100)]
    try:
        _frames(server, 100)  # the HELLOs
        for c in clients:
            assert c.ring(0, 1) and c.ring(1, 1)
        rings = {RING.unpack(f)[:2] for _, f in _frames(server, 200)}
        assert rings == {(k, s) for k in range(100) for s in (0, 1)}
    finally:
        for c in clients:
            c.close()
        server.close()

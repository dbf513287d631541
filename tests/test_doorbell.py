"""The driver/worker doorbells (rlpipe.shm.doorbell over rlpipe.native.bell): act down and done
up through words in the worker's segment, a wait that sleeps in the kernel until a ring (in
another process too) and no longer than its timeout, STOP, a replaced generation's rings
going unread, signals handled during a wait, and no fd but the mappings' at either end."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from conftest import load_benchmark
from rlpipe.shm.doorbell import STOP_SLICE, DoorbellClient, DoorbellServer, send_act, send_stop, wake_worker
from rlpipe.shm.layout import H_PID, WorkerLayout, WorkerViews
from rlpipe.shm.segment import Segment, new_run_id, segment_name
from rlpipe.spec import ObsKey

N_ENVS = 8


class Fixture:
    """A driver's server and one worker segment per (worker, generation), both ends mapped
    in this process (the worker end as a worker maps it: attached by name)."""

    def __init__(self, n_slots: int):
        self.run_id = new_run_id()
        self.layout = WorkerLayout.build(N_ENVS, (ObsKey("obs", (4,), "float32"),), 0)
        self.server = DoorbellServer(self.run_id, n_slots)
        self.made: list[tuple[Segment, WorkerViews]] = []

    def segment(self, worker: int, generation: int) -> tuple[WorkerViews, WorkerViews]:
        """(driver's views, worker's views) of a fresh segment."""
        seg = Segment.create(segment_name(self.run_id, f"w{worker}g{generation}"), self.layout.size)
        mine = Segment.attach(seg.name)
        pair = WorkerViews(self.layout, seg, locked=False), WorkerViews(self.layout, mine, locked=False)
        self.made += [(seg, pair[0]), (mine, pair[1])]
        return pair

    def client(self, views: WorkerViews, n_slices: int) -> DoorbellClient:
        return DoorbellClient(self.server.name, views, n_slices)

    def close(self) -> None:
        self.server.close()
        for seg, views in self.made:
            views.release()
            seg.unlink()
            seg.close()


@pytest.fixture
def bells():
    fx = Fixture(n_slots=16)
    yield fx
    fx.close()


def _take(server: DoorbellServer, want: int, timeout_s: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += server.take(100)
    return out


def test_act_down_done_up_each_ring_once(bells):
    drv, wrk = bells.segment(7, 1)
    bells.server.attach(7, 3, 2, drv)  # worker 7's two slices are slots 3 and 4
    client = bells.client(wrk, 2)
    try:
        assert bells.server.take(0) == [] and client.take(0) is None
        client.ring(0, 0)
        client.ring(1, 0)
        assert sorted(bells.server.take(0)) == [(7, 0, 0), (7, 1, 0)]
        assert bells.server.take(0) == []  # taken once
        assert send_act(drv, 1, 0) and send_act(drv, 0, 0)
        assert sorted([client.take(0), client.take(0)]) == [(0, 0), (1, 0)]
        assert client.take(0) is None
        client.ring(1, 1)
        assert bells.server.take(1000) == [(7, 1, 1)]
        send_act(drv, 1, 1)
        assert client.take(1000) == (1, 1)
        assert not send_act(None, 0, 1)  # a handle with no segment
    finally:
        client.close()


def test_slices_are_served_in_turn(bells):
    drv, wrk = bells.segment(0, 1)
    bells.server.attach(0, 0, 3, drv)
    client = bells.client(wrk, 3)
    try:
        seen = []
        for step in range(3):
            for s in range(3):
                send_act(drv, s, step)
            seen += [client.take(0)[0] for _ in range(3)]
        assert sorted(seen[:3]) == [0, 1, 2] and sorted(seen[3:6]) == [0, 1, 2]
    finally:
        client.close()


def _wait_in_child(bell_name: str, seg_name: str, layout: WorkerLayout, q) -> None:
    seg = Segment.attach(seg_name)
    views = WorkerViews(layout, seg, locked=False)
    client = DoorbellClient(bell_name, views, 1)
    client.ring(0, 0)  # the driver wakes from its wait
    t0 = time.monotonic()
    act = client.take(10_000)  # sleeps until the parent's act
    q.put((act, time.monotonic() - t0))
    client.ring(0, 1)


def test_a_wait_sleeps_until_the_other_process_rings(bells):
    drv, _ = bells.segment(2, 1)
    bells.server.attach(2, 0, 1, drv)
    q = mp.get_context("fork").Queue()
    child = mp.get_context("fork").Process(
        target=_wait_in_child, args=(bells.server.name, segment_name(bells.run_id, "w2g1"), bells.layout, q)
    )
    child.start()
    try:
        t0 = time.monotonic()
        assert bells.server.take(10_000) == [(2, 0, 0)]
        assert time.monotonic() - t0 < 5.0
        time.sleep(0.3)  # the child is asleep in its wait by now
        send_act(drv, 0, 0)
        act, waited = q.get(timeout=10)
        assert act == (0, 0) and 0.2 < waited < 5.0
        assert _take(bells.server, 1) == [(2, 0, 1)]
    finally:
        child.join(10)
    assert child.exitcode == 0


def test_a_wait_for_several_rings_sleeps_through_the_earlier_ones(bells):
    """The driver gathering ready slices waits for the ring that can make a round due
    (`min_rings`): the rings before it wake nobody, the rings already in count, and a wait
    short of its rings still ends at its timeout with what came."""
    drv, wrk = bells.segment(0, 1)
    bells.server.attach(0, 0, 4, drv)
    client = bells.client(wrk, 4)
    board = bells.server

    def ring_later(slices, gap_s):
        for s in slices:
            time.sleep(gap_s)
            client.ring(s, 0)

    try:
        ringer = threading.Thread(target=ring_later, args=([0, 1, 2], 0.15))
        t0 = time.monotonic()
        ringer.start()
        slots, seqs = board.take_slots(10_000, 3)
        waited = time.monotonic() - t0
        ringer.join()
        assert sorted(slots.tolist()) == [0, 1, 2] and seqs.tolist() == [0, 0, 0]
        assert 0.4 < waited < 5.0  # woken by the third ring, not the first
        for s in (0, 1, 2):
            send_act(drv, s, 0)
            assert client.take(1000) == (s, 0)
        # two rings already in, one more awaited
        client.ring(0, 1)
        client.ring(1, 1)
        ringer = threading.Thread(target=ring_later, args=([3], 0.2))
        t0 = time.monotonic()
        ringer.start()
        slots, _ = board.take_slots(10_000, 3)
        ringer.join()
        assert sorted(slots.tolist()) == [0, 1, 3] and 0.15 < time.monotonic() - t0 < 5.0
        # the rings already there are enough: no wait
        client.ring(2, 1)
        assert board.take_slots(10_000, 1)[0].tolist() == [2]
        # short of its rings: the wait ends at its timeout with the one that came
        send_act(drv, 3, 0)
        assert client.take(1000) == (3, 0)
        client.ring(3, 1)
        t0 = time.monotonic()
        assert board.take_slots(200, 2)[0].tolist() == [3]
        assert 0.15 < time.monotonic() - t0 < 2.0
    finally:
        client.close()


def test_waits_end_at_their_timeout(bells):
    drv, wrk = bells.segment(0, 1)
    bells.server.attach(0, 0, 1, drv)
    client = bells.client(wrk, 1)
    try:
        for wait in (bells.server.take, client.take):
            t0 = time.monotonic()
            assert not wait(150)
            assert 0.1 < time.monotonic() - t0 < 2.0
    finally:
        client.close()


def test_stop_reaches_only_an_attached_worker_and_comes_first(bells):
    drv, wrk = bells.segment(0, 1)
    bells.server.attach(0, 0, 1, drv)
    client = bells.client(wrk, 1)
    try:
        assert not send_stop(drv)  # no process has attached: the caller terminates it instead
        assert not send_stop(None)
        wrk.store(H_PID, os.getpid())
        send_act(drv, 0, 0)
        assert send_stop(drv)
        assert client.take(1000) == (STOP_SLICE, 0)
        assert client.take(0) == (STOP_SLICE, 0)  # and stays
    finally:
        client.close()


def test_a_replaced_generations_rings_go_unread(bells):
    old_drv, old_wrk = bells.segment(5, 1)
    bells.server.attach(5, 2, 1, old_drv)
    old = bells.client(old_wrk, 1)
    new_drv, new_wrk = bells.segment(5, 2)
    new = bells.client(new_wrk, 1)
    try:
        old.ring(0, 0)
        assert bells.server.take(0) == [(5, 0, 0)]
        bells.server.detach(5, 2, 1)
        wake_worker(old_drv)  # the old writer wakes with nothing to do
        assert old.take(0) is None
        bells.server.attach(5, 2, 1, new_drv)
        old.ring(0, 7)  # a stopped writer continued after its replacement
        assert bells.server.take(0) == []
        new.ring(0, 0)  # the new one's first ring counts, though the old one rang seq 0 too
        assert bells.server.take(0) == [(5, 0, 0)]
    finally:
        old.close()
        new.close()


def test_many_workers_ring_at_once():
    fx = Fixture(n_slots=200)
    clients = []
    try:
        for k in range(100):
            drv, wrk = fx.segment(k, 1)
            fx.server.attach(k, 2 * k, 2, drv)
            clients.append(fx.client(wrk, 2))
        for c in clients:
            c.ring(0, 1)
            c.ring(1, 1)
        assert set(fx.server.take(0)) == {(k, s, 1) for k in range(100) for s in (0, 1)}
    finally:
        for c in clients:
            c.close()
        fx.close()


def test_a_signal_handler_runs_during_a_wait_and_its_exception_ends_it(bells):
    drv, wrk = bells.segment(0, 1)
    bells.server.attach(0, 0, 1, drv)
    client = bells.client(wrk, 1)
    beats = []
    old = signal.signal(signal.SIGALRM, lambda *_: beats.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        t0 = time.monotonic()
        assert client.take(5000) is None  # cut by the signal: the caller's loop looks around
        assert beats and time.monotonic() - t0 < 2.0
        signal.signal(signal.SIGALRM, lambda *_: 1 / 0)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(ZeroDivisionError):
            bells.server.take(5000)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        client.close()


def test_each_end_holds_only_its_mappings_fds():
    """No socket, epoll set or eventfd: the fds are the mappings' (Python's mmap keeps one per
    map), here the worker segment mapped twice and the bell page at each end."""
    before = len(os.listdir("/proc/self/fd"))
    fx = Fixture(n_slots=4)
    drv, wrk = fx.segment(0, 1)
    fx.server.attach(0, 0, 1, drv)
    client = fx.client(wrk, 1)
    assert len(os.listdir("/proc/self/fd")) == before + 4
    client.close()
    fx.close()
    fx.server.close()  # a second close does nothing
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_benchmark_runs_both_transports_in_its_loop(short_tmp):
    """benchmarks/doorbell.py's SEQPACKET and futex rows, tiny: each counts round trips and
    the CPU they took (figures printed by the script, never asserted on here)."""
    bench = load_benchmark("doorbell")
    bench.WARMUP_S = 0.2
    for name, run in (("seqpacket", bench._seqpacket), ("futex", bench._futex)):
        d = short_tmp / name
        d.mkdir()
        row = run(2, 0, 0.5, str(d))
        assert row["round_trips_per_s"] > 0 and row["env_steps_per_s"] == 0, (name, row)
        assert row["cpu_us_per_round_trip"] > 0, (name, row)

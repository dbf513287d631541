"""The doorbell transport alone: one unix SEQPACKET connection per worker (the engine's doorbells
until 2026-12-01, written here as `rlpipe/doorbell.py` had them) against the futex words in shared
memory of `rlpipe.shm.doorbell` now, and optionally ZMQ PUSH/PULL (before 2026-11-30), in the same
loop.

    python benchmarks/doorbell.py [--workers 100] [--envs 70] [--seconds 10] [--rounds 2]
                                  [--transports seqpacket,futex] [--json]

Each worker process owns `--envs` CartPoles (`gym.make("CartPole-v1", disable_env_checker=True)`,
as the engine's adapter builds them) and, on each doorbell, steps all of them with random
actions (autoreset) and rings back; the driver rings a worker again the moment its ring
arrives. `--envs 0` steps nothing: the round trip alone. No board, no learner: the difference
between the rows is the transport's. Per row, over `--seconds` after a 2 s warm-up: env
steps/s, round trips/s, and the CPU time (driver and workers, from /proc) per round trip.
The transports alternate for `--rounds` rounds; ratios use the medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import shutil
import statistics
import struct
import tempfile
import time

import numpy as np

FRAME = struct.Struct("<qq")  # (worker, seq); seq < 0: stop
WARMUP_S = 2.0
TICKS = os.sysconf("SC_CLK_TCK")
TRANSPORTS = ("zmq", "seqpacket", "futex")


def _envs(n: int):
    import gymnasium as gym

    envs = [gym.make("CartPole-v1", disable_env_checker=True) for _ in range(n)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    return envs


def _step_all(envs, rng) -> None:
    for env, a in zip(envs, rng.integers(0, 2, len(envs))):
        _, _, terminated, truncated, _ = env.step(int(a))
        if terminated or truncated:
            env.reset()


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of this process and of `pids` so far."""
    own = os.times()
    total = own.user + own.system
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


class _Clock:
    """Counts rings (seq 0: a worker's first; later ones a round trip each) over `seconds`,
    once every worker has rung and WARMUP_S has passed, with the CPU spent meanwhile."""

    def __init__(self, n_workers: int, n_envs: int, seconds: float, pids: list[int]):
        self.n_workers, self.n_envs, self.seconds, self.pids = n_workers, n_envs, seconds, pids
        self.started, self.trips, self.t_start, self.t_end = 0, 0, None, None
        self.cpu0 = self.cpu = 0.0

    def count(self, seq: int) -> None:
        if seq == 0:
            self.started += 1
        else:
            self.trips += 1

    def running(self) -> bool:
        now = time.perf_counter()
        if self.t_start is None and self.started == self.n_workers:
            self.t_start = now + WARMUP_S
        if self.t_start is not None and self.t_end is None and now >= self.t_start:
            self.trips, self.t_end, self.cpu0 = 0, now + self.seconds, _cpu_s(self.pids)
        if self.t_end is not None and now >= self.t_end:
            self.cpu = _cpu_s(self.pids) - self.cpu0
            return False
        return True

    def result(self) -> dict:
        return {
            "env_steps_per_s": self.trips * self.n_envs / self.seconds,
            "round_trips_per_s": self.trips / self.seconds,
            "cpu_us_per_round_trip": 1e6 * self.cpu / max(self.trips, 1),
        }


def _start(target, n_workers: int, n_envs: int, d: str) -> list:
    procs = [mp.get_context("fork").Process(target=target, args=(k, n_envs, d)) for k in range(n_workers)]
    for p in procs:
        p.start()
    return procs


# -- ZMQ PUSH/PULL -------------------------------------------------------------------------


def _zmq_worker(k: int, n_envs: int, d: str) -> None:
    import zmq

    envs, rng = _envs(n_envs), np.random.default_rng(k)
    ctx = zmq.Context(io_threads=1)
    ready, act = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    ready.connect(f"ipc://{d}/ready")
    act.connect(f"ipc://{d}/act{k}")
    ready.send(FRAME.pack(k, 0))
    while (seq := FRAME.unpack(act.recv())[1]) >= 0:
        _step_all(envs, rng)
        ready.send(FRAME.pack(k, seq + 1))
    ready.close(0)
    act.close(0)
    ctx.term()


def _zmq(n_workers: int, n_envs: int, seconds: float, d: str) -> dict:
    import zmq

    ctx = zmq.Context(io_threads=1)
    ready = ctx.socket(zmq.PULL)
    ready.bind(f"ipc://{d}/ready")
    acts = []
    for k in range(n_workers):
        s = ctx.socket(zmq.PUSH)
        s.bind(f"ipc://{d}/act{k}")
        acts.append(s)
    procs = _start(_zmq_worker, n_workers, n_envs, d)
    clock = _Clock(n_workers, n_envs, seconds, [p.pid for p in procs])
    while clock.running():
        if not ready.poll(10):
            continue
        while True:
            try:
                k, seq = FRAME.unpack(ready.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            clock.count(seq)
            acts[k].send(FRAME.pack(k, seq))
    for s in acts:
        s.send(FRAME.pack(0, -1))
    for p in procs:
        p.join()
    for s in acts + [ready]:
        s.close(0)
    ctx.term()
    return clock.result()


# -- unix SEQPACKET, as the engine had it ----------------------------------------------------


def _seq_worker(k: int, n_envs: int, d: str) -> None:
    """The old DoorbellClient's calls: a socket with a send timeout (so Python polls before
    each send and recv), and a poll for the next frame before its recv."""
    import socket

    envs, rng = _envs(n_envs), np.random.default_rng(k)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(f"{d}/doorbell")
    s.settimeout(1.0)
    poller = select.poll()
    poller.register(s.fileno(), select.POLLIN)
    s.send(FRAME.pack(k, 0))
    while True:
        if not poller.poll(1000):
            continue
        m = s.recv(64)
        if not m or (seq := FRAME.unpack(m)[1]) < 0:
            break
        _step_all(envs, rng)
        s.send(FRAME.pack(k, seq + 1))
    s.close()


def _seqpacket(n_workers: int, n_envs: int, seconds: float, d: str) -> dict:
    """The old DoorbellServer's calls: epoll, then recv on each ready connection until it
    would block, and a send per ring back."""
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"{d}/doorbell")
    listener.listen(4096)
    procs = _start(_seq_worker, n_workers, n_envs, d)
    conns, ep = {}, select.epoll()
    for _ in range(n_workers):
        c, _ = listener.accept()
        c.setblocking(False)
        conns[c.fileno()] = c
        ep.register(c.fileno(), select.EPOLLIN)
    clock = _Clock(n_workers, n_envs, seconds, [p.pid for p in procs])
    while clock.running():
        for fd, _ev in ep.poll(0.01):
            c = conns[fd]
            while True:
                try:
                    k, seq = FRAME.unpack(c.recv(64))
                except BlockingIOError:
                    break
                clock.count(seq)
                c.send(FRAME.pack(k, seq))
    for c in conns.values():
        c.setblocking(True)
        c.send(FRAME.pack(0, -1))
    for p in procs:
        p.join()
    for c in conns.values():
        c.close()
    ep.close()
    listener.close()
    return clock.result()


# -- futex words in shared memory (rlpipe.shm.doorbell) ------------------------------------------


def _layout(n_envs: int):
    from rlpipe.shm.layout import WorkerLayout
    from rlpipe.spec import ObsKey

    return WorkerLayout.build(max(n_envs, 1), (ObsKey("obs", (4,), "float32"),), 0)


def _futex_worker(k: int, n_envs: int, d: str) -> None:
    from rlpipe.shm.doorbell import STOP_SLICE, DoorbellClient
    from rlpipe.shm.layout import WorkerViews
    from rlpipe.shm.segment import Segment

    bell_name, run_id = d.split(" ")
    envs, rng = _envs(n_envs), np.random.default_rng(k)
    seg = Segment.attach(f"rlpipe_{run_id}_w{k}g1")
    views = WorkerViews(_layout(n_envs), seg, locked=False)
    bell = DoorbellClient(bell_name, views, 1)
    bell.ring(0, 0)
    while True:
        act = bell.take(1000)
        if act is None:
            continue
        s, seq = act
        if s == STOP_SLICE:
            break
        _step_all(envs, rng)
        bell.ring(s, seq + 1)
    bell.close()
    views.release()
    seg.close()


def _futex(n_workers: int, n_envs: int, seconds: float, d: str) -> dict:
    from rlpipe.shm.doorbell import DoorbellServer, send_act, send_stop
    from rlpipe.shm.layout import H_PID, WorkerViews
    from rlpipe.shm.segment import Segment, new_run_id, segment_name

    run_id, layout = new_run_id(), _layout(n_envs)
    server = DoorbellServer(run_id, n_workers)
    segs = [Segment.create(segment_name(run_id, f"w{k}g1"), layout.size) for k in range(n_workers)]
    views = [WorkerViews(layout, s, locked=False) for s in segs]
    for k, v in enumerate(views):
        server.attach(k, k, 1, v)
    procs = _start(_futex_worker, n_workers, n_envs, f"{server.name} {run_id}")
    clock = _Clock(n_workers, n_envs, seconds, [p.pid for p in procs])
    try:
        while clock.running():
            for k, s, seq in server.take(10):
                clock.count(seq)
                send_act(views[k], s, seq)
        for v in views:
            v.store(H_PID, 1)  # (the workers here do not write theirs)
            send_stop(v)
        for p in procs:
            p.join()
    finally:
        server.close()
        for s, v in zip(segs, views):
            v.release()
            s.unlink()
            s.close()
    return clock.result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--envs", type=int, default=70)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--transports", default="seqpacket,futex", help=f"comma-separated, of {', '.join(TRANSPORTS)}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = [t for t in args.transports.split(",") if t]
    if not names or set(names) - set(TRANSPORTS):
        ap.error(f"--transports: of {', '.join(TRANSPORTS)}")
    fns = {"zmq": _zmq, "seqpacket": _seqpacket, "futex": _futex}
    runs: dict[str, list[dict]] = {t: [] for t in names}
    for _ in range(args.rounds):
        for name in names:
            d = tempfile.mkdtemp(prefix="rlbd", dir="/tmp")
            try:
                runs[name].append(fns[name](args.workers, args.envs, args.seconds, d))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            r = runs[name][-1]
            print(
                f"{name:>10}: {r['env_steps_per_s']:>10,.0f} env steps/s, {r['round_trips_per_s']:>9,.0f} "
                f"round trips/s, {r['cpu_us_per_round_trip']:6.1f} CPU us per round trip",
                flush=True,
            )
    med = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in runs.items()}
    print(f"{args.workers} workers x {args.envs} CartPoles, medians of {args.rounds} rounds:")
    for t, m in med.items():
        print(
            f"{t:>10}: {m['env_steps_per_s']:>10,.0f} env steps/s, {m['round_trips_per_s']:>9,.0f} round trips/s, "
            f"{m['cpu_us_per_round_trip']:6.1f} CPU us per round trip"
        )
    ratios = {}
    base = "seqpacket" if "seqpacket" in med else names[0]
    for t in med:
        if t != base:
            ratios[f"{t}_over_{base}"] = {
                "round_trips_per_s": round(med[t]["round_trips_per_s"] / med[base]["round_trips_per_s"], 3),
                "cpu_per_round_trip": round(med[t]["cpu_us_per_round_trip"] / med[base]["cpu_us_per_round_trip"], 3),
            }
            r = ratios[f"{t}_over_{base}"]
            print(
                f"{t} / {base}: {r['round_trips_per_s']:.2f}x the round trips/s, "
                f"{r['cpu_per_round_trip']:.2f}x the CPU per round trip"
            )
    if args.json:
        print(json.dumps({"runs": runs, "median": med, "ratios": ratios}))


if __name__ == "__main__":
    main()

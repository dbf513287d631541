"""The doorbell transport alone: ZMQ PUSH/PULL (what the engine used before) against one unix
SEQPACKET connection per worker (`rlpipe.doorbell`, what it uses now), in the same loop.

    python benchmarks/doorbell.py [--workers 100] [--envs 70] [--seconds 10] [--rounds 2] [--json]

Each worker process owns `--envs` CartPoles (`gym.make("CartPole-v1", disable_env_checker=True)`,
as the engine's adapter builds them) and, on each doorbell, steps all of them with random
actions (autoreset) and rings back; the driver rings a worker again the moment its ring
arrives. No shared memory, no learner: only the stepping and the doorbells, so the difference
between the two rows is the transport's. Figures are env steps/s over `--seconds` after a 2 s
warm-up, the two transports alternating for `--rounds` rounds; the ratio uses the medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import select
import shutil
import statistics
import struct
import tempfile
import time

import numpy as np

FRAME = struct.Struct("<qq")  # (worker, seq); seq < 0: stop
WARMUP_S = 2.0


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


class _Clock:
    """Counts env steps from the rings, over `seconds` once every worker has said hello and
    WARMUP_S has passed."""

    def __init__(self, n_workers: int, n_envs: int, seconds: float):
        self.n_workers, self.n_envs, self.seconds = n_workers, n_envs, seconds
        self.started, self.steps, self.t_start, self.t_end = 0, 0, None, None

    def count(self, seq: int) -> None:
        self.started += seq == 0
        self.steps += self.n_envs * (seq == 1)

    def running(self) -> bool:
        now = time.perf_counter()
        if self.t_start is None and self.started == self.n_workers:
            self.t_start = now + WARMUP_S
        if self.t_start is not None and self.t_end is None and now >= self.t_start:
            self.steps, self.t_end = 0, now + self.seconds
        return self.t_end is None or now < self.t_end

    def rate(self) -> float:
        return self.steps / self.seconds


def _start(target, n_workers: int, n_envs: int, d: str) -> list:
    procs = [mp.get_context("fork").Process(target=target, args=(k, n_envs, d)) for k in range(n_workers)]
    for p in procs:
        p.start()
    return procs


def _zmq_worker(k: int, n_envs: int, d: str) -> None:
    import zmq

    envs, rng = _envs(n_envs), np.random.default_rng(k)
    ctx = zmq.Context(io_threads=1)
    ready, act = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    ready.connect(f"ipc://{d}/ready")
    act.connect(f"ipc://{d}/act{k}")
    ready.send(FRAME.pack(k, 0))
    while FRAME.unpack(act.recv())[1] >= 0:
        _step_all(envs, rng)
        ready.send(FRAME.pack(k, 1))
    ready.close(0)
    act.close(0)
    ctx.term()


def _zmq(n_workers: int, n_envs: int, seconds: float, d: str) -> float:
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
    clock = _Clock(n_workers, n_envs, seconds)
    while clock.running():
        if not ready.poll(10):
            continue
        while True:
            try:
                k, seq = FRAME.unpack(ready.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            clock.count(seq)
            acts[k].send(FRAME.pack(k, 1))
    for s in acts:
        s.send(FRAME.pack(0, -1))
    for p in procs:
        p.join()
    for s in acts + [ready]:
        s.close(0)
    ctx.term()
    return clock.rate()


def _seq_worker(k: int, n_envs: int, d: str) -> None:
    import socket

    envs, rng = _envs(n_envs), np.random.default_rng(k)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(f"{d}/doorbell")
    s.send(FRAME.pack(k, 0))
    while (m := s.recv(64)) and FRAME.unpack(m)[1] >= 0:
        _step_all(envs, rng)
        s.send(FRAME.pack(k, 1))
    s.close()


def _seqpacket(n_workers: int, n_envs: int, seconds: float, d: str) -> float:
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
    clock = _Clock(n_workers, n_envs, seconds)
    while clock.running():
        for fd, _ev in ep.poll(0.01):
            c = conns[fd]
            while True:
                try:
                    k, seq = FRAME.unpack(c.recv(64))
                except BlockingIOError:
                    break
                clock.count(seq)
                c.send(FRAME.pack(k, 1))
    for c in conns.values():
        c.setblocking(True)
        c.send(FRAME.pack(0, -1))
    for p in procs:
        p.join()
    for c in conns.values():
        c.close()
    ep.close()
    listener.close()
    return clock.rate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--envs", type=int, default=70)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"zmq_push_pull": [], "unix_seqpacket": []}
    for _ in range(args.rounds):
        for name, fn in (("zmq_push_pull", _zmq), ("unix_seqpacket", _seqpacket)):
            d = tempfile.mkdtemp(prefix="rlbd", dir="/tmp")
            try:
                runs[name].append(fn(args.workers, args.envs, args.seconds, d))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            print(f"{name:>15}: {runs[name][-1]:>10,.0f} env steps/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["unix_seqpacket"] / med["zmq_push_pull"]
    print(
        f"{args.workers} workers x {args.envs} CartPoles, medians: ZMQ {med['zmq_push_pull']:,.0f}, "
        f"SEQPACKET {med['unix_seqpacket']:,.0f} env steps/s; SEQPACKET / ZMQ {ratio:.2f}x"
    )
    if args.json:
        print(json.dumps({"runs": runs, "median": med, "seqpacket_over_zmq": round(ratio, 3)}))


if __name__ == "__main__":
    main()

"""The worker's side of the control plane: its heartbeats (the Redis beat, and the start-up
thread that keeps both beats going while envs build) and the learner's exploration rates,
arriving over Redis pub/sub. Redis trouble never stops a worker: the watchdog decides what
silence means, and rates stay as they were until the next message."""

from __future__ import annotations

import threading
import time
from typing import Callable

import redis

from rlpipe import redis_client
from rlpipe.cadence import Every
from rlpipe.native.board import store_u64
from rlpipe.worker.exploration import EpsilonGreedy, unpack_epsilons

EPSILON_POLL_S = 0.5


class Heartbeat:
    """Application-level beat: a pipelined HSET of pid, generation, steps, RSS and time every
    interval."""

    def __init__(self, url: str, key: str, interval_s: float):
        self.client = redis_client.connect(url)
        self.key = key
        self.every = Every(interval_s)
        self.failures = 0
        self.lock = threading.Lock()  # the start-up beat thread and the main loop share it

    def maybe_beat(self, now: float, fields: Callable[[], dict]) -> None:
        with self.lock:
            if not self.every.due(now):
                return
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.hset(self.key, mapping=fields())
                pipe.execute()
            except redis.RedisError:
                self.failures += 1

    def close(self) -> None:
        self.client.close()


class StartupBeat:
    """Both beats while the main thread is busy starting (joining cgroups, waiting dormant,
    building envs, one of which may take longer than a beat interval to build): a worker
    beats from its first instant, so one frozen in its start-up (SIGSTOP, a simulator that
    deadlocks holding the GIL) falls silent and is judged on `heartbeat.timeout_s` like any
    other. A start-up that is alive but makes no progress is judged by the watchdog on the
    envs-built counter (H_BUILT) instead. Stops once every env is built; the step loop beats
    from then on."""

    def __init__(self, beat_addr: int, beat: Heartbeat, fields: Callable[[], dict], interval_s: float):
        self.beat_addr, self.beat, self.fields = beat_addr, beat, fields
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            store_u64(self.beat_addr, time.monotonic_ns())
            self.beat.maybe_beat(time.monotonic(), self.fields)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class EpsilonFeed:
    """The learner's exploration rates for this worker, from its Redis pub/sub channel, polled
    without blocking. redis-py reconnects and resubscribes after Redis comes back."""

    def __init__(self, client: redis.Redis, channel: str, env_lo: int, explore: EpsilonGreedy):
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.channel = channel
        self.env_lo = env_lo
        self.explore = explore
        self.subscribed = False
        self.every = Every(EPSILON_POLL_S)
        self.messages = 0  # rate messages applied (reported in worker_exit)

    def poll(self, now: float) -> None:
        if not self.every.due(now):
            return
        try:
            if not self.subscribed:
                self.pubsub.subscribe(self.channel)
                self.subscribed = True
            while (msg := self.pubsub.get_message(timeout=0)) is not None:
                if msg.get("type") == "message":
                    lo, eps = unpack_epsilons(msg["data"])
                    self.explore.set_epsilon(eps, lo=lo - self.env_lo)
                    self.messages += 1
        except (redis.RedisError, OSError):
            pass  # retried at the next poll; rates stay as they were meanwhile

    def close(self) -> None:
        try:
            self.pubsub.close()
        except (redis.RedisError, OSError):
            pass  # closing a connection to a Redis that is gone: nothing left to free

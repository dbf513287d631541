"""The learner-level heartbeat: decides which workers are dead and drives their replacement.

A worker is judged every `heartbeat.scan_interval_s` on two beats: the OS beat (a CLOCK_MONOTONIC
stamp its SIGUSR1 handler writes into shared memory) and the Redis beat (`ts` in its hash).
Silent on either past `heartbeat.timeout_s` means dead, whether the worker steps or is still
starting (a starting worker beats from its first instant). Slow-but-alive building has its own,
longer budget judged by progress: an awake worker whose envs-built counter (H_BUILT) has not
moved for `heartbeat.startup_timeout_s` is stalled and replaced the same way. When Redis
cannot be read, only the OS beat counts: Redis being down is not a dead worker. A dead worker
gets SIGTERM, SIGKILL after `term_grace_s`, and once reaped a new worker with a bumped
generation takes over its env ids. A worker that exits by itself (a crash,
or an RSS recycle) is replaced at the next check, without a scan.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass

import redis

from rlpipe.config import HeartbeatSpec
from rlpipe.lifecycle import fault_counts
from rlpipe.protocol import worker_key
from rlpipe.shm.layout import H_BUILT, H_OS_BEAT_NS, H_READY

log = logging.getLogger("rlpipe.watchdog")

# The training driver's cadence: its loop scans and reaps (Fleet.check_workers) once a second.
SUPERVISE_S = 1.0


def worst_heal_s(spec: HeartbeatSpec, tick_s: float = SUPERVISE_S) -> float:
    """The longest from a worker falling silent to its replacement's spawn, for a caller that
    scans and reaps every `tick_s` (and scans no closer than `scan_interval_s`): the silence is
    seen on the first tick past the timeout; the SIGKILL goes out on the first tick at least
    the grace after the SIGTERM, one tick more than the grace in ticks, as the SIGTERM's
    instant is taken a hair after its tick's (a chaos_lite run: term -> kill 2 s with a 1 s
    grace); the killed process is reaped a tick after that. The chaos runner stops injecting
    this long before the end, so each fault it injects is healed within the run."""
    tick = max(spec.scan_interval_s, tick_s)
    return spec.timeout_s + tick + (math.ceil(spec.term_grace_s / tick) + 1) * tick + tick


@dataclass
class Replacement:
    handle: object
    reason: str
    detail: dict
    term_at: float
    killed: bool = False


def redis_beat_times(client, run_id: str, worker_ids) -> dict[int, float]:
    """Each worker's last Redis beat (wall-clock ts) in one pipelined round trip; workers
    with no beat yet are left out. Raises redis.RedisError when Redis cannot answer."""
    pipe = client.pipeline(transaction=False)
    for w in worker_ids:
        pipe.hget(worker_key(run_id, w), "ts")
    return {w: float(v) for w, v in zip(worker_ids, pipe.execute()) if v is not None}


class Watchdog:
    def __init__(self, spec: HeartbeatSpec, run_id: str, redis_client: redis.Redis, lifecycle):
        self.spec = spec
        self.run_id = run_id
        self.redis = redis_client
        self.lifecycle = lifecycle
        self.next_scan = time.monotonic() + spec.scan_interval_s
        self.pending: dict[int, Replacement] = {}
        self.redis_down_scans = 0
        # Wall time since which Redis beats can be expected: a Redis that restarted (or came
        # back after being unreachable) holds no beats until each worker's next one.
        self.redis_epoch = time.time()
        self._redis_was_down = False
        # worker id -> (generation, envs built, monotonic time that count was first seen)
        self.progress: dict[int, tuple[int, int, float]] = {}
        # Oldest beats of the last scan over the workers it judged (TensorBoard health/).
        self.max_os_age_s: float | None = None
        self.max_redis_age_s: float | None = None

    def redis_restarted(self) -> None:
        self.redis_epoch = time.time()

    def _redis_beats(self, handles) -> dict[int, float] | None:
        try:
            beats = redis_beat_times(self.redis, self.run_id, [h.worker_id for h in handles])
        except redis.RedisError:
            # Down even after the client's retries: not a dead worker. The scan judges by
            # the OS beat alone, and Redis beats count again from its restart.
            self.redis_down_scans += 1
            self._redis_was_down = True
            return None
        if self._redis_was_down:
            self._redis_was_down = False
            self.redis_epoch = time.time()
        return beats

    def scan(self, handles, now: float) -> None:
        """Judge every live worker on both beats; start replacing the silent ones."""
        if now < self.next_scan:
            return
        self.next_scan = now + self.spec.scan_interval_s
        live = [h for h in handles if h.alive() and h.worker_id not in self.pending]
        beats = self._redis_beats(live)
        wall, mono_ns = time.time(), time.monotonic_ns()
        os_ages, redis_ages = [], []
        for h in live:
            if h.awake and h.views.load(H_READY) == 0 and self._stalled(h, now):
                continue
            limit = self.spec.timeout_s
            if now - h.spawned_at < limit:
                continue  # too young to be judged on silence
            os_age = (mono_ns - h.views.load(H_OS_BEAT_NS)) / 1e9
            # A worker with no beat since Redis (re)started is measured from that moment, one
            # that never beat at all from its spawn.
            redis_age = (
                None if beats is None else wall - max(beats.get(h.worker_id, 0.0), h.spawned_wall, self.redis_epoch)
            )
            os_ages.append(os_age)
            if redis_age is not None:
                redis_ages.append(redis_age)
            stale = [name for name, age in (("os", os_age), ("redis", redis_age)) if age is not None and age > limit]
            if stale:
                self._terminate(
                    h,
                    "heartbeat",
                    {
                        "stale": stale,
                        "os_beat_age_s": round(os_age, 2),
                        "redis_beat_age_s": None if redis_age is None else round(redis_age, 2),
                        "redis_reachable": beats is not None,
                        "limit_s": limit,
                    },
                )
        self.max_os_age_s = max(os_ages, default=None)
        self.max_redis_age_s = max(redis_ages, default=None)

    def health_scalars(self) -> dict[str, float]:
        """TensorBoard health/ figures: the oldest OS and Redis beats of the last scan (seconds;
        a worker is replaced past heartbeat.timeout_s), workers being replaced now, and worker
        restarts so far (lifecycle rows, every reason)."""
        out = {"health/workers_being_replaced": float(len(self.pending))}
        if self.max_os_age_s is not None:
            out["health/os_beat_age_max_s"] = self.max_os_age_s
        if self.max_redis_age_s is not None:
            out["health/redis_beat_age_max_s"] = self.max_redis_age_s
        try:
            out["health/worker_restarts"] = float(fault_counts(self.lifecycle.db_path)["worker_restarts"])
        except Exception:  # the log not readable this time: the next call has it
            pass
        return out

    def _stalled(self, h, now: float) -> bool:
        """Building but alive: replace it (True) when its envs-built count has not moved for
        startup_timeout_s since it was first seen awake at that count."""
        built = h.views.load(H_BUILT)
        gen, seen, since = self.progress.get(h.worker_id, (None, None, now))
        if gen != h.generation or seen != built:
            self.progress[h.worker_id] = (h.generation, built, now)
            return False
        if now - since < self.spec.startup_timeout_s:
            return False
        self._terminate(
            h,
            "startup_stalled",
            {
                "envs_built": built,
                "envs": h.n,
                "stalled_s": round(now - since, 2),
                "limit_s": self.spec.startup_timeout_s,
            },
        )
        return True

    def _terminate(self, h, reason: str, detail: dict) -> None:
        log.warning("worker %d (pid %d) silent (%s): SIGTERM", h.worker_id, h.proc.pid, reason)
        self.lifecycle.record(
            "worker_term", worker_id=h.worker_id, generation=h.generation, detail={"reason": reason, **detail}
        )
        try:
            os.kill(h.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.pending[h.worker_id] = Replacement(h, reason, detail, time.monotonic())

    def reap(self, now: float) -> list[Replacement]:
        """Advance replacements: SIGKILL after the grace, and return those whose process is
        gone (the caller respawns them)."""
        done = []
        for wid, rep in list(self.pending.items()):
            proc = rep.handle.proc
            if proc.is_alive() and not rep.killed and now - rep.term_at >= self.spec.term_grace_s:
                self.lifecycle.record(
                    "worker_kill", worker_id=wid, generation=rep.handle.generation, detail={"reason": rep.reason}
                )
                proc.kill()  # SIGKILL also ends a SIGSTOPped process
                rep.killed = True
            if not proc.is_alive():
                proc.join()
                done.append(self.pending.pop(wid))
        return done

"""The worker process: owns env ids [env_lo, env_hi), steps them on the learner's doorbell,
publishes obs on its shared-memory board, beats its heartbeat into Redis.

Started from a forkserver whose preload imported this module (numpy, gymnasium, zmq, redis;
never torch), so a new worker is a cheap fork of a warm interpreter.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from typing import Callable

import numpy as np
import redis
import zmq

from rlpipe import redis_client
from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import make_factory
from rlpipe.native.board import store_u64
from rlpipe.procs import pid_alive
from rlpipe.protocol import (ACT, RING, STOP_SLICE, epsilon_channel, reward_stats_key, slice_bounds,
                             worker_key)
from rlpipe.shm.layout import (H_AWAKE, H_BUILT, H_GENERATION, H_LC_DROPPED, H_OS_BEAT_NS, H_PID, H_READY,
                                H_STEPS, WorkerLayout, WorkerViews)
from rlpipe.shm.errorlog import ErrorLog
from rlpipe.shm.segment import Segment
from rlpipe.lifecycle import LifecycleClient
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.exploration import EpsilonGreedy, unpack_epsilons
from rlpipe.worker.rewardnorm import RewardNormalizer
from rlpipe.worker.stability import StabilityTracker
from rlpipe.worker.spec import WorkerSpec
from rlpipe.worker.stepper import Stepper

PR_SET_PDEATHSIG = 1
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
log = logging.getLogger("rlpipe.worker")


EXIT_RECYCLE = 75          # the worker left on purpose (RSS past worker.max_rss_mb): replace it


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when our parent (the forkserver, which itself exits when the
    driver dies) goes away; the doorbell timeout also checks the driver's pid directly."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _join_cgroups(paths: tuple[str, ...]) -> None:
    """First thing after fork: join the group's cgroup, so env construction is already
    under its limits."""
    pid = str(os.getpid())
    for path in paths:
        with open(path, "w") as f:
            f.write(pid)


def _scheduling(spec: WorkerSpec, lifecycle: LifecycleClient) -> None:
    if spec.cpu_affinity:
        os.sched_setaffinity(0, spec.cpu_affinity)
    if spec.sched_fifo:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(spec.sched_fifo))
        except PermissionError:
            lifecycle.event("worker_spawn", detail={"warning": "worker.sched_fifo needs "
                                                    "CAP_SYS_NICE; running with the default policy"})


class _Heartbeat:
    """Application-level beat: a pipelined HSET of pid, generation, steps, RSS and time every
    interval. Redis trouble never stops the worker; the watchdog decides what silence means."""

    def __init__(self, url: str, key: str, interval_s: float):
        self.client = redis_client.connect(url)
        self.key = key
        self.interval_s = interval_s
        self.next_at = 0.0
        self.failures = 0
        self.lock = threading.Lock()    # the start-up beat thread and the main loop share it

    def maybe_beat(self, now: float, fields: Callable[[], dict]) -> None:
        with self.lock:
            if now < self.next_at:
                return
            self.next_at = now + self.interval_s
            try:
                pipe = self.client.pipeline(transaction=False)
                pipe.hset(self.key, mapping=fields())
                pipe.execute()
            except redis.RedisError:
                self.failures += 1

    def close(self) -> None:
        self.client.close()


class _StartupBeat:
    """Both beats while the main thread is busy starting (joining cgroups, waiting dormant,
    building envs, one of which may take longer than a beat interval to build): a worker
    beats from its first instant, so one frozen in its start-up (SIGSTOP, a simulator that
    deadlocks holding the GIL) falls silent and is judged on `heartbeat.timeout_s` like any
    other. A start-up that is alive but makes no progress is judged by the watchdog on the
    envs-built counter (H_BUILT) instead. Stops once every env is built; the step loop beats
    from then on."""

    def __init__(self, beat_addr: int, beat: _Heartbeat, fields: Callable[[], dict], interval_s: float):
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


class _EpsilonFeed:
    """The learner's exploration rates for this worker, from its Redis pub/sub channel, polled
    without blocking. redis-py reconnects and resubscribes after Redis comes back."""

    def __init__(self, client: redis.Redis, channel: str, env_lo: int, explore: EpsilonGreedy):
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.channel = channel
        self.env_lo = env_lo
        self.explore = explore
        self.subscribed = False
        self.next_poll = 0.0
        self.messages = 0          # rate messages applied (reported in worker_exit)

    def poll(self, now: float) -> None:
        if now < self.next_poll:
            return
        self.next_poll = now + 0.5
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
            pass           # retried at the next poll; rates stay as they were meanwhile

    def close(self) -> None:
        try:
            self.pubsub.close()
        except (redis.RedisError, OSError):
            pass           # closing a connection to a Redis that is gone: nothing left to free


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES / 2**20


def run_worker(spec: WorkerSpec) -> None:
    _die_with_parent()
    segment = Segment.attach(spec.segment_name)
    n = len(spec.type_index)
    layout = WorkerLayout.build(n, spec.obs_keys, spec.cont_dim)
    views = WorkerViews(layout, segment, locked=spec.locked_board)
    beat_addr = views.header_addr + H_OS_BEAT_NS
    beat = _Heartbeat(spec.wiring.redis_url, worker_key(spec.wiring.run_id, spec.worker_id),
                      spec.heartbeat_redis_interval_s)
    startup_beat = _StartupBeat(beat_addr, beat, lambda: {
        "pid": os.getpid(), "generation": spec.generation, "steps": 0, "rss_mb": round(_rss_mb(), 1),
        "ts": time.time()}, min(spec.heartbeat_signal_interval_s, spec.heartbeat_redis_interval_s))
    if spec.cgroup_paths:
        # Join the dormant cgroup first thing; the driver may have woken the group meanwhile
        # (it raises H_AWAKE before moving us), so look again and follow it to `active`.
        _join_cgroups(spec.cgroup_paths)
        if views.load(H_AWAKE):
            _join_cgroups(spec.active_cgroup_paths)
    os.setpgrp()                                   # own process group: OS beats, no terminal Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the driver coordinates shutdown
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        from setproctitle import setproctitle
        setproctitle(f"rlpipe: worker {spec.worker_id}")
    except ImportError:
        pass

    views.store(H_PID, os.getpid())
    errors = ErrorLog(views.error_log_buf, create=False)      # the driver initialized it
    # OS-level beat: the handler stamps CLOCK_MONOTONIC into shared memory. It runs only when
    # this interpreter's main thread is alive and reaching bytecode boundaries (until every
    # env is built, the start-up beat thread stamps it too).
    signal.signal(signal.SIGUSR1, lambda *_: store_u64(beat_addr, time.monotonic_ns()))
    ctx = zmq.Context(io_threads=1)
    lifecycle = LifecycleClient(spec.wiring.lifecycle_endpoint, ctx, worker_id=spec.worker_id,
                                generation=spec.generation)
    _scheduling(spec, lifecycle)
    ready = ctx.socket(zmq.PUSH)
    ready.setsockopt(zmq.LINGER, 0)
    ready.setsockopt(zmq.SNDHWM, 1000)
    ready.setsockopt(zmq.SNDTIMEO, 1000)
    ready.connect(spec.wiring.ready_endpoint)
    act = ctx.socket(zmq.PULL)
    act.setsockopt(zmq.LINGER, 0)
    act.setsockopt(zmq.RCVHWM, 1000)
    act.connect(spec.act_endpoint)
    steps = 0
    next_signal = 0.0

    def heartbeats() -> None:
        nonlocal next_signal
        now = time.monotonic()
        if now >= next_signal:
            next_signal = now + spec.heartbeat_signal_interval_s
            os.killpg(0, signal.SIGUSR1)
            views.store(H_LC_DROPPED, lifecycle.dropped)    # the driver sums them into faults
        beat.maybe_beat(now, lambda: {"pid": os.getpid(), "generation": spec.generation,
                                      "steps": steps, "rss_mb": round(_rss_mb(), 1), "ts": time.time()})

    staging = [np.zeros((n,) + k.shape, dtype=k.dtype) for k in spec.obs_keys]
    ptrs = [s.ctypes.data for s in staging]
    row_strides = [s.strides[0] for s in staging]
    factories = [make_factory(node) for node in spec.type_nodes]
    id_lo = spec.env_id_offset + spec.env_lo     # global id of this worker's first env
    table = EnvTable(id_lo, spec.type_index, spec.type_names, spec.type_specs, factories,
                     spec.obs_keys, staging, spec.seed,
                     final_staging=[views.results[f"final_{k.name}"] for k in spec.obs_keys])
    stepper = Stepper(table, spec.threads, spec.step_timeout_s, views.results, tick=heartbeats)
    bounds = slice_bounds(n, spec.slices)
    exit_code = 0
    rnorm_key = reward_stats_key(spec.wiring.run_id, spec.worker_id)
    rnorm = None
    spawn_detail = {"pid": os.getpid(), "envs": n}
    if spec.reward_norm_mode != "off":
        rnorm = RewardNormalizer(n, spec.reward_norm_mode, spec.reward_norm_clip,
                                 spec.reward_norm_gamma, spec.type_index)
        try:    # a replaced worker (or a resumed run) continues its predecessor's statistics
            saved = beat.client.get(rnorm_key)
            if saved:
                rnorm.load(saved)
            spawn_detail["reward_count_restored"] = int(rnorm.count.sum())
        except (redis.RedisError, ValueError) as exc:
            lifecycle.event("worker_spawn", detail={"warning": f"reward statistics not restored: {exc}"})
    tracker = explore = feed = None
    if spec.scaling_enabled:
        tracker = StabilityTracker(n, window=spec.scaling_window)
        specs = [spec.type_specs[t] for t in spec.type_index]
        explore = EpsilonGreedy(np.array([s.action_kind == CONTINUOUS for s in specs]),
                                np.array([s.action_n for s in specs]),
                                seed=(spec.seed + 7919 * spec.worker_id if not spec.env_id_offset
                                      else (spec.seed, spec.worker_id, spec.env_id_offset)))
        feed = _EpsilonFeed(beat.client, epsilon_channel(spec.wiring.run_id, spec.worker_id), spec.env_lo,
                            explore)
    next_rnorm_sync = spec.reward_norm_sync_every * n
    explored_steps = 0

    def report_faults() -> None:
        """Each env fault: a lifecycle row and an ERROR record in the shared-memory error log."""
        for fault in table.faults:
            t = spec.type_index[fault.env_id - id_lo]
            fields = dict(env_id=fault.env_id, env_type=spec.type_names[t],
                          env_version=spec.wiring.type_versions[t])
            rec = fault.record
            lifecycle.event(fault.kind, detail={"error_type": rec["error_type"], "message": rec["message"],
                                                "stacktrace_hash": rec["stacktrace_hash"]}, **fields)
            lifecycle.event("env_rebuild", **fields)
            errors.write(rec)
        table.faults.clear()

    def publish(lo: int, hi: int) -> bool:
        rows = [p + lo * s for p, s in zip(ptrs, row_strides)]
        return views.board.publish(rows, row_strides, lo, hi - lo, spec.generation) >= 0

    try:
        lifecycle.event("worker_spawn", detail=spawn_detail)
        # A dormant group idles (in its throttled cgroup) until the driver wakes it: its envs
        # are built only then, so a hundred dormant groups cost next to nothing.
        while not views.load(H_AWAKE) and not stopping:
            if act.poll(100) and ACT.unpack(act.recv())[0] == STOP_SLICE:
                stopping.append(True)
            elif not pid_alive(spec.wiring.driver_pid):
                stopping.append(True)
            heartbeats()
        acts, results = views.actions, views.results
        disc, cont = acts["discrete"], acts["continuous"]
        exec_disc, exec_cont = results["exec_discrete"], results["exec_continuous"]
        timeout_ms = int(spec.doorbell_timeout_s * 1000)
        # Envs are built slice by slice, between doorbells: a slice rings (seq 0) as soon as
        # its own envs are up, so stepping starts while the rest of the group still builds.
        built = 0
        next_rss_check = 0.0
        while not stopping:
            if built < n and not act.poll(0):
                table.start(built)
                t = spec.type_index[built]
                lifecycle.event("env_create", env_id=id_lo + built, env_type=spec.type_names[t],
                                env_version=spec.wiring.type_versions[t])
                built += 1
                views.store(H_BUILT, built)
                for s, (lo, hi) in enumerate(bounds):
                    if hi == built:                  # slice s is complete: publish and ring
                        report_faults()
                        if not publish(lo, hi):
                            stopping.append(True)
                            break
                        ready.send(RING.pack(spec.worker_id, s, spec.generation, 0))
                if built == n:
                    views.store(H_READY, n)
                    startup_beat.stop()
                heartbeats()
                continue
            if act.poll(timeout_ms):
                s, seq = ACT.unpack(act.recv())
                if s == STOP_SLICE:
                    break
                lo, hi = bounds[s]
                if explore is not None:
                    ed, ec, blogp, explored = explore.apply(
                        lo, hi, disc[lo:hi], cont[lo:hi], acts["logp"][lo:hi], acts["alt_discrete"][lo:hi],
                        acts["alt_continuous"][lo:hi], acts["alt_logp"][lo:hi])
                    exec_disc[lo:hi], exec_cont[lo:hi], results["behaviour_logp"][lo:hi] = ed, ec, blogp
                    explored_steps += int(explored.sum())
                    actions = table.actions(lo, hi, exec_disc, exec_cont)
                else:
                    actions = table.actions(lo, hi, disc, cont)
                stepper.step(lo, hi, actions)
                raw = results["reward"][lo:hi].copy()
                results["reward_raw"][lo:hi] = raw
                if rnorm is not None:
                    results["reward"][lo:hi] = rnorm.normalize(
                        lo, hi, raw, results["terminated"][lo:hi] | results["truncated"][lo:hi])
                if tracker is not None:
                    ep_len = results["ep_len"][lo:hi]
                    tracker.update(lo, hi, raw, ep_len, cut=results["truncated"][lo:hi].astype(bool) & (ep_len == 0))
                    results["score"][lo:hi] = tracker.scores(lo, hi)
                if not publish(lo, hi):
                    break                      # replaced: a successor owns these env ids now
                steps += hi - lo
                views.store(H_STEPS, steps)
                try:
                    ready.send(RING.pack(spec.worker_id, s, spec.generation, seq + 1))
                except zmq.Again:
                    pass                       # the learner is gone or drowning; we check below
                if table.faults:
                    report_faults()
            elif not pid_alive(spec.wiring.driver_pid):
                break
            if views.load(H_GENERATION) != spec.generation:
                break
            heartbeats()
            if feed is not None:
                feed.poll(time.monotonic())
            if rnorm is not None and steps >= next_rnorm_sync:
                next_rnorm_sync = steps + spec.reward_norm_sync_every * n
                try:
                    beat.client.set(rnorm_key, rnorm.state())
                except redis.RedisError:
                    pass     # the next sync tries again
            now = time.monotonic()
            if spec.max_rss_mb and now >= next_rss_check:
                next_rss_check = now + 1.0
                if _rss_mb() > spec.max_rss_mb:
                    exit_code = EXIT_RECYCLE   # leave cleanly; the driver starts a fresh worker
                    lifecycle.event("worker_exit", detail={"reason": "rss", "rss_mb": round(_rss_mb())})
                    break
    finally:
        startup_beat.stop()
        if rnorm is not None:
            try:
                beat.client.set(rnorm_key, rnorm.state())
            except redis.RedisError:
                pass       # Redis down at exit: the statistics of the last sync stay in Redis
        if feed is not None:
            feed.close()
        stepper.close()
        table.close_all()
        exit_detail = {"steps": steps, "hung_steps": stepper.hung_total}
        if feed is not None:        # exploration rates received over pub/sub, and actions they changed
            exit_detail.update(eps_messages=feed.messages, explored_steps=explored_steps)
        lifecycle.event("worker_exit", detail=exit_detail)
        views.store(H_LC_DROPPED, lifecycle.dropped)
        lifecycle.close()
        beat.close()
        ready.close()
        act.close()
        ctx.term()
        errors.release()
        views.release()
        segment.close()
    if exit_code:
        os._exit(exit_code)

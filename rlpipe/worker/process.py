"""The worker process: owns env ids [env_lo, env_hi), steps them on the learner's doorbell,
publishes obs on its shared-memory board, beats its heartbeat into Redis.

Started from a forkserver whose preload imported this module (numpy, gymnasium, zmq, redis;
never torch), so a new worker is a cheap fork of a warm interpreter.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import redis
import zmq

from rlpipe.cadence import Every
from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import make_factory
from rlpipe.lifecycle import LifecycleClient
from rlpipe.native.board import store_u64
from rlpipe.outputlog import OutputLog
from rlpipe.procs import die_with_parent, pid_alive
from rlpipe.proctree import ENV_OOM_SCORE_ADJ, become_subreaper, kill_descendants, set_oom_score_adj
from rlpipe.protocol import epsilon_channel, reward_stats_key, slice_bounds, worker_key
from rlpipe.shm.doorbell import STOP_SLICE, DoorbellClient
from rlpipe.shm.errorlog import ErrorLog
from rlpipe.shm.layout import (
    H_ARMED,
    H_AWAKE,
    H_BUILT,
    H_ENV_LEAK,
    H_GENERATION,
    H_LC_DROPPED,
    H_OS_BEAT_NS,
    H_PID,
    H_READY,
    H_SLICE_LO,
    H_SLICE_SERIAL,
    H_STEPS,
    WorkerLayout,
    WorkerViews,
)
from rlpipe.shm.segment import Segment
from rlpipe.worker.control import EpsilonFeed, Heartbeat, StartupBeat
from rlpipe.worker.deadlines import TypeDeadlines
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.exploration import EpsilonGreedy
from rlpipe.worker.os_process import join_cgroups, rss_mb, set_scheduling
from rlpipe.worker.relief import Stalls
from rlpipe.worker.rewardnorm import RewardNormalizer
from rlpipe.worker.spec import WorkerSpec
from rlpipe.worker.stability import StabilityTracker
from rlpipe.worker.stepper import Stepper

EXIT_RECYCLE = 75  # the worker left on purpose (RSS past worker.max_rss_mb): replace it
RSS_CHECK_S = 1.0


class Worker:
    """One worker process, phase by phase: `attach` (segment, beats, cgroup, signals, sockets),
    `build` (env table, stepper, reward statistics, exploration), `wait_for_wake` (a dormant
    group idles), then `loop`: `build_next_env` between doorbells until every env is up,
    `step_slice` per doorbell, `beat` and `upkeep` after each; `stop` releases everything.
    Every attribute is set here; what a phase builds is None (or empty) until that phase.
    The loop reads its settings into locals once: the per-env work is the C step loop's."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        # what the per-slice path reads, as plain attributes (not through spec)
        self.worker_id, self.generation = spec.worker_id, spec.generation
        self.max_rss_mb = spec.worker.max_rss_mb
        self.n = len(spec.type_index)
        self.id_lo = spec.env_id_offset + spec.env_lo  # global id of this worker's first env
        self.stopping: list[bool] = []  # non-empty once asked to stop (SIGTERM, STOP, driver gone)
        self.exit_code = 0
        self.steps = 0
        self.built = 0  # envs built so far, in env order
        self.explored_steps = 0
        self.segment: Segment | None = None
        self.views: WorkerViews | None = None
        self.heartbeat: Heartbeat | None = None
        self.startup_beat: StartupBeat | None = None
        self.signal_every = Every(spec.heartbeat.signal_interval_s)
        self.rss_every = Every(RSS_CHECK_S)
        self.errors: ErrorLog | None = None
        self.zctx: zmq.Context | None = None
        self.lifecycle: LifecycleClient | None = None
        self.doorbell: DoorbellClient | None = None
        self.staging: list[np.ndarray] = []
        self.ptrs: list[int] = []
        self.row_strides: list[int] = []
        self.table: EnvTable | None = None
        self.stepper: Stepper | None = None
        self.bounds = slice_bounds(self.n, spec.worker.slices)
        self.rnorm: RewardNormalizer | None = None
        self.rnorm_key = reward_stats_key(spec.run_id, spec.worker_id)
        sync_every = spec.reward_norm.sync_every * self.n
        # first at the first step: every worker's key exists from the ramp on, so Redis's footprint
        # is its final size from the start (a slow type's worker would add it an hour in)
        self.rnorm_sync = Every(sync_every)
        self.tracker: StabilityTracker | None = None
        self.explore: EpsilonGreedy | None = None
        self.feed: EpsilonFeed | None = None
        self.spawn_detail = {"pid": os.getpid(), "envs": self.n}
        self.deadlines: TypeDeadlines | None = None
        self.stalls = Stalls(self)  # a stalled step off the slice's path
        self.slice_ctx: tuple = ()  # the main loop's slice in progress: (s, seq, lo, hi, actions)
        self.output: OutputLog | None = None

    def run(self) -> None:
        self.attach()
        self.build()
        try:
            self.lifecycle.event("worker_spawn", detail=self.spawn_detail)
            self.wait_for_wake()
            self.loop()
        finally:
            self.stop()
        if self.exit_code:
            os._exit(self.exit_code)

    # -- attach: the process joins its run ---------------------------------------------------
    def attach(self) -> None:
        spec = self.spec
        die_with_parent()
        if spec.output_log:  # before anything of ours or an env's can print
            header = f"worker {spec.worker_id} generation {spec.generation} pid {os.getpid()}"
            self.output = OutputLog(spec.output_log, header)
        become_subreaper()  # what our envs start stays in our tree, to be killed at `stop`
        set_oom_score_adj(ENV_OOM_SCORE_ADJ)  # an env's memory: ours to lose, never the driver's
        self.segment = Segment.attach(spec.segment_name)
        layout = WorkerLayout.build(self.n, spec.obs_keys, spec.cont_dim)
        self.views = views = WorkerViews(layout, self.segment, locked=spec.locked_board)
        beat_addr = views.header_addr + H_OS_BEAT_NS
        self.heartbeat = Heartbeat(
            spec.redis_url, worker_key(spec.run_id, spec.worker_id), spec.heartbeat.redis_interval_s
        )
        self.startup_beat = StartupBeat(
            beat_addr,
            self.heartbeat,
            lambda: {
                "pid": os.getpid(),
                "generation": spec.generation,
                "steps": 0,
                "rss_mb": round(rss_mb(), 1),
                "ts": time.time(),
            },
            min(spec.heartbeat.signal_interval_s, spec.heartbeat.redis_interval_s),
        )
        if spec.cgroup_paths:
            # Join the dormant cgroup first thing; the driver may have woken the group meanwhile
            # (it raises H_AWAKE before moving us), so look again and follow it to `active`.
            join_cgroups(spec.cgroup_paths)
            if views.load(H_AWAKE):
                join_cgroups(spec.active_cgroup_paths)
        os.setpgrp()  # own process group: OS beats, no terminal Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver coordinates shutdown
        stopping = self.stopping
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        try:
            from setproctitle import setproctitle

            setproctitle(f"rlpipe: worker {spec.worker_id}")
        except ImportError:
            pass

        views.store(H_PID, os.getpid())
        self.errors = ErrorLog(views.error_log_buf, create=False)  # the driver initialized it
        # OS-level beat: the handler stamps CLOCK_MONOTONIC into shared memory. It runs only when
        # this interpreter's main thread is alive and reaching bytecode boundaries (until every
        # env is built, the start-up beat thread stamps it too).
        signal.signal(signal.SIGUSR1, lambda *_: store_u64(beat_addr, time.monotonic_ns()))
        self.zctx = zmq.Context(io_threads=1)
        self.lifecycle = LifecycleClient(
            spec.lifecycle_endpoint, self.zctx, worker_id=spec.worker_id, generation=spec.generation
        )
        set_scheduling(spec.worker.cpu_affinity, spec.worker.sched_fifo, self.lifecycle)
        self.doorbell = DoorbellClient(spec.doorbell_segment, views, len(self.bounds))

    # -- build: what stepping needs (envs themselves are built one by one in the loop) --------
    def build(self) -> None:
        spec, n, views = self.spec, self.n, self.views
        self.staging = [np.zeros((n,) + k.shape, dtype=k.dtype) for k in spec.obs_keys]
        self.ptrs = [s.ctypes.data for s in self.staging]
        self.row_strides = [s.strides[0] for s in self.staging]
        factories = [make_factory(node) for node in spec.type_nodes]
        self.table = EnvTable(
            self.id_lo,
            spec.type_index,
            spec.type_names,
            spec.type_specs,
            factories,
            spec.obs_keys,
            self.staging,
            spec.seed,
            final_staging=[views.results[f"final_{k.name}"] for k in spec.obs_keys],
            final_all=spec.final_obs_all_ends,
            crash_backoff=spec.worker.crash_backoff,
        )
        timeout_s = spec.worker.step_timeout_s
        self.deadlines = TypeDeadlines(spec.type_index, len(spec.type_names), timeout_s, views) if timeout_s else None
        self.stepper = Stepper(
            self.table,
            spec.worker.threads,
            spec.worker.step_timeout_s,
            views.results,
            tick=self.beat,
            armed=views.word_array(H_ARMED),
            deadlines=self.deadlines,
            # a detached env's rows are cuts with no fault record, as a parked env's: both or neither
            on_stall=self.stalls.on_stall if self.deadlines is not None and spec.worker.crash_backoff else None,
        )
        if spec.reward_norm.mode != "off":
            self.rnorm = RewardNormalizer(
                n, spec.reward_norm.mode, spec.reward_norm.clip, spec.reward_norm.gamma, spec.type_index
            )
            try:  # a replaced worker (or a resumed run) continues its predecessor's statistics
                saved = self.heartbeat.client.get(self.rnorm_key)
                if saved:
                    self.rnorm.load(saved)
                self.spawn_detail["reward_count_restored"] = int(self.rnorm.count.sum())
            except (redis.RedisError, ValueError) as exc:
                self.lifecycle.event("worker_spawn", detail={"warning": f"reward statistics not restored: {exc}"})
        if spec.scaling.enabled:
            self.tracker = StabilityTracker(n, window=spec.scaling.window)
            specs = [spec.type_specs[t] for t in spec.type_index]
            self.explore = EpsilonGreedy(
                np.array([s.action_kind == CONTINUOUS for s in specs]),
                np.array([s.action_n for s in specs]),
                seed=(
                    spec.seed + 7919 * spec.worker_id
                    if not spec.env_id_offset
                    else (spec.seed, spec.worker_id, spec.env_id_offset)
                ),
            )
            self.feed = EpsilonFeed(
                self.heartbeat.client, epsilon_channel(spec.run_id, spec.worker_id), spec.env_lo, self.explore
            )

    # -- wake --------------------------------------------------------------------------------
    def wait_for_wake(self) -> None:
        """A dormant group idles (in its throttled cgroup) until the driver wakes it: its envs
        are built only then, so a hundred dormant groups cost next to nothing."""
        doorbell, views, stopping = self.doorbell, self.views, self.stopping
        while not views.load(H_AWAKE) and not stopping:
            act = doorbell.take(100)
            if act is not None and act[0] == STOP_SLICE:  # (no actions come before a first ring)
                stopping.append(True)
            elif not pid_alive(self.spec.driver_pid):
                stopping.append(True)
            self.beat()

    # -- the loop ----------------------------------------------------------------------------
    def loop(self) -> None:
        """Envs are built slice by slice, one between any two doorbells (not only when none waits:
        a busy driver starved the build, tests/test_worker_loop.py): a slice rings (seq 0) as soon
        as its own envs are up, so stepping starts while the rest of the group still builds."""
        doorbell, views, stopping, n = self.doorbell, self.views, self.stopping, self.n
        generation, driver_pid = self.generation, self.spec.driver_pid
        timeout_ms = int(self.spec.worker.doorbell_timeout_s * 1000)
        while not stopping:
            act = doorbell.take(0 if self.built < n else timeout_ms)
            if self.built < n:
                self.build_next_env()
                if act is None or stopping:
                    continue
            if act is not None:
                s, seq = act
                if s == STOP_SLICE or not self.step_slice(s, seq):
                    break
            elif not pid_alive(driver_pid):
                break
            if views.load(H_GENERATION) != generation:
                break
            self.beat()
            if not self.upkeep():
                break

    def build_next_env(self) -> None:
        """Build one env; publish and ring each slice it completes."""
        spec, built = self.spec, self.built
        self.table.start(built)
        t = spec.type_index[built]
        self.lifecycle.event(
            "env_create", env_id=self.id_lo + built, env_type=spec.type_names[t], env_version=spec.type_versions[t]
        )
        self.built = built = built + 1
        self.views.store(H_BUILT, built)
        for s, (lo, hi) in enumerate(self.bounds):
            if hi == built:  # slice s is complete: publish and ring
                self.report_faults()
                if not self.publish(lo, hi):
                    self.stopping.append(True)
                    break
                self.doorbell.ring(s, 0)
        if built == self.n:
            self.views.store(H_READY, self.n)
            self.startup_beat.stop()
        self.beat()

    def step_slice(self, s: int, seq: int) -> bool:
        """One doorbell: act (exploring if scaling is on), step the slice's envs, write rewards
        and scores, publish the obs and ring back. False when this worker was replaced."""
        lo, hi = self.bounds[s]
        actions = self.slice_actions(lo, hi)
        self.slice_ctx = (s, seq, lo, hi, actions)
        if not self.step_rows(lo, hi, actions):
            self.stalls.take_back()  # a step stalled: a relief finished the slice and kept the loop going
            return not self.stopping
        return self.after_step(s, seq, lo, hi)

    def step_rows(self, lo: int, hi: int, actions: list) -> bool:
        """The main thread steps envs [lo, hi): False when one stalled and was detached."""
        self.views.store(H_SLICE_LO, lo)  # with H_ARMED: the env being stepped, should we die in it
        self.views.store(H_SLICE_SERIAL, self.stepper.serial)
        return self.stepper.step(lo, hi, actions)

    def slice_actions(self, lo: int, hi: int) -> list:
        """The actions of envs [lo, hi) as their envs take them (epsilon-greedy if scaling is on)."""
        acts, results = self.views.actions, self.views.results
        if self.explore is not None:
            self.explored_steps += self.explore.apply_slice(lo, hi, acts, results)
            return self.table.actions(lo, hi, results["exec_discrete"], results["exec_continuous"])
        return self.table.actions(lo, hi, acts["discrete"], acts["continuous"])

    def after_step(self, s: int, seq: int, lo: int, hi: int) -> bool:
        """The slice's rewards and scores, its obs published, its ring; False once replaced."""
        views, table = self.views, self.table
        results = views.results
        if self.deadlines is not None:
            self.deadlines.observe(lo, hi, results["step_ms"][lo:hi])
        raw = results["reward"][lo:hi].copy()
        results["reward_raw"][lo:hi] = raw
        if self.rnorm is not None:
            results["reward"][lo:hi] = self.rnorm.normalize(
                lo, hi, raw, results["terminated"][lo:hi] | results["truncated"][lo:hi]
            )
        tracker = self.tracker
        if tracker is not None:
            ep_len = results["ep_len"][lo:hi]
            tracker.update(lo, hi, raw, ep_len, cut=results["truncated"][lo:hi].astype(bool) & (ep_len == 0))
            tracker.scores(lo, hi, out=results["score"][lo:hi])
        if not self.publish(lo, hi):
            return False  # replaced: a successor owns these env ids now
        self.steps += hi - lo
        views.store(H_STEPS, self.steps)
        self.doorbell.ring(s, seq + 1)
        if table.faults:
            self.report_faults()
        return True

    def publish(self, lo: int, hi: int) -> bool:
        """The staged obs rows [lo, hi) onto the board; False once our generation is revoked."""
        rows = [p + lo * s for p, s in zip(self.ptrs, self.row_strides)]
        return self.views.board.publish(rows, self.row_strides, lo, hi - lo, self.generation) >= 0

    def report_faults(self) -> None:
        """Each env fault: a lifecycle row and an ERROR record in the shared-memory error log."""
        spec, table = self.spec, self.table
        for fault in table.faults:
            t = spec.type_index[fault.env_id - self.id_lo]
            fields = dict(env_id=fault.env_id, env_type=spec.type_names[t], env_version=spec.type_versions[t])
            rec = fault.record
            detail = {
                "error_type": rec["error_type"],
                "message": rec["message"],
                "stacktrace_hash": rec["stacktrace_hash"],
            }
            if fault.backoff_s:
                detail["backoff_s"] = fault.backoff_s  # a crash loop: parked this long before the rebuild
            self.lifecycle.event(fault.kind, detail=detail, **fields)
            self.lifecycle.event("env_rebuild", **fields)
            self.errors.write(rec)
        table.faults.clear()

    # -- beat and upkeep ---------------------------------------------------------------------
    def beat(self) -> None:
        """Both heartbeats when due: SIGUSR1 to our process group (the handler stamps the OS
        beat) and the Redis beat. Also the stepper's tick while a slow step runs."""
        now = time.monotonic()
        if self.output is not None:
            self.output.check()
        if self.signal_every.due(now):
            os.killpg(0, signal.SIGUSR1)
            self.views.store(H_LC_DROPPED, self.lifecycle.dropped)  # the driver sums them into faults
        self.heartbeat.maybe_beat(now, self._beat_fields)

    def _beat_fields(self) -> dict:
        return {
            "pid": os.getpid(),
            "generation": self.generation,
            "steps": self.steps,
            "rss_mb": round(rss_mb(), 1),
            "ts": time.time(),
        }

    def upkeep(self) -> bool:
        """After each turn: take new exploration rates, sync reward statistics to Redis, and
        check our RSS. False when the RSS limit says to leave (the driver starts a fresh worker)."""
        if self.feed is not None:
            self.feed.poll(time.monotonic())
        if self.rnorm is not None and self.rnorm_sync.due(self.steps):
            try:
                self.heartbeat.client.set(self.rnorm_key, self.rnorm.state())
            except redis.RedisError:
                pass  # the next sync tries again
        if self.rss_every.due(time.monotonic()):
            self.views.store(H_ENV_LEAK, self.table.leaked_bytes())
            max_rss_mb = self.max_rss_mb
            if max_rss_mb and rss_mb() > max_rss_mb:
                self.exit_code = EXIT_RECYCLE
                self.lifecycle.event("worker_exit", detail={"reason": "rss", "rss_mb": round(rss_mb())})
                return False
        return True

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Save reward statistics, close envs and sockets, report the exit, unmap the segment."""
        self.startup_beat.stop()
        if self.table is not None and self.table.faults:
            self.report_faults()  # e.g. the failed builds of an env that ended this worker
        if self.rnorm is not None:
            try:
                self.heartbeat.client.set(self.rnorm_key, self.rnorm.state())
            except redis.RedisError:
                pass  # Redis down at exit: the statistics of the last sync stay in Redis
        if self.feed is not None:
            self.feed.close()
        self.stepper.close()
        self.table.close_all()
        orphans = kill_descendants()  # whatever the envs started and left running
        exit_detail = {"steps": self.steps, "hung_steps": self.stepper.hung_total, "env_processes_killed": orphans}
        if self.feed is not None:  # exploration rates received over pub/sub, and actions they changed
            exit_detail.update(eps_messages=self.feed.messages, explored_steps=self.explored_steps)
        self.lifecycle.event("worker_exit", detail=exit_detail)
        self.views.store(H_LC_DROPPED, self.lifecycle.dropped)
        self.lifecycle.close()
        self.heartbeat.close()
        self.doorbell.close()
        self.zctx.term()
        self.errors.release()
        self.views.release()
        self.segment.close()


def run_worker(spec: WorkerSpec) -> None:
    """The process entry point (a module-level function, so forkserver and spawn can pickle it)."""
    Worker(spec).run()

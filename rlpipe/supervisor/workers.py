"""Worker processes as seen from the driver: segment, doorbell socket, process, generation."""
from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time

import numpy as np
import zmq

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.shm.layout import H_AWAKE, H_GENERATION, H_MAGIC, MAGIC, WorkerLayout, WorkerViews
from rlpipe.shm.errorlog import ErrorLog
from rlpipe.shm.segment import Segment, segment_name
from rlpipe.protocol import ACT, STOP_SLICE, slice_bounds
from rlpipe.worker.process import run_worker
from rlpipe.worker.spec import RunWiring, WorkerSpec

WORKER_PRELOAD = ["rlpipe.worker.process"]


def worker_context(start_method: str, env_modules: list[str]):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # Workers fork from a server that has already imported numpy, gymnasium, zmq, redis and
        # the mix's env modules (never torch): a new worker costs a fork, and those pages are
        # shared until written.
        ctx.set_forkserver_preload(WORKER_PRELOAD + env_modules)
    return ctx


def group_ranges(env_count: int, group_size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + group_size, env_count)) for lo in range(0, env_count, group_size)]


class WorkerHandle:
    def __init__(self, worker_id: int, env_lo: int, env_hi: int, spec: RunSpec, plan: MixPlan,
                 wiring: RunWiring, zctx: zmq.Context, act_endpoint: str):
        self.worker_id = worker_id
        self.env_lo, self.env_hi = env_lo, env_hi
        self.n = env_hi - env_lo
        self.spec = spec
        self.plan = plan
        self.wiring = wiring
        self.run_id = wiring.run_id
        self.layout = WorkerLayout.build(self.n, plan.obs_keys, plan.actions.cont_dim)
        self.bounds = slice_bounds(self.n, spec.worker.slices)
        # env type index of each slice's envs (the learner's per-round lookups, made once)
        self.slice_types = [plan.env_type[env_lo + lo:env_lo + hi].astype(np.int64) for lo, hi in self.bounds]
        self.act_endpoint = act_endpoint
        self.act = zctx.socket(zmq.PUSH)
        self.act.setsockopt(zmq.LINGER, 0)
        self.act.setsockopt(zmq.SNDHWM, 64)
        self.act.bind(act_endpoint)
        self.generation = 0
        self.segment: Segment | None = None
        self.views: WorkerViews | None = None
        self.proc = None
        self.spawned_at = 0.0
        self.awake = False
        self.error_log: ErrorLog | None = None
        self.on_retire = None                      # called with the handle before a segment goes
        self.parked: list = []                     # rings of a dormant group, served on wake
        self.slice_seq = [0] * len(self.bounds)    # last step seq per slice (steps per env)

    def _new_segment(self) -> None:
        """A fresh segment per generation: a replaced writer keeps only a dead mapping."""
        old = self.segment
        if old is not None:
            self.views.store(H_GENERATION, self.generation)   # revoke: the old writer's publishes fail
            if self.on_retire is not None:
                self.on_retire(self)                           # last chance to read the old error log
            self.error_log.release()
            self.views.release()
        name = segment_name(self.run_id, f"w{self.worker_id}g{self.generation}")
        self.segment = Segment.create(name, self.layout.size)
        self.views = WorkerViews(self.layout, self.segment, locked=self.spec.buffer.sync == "lock")
        self.views.store(H_MAGIC, MAGIC)
        self.views.store(H_GENERATION, self.generation)
        self.error_log = ErrorLog(self.views.error_log_buf, create=True)
        if self.spec.buffer.sync == "lock":
            self.views.board.init_locks(self.n)
        if old is not None:
            old.unlink()
            old.close()

    def worker_spec(self, cgroup_paths: list[str], active_paths: list[str]) -> WorkerSpec:
        """The one place a WorkerSpec is built: the run's settings and plan, its wiring, and
        this worker's own fields (its current generation and segment)."""
        spec, plan, w = self.spec, self.plan, self.spec.worker
        return WorkerSpec(
            wiring=self.wiring, worker_id=self.worker_id, generation=self.generation, env_lo=self.env_lo,
            type_index=plan.env_type[self.env_lo:self.env_hi].copy(), segment_name=self.segment.name,
            act_endpoint=self.act_endpoint, cgroup_paths=tuple(cgroup_paths),
            active_cgroup_paths=tuple(active_paths),
            type_names=plan.names, type_nodes=tuple(t.node for t in spec.env_types), type_specs=plan.specs,
            obs_keys=plan.obs_keys, cont_dim=plan.actions.cont_dim, locked_board=spec.buffer.sync == "lock",
            env_id_offset=spec.env_id_offset, seed=spec.run.seed,
            slices=w.slices, threads=w.threads, step_timeout_s=w.step_timeout_s, max_rss_mb=w.max_rss_mb,
            cpu_affinity=w.cpu_affinity, sched_fifo=w.sched_fifo, doorbell_timeout_s=w.doorbell_timeout_s,
            heartbeat_redis_interval_s=spec.heartbeat.redis_interval_s,
            heartbeat_signal_interval_s=spec.heartbeat.signal_interval_s,
            scaling_enabled=spec.scaling.enabled, scaling_window=spec.scaling.window,
            reward_norm_mode=spec.reward_norm.mode, reward_norm_clip=spec.reward_norm.clip,
            reward_norm_sync_every=spec.reward_norm.sync_every, reward_norm_gamma=spec.learner.gamma)

    def spawn(self, ctx, cgroup_paths: list[str], active_paths: list[str]) -> None:
        proc = self.prepare(ctx, cgroup_paths, active_paths)
        proc.start()
        self.started(proc)

    def prepare(self, ctx, cgroup_paths: list[str], active_paths: list[str]):
        """A new generation's segment and its (not yet started) process: `spawn` without the
        start, for `BackgroundStarts`. Until `started`, the handle has no process: every check
        of a live worker (supervision, watchdog, chaos, wakes' cgroup moves) passes it by."""
        self.generation += 1
        self._new_segment()
        self.views.store(H_AWAKE, int(self.awake))
        self.parked = []
        self.slice_seq = [0] * len(self.bounds)
        self.spawned_awake = self.awake        # its spawn -> ready time is a build time, not a wait
        return ctx.Process(target=run_worker, args=(self.worker_spec(cgroup_paths, active_paths),),
                           name=f"rlpipe-worker-{self.worker_id}", daemon=False)

    def started(self, proc) -> None:
        self.proc = proc
        self.spawned_at = time.monotonic()
        self.spawned_wall = time.time()

    def ring(self, slice_index: int, seq: int) -> bool:
        try:
            self.act.send(ACT.pack(slice_index, seq), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False     # no live peer: the watchdog deals with the worker, not the learner

    def request_stop(self) -> None:
        for _ in range(len(self.bounds) + 1):
            try:
                self.act.send(ACT.pack(STOP_SLICE, 0), zmq.NOBLOCK)
            except zmq.Again:
                break

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def close(self) -> None:
        self.act.close()
        if self.error_log is not None:
            self.error_log.release()
            self.error_log = None
        if self.views is not None:
            self.views.release()
            self.views = None
        if self.segment is not None:
            self.segment.unlink()
            self.segment.close()
            self.segment = None


class BackgroundStarts:
    """Starts prepared worker processes in a thread. A forkserver start is a round trip (the
    server forks, the child's pid comes back): tens of milliseconds each on a busy machine,
    which the driver's loop would otherwise pay one after another between inference rounds
    (a hundred dormant workers took most of day4's start-up that way)."""

    def __init__(self, threads: int = 4):
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        # several round trips in flight: each mostly waits for the server to be scheduled
        self._threads = [threading.Thread(target=self._run, name=f"worker-starts-{i}", daemon=True)
                         for i in range(threads)]
        self.pending = 0              # submitted, not yet collected by `finished`

    def submit(self, handle: WorkerHandle, proc) -> None:
        if not self._threads[0].is_alive():
            for t in self._threads:
                t.start()
        self._todo.put((handle, proc))
        self.pending += 1

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            handle, proc = item
            if self._closing:
                self._done.put((handle, None, None))        # never started
                continue
            try:
                proc.start()
                self._done.put((handle, proc, None))
            except BaseException as exc:                    # raised in the driver's thread
                self._done.put((handle, None, exc))

    def finished(self) -> list[tuple[WorkerHandle, object, BaseException | None]]:
        """(handle, started process or None, the start's exception or None) since the last call."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.pending -= len(out)
        return out

    def close(self) -> list[tuple[WorkerHandle, object, BaseException | None]]:
        """Start nothing more; wait for the start in flight; the rest as `finished`."""
        self._closing = True
        if self._threads[0].is_alive():
            for _ in self._threads:
                self._todo.put(None)
            for t in self._threads:
                t.join()
        return self.finished()


def stop_workers(handles: list[WorkerHandle], grace_s: float = 5.0) -> None:
    """Ask politely (STOP doorbell), then SIGTERM, then SIGKILL; reap everything."""
    for h in handles:
        if h.alive():
            h.request_stop()
    deadline = time.monotonic() + grace_s
    for h in handles:
        if h.proc is not None:
            h.proc.join(max(0.0, deadline - time.monotonic()))
    for h in handles:
        if h.alive():
            h.proc.terminate()
    deadline = time.monotonic() + 2.0
    for h in handles:
        if h.proc is not None:
            h.proc.join(max(0.0, deadline - time.monotonic()))
            if h.proc.is_alive():
                h.proc.kill()
                h.proc.join(5)

"""Worker processes as seen from the driver: segment, doorbell words, process, generation."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time

import numpy as np

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.proctree import stop_signals_blocked
from rlpipe.protocol import reward_stats_key, slice_bounds
from rlpipe.shm.doorbell import DoorbellServer, send_stop, wake_worker
from rlpipe.shm.errorlog import ErrorLog
from rlpipe.shm.layout import H_AWAKE, H_GENERATION, H_MAGIC, MAGIC, WorkerLayout, WorkerViews
from rlpipe.shm.segment import Segment, segment_name
from rlpipe.worker.process import run_worker
from rlpipe.worker.spec import WorkerSpec

# zygote first: the forkserver is a subreaper before anything it imports could start a process
WORKER_PRELOAD = ["rlpipe.worker.zygote", "rlpipe.worker.process"]


def worker_context(start_method: str, env_modules: list[str]):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # Workers fork from a server that has already imported numpy, gymnasium, zmq, redis and
        # the mix's env modules (never torch): a new worker costs a fork, and those pages are
        # shared until written.
        ctx.set_forkserver_preload(WORKER_PRELOAD + env_modules)
        # Started here, with the stop signals held, rather than by the first worker's start:
        # it inherits the mask, and its first preload module ignores them before Python could
        # turn a terminal's Ctrl-C into a KeyboardInterrupt in its imports (rlpipe.proctree).
        # The resource tracker first: the forkserver's start starts it too, and its own start
        # unblocks both signals in the calling thread when it is done (not restoring the mask),
        # which left the forkserver's start unprotected.
        from multiprocessing import forkserver, resource_tracker

        resource_tracker.ensure_running()
        with stop_signals_blocked():
            forkserver.ensure_running()
    return ctx


def group_ranges(env_count: int, group_size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + group_size, env_count)) for lo in range(0, env_count, group_size)]


def reward_stats_keys(spec: RunSpec, run_id: str) -> list[str]:
    """The Redis key of each worker group's reward statistics (known before any worker exists)."""
    n_workers = -(-spec.env_count // spec.groups.size)
    return [reward_stats_key(run_id, k) for k in range(n_workers)]


class WorkerHandle:
    def __init__(
        self,
        worker_id: int,
        env_lo: int,
        env_hi: int,
        spec: RunSpec,
        plan: MixPlan,
        run_id: str,
        doorbells: DoorbellServer,
        slot_lo: int,
    ):
        self.worker_id = worker_id
        self.env_lo, self.env_hi = env_lo, env_hi
        self.n = env_hi - env_lo
        self.spec = spec
        self.plan = plan
        self.run_id = run_id
        self.layout = WorkerLayout.build(self.n, plan.obs_keys, plan.actions.cont_dim)
        self.bounds = slice_bounds(self.n, spec.worker.slices)
        self.doorbells = doorbells  # reads the done words of this handle's current segment
        self.slot_lo = slot_lo  # its slices' first slot there
        self.generation = 0  # next_generation makes the first process generation 1
        self.segment: Segment | None = None
        self.views: WorkerViews | None = None
        self.proc = None
        self.spawned_at = 0.0
        self.spawned_wall = 0.0
        self.spawned_awake = False
        self.awake = False
        self.error_log: ErrorLog | None = None
        self.on_retire = None  # called with the handle before a segment goes
        self.on_attach = None  # called with the handle once a new segment is in place
        # per slice (views into the fleet's per-slot arrays once it has started the handle):
        self.slice_seq = np.zeros(len(self.bounds), dtype=np.int64)  # the last ring's step (steps per env)
        self.parked = np.full(len(self.bounds), -1, dtype=np.int64)  # a dormant group's ring, served on wake
        self.respawn_at: float | None = None  # a crash-looping group's next start (Fleet._replace)

    def _new_segment(self) -> None:
        """A fresh segment per generation: a replaced writer keeps only a dead mapping."""
        old = self.segment
        n_slices = len(self.bounds)
        if old is not None:
            self.doorbells.detach(self.worker_id, self.slot_lo, n_slices)  # its late rings go unread
            self.views.store(H_GENERATION, self.generation)  # revoke: the old writer's publishes fail
            wake_worker(self.views)  # a writer still waiting for actions sees it now
            if self.on_retire is not None:
                self.on_retire(self)  # last chance to read the old error log
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
        self.doorbells.attach(self.worker_id, self.slot_lo, n_slices, self.views)
        if self.on_attach is not None:
            self.on_attach(self)  # before the old segment goes: nothing may point into it after
        if old is not None:
            old.unlink()
            old.close()

    def next_generation(self) -> None:
        """A fresh segment and doorbell state for the next process of this group."""
        self.generation += 1
        self._new_segment()
        self.views.store(H_AWAKE, int(self.awake))
        self.parked[:] = -1
        self.slice_seq[:] = 0

    @property
    def replacement(self) -> bool:
        """This generation replaced an earlier process of the group (the first is generation 1)."""
        return self.generation > 1

    @property
    def stepped(self) -> bool:
        """This generation has stepped its first slice (its `worker_ready` row): a replacement
        still building is not."""
        return self.slice_seq[0] > 0

    def process(self, ctx, worker_spec: WorkerSpec):
        """This generation's process, not yet started (`worker_spec` names its segment and
        generation).
        Until `started`, the handle has no process: every check of a live worker (supervision,
        watchdog, chaos, wakes' cgroup moves) passes it by."""
        self.spawned_awake = self.awake  # its spawn -> ready time is a build time, not a wait
        return ctx.Process(target=run_worker, args=(worker_spec,), name=f"rlpipe-worker-{self.worker_id}", daemon=False)

    def started(self, proc) -> None:
        self.proc = proc
        self.spawned_at = time.monotonic()
        self.spawned_wall = time.time()

    def request_stop(self) -> bool:
        """STOP over the doorbell; False if the worker cannot hear it (not attached yet)."""
        return send_stop(self.views)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def pin(self, cpus: tuple[int, ...]) -> None:
        """Every thread of the running process onto `cpus`: the main thread first, so a thread
        it starts from then on inherits them, then the others. A process or thread that exits
        meanwhile is passed by: a next generation starts pinned (Fleet.worker_cpus)."""
        pid = self.proc.pid
        try:
            os.sched_setaffinity(pid, cpus)
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return
        for tid in tids:
            if tid != pid:
                try:
                    os.sched_setaffinity(tid, cpus)
                except OSError:
                    pass

    def close(self) -> None:
        if self.segment is not None:
            self.doorbells.detach(self.worker_id, self.slot_lo, len(self.bounds))
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
    server forks, the child's pid comes back), which the driver's loop would otherwise pay
    one after another between inference rounds (what that cost day4: docs/benchmarks.md,
    "Figures behind the code's comments")."""

    def __init__(self, threads: int = 4):
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        # several round trips in flight: each mostly waits for the server to be scheduled
        self._threads = [
            threading.Thread(target=self._run, name=f"worker-starts-{i}", daemon=True) for i in range(threads)
        ]
        self.pending = 0  # submitted, not yet collected by `finished`

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
                self._done.put((handle, None, None))  # never started
                continue
            try:
                proc.start()
                self._done.put((handle, proc, None))
            except BaseException as exc:  # raised in the driver's thread
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


def stop_workers(handles: list[WorkerHandle], grace_s: float) -> None:
    """Ask politely (STOP doorbell; SIGTERM, which a worker also ends on cleanly, to one not
    connected yet), wait up to `grace_s` (heartbeat.term_grace_s), then SIGTERM, then SIGKILL;
    reap everything."""
    for h in handles:
        if h.alive() and not h.request_stop():
            h.proc.terminate()
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

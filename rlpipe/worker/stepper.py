"""Stepping a slice with a deadline per env step (`worker.step_timeout_s`).

Two ways, picked by `worker.threads`:

- **One thread (the default): inline.** The main thread steps the slice in the C StepLoop
  (rlpipe/native/steploop.pyx) under the env harness's `InlineDeadline`
  (rlpipe/envs/harness.py, the one owner of SIGALRM and StepTimeout). A watcher thread wakes
  every eighth of the deadline. When it finds the same step still running past the deadline,
  it sends SIGALRM to the main thread, whose handler raises StepTimeout inside that step.
  This covers hangs in Python code, and in sleeps, sockets, locks and other interruptible
  waits. A step stuck in native code that
  ignores signals also stops the OS beat, so the watchdog replaces the worker. Arming the
  deadline is one C store per step. Handing each slice to a helper thread instead, and a
  Condition round trip per env, cost several times a CartPole step (benchmarks/step_path.py;
  the figures are in docs/benchmarks.md).
- **Several threads: a pool.** This is for envs that release the GIL: renderers, physics
  engines, I/O. Helpers claim env after env of the slice under a plain lock and step them at
  once, through EnvTable.step_one. The main thread sleeps until the slice is done, or until
  a poll finds a step past its deadline. That step is abandoned: its thread is left to
  finish or hang on its own and is never listened to again, and a fresh helper takes the
  rest of the slice. This also covers native code that releases the GIL and ignores signals.

Either way the env of a step past its deadline is rebuilt by id. Its neighbours go on. Inline,
they do not even wait for the deadline: a step past its type's shorter stall budget is
detached and another thread runs the worker's loop meanwhile (rlpipe/worker/relief.py).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from rlpipe.envs.harness import InlineDeadline, timeout
from rlpipe.worker.envtable import EnvTable

HUNG = object()  # placeholder result of an abandoned step


class _Job:
    """One slice: envs [lo, hi), claimed one by one by the helpers."""

    def __init__(self, lo: int, hi: int, actions: list):
        self.lo, self.hi = lo, hi
        self.actions = actions
        self.next = lo
        self.pending = hi - lo
        self.results: list = [None] * (hi - lo)
        self.done = threading.Event()


class _StepThread(threading.Thread):
    def __init__(self, owner: "Stepper", seen_serial: int):
        super().__init__(name="step", daemon=True)
        self.owner = owner
        self.seen_serial = seen_serial  # the last slice this helper took (see wait_job)
        self.current: int | None = None  # env index being stepped (read by the main thread)
        self.started = 0.0
        self.abandoned = False

    def run(self) -> None:
        owner, lock, table = self.owner, self.owner.lock, self.owner.table
        while True:
            job = owner.wait_job()
            if job is None:
                return
            while True:
                with lock:
                    if self.abandoned:
                        return
                    i = job.next
                    if i >= job.hi:
                        break
                    job.next = i + 1
                    self.current, self.started = i, time.monotonic()
                result = table.step_one(i, job.actions[i - job.lo])
                with lock:
                    if self.abandoned:
                        return  # the main thread gave up on this step long ago
                    self.current = None
                    job.results[i - job.lo] = result
                    job.pending -= 1
                    if job.pending == 0:
                        job.done.set()


class Stepper:
    """Steps slices of `table`, writing each step's results into `results` (the worker's
    shared result arrays: reward, terminated, truncated, ep_return, ep_len)."""

    def __init__(
        self,
        table: EnvTable,
        threads: int,
        timeout_s: float | None,
        results: dict,
        tick: Callable[[], None] = lambda: None,
        armed: np.ndarray | None = None,
        deadlines=None,
        on_stall: Callable[[int, float], None] | None = None,
    ):
        self.table = table
        self.timeout_s = timeout_s
        self.results = results
        self.tick = tick  # called while the pool steps (heartbeats)
        self.closed = False
        # The inline deadline needs the main thread (signal handlers run only there).
        self.inline = threads == 1 and threading.current_thread() is threading.main_thread()
        self.deadline = None
        self.loop = None
        self.serial = 0  # step serials are never reused (see InlineDeadline)
        if self.inline:
            if timeout_s is not None:
                self.deadline = InlineDeadline(
                    timeout_s,
                    armed=armed,
                    limit_of=deadlines.limit_of if deadlines is not None else None,
                    poll_s=deadlines.poll_s if deadlines is not None else None,
                    stall_of=deadlines.stall_of if deadlines is not None and on_stall is not None else None,
                    on_stall=on_stall,
                )
                self.deadline.start()
            armed = self.deadline.armed if self.deadline is not None else armed
            armed = np.zeros(1, dtype=np.int64) if armed is None else armed
            self.loop = table.step_loop(results, armed)
        self.lock = threading.Lock()  # pool: guards claims, results and abandonment
        self.posted = threading.Condition(threading.Lock())  # pool: wakes idle helpers per slice
        self.job: _Job | None = None
        self.job_serial = 0
        self.threads = [] if self.inline else [self._spawn() for _ in range(threads)]

    @property
    def hung_total(self) -> int:
        return self.table.hangs

    def step(self, lo: int, hi: int, actions: list) -> bool:
        """Step envs [lo, hi); a step past the deadline is cut and its env rebuilt. False when
        a step stalled and was detached: another thread finished the slice (worker.relief),
        and `loop.halted` says how the stalled step ended."""
        if self.inline:
            self.serial = self.loop.run(lo, hi, actions, self.serial)
            return self.loop.halted is None
        self.table.finish(lo, hi, self._step_pool(lo, hi, actions), self.results)
        return True

    # -- pool ---------------------------------------------------------------------------------
    def _spawn(self) -> _StepThread:
        # A helper spawned mid-slice (replacing an abandoned one) joins the posted slice.
        t = _StepThread(self, self.job_serial - 1 if self.job is not None else self.job_serial)
        t.start()
        return t

    def wait_job(self) -> _Job | None:
        """A helper's wait for the next slice it has not worked on yet (None: closing)."""
        me = threading.current_thread()
        with self.posted:
            while not self.closed and (self.job is None or me.seen_serial == self.job_serial):
                self.posted.wait()
            if self.closed:
                return None
            me.seen_serial = self.job_serial
            return self.job

    def _step_pool(self, lo: int, hi: int, actions: list) -> list:
        hung: list[int] = []
        poll = min(0.25, self.timeout_s / 4) if self.timeout_s else 0.25
        job = _Job(lo, hi, actions)
        with self.posted:
            self.job, self.job_serial = job, self.job_serial + 1
            self.posted.notify_all()
        while not job.done.wait(poll):
            now = time.monotonic()
            with self.lock:
                for k, t in enumerate(self.threads):
                    if t.current is not None and self.timeout_s and now - t.started > self.timeout_s:
                        t.abandoned = True
                        hung.append(t.current)
                        job.results[t.current - lo] = HUNG
                        job.pending -= 1
                        self.threads[k] = self._spawn()  # takes the rest of this slice
                if job.pending == 0:
                    break
            self.tick()
        with self.posted:
            self.job = None
        for i in hung:
            self.table.abandon(i, timeout(self.timeout_s, "worker.step_timeout_s"), interrupted=False)
        return job.results

    def close(self) -> None:
        if self.deadline is not None:
            self.deadline.close()
        with self.posted:
            self.closed = True
            self.posted.notify_all()

"""Stepping a slice with a deadline per env step.

Steps run in helper threads so the worker's main thread can notice a step that has run past
`worker.step_timeout_s`: that env is abandoned (its thread is left to finish or hang on its
own and is never listened to again), rebuilt by id, and the rest of the slice goes on in a
fresh thread. `threads` > 1 steps several envs of the slice at once (envs that release the
GIL: renderers, physics engines, I/O). With no timeout and one thread, the slice is stepped
inline in the main thread, the cheapest path.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from rlpipe.worker.envtable import EnvTable

HUNG = object()        # placeholder result of an abandoned step


class _Job:
    def __init__(self, lo: int, hi: int, actions: list):
        self.lo, self.hi = lo, hi
        self.actions = actions
        self.next = lo
        self.pending = hi - lo
        self.results: list = [None] * (hi - lo)


class _StepThread(threading.Thread):
    def __init__(self, owner: "Stepper"):
        super().__init__(name="step", daemon=True)
        self.owner = owner
        self.current: int | None = None
        self.started = 0.0
        self.abandoned = False

    def run(self) -> None:
        owner, cv = self.owner, self.owner.cv
        while True:
            with cv:
                while not owner.closed and (owner.job is None or owner.job.next >= owner.job.hi):
                    cv.wait()
                if owner.closed:
                    return
                job = owner.job
                i = job.next
                job.next += 1
                self.current, self.started = i, time.monotonic()
            result = owner.table.step_one(i, job.actions[i - job.lo])
            with cv:
                if self.abandoned:
                    return            # the main thread gave up on this step long ago
                self.current = None
                job.results[i - job.lo] = result
                job.pending -= 1
                if job.pending == 0:
                    cv.notify_all()


class Stepper:
    def __init__(self, table: EnvTable, threads: int, timeout_s: float | None,
                 tick: Callable[[], None] = lambda: None):
        self.table = table
        self.timeout_s = timeout_s
        self.tick = tick                       # called while waiting (heartbeats)
        self.inline = timeout_s is None and threads == 1
        self.cv = threading.Condition()
        self.job: _Job | None = None
        self.closed = False
        self.hung_total = 0
        self.threads = [] if self.inline else [self._spawn() for _ in range(threads)]

    def _spawn(self) -> _StepThread:
        t = _StepThread(self)
        t.start()
        return t

    def step(self, lo: int, hi: int, actions: list) -> tuple[list, list[int]]:
        """Step envs [lo, hi); returns (results, env indices abandoned as hung)."""
        if self.inline:
            return [self.table.step_one(i, a) for i, a in zip(range(lo, hi), actions)], []
        hung: list[int] = []
        poll = min(0.25, self.timeout_s / 4) if self.timeout_s else 0.25
        with self.cv:
            job = self.job = _Job(lo, hi, actions)
            self.cv.notify_all()
            while job.pending > 0:
                self.cv.wait(poll)
                if job.pending == 0:
                    break
                now = time.monotonic()
                for k, t in enumerate(self.threads):
                    if t.current is not None and self.timeout_s and now - t.started > self.timeout_s:
                        t.abandoned = True
                        hung.append(t.current)
                        job.results[t.current - lo] = HUNG
                        job.pending -= 1
                        self.threads[k] = self._spawn()
                self.cv.release()
                try:
                    self.tick()
                finally:
                    self.cv.acquire()
            self.job = None
        self.hung_total += len(hung)
        return job.results, hung

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()

"""A stalled step off its slice's path (issue 49): one env blocking in `step` must not hold
the other envs of its worker.

The worker steps a slice inline, on its main thread (rlpipe/native/steploop.pyx): an env that
blocks holds the thread, and with it every other env of the worker, until its deadline cuts it.
Here, when the step in progress passes its type's stall budget (rlpipe/worker/deadlines.py:
ten times the longest step seen of the type, at least 0.25 s), the deadline's watcher detaches
it and starts a `Relief` thread, which takes the worker's loop over while the main thread stays
in the stalled step:

1. the stalled env's row becomes a cut step (truncated, no episode, a neutral obs: what a
   parked env publishes, so the learner never gets an obs that is not one) and its env is
   marked detached;
2. the relief steps the rest of the slice on its own C loop, publishes it and rings, then
   serves the worker's doorbells as the main loop would, every detached env's row a cut;
3. the main thread comes back when the step does, or when its deadline cuts it (SIGALRM still
   reaches the main thread), and takes the loop back at the relief's next turn: the env
   starts a new episode (a reset), or is rebuilt as any hung env is (`env_hang`, its backoff),
   and its first row after is a cut carrying its fresh obs.

The relief has no SIGALRM (only the main thread gets signals): should an env hang in the
relief's own step, the main thread, back from its own, waits that env's deadline out and then
abandons it as the pool does (the thread keeps the old env object and is never listened to
again), finishing the relief's slice itself. A worker killed during a relief is attributed to
the env stalled on the main thread.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from rlpipe.envs.harness import StepTimeout, timeout
from rlpipe.procs import pid_alive
from rlpipe.shm.doorbell import STOP_SLICE
from rlpipe.shm.layout import H_GENERATION
from rlpipe.worker.deadlines import POLL_S

POLL_MS = int(POLL_S * 1000)  # the relief's doorbell wait: how soon it sees the main thread is back
DETACHED, REJOINING = 1, 2  # the table's `detached` states (rlpipe/native/steploop.pyx)


class Relief(threading.Thread):
    def __init__(self, worker, ctx: tuple, i: int, began: float):
        super().__init__(name="relief", daemon=True)
        self.worker = worker
        self.ctx = ctx  # the main loop's slice that stalled: (s, seq, lo, hi, actions)
        self.i = i  # the stalled env (row)
        self.began = began  # (monotonic) when the stalled step was first seen in progress
        self.cut_rows = 0  # the stalled env's rows the relief published (as cuts)
        self.steps_before = worker.steps + i - ctx[2]  # (the slice's envs before it stepped before it stalled)
        self.loop = worker.table.step_loop(worker.views.results, np.zeros(1, dtype=np.int64))
        self.serial = 0
        self.current: tuple | None = None  # the relief's slice in progress: (s, seq, lo, hi, actions, start, serial0)
        self.handback = threading.Event()
        self.done = threading.Event()
        self.abandoned = False

    # -- the relief thread -------------------------------------------------------------------
    def run(self) -> None:
        w = self.worker
        try:
            s, seq, lo, hi, actions = self.ctx
            w.table.detached[self.i] = DETACHED
            w.table.neutral(self.i)
            self.loop.cut(self.i)
            if not self._step(s, seq, lo, hi, actions, self.i + 1):
                return
            while not self.handback.is_set() and not w.stopping and self._turn():
                pass
        finally:
            self.done.set()

    def _step(self, s: int, seq: int, lo: int, hi: int, actions: list, start: int) -> bool:
        """Envs [start, hi) of slice s on the relief's loop, then the slice's results out.
        False when the relief was abandoned (its step hung) or the worker is stopping."""
        self.current = (s, seq, lo, hi, actions, start, self.serial)
        self.cut_rows += lo <= self.i < hi
        self.serial = self.loop.run(start, hi, actions[start - lo :], self.serial)
        if self.loop.halting:
            return False  # abandoned: the main thread finished this slice
        self.current = None
        if not self.worker.after_step(s, seq, lo, hi):
            self.worker.stopping.append(True)
            return False
        return True

    def _turn(self) -> bool:
        """One turn of the worker's loop (Worker.loop's, every env built or not)."""
        w = self.worker
        act = w.doorbell.take(POLL_MS)
        if act is not None:
            s, seq = act
            if s == STOP_SLICE:
                w.stopping.append(True)
                return False
            lo, hi = w.bounds[s]
            if not self._step(s, seq, lo, hi, w.slice_actions(lo, hi), lo):
                return False
        elif not pid_alive(w.spec.driver_pid):
            w.stopping.append(True)
            return False
        if w.views.load(H_GENERATION) != w.generation:
            w.stopping.append(True)
            return False
        w.beat()
        if not w.upkeep():
            w.stopping.append(True)
            return False
        return True

    # -- the main thread, back from the stalled step -----------------------------------------
    def take_back(self, outcome) -> tuple[float, int]:
        """The main loop's stalled step ended (`outcome`: True when it came back, else its
        exception): wait for the relief's turn to end, or abandon its own hung step, then deal
        with the stalled env. Returns how long it stalled and the worker's steps meanwhile."""
        w = self.worker
        self.handback.set()
        seen, since = 0, time.monotonic()
        while not self.done.wait(POLL_S):
            serial, now = int(self.loop.armed_serial()), time.monotonic()
            if serial != seen:
                seen, since = serial, now
            elif serial and self.current is not None:
                s, seq, lo, hi, actions, start, serial0 = self.current
                k = start + serial - serial0 - 1
                limit = w.deadlines.limit_of_env(k)
                if now - since > limit and self.loop.detach(serial):
                    self._abandon(k, limit)
                    break
        i, table = self.i, w.table
        seconds = time.monotonic() - self.began
        if outcome is True:
            w.deadlines.observe_stall(i, seconds)  # a step its type can take
            table.rejoin(i)
        elif isinstance(outcome, StepTimeout):
            table.abandon(i, outcome, interrupted=True)
        else:
            table.recover(i, outcome)
        table.detached[i] = REJOINING
        return seconds, w.steps - self.steps_before - self.cut_rows

    def _abandon(self, k: int, limit: float) -> None:
        """The relief's own step of env k hung past its deadline: the thread is left to it, and
        the main thread finishes the relief's slice."""
        w = self.worker
        self.abandoned = True
        s, seq, lo, hi, actions, _start, _serial0 = self.current
        w.table.abandon(k, timeout(round(limit, 3), "worker.step_timeout_s"), interrupted=False)
        w.stepper.loop.cut(k)  # published with the fresh obs its rebuild wrote
        w.stepper.loop.rearm()
        w.step_rows(k + 1, hi, actions[k + 1 - lo :])
        w.after_step(s, seq, lo, hi)


class Stalls:
    """The worker's side: detach a stalled step and start a relief (on the deadline's watcher
    thread), take the loop back and report the stall (on the main thread)."""

    def __init__(self, worker):
        self.worker = worker
        self.relief: Relief | None = None  # running the loop while the main thread is in a stalled step

    def on_stall(self, serial: int, began: float) -> None:
        """The watcher: the main loop's step `serial`, in progress since `began`, is past its
        stall budget."""
        w = self.worker
        i = w.deadlines.env_of(serial)
        if i < 0 or self.relief is not None:
            return
        # set before the detach: once detached, the main thread may be back and asking for it
        self.relief = relief = Relief(w, w.slice_ctx, i, began)
        if w.stepper.loop.detach(serial):
            relief.start()
        else:
            self.relief = None  # it came back meanwhile

    def take_back(self) -> None:
        """The main thread is back from its stalled step: the loop is its own again."""
        w = self.worker
        relief = self.relief
        outcome = w.stepper.loop.halted
        w.stepper.loop.rearm()
        seconds, steps_beside = relief.take_back(outcome)
        self.relief = None
        i = relief.i
        t = w.spec.type_index[i]
        detail = {
            "stalled_s": round(seconds, 3),
            "stall_budget_s": round(float(w.deadlines.stall_s[t]), 3),
            "ended": "returned" if outcome is True else type(outcome).__name__,
            "steps_beside": steps_beside,  # the env steps this worker's other envs made meanwhile
        }
        w.lifecycle.event(
            "env_stall",
            env_id=w.id_lo + i,
            env_type=w.spec.type_names[t],
            env_version=w.spec.type_versions[t],
            detail=detail,
        )
        if w.table.faults:
            w.report_faults()  # the hang, when its deadline cut it

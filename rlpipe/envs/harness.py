"""One env under the contract, with a deadline: how every part of rlpipe builds, resets, steps
and closes an env.

Four callers, one set of rules:

- the worker (rlpipe/worker/envtable.py, stepper.py): builds, resets and closes through here;
  its steps run in the C step loop (rlpipe/native/steploop.pyx) or `EnvTable.step_one`, the
  hot-path forms of `step`, under `InlineDeadline` or the stepper's pool;
- day0 (rlpipe/envs/validate.py): every call timed and watched from another thread
  (`WatchedCalls`);
- the random-return probe (rlpipe/envs/random_return.py) and eval (rlpipe/learner/play.py): one
  env after the other on the main thread under SIGALRM (`AlarmDeadline`; the probe's steps,
  eval's every call).

What cuts an episode is the same everywhere: an exception of the env, a contract violation
(`ContractViolation`, from the checks of rlpipe/envs/contract.py), or a call past its deadline
(`StepTimeout`). `CUTS` names the three for an `except`. (day0 records each as a fault; a
call it watches hang fails the type.)

SIGALRM has one owner, this module: the worker's inline deadline and the alarm deadline both
raise StepTimeout from its handler, so a process uses one of them at a time.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from rlpipe.envs.contract import DISCRETE, EnvSpec, check_obs, check_step


class StepTimeout(BaseException):
    """An env call ran past its deadline. A BaseException, like KeyboardInterrupt, so that when
    it is raised inside the call (from a SIGALRM handler) neither the env's own `except
    Exception` nor a caller's crash handler takes it for an ordinary error."""


# What ends an env's episode as cut: a crash or a contract violation (both Exceptions), or a
# deadline. Catch these, never BaseException (KeyboardInterrupt and SystemExit go on).
CUTS = (Exception, StepTimeout)


def timeout(limit_s: float, setting: str) -> StepTimeout:
    """The StepTimeout of a call past `limit_s`, naming the setting that set it."""
    return StepTimeout(f"step exceeded {setting}={limit_s}")


# -- deadlines ----------------------------------------------------------------------------------
class NoDeadline:
    """Calls run as long as they take (the worker's builds and resets: its start-up beat keeps
    it alive meanwhile)."""

    @contextmanager
    def call(self, stage: str) -> Iterator[None]:
        yield


NO_DEADLINE = NoDeadline()


class AlarmDeadline:
    """Each call is cut at `limit_s`, or where the whole run of calls ends (`until`, a
    time.monotonic() instant), by SIGALRM raising StepTimeout inside it. For a player on the
    main thread (signal handlers run only there). Without either limit, or where the platform
    has no interval timer, calls are not cut. `close` restores the previous handler."""

    def __init__(self, limit_s: float | None = None, until: float | None = None):
        self.limit_s = limit_s if limit_s is not None else math.inf
        self.until = until if until is not None else math.inf
        self.armed = (limit_s is not None or until is not None) and hasattr(signal, "setitimer")
        self.stage = ""  # the call in progress, for the StepTimeout's message
        self._previous = signal.signal(signal.SIGALRM, self._on_alarm) if self.armed else None

    def _on_alarm(self, _signum, _frame) -> None:
        raise StepTimeout(
            f"a {self.stage} call ran past its deadline ({self.limit_s} s per call, or the end of the calls' budget)"
        )

    @contextmanager
    def call(self, stage: str) -> Iterator[None]:
        if not self.armed:
            yield
            return
        self.stage = stage
        signal.setitimer(signal.ITIMER_REAL, max(min(self.limit_s, self.until - time.monotonic()), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def close(self) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self.armed = False


class WatchedCalls:
    """Each call timed per stage, and the one in progress readable from another thread, which
    decides what a hang means (day0 abandons the type's thread). Calls are never cut here."""

    def __init__(self, stages: tuple[str, ...]):
        self.in_progress: tuple[str, float] | None = None  # (stage, perf_counter start)
        self.timings: dict[str, list[float]] = {stage: [] for stage in stages}  # ms per call

    @contextmanager
    def call(self, stage: str) -> Iterator[None]:
        self.in_progress = (stage, time.perf_counter())
        try:
            yield
        finally:
            start = self.in_progress[1]
            self.in_progress = None
            self.timings[stage].append((time.perf_counter() - start) * 1000.0)

    def overdue(self, limit_s: float) -> str | None:
        """The stage of a call running for more than `limit_s`, else None."""
        call = self.in_progress
        return call[0] if call is not None and time.perf_counter() - call[1] > limit_s else None


class InlineDeadline(threading.Thread):
    """The worker's inline deadline (worker.step_timeout_s) for a loop that writes the serial of
    the step in progress into `armed[0]` (0 between steps): the C step loop does, at the cost of
    one store. A watcher thread wakes every eighth of the deadline; the same serial seen for
    longer than the deadline gets SIGALRM to the main thread, and only that one: the handler
    raises StepTimeout only if the main thread is still in it."""

    def __init__(
        self,
        timeout_s: float,
        setting: str = "worker.step_timeout_s",
        armed: np.ndarray | None = None,
        limit_of: Callable[[int], float] | None = None,
        poll_s: float | Callable[[], float] | None = None,
        stall_of: Callable[[int], float] | None = None,
        on_stall: Callable[[int, float], None] | None = None,
    ):
        super().__init__(name="step-deadline", daemon=True)
        self.timeout_s = timeout_s
        self.setting = setting
        # the deadline of the step with this serial (a worker's: from its env type's measured
        # step time, rlpipe.worker.deadlines), never past timeout_s; None: timeout_s for all
        self.limit_of = limit_of
        # a step past its stall budget (shorter than its deadline) is handed to `on_stall` once,
        # with its serial and when it was first seen: the worker lets the rest of the slice go
        # on (rlpipe.worker.relief)
        self.stall_of = stall_of
        self.on_stall = on_stall
        # how long the watcher sleeps between looks; a callable is asked at each look (a
        # worker's follows its types' stall budgets: rlpipe.worker.deadlines.POLL_S)
        self.poll_s = poll_s if callable(poll_s) else lambda: poll_s or timeout_s / 8
        self.fired_limit = timeout_s
        # the loop's serial word: a worker's is in its shared segment (H_ARMED), where the
        # driver reads which env a dead worker was stepping
        self.armed = np.zeros(1, dtype=np.int64) if armed is None else armed
        self.fired = -1
        self.closed = threading.Event()
        self.main_ident = threading.main_thread().ident
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, _signum, _frame) -> None:
        armed = int(self.armed[0])
        if armed and armed == self.fired:
            raise timeout(round(self.fired_limit, 3), self.setting)

    def run(self) -> None:
        # A hang is cut between its limit and its limit + poll after it began.
        seen, since, limit, stall, stalled = 0, 0.0, self.timeout_s, self.timeout_s, -1
        while not self.closed.wait(self.poll_s()):
            armed, now = int(self.armed[0]), time.monotonic()
            if not armed or armed != seen:
                seen, since = armed, now
                limit = (
                    self.timeout_s if self.limit_of is None or not armed else min(self.timeout_s, self.limit_of(armed))
                )
                stall = limit if self.stall_of is None or not armed else min(limit, self.stall_of(armed))
            elif now - since > limit and self.fired != armed:
                self.fired, self.fired_limit = armed, limit
                signal.pthread_kill(self.main_ident, signal.SIGALRM)
            elif now - since > stall and stalled != armed and self.on_stall is not None:
                stalled = armed
                self.on_stall(armed, since)

    def close(self) -> None:
        self.closed.set()
        self.join()
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


# -- one env ------------------------------------------------------------------------------------
def build(factory: Callable, env_id: int, seed: int, deadline=NO_DEADLINE):
    """A new env for `env_id` from its type's factory (rlpipe.envs.registry.make_factory)."""
    with deadline.call("build"):
        return factory(env_id=env_id, seed=seed)


def reset(spec: EnvSpec, env, env_id: int, deadline=NO_DEADLINE) -> dict:
    """The env's first obs of an episode, checked against the contract."""
    with deadline.call("reset"):
        obs = env.reset(env_id)
    check_obs(spec, obs)
    return obs


def step(spec: EnvSpec, env, env_id: int, action, deadline=NO_DEADLINE) -> tuple[dict, float, bool, bool]:
    """One step, checked against the contract: (obs, reward, terminated, truncated) as a float
    and two bools. `action` is what the worker hands an env (rlpipe.envs.contract.EnvInterface.step)."""
    with deadline.call("step"):
        result = env.step(env_id, action)
    return check_step(spec, result)


def close(env, env_id: int, deadline=NO_DEADLINE, on_error: Callable[[Exception], None] | None = None) -> None:
    """Close the env (None: nothing to close). A failing close is the env's last fault, never
    the caller's: it goes to `on_error` when given, else it is dropped."""
    if env is None:
        return
    try:
        with deadline.call("close"):
            env.close(env_id)
    except Exception as exc:
        if on_error is not None:
            on_error(exc)


def random_action(spec: EnvSpec, rng: np.random.Generator):
    """A uniformly random action in the worker's format: an int in [0, action_n) for a discrete
    type, float32 in [-1, 1] on each continuous dim (what the learner's mode=random draws)."""
    if spec.action_kind == DISCRETE:
        return int(rng.integers(spec.action_n))
    return rng.uniform(-1.0, 1.0, spec.action_n).astype(np.float32)

"""The chaos faults (conf/chaos/), one class each: the setting under `chaos.` that turns it on,
when it is due, how it is injected, and which lifecycle row says the run healed from it.

`FAULTS` is the registry. The chaos runner (rlpipe.supervisor.chaos) injects the faults its
tick drives; the driver's loop injects `FreezeDriver`; the recovery report
(rlpipe.lifecycle.recovery) judges every `chaos_inject` row by its fault's `healed_by`. A
new fault is a class here, listed in `FAULTS`, and its setting: a ChaosSpec field
(rlpipe/config.py) and its default, null, in conf/chaos/off.yaml (chaos=on starts from it).
tests/test_chaos_faults.py checks that every registered fault has one setting, off by
default, and a healing row the report can find.

Every injection is a `chaos_inject` row whose detail "what" names the fault, written before
the fault strikes, with the seconds into the run ("t").

This module imports nothing of rlpipe: the lifecycle package (which imports nothing else of
rlpipe but this) reads the faults' healing rules here, and the runner hands each injection
what it acts on (the `ChaosRun` below).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Optional, Protocol

log = logging.getLogger("rlpipe.chaos")


@dataclass(frozen=True)
class Healed:
    """Which lifecycle row says an injection healed: the first row of `kind` at or after it.
    newer_generation: of the injected worker's id with a higher generation (its replacement;
    an injection without a worker never heals); one_each: a row heals one injection only
    (one Redis recovery per Redis kill)."""

    kind: str
    newer_generation: bool = False
    one_each: bool = False

    def label(self, row: dict) -> str:
        """How the report names the healing row."""
        return f"{row['kind']} gen {row['generation']}" if self.newer_generation else row["kind"]


class ChaosRun(Protocol):
    """What an injection acts on, held by the runner (rlpipe.supervisor.chaos.Chaos)."""

    services: object  # the run's Services: `redis` (its `proc`), `await_worker_beats`

    def target(self, handles) -> object | None: ...  # a random awake, stepped worker not already hit
    def record(self, what: str, h=None, **detail) -> None: ...  # the `chaos_inject` row
    def t(self, now: float) -> float: ...  # seconds into the run, for the row
    def sigstop(self, pid: int) -> None: ...  # continued at teardown unless sigcont'ed
    def sigcont(self, pid: int) -> None: ...


class Fault:
    """A chaos fault. `setting` reads its key of the chaos spec (None: off); the runner builds
    the fault from the spec and the schedule's start when it is on, asks `due` every tick and
    then calls `inject`, and `struck` once it hit; `upkeep` runs every tick, also once
    injections stopped near the run's end."""

    what = ""  # the chaos_inject row's detail "what"
    healed_by: Healed
    costs_env_steps = False  # its down time is stepping lost (the report's lost_env_steps_est)
    in_loop = False  # injected by the driver's loop, not by the runner's tick

    @staticmethod
    def setting(chaos) -> Optional[float]:
        raise NotImplementedError

    def due(self, now: float) -> bool:
        raise NotImplementedError

    def struck(self, now: float) -> None:
        """The fault struck at `now`: the schedule moves on to its next time."""
        raise NotImplementedError

    def inject(self, run: ChaosRun, handles, now: float) -> bool:
        """Strike, if there is something to strike: whether it did."""
        raise NotImplementedError

    def upkeep(self, run: ChaosRun, now: float) -> None:
        """Follow-up work of an earlier injection (none by default)."""


class EveryFault(Fault):
    """Due every `setting` seconds, the first time that long after the schedule's start (the
    fleet up: rlpipe.supervisor.chaos), the next that long after it struck. A due fault with
    nothing to strike (every worker hit, stopped or still rebuilding) stays due and strikes at
    the first tick that has a target: skipped, it lost a whole interval, and a small run (3
    workers, each in turn struck or rebuilding) lost a good part of its schedule so."""

    def __init__(self, chaos, t0: float):
        self.every = self.setting(chaos)
        self.next_at = t0 + self.every

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def struck(self, now: float) -> None:
        self.next_at = now + self.every


class OnceFault(Fault):
    """Due once, `setting` seconds after the schedule's start."""

    def __init__(self, chaos, t0: float):
        self.at: float | None = t0 + self.setting(chaos)

    def due(self, now: float) -> bool:
        return self.at is not None and now >= self.at

    def struck(self, now: float) -> None:
        self.at = None


# A worker fault heals when the worker's replacement has stepped its envs once.
REPLACEMENT_READY = Healed("worker_ready", newer_generation=True)
# A Redis fault heals when every live worker has beaten into Redis again, not when the server
# merely answers a ping (the driver's `redis_recovered` row); each row heals one injection.
REDIS_RECOVERED = Healed("redis_recovered", one_each=True)


class KillWorker(EveryFault):
    """SIGKILL a random awake worker every chaos.kill_worker_every_s."""

    what = "kill_worker"
    healed_by = REPLACEMENT_READY
    costs_env_steps = True

    @staticmethod
    def setting(chaos) -> Optional[float]:
        return chaos.kill_worker_every_s

    def inject(self, run: ChaosRun, handles, now: float) -> bool:
        h = run.target(handles)
        if h is None:
            return False
        run.record(self.what, h, pid=h.proc.pid, signal="SIGKILL", t=run.t(now))
        os.kill(h.proc.pid, signal.SIGKILL)
        return True


class StopWorker(EveryFault):
    """SIGSTOP a random awake worker every chaos.stop_worker_every_s and leave it stopped: the
    watchdog must notice the silence and replace it."""

    what = "stop_worker"
    healed_by = REPLACEMENT_READY
    costs_env_steps = True

    @staticmethod
    def setting(chaos) -> Optional[float]:
        return chaos.stop_worker_every_s

    def inject(self, run: ChaosRun, handles, now: float) -> bool:
        h = run.target(handles)
        if h is None:
            return False
        run.record(self.what, h, pid=h.proc.pid, signal="SIGSTOP", t=run.t(now))
        run.sigstop(h.proc.pid)
        return True


class KillRedis(OnceFault):
    """SIGKILL the embedded redis-server once, chaos.kill_redis_at_s after the fleet is up (the
    driver restarts it: rlpipe.supervisor.services). A Redis kill costs no env steps: Redis
    down is not a dead worker."""

    what = "kill_redis"
    healed_by = REDIS_RECOVERED

    @staticmethod
    def setting(chaos) -> Optional[float]:
        return chaos.kill_redis_at_s

    def inject(self, run: ChaosRun, handles, now: float) -> bool:
        proc = run.services.redis.proc
        if proc is None or proc.poll() is not None:  # an external server, or down already
            return False
        run.record(self.what, pid=proc.pid, signal="SIGKILL", t=run.t(now))
        proc.kill()
        return True


class PauseRedis(OnceFault):
    """SIGSTOP the embedded redis-server once, chaos.pause_redis_at_s after the fleet is up, and
    SIGCONT it PAUSE_S later: every Redis call meanwhile times out, nothing restarts. Healed
    when every live worker has beaten into it again after the SIGCONT (`redis_recovered`, as
    a kill)."""

    what = "pause_redis"
    healed_by = REDIS_RECOVERED
    PAUSE_S = 3.0  # past a Redis client's 2 s timeout (rlpipe.redis_client): calls fail, not wait

    @staticmethod
    def setting(chaos) -> Optional[float]:
        return chaos.pause_redis_at_s

    def __init__(self, chaos, t0: float):
        super().__init__(chaos, t0)
        self.paused: tuple[int, float] | None = None  # (pid, when to continue it)

    def inject(self, run: ChaosRun, handles, now: float) -> bool:
        proc = run.services.redis.proc
        if proc is None or proc.poll() is not None:
            return False
        run.record(self.what, pid=proc.pid, signal="SIGSTOP", pause_s=self.PAUSE_S, t=run.t(now))
        run.sigstop(proc.pid)
        self.paused = (proc.pid, now + self.PAUSE_S)
        return True

    def upkeep(self, run: ChaosRun, now: float) -> None:
        if self.paused is not None and now >= self.paused[1]:
            run.sigcont(self.paused[0])
            self.paused = None
            run.services.await_worker_beats()


class FreezeDriver(Fault):
    """Block the driver's own loop for good chaos.freeze_driver_at_s after the run's first
    checkpoint, for the stall detector (rlpipe.supervisor.stall) to find; it ends the run for its
    supervisor to restart (the restart is a new run in the same log). Counted from the first
    checkpoint, not from the start or the first step, so the restart has one to resume from
    however long the start-up and the first update took (on a loaded machine the first update
    alone took 4 s, and a start froze before it), and a fast machine cannot finish the run
    first; a run that writes no checkpoint (learner.mode=random) never freezes.
    Only in a run that did not resume: the restart a supervisor makes with the same command
    line continues from the checkpoint instead of freezing again. The loop (Driver.loop) asks
    `due_at` and calls `freeze_driver`, so the stall detector's stack dump names the loop's own
    frame and then this one."""

    what = "freeze_driver"
    healed_by = Healed("driver_stall")
    in_loop = True

    @staticmethod
    def setting(chaos) -> Optional[float]:
        return chaos.freeze_driver_at_s

    @classmethod
    def due_at(cls, chaos, first_checkpoint: float, resumed: bool) -> float | None:
        at = cls.setting(chaos)
        return None if at is None or resumed else first_checkpoint + at

    @classmethod
    def freeze_driver(cls, lifecycle, t: float) -> None:
        """Block the calling thread (the driver's loop) for good, after its `chaos_inject` row
        (the stack dump's `in freeze_driver`)."""
        lifecycle.record("chaos_inject", detail={"what": cls.what, "t": round(t, 2)})
        log.warning("chaos: freezing the driver's loop at %.1f s", t)
        threading.Event().wait()


# In the order a tick injects them (one random generator picks every target: the order keeps
# a seed's schedule).
FAULTS: tuple[type[Fault], ...] = (KillWorker, StopWorker, KillRedis, PauseRedis, FreezeDriver)
BY_WHAT = {f.what: f for f in FAULTS}


def ticked_faults(chaos) -> list[type[Fault]]:
    """The faults the runner's tick injects that `chaos` turns on."""
    return [f for f in FAULTS if not f.in_loop and f.setting(chaos) is not None]

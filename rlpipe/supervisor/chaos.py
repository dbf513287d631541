"""Declarative fault injection (conf/chaos/): the run attacks itself on a schedule, and every
injection is a lifecycle row (`chaos_inject`) so recovery can be checked against it.

- kill_worker_every_s: SIGKILL a random awake worker;
- stop_worker_every_s: SIGSTOP a random awake worker and leave it stopped (the watchdog must
  notice the silence and replace it);
- kill_redis_at_s: SIGKILL the embedded redis-server once, this many seconds into the run;
- freeze_driver_at_s: the driver's own loop blocks for good this many seconds after it served
  its first env step (`freeze_driver`, called by the loop), for the stall detector
  (rlpipe.supervisor.stall) to find. Counted from the first step, not from the start, so a
  test can count on its checkpoints on a loaded machine too. Only in a run that did not
  resume: the restart a supervisor makes with the same command line continues from the
  checkpoint instead of freezing again.

Injections stop when less of the run is left than the watchdog needs to notice and heal a
fault (timeout + grace + two scans) plus the longest a worker of this run has taken from its
spawn to its first stepped slice (`heal_s`, which the driver raises as workers get ready), so
every injection of a finished run has its recovery.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import threading

from rlpipe.config import ChaosSpec
from rlpipe.procs import pid_alive

log = logging.getLogger("rlpipe.chaos")


def live_pids(pids: set[int]) -> set[int]:
    return {pid for pid in pids if pid_alive(pid)}


class Chaos:
    def __init__(self, spec: ChaosSpec, seed: int, t0: float, lifecycle, redis_service, pending: dict,
                 quiet_from: float | None = None):
        self.spec = spec
        self.lifecycle = lifecycle
        self.redis = redis_service
        self.pending = pending            # the watchdog's replacements under way: not targets
        self.rng = random.Random(seed)
        self.t0 = t0
        self.next_kill = t0 + spec.kill_worker_every_s if spec.kill_worker_every_s else None
        self.next_stop = t0 + spec.stop_worker_every_s if spec.stop_worker_every_s else None
        self.redis_at = t0 + spec.kill_redis_at_s if spec.kill_redis_at_s is not None else None
        self.stopped: set[int] = set()     # pids we SIGSTOPped (continued or killed at teardown)
        # No injections once too little run is left for the watchdog to see the fault healed.
        self.quiet_from = quiet_from
        self.heal_s = 0.0                  # longest spawn -> worker_ready seen in this run
        self.injected = 0

    def _target(self, handles):
        candidates = [h for h in handles if h.awake and h.alive() and h.worker_id not in self.pending
                      and h.proc.pid not in self.stopped]
        return self.rng.choice(candidates) if candidates else None

    def _record(self, what: str, h=None, **detail) -> None:
        self.injected += 1
        fields = dict(worker_id=h.worker_id, generation=h.generation) if h is not None else {}
        self.lifecycle.record("chaos_inject", detail={"what": what, **detail}, **fields)
        log.warning("chaos: %s %s", what, detail)

    def tick(self, handles, now: float) -> None:
        if self.quiet_from is not None and now >= self.quiet_from - self.heal_s:
            return
        if self.next_kill is not None and now >= self.next_kill:
            self.next_kill = now + self.spec.kill_worker_every_s
            h = self._target(handles)
            if h is not None:
                self._record("kill_worker", h, pid=h.proc.pid, signal="SIGKILL",
                             t=round(now - self.t0, 2))
                os.kill(h.proc.pid, signal.SIGKILL)
        if self.next_stop is not None and now >= self.next_stop:
            self.next_stop = now + self.spec.stop_worker_every_s
            h = self._target(handles)
            if h is not None:
                self._record("stop_worker", h, pid=h.proc.pid, signal="SIGSTOP",
                             t=round(now - self.t0, 2))
                # the stopped workers the watchdog has since killed are forgotten: a six-day run
                # stops thousands, and a reused pid must not be spared as "already stopped"
                self.stopped = live_pids(self.stopped) | {h.proc.pid}
                os.kill(h.proc.pid, signal.SIGSTOP)
        if self.redis_at is not None and now >= self.redis_at:
            self.redis_at = None
            proc = self.redis.proc
            if proc is not None and proc.poll() is None:
                self._record("kill_redis", pid=proc.pid, signal="SIGKILL", t=round(now - self.t0, 2))
                proc.kill()


def freeze_driver(lifecycle, t: float) -> None:
    """Block the calling thread (the driver's loop) for good, after a `chaos_inject` row:
    the frame the stall detector's stack dump names."""
    lifecycle.record("chaos_inject", detail={"what": "freeze_driver", "t": round(t, 2)})
    log.warning("chaos: freezing the driver's loop at %.1f s", t)
    threading.Event().wait()

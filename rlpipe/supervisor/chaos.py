"""The chaos runner: the run attacks itself on the schedule conf/chaos/ sets. Each fault is one
class of rlpipe.chaos_faults (its setting, when it is due, how it is injected, how its
recovery is judged); the runner builds the ones the spec turns on and, every supervision
tick, injects those that are due, and gives them what they act on: a random awake worker,
the `chaos_inject` row, signals to processes, the run's Services. (`FreezeDriver` is injected
by the driver's loop itself.)

The schedule's clock starts when every worker the run started awake has stepped its first
slice (`start`), not at the process's start: on a loaded machine the start-up (imports, env
builds) can take most of a short run, and counted from the process every fault due by then
fired at once, before a worker had stepped. `t` in the rows stays seconds into the run.

Injections stop when less of the run is left than the watchdog needs to notice and heal a
fault (`watchdog.worst_heal_s`: the timeout, the grace, and the supervision ticks each step
waits for) plus the longest a replacement worker of this run has
taken from its spawn to its first stepped slice (`heal_s`), so every injection of a finished
run has its recovery. Until the first replacement is ready, the fleet's own start stands in
for it: that start spawns every worker at once beside the learner's start-up, so it is the
pessimistic guess, and on a loaded machine (16 s against 2-3 s for one replacement) it held
back most of a short run's schedule. A fault's follow-up (`upkeep`) still runs then. Each time
injections stop, a `chaos_quiet` row says when and which heal time it was ("replacements" or
"fleet start").
"""

from __future__ import annotations

import logging
import os
import random
import signal

from rlpipe.chaos_faults import ticked_faults
from rlpipe.config import ChaosSpec
from rlpipe.procs import pid_alive

log = logging.getLogger("rlpipe.chaos")


def live_pids(pids: set[int]) -> set[int]:
    return {pid for pid in pids if pid_alive(pid)}


class Chaos:
    def __init__(self, spec: ChaosSpec, seed: int, t0: float, services, pending: dict, quiet_from: float | None = None):
        self.services = services
        self.lifecycle = services.lifecycle
        self.pending = pending  # the watchdog's replacements under way: not targets
        self.rng = random.Random(seed)
        self.spec = spec
        self.t0 = t0  # the run's start: rows' `t`
        self.faults = []  # built by `start`, once the fleet is up
        self.started_at: float | None = None
        self.stopped: set[int] = set()  # pids we SIGSTOPped (continued or killed at teardown)
        self.hit: set[int] = set()  # worker pids a fault struck: no target until replaced
        # No injections once too little run is left for the watchdog to see the fault healed.
        self.quiet_from = quiet_from
        self.fleet_start_s = 0.0  # the longest spawn -> worker_ready of the fleet's first workers
        self.replacement_heal_s: float | None = None  # the same over replacements, once one is ready
        self.injected = 0
        self.quiet = False  # too little run left to heal an injection (the last tick's verdict)

    @property
    def heal_s(self) -> float:
        return self.fleet_start_s if self.replacement_heal_s is None else self.replacement_heal_s

    def worker_ready(self, since_spawn_s: float, replacement: bool) -> None:
        """A worker spawned awake stepped its first slice `since_spawn_s` after its spawn."""
        if replacement:
            self.replacement_heal_s = max(self.replacement_heal_s or 0.0, since_spawn_s)
        else:
            self.fleet_start_s = max(self.fleet_start_s, since_spawn_s)

    # -- what a fault acts on (rlpipe.chaos_faults.ChaosRun) -------------------------------------
    def target(self, handles):
        # a replacement that has not stepped yet is still healing the last fault, and a worker
        # struck already (stopped, or killed and not yet seen dead by the watchdog) waits for
        # its replacement: hit again, its recovery and the new fault's would be one restart
        # (two faults, one worker_ready; a kill and a stop struck one worker in one tick so)
        candidates = [
            h
            for h in handles
            if h.awake and h.alive() and h.stepped and h.worker_id not in self.pending and h.proc.pid not in self.hit
        ]
        return self.rng.choice(candidates) if candidates else None

    def record(self, what: str, h=None, **detail) -> None:
        self.injected += 1
        fields = {}
        if h is not None:
            fields = dict(worker_id=h.worker_id, generation=h.generation)
            self.hit = live_pids(self.hit) | {h.proc.pid}  # the dead forgotten, as in sigstop
        self.lifecycle.record("chaos_inject", detail={"what": what, **detail}, **fields)
        log.warning("chaos: %s %s", what, detail)

    def record_quiet(self, now: float) -> None:
        """Injections stop: the `chaos_quiet` row says when and which heal time decided it (a
        window the fleet's start closed opens again when a faster replacement is ready)."""
        by = "fleet start" if self.replacement_heal_s is None else "replacements"
        detail = {"t": self.t(now), "heal_s": round(self.heal_s, 3), "heal_s_of": by}
        self.lifecycle.record("chaos_quiet", detail=detail)
        log.info("chaos: no injections while the heal time no longer fits before the end %s", detail)

    def t(self, now: float) -> float:
        return round(now - self.t0, 2)

    def sigstop(self, pid: int) -> None:
        # the stopped processes that have since died are forgotten: a six-day run stops
        # thousands of workers, and a reused pid must not be spared as "already stopped"
        self.stopped = live_pids(self.stopped) | {pid}
        os.kill(pid, signal.SIGSTOP)

    def sigcont(self, pid: int) -> None:
        self.stopped.discard(pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    # -- the schedule ----------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """The schedule's origin: each fault is first due its setting after `now`."""
        self.started_at = now
        self.faults = [fault(self.spec, now) for fault in ticked_faults(self.spec)]

    def tick(self, handles, now: float) -> None:
        for fault in self.faults:
            fault.upkeep(self, now)
        quiet = self.quiet_from is not None and now >= self.quiet_from - self.heal_s
        if quiet and not self.quiet:
            self.record_quiet(now)
        self.quiet = quiet
        if quiet:
            return
        for fault in self.faults:
            if fault.due(now) and fault.inject(self, handles, now):
                fault.struck(now)

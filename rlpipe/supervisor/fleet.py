"""The worker fleet as the driver runs it: one WorkerHandle per group of env ids, the hot ones
started at once and the dormant ones by background start threads, woken by the schedule, replaced
when they exit or fall silent, and their doorbells taken in. What a worker process is started
with is built in one place, `Fleet.worker_spec`; the serving side (rings in, a round's moves)
is `FleetRounds` (rlpipe/supervisor/rounds.py)."""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import signal
import time
from typing import Callable

import numpy as np
import redis

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan, preload_modules
from rlpipe.procs import cpu_seconds, parent_pid
from rlpipe.protocol import epsilon_channel, slice_bounds
from rlpipe.shm.doorbell import DoorbellServer
from rlpipe.shm.layout import H_AWAKE, H_LC_DROPPED
from rlpipe.supervisor.cgroups import make_driver as make_cgroup_driver
from rlpipe.supervisor.chaos import Chaos
from rlpipe.supervisor.deaths import death_record, env_in_step
from rlpipe.supervisor.errors import ErrorAggregator
from rlpipe.supervisor.groups import WakeSchedule
from rlpipe.supervisor.memory import contain_memory, resolve_active_mem_mb
from rlpipe.supervisor.orphans import kill_orphans
from rlpipe.supervisor.rounds import FleetRounds
from rlpipe.supervisor.services import LIFECYCLE_ENDPOINT, Services, multiprocessing_temp_dir
from rlpipe.supervisor.slot_table import SlotTable
from rlpipe.supervisor.watchdog import Watchdog, worst_heal_s
from rlpipe.supervisor.workers import (
    BackgroundStarts,
    WorkerHandle,
    group_ranges,
    stop_workers,
    worker_context,
)
from rlpipe.worker.backoff import FaultBackoff
from rlpipe.worker.exploration import pack_epsilons
from rlpipe.worker.process import EXIT_RECYCLE
from rlpipe.worker.spec import (
    HeartbeatSettings,
    RewardNormSettings,
    ScalingSettings,
    WorkerPoolSettings,
    WorkerSpec,
    twin,
)

log = logging.getLogger("rlpipe")
QUICK_DEATH_S = 30.0  # a worker dead this soon after its start counts toward a crash loop
WORKER_OUTPUT_DIR = "worker_output"  # each worker's stdout and stderr, capped (rlpipe.outputlog)


def _own_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker_sections(spec: RunSpec) -> dict:
    """The conf/ sections a worker reads, as the worker layer's twins, keyed as WorkerSpec
    holds them."""
    return {
        "worker": twin(WorkerPoolSettings, spec.worker),
        "heartbeat": twin(HeartbeatSettings, spec.heartbeat),
        "scaling": twin(ScalingSettings, spec.scaling),
        "reward_norm": twin(RewardNormSettings, spec.reward_norm, gamma=spec.learner.gamma),
    }


class Fleet(FleetRounds):
    def __init__(
        self,
        spec: RunSpec,
        run_id: str,
        t0: float,
        services: Services,
        phase: Callable[[str], None],
        first_job: bool = True,
        final_obs_all_ends: bool = False,
    ):
        self.spec = spec
        self.final_obs_all_ends = final_obs_all_ends  # rlpipe.vector's: every end's obs, not only truncations'
        self.run_id = run_id
        self.t0 = t0
        self.services = services
        self.phase = phase  # the driver's start-up log line
        self.plan: MixPlan | None = None
        self.versions: dict[str, str] = {}
        self.sections: dict = {}  # every WorkerSpec's conf/ sections (built in start)
        self.ctx = None  # the multiprocessing context workers start from
        self.doorbells: DoorbellServer | None = None  # the driver's bell and every worker's done words
        self.slots: SlotTable | None = None  # every slice's addresses: a round's moves (rlpipe.supervisor.slot_table)
        self.handles: list[WorkerHandle] = []
        self.by_id: dict[int, WorkerHandle] = {}
        self.cgroups = None
        self.active_mem_mb = resolve_active_mem_mb(spec.groups.active_mem_mb)  # rlpipe.supervisor.memory
        self.schedule: WakeSchedule | None = None
        self.watchdog: Watchdog | None = None
        self.chaos: Chaos | None = None
        self.errors: ErrorAggregator | None = None
        self.unspawned: list[WorkerHandle] = []
        self.hot_unready: set[int] = set()  # hot workers not yet stepped: the chaos clock waits for them
        self.starts = BackgroundStarts()  # dormant workers' process starts
        self.lifecycle_dropped = 0  # workers' lifecycle events dropped at the ZMQ high-water mark
        self.pinned_at: float | None = None  # learner_core: when the update's CPU became its own
        self.learner_by_weight = False  # ... by the workers' cgroup weight (else by pinning them)
        # `cpu_seconds` counts from the job's start: a later job of a multirun shares the
        # driver process and the forkserver with the jobs before it, so what they had used by
        # then is taken off (the forkserver's at this job's first fork).
        self.forkserver_pid: int | None = None
        self.cpu_before = {"driver": 0.0 if first_job else _own_cpu_seconds(), "forkserver": 0.0}
        self.first_job = first_job

    # -- start -------------------------------------------------------------------------------
    def start(self, plan: MixPlan, versions: dict[str, str], errors: ErrorAggregator | None = None) -> None:
        """The doorbell, the groups' cgroups, schedule and watchdog, and the hot workers;
        `errors`: the error aggregator to use instead of a plain ErrorAggregator."""
        spec, services = self.spec, self.services
        self.plan, self.versions = plan, versions
        self.sections = worker_sections(spec)
        multiprocessing_temp_dir(self.run_id)
        (services.run_dir / WORKER_OUTPUT_DIR).mkdir(exist_ok=True)
        self.ctx = worker_context(spec.worker.start_method, preload_modules(spec.env_types))
        g = spec.groups
        ranges = group_ranges(spec.env_count, spec.groups.size)
        n, mem = len(ranges), self.active_mem_mb
        self.cgroups = make_cgroup_driver(
            g.cgroup, self.run_id, g.dormant_cpu_pct, g.dormant_mem_mb, n_groups=n, active_mem_mb=mem
        )
        self.max_rss_mb = contain_memory(self.cgroups.name, spec.worker.max_rss_mb, mem, n)
        self.schedule = WakeSchedule(len(ranges), g)
        self.watchdog = Watchdog(spec.heartbeat, self.run_id, services.rcli, services.lifecycle)
        self.errors = errors or ErrorAggregator(services.run_dir, spec.logging.aggregate_interval_s)
        quiet = self.t0 + spec.run.duration_s - worst_heal_s(spec.heartbeat) if spec.run.duration_s else None
        self.chaos = (
            Chaos(spec.chaos, spec.run.seed, self.t0, services, self.watchdog.pending, quiet)
            if spec.chaos.enabled
            else None
        )
        slices = [len(slice_bounds(hi - lo, spec.worker.slices)) for lo, hi in ranges]
        self.doorbells = DoorbellServer(self.run_id, sum(slices))  # before any worker's segment
        self.slots = SlotTable(
            sum(slices), [lo for lo, _ in ranges], plan.env_type, plan.obs_keys, plan.actions.cont_dim
        )
        for k, (lo, hi) in enumerate(ranges):
            h = WorkerHandle(k, lo, hi, spec, plan, self.run_id, self.doorbells, sum(slices[:k]))
            h.awake = self.schedule.awake[k]
            h.on_retire = self._retire
            h.on_attach = self.slots.attach
            self.handles.append(h)
        self.by_id = {h.worker_id: h for h in self.handles}
        self.start_rounds(sum(slices))
        self.respawn_backoff = FaultBackoff(len(self.handles))
        # Hot groups start now; dormant ones are started from the loop, so the first steps
        # are not queued behind a hundred forks on a busy machine.
        self.unspawned = [h for h in self.handles if not h.awake]
        self.hot_unready = {h.worker_id for h in self.handles if h.awake}  # chaos starts when empty
        for h in self.handles:
            if h.awake:
                self._spawn(h)
        server = parent_pid(self.handles[0].proc.pid)  # group 0 is always hot
        if server is not None and server != os.getpid():  # spawn: the driver is the parent
            self.forkserver_pid = server
            if not self.first_job:
                self.cpu_before["forkserver"] = cpu_seconds(server)
        self.phase(f"{len(self.handles) - len(self.unspawned)} hot workers started")

    def worker_spec(self, h: WorkerHandle) -> WorkerSpec:
        """Everything the next process of `h` is started with: picklable, sent once at spawn.
        A dormant group's worker joins its cgroup first thing."""
        spec, plan, services = self.spec, self.plan, self.services
        return WorkerSpec(
            worker_id=h.worker_id,
            generation=h.generation,
            run_id=self.run_id,
            env_lo=h.env_lo,
            type_index=plan.env_type[h.env_lo : h.env_hi].copy(),
            segment_name=h.segment.name,
            cgroup_paths=tuple(self.cgroups.active_paths() if h.awake else self.cgroups.dormant_paths(h.worker_id)),
            active_cgroup_paths=tuple(self.cgroups.active_paths()),
            type_names=plan.names,
            type_nodes=tuple(t.node for t in spec.env_types),
            type_specs=plan.specs,
            type_versions=tuple(self.versions[t.name] for t in spec.env_types),
            obs_keys=plan.obs_keys,
            cont_dim=plan.actions.cont_dim,
            locked_board=spec.buffer.sync == "lock",
            seed=spec.run.seed,
            doorbell_segment=self.doorbells.name,
            lifecycle_endpoint=services.endpoint(LIFECYCLE_ENDPOINT),
            redis_url=services.redis.url,
            driver_pid=os.getpid(),
            env_id_offset=spec.env_id_offset,
            output_log=str(services.run_dir / WORKER_OUTPUT_DIR / f"worker_{h.worker_id}.log"),
            final_obs_all_ends=self.final_obs_all_ends,
            # the worker section as built at start, but for the CPUs this generation pins to
            **{
                **self.sections,
                "worker": dataclasses.replace(
                    self.sections["worker"], cpu_affinity=self.worker_cpus(), max_rss_mb=self.max_rss_mb
                ),
            },
        )

    def worker_cpus(self) -> tuple[int, ...] | None:
        """The CPUs a new worker process pins itself to (None: every CPU). Under learner_core
        none until every env has stepped (start-up builds envs on every CPU, and a worker
        pinned before then would build on all but one), nor after where the workers' cgroup
        weight gives the update its CPU."""
        layout = self.spec.layout
        if layout.pin_after_startup and (self.pinned_at is None or self.learner_by_weight):
            return None
        return layout.worker_cpus

    def startup_over(self, now: float) -> None:
        """Every env has stepped (the driver's `all_envs_ready`): under learner_core the PPO
        update's CPU becomes its own now. Under `backlog` hold or sync, where the cgroup
        driver can, by weight: the workers together weigh about one low-priority task
        (rlpipe/supervisor/cgroups.py), so the update and the driver run whenever they are
        ready and the workers step on every CPU in the time left, the update's CPU included
        (it idled 13-15 % of the `hold` row while the update waited for its batch). Otherwise
        the live workers leave that CPU and later generations start on theirs: under `drop`
        a batch always waits, the update's CPU is never free, and day4 trained 0.83-0.90x as
        many samples with the workers weighed onto it (docs/benchmarks.md, "The learner's
        core by weight")."""
        layout = self.spec.layout
        if not layout.pin_after_startup or self.pinned_at is not None:
            return
        self.pinned_at = now
        by_weight = self.spec.learner.backlog != "drop"
        if by_weight and self.cgroups is not None and self.cgroups.yield_to_learner():
            self.learner_by_weight = True
            self.phase(
                f"workers weighed below the PPO update (CPU {layout.learner_cpu}) and the driver "
                f"({self.cgroups.name} cgroup), stepping on every CPU"
            )
            return
        for h in self.handles:
            if h.alive():
                h.pin(layout.worker_cpus)
        self.phase(
            f"workers moved to CPUs {','.join(map(str, layout.worker_cpus))}, "
            f"CPU {layout.learner_cpu} kept for the PPO update"
        )

    def _prepare(self, h: WorkerHandle):
        """A new generation of `h` and its process, not yet started."""
        h.next_generation()
        proc = h.process(self.ctx, self.worker_spec(h))
        self.errors.add_log(h.worker_id, h.error_log)
        return proc

    def _spawn(self, h: WorkerHandle) -> None:
        """Start (or restart) the worker of a group, in a new generation, in this thread."""
        proc = self._prepare(h)
        proc.start()
        h.started(proc)

    def spawn_some(self) -> None:
        """In the loop's first turn (the hot workers are building by then): prepare every
        dormant worker and hand its start to the start threads. Every turn: take the
        processes they have started. (A loop turn lasts an inference round: starting a few
        per turn, in the loop's thread, stretched day4's start-up; docs/benchmarks.md,
        "Figures behind the code's comments".)"""
        if self.unspawned:
            batch, self.unspawned = self.unspawned, []
            for h in batch:
                self.starts.submit(h, self._prepare(h))
        if self.starts.pending:
            self._take_started(self.starts.finished())
            if not self.unspawned and not self.starts.pending:
                self.phase(f"all {len(self.handles)} workers started")

    def _take_started(self, started, teardown: bool = False) -> None:
        failed = None
        for h, proc, exc in started:
            failed = failed or exc
            if proc is None:
                continue  # its start failed, or teardown came first
            h.started(proc)
            if h.awake and not h.spawned_awake:
                # woken while its start was in flight: the wake found no process to move
                try:
                    self.cgroups.wake(h.worker_id, proc.pid)
                except OSError as exc:
                    log.warning("moving worker %d to the active cgroup failed: %s", h.worker_id, exc)
        if failed is not None and not teardown:
            raise failed  # as a failed start in the driver's own thread

    def _retire(self, old: WorkerHandle) -> None:
        """A generation's segment is about to go: keep what its worker counted there."""
        self.errors.remove_log(old.worker_id)
        self.lifecycle_dropped += old.views.load(H_LC_DROPPED)

    # -- the loop ----------------------------------------------------------------------------
    def wake_due(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Wake the groups the schedule says are due; return their parked rings (slots, seqs)."""
        none = np.zeros(0, dtype=np.int64)
        if self.schedule.all_awake:
            return none, none
        min_steps = {h.worker_id: int(h.slice_seq.min()) for h in self.handles if h.awake}
        slots, seqs = [none], [none]
        for k in self.schedule.due(min_steps):
            h = self.handles[k]
            h.awake = True
            self.slot_awake[h.slot_lo : h.slot_lo + len(h.bounds)] = True
            if h.views is not None:
                h.views.store(H_AWAKE, 1)  # before the move: a worker still joining looks again
            if h.alive():
                try:
                    self.cgroups.wake(k, h.proc.pid)
                except OSError as exc:
                    log.warning("moving worker %d to the active cgroup failed: %s", k, exc)
            self.services.lifecycle.record(
                "group_wake", worker_id=k, generation=h.generation, detail={"envs": h.n, "wake": self.schedule.wakes}
            )
            parked = np.flatnonzero(h.parked >= 0)
            slots.append(h.slot_lo + parked)
            seqs.append(h.parked[parked].copy())
            h.parked[:] = -1
        return np.concatenate(slots), np.concatenate(seqs)

    def check_workers(self, now: float) -> list[int]:
        """Replace workers that exited, inject the configured faults, advance the watchdog and
        replace the workers it has ended; the ids replaced are returned (no one needs to be
        called: a new generation's first ring, seq 0, restarts its slices)."""
        replaced = []
        for h in self.handles:
            if h.respawn_at is not None:  # backing off (_replace): started once its time is up
                if now >= h.respawn_at:
                    h.respawn_at = None
                    self._spawn(h)
                continue
            if h.worker_id in self.watchdog.pending or h.proc is None or h.proc.is_alive():
                continue
            h.proc.join()
            code = h.proc.exitcode
            reason = "rss" if code == EXIT_RECYCLE else "exited"
            self._replace(h, reason, {"exitcode": code})
            replaced.append(h.worker_id)
        if self.chaos is not None:
            self.chaos.tick(self.handles, now)
        self.watchdog.scan(self.handles, now)
        for rep in self.watchdog.reap(now):
            self._replace(rep.handle, rep.reason, rep.detail)
            replaced.append(rep.handle.worker_id)
        return replaced

    def _replace(self, h: WorkerHandle, reason: str, detail: dict) -> None:
        # A worker dead soon after its start (an env that kills it) backs off as an env does;
        # not an RSS recycle, nor a death the chaos runner may have caused on purpose.
        quick = reason != "rss" and self.chaos is None and time.monotonic() - h.spawned_at < QUICK_DEATH_S
        delay = self.respawn_backoff.fault(h.worker_id) if quick else 0.0
        if delay:
            detail = {**detail, "respawn_in_s": delay}
        if (found := env_in_step(h, self.plan, self.spec.env_id_offset)) is not None:  # who killed it
            detail = {**detail, **found}
            self.errors.add_record(death_record(h, found, detail.get("exitcode")), h.worker_id)
        self.services.lifecycle.record(
            "worker_restart", worker_id=h.worker_id, generation=h.generation, detail={"reason": reason, **detail}
        )
        self.slot_seen[h.slot_lo : h.slot_lo + len(h.bounds)] = -np.inf  # not active until it rings
        kill_orphans(self.forkserver_pid, self.handles)  # what its envs started, if it could not
        if delay:
            h.respawn_at = time.monotonic() + delay
        else:
            self._spawn(h)

    def restart_all(self, reason: str) -> None:
        """Every worker stopped and started again in a new generation (rlpipe.vector's reset)."""
        stop_workers(self.handles, self.spec.heartbeat.term_grace_s)
        for h in self.handles:
            self.services.lifecycle.record(
                "worker_restart", worker_id=h.worker_id, generation=h.generation, detail={"reason": reason}
            )
            self._spawn(h)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds this job has used so far: the driver (every thread), its live workers
        and the forkserver they were forked from (0 under spawn)."""
        server = cpu_seconds(self.forkserver_pid) if self.forkserver_pid is not None else 0.0
        return {
            "driver": round(_own_cpu_seconds() - self.cpu_before["driver"], 2),
            "workers": round(sum(cpu_seconds(h.proc.pid) for h in self.handles if h.alive()), 2),
            "forkserver": round(max(0.0, server - self.cpu_before["forkserver"]), 2),
        }

    def live_worker_ids(self) -> list[int]:
        """Workers running and not being replaced."""
        return [h.worker_id for h in self.handles if h.alive() and h.worker_id not in self.watchdog.pending]

    def publish_epsilons(self, learner) -> None:
        """The learner's exploration rates to each awake worker's channel."""
        try:
            pipe = self.services.rcli.pipeline(transaction=False)
            for h in self.handles:
                if h.awake:
                    pipe.publish(
                        epsilon_channel(self.run_id, h.worker_id),
                        pack_epsilons(h.env_lo, learner.epsilons(h.env_lo, h.env_hi)),
                    )
            pipe.execute()
        except redis.RedisError:
            pass  # the next publish carries the rates; workers keep the last ones

    # -- stop --------------------------------------------------------------------------------
    def continue_stopped(self) -> None:
        """Processes the chaos SIGSTOPped that nobody replaced or continued since: continued, so
        each answers the teardown (a worker hears STOP)."""
        for pid in self.chaos.stopped if self.chaos else ():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop_starts(self) -> None:
        """Start no more dormant workers; take in those whose start was in flight."""
        self._take_started(self.starts.close(), teardown=True)

    def stop_workers(self) -> None:
        stop_workers(self.handles, self.spec.heartbeat.term_grace_s)
        kill_orphans(self.forkserver_pid, self.handles)  # left by workers that were killed

    def count_lifecycle_drops(self) -> None:
        for h in self.handles:
            if h.views is not None:
                self.lifecycle_dropped += h.views.load(H_LC_DROPPED)

    def release_steps(self) -> list:
        """After the workers stopped: the teardown steps that free the fleet's cgroups,
        segments and sockets; the caller guards each one."""
        return [
            lambda: self.cgroups.cleanup() if self.cgroups is not None else None,
            lambda: self.slots.close() if self.slots is not None else None,  # before the segments go
            lambda: [h.close() for h in self.handles],
            lambda: self.doorbells.close() if self.doorbells is not None else None,
        ]

"""The slice engine: the run's services (embedded Redis, the lifecycle writer), its worker fleet
(the processes, doorbells and watchdog) and every move through shared memory, behind two
verbs. Its two clients hold none of it: the training driver (rlpipe/supervisor/driver.py)
and `rlpipe.vector` (rlpipe/vector/engine.py).

    engine.poll(now, poll_ms)    take the doorbells rung since the last call: the slices ready
                                 (gather=True: wait for as many as a round needs at the least)
    engine.serve_due(now)        whether they are worth a round now (the driver's gathering)
    rnd = engine.recv()          the ready slices as one batch (rlpipe.protocol.Round)
    engine.send(rnd.slots, acts) their actions scattered, their workers rung

A slot is one slice of one worker (rlpipe.protocol.slot_count). The engine keeps, per slot,
the newest ring of the worker generation now serving it, ready until answered. A replaced
worker reaches the client as data, never as a call: its slots' first ring has seq 0, and a
round marks `restarted` the slots whose generation changed since they were last received.
The fleet, not the client, replaces workers (`supervise`); the in-process backend
(rlpipe/supervisor/inprocess.py) offers the same verbs over envs stepped in the caller.

Set-up is two calls (`start_services`, `start_workers`: the driver builds its learner between
them) and teardown one list of guarded steps (`stop_steps`), in which the client may put its
own between the workers' stop and the services' (the driver's final checkpoint needs Redis).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import rlpipe
from rlpipe.config import EnvTypeSpec, RunSpec
from rlpipe.envs.registry import MixPlan, plan_mix
from rlpipe.lifecycle import EnvLayout
from rlpipe.protocol import Round, batch_rows
from rlpipe.shm.segment import run_segments, sweep_dead_segments
from rlpipe.supervisor.fleet import Fleet
from rlpipe.supervisor.gathering import busy_workers, rings_to_serve, serve_now
from rlpipe.supervisor.services import Services, sweep_dead_socket_dirs


def git_commit() -> str:
    root = Path(rlpipe.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return "nogit"
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "nogit"
    except (OSError, subprocess.TimeoutExpired):
        return "nogit"


def env_version(node: dict, commit: str) -> str:
    """Hash of the type's config + package version + git commit (docs/architecture.md)."""
    text = json.dumps(node, sort_keys=True, default=str) + rlpipe.__version__ + commit
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def env_versions(env_types: Sequence[EnvTypeSpec]) -> dict[str, str]:
    """Each type's env_version at the checkout's commit, by type name."""
    commit = git_commit()
    return {t.name: env_version(t.node, commit) for t in env_types}


class SliceEngine:
    def __init__(
        self,
        spec: RunSpec,
        run_dir: Path,
        run_id: str,
        t0: float,
        phase: Callable[[str], None],
        first_job: bool = True,
        final_obs_all_ends: bool = False,
    ):
        """`final_obs_all_ends`: the workers keep the end obs of every ended episode (what
        Gymnasium's vectors return), not only of time-limit truncations (what PPO bootstraps)."""
        self.spec = spec
        self.services = Services(run_dir, run_id)
        self.fleet = Fleet(spec, run_id, t0, self.services, phase, first_job, final_obs_all_ends)
        self.plan: MixPlan | None = None
        self.versions: dict[str, str] = {}
        self.started = False  # workers started: stop_steps has a fleet to stop
        # per slot (filled by start_workers)
        self.ready = np.zeros(0, dtype=bool)  # a ring not yet answered (read through ready_mask)
        self.seq = np.zeros(0, dtype=np.int64)  # the newest ring's step
        self.gen = np.zeros(0, dtype=np.int64)  # the newest ring's worker generation
        self.handed_gen = np.zeros(0, dtype=np.int64)  # the generation last received (0: none)
        self.rang_at = np.zeros(0, dtype=np.int64)  # when it became ready, in rings counted
        self.ready_since = np.zeros(0)  # when it became ready, monotonic seconds
        self.rings = 0

    # -- set-up ----------------------------------------------------------------------------
    def describe(self) -> MixPlan:
        """Each env type described once, the board sized to the mix; the types' versions."""
        spec = self.spec
        self.plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
        self.versions = env_versions(spec.env_types)
        return self.plan

    def start_services(self, redis_fields: dict, between_tries=lambda: None) -> None:
        """What a crashed run of this machine left (segments, socket dirs) swept; Redis (its run
        hash with `redis_fields`; `between_tries` runs while an external one is waited for and
        may raise to stop the wait) and the lifecycle writer up."""
        sweep_dead_segments()
        sweep_dead_socket_dirs()
        self.services.start_redis(self.spec.redis, self.spec.env_count, redis_fields, between_tries)
        names = [self.plan.names[t] for t in self.plan.env_type]
        self.services.start_lifecycle(
            EnvLayout(self.spec.env_id_offset, names, [self.versions[name] for name in names])
        )

    def start_workers(self, errors=None) -> None:
        """The fleet's doorbells, cgroups and hot workers; `errors` replaces the fleet's error
        aggregator (rlpipe.vector keeps records by env id)."""
        self.started = True
        fleet = self.fleet
        fleet.start(self.plan, self.versions, errors)
        n = fleet.slots.n_slots
        self.ready = np.zeros(n, dtype=bool)
        self.seq = np.zeros(n, dtype=np.int64)
        self.gen = np.zeros(n, dtype=np.int64)
        self.handed_gen = np.zeros(n, dtype=np.int64)
        self.rang_at = np.zeros(n, dtype=np.int64)
        self.ready_since = np.zeros(n)

    # -- the serving verbs ------------------------------------------------------------------
    def poll(self, now: float, poll_ms: int, gather: bool = False) -> np.ndarray:
        """The doorbells rung since the last call, waiting up to `poll_ms` for the first (with
        `gather`, for as many as `serve_due` needs before it can say yes: the rings before then
        do not wake the caller); dormant workers started and due groups woken on the way
        (their parked rings come in). Returns the slots that became ready."""
        fleet = self.fleet
        min_rings = self._rings_to_serve() if gather and poll_ms else 1
        slots, seqs = fleet.take_rings(now, poll_ms, min_rings)
        fleet.spawn_some()
        woken, woken_seqs = fleet.wake_due(now)
        if len(woken):
            slots, seqs = np.concatenate([slots, woken]), np.concatenate([seqs, woken_seqs])
        return self._mark_ready(slots, seqs, now)

    def _mark_ready(self, slots: np.ndarray, seqs: np.ndarray, now: float) -> np.ndarray:
        """Rings of the slots' current generations (the fleet reads no other) in."""
        if not len(slots):
            return slots
        current = self.fleet.slots.generation[slots]
        renewed = self.gen[slots] != current  # a new generation's first ring
        if renewed.any():
            self.gen[slots[renewed]] = current[renewed]
            self.ready[slots[renewed]] = False
        self.seq[slots] = seqs
        fresh = slots[~self.ready[slots]]
        self.ready[fresh] = True
        self.rang_at[fresh] = self.rings + np.arange(1, len(fresh) + 1)
        self.ready_since[fresh] = now
        self.rings += len(fresh)
        return fresh

    def _drop_replaced(self) -> None:
        """A ready slot whose worker was replaced since it rang waits for the new generation."""
        self.ready &= self.gen == self.fleet.slots.generation

    def ready_mask(self) -> np.ndarray:
        """Per slot: ready to be received."""
        self._drop_replaced()
        return self.ready

    @property
    def has_ready(self) -> bool:
        return bool(self.ready_mask().any())

    def ready_slots(self) -> np.ndarray:
        """The ready slots, in the order they rang."""
        self._drop_replaced()
        slots = np.flatnonzero(self.ready)
        return slots[np.argsort(self.rang_at[slots], kind="stable")]

    def serve_due(self, now: float) -> bool:
        """Whether the ready slots are worth a round now, or wait for more to ring while most
        workers still step a slice (rlpipe/supervisor/gathering.py); False when none is ready."""
        ready = self.ready_mask()
        if not ready.any():
            return False
        fleet = self.fleet
        busy, awake = busy_workers(fleet.slots.worker, fleet.slot_awake, ready)
        return serve_now(busy, awake, self._worker_cpu_count(), now - self.ready_since[ready].min())

    def _rings_to_serve(self) -> int:
        fleet = self.fleet
        return rings_to_serve(fleet.slots.worker, fleet.slot_awake, self.ready_mask(), self._worker_cpu_count())

    def _worker_cpu_count(self) -> int:
        cpus = self.fleet.worker_cpus()
        return len(cpus) if cpus is not None else math.ceil(self.spec.layout.cpus)

    def recv(self, slots: np.ndarray | None = None) -> Round | None:
        """The obs, step results and final obs of `slots` (default: every ready slot), as one
        batch; None when none is ready. They stay ready until answered (`send`)."""
        if slots is None:
            slots = self.ready_slots()
            if not len(slots):
                return None
        rnd = self.fleet.slots.recv(slots, self.seq[slots])
        handed = self.handed_gen[slots]
        rnd.restarted = (handed != 0) & (handed != self.gen[slots])
        self.handed_gen[slots] = self.gen[slots]
        return rnd

    def send(self, slots: np.ndarray, actions: dict) -> None:
        """`actions` (field -> rows of `slots` one after another, as `recv` made them) to the
        slots' workers, answering each slot's newest ring."""
        self.ready[slots] = False
        self.fleet.slots.send(slots, self.seq[slots], actions)

    def slot_rows(self, slots) -> np.ndarray:
        """The env ids of `slots`, one slot after another."""
        table = self.fleet.slots
        return batch_rows(table.env_lo[slots], table.count[slots])[1]

    # -- supervision ------------------------------------------------------------------------
    def supervise(self, now: float) -> list[int]:
        """Workers that exited or fell silent replaced (the ids returned), the configured
        faults injected, Redis restarted if it died and its recovery followed."""
        fleet, services = self.fleet, self.services
        replaced = fleet.check_workers(now)
        if services.restart_dead_redis(now):
            fleet.watchdog.redis_restarted()
        if services.redis_down_since is not None:
            services.check_redis_recovered(fleet.live_worker_ids())
        return replaced

    def restart_all(self) -> None:
        """Every worker replaced by a new generation (fresh envs from the spec's seed); no slot
        of it reports `restarted`: the client asked for it."""
        self.fleet.restart_all("vector_reset")
        self.handed_gen[:] = 0

    # -- teardown ---------------------------------------------------------------------------
    def stop_steps(self, between: Sequence[Callable[[], object]] = ()) -> list:
        """Every step of the engine's teardown, in reverse order of creation, for the caller to
        run guarded: the workers stopped (and their error logs read a last time), then the
        caller's `between` steps, then the fleet's cgroups, segments and doorbells, then the
        services. Before the workers started: the services only."""
        fleet = self.fleet
        if not self.started:
            return [*between, *self.services.stop_steps()]
        return [
            fleet.continue_stopped,
            fleet.stop_starts,
            fleet.stop_workers,
            lambda: fleet.errors.finish() if fleet.errors is not None else None,
            fleet.count_lifecycle_drops,
            *between,
            *fleet.release_steps(),
            *self.services.stop_steps(),
            self.unlink_segments,
        ]

    def unlink_segments(self) -> None:
        """Belt and braces: no shared-memory segment of the run stays."""
        for name in run_segments(self.services.run_id):
            Path("/dev/shm", name).unlink(missing_ok=True)

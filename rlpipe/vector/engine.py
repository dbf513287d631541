"""rlpipe's engine served by a caller instead of by the learner: the run's services (embedded
Redis, the lifecycle writer) and its worker fleet (forkserver, one worker per group, the
doorbells, the watchdog that replaces dead and silent workers), exactly as a training run
starts them (rlpipe/supervisor/driver.py `Driver.setup`), and one inference round's moves as
a training round makes them: the fleet's slot table (rlpipe/supervisor/slot_table.py) scatters
actions and rings, and gathers the obs, step results and final obs of the slices that rang.

The unit of stepping is a worker's slice (rlpipe/protocol.py `slice_bounds`): each slice of
the fleet is in one of three states, moved only here:
  flight   actions sent, its worker is stepping it;
  arrived  its worker rang: obs published, results readable, not yet handed to the caller;
  held     handed to the caller, whose next actions it waits for.
A replaced worker's new generation rings each slice with seq 0 whatever state the slice was
in; the slice is marked `restarted` until its results are handed out.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import time
import types
from dataclasses import replace
from pathlib import Path

import numpy as np

from rlpipe.cadence import Every
from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan, plan_mix
from rlpipe.shm.segment import new_run_id, run_segments, sweep_dead_segments
from rlpipe.supervisor.driver import env_versions
from rlpipe.supervisor.fleet import Fleet
from rlpipe.supervisor.rounds import current_refs
from rlpipe.supervisor.services import Services, sweep_dead_socket_dirs
from rlpipe.supervisor.workers import SliceRef, stop_workers
from rlpipe.vector.faults import FaultRecords

log = logging.getLogger("rlpipe")
_started_engines = 0  # engines of this process with services up (they share the forkserver)
MAX_SILENT_RESTARTS = 5  # a worker replaced this often without one ring: its envs cannot be built
SUPERVISE_S = 0.25  # while waiting for rings: replace exited workers, advance the watchdog
POLL_MS = 10


class VectorFleet(Fleet):
    """The training run's fleet; its workers also copy the end obs of terminated episodes
    (Gymnasium's `final_obs`), which the learner never needs."""

    def worker_spec(self, h):
        return replace(super().worker_spec(h), final_obs_all_ends=True)


@contextlib.contextmanager
def hidden_main():
    """Worker (and forkserver) starts that do not import the caller's `__main__`.

    multiprocessing's forkserver and spawn re-import the main module in every child (as
    `__mp_main__`): a learner's script would be imported into each worker, torch and all
    (rlpipe's workers never import torch), and a script without an `if __name__ ==
    "__main__"` guard would start vectors from its workers. The workers need nothing of it:
    they are given a picklable WorkerSpec and import the env types' modules themselves (a
    custom env is named by an importable `module:Id`). So while a worker starts, `__main__` is
    a bare module with no file or spec, and multiprocessing passes none on."""
    real = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


class Engine:
    def __init__(self, spec: RunSpec, run_dir: str | Path | None = None):
        self.spec = spec
        self.own_dir = run_dir is None
        # /tmp and short: the run's unix sockets live in it (sun_path is 108 bytes)
        self.run_dir = Path(tempfile.mkdtemp(prefix="rlv", dir="/tmp")) if run_dir is None else Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = new_run_id()
        self.t0 = time.monotonic()
        self.services = Services(self.run_dir, self.run_id)
        self.fleet = VectorFleet(spec, self.run_id, self.t0, self.services, self._phase)
        self.plan: MixPlan | None = None
        self.faults: FaultRecords | None = None
        self.keys: list[tuple[int, int]] = []  # (worker id, slice) of every slice
        self.rows: dict[tuple[int, int], tuple[int, int]] = {}  # slice -> global env rows [a, b)
        self.ref: dict[tuple[int, int], SliceRef] = {}  # the latest ring of each slice
        self.flight: set = set()
        self.arrived: set = set()
        self.held: set = set()
        self.restarted: set = set()
        self.supervise_timer = Every(SUPERVISE_S)
        self.silent_restarts: dict[int, int] = {}  # worker id -> replacements since its last ring
        self.started = False

    def _phase(self, what: str) -> None:
        log.debug("rlpipe.vector: %s at %.2f s", what, time.monotonic() - self.t0)

    # -- start and restart ---------------------------------------------------------------
    def describe(self) -> MixPlan:
        """Each type described once (as the driver does), the board sized to it."""
        spec = self.spec
        self.plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
        return self.plan

    def start(self) -> None:
        """Services and workers up, as Driver.setup brings them (no learner, no TensorBoard)."""
        spec, services, fleet = self.spec, self.services, self.fleet
        sweep_dead_segments()
        sweep_dead_socket_dirs()
        versions = env_versions(spec.env_types)
        services.start_redis(spec.redis.url, spec.env_count, {"client": "rlpipe.vector"})
        services.start_lifecycle()
        global _started_engines
        self.started = True
        _started_engines += 1
        with hidden_main():
            fleet.start(self.plan, versions)
        # The fleet's aggregator, swapped for one that also keeps records by env id (the hot
        # workers already started hand their error logs over; replacements add theirs).
        self.faults = FaultRecords(self.run_dir, spec.logging.aggregate_interval_s)
        for h in fleet.handles:
            if h.error_log is not None:
                self.faults.add_log(h.worker_id, h.error_log)
        fleet.errors = self.faults
        for h in fleet.handles:
            for s, (lo, hi) in enumerate(h.bounds):
                key = (h.worker_id, s)
                self.keys.append(key)
                self.rows[key] = (h.env_lo + lo, h.env_lo + hi)
        self.flight = set(self.keys)  # every slice rings once its envs are built
        services.set_state("running")

    def restart_all(self) -> None:
        """Every worker replaced by a new generation (a reset: fresh envs, the spec's seed)."""
        fleet = self.fleet
        stop_workers(fleet.handles, self.spec.heartbeat.term_grace_s)
        with hidden_main():
            for h in fleet.handles:
                fleet.services.lifecycle.record(
                    "worker_restart", worker_id=h.worker_id, generation=h.generation, detail={"reason": "vector_reset"}
                )
                fleet._spawn(h)
        self.ref.clear()
        self.arrived.clear()
        self.held.clear()
        self.restarted.clear()
        self.flight = set(self.keys)

    def drop_worker(self, worker_id: int) -> None:
        """Fleet's call when it replaces a worker (the learner forgets half-made rollouts here;
        the vector learns of the restart from the new generation's first ring). A worker that
        never rings between replacements is not a fault of one env but a type that cannot be
        built (the worker gives up after MAX_BUILD_ATTEMPTS of one env): said, not waited on."""
        n = self.silent_restarts[worker_id] = self.silent_restarts.get(worker_id, 0) + 1
        if n > MAX_SILENT_RESTARTS:
            h = self.fleet.by_id[worker_id]
            last = None
            if self.faults is not None:
                self.faults.drain(worker_id)
                last = next((q[-1] for e in range(h.env_lo, h.env_hi) if (q := self.faults.by_env.get(e))), None)
            why = f"{last['error_type']}: {last['message']}" if last else "no error record"
            raise RuntimeError(
                f"rlpipe.vector: worker {worker_id} (envs {h.env_lo}..{h.env_hi - 1}) was "
                f"replaced {n} times without building its envs; last error: {why}"
            )

    # -- the serving moves ---------------------------------------------------------------
    def poll(self, timeout_ms: int = POLL_MS) -> None:
        """Take the rings (waiting up to timeout_ms for the first) and, when due, supervise."""
        fleet = self.fleet
        now = time.monotonic()
        for ref in current_refs(fleet.take_rings(now, timeout_ms)):
            key = (ref.handle.worker_id, ref.slice_index)
            self.silent_restarts.pop(key[0], None)
            old = self.ref.get(key)
            if old is not None and old.generation != ref.generation:
                self.restarted.add(key)  # a new process took the slice's env ids
            self.ref[key] = ref
            if key in self.held:
                continue  # the caller's next actions go to the new generation
            self.flight.discard(key)
            self.arrived.add(key)
        if self.supervise_timer.due(now):
            self.supervise(now)

    def supervise(self, now: float) -> None:
        fleet, services = self.fleet, self.services
        with hidden_main():  # it may start replacements
            fleet.check_workers(now, self.drop_worker)
        if services.restart_dead_redis(now):
            fleet.watchdog.redis_restarted()
        if services.redis_down_since is not None:
            services.check_redis_recovered(fleet.live_worker_ids())

    def wait(self, done) -> None:
        """Poll until `done()`; the watchdog and the step deadline bound how long that takes."""
        while not done():
            self.poll()

    def send(self, keys, disc: np.ndarray, cont: np.ndarray | None) -> None:
        """Held slices' actions (rows of the full-size `disc`/`cont`) out, and their rings: the
        slot table's scatter and rings, as a training round's (a gone worker leaves them
        unanswered: the fleet replaces it and its new generation rings)."""
        slots, seqs = self.slots_of(keys)
        rows = self.rows_of(keys)
        actions = {"discrete": disc[rows]}
        if cont is not None:
            actions["continuous"] = cont[rows]
        self.fleet.slots.send(slots, seqs, actions)
        for key in keys:
            self.held.discard(key)
            self.flight.add(key)

    def recv(self, keys):
        """The obs, step results and final obs of these arrived slices, in their order (the slot
        table's gather, as a training round's): an rlpipe.protocol.Round."""
        return self.fleet.slots.recv(*self.slots_of(keys))

    def slots_of(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """(slots, seqs) of these slices' latest rings."""
        refs = [self.ref[key] for key in keys]
        slots = np.fromiter((r.handle.slot_lo + r.slice_index for r in refs), dtype=np.int64, count=len(refs))
        return slots, np.fromiter((r.seq for r in refs), dtype=np.int64, count=len(refs))

    def rows_of(self, keys) -> np.ndarray:
        """The env ids of these slices, one after another."""
        return np.concatenate([np.arange(*self.rows[key]) for key in keys]) if keys else np.zeros(0, np.int64)

    def hand_out(self, keys) -> None:
        for key in keys:
            self.arrived.discard(key)
            self.held.add(key)
            self.restarted.discard(key)

    # -- stop ----------------------------------------------------------------------------
    def close(self) -> None:
        """Everything the engine started, in reverse order, each step guarded (as
        Driver.teardown): workers, the fleet's segments, doorbells and cgroups, the lifecycle
        writer, Redis, the socket dir and, if the engine made it, the run dir."""
        fleet = self.fleet
        steps = [
            fleet.stop_starts,
            fleet.stop_workers,
            lambda: self.faults.finish() if self.faults is not None else None,
            fleet.count_lifecycle_drops,
            *fleet.release_steps(),
            *self.services.stop_steps(),
        ]
        global _started_engines
        if self.started:
            _started_engines -= 1
            if _started_engines == 0:
                steps.append(release_forkserver)
        for step in steps if self.started else self.services.stop_steps():
            try:
                step()
            except Exception:
                log.exception("rlpipe.vector: a close step failed")
        for name in run_segments(self.run_id):
            Path("/dev/shm", name).unlink(missing_ok=True)
        if self.own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self.started = False


def release_forkserver() -> None:
    """The last engine of the process closed: its forkserver and the temp dir holding the
    server's socket (rlpipe.supervisor.services.multiprocessing_temp_dir) go too. The next
    engine starts a new server in a new dir."""
    from multiprocessing import forkserver, process

    try:
        forkserver._forkserver._stop()
    except FileNotFoundError:
        # its socket's dir is gone already (at exit, multiprocessing_temp_dir's own atexit
        # removal may run first): the server has been stopped and reaped by then
        forkserver._forkserver._forkserver_address = None
    config = process.current_process()._config
    tempdir = config.get("tempdir")
    if tempdir and Path(tempdir).name.startswith("rlpipe_"):
        del config["tempdir"]
        shutil.rmtree(tempdir, ignore_errors=True)

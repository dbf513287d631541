"""rlpipe's engine served by a caller instead of by the learner: the slice engine
(rlpipe/supervisor/engine.py: the run's services, its worker fleet and every move through
shared memory, as a training run starts them) with the state of each slice as Gymnasium's
vector calls move it.

The unit of stepping is a worker's slice, a slot of the engine (rlpipe/protocol.py
`slot_count`): each is in one of three states, moved only here:
  flight   actions sent, its worker is stepping it;
  arrived  its worker rang: obs published, results readable, not yet handed to the caller;
  held     handed to the caller, whose next actions it waits for.
A replaced worker's new generation rings each slot with seq 0 whatever state it was in; the
engine's next round of the slot says `restarted`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from rlpipe.cadence import Every
from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.protocol import Round
from rlpipe.shm.segment import new_run_id
from rlpipe.supervisor.engine import SliceEngine
from rlpipe.vector.faults import FaultRecords

log = logging.getLogger("rlpipe")
_started_engines = 0  # engines of this process with services up (they share the forkserver)
MAX_SILENT_RESTARTS = 5  # a worker replaced this often without one ring: its envs cannot be built
SUPERVISE_S = 0.25  # while waiting for rings: replace exited workers, advance the watchdog
POLL_MS = 10


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
        self.t0 = time.monotonic()
        self.run_id = new_run_id()
        self.core = SliceEngine(spec, self.run_dir, self.run_id, self.t0, self._phase, final_obs_all_ends=True)
        self.faults: FaultRecords | None = None
        self.n_slots = 0
        self.slot_env_lo = np.zeros(0, dtype=np.int64)  # each slot's first env id
        self.slot_envs = np.zeros(0, dtype=np.int64)  # and its number of envs
        self.slot_worker = np.zeros(0, dtype=np.int64)  # and its worker's id
        self.held = np.zeros(0, dtype=bool)
        self.supervise_timer = Every(SUPERVISE_S)
        self.silent_restarts: dict[int, int] = {}  # worker id -> replacements since its last ring
        self.started = False

    def _phase(self, what: str) -> None:
        log.debug("rlpipe.vector: %s at %.2f s", what, time.monotonic() - self.t0)

    # -- start and restart ---------------------------------------------------------------
    def describe(self) -> MixPlan:
        """Each type described once (as the driver does), the board sized to it."""
        return self.core.describe()

    def start(self) -> None:
        """The engine's services and workers up, as a training run brings them (no learner, no
        TensorBoard); its fault records kept by env id."""
        core = self.core
        core.start_services({"client": "rlpipe.vector"})
        global _started_engines
        self.started = True
        _started_engines += 1
        self.faults = FaultRecords(self.run_dir, self.spec.logging.aggregate_interval_s)
        with hidden_main():
            core.start_workers(errors=self.faults)
        table = core.fleet.slots
        self.n_slots = table.n_slots
        self.slot_env_lo, self.slot_envs, self.slot_worker = (
            table.env_lo.copy(),
            table.count.copy(),
            table.worker.copy(),
        )
        self.held = np.zeros(self.n_slots, dtype=bool)
        core.services.set_state("running")

    def restart_all(self) -> None:
        """Every worker replaced by a new generation (a reset: fresh envs, the spec's seed)."""
        with hidden_main():
            self.core.restart_all()
        self.held[:] = False

    # -- the slots' states ----------------------------------------------------------------
    @property
    def arrived(self) -> np.ndarray:
        return self.core.ready_mask() & ~self.held

    @property
    def flight(self) -> np.ndarray:
        return ~self.core.ready_mask() & ~self.held

    def envs_in(self, mask: np.ndarray) -> int:
        """The envs of the slots in `mask`."""
        return int(self.slot_envs[mask].sum())

    def rows_of(self, slots: np.ndarray) -> np.ndarray:
        """The env ids of these slots, one after another."""
        return self.core.slot_rows(slots)

    # -- the serving moves ---------------------------------------------------------------
    def poll(self, timeout_ms: int = POLL_MS) -> None:
        """Take the rings (waiting up to timeout_ms for the first) and, when due, supervise."""
        now = time.monotonic()
        with hidden_main():  # dormant groups may start
            rang = self.core.poll(now, timeout_ms)
        for w in np.unique(self.slot_worker[rang]).tolist():
            self.silent_restarts.pop(w, None)
        if self.supervise_timer.due(now):
            with hidden_main():  # it may start replacements
                replaced = self.core.supervise(now)
            for w in replaced:
                self._count_silent_restart(w)

    def _count_silent_restart(self, worker_id: int) -> None:
        """A worker that never rings between replacements is not a fault of one env but a type
        that cannot be built (the worker gives up after MAX_BUILD_ATTEMPTS of one env): said,
        not waited on."""
        n = self.silent_restarts[worker_id] = self.silent_restarts.get(worker_id, 0) + 1
        if n > MAX_SILENT_RESTARTS:
            h = self.core.fleet.by_id[worker_id]
            last = None
            if self.faults is not None:
                self.faults.drain(worker_id)
                last = next((q[-1] for e in range(h.env_lo, h.env_hi) if (q := self.faults.by_env.get(e))), None)
            why = f"{last['error_type']}: {last['message']}" if last else "no error record"
            raise RuntimeError(
                f"rlpipe.vector: worker {worker_id} (envs {h.env_lo}..{h.env_hi - 1}) was "
                f"replaced {n} times without building its envs; last error: {why}"
            )

    def wait(self, done) -> None:
        """Poll until `done()`; the watchdog and the step deadline bound how long that takes."""
        while not done():
            self.poll()

    def send(self, slots: np.ndarray, disc: np.ndarray, cont: np.ndarray | None) -> None:
        """Held slots' actions (rows of the full-size `disc`/`cont`) out, and their rings (a gone
        worker leaves them unanswered: the fleet replaces it and its new generation rings)."""
        rows = self.rows_of(slots)
        actions = {"discrete": disc[rows]}
        if cont is not None:
            actions["continuous"] = cont[rows]
        self.core.send(slots, actions)
        self.held[slots] = False

    def recv(self, slots: np.ndarray) -> Round:
        """The obs, step results and final obs of these arrived slots, in their order, handed
        to the caller (held) from now on: an rlpipe.protocol.Round."""
        rnd = self.core.recv(slots)
        self.held[slots] = True
        return rnd

    # -- stop ----------------------------------------------------------------------------
    def close(self) -> None:
        """Everything the engine started, in reverse order, each step guarded (the slice
        engine's teardown); the forkserver with the last engine of the process and, if the
        engine made it, the run dir."""
        global _started_engines
        steps = self.core.stop_steps()
        if self.started:
            _started_engines -= 1
            if _started_engines == 0:
                steps.append(release_forkserver)
        for step in steps:
            try:
                step()
            except Exception:
                log.exception("rlpipe.vector: a close step failed")
        self.core.unlink_segments()
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

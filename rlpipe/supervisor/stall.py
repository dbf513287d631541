"""The driver watched too: a stall detector outside the loop's locks.

The watchdog heals workers; nothing healed a driver whose own loop stopped (a deadlock, the
PPO update thread stuck, a hung C call that released the GIL). `StallWatch` is a thread that
reads two timestamps the loop stores without a lock (`LoopMarks`: the last env step served,
the last PPO update finished) and, when neither moved for `run.stall_timeout_s`:

1. dumps every thread's stack into `<run_dir>/stall_stacks.txt` (faulthandler: no lock, no
   allocation-heavy formatting), under one line saying what stalled;
2. writes that line to stderr with os.write (the logging module's handler locks may be what
   the loop holds) and, bounded, as a `driver_stall` lifecycle row;
3. cleans up what a killed run would leave, taking no lock the loop may hold: every child
   process of the driver (Redis, the forkserver and its workers, the random-return probe)
   SIGKILLed, the run's /dev/shm segments, socket files and multiprocessing temp dir removed,
   its cgroups removed; the checkpoints already written are left as they are;
4. exits with EXIT_STALL (`os._exit`: the stuck threads cannot be joined), so a supervisor
   (systemd `Restart=on-failure`, `torchrun --max-restarts`) restarts the same command
   line, which with `run.resume=auto` continues from the newest checkpoint.

What counts as progress: a served step and a finished update. Until the loop has served its
first step, each of its turns counts too (the hot workers are still building their envs,
which the watchdog judges by `heartbeat.startup_timeout_s`), and during teardown each step
does (a teardown that hangs, e.g. on an update thread that never ends, is a stall as well).
The watch starts with the loop: start-up before it has its own timeouts (Redis, forks).

A process stopped and continued (SIGSTOP, Ctrl-Z) is not a stalled loop: when this thread
itself slept far past its turn, the pause counts as progress.

Not covered: a C call that holds the GIL. This thread then never runs; the process is stuck
until killed from outside (Redis still dies with it, workers and the probe exit once it is
gone). faulthandler's C watchdog (dump_traceback_later) could cover it, but it cannot tell a
held GIL from a stopped process, and would end a run paused for longer than its timeout.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from rlpipe.shm.segment import SHM_DIR, run_segments
from rlpipe.supervisor.services import SOCKET_NAMES
from rlpipe.supervisor.stopping import process_started_at, stopped_by, write_short_summary

EXIT_STALL = 4  # beside 0 (done), 2 (config), 3 (rank lost), 128+n (signal)
STACKS_FILE = "stall_stacks.txt"
CLEANUP_BOUND_S = 15.0  # the emergency cleanup gets this long, then the process exits anyway
LIFECYCLE_FLUSH_S = 2.0  # how long the stall's lifecycle row may take to be committed
KILL_PASSES = 3  # children listed and killed again: a start in flight forks late
PAUSED_S = 5.0  # the watch woke this much later than its turn: the process was stopped


class LoopMarks:
    """What the driver's loop last did and when (time.monotonic()). Plain attribute stores:
    one per event, no lock, so a stuck loop can never hold what the watch needs to read."""

    def __init__(self) -> None:
        now = time.monotonic()
        self.served_at = now  # the last env step served (learner.serve)
        self.updated_at = now  # the last PPO update finished (poll_update returned stats)
        self.alive_at = now  # other progress: loop turns before the first serve, teardown steps
        self.serving = False  # set at the first serve: from then on turns are not progress
        self.phase = "start"  # what the loop was last doing (a cheap label)

    def last_progress(self) -> float:
        return max(self.served_at, self.updated_at, self.alive_at)

    def ages(self, now: float) -> dict:
        """What the stall line and row say: seconds since each kind of progress, the phase."""
        return {
            "since_step_served_s": round(now - self.served_at, 1),
            "since_update_finished_s": round(now - self.updated_at, 1),
            "phase": self.phase,
        }

    def describe(self, now: float) -> str:
        a = self.ages(now)
        return (
            f"no env step served for {a['since_step_served_s']} s, no PPO update finished for "
            f"{a['since_update_finished_s']} s; the loop was last at: {a['phase']}"
        )


class StallWatch:
    """The watch thread. `cleanup` is the run's emergency cleanup (`emergency_cleanup` with the
    run's names bound); `record(detail)` writes the lifecycle row and waits (bounded) for its
    commit (None: no row)."""

    def __init__(
        self,
        timeout_s: float | None,
        run_dir: Path,
        marks: LoopMarks,
        cleanup: Callable[[], None],
        record: Callable[[dict], None] | None = None,
    ):
        self.timeout_s = timeout_s
        self.run_dir = run_dir
        self.marks = marks
        self.cleanup = cleanup
        self.record = record
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.timeout_s is None or self._thread is not None:
            return
        self.marks.alive_at = time.monotonic()  # armed now: start-up before this is not counted
        self._thread = threading.Thread(target=self._run, name="rlpipe-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        last_turn = resumed_at = time.monotonic()
        while not self._stop.wait(period):
            now = time.monotonic()
            if now - last_turn > period + PAUSED_S:
                resumed_at = now  # the whole process was stopped, the loop with it
            last_turn = now
            if now - max(self.marks.last_progress(), resumed_at) >= self.timeout_s:
                self._stalled(now)

    def _stalled(self, now: float) -> None:
        line = (
            f"rlpipe: driver stalled (run.stall_timeout_s={self.timeout_s:g}): "
            f"{self.marks.describe(now)}; every thread's stack is in {self.run_dir / STACKS_FILE}; "
            f"exiting with code {EXIT_STALL} (the checkpoints are kept: run.resume=auto continues)"
        )
        try:
            dump_stacks(self.run_dir / STACKS_FILE, line)
        except OSError:
            pass  # a full or gone disk: still clean up and exit
        os.write(2, (line + "\n").encode())
        self._short_summary(now)
        # The row and the cleanup each get a bound; nothing after this returns to the loop.
        detail = {**self.marks.ages(now), "stall_timeout_s": self.timeout_s, "exit_code": EXIT_STALL}
        worker = threading.Thread(
            target=self._row_and_cleanup, args=(detail,), name="rlpipe-stall-cleanup", daemon=True
        )
        worker.start()
        worker.join(CLEANUP_BOUND_S)
        os._exit(EXIT_STALL)

    def _short_summary(self, now: float) -> None:
        """summary.json says why the run stopped; its figures are the loop's, which is stuck,
        so none is given (`env_steps` null: not measured; a restart's summary replaces it)."""
        at_s = time.time() - process_started_at()
        ages = self.marks.ages(now)
        loop_at = ages.pop("phase")
        stop = stopped_by("stall", at_s, phase="running", loop_at=loop_at, stall_timeout_s=self.timeout_s, **ages)
        try:
            write_short_summary(self.run_dir, stop, env_steps=None, wall_s=round(at_s, 3), exit_code=EXIT_STALL)
        except OSError:
            pass  # a full or gone disk: the line on stderr says it all

    def _row_and_cleanup(self, detail: dict) -> None:
        if self.record is not None:
            try:
                self.record(detail)
            except Exception:
                pass  # the lifecycle writer is part of what may be stuck
        self.cleanup()


def dump_stacks(path: Path, header: str) -> None:
    """`header`, then every thread's stack (faulthandler writes straight to the fd)."""
    with open(path, "w") as f:
        f.write(header + "\n\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)


def _ours_to_kill(proc: psutil.Process) -> bool:
    """Every descendant but multiprocessing's resource tracker: it exits by itself when this
    process does (its pipe closes), and killed first it would be relaunched by the next
    multiprocessing call of a loop that is slow rather than stuck."""
    try:
        return "multiprocessing.resource_tracker" not in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def kill_children() -> None:
    """SIGKILL every descendant of this process: Redis, the forkserver, its workers, the
    random-return probe. psutil reads /proc: no lock of ours."""
    for _ in range(KILL_PASSES):
        children = [c for c in psutil.Process().children(recursive=True) if _ours_to_kill(c)]
        if not children:
            return
        for child in children:
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=1.0)  # reaps our direct children; others go to init


def emergency_cleanup(
    run_id: str, sock_dir: Path | None, run_dir: Path, cgroup_cleanup: Callable[[], None] | None
) -> None:
    """What the teardown would remove, without it: processes first (nothing may recreate a
    segment or socket after), then segments, sockets, the multiprocessing temp dir and the
    cgroups. Each step guarded: one failure must not keep the rest. A loop that is slow rather
    than stuck may start a worker meanwhile: processes and segments are swept once more last
    (a child started after that still dies with this process, PR_SET_PDEATHSIG, and the next
    run's start-up sweeps segments and socket dirs of dead drivers)."""
    unlink_segments = lambda: [(SHM_DIR / name).unlink(missing_ok=True) for name in run_segments(run_id)]  # noqa: E731
    steps = [
        kill_children,
        unlink_segments,
        lambda: remove_sockets(sock_dir, run_dir),
        remove_mp_temp_dir,
        cgroup_cleanup or (lambda: None),
        kill_children,
        unlink_segments,
    ]
    for step in steps:
        try:
            step()
        except Exception as exc:
            os.write(2, f"rlpipe: stall cleanup step failed: {exc!r}\n".encode())


def remove_sockets(sock_dir: Path | None, run_dir: Path) -> None:
    """A private socket dir in /tmp goes whole; in the run dir only the socket files go."""
    if sock_dir is None:
        return
    if sock_dir != run_dir:
        shutil.rmtree(sock_dir, ignore_errors=True)
        return
    for name in SOCKET_NAMES:
        (sock_dir / name).unlink(missing_ok=True)


def remove_mp_temp_dir() -> None:
    """multiprocessing's temp dir (`rlpipe.supervisor.services.multiprocessing_temp_dir`):
    removed by an atexit hook that os._exit skips."""
    path = mp.process.current_process()._config.get("tempdir")
    if path:
        shutil.rmtree(path, ignore_errors=True)

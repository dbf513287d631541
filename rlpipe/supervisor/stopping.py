"""How a run stops, at any moment: what a stop signal does before the driver exists, during
its start-up, while it runs and during its teardown, and the `stopped_by` record that every
`summary.json` carries (docs/running.md, "Stopping a run").

- From the first line of `python -m rlpipe` (`record_stop_signals`), SIGINT and SIGTERM only
  record themselves: Python's default SIGINT handler would raise KeyboardInterrupt inside
  whatever import or child start it lands in (a traceback, exit 1, nothing written). The app
  and the driver look at the record at their own safe points (`pending`, `StopRequested`).
- The run's services must outlive a terminal's Ctrl-C, which goes to the whole foreground
  process group, until the driver has taken its last checkpoint: the embedded Redis runs in
  a process group of its own (rlpipe.supervisor.redis_service), the workers make their own
  (rlpipe.worker.process), and the forkserver, which multiprocessing starts in the driver's
  group, ignores both stop signals from its first instruction on (rlpipe.proctree's
  `stop_signals_blocked` around its start, `forkserver_ignores_stop_signals` in its first
  preload module). The lifecycle writer is a thread of the driver.
- A stop that comes before the driver is up writes a short summary (`write_short_summary`),
  as does the stall watch (exit 4) whose loop is stuck.

Imports only rlpipe.proctree (where the forkserver's side lives, as the worker layer
imports it): the app's `__main__` imports this module before anything else.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from pathlib import Path

from rlpipe.proctree import STOP_SIGNALS

SUMMARY_FILE = "summary.json"

_pending: int | None = None  # the first stop signal received before the driver took over
_pending_at: float | None = None  # ... and when (wall time)


def _record(signum, _frame) -> None:
    global _pending, _pending_at
    if _pending is None:
        _pending, _pending_at = signum, time.time()


def record_stop_signals() -> None:
    """SIGINT and SIGTERM only record themselves from now on (the driver installs its own
    handlers later and takes over what was recorded: `pending`)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def pending() -> int | None:
    """The stop signal received before the driver's own handlers, if any."""
    return _pending


def pending_at_s() -> float:
    """When the pending stop signal came, in seconds since this process started."""
    return (_pending_at or time.time()) - process_started_at()


def signal_name(signum: int | None) -> str | None:
    return signal.Signals(signum).name if signum else None


class StopRequested(Exception):
    """A stop signal came during the driver's start-up: raised at the next start-up phase, so
    the teardown takes down what was started so far instead of starting the rest."""

    def __init__(self, signum: int, phase: str):
        super().__init__(f"stopped by {signal_name(signum)} during start-up (after: {phase})")
        self.signum = signum
        self.phase = phase


def exit_now(code) -> None:
    """The end of `python -m rlpipe`, once every job is over: the exit handlers (logging's
    flush, multiprocessing's, the run's temp dirs), then the process exits without the
    interpreter's own teardown of its modules, which took 1.3 s after `import torch` alone
    here and 2.5 s after a run, between the last line and the exit a user waits for.
    `code` as SystemExit's: None is 0, a message is printed and exits 1."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed or full stream: nothing more can be said on it
        os._exit(code or 0)


# -- the record of why a run stopped ---------------------------------------------------------


def stopped_by(
    reason: str,
    at_s: float,
    signum: int | None = None,
    phase: str | None = None,
    **detail,
) -> dict:
    """`summary.json` `stopped_by`: `reason` is `total_env_steps`, `duration`, `signal`,
    `disk_full` or `stall`; `signal` the signal's name when one came (also one that came during
    the teardown of a run that had reached its stop condition); `phase` where the run was
    when it stopped (`start-up`, `running`, `teardown`); `at_s` seconds since the process
    started."""
    return {"reason": reason, "signal": signal_name(signum), "phase": phase, "at_s": round(at_s, 3), **detail}


def condition_reached(total_env_steps: int | None, env_steps: int, duration_s: float | None) -> dict:
    """Which stop condition ended a run that stopped by itself."""
    if total_env_steps and env_steps >= total_env_steps:
        return {"reason": "total_env_steps", "limit": total_env_steps}
    if duration_s:
        return {"reason": "duration", "limit": duration_s}
    return {"reason": "stop condition"}


def process_started_at() -> float:
    """The wall time this process started (a run's clock starts there: rlpipe.supervisor.driver)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stat = Path("/proc/self/stat").read_text()
    start_ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - start_ticks / ticks)


def write_short_summary(run_dir: Path, stop: dict, **fields) -> Path:
    """`summary.json` of a run that stopped before it had figures to report (a signal during
    start-up, a stall): why it stopped and what is known. Written whole or not at all."""
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({**fields, "stopped_by": stop}, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def say_stopped_in_startup(signum: int, phase: str, at_s: float, summary: Path | None, prefix: str = "") -> None:
    """The one line of a run stopped before its first step."""
    where = f"; {summary}" if summary is not None else ""
    print(
        f"rlpipe {prefix}stopped by {signal_name(signum)} during start-up at {at_s:.1f} s "
        f"(after: {phase}): nothing trained{where}",
        flush=True,
        file=sys.stdout,
    )


class StopRecord:
    """The driver's side: where it was when its stop signal came (`came`), and the
    `stopped_by` it reports at the end."""

    def __init__(self) -> None:
        self.phase: str | None = None  # start-up, running or teardown, when the signal came
        self.at_s: float | None = None
        self.last_phase = "process start"  # the last start-up phase the driver reached
        self.tearing_down = False

    def came(self, started: bool, at_s: float) -> None:
        self.phase = "teardown" if self.tearing_down else ("running" if started else "start-up")
        self.at_s = at_s

    def stopped_by(
        self, spec, learner, signum: int | None, disk_full: str | None, end_s: float, loop_ran: bool
    ) -> dict:
        """`spec` a RunSpec, `learner` the CentralLearner (None before it was built); `end_s`
        the end of the stepping loop (or now, when it never ran), from the run's start."""
        if disk_full is not None:
            phase = self.phase or ("running" if loop_ran else "start-up")
            return stopped_by("disk_full", end_s, signum, phase, what=disk_full)
        if signum is not None and self.phase != "teardown":
            after = {"after": self.last_phase} if self.phase == "start-up" else {}
            return stopped_by("signal", self.at_s if self.at_s is not None else end_s, signum, self.phase, **after)
        steps = learner.global_env_steps if learner is not None else 0
        condition = condition_reached(spec.run.total_env_steps, steps, spec.run.duration_s)
        reason = condition.pop("reason")
        return stopped_by(reason, end_s, signum, "teardown" if signum else "running", **condition)

    def short_summary(self, run_dir: Path, stop: dict, spec, resumed_from_step: int, wall_s: float) -> None:
        """A run stopped before its loop ran: the short summary and, for a signal, its line."""
        path = write_short_summary(
            run_dir,
            stop,
            stage=spec.stage,
            env_count=spec.env_count,
            env_steps=resumed_from_step,  # none stepped in this start
            wall_s=round(wall_s, 3),
            resumed_from_step=resumed_from_step,
        )
        if stop["reason"] == "signal":
            say_stopped_in_startup(signal.Signals[stop["signal"]], stop.get("after", "?"), stop["at_s"], path)

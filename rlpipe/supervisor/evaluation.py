"""Evaluation during training, as the driver sees it: every `eval.interval_s` a snapshot of the
acting policy and a child process that plays deterministic episodes of each env type with it,
on envs of its own (`python -m rlpipe.eval.during`, at nice 19); its results charted as
`eval/<type>` when they arrive.

Why a snapshot and not the newest checkpoint: checkpoints come every
`learner.checkpoint_interval_s`, on their own clock, and may be minutes old; the snapshot is
the weights that act at that moment (the learner's `actor`: an update thread may be changing
`policy` meanwhile), saved atomically with the env steps they were taken at.

Why a program and not a `fleet.ctx` process like the random-return probe: the round reuses
`rlpipe.eval` (loader and play), which sits above the supervisor (docs/architecture.md,
Package layers), so the driver starts it by name instead of importing it. Its own session
keeps a terminal's Ctrl-C away from it: the driver's teardown stops it, on every way out.

At most one round runs at a time: a round due while one runs is skipped and counted. A round
that fails (exit code not 0, or still running after every type's budget and START_ALLOWANCE_S)
is logged with its stderr's last lines, counted, and the next round tries again. The child
appends its line to `eval/history.jsonl` itself; the driver reads the lines that are new.
Nothing else stays: the snapshot and the child's stderr file are removed after each round.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from rlpipe.cadence import Every
from rlpipe.config import RunSpec
from rlpipe.files import atomic_write

log = logging.getLogger("rlpipe")
HISTORY = "eval/history.jsonl"
SNAPSHOT = "eval/policy_snapshot.pt"
STDERR = "eval/.round.stderr"
# Interpreter, torch (2 s of CPU), the run's config and env descriptions, at nice 19: on a
# machine the workers keep busy (day4) that is minutes, and a round killed for being slow
# would never chart. Past it (and every type's budget) the child is taken as hung in C code,
# where its SIGALRM budget cannot reach, and stopped so the next round can run.
START_ALLOWANCE_S = 600.0
STOP_GRACE_S = 5.0


class HistoryTail:
    """The lines appended to a JSON-lines file since the last read (only whole lines)."""

    def __init__(self, path: Path):
        self.path = path
        # a resumed run's earlier rounds are charted already: start at the end
        self.offset = path.stat().st_size if path.is_file() else 0

    def new_records(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        out = []
        for line in whole.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                log.warning("eval: a line of %s is not JSON, left out: %.200r", self.path, line)
        return out


class Evaluation:
    """The driver's hook: `maybe_start(now, learner)` and `poll()` once a second, `stop()` in
    teardown. Off (every call returns at once) when `eval.interval_s` is null."""

    def __init__(self, spec: RunSpec, run_dir: Path, t0: float, services, on: bool = True):
        self.cfg = spec.eval
        self.run_dir = run_dir
        self.t0 = t0
        self.services = services  # its TensorBoard writer charts the rounds
        self.on = on and self.cfg.interval_s is not None
        self.timer = Every(self.cfg.interval_s or 0.0, first_at=t0 + (self.cfg.interval_s or 0.0))
        self.limit_s = len(spec.env_types) * self.cfg.budget_s + START_ALLOWANCE_S
        self.history = HistoryTail(run_dir / HISTORY)
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.rounds = 0  # rounds appended to the history by this driver
        self.env_steps = 0  # the learner's, at the last call: where counts are charted
        self.skipped = 0  # rounds due while the last one still ran
        self.failed = 0  # rounds that crashed or ran past their limit

    def maybe_start(self, now: float, learner) -> None:
        if not self.on or learner.random or not self.timer.due(now):
            return
        self.env_steps = learner.counters.env_steps
        if self.proc is not None:
            self.skipped += 1
            log.info(
                "eval: a round is due while the last one (started %.0f s ago) still runs: skipped (%d so far)",
                time.monotonic() - self.started_at,
                self.skipped,
            )
            self._chart_counts()
            return
        try:
            self._start(now, learner)
        except OSError as exc:  # a full disk or no fork: that round is lost, never the run
            self.failed += 1
            log.warning("eval: round could not start (%s: %s); the next round tries again", type(exc).__name__, exc)
            self._chart_counts()
            self._clean()

    def _start(self, now: float, learner) -> None:
        import torch

        snapshot = self.run_dir / SNAPSHOT
        snapshot.parent.mkdir(exist_ok=True)
        env_steps = learner.counters.env_steps
        payload = {
            "policy": {k: v.detach().cpu() for k, v in learner.actor.state_dict().items()},
            "compat": learner.compat(),
            "env_steps": env_steps,
        }
        atomic_write(snapshot, lambda f: torch.save(payload, f))
        cfg = self.cfg
        cmd = [
            sys.executable,
            "-m",
            "rlpipe.eval.during",
            str(self.run_dir),
            "--weights",
            str(snapshot),
            "--history",
            str(self.run_dir / HISTORY),
            "--episodes",
            str(cfg.episodes),
            "--budget-s",
            str(cfg.budget_s),
            "--max-steps",
            str(cfg.max_steps),
            "--wall-s",
            f"{now - self.t0:.3f}",
            "--driver-pid",
            str(os.getpid()),
        ]
        with open(self.run_dir / STDERR, "wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        self.started_at = time.monotonic()
        log.info("eval: round started at %d env steps (pid %d)", env_steps, self.proc.pid)

    def poll(self) -> None:
        """Reap a finished round (or end one past its limit) and chart the new lines."""
        if not self.on:
            return
        if self.proc is not None:
            code = self.proc.poll()
            how = f"exit {code}"
            if code is None and time.monotonic() - self.started_at > self.limit_s:
                log.warning(
                    "eval: round still running after %.0f s (every type's budget and %.0f s to start): stopped",
                    self.limit_s,
                    START_ALLOWANCE_S,
                )
                self._end_child()
                code, how = self.proc.returncode, "stopped at its time limit"
            if code is not None:
                if code != 0:
                    self.failed += 1
                    log.warning("eval: round failed (%s); the next round tries again:\n%s", how, self._stderr_tail())
                    self._chart_counts()
                self._clean()
        self._chart_new()

    def stop(self) -> None:
        """Teardown: end a running round, chart what arrived, leave no file of ours behind."""
        if not self.on:
            return
        if self.proc is not None:
            if self.proc.poll() is None:
                log.info("eval: the round in progress is stopped with the run (its line is not written)")
            self._end_child()
        self._clean()
        if self.services.tb is not None:
            self._chart_new()

    # -- the child and its files -------------------------------------------------------------
    def _end_child(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _clean(self) -> None:
        self.proc = None
        for name in (SNAPSHOT, STDERR):
            (self.run_dir / name).unlink(missing_ok=True)

    def _stderr_tail(self, lines: int = 12) -> str:
        try:
            text = (self.run_dir / STDERR).read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(no stderr)"

    # -- charts ------------------------------------------------------------------------------
    def _chart_new(self) -> None:
        for rec in self.history.new_records():
            try:
                values = {
                    f"eval/{name}": float(t["mean"]) for name, t in rec["types"].items() if t.get("mean") is not None
                }
                step = int(rec["env_steps"])
            except (KeyError, TypeError, ValueError, AttributeError):
                log.warning("eval: a history line lacks env_steps or types, left out: %.200r", rec)
                continue
            self.rounds += 1
            if values:
                self.services.tb.scalars(step, values)

    def _chart_counts(self) -> None:
        """Skipped and failed rounds, under their own prefix: every eval/ tag is a type's return."""
        if self.services.tb is not None:
            self.services.tb.scalars(
                self.env_steps, {"eval_rounds/skipped": self.skipped, "eval_rounds/failed": self.failed}
            )

"""Stopping a run at any moment (docs/running.md, "Stopping a run"): a stop signal before the
driver exists, while the forkserver starts and preloads, mid-run to the whole process group (a terminal's
Ctrl-C) and during the teardown each ends with the signal's exit code, one line saying what
stopped the run, a `summary.json` with `stopped_by`, no traceback and nothing left behind.
(Mid-run, SIGTERM to the driver and SIGINT to its group: tests/test_engine.py's signalled runs;
SIGKILL and the restart after it: tests/test_restart.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, driver_dies_with_pytest, read_summary, rlpipe_cmd, run_leftovers, wait_for

SMALL = ("env_mix=cartpole", "env_count=16", "groups.size=8", "logging.random_return_episodes=2")


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """The driver in a process group of its own, as a shell starts a job: a signal to the
    group reaches it and every child that stayed in it (the forkserver, the probe)."""
    run_dir.mkdir(parents=True)
    with open(run_dir.parent / "out.txt", "w") as out, open(run_dir.parent / "err.txt", "w") as err:
        return subprocess.Popen(
            rlpipe_cmd(run_dir, *SMALL, *overrides),
            cwd=REPO,
            stdout=out,
            stderr=err,
            process_group=0,
            preexec_fn=driver_dies_with_pytest,
        )


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def command_line(p: psutil.Process) -> str:
    """A descendant's command line; "" once it has exited (gone, or a zombie its parent has not
    reaped yet: psutil raises for both, and a run's short-lived children hit it)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def finish(proc: subprocess.Popen, run_dir: Path, seen: list[psutil.Process]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) once the driver is gone, after checking that every process
    it had (`seen` and whatever it started since), segment, socket and temp dir went with it."""
    seen = seen + descendants(proc.pid)
    try:
        code = proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    out, err = ((run_dir.parent / name).read_text() for name in ("out.txt", "err.txt"))
    _gone, alive = psutil.wait_procs(seen, timeout=10)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], [p.cmdline() for p in alive]
    assert run_leftovers(proc.pid) == []  # segments, cgroups, socket and multiprocessing temp dirs
    assert not list(run_dir.glob("*.ipc")) and not (run_dir / "redis.sock").exists()
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    return code, out, err


def last_line(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("rlpipe ")][-1]


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Python installs none of its own): the
    first line of rlpipe/__main__.py has run."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_before_the_driver_exists_writes_a_short_summary(short_tmp, sig):
    """The moment rlpipe's first line has run: Python is still importing, Hydra has yet to
    compose (a KeyboardInterrupt traceback and exit 1 before the signals were recorded there;
    before that line, about 0.05 s, Python's defaults apply: docs/running.md)."""
    run_dir = short_tmp / "run"
    proc = start(run_dir, "run.duration_s=30")
    assert wait_for(lambda: catches_sigterm(proc.pid), 30, every_s=0.005)
    os.killpg(proc.pid, sig)
    code, out, err = finish(proc, run_dir, [])
    assert code == 128 + sig, err[-3000:]
    stop = read_summary(run_dir)["stopped_by"]
    assert stop["reason"] == "signal" and stop["signal"] == sig.name and stop["phase"] == "start-up"
    assert f"stopped by {sig.name} during start-up" in last_line(out)
    assert not (run_dir / "checkpoints").exists()


def test_ctrl_c_held_down_while_the_forkserver_starts_stops_the_start_up_cleanly(short_tmp):
    """Ctrl-C to the whole group every 5 ms from the moment Redis is up (the forkserver starts
    next) until the driver exits: the forkserver's start, its preload imports and the first
    worker's are all hit. Before, the forkserver printed a KeyboardInterrupt from its imports
    and the driver stopped on EOFError in fleet._spawn, exit 1."""
    run_dir = short_tmp / "run"
    proc = start(run_dir, "run.duration_s=30")
    log = run_dir / "app.log"
    assert wait_for(lambda: log.exists() and "redis (embedded) up" in log.read_text(), 90, every_s=0.01)
    seen, started = descendants(proc.pid), set()
    while proc.poll() is None:
        for child in descendants(proc.pid):
            if child not in seen:
                seen.append(child)
            with contextlib.suppress(psutil.Error):
                started.add(" ".join(child.cmdline()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.005)
    code, out, err = finish(proc, run_dir, seen)
    assert any("forkserver" in cmd for cmd in started), started  # it was started under the signals
    assert code == 130, err[-3000:]
    stop = read_summary(run_dir)["stopped_by"]
    assert stop["reason"] == "signal" and stop["phase"] == "start-up", stop
    assert "stopped by SIGINT during start-up" in last_line(out)


@pytest.mark.slow
def test_sigint_to_the_driver_alone_mid_run_stops_it_with_a_final_checkpoint(short_tmp):
    """`kill -INT <driver>` (not its group): the same stop as a terminal's Ctrl-C, which
    tests/test_engine.py sends to the group (its SIGINT run)."""
    from rlpipe.learner.checkpoint import checkpoint_files, load_checkpoint

    run_dir = short_tmp / "run"
    proc = start(run_dir, "run.duration_s=120", "reward_norm=per_env", "learner.checkpoint_interval_s=2")
    assert wait_for(lambda: checkpoint_files(run_dir / "checkpoints"), 90), (run_dir.parent / "err.txt").read_text()
    seen = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGINT)
    code, out, err = finish(proc, run_dir, seen)
    assert code == 130, err[-3000:]
    summary = read_summary(run_dir)
    assert summary["stopped_by"]["reason"] == "signal" and summary["stopped_by"]["phase"] == "running"
    assert last_line(out).startswith("rlpipe stopped by SIGINT: ")
    final = load_checkpoint(checkpoint_files(run_dir / "checkpoints")[-1])
    assert final["counters"]["env_steps"] == summary["env_steps"]  # the final one, not a periodic one
    assert final["reward_norm"] and all(state.numel() for state in final["reward_norm"])


def test_a_signal_during_the_teardown_lets_it_finish_and_keeps_the_stop_condition(short_tmp):
    """The run reached run.total_env_steps; a SIGTERM once its workers have been stopped (the
    teardown is under way) changes the exit code, not what the teardown does."""
    run_dir = short_tmp / "run"
    proc = start(run_dir, "run.duration_s=null", "run.total_env_steps=3000")

    def workers():
        return [p for p in descendants(proc.pid) if command_line(p).startswith("rlpipe: worker")]

    seen = wait_for(lambda: len(workers()) == 2 and workers(), 90, every_s=0.05)
    assert seen, (run_dir.parent / "err.txt").read_text()[-3000:]
    everything = descendants(proc.pid)
    psutil.wait_procs(seen, timeout=60)  # the teardown stops the workers first thing
    os.kill(proc.pid, signal.SIGTERM)
    code, out, err = finish(proc, run_dir, everything)
    assert code == 143, err[-3000:]
    stop = read_summary(run_dir)["stopped_by"]
    assert stop["reason"] == "total_env_steps" and stop["signal"] == "SIGTERM" and stop["phase"] == "teardown", stop
    assert "done (SIGTERM during the teardown)" in last_line(out)


def test_every_row_of_the_stopping_and_bad_input_tables_names_a_test_that_exists():
    """docs/running.md's two tables hold each row to a test: the names must be real."""
    import re

    text = (REPO / "docs" / "running.md").read_text()
    tables = text[text.index("## Stopping a run") : text.index("## The learner on a GPU")]
    named = re.findall(r"`(tests/\w+\.py)::(\w+)", tables)
    assert len(named) >= 20, named
    missing = [(f, t) for f, t in named if f"def {t}(" not in (REPO / f).read_text()]
    assert not missing, missing

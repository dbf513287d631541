"""A run that restarts itself (run.resume=auto) and a driver that is watched too
(run.stall_timeout_s): the stall detector's exit, and three supervisors restarting the same
command line: a plain loop standing in for systemd (after a SIGKILL, after a stall) and
torchrun --max-restarts on one node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import psutil
import pytest

from conftest import REPO, compose_cfg, driver_dies_with_pytest, read_summary, rlpipe_cmd, run_leftovers
from rlpipe.config import ConfigError, run_spec
from rlpipe.lifecycle.recovery import recovery_report
from rlpipe.supervisor.stall import EXIT_STALL, STACKS_FILE

TORCHRUN = Path(sys.executable).parent / "torchrun"
ENVS = 64
# Short rollouts and a checkpoint every second, so one exists long before the kill; the freeze
# comes 2 s after the first checkpoint (a start counted from its first step froze before any
# checkpoint on a loaded machine, and on a quiet one finished 160k steps before it froze 8 s
# in). The probe of random returns plays for the whole run, so it is alive when the driver
# dies. The stall timeout is 8 s: on this 2-core machine under load the first PPO update alone
# took 4 s (an update with backlog=hold serves nothing).
RUN = [
    f"env_count={ENVS}",
    "run.duration_s=120",
    "learner.rollout_len=8",
    "learner.checkpoint_interval_s=1",
    "logging.random_return_episodes=100000",
    "logging.random_return_budget_s=120",
]
FREEZE = ["chaos.freeze_driver_at_s=2", "run.stall_timeout_s=8"]


def long_run_dir(base: Path) -> Path:
    """A run dir too long for unix socket paths: the run's sockets then live in a socket dir
    of its own in /tmp, which must not be left behind either."""
    return base / ("d" * 80) / "run"


def descendants(pid: int) -> list[tuple[int, float]]:
    """(pid, start time) of every descendant: the start time tells a pid reused later apart."""
    found = []
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append((p.pid, p.create_time()))
    return found


def alive(procs) -> list[int]:
    """The pids still running (a zombie, killed and waiting for init to reap it, is not)."""
    out = []
    for pid, started in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"{pid} (gone)"


def wait_until_gone(pids, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def step_of(ckpt: Path) -> int:
    return int(ckpt.stem.split("_")[1])


def wait_for_checkpoint(proc, run_dir: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not checkpoints(run_dir):
        assert proc.poll() is None, f"the run ended (code {proc.returncode}) before a checkpoint"
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.2)


def start(cmd: list[str], **popen_args) -> subprocess.Popen:
    """The command line with its stderr in a temp file, read back by `finish` (a pipe nobody
    reads while the test watches would fill up and block the driver: a stall of the test's own)."""
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
        preexec_fn=driver_dies_with_pytest,
        **popen_args,
    )
    proc.err_file = err
    return proc


def finish(proc: subprocess.Popen, timeout: float = 120.0) -> str:
    """Wait for the end (killed past `timeout`, which fails the test); its stderr."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the run did not end within {timeout} s:\n{_read(proc)[-3000:]}") from None
    return _read(proc)


def _read(proc: subprocess.Popen) -> str:
    with proc.err_file as f:
        f.seek(0)
        return f.read()


class Generation:
    """One start of the command line, as a supervisor sees it: the driver's pid, every process
    it had (taken while it ran, so the test can ask that none outlives it), its exit code and
    stderr, and the newest checkpoint step it left (what the next start must resume from)."""

    def __init__(self, pid: int, tree: list[tuple[int, float]], code: int, err: str, run_dir: Path):
        self.pid, self.tree, self.code, self.err = pid, tree, code, err
        self.saved = max((step_of(p) for p in checkpoints(run_dir)), default=0)


def watch(
    proc: subprocess.Popen, run_dir: Path, act: Callable[[subprocess.Popen], None] | None
) -> list[tuple[int, float]]:
    """Every process the run had while it ran (the union: workers and the probe start late);
    `act(proc)` once a checkpoint exists (e.g. a SIGKILL)."""
    tree: set[tuple[int, float]] = set()
    while proc.poll() is None:
        tree.update(descendants(proc.pid))
        if act is not None and checkpoints(run_dir):
            act(proc)
            act = None
        time.sleep(0.3)
    return sorted(tree)


def restart_loop(
    cmd: list[str],
    run_dir: Path,
    act: Callable[[subprocess.Popen], None] | None,
    restart_codes: set[int],
    most: int = 4,
    ended: Callable[[Generation], None] | None = None,
    env: dict[str, str] | None = None,
) -> list[Generation]:
    """Start `cmd` (in `env`), `act` on its first start once a checkpoint exists, and start
    `cmd` again, unchanged, while it ends with one of `restart_codes` (systemd's
    Restart=on-failure), at most `most` times in all; `ended(generation)` as each one ends,
    before the next starts."""
    gens: list[Generation] = []
    while len(gens) < most:
        proc = start(cmd, env=env)
        try:
            deadline = threading.Timer(120, proc.kill)  # a hung start fails the test, not the suite
            deadline.start()
            tree = watch(proc, run_dir, None if gens else act)
            err = finish(proc)
        finally:
            deadline.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        gens.append(Generation(proc.pid, tree, proc.returncode, err, run_dir))
        if ended is not None:
            ended(gens[-1])
        if proc.returncode not in restart_codes:
            break
    return gens


def lifecycle_rows(run_dir: Path, kind: str) -> list[dict]:
    with contextlib.closing(sqlite3.connect(f"file:{run_dir}/lifecycle.sqlite?mode=ro", uri=True)) as db:
        return [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = ?", (kind,))]


def assert_nothing_left(gen: Generation) -> None:
    """No process, segment, socket dir, multiprocessing temp dir or cgroup of a dead generation."""
    assert gen.tree, "the generation had no child processes to watch"
    left = wait_until_gone(gen.tree)
    assert left == [], [_cmdline(p) for p in left]
    assert run_leftovers(gen.pid) == []


def assert_resumed_to_the_end(run_dir: Path, gens: list[Generation], total: int) -> None:
    last = gens[-1]
    assert last.code == 0, last.err[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == gens[-2].saved > 0  # the dead run's newest checkpoint
    assert summary["env_steps"] >= total > summary["resumed_from_step"]
    assert summary["active_envs_end"] == summary["env_count"] == ENVS


# -- run.resume values ---------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [("true", True), ("false", False), ("auto", "auto")])
def test_resume_takes_true_false_and_auto(value, expected):
    assert run_spec(compose_cfg([f"run.resume={value}"])).run.resume == expected


@pytest.mark.parametrize("value", ["yes", "True_", "1", "'true'"])
def test_other_resume_values_are_one_paragraph_naming_the_key(value):
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg([f"run.resume={value}"]))
    text = str(err.value)
    assert "run.resume=" in text and "auto" in text and "\n" not in text


def test_resume_true_without_a_checkpoint_is_an_error_and_auto_starts_fresh(short_tmp):
    """true means "continue this run": an empty run dir (a wrong hydra.run.dir) is exit 2;
    auto, for a supervisor's first start, starts fresh."""
    base = [
        f"hydra.run.dir={short_tmp / 'strict'}",
        "env_count=8",
        "run.total_env_steps=3000",
        "logging.random_return_episodes=0",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe", *base, "run.resume=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "run.resume=true" in out.stderr and "holds no checkpoint" in out.stderr
    assert "Traceback" not in out.stderr
    base[0] = f"hydra.run.dir={short_tmp / 'auto'}"
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe", *base, "run.resume=auto"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_summary(short_tmp / "auto")["resumed_from_step"] == 0


# -- the stall detector, and a loop restarting on its exit code ------------------------------


@pytest.fixture(scope="module")
def stall_restarts():
    """A plain loop restarting on EXIT_STALL over a run that freezes (chaos) 2 s after its
    first checkpoint, to a step target of 60k (its last checkpoint before the freeze was at
    10-11k steps on this machine, quiet, on a slow day, 6-7k beside a benchmark, 2026-12-03:
    the target leaves a fast day's first start 3x room; the restart's remaining steps are the
    fixture's time); what the first start left when it ended, before the restart, is kept
    for the stall detector's own checks."""
    import shutil

    base = Path(tempfile.mkdtemp(prefix="rlr", dir="/tmp"))
    run_dir, total = long_run_dir(base), 60000
    cmd = rlpipe_cmd(run_dir, *RUN, f"run.total_env_steps={total}", "run.resume=auto", *FREEZE)
    first: dict = {}

    def at_checkpoint(proc: subprocess.Popen) -> None:
        first["sockets_in_tmp"] = list(Path("/tmp").glob(f"rlpipe_{proc.pid}-*"))

    def ended(gen: Generation) -> None:
        if "gen" in first:
            return
        stacks = run_dir / STACKS_FILE
        first.update(
            gen=gen,
            stacks=stacks.read_text() if stacks.exists() else "",
            checkpoints=checkpoints(run_dir),
            summary=json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None,
            stalls=lifecycle_rows(run_dir, "driver_stall"),
            freeze=recovery_report(run_dir / "lifecycle.sqlite")["by_kind"].get("freeze_driver"),
        )

    try:
        gens = restart_loop(cmd, run_dir, at_checkpoint, {EXIT_STALL}, ended=ended)
        yield SimpleNamespace(run_dir=run_dir, total=total, gens=gens, first=first)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_frozen_driver_loop_is_found_dumped_cleaned_up_and_exits_with_its_code(stall_restarts):
    """chaos.freeze_driver_at_s blocks the loop; run.stall_timeout_s later the detector dumps
    every thread's stack (naming the frozen frame), records the stall, kills every child of
    the driver, removes its segments, socket dir and temp dir, keeps the checkpoints and exits
    with EXIT_STALL. (The first start of `stall_restarts`, as it was when it ended.)"""
    first = stall_restarts.first
    gen = first["gen"]
    assert first.get("sockets_in_tmp"), "the sockets should be in /tmp here (checked at a checkpoint)"
    assert gen.code == EXIT_STALL, gen.err[-3000:]
    line = next(x for x in gen.err.splitlines() if "driver stalled" in x)
    assert "no env step served for" in line and "chaos.freeze_driver_at_s" in line
    stacks = first["stacks"]
    assert stacks.startswith(line)
    assert "in freeze_driver" in stacks and "driver.py" in stacks and "in loop" in stacks
    assert first["checkpoints"], "the checkpoints written before the stall were kept"
    # a short summary: why it stopped, and no figure of the stuck loop (env_steps: not measured)
    summary = first["summary"]
    assert summary["stopped_by"]["reason"] == "stall" and summary["env_steps"] is None, summary
    assert summary["stopped_by"]["loop_at"] == "chaos.freeze_driver_at_s"
    (stall,) = first["stalls"]
    assert stall["exit_code"] == EXIT_STALL and stall["since_step_served_s"] >= 8
    assert stall["phase"] == "chaos.freeze_driver_at_s"
    freeze = first["freeze"]
    assert freeze["injected"] == freeze["recovered"] == 1  # found by the detector
    assert len(gen.tree) >= 4  # redis, the forkserver, a worker, the probe (and the resource tracker)
    assert_nothing_left(gen)


WATCHED = """
import sys, time
from pathlib import Path
from rlpipe.supervisor.stall import LoopMarks, StallWatch
marks = LoopMarks()
watch = StallWatch(2.0, Path(sys.argv[1]), marks, cleanup=lambda: None)
watch.start()
print("ready", flush=True)
# serving: a step every second of the process's own running time (20 naps of 50 ms), so a
# SIGCONT finds the last step old, as it finds a real loop mid-round
for turn in range(int(float(sys.argv[2]) / 0.05)):
    if sys.argv[3] == "serving" and turn % 20 == 0:
        marks.served_at = time.monotonic()
    time.sleep(0.05)
watch.stop()
"""


def test_a_stopped_and_continued_process_is_not_a_stall_but_a_silent_loop_is(short_tmp):
    """The watch alone, in a process of its own: a loop that keeps serving through a SIGSTOP
    longer than the timeout (Ctrl-Z, then fg) goes on and ends with 0; one that stops
    marking exits with EXIT_STALL after the timeout, its stacks written."""

    def watched(seconds: float, mode: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", WATCHED, str(short_tmp), str(seconds), mode],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        return proc

    paused = watched(6, "serving")  # 1 s, stopped for 8 s, then 5 s (2.5 timeouts) more
    time.sleep(1)
    os.kill(paused.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    silent = watched(30, "silent")  # meanwhile, in the 8 s the other one is stopped
    started = time.monotonic()
    assert silent.wait(20) == EXIT_STALL
    assert 2 <= time.monotonic() - started < 10
    assert "driver stalled (run.stall_timeout_s=2)" in (short_tmp / STACKS_FILE).read_text()
    time.sleep(max(0.0, stopped + 8 - time.monotonic()))  # past period + PAUSED_S, and past the 2 s timeout
    os.kill(paused.pid, signal.SIGCONT)
    assert paused.wait(30) == 0, paused.stderr.read()


# -- supervisors restarting the same command line --------------------------------------------


def test_restart_loop_after_sigkill_resumes_and_leaves_nothing_of_the_dead_run(short_tmp):
    """A plain loop standing in for systemd's Restart=on-failure: the driver is SIGKILLed once
    a checkpoint exists; the same command line (run.resume=auto) continues from it to the
    step target with every env active, and nothing of the killed run is left."""
    run_dir, total = long_run_dir(short_tmp), 30000  # the kill comes a few thousand steps in
    cmd = rlpipe_cmd(run_dir, *RUN, f"run.total_env_steps={total}", "run.resume=auto")
    # The runs' temp dir is one of their own: a `pymp-*` dir in it can only be theirs (in the
    # shared /tmp, another test's multiprocessing, on the other xdist worker, makes them too).
    temp_dir = short_tmp / "temp"
    temp_dir.mkdir()
    gens = restart_loop(
        cmd,
        run_dir,
        lambda p: p.send_signal(signal.SIGKILL),
        {-signal.SIGKILL},
        env={**os.environ, "TMPDIR": str(temp_dir)},
    )
    assert [g.code for g in gens] == [-signal.SIGKILL, 0], gens[-1].err[-3000:]
    assert_resumed_to_the_end(run_dir, gens, total)
    assert_nothing_left(gens[0])
    assert list(temp_dir.glob("pymp-*")) == []


def test_restart_loop_after_a_stall_resumes_and_does_not_freeze_again(stall_restarts):
    """The same loop restarting on EXIT_STALL: the first run freezes (chaos) and the detector
    ends it; the restart resumes from the checkpoint, where the freeze does not apply, and
    finishes: two starts, the freeze comes after a checkpoint however slow the first one was."""
    run_dir, total, gens = stall_restarts.run_dir, stall_restarts.total, stall_restarts.gens
    assert len(gens) == 2, [g.code for g in gens]
    assert gens[0].code == EXIT_STALL and "driver stalled" in gens[0].err
    assert_resumed_to_the_end(run_dir, gens, total)
    for gen in gens[:-1]:
        assert_nothing_left(gen)


def _rank_pid(torchrun_pid: int) -> int | None:
    """The pid of rank 0's driver (the child of torchrun's agent with RANK in its environment)."""
    for child in psutil.Process(torchrun_pid).children():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if "RANK" in child.environ():
                return child.pid
    return None


def test_torchrun_max_restarts_resumes_a_killed_rank_on_one_node(short_tmp):
    """torchrun --standalone --nproc_per_node=1 --max-restarts=1 over the same command line:
    the rank's driver is SIGKILLed once a checkpoint exists; torchrun's restart resumes from
    it and finishes; torchrun's files stay under the test dir."""
    run_dir, total = short_tmp / "run", 30000
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node=1",
        "--max-restarts=1",
        f"--log-dir={short_tmp / 'torchrun'}",
        "-m",
        "rlpipe",
        f"hydra.run.dir={run_dir}",
        "logging.progress_interval_s=2",
        *RUN,
        f"run.total_env_steps={total}",
        "run.resume=auto",
    ]
    elastic_before = set(Path(tempfile.gettempdir()).glob("torchelastic_*"))
    proc = start(cmd, start_new_session=True)  # torchrun's own lines go to stderr too
    try:
        wait_for_checkpoint(proc, run_dir)
        rank = _rank_pid(proc.pid)
        assert rank is not None
        tree = descendants(rank)
        os.kill(rank, signal.SIGKILL)
        killed = Generation(rank, tree, -signal.SIGKILL, "", run_dir)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(120)
    finally:
        if proc.poll() is None:  # only a job that did not end: the survivors' check is below
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = _read(proc)
    assert_resumed_to_the_end(run_dir, [killed, Generation(0, [], proc.returncode, out, run_dir)], total)
    assert_nothing_left(killed)
    assert set(Path(tempfile.gettempdir()).glob("torchelastic_*")) <= elastic_before

"""Hostile envs contained (issue 49): what an env, or a local user beside the run, can do
to a run and the machine, and what the run does about it. Each test runs the real engine on
an env of tests/hostile_gym.py (`env_mix=gym env_mix.id=hostile_gym:<Id>`)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import psutil
import pytest

from conftest import REPO, driver_dies_with_pytest, rlpipe_cmd, run_cli, wait_for

HOSTILE_ENV = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # driver and workers import hostile_gym


def hostile(env_id: str, *overrides: str) -> list[str]:
    return ["env_mix=gym", f"env_mix.id=hostile_gym:{env_id}", "env_count=16", *overrides]


def start_run(run_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    """The driver, its stdout and stderr to files beside the run dir (a pipe would keep
    `finish` waiting on any process that inherited it and outlived the run)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / "stdout.txt", "w") as out, open(run_dir.parent / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            rlpipe_cmd(run_dir, *overrides),
            cwd=REPO,
            stdout=out,
            stderr=err,
            text=True,
            env=env or HOSTILE_ENV,
            preexec_fn=driver_dies_with_pytest,
        )
    proc.run_dir = run_dir
    return proc


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """Wait for the driver's end; its stdout and stderr."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    parent = proc.run_dir.parent
    out, err = (parent / "stdout.txt").read_text(), (parent / "stderr.txt").read_text()
    assert proc.returncode is not None and proc.returncode != -9, (
        f"rlpipe did not finish in {timeout} s:\n{err[-3000:]}"
    )
    return out, err


# -- secrets: the Redis password off the command line, the run dir its owner's ------------------


def _redis_children(driver_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(driver_pid).children()
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if "redis-server" in p.name()]


def test_redis_password_is_not_on_the_command_line_and_the_run_dir_is_private(short_tmp):
    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile("Plain-v0", "run.total_env_steps=3000", "learner.update_envs=16", "learner.checkpoint_interval_s=1"),
    )
    try:
        redis = wait_for(lambda: _redis_children(proc.pid), 60, every_s=0.05)
        assert redis, "the run's embedded redis-server never appeared"
        # what any local user reads in /proc/<pid>/cmdline
        argv = Path(f"/proc/{redis[0].pid}/cmdline").read_bytes().split(b"\0")
    finally:
        out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert not any(b"requirepass" in a or re.fullmatch(rb"[0-9a-f]{32}", a) for a in argv), argv
    assert not list(run_dir.glob("**/redis.conf")), "the password file outlived the server's start"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    checkpoints = list(run_dir.glob("**/ckpt_*.pt"))
    assert checkpoints
    loose = {
        str(p.relative_to(run_dir)): oct(stat.S_IMODE(p.lstat().st_mode))
        for p in run_dir.rglob("*")
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077
    }
    assert not loose, f"group/other may read: {loose}"


# -- children: whatever an env starts dies with its worker ---------------------------------------


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# the clean exit (the worker kills its own tree) is in the slow suite; the default one has the dead worker (the driver kills)
@pytest.mark.parametrize("env_id", [pytest.param("Spawner-v0", marks=pytest.mark.slow), "SpawnerCrash-v0"])
def test_processes_an_env_starts_die_with_its_worker(short_tmp, env_id):
    """Each env starts two `sleep 3600`s, one in a session of its own (setsid). Spawner's
    worker exits cleanly at the end; SpawnerCrash's dies under its envs (os._exit) every few
    steps, so its sleeps are orphans of a dead worker. The probe steps them too."""
    marks = short_tmp / "marks"
    marks.mkdir()
    proc = start_run(
        short_tmp / "run",
        *hostile(env_id, "env_count=8", "run.duration_s=4"),
        env={**HOSTILE_ENV, "HOSTILE_MARKS": str(marks)},
    )
    out, err = finish(proc)
    started = [int(p.name) for p in marks.iterdir()]
    try:
        assert proc.returncode == 0, err[-3000:]
        assert len(started) >= 16  # eight envs, two sleeps each (more: rebuilds, the probe)
        wait_for(lambda: not any(_alive(pid) for pid in started), 2)  # SIGKILLed: gone at once
        left = [pid for pid in started if _alive(pid)]
        assert not left, f"{len(left)} of {len(started)} processes the envs started are still running"
    finally:
        for pid in started:  # never leave them to the next test
            if _alive(pid):
                os.kill(pid, 9)


# -- output: a worker's fd 1 and 2 go to its own capped log, never the driver's terminal ---------


def test_what_an_env_prints_goes_to_its_workers_capped_log(short_tmp):
    """Chatty writes 100 KB a step to each of fd 1 and fd 2 (os.write: as C code would)."""
    from rlpipe.outputlog import CAP_BYTES

    run_dir = short_tmp / "run"
    proc = start_run(run_dir, *hostile("Chatty-v0", "env_count=8", "run.duration_s=null", "run.total_env_steps=400"))
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert len(out) + len(err) < 100_000, f"{len(out) + len(err)} bytes reached the driver's terminal"
    logs = sorted((run_dir / "worker_output").glob("worker_*.log"))
    assert logs
    text = logs[0].read_bytes()
    assert text.startswith(b"--- worker 0 generation 1 pid ")
    assert b"ooooo" in text and b"eeeee" in text  # both descriptors
    # more than the cap was written, what is left is bounded, and the log says what it dropped
    assert re.search(rb"\[rlpipe: \d+ bytes of output dropped so far", text)
    assert all(p.stat().st_size <= 2 * CAP_BYTES for p in logs), [p.stat().st_size for p in logs]


# -- a full disk: its own exit code, one line, the last good checkpoint kept ---------------------


@pytest.fixture
def small_disk(short_tmp):
    """A 2 MB tmpfs (the run dir goes on it); skipped where mounting is not permitted."""
    mnt = short_tmp / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("free_kb", [550, pytest.param(64, marks=pytest.mark.slow)])
def test_a_full_disk_stops_the_run_with_its_own_code_and_one_line(small_disk, free_kb):
    """550 KB free: two checkpoints fit, the third fails mid-run. 64 KB: the lifecycle db
    fails at start-up."""
    from rlpipe.learner.checkpoint import load_latest
    from rlpipe.supervisor.diskfull import EXIT_DISK_FULL

    (small_disk / "filler").write_bytes(b"\0" * (2 * 2**20 - free_kb * 1024))
    run_dir = small_disk / "run"
    overrides = ["env_mix=cartpole", "env_count=16", "run.duration_s=30", "learner.checkpoint_interval_s=1"]
    proc = run_cli(run_dir, *overrides, timeout=120)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == EXIT_DISK_FULL, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("rlpipe: disk full: no space left to write ")]
    assert len(said) == 1, err[-3000:]
    assert "Traceback" not in out + err, (out + err)[-3000:]
    stop = json.loads((run_dir / "summary.json").read_text())["stopped_by"]  # written into the reserve
    assert stop["reason"] == "disk_full", stop
    if free_kb == 64:
        assert "lifecycle db" in said[0] and stop["phase"] == "start-up" and "lifecycle db" in stop["what"]
        return
    assert "checkpoint" in said[0] and "last good checkpoint" in said[0]
    assert stop["phase"] == "running" and "checkpoint" in stop["what"]
    path, _ = load_latest(run_dir / "checkpoints")  # whole, and the one the line names
    assert str(path) in said[0]
    assert not list((run_dir / "checkpoints").glob("*.bad"))


# -- crash loops: backoff, said loudly, logs bounded ---------------------------------------------


def test_fault_backoff_doubles_to_its_cap_and_a_quiet_spell_resets_it():
    from rlpipe.worker.backoff import BACKOFF_AFTER, BACKOFF_BASE_S, BACKOFF_CAP_S, STREAK_RESET_S, FaultBackoff

    b = FaultBackoff(1)
    delays = [b.fault(0, now=float(t)) for t in range(BACKOFF_AFTER + 12)]
    assert delays[: BACKOFF_AFTER - 1] == [0.0] * (BACKOFF_AFTER - 1)
    assert delays[BACKOFF_AFTER - 1 : BACKOFF_AFTER + 2] == [BACKOFF_BASE_S, 2 * BACKOFF_BASE_S, 4 * BACKOFF_BASE_S]
    assert max(delays) == BACKOFF_CAP_S == delays[-1]
    assert not b.due(0, now=BACKOFF_AFTER + 11.0) and b.due(0, now=BACKOFF_AFTER + 11.0 + BACKOFF_CAP_S)
    assert b.fault(0, now=1e6 + STREAK_RESET_S) == 0.0  # a fault long after: a new streak


def _rows(run_dir: Path, kind: str) -> int:
    import sqlite3

    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM events WHERE kind = ?", (kind,)).fetchone()[0]


def test_a_type_that_faults_on_every_step_backs_off_and_is_named(short_tmp):
    """FourValues breaks the contract on every step (16,392 crash/rebuild pairs in 20 s
    before). With the backoff, each env faults BACKOFF_AFTER times at once, then after
    0.5, 1, 2 s...: a handful of times in the seconds a 2,000-step run takes."""
    import json

    run_dir = short_tmp / "run"
    # a step count, not a duration: a loaded machine's start-up took a 5 s run's whole time
    proc = start_run(
        run_dir, *hostile("FourValues-v0", "env_count=8", "run.duration_s=null", "run.total_env_steps=2000")
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    faults = _rows(run_dir, "env_crash")  # the gym adapter's unpacking raises
    assert 8 <= faults <= 8 * 12, faults  # every env faulted, none more than a dozen times
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["types_without_episodes"] == {"FourValues-v0": faults}
    assert "env type FourValues-v0 finished no episode in this run" in out + err
    assert "return last 100: FourValues-v0 no episode;" in out  # the last line says so, not "None"
    report = (run_dir / "health_report.md").read_text()
    assert "every env type finished an episode: **no**: FourValues-v0: no episode finished" in report


# -- a worker's death attributed to the env it was stepping --------------------------------------


def test_a_worker_killed_in_an_envs_step_is_attributed_to_that_env(short_tmp):
    """Segfault's step kills its worker with SIGSEGV: the restart row and errors_top10.md name
    the env, its type, its step and the action it was given."""
    import json
    import sqlite3

    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile("Segfault-v0", "env_count=4", "groups.size=4", "run.duration_s=null", "run.total_env_steps=60"),
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        rows = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'worker_restart'")]
    assert rows, "the worker never died"
    assert all(r["env_type"] == "Segfault-v0" and 0 <= r["env_id"] < 4 for r in rows), rows
    assert all(r["exitcode"] == -11 and r["env_steps"] == 4 and r["last_action"] in (0, 1) for r in rows), rows
    report = (run_dir / "errors_top10.md").read_text()
    assert "WorkerDeath" in report and "Segfault-v0" in report and "SIGSEGV" in report, report


# -- memory: the processes running env code under one limit, the driver spared ------------------


@pytest.mark.slow  # a 20 s run; under a loaded machine's start-up a shorter one may not reach the limit
def test_an_env_that_grows_50_mb_a_step_is_contained_and_named(short_tmp):
    """Hog keeps 50 MB more at every step (6.3 GB of RSS in 16 s before, nothing said). Under
    a 600 MiB limit its worker is killed by the kernel inside the run's cgroup (or, with no
    writable memory cgroup, leaves past its RSS share) and replaced; the run ends 0."""
    import json
    import sqlite3

    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile(
            "Hog-v0",
            "env_count=4",
            "groups.size=4",
            "run.duration_s=20",  # not a step count: its worker's respawns back off
            "groups.active_mem_mb=600",
        ),
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        rows = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'worker_restart'")]
    assert rows, "the hog's worker was never replaced"
    assert summary["peak_rss_mb"] < 600 + 1500, summary["peak_rss_mb"]  # the limit, and the driver beside it
    if summary["cgroup_driver"] == "none":
        assert all(r["reason"] == "rss" for r in rows), rows
        assert "no writable memory cgroup" in out + err
        return
    assert all(r["exitcode"] == -9 and r["env_type"] == "Hog-v0" for r in rows), rows
    report = (run_dir / "errors_top10.md").read_text()
    assert "WorkerDeath" in report and "Hog-v0" in report and "SIGKILL" in report, report
    assert "limited to 600 MiB together" in out + err


# -- a hang: cut at its type's own deadline, not the 30 s default --------------------------------


@pytest.mark.slow  # a 20 s run
def test_a_hung_env_is_cut_at_its_types_measured_deadline(short_tmp):
    """HangOnce's first env blocks in its 10th step. Its type steps in microseconds, so its
    deadline is the floor (5 s), not worker.step_timeout_s (30 s): within a 14 s run the hang
    is cut, the env rebuilt, and its 7 neighbours step on. (Before: no cut within the run.)"""
    import json
    import sqlite3

    from rlpipe.worker.deadlines import FLOOR_S

    run_dir = short_tmp / "run"
    proc = start_run(run_dir, *hostile("HangOnce-v0", "env_count=8", "groups.size=8", "run.duration_s=20"))
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        hangs = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'env_hang'")]
    assert len(hangs) == 1, hangs
    assert f"step exceeded worker.step_timeout_s={FLOOR_S}" in hangs[0]["message"], hangs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] > 8 * 10, summary["env_steps"]  # the envs went on after the hang


def test_a_hung_env_does_not_stall_the_rest_of_its_slice(short_tmp):
    """HangBeside's first env blocks in its 10th step, in a slice with 7 healthy envs of its
    type. While it waits out its deadline (4 s here), the 7 go on stepping: the envs count
    their own steps, and the hung one writes how many its neighbours made while it hung. The
    hang is reported, type named, when its deadline cuts it (an env_hang row and an env_stall
    row). (Before: the slice waited for the deadline, 0 steps beside it.) The stall budget is
    ten times the type's longest step (at least 0.25 s): under the deadline unless a step of
    the type took 0.4 s on a loaded machine."""
    import json
    import sqlite3

    marks = short_tmp / "marks"
    marks.mkdir()
    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile(
            "HangBeside-v0",
            "env_count=8",
            "groups.size=8",
            "worker.slices=1",
            "worker.step_timeout_s=4",
            # a step count, not a duration (a loaded machine's start-up took most of 14 s):
            # the hang begins at step 80, and a worker asked to stop waits its deadline out
            # within heartbeat.term_grace_s (5 s), so the hung env always reports
            "run.duration_s=null",
            "run.total_env_steps=2000",
        ),
        env={**HOSTILE_ENV, "HOSTILE_MARKS": str(marks)},
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        pids = {
            json.loads(d).get("pid") for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'worker_spawn'")
        }
        hangs = db.execute("SELECT env_type, detail FROM events WHERE kind = 'env_hang'").fetchall()
        stalls = db.execute("SELECT env_type, detail FROM events WHERE kind = 'env_stall'").fetchall()
    beside = {int(p.name.split("_")[1]): int(p.read_text()) for p in marks.glob("beside_*")}
    in_workers = [n for pid, n in beside.items() if pid in pids]
    assert in_workers, f"no worker's env hung and was cut: marks {beside}, worker pids {pids}"
    assert in_workers[0] >= 7, f"the hung env's 7 neighbours made {in_workers[0]} steps while it hung"
    assert [t for t, _ in hangs] == ["HangBeside-v0"], hangs
    assert "step exceeded worker.step_timeout_s=4" in json.loads(hangs[0][1])["message"], hangs
    assert [t for t, _ in stalls] == ["HangBeside-v0"], stalls
    stall = json.loads(stalls[0][1])
    assert stall["ended"] == "StepTimeout" and stall["steps_beside"] >= 7, stall


@pytest.mark.slow  # two runs of 10-20 s
@pytest.mark.parametrize("env_id", ["HangBriefly-v0", "HangTwice-v0"])
def test_a_stall_that_comes_back_and_a_hang_beside_a_hang(short_tmp, env_id):
    """HangBriefly's first env blocks 1 s (its deadline: 2 s): detached, it comes back, starts
    a new episode, and no fault is recorded. HangTwice's first two envs block for good: the
    second blocks the thread that took the loop over from the first; once the first is cut the
    main thread waits the second's deadline out, abandons it and the run goes on."""
    import json
    import sqlite3

    run_dir = short_tmp / "run"
    proc = start_run(
        run_dir,
        *hostile(
            env_id, "env_count=8", "groups.size=8", "worker.slices=1", "worker.step_timeout_s=2", "run.duration_s=12"
        ),
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    with sqlite3.connect(run_dir / "lifecycle.sqlite") as db:
        hangs = sorted(e for (e,) in db.execute("SELECT env_id FROM events WHERE kind = 'env_hang'"))
        stalls = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'env_stall'")]
        steps_after = db.execute(
            "SELECT json_extract(detail, '$.steps') FROM events WHERE kind = 'worker_exit'"
        ).fetchall()
        restarts = db.execute("SELECT COUNT(*) FROM events WHERE kind = 'worker_restart'").fetchone()[0]
    assert restarts == 0
    assert len(stalls) == 1, stalls
    if env_id == "HangBriefly-v0":
        assert hangs == [] and stalls[0]["ended"] == "returned", (hangs, stalls)
        assert stalls[0]["steps_beside"] >= 7, stalls
    else:
        assert hangs == [0, 1] and stalls[0]["ended"] == "StepTimeout", (hangs, stalls)
    assert steps_after and steps_after[0][0] >= 1600, steps_after

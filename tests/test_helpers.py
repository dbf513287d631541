"""The shared helpers: atomic writes (rlpipe/files.py), the process-alive check and CPU
count (rlpipe/procs.py), the periodic timer (rlpipe/cadence.py), and the tests' own clean-up
of what a failed test left running (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rlpipe.cadence import Every
from rlpipe.files import atomic_write
from rlpipe.procs import cpu_seconds, parent_pid, pid_alive


def test_atomic_write_text_bytes_and_writer(tmp_path):
    path = tmp_path / "out.txt"
    assert atomic_write(path, "héllo\n") == path and path.read_text(encoding="utf-8") == "héllo\n"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    atomic_write(path, lambda f: f.write(b"from a writer"))
    assert path.read_bytes() == b"from a writer"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")

    def half_then_fail(f):
        f.write(b"half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(child.pid):  # killed, not reaped: a zombie
            assert time.monotonic() < deadline, "a zombie still counts as alive"
            time.sleep(0.05)
        assert os.waitpid(child.pid, os.WNOHANG)[0] == child.pid  # it was a zombie until now
        child.returncode = -signal.SIGKILL
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()
    assert not pid_alive(child.pid)


def test_cpu_seconds_and_parent_of_a_child():
    """A child that spins until its own CPU clock reads 0.3 s shows about that much (/proc
    counts in clock ticks); its parent is us; once reaped, both answers say it is gone."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nwhile time.process_time() < 0.3: pass\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while cpu_seconds(child.pid) < 0.25:
            assert time.monotonic() < deadline, cpu_seconds(child.pid)
            time.sleep(0.05)
        assert cpu_seconds(child.pid) < 0.3 + 5  # it idles on stdin after its spin
        assert parent_pid(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds(child.pid) == 0.0 and parent_pid(child.pid) is None


def test_every_is_due_once_per_interval_counted_from_the_check():
    timer = Every(2.0)
    assert timer.due(100.0)  # first_at 0: due at the first check
    assert not timer.due(101.9) and timer.due(102.5)
    assert not timer.due(104.0) and timer.due(104.5)  # counted from 102.5, not from 102.0
    late = Every(10.0, first_at=50.0)
    assert not late.due(49.9) and late.passed(50.0) and late.passed(50.0)  # passed() does not re-arm
    late.restart(50.0)
    assert not late.due(59.9) and late.due(60.0)


def test_the_resource_sampler_spends_at_most_its_share_of_a_core(monkeypatch, tmp_path):
    """PSS costs the kernel a walk of every mapping: with a hundred workers one sample took a
    tenth of a second of CPU, a tenth of a core at one sample a second. The sampler waits
    cost / MAX_CPU_SHARE after each sample (never less than its interval)."""
    from rlpipe.supervisor import resources

    def costly(_pid: int, _roles, _env_leaks) -> dict:  # burns ~20 ms of this thread's CPU, like a big run
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return {"tree/pss_mb": 123.0}

    monkeypatch.setattr(resources, "process_figures", costly)
    sampler = resources.ResourceSampler(os.getpid(), "norun", tmp_path, 0.5, dict, lambda: None)
    sampler.paced_sample()
    assert sampler.peak_bytes == 123 << 20
    assert sampler.wait_s >= 0.02 / resources.MAX_CPU_SHARE  # >= 2 s between samples
    monkeypatch.setattr(resources, "process_figures", lambda _pid, _roles, _env_leaks: {"tree/pss_mb": 1.0})
    sampler.paced_sample()  # a cheap sample: the interval again
    assert sampler.wait_s == 0.5 and sampler.peak_bytes == 123 << 20 and sampler.last_bytes == 1 << 20


# A child that names its directory on its command line, as a driver's hydra.run.dir does; it
# starts a grandchild, says so, and records a SIGTERM (or ignores it) before it goes.
LEFT_RUNNING = """
import pathlib, signal, subprocess, sys, time
out = pathlib.Path(sys.argv[2])
def stop(*_):
    out.write_text("terminated")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop if sys.argv[3] == "clean" else signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(grandchild.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("kind", ["clean", "deaf"])
def test_what_a_failed_test_left_running_in_its_dir_is_stopped(tmp_path, kind):
    """short_tmp's teardown: a process that names the dir gets SIGTERM (its own teardown), one
    deaf to it SIGKILL after the grace, and the children of either go too; a process that
    names another dir is left alone."""
    from conftest import stop_what_runs_in

    run_dir, other_dir = tmp_path / "run", tmp_path / "other"
    marker = tmp_path / "said"
    left = subprocess.Popen(
        [sys.executable, "-c", LEFT_RUNNING, f"hydra.run.dir={run_dir}", str(marker), kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(other_dir)])
    try:
        grandchild = int(left.stdout.readline())
        # a clean one is not waited for the whole grace: a long grace tells that apart from a
        # loaded machine's slow exit (2.01 s against a 2 s grace once, in a full suite)
        grace_s = 10 if kind == "clean" else 2
        started = time.monotonic()
        stop_what_runs_in(run_dir, grace_s=grace_s)
        took = time.monotonic() - started
        # (psutil reaps the children it waits for, so Popen cannot read their exit codes)
        assert not pid_alive(left.pid) and not pid_alive(grandchild)
        if kind == "clean":
            assert marker.read_text() == "terminated" and took < grace_s
        else:
            assert not marker.exists() and took >= grace_s  # killed once the grace had passed
        assert bystander.poll() is None
    finally:
        for proc in (left, bystander):
            proc.kill()
            proc.wait()

"""Groups: wake order and counts, cgroup drivers on this machine, the `none` fallback."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import delegated_v2_root, read_summary, run_cli
from rlpipe.config import GroupsSpec
from rlpipe.supervisor.cgroups import CgroupRoots, _v1_usable, _v2_usable, make_driver, sweep_dead_cgroups
from rlpipe.supervisor.groups import WakeSchedule


def spec(**kw) -> GroupsSpec:
    base = dict(
        size=70,
        hot=1,
        wake_after_steps=10,
        wake_batch=1,
        wake_growth=1.0,
        cgroup="none",
        dormant_cpu_pct=1.0,
        dormant_mem_mb=512,
        active_mem_mb="auto",
    )
    return GroupsSpec(**{**base, **kw})


def test_wake_order_and_counts():
    s = WakeSchedule(6, spec(hot=2, wake_batch=1, wake_growth=2.0))
    assert s.awake == [True, True, False, False, False, False]
    assert s.due({0: 9, 1: 50}) == []  # group 0 has not made its 10 steps yet
    assert s.due({0: 10, 1: 10}) == [2]  # batch 1, then it doubles
    assert s.due({0: 99, 1: 99, 2: 3}) == []  # waits for the group just woken
    assert s.due({0: 99, 1: 99, 2: 10}) == [3, 4]
    assert s.due({3: 10, 4: 9}) == []
    assert s.due({3: 10, 4: 10}) == [5]  # only one dormant group left
    assert s.all_awake and s.due({5: 1000}) == [] and s.wakes == 3


def test_everything_hot():
    s = WakeSchedule(3, spec(hot=5))
    assert s.all_awake and s.due({}) == []


def _v1_writable() -> bool:
    return all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK) for c in ("cpu", "memory"))


@pytest.mark.skipif(not _v1_writable(), reason="cgroup v1 cpu+memory not writable on this machine")
def test_v1_places_moves_and_cleans_up():
    run_id = f"{os.getpid()}-7e57"
    driver = make_driver("v1", run_id, cpu_pct=1.0, mem_mb=512)
    assert driver.name == "v1"
    proc = subprocess.Popen(["sleep", "30"])
    try:
        for path in driver.dormant_paths(4):
            Path(path).write_text(str(proc.pid))
        groups = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert f"cpu:/rlpipe_{run_id}/g4" in groups and f"memory:/rlpipe_{run_id}/g4" in groups
        g4 = Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}/g4")
        assert (g4 / "cpu.cfs_quota_us").read_text().strip() == "1000"
        assert Path(f"/sys/fs/cgroup/memory/rlpipe_{run_id}/g4/memory.limit_in_bytes").read_text().strip() == str(
            512 * 2**20
        )
        driver.wake(4, proc.pid)
        groups = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert f"cpu:/rlpipe_{run_id}/active" in groups
        driver.hibernate(4, proc.pid)
        assert f"cpu:/rlpipe_{run_id}/g4" in Path(f"/proc/{proc.pid}/cgroup").read_text()
        # the random-return probe's placement: the workers' memory limit, not their CPU weight
        for path in driver.memory_paths():
            Path(path).write_text(str(proc.pid))
        groups = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert f"memory:/rlpipe_{run_id}/active" in groups and f"cpu:/rlpipe_{run_id}/g4" in groups
        assert driver.memory_paths() == [f"/sys/fs/cgroup/memory/rlpipe_{run_id}/active/cgroup.procs"]
        driver.cleanup()  # the live process is moved out, then every dir removed
        assert not Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}").exists()
        assert not Path(f"/sys/fs/cgroup/memory/rlpipe_{run_id}").exists()
    finally:
        proc.kill()
        proc.wait()
        driver.cleanup()


def test_none_fallback_when_nothing_is_writable(tmp_path, caplog):
    # Roots we control: a v2 root without cpu/memory delegated, a v1 root with only `cpu`.
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("freezer\n")
    (tmp_path / "v2" / "cgroup.subtree_control").write_text("")
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    roots = CgroupRoots(v2=tmp_path / "v2", v1=tmp_path / "v1")
    with caplog.at_level(logging.WARNING, logger="rlpipe.cgroups"):
        driver = make_driver("auto", "1-abc", 1.0, 512, roots=roots)
    assert driver.name == "none"
    assert driver.dormant_paths(0) == []
    lines = [r for r in caplog.records if r.name == "rlpipe.cgroups"]
    assert len(lines) == 1 and "cgroup driver: none" in lines[0].getMessage()


def test_sweep_removes_dead_runs_only(tmp_path):
    roots = CgroupRoots(v2=tmp_path / "v2", v1=tmp_path / "v1")
    dead = subprocess.Popen(["true"])
    dead.wait()
    for base in (roots.v2, roots.v1 / "cpu"):
        (base / f"rlpipe_{dead.pid}-abc" / "g1").mkdir(parents=True)
        (base / f"rlpipe_{os.getpid()}-abc").mkdir(parents=True)
    removed = sweep_dead_cgroups(roots)
    assert len(removed) == 2
    assert (roots.v2 / f"rlpipe_{os.getpid()}-abc").exists()
    assert not (roots.v2 / f"rlpipe_{dead.pid}-abc").exists()


def test_engine_wakes_groups_in_order(short_tmp):
    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_count=210",
        "groups.size=70",
        "groups.hot=1",
        "groups.wake_after_steps=20",
        "groups.wake_batch=1",
        "run.duration_s=40",
        "run.total_env_steps=60000",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["active_envs_end"] == 210
    # what `auto` must pick on this machine: v2 with cpu+memory delegated, else writable v1, else none
    roots = CgroupRoots.detect()
    expected = "v2" if _v2_usable(roots.v2) else "v1" if _v1_usable(roots.v1) else "none"
    assert summary["cgroup_driver"] == expected
    with contextlib.closing(sqlite3.connect(f"file:{run_dir}/lifecycle.sqlite?mode=ro&immutable=1", uri=True)) as db:
        wakes = db.execute("SELECT worker_id FROM events WHERE kind = 'group_wake' ORDER BY ts").fetchall()
    assert [w for (w,) in wakes] == [1, 2]


def _die_with_us() -> None:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with pytest


def _drop_interface_files(top: Path) -> None:
    """On cgroupfs a dir's interface files vanish with its rmdir; in a plain directory that
    stands in for a cgroup root they are ordinary files, removed here first."""
    for p in top.rglob("*"):
        if p.is_file():
            p.unlink()


def test_v2_driver_against_a_temporary_root(tmp_path):
    """The v2 driver on a root we control (this machine's v2 hierarchy delegates no cpu or
    memory controller): what `auto` picks, the files it writes, placement, wake, cleanup."""
    roots = delegated_v2_root(tmp_path, "cpuset cpu io memory pids")
    root = roots.v2
    run_id = f"{os.getpid()}-7e58"
    driver = make_driver("auto", run_id, cpu_pct=2.5, mem_mb=256, roots=roots, n_groups=3)
    try:
        assert driver.name == "v2"
        top = root / f"rlpipe_{run_id}"
        assert (top / "cgroup.subtree_control").read_text() == "+cpu +memory"
        assert (top / "cpu.weight").read_text() == (top / "active" / "cpu.weight").read_text() == "300"
        assert driver.dormant_paths(1) == [str(top / "g1" / "cgroup.procs")]
        assert (top / "g1" / "cpu.max").read_text() == "2500 100000"
        assert (top / "g1" / "memory.max").read_text() == str(256 * 2**20)
        assert driver.active_paths() == [str(top / "active" / "cgroup.procs")]
        assert driver.memory_paths() == driver.active_paths()  # one hierarchy: memory comes with cpu
        driver.wake(1, 4242)
        assert (top / "active" / "cgroup.procs").read_text() == "4242"
        driver.hibernate(1, 4243)
        assert (top / "g1" / "cgroup.procs").read_text() == "4243"
        _drop_interface_files(top)
        driver.cleanup()
        assert not top.exists() and root.exists()
        # without cpu+memory in subtree_control, v2 is refused and auto falls back
        (root / "cgroup.subtree_control").write_text("cpu\n")
        assert make_driver("v2", run_id, 1.0, 512, roots=roots).name == "none"
    finally:
        if (root / f"rlpipe_{run_id}").exists():
            _drop_interface_files(root / f"rlpipe_{run_id}")
            driver.cleanup()


@pytest.mark.skipif(not _v1_writable(), reason="cgroup v1 cpu+memory not writable on this machine")
def test_a_dormant_group_is_really_cpu_limited():
    """A busy process in a dormant group's cgroup (1% of a core) gets about 1% of a core:
    its CPU time while dormant, the group's throttling count, then the same process woken."""
    import sys

    run_id = f"{os.getpid()}-d0a1"
    driver = make_driver("v1", run_id, cpu_pct=1.0, mem_mb=512, n_groups=2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_us)
    try:
        for path in driver.dormant_paths(0):
            Path(path).write_text(str(busy.pid))
        proc = psutil.Process(busy.pid)

        def cpu_s() -> float:
            t = proc.cpu_times()
            return t.user + t.system

        time.sleep(0.3)
        c0, t0 = cpu_s(), time.monotonic()
        time.sleep(2.0)
        dormant, span = cpu_s() - c0, time.monotonic() - t0
        stat = Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}/g0/cpu.stat").read_text()
        throttled = int(re.search(r"nr_throttled (\d+)", stat).group(1))
        driver.wake(0, busy.pid)
        c1 = cpu_s()
        time.sleep(2.0)
        awake = cpu_s() - c1
    finally:
        busy.kill()
        busy.wait()
        driver.cleanup()
    assert dormant <= 0.03 * span, dormant  # 1% quota (+ a period's slack)
    assert throttled > 0
    assert awake > 3 * dormant, (awake, dormant)  # the same process, unlimited
    assert not Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}").exists()


@pytest.mark.skipif(not _v1_writable(), reason="cgroup v1 cpu+memory not writable on this machine")
def test_workers_weighed_below_the_learner_leave_it_the_cpu():
    """learner_core by weight (Fleet.startup_over): two busy processes on one CPU, one in the
    run's `active` cgroup (a worker), one outside it (the PPO update). At the run's weight of
    its workers they split the CPU; once the workers yield to the learner, it gets nearly all.

    The learner stands in a cgroup of its own at the run's level, with the default 1,024
    shares. Left in the root cgroup, it shared its session's autogroup with every busy process
    of pytest's session (the other xdist workers' runs), and took 0.27 of the CPU at the
    workers' full weight in one clean-clone CI."""
    import sys

    from rlpipe.supervisor.cgroups import LEARNER_FIRST_SHARES, SHARES_DEFAULT

    run_id = f"{os.getpid()}-1ea4"
    driver = make_driver("v1", run_id, cpu_pct=1.0, mem_mb=512, n_groups=1)
    beside = Path(f"/sys/fs/cgroup/cpu/pytest_learner_{os.getpid()}")
    beside.mkdir()
    cpu = min(os.sched_getaffinity(0))
    one_cpu = [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    worker = subprocess.Popen(one_cpu, preexec_fn=_die_with_us)
    learner = subprocess.Popen(one_cpu, preexec_fn=_die_with_us)
    procs = [psutil.Process(p.pid) for p in (worker, learner)]

    def shares_over(seconds: float) -> list[float]:
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(seconds)
        used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before)]
        return [u / sum(used) for u in used]

    try:
        (beside / "cpu.shares").write_text(str(SHARES_DEFAULT))
        (beside / "cgroup.procs").write_text(str(learner.pid))
        driver.wake(0, worker.pid)
        time.sleep(0.3)
        even = shares_over(1.5)
        assert driver.yield_to_learner()
        top = Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}")
        assert (top / "cpu.shares").read_text().strip() == str(LEARNER_FIRST_SHARES)
        time.sleep(0.3)
        yielded = shares_over(1.5)
    finally:
        for p in (worker, learner):
            p.kill()
            p.wait()
        driver.cleanup()
        beside.rmdir()
    assert 0.3 < even[1] < 0.7, even  # 1,024 shares against 1,024
    assert yielded[1] > 0.85, yielded  # 1,024 against 40: about 0.96
    assert not Path(f"/sys/fs/cgroup/cpu/rlpipe_{run_id}").exists()


def test_yield_to_learner_writes_the_weight_or_says_it_cannot(tmp_path, caplog):
    from rlpipe.supervisor.cgroups import LEARNER_FIRST_WEIGHT, CgroupDriver

    roots = delegated_v2_root(tmp_path)
    run_id = f"{os.getpid()}-1ea5"
    driver = make_driver("v2", run_id, cpu_pct=1.0, mem_mb=256, roots=roots, n_groups=10)
    top = roots.v2 / f"rlpipe_{run_id}"  # a plain directory under tmp_path: pytest removes it
    assert (top / "cpu.weight").read_text() == "1000"
    assert driver.yield_to_learner()
    assert (top / "cpu.weight").read_text() == str(LEARNER_FIRST_WEIGHT)
    top.rename(tmp_path / "gone")  # the write fails: the fleet pins the workers instead
    with caplog.at_level(logging.WARNING, logger="rlpipe.cgroups"):
        assert not driver.yield_to_learner()
    assert "leave its CPU instead" in caplog.records[-1].getMessage()
    assert not CgroupDriver(run_id, 1.0, 256, roots).yield_to_learner()  # no cgroups: pin

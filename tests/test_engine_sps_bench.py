"""benchmarks/engine_sps.py's process layouts and PPO modes: `auto` overrides nothing (conf/'s
layout resolved for the machine), `70` is the layout before auto, the 350x5 layout keeps the
70-env slices (so PPO batches keep their size), the PPO modes name conf/'s affinity, every
CPU or learner_core, and a malformed layout or mode is refused with the flag and what is
allowed. Its PufferLib rows: one worker per CPU, the EnvPool-style batch half the workers'
envs (none with one worker), skipped on one line that says how to install where pufferlib does
not import (as under .venv), and their child leaves no process behind, hung or exited, nor do
its workers once it is SIGKILLed."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO, compose_cfg, load_benchmark
from rlpipe.config import run_spec
from rlpipe.protocol import slice_bounds


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: None)


def test_layouts_compose_into_the_same_slices_in_fewer_processes(two_cpus):
    bench = load_benchmark("engine_sps")
    assert bench.layout_overrides("auto") == [] and bench.layout_name("auto") == "layout auto"
    assert bench.layout_overrides("70") == ["groups.size=70"]
    assert bench.layout_overrides("350x5") == ["groups.size=350", "worker.slices=5"]
    assert bench.layout_name("350x5") == "groups of 350 x 5 slices"
    base = ["env_mix=cartpole", "env_count=7000", *bench.mode_overrides("hold")]
    old = run_spec(compose_cfg(base + bench.layout_overrides("70")))
    wide = run_spec(compose_cfg(base + bench.layout_overrides("350x5")))
    auto = run_spec(compose_cfg(base + bench.layout_overrides("auto")))
    assert (old.groups.size, old.worker.slices, old.layout.workers) == (70, 1, 100)
    assert (wide.groups.size, wide.worker.slices) == (350, 5)
    assert (auto.groups.size, auto.worker.slices) == (700, 10)  # on 2 CPUs, PPO keeping one: 700x10
    assert slice_bounds(wide.groups.size, wide.worker.slices) == [(i, i + 70) for i in range(0, 350, 70)]
    assert wide.learner == old.learner == auto.learner  # the same PPO settings in every layout


def test_ppo_rows_train_with_day4s_update_not_the_quick_starts(two_cpus):
    """conf/env_mix/cartpole.yaml tunes the update to the quick start; the PPO rows run day4's
    own (as on its seed12 mix), whatever the two files set."""
    bench = load_benchmark("engine_sps")
    for backlog in ("hold", "drop"):
        on_cartpole = run_spec(compose_cfg(["env_mix=cartpole", *bench.mode_overrides(backlog)])).learner
        day4 = run_spec(compose_cfg(["+stage=day4", f"learner.backlog={backlog}"])).learner
        assert on_cartpole == day4
    assert run_spec(compose_cfg([])).learner.backlog == "sync"  # the mix's own tuning is real


def test_ppo_modes_name_the_affinity(two_cpus):
    bench = load_benchmark("engine_sps")
    base = ["env_mix=cartpole", "env_count=1000"]
    learner_cpu = {
        mode: run_spec(compose_cfg(base + bench.mode_overrides(mode))).learner_cpu
        for mode in ("hold", "drop+null", "hold+core", "random")
    }
    assert learner_cpu == {"hold": 0, "drop+null": None, "hold+core": 0, "random": None}
    assert bench.mode_name("drop+null") == "engine PPO backlog=drop, workers on every CPU"
    with pytest.raises(SystemExit, match=r"--ppo-modes: 'hold\+all' is not hold or drop"):
        bench.mode_overrides("hold+all")


def test_the_resolved_layout_is_printed_from_the_summary():
    bench = load_benchmark("engine_sps")
    layout = {
        "workers": 20,
        "group_size": 350,
        "slices": 5,
        "cpu_affinity": "learner_core",
        "worker_cpus": [1],
        "learner_cpu": 0,
        "workers_pinned_s": 3.2,
        "learner_core_by": "weight",
    }
    want = "ran 20 x 350 in 5 slices, learner core 0 by weight from 3.2 s"
    assert bench.resolved_layout({"layout": layout}) == want
    assert bench.resolved_layout({}) == "layout not reported"


@pytest.mark.parametrize("bad", ["70x", "x5", "big", "350x5x2", "-70"])
def test_a_malformed_layout_names_the_flag_and_the_form(bad):
    with pytest.raises(SystemExit, match=r"--layouts: .* is not auto, GROUP_SIZE or GROUP_SIZExSLICES"):
        load_benchmark("engine_sps").layout_overrides(bad)


@pytest.fixture
def cpus(monkeypatch):
    """Usable CPUs and physical cores, as PufferLib's worker count reads them."""

    def set_cpus(usable: int, physical: int):
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(usable)))
        monkeypatch.setattr("psutil.cpu_count", lambda logical=True: usable if logical else physical)

    return set_cpus


def test_puffer_rows_run_one_worker_per_cpu_and_half_the_workers_a_batch(cpus):
    bench = load_benchmark("engine_sps")
    cpus(2, 2)
    assert bench.puffer_plan(7000, "puffer_all") == {"workers": 2, "batch": 7000, "zero_copy": True}
    assert bench.puffer_plan(7000, "puffer_half") == {"workers": 2, "batch": 3500, "zero_copy": False}
    # 1,001 = 7 x 11 x 13: one worker divides it, and one worker has no smaller batch
    assert bench.puffer_plan(1001, "puffer_all")["workers"] == 1
    assert "one PufferLib worker at 1001 envs" in bench.puffer_plan(1001, "puffer_half")
    cpus(16, 8)  # PufferLib refuses more workers than physical cores
    assert bench.puffer_plan(1000, "puffer_half") == {"workers": 8, "batch": 500, "zero_copy": False}
    cpus(16, 16)
    assert bench.puffer_plan(1000, "puffer_half") == {"workers": 10, "batch": 500, "zero_copy": False}
    cpus(3, 4)  # a cgroup's 3 CPUs: 3 workers, a batch of one worker's envs
    assert bench.puffer_plan(3000, "puffer_half") == {"workers": 3, "batch": 1000, "zero_copy": False}


@pytest.mark.skipif(importlib.util.find_spec("pufferlib") is not None, reason="pufferlib imports here")
def test_without_pufferlib_its_rows_are_skipped_on_one_line_that_says_how_to_install():
    bench = load_benchmark("engine_sps")
    reason = bench.puffer_rows_asked(None)
    assert reason.startswith("pufferlib not importable: ModuleNotFoundError: No module named 'pufferlib'; ")
    assert "--no-deps pufferlib-core" in reason and "\n" not in reason
    with pytest.raises(SystemExit, match=r"^--puffer: pufferlib not importable"):
        bench.puffer_rows_asked(True)  # asked for by name: an error, not a skip
    assert bench.puffer_rows_asked(False) == "not asked (--no-puffer)"


FORK_A_SLEEPER = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    time.sleep(600)\n"
    "print(os.getpid(), pid, flush=True)\n"
    "time.sleep({parent_sleep})\n"
)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("parent_sleep", [600, 0])
def test_a_child_in_its_own_session_leaves_no_process_behind(parent_sleep):
    """A child that hangs (killed at its timeout) or exits at once, each leaving a forked
    sleeper that holds its stdout (as PufferLib's workers do): both come back, the sleeper
    gone, and the exited one without waiting for the timeout."""
    baselines = load_benchmark("baselines")
    t0 = time.monotonic()
    returncode, stdout, _ = baselines.run_in_own_session(
        [sys.executable, "-c", FORK_A_SLEEPER.format(parent_sleep=parent_sleep)], timeout=3.0 if parent_sleep else 30.0
    )
    child, sleeper = map(int, stdout.split())
    assert returncode == (None if parent_sleep else 0)
    assert time.monotonic() - t0 < 10.0
    assert gone(sleeper) and baselines.session_pids(child) == []


def test_a_fork_after_forks_die_with_their_parent_is_killed_with_its_parent():
    """PufferLib's workers when their child is SIGKILLed: a sleeper forked after
    forks_die_with_their_parent goes with the process that forked it."""
    script = (
        f"import os, sys, time\nsys.path.insert(0, {str(REPO / 'benchmarks')!r})\n"
        "from baselines import forks_die_with_their_parent\n"
        "forks_die_with_their_parent()\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, b'1')\n"  # past the fork's hooks: its parent may go now
        "    time.sleep(600)\n"
        "os.read(r, 1)\n"
        "print(pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    with tempfile.TemporaryFile("w+") as out:  # not a pipe: the sleeper would hold it open
        subprocess.run([sys.executable, "-c", script], stdout=out, timeout=30)
        out.seek(0)
        sleeper = int(out.read())
    try:
        deadline = time.monotonic() + 5.0
        while not gone(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(sleeper)
    finally:
        if not gone(sleeper):
            os.kill(sleeper, signal.SIGKILL)


ENGINE_RUN_STOPPED = """
import sys
sys.path.insert(0, {bench!r})
import engine_sps
engine_sps.stop_on_sigterm()
engine_sps.engine_run(64, 120.0, "random", [])
"""


def test_a_bench_stopped_by_sigterm_stops_its_engine_run_and_leaves_nothing_behind():
    """SIGTERM to the script mid-run (as `kill` or a CI timeout sends it): it exits 143, and
    the engine run it started is stopped cleanly: no process of it left, no /dev/shm segment,
    and the temporary run dir removed. Before, the script died at once, the run went on to
    its end and the temporary dir stayed."""
    import psutil

    script = subprocess.Popen(
        [sys.executable, "-c", ENGINE_RUN_STOPPED.format(bench=str(REPO / "benchmarks"))],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, driver = time.monotonic() + 120, None
        while time.monotonic() < deadline and driver is None:
            for child in psutil.Process(script.pid).children():
                segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"rlpipe_{child.pid}")]
                if "rlpipe" in child.cmdline() and segments:  # the run is up: its workers' segments made
                    driver = child
            time.sleep(0.2)
        assert driver is not None, "the engine run did not start"
        run_dir = next(a.split("=", 1)[1] for a in driver.cmdline() if a.startswith("hydra.run.dir="))
        tree = [driver, *driver.children(recursive=True)]
        script.send_signal(signal.SIGTERM)
        assert script.wait(90) == 128 + signal.SIGTERM
        psutil.wait_procs(tree, timeout=10)
        assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"rlpipe_{driver.pid}")]
        assert not os.path.exists(os.path.dirname(run_dir))
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()


@pytest.mark.parametrize(
    "script, flags, said",
    [
        ("engine_sps.py", ["--counts", "-5"], "argument --counts: -5 is not a positive integer"),
        ("engine_sps.py", ["--seconds", "0"], "argument --seconds: 0 is not a positive number"),
        ("soak.py", ["--minutes", "-1"], "argument --minutes: -1 is not a positive number"),
        ("crash_loop.py", ["--repeats", "two"], "argument --repeats: 'two' is not an integer"),
        ("driver_cost.py", ["--baseline-rev", "no-such-rev"], "argument --baseline-rev: 'no-such-rev' names no commit"),
    ],
)
def test_a_benchmark_refuses_a_value_out_of_range_before_it_runs_anything(script, flags, said, tmp_path):
    """benchmarks/argtypes.py: argparse's usage line, exit 2, nothing started (before: an
    IndexError, a CalledProcessError from git worktree, or an rlpipe run refused half-way
    with its outputs/ folder left)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"{script}: error: {said}")
    assert list(tmp_path.iterdir()) == []

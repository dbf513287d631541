"""End to end through the real CLI: real workers, Redis, ZMQ, SQLite, shared memory."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import time

import psutil
import pytest
from omegaconf import OmegaConf

from conftest import REPO, compose_cfg, driver_dies_with_pytest, read_summary, rlpipe_cmd, run_cli, run_leftovers

SUMMARY_KEYS = {
    "stage",
    "env_count",
    "env_types",
    "active_envs_end",
    "env_steps",
    "wall_s",
    "teardown_s",
    "stopped_by",
    "not_measured",
    "sps",
    "startup_first_step_s",
    "all_envs_ready_s",
    "startup_cpu_s",
    "updates",
    "trained_samples",
    "episodes",
    "mean_return_last100",
    "random_return",
    "initial_policy_return",
    "learned",
    "peak_rss_mb",
    "shm_bytes",
    "faults",
    "board",
    "cgroup_driver",
    "redis",
    "env_versions",
    "loss_std",
    "loss_std_checkpoints",
    "resumed_from_step",
    "dist",
    "layout",
}


def run_processes(driver_pid, run_dir):
    """Processes of one run (other runs may be going on beside the tests): its embedded Redis
    (the run dir is on its command line), workers mapping the run's segments and its PPO
    update process (titled with the driver's pid)."""
    marker = f"rlpipe_{driver_pid}-"
    update = f"rlpipe: ppo update (driver {driver_pid})"
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            if (
                str(run_dir) in cmd
                or cmd.startswith(update)
                or (cmd.startswith("rlpipe:") and any(marker in m.path for m in p.memory_maps()))
            ):
                found.append(f"{p.info['pid']}: {cmd[:100]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def assert_nothing_left(run_dir, driver_pid):
    deadline = time.monotonic() + 10
    while run_processes(driver_pid, run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run_processes(driver_pid, run_dir) == []
    assert run_leftovers(driver_pid) == []
    assert not list(run_dir.glob("*.ipc")) and not (run_dir / "redis.sock").exists()
    assert not list(run_dir.glob("*.sqlite-*"))


def tree_memory(pid: int) -> tuple[int, int]:
    """(sum of PSS, sum of RSS) in bytes over a process and all its descendants, measured
    here, beside the driver's own sampler."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    pss = rss = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            m = p.memory_full_info()
            pss, rss = pss + m.pss, rss + m.rss
    return pss, rss


def worker_cpu_sets(pid: int) -> set[tuple[int, ...]]:
    """The CPU sets the run's worker processes may run on now, seen from outside."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if "rlpipe: worker" in " ".join(p.cmdline()):
                found.add(tuple(sorted(p.cpu_affinity())))
    return found


def expected_shm_bytes(*overrides: str) -> int:
    """The run's segments as the config lays them out: one WorkerLayout per group."""
    from rlpipe.config import run_spec
    from rlpipe.envs.registry import plan_mix
    from rlpipe.shm.layout import WorkerLayout
    from rlpipe.supervisor.workers import group_ranges

    spec = run_spec(compose_cfg(list(overrides)))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    return sum(
        WorkerLayout.build(hi - lo, plan.obs_keys, plan.actions.cont_dim).size
        for lo, hi in group_ranges(spec.env_count, spec.groups.size)
    )


def test_short_run_learns_and_cleans_up(short_tmp):
    run_dir = short_tmp / "run"
    # reward_norm=per_env scales by the std of the discounted return: CartPole's +1 keeps its
    # meaning (the mean-shifting form would turn it into 0 and nothing would be learned)
    overrides = (
        "env_mix=cartpole",
        "env_count=32",
        "run.total_env_steps=30000",  # 153-213 at 25k-40k (2026-12-03): far above the bar below
        "run.duration_s=240",
        "reward_norm=per_env",
        "logging.random_return_episodes=20",  # the default: its figure is checked below
    )
    t_start = time.monotonic()
    proc = subprocess.Popen(
        rlpipe_cmd(run_dir, *overrides),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=driver_dies_with_pytest,
    )
    samples = []  # our own memory samples of the run's process tree
    cpu_sets = set()  # the CPUs its workers were allowed, sample by sample
    try:
        while proc.poll() is None and time.monotonic() - t_start < 240:
            samples.append(tree_memory(proc.pid))
            cpu_sets |= worker_cpu_sets(proc.pid)
            time.sleep(0.5)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - t_start
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    out.pid = proc.pid
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert SUMMARY_KEYS <= set(summary)
    assert summary["env_steps"] >= 30000
    assert summary["env_types"] == {"cartpole": 32}
    assert summary["active_envs_end"] == 32
    assert summary["updates"] > 10
    # Random CartPole lasts ~22 steps; a learning policy is well past that after 30k steps.
    assert summary["mean_return_last100"]["cartpole"] > 60
    assert 10 < summary["random_return"]["cartpole"] < 40  # measured beside the run
    assert summary["learned"] == {"cartpole": "learned"}
    assert summary["trained_samples"] >= summary["updates"] * 32 * 32  # update_envs x rollout_len
    assert summary["redis"] == "embedded"
    # Run figures: taken at the end of the stepping loop, teardown apart.
    first, ready, wall = summary["startup_first_step_s"], summary["all_envs_ready_s"], summary["wall_s"]
    assert 0 < first <= ready <= wall
    # CPU seconds used by the time every env stepped: both sides worked, within what the
    # machine's CPUs could give (the driver's count starts with its interpreter, before t0)
    cpu = summary["startup_cpu_s"]
    assert cpu["driver"] > 0 and cpu["workers"] > 0 and cpu["forkserver"] > 0  # it imported the envs
    assert sum(cpu.values()) <= (ready + 5) * len(os.sched_getaffinity(0)), cpu
    # wall_s counts from the driver process's creation time, which the kernel gives against a
    # boot time in whole seconds (/proc/stat btime): up to 1 s off the test's own clock; and
    # teardown_s now runs to the process's last line, so the two nearly fill `elapsed`
    assert 0 < summary["teardown_s"] and wall + summary["teardown_s"] <= elapsed + 1.0
    stepping_rate = summary["env_steps"] / (wall - first)
    assert abs(summary["sps"] - stepping_rate) <= 0.2 * stepping_rate
    # peak_rss_mb: PSS summed over the whole tree (not the driver alone, not RSS that counts
    # shared pages once per mapper), so between our PSS and RSS samples.
    peak = summary["peak_rss_mb"] * 2**20
    assert 0.85 * max(p for p, _r in samples) <= peak <= 1.1 * max(r for _p, r in samples), (
        summary["peak_rss_mb"],
        max(samples),
    )
    assert summary["shm_bytes"] == expected_shm_bytes(*overrides)
    assert summary["faults"]["lifecycle_dropped"] == 0
    # the layout conf/'s auto chose here, reported; under learner_core (2+ CPUs) the update's
    # CPU became its own the moment every env had stepped: by the workers' cgroup weight where
    # there is a cgroup driver (they keep every CPU), else by moving the worker off it
    from rlpipe.config import run_spec

    layout = run_spec(compose_cfg(list(overrides))).layout
    assert {k: summary["layout"][k] for k in layout.as_dict()} == layout.as_dict()
    if layout.pin_after_startup:
        assert ready <= summary["layout"]["workers_pinned_s"] <= ready + 1.0
        if summary["cgroup_driver"] == "none":
            assert summary["layout"]["learner_core_by"] == "pinning"
            assert layout.worker_cpus in cpu_sets, cpu_sets
        else:
            assert summary["layout"]["learner_core_by"] == "weight"
            assert cpu_sets == {tuple(sorted(os.sched_getaffinity(0)))}, cpu_sets
    else:
        assert summary["layout"]["workers_pinned_s"] is None
        assert summary["layout"]["learner_core_by"] is None
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert "rlpipe done" in out.stdout
    assert_nothing_left(run_dir, out.pid)
    with contextlib.closing(sqlite3.connect(run_dir / "lifecycle.sqlite")) as db:
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall())
    assert kinds["env_create"] == 32 and kinds["worker_spawn"] == 1


def test_mixed_discrete_and_continuous_run(short_tmp):
    """One policy, both heads: losses stay finite and the discrete classic-control type learns."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_mix=mixed",
        "env_count=32",
        "groups.size=16",
        "run.total_env_steps=40000",  # cartpole's last 100: 136 at 40k (2026-12-03), the bar 60
        "run.duration_s=240",
        "learner.update_envs=32",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["env_types"] == {"cartpole": 16, "mountaincar_cont": 16}
    assert summary["updates"] >= 10
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    for tag in ("losses/policy", "losses/value", "losses/entropy"):
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    # random CartPole lasts 22 steps on average (the mean of 100 episodes: 22 +- 1.2)
    assert summary["mean_return_last100"]["cartpole"] > 60
    assert "mountaincar_cont" in summary["mean_return_last100"]


def test_the_driver_gathers_ready_slices_into_rounds(short_tmp):
    """16 workers of one 16-env slice on 2 CPUs: a round is served once fewer than half of them
    (8) still step their slice, so it holds at least 9 slices (144 rows) unless a slice waited
    0.5 s (rlpipe/supervisor/gathering.py); charted as charts/rows_per_round. Served at each
    ring instead, these rounds held 21-25 rows (2026-12-05)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_mix=cartpole",
        "buffer=lowdim",
        "+env@env_mix.types.physics_sim=physics_sim",  # ~0.6 ms a step: the workers, not the
        "+env_mix.weights.physics_sim=3.0",  # driver, are the limit, so rings come in one by one
        "env_count=256",
        "groups.size=16",
        "worker.slices=1",
        "worker.cpu_affinity=null",
        "groups.hot=100000",
        "learner.mode=random",
        "logging.random_return_episodes=0",
        "run.total_env_steps=40000",
        "run.duration_s=120",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    rows = [e.value for e in acc.Scalars("charts/rows_per_round")]
    assert rows and all(0 < r <= 256 for r in rows)
    assert statistics.median(rows) >= 9 * 16, rows


def test_tensorboard_tags(cartpole_multirun):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = cartpole_multirun / "0"  # 16 CartPoles, 15k env steps (tests/conftest.py)
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "charts/sps",
        "losses/policy",
        "losses/value",
        "losses/entropy",
        "envs/active",
        "charts/episodic_return/cartpole",
        "latency/step_ms/cartpole/p50",
        "latency/step_ms/cartpole/p99",
    } <= tags
    p50 = [e.value for e in acc.Scalars("latency/step_ms/cartpole/p50")]
    p99 = [e.value for e in acc.Scalars("latency/step_ms/cartpole/p99")]
    assert all(0 < a <= b < 1000 for a, b in zip(p50, p99))  # CartPole's step: microseconds


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_with_its_exit_code(signalled_run, sig):
    """64 CartPoles in two workers, signalled mid-run: SIGTERM to the driver, SIGINT to its
    process group (the run tests/test_eval_during.py reads too: tests/conftest.py)."""
    from rlpipe.learner.checkpoint import checkpoint_files, load_checkpoint

    run = signalled_run(sig)
    assert run.code == 128 + sig, run.stderr[-3000:]
    summary = read_summary(run.run_dir)
    assert summary["env_steps"] > 0
    assert summary["stopped_by"]["reason"] == "signal" and summary["stopped_by"]["signal"] == sig.name
    assert summary["stopped_by"]["phase"] == "running"
    assert f"rlpipe stopped by {sig.name}: " in run.stdout and "Traceback" not in run.stderr
    if sig == signal.SIGINT:  # trained under hold: the update had a process of its own
        assert run.update_titles == [f"rlpipe: ppo update (driver {run.pid})"]
    assert_nothing_left(run.run_dir, run.pid)
    # SIGINT went to the whole group: the embedded Redis, in a group of its own, still served
    # the final checkpoint the workers' reward statistics (reward_norm=per_env)
    assert "Redis unreachable" not in (run.run_dir / "app.log").read_text()
    final = load_checkpoint(checkpoint_files(run.run_dir / "checkpoints")[-1])
    assert final["counters"]["env_steps"] == summary["env_steps"]
    assert final["reward_norm"] and all(state.numel() for state in final["reward_norm"])


def test_sigterm_while_dormant_workers_are_still_starting_leaves_nothing(short_tmp):
    """99 dormant workers are started by the driver's start threads in the background: a
    SIGTERM in the middle of those starts must still stop every worker they started (through
    the driver, which records each exit) and start no more."""
    run_dir = short_tmp / "run"
    proc = subprocess.Popen(
        rlpipe_cmd(
            run_dir,
            "env_count=1400",
            "groups.size=14",
            "groups.hot=1",
            "learner.mode=random",
            "run.duration_s=300",
            "run.total_env_steps=null",
        ),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=driver_dies_with_pytest,
    )
    log_file, deadline = run_dir / "app.log", time.monotonic() + 90
    driver = psutil.Process(proc.pid)
    while len(driver.children(recursive=True)) < 8:  # Redis, forkserver, tracker, 1 hot + 4 dormant
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)  # a few dormant workers are up, most are not
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()  # a hung teardown fails the test, leaving nothing
        raise
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "all 100 workers started" not in log_file.read_text()  # it really was mid-start
    assert_nothing_left(run_dir, proc.pid)
    # Every worker that came up was stopped by the driver while its lifecycle log still ran
    # (a worker whose start the teardown did not take in would only notice the driver gone,
    # with nobody left to record its exit).
    with contextlib.closing(sqlite3.connect(run_dir / "lifecycle.sqlite")) as db:
        rows = db.execute(
            "SELECT kind, worker_id, generation FROM events WHERE kind IN ('worker_spawn', 'worker_exit')"
        ).fetchall()
    spawned = {(w, g) for kind, w, g in rows if kind == "worker_spawn"}
    exited = {(w, g) for kind, w, g in rows if kind == "worker_exit"}
    assert len(spawned) > 1 and spawned <= exited, sorted(spawned - exited)


def test_multirun_jobs_each_run_and_free_everything(cartpole_multirun):
    """Jobs of a multirun share the driver process: each must get its own full run (the
    session's two-job multirun, seeds 1 and 2: tests/conftest.py), with its own overrides."""
    for job, seed in (("0", 1), ("1", 2)):
        summary = read_summary(cartpole_multirun / job)
        assert summary["env_count"] == 16 and summary["env_types"] == {"cartpole": 16}
        assert summary["env_steps"] >= 15000 and summary["active_envs_end"] == 16
        assert summary["startup_first_step_s"] < 60
        assert OmegaConf.load(cartpole_multirun / job / ".hydra" / "config.yaml").run.seed == seed

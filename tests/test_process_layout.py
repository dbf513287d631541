"""The process layout chosen from the machine (rlpipe/process_layout.py): the rule's layouts at
64, 1,000 and 7,000 envs on 1, 2, 16 and 128 CPUs, explicit values kept, the CPUs a cgroup
quota leaves, learner_core under `auto`, and the fleet moving its workers off the learner's
CPU once start-up is over."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import compose_cfg, delegated_v2_root
from rlpipe.config import run_spec
from rlpipe.process_layout import cgroup_cpu_limit, resolve


@pytest.fixture
def machine(monkeypatch):
    """A machine of `n` CPUs in the affinity mask and no cgroup quota."""

    def cpus(n: int) -> None:
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(n)))
        monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: None)

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return cpus


# (CPUs, envs) -> (workers, group size, slices), PPO on the CPU (conf/'s default): 70-env groups
# while they make at most 10 workers a CPU they step on (from 2 CPUs up one fewer than the
# machine's: learner_core keeps one for the update), larger groups of 70-env slices beyond; 2
# slices while workers < 2x those CPUs.
RULE = {
    (1, 64): (1, 64, 2),
    (1, 1000): (10, 100, 2),
    (1, 7000): (10, 700, 10),
    (2, 64): (1, 64, 2),
    (2, 1000): (10, 100, 2),
    (2, 7000): (10, 700, 10),
    (16, 64): (1, 64, 2),
    (16, 1000): (15, 67, 2),
    (16, 7000): (100, 70, 1),
    (128, 64): (1, 64, 2),
    (128, 1000): (15, 67, 2),
    (128, 7000): (100, 70, 2),
}


# (CPUs, envs) -> (workers, group size, slices) with random actions: every CPU for the workers,
# at most 2 processes a CPU (no inference round to wait for), slices of at most 350 envs (no
# rollout block to keep at 70); still 2 slices while workers < 2x the CPUs.
RANDOM_RULE = {
    (1, 64): (1, 64, 2),
    (2, 1000): (4, 250, 1),
    (2, 7000): (4, 1750, 5),
    (16, 1000): (15, 67, 2),
    (16, 7000): (32, 219, 1),
    (128, 7000): (100, 70, 2),
}
RULES = {"ppo": RULE, "random": RANDOM_RULE}
SLICE_CAP = {"ppo": 70, "random": 350}


@pytest.mark.parametrize("mode,cpus,envs", [(mode, *key) for mode, rule in RULES.items() for key in sorted(rule)])
def test_the_rule_at_each_count_and_machine(machine, mode, cpus, envs):
    machine(cpus)
    spec = run_spec(compose_cfg([f"env_count={envs}", f"learner.mode={mode}"]))
    layout = spec.layout
    assert (layout.workers, layout.group_size, layout.slices) == RULES[mode][cpus, envs]
    assert (spec.groups.size, spec.worker.slices) == (layout.group_size, layout.slices)
    assert layout.envs_per_slice <= SLICE_CAP[mode] and layout.workers * layout.group_size >= envs
    assert layout.auto == ("groups.size", "worker.slices", "worker.cpu_affinity")
    # PPO trains on the CPU by default: from 2 CPUs on, one is kept for its update thread;
    # random actions train nothing and step on every CPU
    if mode == "ppo" and cpus >= 2:
        assert (spec.learner_cpu, spec.worker.cpu_affinity) == (0, tuple(range(1, cpus)))
    else:
        assert (spec.learner_cpu, spec.worker.cpu_affinity) == (None, None)


def test_the_cap_counts_the_cpus_the_workers_step_on(machine):
    """Under learner_core the workers share the CPUs the update leaves them: on 2 CPUs one,
    so 10 processes; on the CPUs of a list, as many as it names."""
    machine(2)
    ppo = run_spec(compose_cfg(["env_count=7000"])).layout
    assert (ppo.workers, ppo.group_size, ppo.affinity) == (10, 700, "learner_core")
    machine(4)  # three CPUs for the workers: 30 processes at most
    assert run_spec(compose_cfg(["env_count=7000"])).layout.workers == 30
    # workers pinned to a list of CPUs step on as many as it names
    listed = run_spec(compose_cfg(["env_count=7000", "worker.cpu_affinity=[2,3]"])).layout
    assert (listed.workers, listed.group_size, listed.affinity) == (20, 350, "cpus")


def test_explicit_values_are_kept(machine):
    machine(2)
    spec = run_spec(compose_cfg(["env_count=7000", "groups.size=70", "worker.slices=2", "worker.cpu_affinity=null"]))
    assert (spec.layout.workers, spec.groups.size, spec.worker.slices) == (100, 70, 2)
    assert spec.layout.auto == () and spec.learner_cpu is None and spec.worker.cpu_affinity is None
    # an explicit size with slices left to auto: slices of at most 70 envs
    assert run_spec(compose_cfg(["env_count=7000", "groups.size=350"])).worker.slices == 5


def test_a_torchrun_rank_resolves_again_for_its_share(machine, monkeypatch):
    """rlpipe.dist.rank_spec replaces env_count: auto is resolved again from the settings, on
    the node's CPUs shared among its ranks, and the learner's CPU is not lost on the way."""
    machine(2)
    spec = run_spec(compose_cfg(["env_count=7000"]))
    half = dataclasses.replace(spec, env_count=3500)
    assert (half.layout.workers, half.groups.size, half.worker.slices) == (10, 350, 5)
    assert half.learner_cpu == 0 and half.worker.cpu_affinity == (1,)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ranked = dataclasses.replace(spec, env_count=3500)
    assert (ranked.layout.workers, ranked.groups.size) == (10, 350)  # one CPU's worth each
    assert ranked.learner_cpu is None  # auto: ranks would all keep the same CPU


def test_the_layout_is_described_and_reported(machine):
    machine(2)
    layout = run_spec(compose_cfg(["env_count=7000"])).layout
    assert layout.describe() == (
        "10 workers of 700 envs, 10 slices of <= 70 envs each, workers on CPUs 1 once every env "
        "stepped, CPU 0 kept for the PPO update; auto: groups.size, worker.slices, "
        "worker.cpu_affinity from 2 usable CPUs"
    )
    assert layout.as_dict() == {
        "workers": 10,
        "group_size": 700,
        "slices": 10,
        "envs_per_slice": 70,
        "cpu_affinity": "learner_core",
        "worker_cpus": [1],
        "learner_cpu": 0,
        "usable_cpus": 2.0,
        "auto": ["groups.size", "worker.slices", "worker.cpu_affinity"],
    }


def test_a_cgroup_quota_caps_the_cpus(machine, monkeypatch):
    machine(16)
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: 2.0)
    layout = run_spec(compose_cfg(["env_count=7000"])).layout
    assert (layout.cpus, layout.workers, layout.group_size) == (2.0, 10, 700)
    assert layout.affinity == "learner_core"
    assert resolve(7000, "auto", "auto", "auto", "ppo", "cpu", cpus=1.5).affinity == "null"


def test_cgroup_cpu_limit_reads_v2_and_v1(tmp_path):
    # v2: the tightest cpu.max of the process's cgroup and its ancestors
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / "a" / "cpu.max").write_text("300000 100000\n")
    (v2 / "a" / "b" / "cpu.max").write_text("max 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    assert cgroup_cpu_limit(v2, proc) == 3.0
    (v2 / "a" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(v2, proc) is None
    # v1: cpu,cpuacct's quota over period; -1 is none; a path outside the mount (a container's
    # view) reads the mount itself
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_limit(v1, proc) == 1.5
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(v1, proc) is None
    assert cgroup_cpu_limit(v1, tmp_path / "absent") is None


# -- the fleet: workers leave the learner's CPU once every env has stepped --------------------------

THREADED = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move a process between")
def test_the_fleet_pins_its_workers_when_startup_is_over(short_tmp):
    """Without a cgroup driver: the live workers' threads move off the update's CPU."""
    from rlpipe.supervisor.fleet import Fleet
    from rlpipe.supervisor.workers import WorkerHandle

    spec = run_spec(compose_cfg(["env_count=64", "worker.cpu_affinity=learner_core"]))
    cpus = spec.layout.worker_cpus
    phases: list[str] = []
    fleet = Fleet(spec, "test", time.monotonic(), services=None, phase=phases.append)
    proc = subprocess.Popen([sys.executable, "-c", THREADED])
    try:
        handle = WorkerHandle.__new__(WorkerHandle)  # only its process matters here
        handle.proc = SimpleNamespace(pid=proc.pid, is_alive=lambda: proc.poll() is None)
        fleet.handles = [handle]
        tasks = f"/proc/{proc.pid}/task"
        while len(os.listdir(tasks)) < 2:  # its second thread has started
            time.sleep(0.01)
        assert fleet.worker_cpus() is None  # start-up: new workers on every CPU
        fleet.startup_over(12.5)
        assert fleet.worker_cpus() == cpus and fleet.pinned_at == 12.5
        assert {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(tasks)} == {cpus}
        assert phases == [f"workers moved to CPUs {','.join(map(str, cpus))}, CPU 0 kept for the PPO update"]
        fleet.startup_over(20.0)  # once
        assert fleet.pinned_at == 12.5 and len(phases) == 1
    finally:
        proc.kill()
        proc.wait()
    # null: nothing to pin, ever
    idle = Fleet(run_spec(compose_cfg(["worker.cpu_affinity=null"])), "test", 0.0, None, phases.append)
    idle.startup_over(1.0)
    assert idle.pinned_at is None and idle.worker_cpus() is None


def test_with_cgroups_the_fleet_weighs_its_workers_below_the_learner(tmp_path):
    """With a cgroup driver (here v2 on a root we control): the workers keep every CPU and
    their cgroup's weight drops to LEARNER_FIRST_WEIGHT once every env has stepped."""
    from rlpipe.supervisor.cgroups import LEARNER_FIRST_WEIGHT, make_driver
    from rlpipe.supervisor.fleet import Fleet
    from rlpipe.supervisor.workers import WorkerHandle

    roots = delegated_v2_root(tmp_path)
    root = roots.v2
    spec = run_spec(compose_cfg(["env_count=64", "worker.cpu_affinity=learner_core"]))
    phases: list[str] = []
    fleet = Fleet(spec, "test", time.monotonic(), services=None, phase=phases.append)
    fleet.cgroups = make_driver("v2", "1-f1ee", 1.0, 256, roots=roots)
    proc = subprocess.Popen([sys.executable, "-c", THREADED])
    try:
        handle = WorkerHandle.__new__(WorkerHandle)
        handle.proc = SimpleNamespace(pid=proc.pid, is_alive=lambda: proc.poll() is None)
        fleet.handles = [handle]
        before = os.sched_getaffinity(proc.pid)
        fleet.startup_over(3.0)
        assert fleet.pinned_at == 3.0 and fleet.learner_by_weight
        assert fleet.worker_cpus() is None and os.sched_getaffinity(proc.pid) == before
        assert (root / "rlpipe_1-f1ee" / "cpu.weight").read_text() == str(LEARNER_FIRST_WEIGHT)
        assert phases == [
            "workers weighed below the PPO update (CPU 0) and the driver (v2 cgroup), stepping on every CPU"
        ]
        # under backlog=drop a batch always waits for the update: its CPU is kept by pinning
        drop = run_spec(compose_cfg(["env_count=64", "worker.cpu_affinity=learner_core", "learner.backlog=drop"]))
        pinned = Fleet(drop, "test", time.monotonic(), services=None, phase=phases.append)
        pinned.cgroups, pinned.handles = fleet.cgroups, [handle]
        pinned.startup_over(4.0)
        assert not pinned.learner_by_weight and pinned.worker_cpus() == drop.layout.worker_cpus
        assert os.sched_getaffinity(proc.pid) == set(drop.layout.worker_cpus)
    finally:
        proc.kill()
        proc.wait()

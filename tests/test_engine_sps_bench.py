"""benchmarks/engine_sps.py's process layouts and PPO modes: `auto` overrides nothing (conf/'s
layout resolved for the machine), `70` is the layout before auto, the 350x5 layout keeps the
70-env slices (so PPO batches keep their size), the PPO modes name conf/'s affinity, every
CPU or learner_core, and a malformed layout or mode is refused with the flag and what is
allowed."""

from __future__ import annotations

import pytest

from conftest import compose_cfg, load_benchmark
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
    assert (auto.groups.size, auto.worker.slices) == (350, 5)  # on 2 CPUs auto is 350x5
    assert slice_bounds(wide.groups.size, wide.worker.slices) == [(i, i + 70) for i in range(0, 350, 70)]
    assert wide.learner == old.learner == auto.learner  # the same PPO settings in every layout


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
    }
    assert bench.resolved_layout({"layout": layout}) == "ran 20 x 350 in 5 slices, learner core 0 from 3.2 s"
    assert bench.resolved_layout({}) == "layout not reported"


@pytest.mark.parametrize("bad", ["70x", "x5", "big", "350x5x2", "-70"])
def test_a_malformed_layout_names_the_flag_and_the_form(bad):
    with pytest.raises(SystemExit, match=r"--layouts: .* is not auto, GROUP_SIZE or GROUP_SIZExSLICES"):
        load_benchmark("engine_sps").layout_overrides(bad)

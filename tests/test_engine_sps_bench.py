"""benchmarks/engine_sps.py's process layouts: each names groups and slices the real config
accepts, the 350x5 layout keeps the 70-env slices (so PPO batches keep their size), and a
malformed one is refused with the flag and what is allowed."""
from __future__ import annotations

import pytest

from conftest import compose_cfg, load_benchmark
from rlpipe.config import run_spec
from rlpipe.protocol import slice_bounds


def test_layouts_compose_into_the_same_slices_in_fewer_processes():
    bench = load_benchmark("engine_sps")
    assert bench.layout_overrides("70") == ["groups.size=70"]
    assert bench.layout_overrides("350x5") == ["groups.size=350", "worker.slices=5"]
    assert bench.layout_name("350x5") == "groups of 350 x 5 slices"
    base = ["env_mix=cartpole", "env_count=7000", "+stage=day4", "learner.mode=ppo"]
    default = run_spec(compose_cfg(base + bench.layout_overrides("70")))
    wide = run_spec(compose_cfg(base + bench.layout_overrides("350x5")))
    assert (default.groups.size, default.worker.slices) == (70, 1)
    assert (wide.groups.size, wide.worker.slices) == (350, 5)
    assert slice_bounds(wide.groups.size, wide.worker.slices) == [(i, i + 70) for i in range(0, 350, 70)]
    assert wide.learner == default.learner           # the same PPO settings in both layouts


@pytest.mark.parametrize("bad", ["70x", "x5", "big", "350x5x2", "-70"])
def test_a_malformed_layout_names_the_flag_and_the_form(bad):
    with pytest.raises(SystemExit, match=r"--layouts: .* is not GROUP_SIZE or GROUP_SIZExSLICES"):
        load_benchmark("engine_sps").layout_overrides(bad)

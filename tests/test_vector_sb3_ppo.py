"""Stable-Baselines3's PPO with rl-zoo's CartPole-v1 settings (benchmarks/sb3_ppo.py) through
rlpipe.vector.sb3 under SB3's VecMonitor: the mean return of 100 consecutive training episodes
reaches 475 (slow: ~61k steps, ~20 s on 2 CPUs with one torch thread), and TorchRL's PPO example
runs (slow: torchrl's import and 3 small batches)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from conftest import load_benchmark

pytest.importorskip("stable_baselines3")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torchrl_rlpipe.py"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sb3_ppo_reaches_475_on_cartpole_through_the_adapter():
    # one torch thread: on 2 cores torch's default (a thread per core) and the workers contend,
    # ~11x slower to the same step (docs/benchmarks.md, "Stable-Baselines3's VecEnvs")
    res = load_benchmark("sb3_ppo").ppo_to_475("sb3_rlpipe", seed=1, torch_threads=1)
    print(res)
    assert res["steps_to_475"] is not None, res
    assert res["faults"] == 0, res


@pytest.mark.slow
def test_the_torchrl_example_trains_a_few_batches(monkeypatch, capsys):
    pytest.importorskip("torchrl")
    import torch

    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--iters", "3", "--steps-per-batch", "256"])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        torch.set_num_threads(threads)  # the example sets the process's torch threads
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("batch ")]
    assert len(lines) == 3 and all("faults 0" in ln for ln in lines), lines

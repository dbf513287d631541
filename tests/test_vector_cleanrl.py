"""CleanRL's PPO (examples/cleanrl_ppo.py, vendored; only its env construction changed) on
rlpipe.vector: a smoke run in the default suite, the CartPole-v1 bar (475) behind `slow`.
The script runs in this process (runpy, as `python examples/cleanrl_ppo.py` would) so the
test can read what its vector counted: CleanRL logs episode returns only from Gymnasium
0.29's list-of-dicts `final_info`, which a Gymnasium 1.x vector does not produce."""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tyro")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cleanrl_ppo.py"


def run_ppo(tmp_path, monkeypatch, *args: str) -> dict:
    monkeypatch.chdir(tmp_path)  # CleanRL writes runs/<run name>/ where it starts
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--no-cuda", *args])
    return runpy.run_path(str(EXAMPLE), run_name="__main__")


def best_mean_100(returns: list[float]) -> float:
    r = np.asarray(returns, dtype=np.float64)
    if len(r) < 100:
        return float("-inf")
    c = np.cumsum(np.concatenate([[0.0], r]))
    return float(((c[100:] - c[:-100]) / 100).max())


@pytest.mark.slow  # ~20 s, mostly torch and TensorBoard imports: kept out of the default suite
def test_cleanrl_ppo_runs_on_rlpipe_vector(tmp_path, monkeypatch):
    g = run_ppo(tmp_path, monkeypatch, "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "256")
    envs = g["envs"]
    assert envs.closed and g["global_step"] == 256
    assert len(envs.episode_returns) > 0
    assert list((tmp_path / "runs").iterdir())  # its TensorBoard run


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 500k steps: ~8 min alone on this 2-core machine, more beside other runs
def test_cleanrl_ppo_reaches_475_on_cartpole(tmp_path, monkeypatch):
    """CleanRL's defaults (4 envs, 500k steps, seed 1): the mean return over 100 consecutive
    training episodes reaches 475."""
    t0 = time.monotonic()
    g = run_ppo(tmp_path, monkeypatch)
    returns = g["envs"].episode_returns
    best = best_mean_100(returns)
    print(
        f"cleanrl ppo on rlpipe.vector: {len(returns)} episodes, best mean of 100 = {best:.1f}, "
        f"{time.monotonic() - t0:.0f} s"
    )
    assert best >= 475, best

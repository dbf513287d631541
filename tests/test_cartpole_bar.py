"""benchmarks/cartpole_bar.py: the window its crossing is judged on, and its watching child on a
real (small) run: the crossing it reports is the learner's own, within the run's steps and time."""

from __future__ import annotations

import collections
import sys

from conftest import load_benchmark

bar = load_benchmark("cartpole_bar")


def test_a_crossing_needs_a_full_window_at_or_above_the_threshold():
    assert not bar.crossed([500.0] * 99, 475)  # 99 episodes: no 100-episode mean yet
    assert bar.crossed([475.0] * 100, 475)
    assert not bar.crossed([474.0] * 100, 475)
    # only the last 100 count: an old bad episode out of the window no longer pulls it down
    window = collections.deque([0.0] + [479.0] * 99, maxlen=100)
    assert not bar.crossed(window, 475)
    window.append(479.0)
    assert bar.crossed(window, 475)
    assert bar.crossed([0.0] + [479.0] * 100, 475)


def test_the_watching_child_reports_the_runs_own_crossing(short_tmp):
    # random actions (learner.mode=random): CartPole's episodes last ~22 steps, a threshold of
    # 10 is crossed at the 100th episode, ~2,200 steps into the 8,000. A learning policy is no
    # good here: at 8 envs the quick start updates every 256 steps, its episodes lengthen
    # within the first thousands, and the 100th came at 5,200-7,200 steps, or on a slow
    # machine after the 8,000.
    overrides = ["env_count=8", "run.total_env_steps=8000", "logging.random_return_episodes=0", "learner.mode=random"]
    res = bar.run_rlpipe(sys.executable, 1, overrides, short_tmp / "run", threshold=10.0, timeout=240)
    # 100 episodes of at least 8 steps each (CartPole's shortest), counted while the run went on
    assert res["steps"] is not None, (res, (short_tmp / "run.log").read_text()[-3000:])
    assert 800 <= res["steps"] <= res["env_steps"], res
    assert 0 < res["to_475_s"] < res["exit_s"], res
    assert res["final"] >= 10 and res["cpu_s"] > 0, res

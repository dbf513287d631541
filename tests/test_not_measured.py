"""Reports say "not measured" instead of a false figure: a killed run's health report reads
the random-return probe's own file and takes no 0.0 for its peak memory, a run's summary says
why a type has no random or untrained-policy figure, and the driver charts no memory before
its sampler has measured any."""

from __future__ import annotations

import json
from pathlib import Path

from rlpipe.telemetry.health import write_health_report
from rlpipe.telemetry.tb import TbWriter

RANDOMS = {"cartpole": {"mean": 21.5, "std": 9.0, "episodes": 20}, "acrobot": {"mean": None, "episodes": 0}}


def killed_run(run_dir: Path, pss_mb: float) -> Path:
    """What a driver killed with -9 leaves: TensorBoard events and the probe's file, no summary."""
    tb = TbWriter(run_dir, None)
    for step in range(0, 4000, 1000):
        tb.scalars(step, {"charts/episodic_return/cartpole": 20.0 + step / 100, "memory/pss_mb": pss_mb})
    tb.close()
    (run_dir / "random_returns.json").write_text(json.dumps(RANDOMS))
    return run_dir


def test_a_killed_runs_report_reads_the_probes_file_and_no_zero_peak(tmp_path):
    md = write_health_report(killed_run(tmp_path, 0.0)).read_text()
    assert "peak memory under 12 GiB: **n/a**" in md and "not measured" in md
    assert "0.0 MiB" not in md
    row = next(line for line in md.splitlines() if line.startswith("| cartpole |"))
    assert "| 21.5 |" in row, row  # random, from random_returns.json (no summary.json)
    assert "no random-return figures" not in md


def test_a_killed_runs_report_takes_its_peak_from_the_charts(tmp_path):
    md = write_health_report(killed_run(tmp_path, 412.5)).read_text()
    assert "peak memory under 12 GiB: **yes**" in md and "412.5 MiB (TensorBoard memory/pss_mb)" in md


def test_unknown_verdicts_are_not_called_missing_random_figures(tmp_path):
    """A resumed run's verdicts were `unknown` (its window had been lost) while its table
    showed random = 18.15: the check said "no random-return figures"."""
    killed_run(tmp_path, 400.0)
    summary = {"learned": {"cartpole": "unknown"}, "random_return": {"cartpole": 18.15}, "env_types": {"cartpole": 4}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    md = write_health_report(tmp_path).read_text()
    assert "every env type learned (above its random return): **n/a**" in md
    assert "no random-return figures" not in md and "fewer than 200 episodes" in md


def test_the_summary_says_why_a_figure_was_not_measured(tmp_path):
    from types import SimpleNamespace

    from rlpipe.envs.random_return import INITIAL_FILE, RESULT_FILE, not_measured

    on = SimpleNamespace(random_return_episodes=20, initial_policy_episodes=20)
    (tmp_path / RESULT_FILE).write_text(json.dumps(RANDOMS))
    (tmp_path / INITIAL_FILE).write_text(json.dumps({"cartpole": {"mean": 9.0, "episodes": 3, "cut": 1}}))
    why = not_measured(tmp_path, ["cartpole", "acrobot", "pendulum"], on)
    assert set(why["random_return"]) == {"acrobot", "pendulum"}
    assert "no episode finished" in why["random_return"]["acrobot"]
    assert "had not finished it" in why["random_return"]["pendulum"]
    assert "cut episode" in why["initial_policy_return"]["cartpole"]
    assert "had not come to it" in why["initial_policy_return"]["acrobot"]
    off = SimpleNamespace(random_return_episodes=20, initial_policy_episodes=0)
    assert "off" in not_measured(tmp_path, ["cartpole"], off)["initial_policy_return"]["cartpole"]

"""A resumed run keeps its history (docs/running.md, "Stopping a run"): each type's last-100
and first-100 returns and episode count travel in the checkpoint, a resumed start keeps the
random-return figures its first start measured, and its charts start at its first step (no
0 sps at the resumed step). The slow test stops a run twice and compares its verdicts with
the uninterrupted run's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import compose_cfg, read_summary, run_cli
from rlpipe.config import run_spec
from rlpipe.envs import random_return
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.central import CentralLearner
from rlpipe.learner.checkpoint import checkpoint_files, load_checkpoint, save_checkpoint


def _learner() -> CentralLearner:
    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim"]))
    return CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))


def test_a_checkpoint_carries_the_episode_windows_and_verdict_inputs(tmp_path):
    """Through a real checkpoint file (torch.load(weights_only=True)) into a new learner: the
    windows a resumed run's summary and `learned` verdicts are made of."""
    before = _learner()
    c = before.counters
    rng = np.random.default_rng(0)
    for name in ("cartpole", "acrobot"):
        values = rng.normal(100, 10, 130).tolist()
        c.returns[name].extend(values)
        c.first_returns[name].extend(values[:100])
        c.episodes_by_type[name] = 130
    c.recent_losses.extend([0.5, 0.25])
    path = save_checkpoint(tmp_path, 1000, before.checkpoint_payload(), keep=2)

    after = _learner()
    after.restore(load_checkpoint(path))
    r = after.counters
    for name in ("cartpole", "acrobot"):
        assert list(r.returns[name]) == list(c.returns[name]) and len(r.returns[name]) == 100
        assert r.first_returns[name] == c.first_returns[name]
        assert r.episodes_by_type[name] == 130
    assert list(r.returns["pendulum"]) == [] and r.episodes_by_type["pendulum"] == 0
    assert list(r.recent_losses) == [0.5, 0.25]
    r.returns["cartpole"].append(1.0)  # still a window of the last 100
    assert len(r.returns["cartpole"]) == 100


def test_a_resumed_probe_keeps_the_random_figures_it_has(tmp_path):
    """A resumed start measures only the types its run dir has no random figure for."""
    nodes = {t.name: t.node for t in run_spec(compose_cfg(["env_mix=classic"])).env_types}
    kept = {"cartpole": {"mean": 21.5, "std": 1.0, "episodes": 20}}
    (tmp_path / random_return.RESULT_FILE).write_text(json.dumps(kept))
    random_return.measure({k: nodes[k] for k in ("cartpole", "acrobot")}, str(tmp_path), 1, 10.0, 0, None, True)
    measured = random_return.read_results(tmp_path)
    assert measured["cartpole"] == kept["cartpole"] and measured["acrobot"]["episodes"] >= 1


@pytest.mark.slow
def test_a_run_stopped_and_resumed_twice_reports_as_the_uninterrupted_run(short_tmp):
    """16 CartPoles to 45,000 env steps in one go (about 400 episodes: a verdict needs 200),
    and the same in three starts (resumed at about 15,000 and 30,000): the same `learned` verdict, last-100 returns within noise of
    each other, and no 0 sps charted at a resumed step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = (
        "env_mix=cartpole",
        "env_count=16",
        "groups.size=8",
        "run.duration_s=null",
        "logging.random_return_episodes=5",
    )
    whole = run_cli(short_tmp / "whole", *base, "run.total_env_steps=45000")
    assert whole.returncode == 0, whole.stderr[-3000:]
    run_dir = short_tmp / "parts"
    for total, resume in ((15000, "false"), (30000, "true"), (45000, "true")):
        part = run_cli(run_dir, *base, f"run.total_env_steps={total}", f"run.resume={resume}")
        assert part.returncode == 0, part.stderr[-3000:]
    one, parts = read_summary(short_tmp / "whole"), read_summary(run_dir)
    assert parts["resumed_from_step"] >= 30000 and len(checkpoint_files(run_dir / "checkpoints")) >= 1
    assert parts["learned"] == one["learned"] == {"cartpole": "learned"}
    assert parts["mean_return_last100"]["cartpole"] is not None
    assert abs(parts["mean_return_last100"]["cartpole"] - one["mean_return_last100"]["cartpole"]) < 100
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    sps = acc.Scalars("charts/sps")
    assert sps and min(e.value for e in sps) > 0, [(e.step, e.value) for e in sps if e.value <= 0]


def test_a_resume_without_reward_statistics_says_so(tmp_path, caplog):
    """A checkpoint written while Redis did not answer has no reward statistics: with reward
    normalization on, the resume warns instead of starting the statistics anew in silence."""
    from rlpipe.supervisor.checkpointing import Checkpointing

    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim", "reward_norm=per_env"]))
    learner = CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))
    save_checkpoint(tmp_path / "checkpoints", 500, {**learner.checkpoint_payload(), "reward_norm": []}, keep=2)
    with caplog.at_level("WARNING", logger="rlpipe"):
        Checkpointing(spec, tmp_path, "run", "", 0.0).resume(learner, None, required=True)
    assert "without reward statistics" in caplog.text and "reward_norm=per_env" in caplog.text

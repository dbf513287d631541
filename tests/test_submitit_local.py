"""`hydra/launcher=submitit_local`: the README's way to try a Slurm sweep on this machine.
Hydra's submitit launchers pickle the job with OmegaConf's resolvers, and one of rlpipe's held
a cache around a local function: every submitit sweep, local or on Slurm, failed with
"Can't pickle local object 'register_alone.<locals>.learner_defaults'" before its first job
(rlpipe/mix_learner.py)."""

from __future__ import annotations

import json

from conftest import rlpipe_with, run_leftovers


def test_a_submitit_local_sweep_runs_every_job_and_leaves_nothing(short_tmp):
    sweep_dir = short_tmp / "sweep"
    out = rlpipe_with(
        *("-m", "hydra/launcher=submitit_local", "env_count=8", "run.total_env_steps=1000", "run.seed=1,2"),
        *("logging.random_return_episodes=5", "logging.initial_policy_episodes=0", f"hydra.sweep.dir={sweep_dir}"),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for job in ("0", "1"):
        summary = json.loads((sweep_dir / job / "summary.json").read_text())
        assert summary["env_steps"] >= 1000 and summary["active_envs_end"] == 8
    # a local submitit job is a process of its own whose pid is its job id: the job's driver
    job_ids = [p.name for p in (sweep_dir / ".submitit").iterdir() if p.name.isdigit()]
    assert len(job_ids) == 2
    for job_id in job_ids:
        assert run_leftovers(int(job_id)) == []

"""Every job of a multirun checked before the first one starts.

`python -m rlpipe -m +stage=day1,day2,day3,day4 learner.epochs=...` runs its jobs one after
the other. Hydra composes every job before the first starts, but rlpipe's own checks ran in
each job as it started: a bad value in the fourth job was found after three stages of
training. This Hydra callback (conf/config.yaml, `hydra.callbacks`) runs them on every job's
composed config at the sweep's start, and refuses the sweep with the job's number and
overrides in one paragraph, exit 2, before any job or its folder exists. The checks are the
ones a job makes before it starts anything: the values (`run_spec`: ranges, choices, what one
key allows given another, as `run_job`), then the mix (each env type described, the board
sized to it: an env id that does not exist, a type that does not fit an explicit buffer) and
the memory its board and rollouts need on this machine (`check_memory_budget`, as the
driver's first step; not for `run.mode=validate`, day0, whose job reports each type that
cannot be built as its own outcome). The four stages of the ramp are checked in 1.1 s here, 0.5 s of it
the mixes.

All of it only where the jobs will run on this machine (Hydra's basic launcher,
submitit_local), with Hydra's basic sweeper (whose job list is known in advance). A value
allowed or not by the machine (the CPUs of the `auto` layouts and of `worker.cpu_affinity`, a
GPU for `learner.device=cuda`, the memory) is judged where the job runs, so a Slurm sweep's
jobs have only their keys checked here (a key no setting has is one on every node), their
values where each starts; and a Slurm sweep from a machine without `srun` (submitit's sign of
a Slurm cluster, whose absence was its traceback) is refused with the launcher to try instead.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlpipe.config import ConfigError, RunSpec, run_spec
from rlpipe.config_errors import check_known_keys, exit_with, hydra_refusal
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.budget import check_memory_budget
from rlpipe.supervisor.workers import group_ranges

log = logging.getLogger("rlpipe")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
LOCAL_LAUNCHERS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
)
SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


class CheckEveryJob(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper, launcher = config.hydra.sweeper._target_, config.hydra.launcher._target_
        if sweeper != BASIC_SWEEPER:
            log.info("multirun: each job's config is checked when it starts (%s)", sweeper)
            return
        local = launcher in LOCAL_LAUNCHERS
        started = time.monotonic()
        jobs = sweep_jobs(config)
        mix_log = logging.getLogger("rlpipe.envs")
        level = mix_log.level
        mix_log.setLevel(logging.WARNING)  # what a mix's description notes, each job logs as it starts
        try:
            for number, overrides in enumerate(jobs):
                refused = job_refused(config, overrides, whole=local)
                if refused is not None:
                    name = f"job #{number} of {len(jobs)} ({' '.join(overrides)})"  # as Hydra's log names it
                    end = "" if refused.endswith(".") else "."
                    exit_with(f"{name}: {refused}{end} No job of the sweep was started.")
        finally:
            mix_log.setLevel(level)
        if launcher == SLURM_LAUNCHER and shutil.which("srun") is None:
            exit_with(
                "hydra/launcher=submitit_slurm sends each job to Slurm, and this machine has no `srun` on its "
                "PATH (how submitit knows a Slurm cluster). Start the sweep on a Slurm login node, or try it "
                "here with hydra/launcher=submitit_local. No job of the sweep was started."
            )
        checked = "values, env types, memory" if local else "keys; their values where each starts"
        log.info("multirun: all %d jobs checked (%s) in %.1f s", len(jobs), checked, time.monotonic() - started)


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, in the order Hydra's basic sweeper launches them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(params + list(task))
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    return jobs


def job_refused(config: DictConfig, overrides: list[str], whole: bool = True) -> str | None:
    """What rlpipe's checks say of the job's config, composed as its launcher will compose it
    (run_job's checks, then the driver's before it starts anything; without `whole`, for a
    job that runs on another machine, its keys only); None where it passes."""
    try:
        cfg = GlobalHydra.instance().config_loader().load_sweep_config(config, list(overrides))
        with open_dict(cfg):
            del cfg["hydra"]
        check_known_keys(cfg, RunSpec)
        if not whole:
            return None
        spec = run_spec(cfg)
        if spec.run.mode != "validate":  # day0 builds and reports each type itself, as its job's outcome
            plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
            check_memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size))
    except (ConfigError, OmegaConfBaseException) as exc:
        return str(exc)
    except Exception as exc:  # what Hydra refuses while it composes, said as rlpipe says it
        text = hydra_refusal(exc, RunSpec)
        if text is None:
            raise
        return text
    return None
